"""A run's own evaluation before and after training where the user looks: at the end of `prime rl run --foreground`
(`follow_progress`, which `prime sft run --foreground` shares), in `prime rl get` and `prime rl progress` (text, and
`evaluation` in `-o json`), and an SFT run's validation loss the same way; on run folders written by the real Run
and EventWriter."""

from __future__ import annotations

import json

import pytest

from prime_lab.runs.registry import Run, RunRegistry
from prime_lab.workbench.cli.rl_run import follow_progress
from tests.support.cli import prime

RESOLVED = {"eval": {"num_examples": 20, "rollouts_per_example": 2, "env": []}}
TITLE = "evaluation (mean reward over 20 examples x 2 rollouts)"


def rl_run(*, steps_done: int = 10, final: bool = True, failures: dict[int, dict[str, int]] | None = None) -> Run:
    """An RL run of 10 steps whose orchestrator evaluated the base model and the policy after step 5 (and 10);
    `failures`: the counts of failed rollouts its events carry, by step."""
    run = RunRegistry().create("rl", config_text="", resolved=RESOLVED, model="smollm2-135m",
                               envs=["reverse-text", "alphabet-sort"], max_steps=10)
    with run.writer("orchestrator") as orchestrator, run.writer("trainer") as trainer:
        for step in [0, *range(1, steps_done + 1)]:
            if step in (0, 5) or (step == 10 and final):
                metrics = {"eval/reverse-text/reward": 0.125 + step / 20, "eval/alphabet-sort/reward": 0.5 - step / 40,
                           **(failures or {}).get(step, {})}
                orchestrator.emit("eval", {"metrics": metrics, "policy_version": step}, step=step)
                orchestrator.metrics(metrics, step)
            if step:
                orchestrator.metrics({"reward/mean": step / 10}, step)
                trainer.metrics({"loss": 0.1}, step)
    run.update_status(step=steps_done)
    run.set_state("completed" if final else "running")
    return run


def test_get_and_progress_show_the_base_and_final_evaluation() -> None:
    run = rl_run()
    table = prime("rl", "get", run.id).stdout
    lines = table.splitlines()
    assert lines[lines.index(TITLE) + 1].split() == ["ENV", "BASE", "(step", "0)", "FINAL", "(step", "10)", "CHANGE"]
    assert lines[lines.index(TITLE) + 2].split() == ["reverse-text", "0.125", "0.625", "+0.500"], table
    assert lines[lines.index(TITLE) + 3].split() == ["alphabet-sort", "0.500", "0.250", "-0.250"], table
    facts = json.loads(prime("rl", "get", run.id, "-o", "json").stdout)
    assert facts["evaluation"][0] == {"metric": "eval/reverse-text/reward", "env": "reverse-text", "base": 0.125,
                                      "base_step": 0, "final": 0.625, "final_step": 10, "change": 0.5,
                                      "examples": 20, "rollouts_per_example": 2, "base_failures": None,
                                      "final_failures": None}
    assert [e["env"] for e in facts["evaluation"]] == ["reverse-text", "alphabet-sort"]

    shown = prime("rl", "progress", run.id, "--plain").stdout.splitlines()
    assert shown[shown.index(TITLE) + 1:] == ["ENV\tBASE (step 0)\tFINAL (step 10)\tCHANGE",
                                             "reverse-text\t0.125\t0.625\t+0.500",
                                             "alphabet-sort\t0.500\t0.250\t-0.250"]


def test_a_running_run_shows_its_latest_evaluation_and_one_without_eval_none() -> None:
    running = rl_run(steps_done=7, final=False)
    shown = prime("rl", "progress", running.id, "--plain").stdout.splitlines()
    assert shown[shown.index(TITLE) + 1:] == ["ENV\tBASE (step 0)\tLATEST (step 5)\tCHANGE",
                                             "reverse-text\t0.125\t0.375\t+0.250",
                                             "alphabet-sort\t0.500\t0.375\t-0.125"]
    progress = json.loads(prime("rl", "progress", running.id, "-o", "json").stdout)
    assert [(e["env"], e["base"], e["final"], e["final_step"]) for e in progress["evaluation"]] == [
        ("reverse-text", 0.125, 0.375, 5), ("alphabet-sort", 0.5, 0.375, 5)]
    plain = RunRegistry().create("rl", config_text="", resolved={}, model="m", envs=["reverse-text"], max_steps=3)
    assert "evaluation" not in prime("rl", "get", plain.id).stdout  # no [eval]: no table


