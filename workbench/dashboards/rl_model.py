"""An RL run as its dashboard sees it, folded from events: the metrics every training run has
(`workbench.dashboards.event_folds.MetricsFold`: bounded metric series, the latest merged metrics, checkpoints, the
log's alerts), plus recent samples, the `[eval]` evaluations' rewards, and alerts raised here by `monitors.alerts`
for logs that carry none.

A `restart` event at step k (the run resumed from the checkpoint of step k) rewinds what was folded for the steps
after k, as `runs.events.final_timeline` does for the other readers: each step shows its latest attempt."""

from __future__ import annotations

from collections import deque
from typing import Any, NamedTuple

from prime_lab.monitors.alerts import AlertMonitor, completion_text
from prime_lab.runs.evaluations import EvaluationFold, Failures
from prime_lab.workbench.dashboards.event_folds import MAX_ALERTS, MetricsFold, RawEvent
from prime_lab.workbench.dashboards.series import DEFAULT_CAPACITY

MAX_SAMPLES = 200


class EvalRewards(NamedTuple):
    """One environment's `[eval]` reward: the base model's (step 0) and the newest policy's after it, each with its
    rollouts that failed and counted 0 (where the event recorded them)."""

    env: str
    base: float | None
    latest: float | None
    latest_step: int | None
    base_failures: Failures | None = None
    latest_failures: Failures | None = None


class RLRunModel(MetricsFold):
    """An RL run: the metrics, recent samples and the `[eval]` evaluations' rewards, with alerts raised here
    (`monitors.alerts`) for a log that has none."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY, loss: str = "rl") -> None:
        super().__init__(capacity)
        self.samples: deque[dict[str, Any]] = deque(maxlen=MAX_SAMPLES)
        self.local_alerts: deque[dict[str, Any]] = deque(maxlen=MAX_ALERTS)
        self.monitor = AlertMonitor(loss=loss)  # the run's loss, as the launcher's monitor has it
        self.evals = EvaluationFold()  # the orchestrator's `eval` events, as every reader folds them

    def rewind(self, step: int) -> None:
        super().rewind(step)
        self.samples = deque((s for s in self.samples if not (isinstance(s.get("step"), int) and s["step"] > step)),
                             maxlen=MAX_SAMPLES)
        self.evals.rewind(step)

    def fold(self, kind: str, step: Any, data: dict[str, Any], raw: RawEvent) -> None:
        super().fold(kind, step, data, raw)
        step = step if isinstance(step, int) else None
        alerts: list[dict[str, Any]] = []
        if kind == "metrics" and step is not None:
            alerts = self.monitor.observe_metrics(data, step)
        elif kind == "eval" and step is not None:
            self.evals.add(kind, step, data)
        elif kind == "sample":
            self.samples.append({**data, "step": step})
            alerts = self.monitor.observe_sample(completion_text(data.get("completion")),
                                                 str(data.get("example_id", "")), step)
        for alert in alerts:
            self.local_alerts.append({**alert, "step": step, "source": "lab"})

    # Views ------------------------------------------------------------------------------------------------
    def eval_rewards(self) -> list[EvalRewards]:
        """Per environment the run evaluated (by name): the base model's reward (step 0, with `eval_base_model`)
        and the newest evaluation's after it (the final one once the run ends), as the run measured them."""
        return sorted((EvalRewards(e.env, e.base, e.final, e.final_step, e.base_failures, e.final_failures)
                       for e in self.evals.evaluations() if e.env is not None), key=lambda rewards: rewards.env)

    @property
    def alerts(self) -> list[dict[str, Any]]:
        """The log's alerts; for a log that has none (a run from before the monitor), the ones raised here."""
        return list(self.log_alerts) if self.log_alerts else list(self.local_alerts)

    def sample_steps(self) -> set[int]:
        """Steps with sample events among those kept."""
        return {s["step"] for s in self.samples if isinstance(s.get("step"), int)}


class DistillationRunModel(RLRunModel):
    """An RL run whose loss learns from a teacher (`loss = "opd"` or `"sft"`): its alerts know it (flat rewards are
    no `reward_std_collapse`, `monitors.alerts.TEACHER_LOSSES` treats the two alike). A class of its own so that a
    large log's replay in a child process builds it with no arguments (`FollowTarget.apart`)."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        super().__init__(capacity, loss="opd")
