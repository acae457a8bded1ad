"""The RL run dashboard: the training dashboard (workbench.screens.dashboard_charts: header, alerts, live charts with
smoothing and series chosen by key, other RL runs overlaid for comparison, the logs; workbench.screens.
dashboard_training: the health line, the System tab, the logs beside the charts) with RL's charts (a teacher/kl
panel once an opd run logs it), the reward and tokens/s in its header, a samples browser, and in its Latest panel
the `[eval]` reward of the base model (step 0) beside the final policy's, as the run measured them."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import TabbedContent, TabPane

from prime_lab.monitors.alerts import TEACHER_LOSSES, run_loss
from prime_lab.runs.evaluations import with_failures
from prime_lab.runs.registry import Run
from prime_lab.workbench.dashboards.rl_model import DistillationRunModel, EvalRewards, RLRunModel
from prime_lab.workbench.dashboards.samples import EnvParsers, rollout_steps
from prime_lab.workbench.screens.dashboard_charts import ChartsDashboard, dashboard_bindings
from prime_lab.workbench.screens.dashboard_training import TrainingDashboard, logs_beside_binding
from prime_lab.workbench.widgets.charts import RL_CHARTS
from prime_lab.workbench.widgets.samples_browser import SamplesBrowser

LATEST_KEYS = ("reward/mean", "reward/std", "val_reward/mean", "policy/entropy", "policy/kl", "policy/ref_kl",
               "teacher/kl", "loss", "optim/lr", "optim/grad_norm", "rollout/mean_length", "rollout/truncated",
               "perf/tokens_per_s", "time/step")


def eval_lines(rewards: list[EvalRewards], max_steps: object) -> list[str]:
    """Per evaluated environment: `eval <env> <difference>` over `base <reward> -> final <reward>` (the newest
    evaluation is named by its step until it is the last step's), each reward with the rollouts that failed and
    counted 0 beside it."""
    lines = []
    for env, base, latest, step, base_failures, latest_failures in rewards:
        name = "final" if step == max_steps else f"step {step}"
        moved = f" {latest - base:+.3f}" if base is not None and latest is not None else ""
        parts = ([f"base {with_failures(f'{base:.3f}', base_failures)}"] if base is not None else []) + \
                ([f"{name} {with_failures(f'{latest:.3f}', latest_failures)}"] if latest is not None else [])
        lines += [f"eval {env.split('/')[-1]}{moved}", "  " + " -> ".join(parts)]
    return lines


class RLDashboard(TrainingDashboard[RLRunModel]):
    CHARTS = RL_CHARTS
    LATEST_KEYS = LATEST_KEYS
    KIND, KIND_NAME = "rl", "RL"
    TAB_ACTIONS = {**ChartsDashboard.TAB_ACTIONS, "samples": {"step"}}

    THROUGHPUT, HEADLINE = "perf/tokens_per_s", (("reward/mean", "reward {:.3f}"),)
    BINDINGS = dashboard_bindings("rl", [("charts", "Charts"), ("samples", "Samples"), ("logs", "Logs"),
                                         ("system", "System")], (
        Binding("left_square_bracket", "step(-1)", "Prev step", id="rl.prev_step"),
        Binding("right_square_bracket", "step(1)", "Next step", id="rl.next_step"),
        logs_beside_binding("rl"),
    ))

    def __init__(self, run: Run) -> None:
        super().__init__(run)
        self.steps: list[int] = []
        self.parsers = EnvParsers(self.status.get("envs") or [])

    def new_model(self) -> RLRunModel:
        """The run's model; a run that learns from a teacher (its resolved.json's `loss`) has alerts that know it."""
        return DistillationRunModel() if run_loss(self.run) in TEACHER_LOSSES else RLRunModel()

    def latest_notes(self) -> list[str]:
        return eval_lines(self.model.eval_rewards(), self.status.get("max_steps"))

    def compose_tabs(self) -> ComposeResult:
        with TabPane("Samples", id="samples"):
            yield SamplesBrowser(self.run.rollouts_dir, self.parsers, self._sample_events, id="samples-browser")

    # Following ----------------------------------------------------------------------------------------------
    def follow_files(self) -> None:
        super().follow_files()
        steps = rollout_steps(self.run.rollouts_dir)
        with self.fold_lock:
            self.steps = sorted(set(steps) | self.model.sample_steps())
            if not self.parsers.env_ids:
                self.parsers.env_ids = list(self.status.get("envs") or [])

    def _sample_events(self, step: int) -> list[dict[str, Any]]:
        with self.fold_lock:
            return [dict(s) for s in self.model.samples if s.get("step") == step]

    # Drawing and keys ---------------------------------------------------------------------------------------
    def redraw(self) -> None:
        super().redraw()
        if self.live and self.query_one(TabbedContent).active == "samples":
            self.query_one(SamplesBrowser).set_steps(self.steps)

    def action_step(self, delta: int) -> None:
        self.query_one(SamplesBrowser).move(delta)