def test_an_sft_runs_validation_loss_before_and_after() -> None:
    run = RunRegistry().create("sft", config_text="", resolved={"val": {"num_examples": 16}}, model="m",
                               envs=["data.jsonl"], max_steps=4)
    with run.writer("trainer") as writer:
        writer.metrics({"val/loss": 2.5}, 0)
        for step in range(1, 5):
            writer.metrics({"loss/mean": 3.0 / step}, step)
        writer.metrics({"val/loss": 1.25}, 4)
    run.update_status(step=4)
    run.set_state("completed")
    shown = prime("sft", "get", run.id, "--plain").stdout.splitlines()
    title = "validation (mean loss per trained token over 16 validation examples)"
    assert shown[shown.index(title) + 1:] == ["METRIC\tBASE (step 0)\tFINAL (step 4)\tCHANGE",
                                             "val/loss\t2.5000\t1.2500\t-1.2500"]
    progress = json.loads(prime("sft", "progress", run.id, "-o", "json").stdout)
    assert [(e["metric"], e["base"], e["final"], e["examples"]) for e in progress["evaluation"]] == [
        ("val/loss", 2.5, 1.25, 16)]


def test_the_foreground_ends_with_the_evaluation(capsys: pytest.CaptureFixture[str]) -> None:
    run = rl_run()
    assert follow_progress(run.id, poll=0.01) == 0
    out, err = capsys.readouterr()
    assert out == ""  # stdout keeps the run id alone (printed before following)
    lines = err.splitlines()
    assert "evaluation of the base model (mean reward): reverse-text 0.125, alphabet-sort 0.500" in lines
    assert "evaluation of the policy after step 10 (mean reward): reverse-text 0.625, alphabet-sort 0.250" in lines
    end = lines[lines.index(TITLE):]
    assert [line.split() for line in end[2:4]] == [["reverse-text", "0.125", "0.625", "+0.500"],
                                                   ["alphabet-sort", "0.500", "0.250", "-0.250"]]
    assert end[-1] == f"{run.id} completed"


def test_failed_and_timed_out_rollouts_are_printed_beside_the_mean() -> None:
    """A rollout that failed or timed out is reward 0 in the mean; every view of the evaluation says how many."""
    counts = {f"eval/{env}/{key}": value for env in ("reverse-text", "alphabet-sort")
              for key, value in (("rollouts", 40), ("failed", 0), ("timed_out", 0))}
    failures = {0: counts | {"eval/reverse-text/timed_out": 3}, 5: counts,
                10: counts | {"eval/alphabet-sort/failed": 2, "eval/alphabet-sort/timed_out": 1}}
    run = rl_run(failures=failures)
    shown = prime("rl", "progress", run.id, "--plain").stdout.splitlines()
    assert shown[shown.index(TITLE) + 1:] == ["ENV\tBASE (step 0)\tFINAL (step 10)\tCHANGE",
                                             "reverse-text\t0.125 (3 of 40 timed out, counted 0)\t0.625\t+0.500",
                                             "alphabet-sort\t0.500\t0.250 (2 of 40 failed, 1 timed out, counted 0)"
                                             "\t-0.250"]
    assert "0.125 (3 of 40 timed out, counted 0)" in prime("rl", "get", run.id).stdout
    facts = json.loads(prime("rl", "get", run.id, "-o", "json").stdout)
    assert [(e["base_failures"], e["final_failures"]) for e in facts["evaluation"]] == [
        ({"rollouts": 40, "failed": 0, "timed_out": 3}, {"rollouts": 40, "failed": 0, "timed_out": 0}),
        ({"rollouts": 40, "failed": 0, "timed_out": 0}, {"rollouts": 40, "failed": 2, "timed_out": 1})]


def test_the_foreground_prints_failed_rollouts_beside_each_evaluation(capsys: pytest.CaptureFixture[str]) -> None:
    run = rl_run(failures={0: {"eval/reverse-text/rollouts": 40, "eval/reverse-text/failed": 0,
                               "eval/reverse-text/timed_out": 3}})
    assert follow_progress(run.id, poll=0.01) == 0
    lines = capsys.readouterr().err.splitlines()
    assert ("evaluation of the base model (mean reward): reverse-text 0.125 (3 of 40 timed out, counted 0), "
            "alphabet-sort 0.500") in lines
    end = lines[lines.index(TITLE):]
    assert end[2].split()[:8] == ["reverse-text", "0.125", "(3", "of", "40", "timed", "out,", "counted"]
