"""An SFT run as its dashboard sees it, folded from events: the metric series every training run has (`MetricsFold`:
training loss, validation loss and perplexity, learning rate, gradient norm, tokens, throughput), the best
validation loss, and the model folder a completed run wrote (its `checkpoint` event with `model`), with how to use it.

A `restart` event rewinds it as it rewinds an RL run's model: each step shows its latest attempt."""

from __future__ import annotations

from typing import Any

from prime_lab.workbench.dashboards.event_folds import MetricsFold, RawEvent
from prime_lab.workbench.dashboards.series import DEFAULT_CAPACITY

TRAIN_LOSS = "loss/mean"
VAL_LOSS = "val/loss"


class SFTRunModel(MetricsFold):
    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        super().__init__(capacity)
        self.model_path: str | None = None  # the model folder the run wrote (a completed run)
        self.model_step: int | None = None

    def fold(self, kind: str, step: Any, data: dict[str, Any], raw: RawEvent) -> None:
        super().fold(kind, step, data, raw)
        if kind == "checkpoint" and data.get("model") and data.get("path"):
            self.model_path = str(data["path"])
            self.model_step = step if isinstance(step, int) else None

    def rewind(self, step: int) -> None:
        super().rewind(step)
        if self.model_step is not None and self.model_step > step:
            self.model_path = self.model_step = None

    # Views ------------------------------------------------------------------------------------------------
    def best_val_loss(self) -> tuple[int, float] | None:
        """The lowest validation loss and its step (None before the first validation)."""
        series = self.series.get(VAL_LOSS)
        if series is None:
            return None
        points = list(zip(*series.points(), strict=True))
        if not points:
            return None
        x, y = min(points, key=lambda p: p[1])
        return round(x), y


def model_usage(run_id: str, path: str) -> str:
    """Where a completed SFT run's model is and how the other commands take it (by the run's id)."""
    return f"{path}\nmodel = \"{run_id}\" in an RL config · prime eval run ENV -m {run_id}"
