"""An RL run's page shows its `[eval]` evaluations as the run measured them: the base model's reward (the
orchestrator's `eval` event at step 0) beside the final policy's, from the model the dashboard folds."""

from __future__ import annotations

import asyncio
from pathlib import Path

from textual.widgets import Static

from prime_lab.runs.evaluations import Failures
from prime_lab.runs.events import EventWriter
from prime_lab.runs.registry import Run, RunRegistry
from prime_lab.workbench.dashboards.files import read_events
from prime_lab.workbench.dashboards.rl_model import EvalRewards, RLRunModel
from prime_lab.workbench.screens.dashboard_rl import RLDashboard, eval_lines
from tests.workbench.lab_fixtures import FROZEN, caught_up, lab_folder, make_app, until

STEPS = 20


def evaluate(writer: EventWriter, step: int, rewards: dict[str, float]) -> None:
    """What the orchestrator's `evaluate` writes: an `eval` event, and the same numbers as metrics."""
    metrics = {f"eval/{env}/reward": value for env, value in rewards.items()}
    writer.emit("eval", {"metrics": metrics, "policy_version": step}, step=step)
    writer.metrics(metrics, step)


def rl_run(run_id: str = "rl-evals", *, final: bool = True) -> Run:
    run = RunRegistry().create("rl", config_text="", resolved={}, model="smollm2-135m",
                               envs=["primeintellect/reverse-text", "primeintellect/alphabet-sort"],
                               max_steps=STEPS, run_id=run_id)
    run.update_status(state="completed" if final else "running", step=STEPS if final else 10,
                      created_at=FROZEN - 600, started_at=FROZEN - 540)
    with run.writer("orchestrator") as writer:
        evaluate(writer, 0, {"reverse-text": 0.12, "alphabet-sort": 0.4})
        for step in range(1, (STEPS if final else 10) + 1):
            writer.metrics({"reward/mean": step / 40}, step)
        evaluate(writer, 10, {"reverse-text": 0.2, "alphabet-sort": 0.45})
        if final:
            evaluate(writer, STEPS, {"reverse-text": 0.31, "alphabet-sort": 0.35})
    return run


def folded(run: Run) -> RLRunModel:
    model = RLRunModel()
    model.feed(read_events(run.events_path, 0)[0])
    return model


def test_the_model_keeps_the_base_and_the_newest_evaluation_per_environment() -> None:
    model = folded(rl_run())
    assert model.eval_rewards() == [EvalRewards("alphabet-sort", 0.4, 0.35, STEPS),
                                    EvalRewards("reverse-text", 0.12, 0.31, STEPS)]
    model.rewind(15)  # resumed from step 15's checkpoint: the final evaluation is gone until it runs again
    assert model.eval_rewards()[1] == EvalRewards("reverse-text", 0.12, 0.2, 10)
    assert eval_lines(model.eval_rewards(), STEPS)[2:] == ["eval reverse-text +0.080", "  base 0.120 -> step 10 0.200"]
    assert RLRunModel().eval_rewards() == [] and eval_lines([], STEPS) == []


def test_the_latest_panel_says_how_many_rollouts_failed_beside_each_reward() -> None:
    """A rollout that failed or timed out counted 0 in the mean: the Latest panel says so beside the reward."""
    run = rl_run("rl-failed")
    with run.writer("orchestrator") as writer:
        writer.emit("eval", {"metrics": {"eval/reverse-text/reward": 0.5, "eval/reverse-text/rollouts": 16,
                                         "eval/reverse-text/failed": 0, "eval/reverse-text/timed_out": 3}},
                    step=STEPS)
    model = folded(run)
    assert model.eval_rewards()[1] == EvalRewards("reverse-text", 0.12, 0.5, STEPS, None, Failures(16, 0, 3))
    assert eval_lines(model.eval_rewards(), STEPS)[2:] == [
        "eval reverse-text +0.380", "  base 0.120 -> final 0.500 (3 of 16 timed out, counted 0)"]


def test_the_rl_page_shows_base_and_final_eval_rewards_side_by_side(tmp_path: Path) -> None:
    rl_run()

    async def scenario() -> None:
        app = make_app(lab_folder(tmp_path), run_id="rl-evals")
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: isinstance(app.screen, RLDashboard) and caught_up(app.screen))
            latest = str(app.screen.query_one("#latest", Static).render())
            assert "eval reverse-text +0.190\n  base 0.120 -> final 0.310" in latest
            assert "eval alphabet-sort -0.050\n  base 0.400 -> final 0.350" in latest

    asyncio.run(scenario())
