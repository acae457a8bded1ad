"""`prime train get | metrics | rollouts | checkpoints | progress`, `ls` and `logs --since/--search/--regex`, as a
user runs them: the installed console script on run directories written by the real Run and EventWriter."""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Iterator

import pytest

from prime_lab.runs import events as events_module
from prime_lab.runs.events import RESTART
from prime_lab.runs.registry import Run, RunRegistry
from prime_lab.trainer.batch import Sample, write_batch
from tests.support.cli import prime
from tests.workbench.lab_fixtures import recorded_run

ROW = re.compile(r"^\s*(\d+)\s")  # a table row starts with its step


def table_rows(stdout: str) -> dict[int, str]:
    rows = {}
    for line in stdout.splitlines():
        if (m := ROW.match(line)) is not None:
            assert int(m.group(1)) not in rows, f"step {m.group(1)} shown twice:\n{stdout}"
            rows[int(m.group(1))] = line
    return rows


def new_run(max_steps: int = 10) -> Run:
    return RunRegistry().create("rl", config_text="", resolved={}, model="smollm2-135m",
                                envs=["primeintellect/reverse-text"], max_steps=max_steps)


def fail_cleanly(*args: str, says: str) -> None:
    proc = prime(*args)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.startswith("Error: ") and says in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


def test_get_shows_the_runs_facts_and_unknown_ids_fail_cleanly() -> None:
    run = new_run()
    run.update_status(step=3, reason="resuming after step 2")
    run.register_process("cli", os.getpid())
    table = prime("train", "get", run.id[:6]).stdout  # a unique prefix is enough
    for text in (f"id           {run.id}", "state        queued", "model        smollm2-135m", "step         3/10",
                 "reason       resuming after step 2", f"processes    cli {os.getpid()} (alive)",
                 f"events       {run.events_path}", f"checkpoints  {run.checkpoints_dir}"):
        assert text in table.splitlines(), table
    facts = json.loads(prime("train", "get", run.id, "-o", "json").stdout)
    assert (facts["id"], facts["kind"], facts["state"], facts["step"], facts["max_steps"]) == (run.id, "rl", "queued",
                                                                                               3, 10)
    assert facts["processes"] == {"cli": {"pid": os.getpid(), "alive": True}}
    assert facts["paths"]["events"] == str(run.events_path) and "gepa" not in facts["paths"]
    for verb in ("get", "metrics", "rollouts", "checkpoints", "progress"):
        fail_cleanly("train", verb, "rl-nosuch", says="no run 'rl-nosuch'")


def write_steps(run: Run, steps: range, reward: float) -> None:
    """The orchestrator's and the trainer's metrics of `steps` in the run's current attempt; reward = step x reward."""
    with run.writer("orchestrator") as orchestrator, run.writer("trainer") as trainer:
        for step in steps:
            orchestrator.metrics({"reward/mean": round(step * reward, 4), "perf/tokens_per_s": 100.0 * step},
                                 step=step)
            trainer.metrics({"loss": round(-step * reward, 4), "optim/lr": 1e-5}, step=step)


def test_metrics_show_each_step_once_with_its_latest_attempt() -> None:
    """Steps 1-8 of attempt 1 (step 8 with an eval), a restart from the checkpoint of step 6, then steps 7-10 of
    attempt 2."""
    run = new_run()
    write_steps(run, range(1, 9), reward=0.01)
    with run.writer("orchestrator") as orchestrator:
        orchestrator.metrics({"eval/reverse-text/reward": 0.5}, step=8)
    run.update_status(attempt=2)
    with run.writer("launcher") as launcher:
        launcher.emit(RESTART, {"from_checkpoint": 6}, step=6)
    write_steps(run, range(7, 8), reward=0.1)
    midway = json.loads(prime("train", "metrics", run.id, "-o", "json").stdout)
    assert [r["step"] for r in midway] == list(range(1, 8))  # attempt 1's step 8 was rewound
    write_steps(run, range(8, 11), reward=0.1)

    rows = json.loads(prime("train", "metrics", run.id, "-o", "json").stdout)
    assert [r["step"] for r in rows] == list(range(1, 11))
    by_step = {r["step"]: r for r in rows}
    assert by_step[6]["attempt"] == 1 and by_step[6]["metrics"]["reward/mean"] == 0.06
    for step in (7, 8):  # written by both attempts: only the second one counts
        assert by_step[step]["attempt"] == 2
        assert by_step[step]["metrics"] == {"reward/mean": round(step * 0.1, 4), "perf/tokens_per_s": 100.0 * step,
                                            "loss": round(-step * 0.1, 4), "optim/lr": 1e-5}

    table = prime("train", "metrics", run.id)
    rows_shown = table_rows(table.stdout)
    assert sorted(rows_shown) == list(range(1, 11))
    assert rows_shown[7].split()[:4] == ["7", "2", "0.7", "-0.7"], table.stdout  # STEP ATTEMPT reward/mean loss
    assert rows_shown[6].split()[:4] == ["6", "1", "0.06", "-0.06"]
    assert "optim/lr" not in table.stdout and "-o json" in table.stderr  # the table has the key metrics only

    window = prime("train", "metrics", run.id, "--min-step", "3", "--max-step", "9", "-n", "2", "-o", "json")
    assert [r["step"] for r in json.loads(window.stdout)] == [8, 9]
    assert sorted(table_rows(prime("rl", "metrics", run.id, "--max-step", "2").stdout)) == [1, 2]


