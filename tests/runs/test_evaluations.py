"""A run's own evaluations before and after training, read from event logs the real EventWriter wrote: an RL run's
`[eval]` rewards per environment (the orchestrator's `eval` events), an SFT run's validation loss, a restart's
rewind, and the sizes each mean is over (recorded by the event, else from the run's config)."""

from __future__ import annotations

from typing import Any

from prime_lab.runs.evaluations import Evaluation, Failures, mean_of, read_evaluations, run_evaluations
from prime_lab.runs.events import RESTART
from prime_lab.runs.registry import Run, RunRegistry

RESOLVED = {"eval": {"num_examples": 20, "rollouts_per_example": 2, "env": [
    {"id": "primeintellect/reverse-text", "name": None, "num_examples": 8, "rollouts_per_example": None}]}}


def evaluate(run: Run, step: int, rewards: dict[str, float], failures: dict[str, Failures] | None = None,
             **sizes: Any) -> None:
    """What the orchestrator's `evaluate` writes: an `eval` event, and the same numbers as metrics; with
    `failures`, each environment's failed and timed-out rollouts and their totals."""
    metrics = {f"eval/{env}/reward": value for env, value in rewards.items()}
    if failures is not None:
        for env, counts in failures.items():
            metrics |= counts.metrics(env)
        metrics |= sum(failures.values(), Failures(0)).metrics()
    with run.writer("orchestrator") as writer:
        writer.emit("eval", {"metrics": metrics, "policy_version": step, **sizes}, step=step)
        writer.metrics(metrics, step)


def rl_run(resolved: dict[str, Any] | None = None) -> Run:
    return RunRegistry().create("rl", config_text="", resolved=resolved or {}, model="m",
                                envs=["reverse-text", "alphabet-sort"], max_steps=20)


def test_base_and_final_per_environment_with_what_each_mean_is_over() -> None:
    run = rl_run(RESOLVED)
    evaluate(run, 0, {"reverse-text": 0.25, "alphabet-sort": 0.5})
    with run.writer("orchestrator") as writer:
        for step in range(1, 21):
            writer.metrics({"reward/mean": 0.9}, step)  # training rewards are not evaluations
    evaluate(run, 10, {"reverse-text": 0.3, "alphabet-sort": 0.55})
    evaluate(run, 20, {"reverse-text": 0.75, "alphabet-sort": 0.375})
    reverse, alphabet = run_evaluations(run)
    assert reverse == Evaluation("eval/reverse-text/reward", "reverse-text", 0.25, 0, 0.75, 20, 8, 2)
    assert (reverse.change, reverse.over()) == (0.5, "8 examples x 2 rollouts")  # its [[eval.env]]'s own count
    assert alphabet == Evaluation("eval/alphabet-sort/reward", "alphabet-sort", 0.5, 0, 0.375, 20, 20, 2)
    assert alphabet.change == -0.125 and alphabet.to_json()["change"] == -0.125
    assert mean_of([reverse, alphabet]) == "mean reward"  # sizes differ: each row says its own
    assert mean_of([alphabet]) == "mean reward over 20 examples x 2 rollouts"


def test_sizes_the_event_records_win_over_the_config_and_all_examples_is_said() -> None:
    run = rl_run({"eval": {"num_examples": -1, "rollouts_per_example": 1, "env": []}})
    evaluate(run, 0, {"reverse-text": 0.1, "alphabet-sort": 0.2}, examples={"reverse-text": 6},
             rollouts_per_example={"reverse-text": 3})
    evaluate(run, 20, {"reverse-text": 0.4, "alphabet-sort": 0.2})
    reverse, alphabet = run_evaluations(run)
    assert (reverse.examples, reverse.rollouts_per_example, reverse.over()) == (6, 3, "6 examples x 3 rollouts")
    assert (alphabet.examples, alphabet.over()) == (None, "all eval examples x 1 rollout")
    assert alphabet.change == 0.0


