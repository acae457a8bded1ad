"""The SFT run dashboard: the training dashboard (workbench.screens.dashboard_charts, with dashboard_training's
health line, System tab and logs beside the charts) with SFT's charts (the loss with the validation loss as points on
it, perplexity, learning rate, gradient norm, tokens, throughput), the loss, validation loss and tokens/s in its
header, and once the run wrote its model, where it is and how to use it. Its health line has what SFT logs: the
gradient norm's spikes."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.widgets import Static

from prime_lab.runs.registry import Run
from prime_lab.workbench.dashboards.sft_model import TRAIN_LOSS, VAL_LOSS, SFTRunModel, model_usage
from prime_lab.workbench.screens.dashboard_charts import dashboard_bindings
from prime_lab.workbench.screens.dashboard_training import TrainingDashboard, logs_beside_binding
from prime_lab.workbench.widgets.charts import SFT_CHARTS

LATEST_KEYS = (TRAIN_LOSS, VAL_LOSS, "loss/perplexity", "val/perplexity", "optim/lr", "optim/grad_norm",
               "progress/num_tokens", "progress/epoch", "train/loss_tokens", "perf/throughput", "perf/peak_memory",
               "time/step", "loss/nan_count")


class SFTDashboard(TrainingDashboard[SFTRunModel]):
    CHARTS = SFT_CHARTS
    LATEST_KEYS = LATEST_KEYS
    KIND, KIND_NAME = "sft", "SFT"

    THROUGHPUT, HEADLINE = "perf/throughput", ((TRAIN_LOSS, "loss {:.4f}"), (VAL_LOSS, "val {:.4f}"))
    BINDINGS = dashboard_bindings("sft", [("charts", "Charts"), ("logs", "Logs"), ("system", "System")],
                                  (logs_beside_binding("sft"),))

    def __init__(self, run: Run) -> None:
        super().__init__(run)
        self.model_on_disk = False  # the run's model folder exists (a run whose log lacks the model's event too)

    def new_model(self) -> SFTRunModel:
        return SFTRunModel()

    def latest_notes(self) -> list[str]:
        best = self.model.best_val_loss()
        return [] if best is None else [f"best val/loss {best[1]:.4g} @{best[0]}"]

    def compose_top(self) -> ComposeResult:
        yield from super().compose_top()
        panel = Static("", id="sft-model", markup=False)
        panel.border_title = "Model: use it by the run's id"
        panel.display = False  # until the run wrote its model
        yield panel

    # Following and drawing ----------------------------------------------------------------------------------
    def follow_files(self) -> None:
        super().follow_files()
        on_disk = self.run.model_dir.is_dir()
        with self.fold_lock:
            self.model_on_disk = on_disk

    def model_path(self) -> str | None:
        """The model folder the run wrote (None before it did)."""
        if self.model.model_path is not None:
            return self.model.model_path
        return str(self.run.model_dir) if self.model_on_disk else None

    def redraw(self) -> None:
        super().redraw()
        if not self.live:
            return
        path = self.model_path()
        panel = self.query_one("#sft-model", Static)
        if path is not None:
            panel.update(model_usage(self.run.id, path))
        panel.display = path is not None