def sample(reward: float, prompt: str, completion: str) -> Sample:
    return Sample([1, 2, 3], [0, 1, 1], [0.0, -0.5, -0.25], advantage=reward - 0.5, env="reverse-text",
                  example_id=f"ex-{prompt}", reward=reward,
                  prompt=[{"role": "system", "content": "Reverse the text."}, {"role": "user", "content": prompt}],
                  completion=[{"role": "assistant", "content": completion}], answer=prompt[::-1])


def test_rollouts_of_a_step() -> None:
    run = new_run()
    fail_cleanly("train", "rollouts", run.id, says=f"{run.id} has no rollouts yet")
    write_batch(run.rollouts_dir, 3, [sample(0.75, "lantern", "nretnal"), sample(0.25, "harbor", "robrah!")])
    write_batch(run.rollouts_dir, 4, [sample(1.0, "meadow", "wodaem")])

    table = prime("train", "rollouts", run.id, "-s", "3").stdout
    assert table.splitlines()[0] == "step 3 · 2 rollouts · reward mean 0.500 (min 0.250, max 0.750)"
    assert "#1  reverse-text  ex-lantern  reward 0.75  advantage 0.25" in table
    assert "    prompt      lantern" in table and "    completion  nretnal" in table  # the user turn, not the system
    assert "    answer      robrah" in table
    rows = json.loads(prime("train", "rollouts", run.id, "--step", "3", "-o", "json").stdout)
    assert [(r["example_id"], r["reward"], r["completion"][0]["content"]) for r in rows] == [
        ("ex-lantern", 0.75, "nretnal"), ("ex-harbor", 0.25, "robrah!")]
    assert "ex-meadow" in prime("train", "rollouts", run.id).stdout  # no -s: the newest step
    fail_cleanly("train", "rollouts", run.id, "-s", "9", says="no rollouts of step 9; steps with rollouts: 3-4")


def test_checkpoints_mark_the_one_restart_resumes_from() -> None:
    run = new_run()
    fail_cleanly("train", "checkpoints", "rl-nosuch", says="no run")
    assert prime("train", "checkpoints", run.id, "-o", "json").stdout.strip() == "[]"
    for step in (2, 4, 6):
        folder = run.checkpoints_dir / f"step_{step}"
        folder.mkdir()
        (folder / "adapter_model.safetensors").write_bytes(b"x" * 1000 * step)
        if step != 6:  # the save of step 6 did not finish: no trainer state
            (folder / "trainer_state.pt").write_bytes(b"s" * 24)
        (run.adapters_dir / f"step_{step}").mkdir()
        (run.adapters_dir / f"step_{step}" / "adapter_config.json").write_text("{}")
    rows = json.loads(prime("train", "checkpoints", run.id, "-o", "json").stdout)
    assert [(r["step"], r["kind"]) for r in rows] == [(s, k) for s in (2, 4, 6) for k in ("adapter", "checkpoint")]
    checkpoints = {r["step"]: r for r in rows if r["kind"] == "checkpoint"}
    assert [s for s, r in checkpoints.items() if r["resume"]] == [4]
    assert [s for s, r in checkpoints.items() if not r["complete"]] == [6]
    assert checkpoints[4]["size_bytes"] == 4024 and checkpoints[4]["path"] == str(run.checkpoints_dir / "step_4")

    table = prime("train", "checkpoints", run.id)
    assert table.stderr == f"`prime train restart {run.id}` resumes after step 4\n"
    lines = [line.rstrip() for line in table.stdout.splitlines()]
    marked = [line.split()[:2] for line in lines if line.endswith("resumes here")]
    assert marked == [["4", "checkpoint"]]
    assert [line.split()[:2] for line in lines if line.endswith("incomplete")] == [["6", "checkpoint"]]
    assert any(line.split()[:2] == ["2", "adapter"] and "adapters/step_2" in line for line in lines)