def test_a_run_still_going_or_without_a_base_evaluation() -> None:
    run = rl_run()
    assert run_evaluations(run) == []  # no [eval]: nothing
    evaluate(run, 0, {"reverse-text": 0.2})
    only_base = run_evaluations(run)[0]
    assert (only_base.base, only_base.final, only_base.final_step, only_base.change) == (0.2, None, None, None)
    assert only_base.over() == "all eval examples x 1 rollout"  # no config: [eval]'s defaults
    resumed = rl_run()  # eval_base_model = false, or a run started from a checkpoint: no step 0
    evaluate(resumed, 10, {"reverse-text": 0.6})
    assert run_evaluations(resumed)[0].to_json() | {"metric": None} == {
        "metric": None, "env": "reverse-text", "base": None, "base_step": None, "final": 0.6, "final_step": 10,
        "change": None, "examples": None, "rollouts_per_example": None, "base_failures": None,
        "final_failures": None}


def base_and_final(run: Run) -> tuple[float | None, float | None, int | None]:
    (evaluation,) = run_evaluations(run)
    return evaluation.base, evaluation.final, evaluation.final_step


def test_a_restart_drops_the_evaluations_after_its_checkpoint() -> None:
    run = rl_run()
    evaluate(run, 0, {"reverse-text": 0.2})
    evaluate(run, 10, {"reverse-text": 0.4})
    evaluate(run, 15, {"reverse-text": 0.9})  # the attempt that died after step 15
    with run.writer("launcher") as writer:
        writer.emit(RESTART, {"from_step": 10}, step=10)
    assert base_and_final(run) == (0.2, 0.4, 10)  # base 0.2 -> step 10's 0.4
    evaluate(run, 20, {"reverse-text": 0.5})
    assert base_and_final(run) == (0.2, 0.5, 20)


def test_an_sft_runs_validation_loss_before_and_after() -> None:
    run = RunRegistry().create("sft", config_text="", resolved={"val": {"num_examples": 32}}, model="m",
                               envs=["data.jsonl"], max_steps=6)
    with run.writer("trainer") as writer:
        writer.metrics({"val/loss": 2.5, "val/perplexity": 12.2}, 0)  # eval_on_start
        for step in range(1, 7):
            writer.metrics({"loss/mean": 3.0 / step}, step)
        writer.metrics({"val/loss": 1.25, "val/perplexity": 3.5}, 6)
    (loss,) = run_evaluations(run)
    assert loss == Evaluation("val/loss", None, 2.5, 0, 1.25, 6, 32, None) and loss.change == -1.25
    assert mean_of([loss]) == "mean loss per trained token over 32 validation examples"
    assert read_evaluations(run.event_log().events())[0].over() == "the validation examples"  # no config


def test_values_that_are_not_numbers_are_left_out() -> None:
    run = rl_run()
    evaluate(run, 0, {"reverse-text": float("nan"), "alphabet-sort": 0.5})
    with run.writer("orchestrator") as writer:
        writer.emit("eval", {"metrics": "not a dict"}, step=5)
        writer.emit("eval", {"metrics": {"eval/x/reward": "high", "reward/mean": 0.3}}, step=6)
    assert [e.env for e in run_evaluations(run)] == ["alphabet-sort"]


def test_failed_and_timed_out_rollouts_are_kept_beside_each_mean_and_said() -> None:
    run = rl_run(RESOLVED)
    evaluate(run, 0, {"reverse-text": 0.207, "alphabet-sort": 0.5},
             {"reverse-text": Failures(16, timed_out=3), "alphabet-sort": Failures(16)})
    evaluate(run, 10, {"reverse-text": 0.3, "alphabet-sort": 0.4},
             {"reverse-text": Failures(16), "alphabet-sort": Failures(16, failed=2, timed_out=1)})
    evaluate(run, 15, {"reverse-text": 0.1})  # written before the counts were: none
    with run.writer("launcher") as writer:
        writer.emit(RESTART, {"from_step": 10}, step=10)  # step 15 is measured again
    reverse, alphabet = run_evaluations(run)
    assert (reverse.base_failures, reverse.final_failures) == (Failures(16, 0, 3), Failures(16))
    assert (alphabet.base_failures, alphabet.final_failures) == (Failures(16), Failures(16, 2, 1))
    assert reverse.to_json()["base_failures"] == {"rollouts": 16, "failed": 0, "timed_out": 3}
    assert [f.note() for f in (Failures(16, 0, 3), Failures(16, 2, 0), Failures(16, 2, 1), Failures(16))] == [
        "3 of 16 timed out, counted 0", "2 of 16 failed, counted 0", "2 of 16 failed, 1 timed out, counted 0", ""]
    evaluate(run, 20, {"reverse-text": 0.1})
    assert run_evaluations(run)[0].final_failures is None  # an event without counts says nothing