@contextlib.contextmanager
def clock_at(clock: list[float]) -> Iterator[None]:
    """Events written inside carry the time clock[0] (EventWriter stamps time.time())."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(events_module.time, "time", lambda: clock[0])
        yield


def test_progress_of_a_running_and_a_finished_run() -> None:
    run = new_run(max_steps=10)
    run.set_state("running")
    now = time.time()
    clock = [0.0]
    with clock_at(clock), run.writer("orchestrator") as writer:
        for step in range(1, 5):  # a step every 10 s, the last one just now
            clock[0] = now - 10 * (4 - step)
            writer.metrics({"reward/mean": step / 10, "perf/tokens_per_s": 250.0}, step=step)
    run.update_status(step=4)
    facts = json.loads(prime("train", "progress", run.id, "-o", "json").stdout)
    assert (facts["state"], facts["step"], facts["max_steps"], facts["fraction"]) == ("running", 4, 10, 0.4)
    assert facts["seconds_per_step"] == pytest.approx(10.0, abs=0.01)
    assert facts["eta_s"] == pytest.approx(60.0, abs=0.1)
    assert (facts["reward"], facts["tokens_per_s"]) == (0.4, 250.0)
    table = prime("train", "progress", run.id).stdout.splitlines()
    assert table[0].startswith(f"{run.id}  running  step 4/10  [") and table[0].endswith("40%")
    assert "10.0 s/step  ETA 1m 00s" in table[1]
    assert table[2] == "reward 0.4  tokens/s 250"

    done = recorded_run("rl-run")  # the recorded 30-step run: finished, no ETA
    facts = json.loads(prime("train", "progress", done.id, "-o", "json").stdout)
    assert (facts["state"], facts["step"], facts["eta_s"], facts["reward"]) == ("completed", 30, None, 0.6455)
    assert facts["elapsed_s"] == pytest.approx(563.0)  # started_at to ended_at
    assert "ETA" not in prime("train", "progress", done.id).stdout


def test_ls_is_list() -> None:
    old, new = new_run(), new_run()
    new.update_status(created_at=time.time() + 1)
    listed = json.loads(prime("train", "ls", "-o", "json").stdout)
    assert [r["id"] for r in listed] == [new.id, old.id]
    assert [r["id"] for r in json.loads(prime("rl", "ls", "-n", "1", "-o", "json").stdout)] == [new.id]


def test_logs_since_search_and_regex() -> None:
    run = new_run()
    now = time.time()
    clock = [now - 3 * 3600]
    with clock_at(clock), run.writer("orchestrator") as writer:
        writer.log("warming up the sampler", step=0)
        clock[0] = now - 20 * 60
        writer.log("Rollout TIMED OUT; retried", level="WARNING", step=1)
        clock[0] = now
        writer.log("batch 2 done", step=2)

    def messages(*flags: str) -> list[str]:
        proc = prime("train", "logs", run.id, "-c", "orchestrator", *flags)
        assert proc.returncode == 0, proc.stderr
        return [line[line.index("step "):] for line in proc.stdout.splitlines()]

    assert len(messages()) == 3
    assert messages("--since", "1h") == ["step 1 Rollout TIMED OUT; retried", "step 2 batch 2 done"]
    assert messages("--since", "5m") == ["step 2 batch 2 done"]
    assert len(messages("--since", "1d")) == 3 and len(messages("--since", "2h59m")) == 2
    assert messages("--search", "timed out") == ["step 1 Rollout TIMED OUT; retried"]
    assert messages("--regex", r"(sampler|done)$") == ["step 0 warming up the sampler", "step 2 batch 2 done"]
    assert messages("--regex", "done", "--since", "1h", "--search", "STEP") == ["step 2 batch 2 done"]
    fail_cleanly("train", "logs", run.id, "--since", "15 minutes", says="--since takes a duration like 30s")
    fail_cleanly("train", "logs", run.id, "--regex", "(", says="--regex '(' is not a regular expression")


def test_train_is_the_primary_name_and_rl_its_alias() -> None:
    commands = [line.split()[1] for line in prime("--help").stdout.splitlines() if line.startswith("│ ")]
    assert commands.index("train") < commands.index("rl")
    for verb in ("get", "metrics", "rollouts", "checkpoints", "progress"):
        assert f"│ {verb} " in prime("train", "--help").stdout
    assert json.loads(prime("rl", "get", new_run().id, "-o", "json").stdout)["kind"] == "rl"
