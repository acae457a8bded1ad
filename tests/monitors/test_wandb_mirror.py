"""The W&B mirror, against the real wandb: a run's event log goes into an offline W&B run that wandb's own reader
(`wandb leet inspect --json`) reads back with every metric of every step; a restart rewinds the same W&B run; the
key is never written; an unreachable W&B is reported and the run's events are still mirrored (offline)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from prime_lab.monitors.wandb_mirror import Rewind, StepAssembler, StepRecord, mirror_argv, wanted
from prime_lab.runs.events import Event
from prime_lab.runs.registry import Run, RunRegistry

WANDB = Path(sys.executable).parent / "wandb"
FAKE_KEY = "prime-lab-test-key-" + "7f3a9c" * 7  # 61 characters: long enough for wandb to accept it as a key
pytestmark = pytest.mark.timeout(120)


# A run directory written the way the run's processes write it ---------------------------------------------------
def make_run(home: Path, *, max_steps: int = 8) -> Run:
    resolved = {"model": "tiny-qwen3", "max_steps": max_steps, "max_async_level": 2, "batch_size": 8,
                "wandb": {"project": "prime-lab-tests", "name": "mirror-test", "entity": None}}
    return RunRegistry(home / "runs").create("rl", config_text="max_steps = 8\n", resolved=resolved,
                                             max_steps=max_steps)


def orchestrator_metrics(step: int, attempt: int) -> dict[str, float]:
    return {"reward/mean": attempt + step / 10, "rollout/mean_length": 100.0 * attempt + step}


def trainer_metrics(step: int, attempt: int) -> dict[str, float]:
    return {"loss": attempt * 10 + step / 100, "policy/entropy": 1.0 / (step + attempt)}


def write_steps(run: Run, steps: range, *, attempt: int = 1, pause: float = 0.0) -> dict[int, dict[str, float]]:
    """The orchestrator two steps ahead of the trainer (max_async_level 2), as in a real run; a sample per step,
    an eval at step 4 and an alert at step 5. Returns what each step should show in W&B."""
    expected: dict[int, dict[str, float]] = {}
    orchestrator, trainer, launcher = run.writer("orchestrator"), run.writer("trainer"), run.writer("launcher")
    # the trainer reports step s after the orchestrator has reported step s + 2
    order = [(who, step) for s in steps for who, step in (("o", s), ("t", s - 2)) if step in steps]
    order += [("t", s) for s in steps[-2:]]
    for who, step in order:
        if who == "o":
            orchestrator.metrics(orchestrator_metrics(step, attempt), step)
            orchestrator.emit("sample", {"env": "reverse-text", "example_id": step, "prompt": [
                {"role": "user", "content": f"reverse step {step}"}], "completion": f"completion {attempt}/{step}",
                "answer": "x", "reward": 0.5, "advantage": 0.1, "metrics": {"correct": 0.5}}, step=step)
            expected.setdefault(step, {}).update(orchestrator_metrics(step, attempt))
            if step == 4:
                orchestrator.emit("eval", {"metrics": {"eval/reverse-text/reward": 0.25 * attempt}}, step=step)
                expected[step]["eval/reverse-text/reward"] = 0.25 * attempt
        else:
            trainer.metrics(trainer_metrics(step, attempt), step)
            expected.setdefault(step, {}).update(trainer_metrics(step, attempt))
            if step == 5:
                launcher.emit("alert", {"name": "reward_drop", "message": "reward fell 40%", "level": "WARNING"},
                              step=step)
                expected[step]["alerts/reward_drop"] = 1.0
        time.sleep(pause)
    for writer in (orchestrator, trainer, launcher):
        writer.close()
    return expected


def mirror_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env["WANDB_CONFIG_DIR"] = str(tmp_path / "wandb-config")  # no user settings read, none written
    env.update(extra)
    return env


def start_mirror(run: Run, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(mirror_argv(run.dir), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_mirror(run: Run, env: dict[str, str], timeout: float = 60) -> str:
    """Mirror a run that has ended; returns the mirror's stderr."""
    out = subprocess.run(mirror_argv(run.dir), env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr
    return out.stderr


# Reading W&B's files back with wandb's own reader -----------------------------------------------------------------
def records(wandb_file: Path) -> list[dict[str, Any]]:
    out = subprocess.run([str(WANDB), "leet", "inspect", "--json", str(wandb_file)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def history(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r["history"]["item"] for r in recs if r["type"] == "history"]


def run_record(recs: list[dict[str, Any]]) -> dict[str, Any]:
    return next(r["run"] for r in recs if r["type"] == "run")


def offline_files(run: Run) -> list[Path]:
    """The .wandb file of each offline W&B run folder, oldest first (the order `wandb sync` must upload them)."""
    state = json.loads((run.dir / "wandb" / "run.json").read_text())
    folders = [Path(f) for f in state["folders"]]
    assert all(f.is_relative_to(run.dir) and f.name.startswith("offline-run-") for f in folders), folders
    return [next(f.glob("run-*.wandb")) for f in folders]


def assert_steps(items: list[dict[str, Any]], expected: dict[int, dict[str, float]]) -> None:
    by_step = {item["_step"]: item for item in items}
    assert len(by_step) == len(items), f"a step logged twice: {[i['_step'] for i in items]}"
    assert sorted(by_step) == sorted(expected)
    for step, values in expected.items():
        for name, value in values.items():
            assert by_step[step].get(name) == pytest.approx(value), (step, name, by_step[step])


def launcher_logs(run: Run) -> list[Event]:
    return [e for e in run.event_log().events() if e.kind == "log" and "wandb" in str(e.data.get("message"))]


# Tests --------------------------------------------------------------------------------------------------------------
def test_step_assembler_waits_for_both_sources_and_rewinds_once() -> None:
    def metrics(source: str, step: int, seq: int, **values: float) -> Event:
        return Event(seq=seq, time=0.0, source=source, kind="metrics", step=step, data=values)

    steps = StepAssembler(max_async_level=2)
    assert steps.feed(metrics("orchestrator", 1, 1, reward=0.1)) == []
    assert steps.feed(metrics("orchestrator", 2, 2, reward=0.2)) == []  # the trainer has not reported step 1
    assert steps.feed(metrics("trainer", 1, 3, loss=1.0)) == []  # nor moved past it
    out = steps.feed(metrics("trainer", 2, 4, loss=2.0))
    assert out == [StepRecord(1, {"reward": 0.1, "loss": 1.0})]
    assert steps.feed(Event(seq=5, time=0.0, source="launcher", kind="restart", step=0)) == [Rewind(0, 5)]
    assert steps.pending == {} and steps.logged == 0
    # a later mirror that already applied that restart replays it without rewinding again
    again = StepAssembler(logged=3, restart_seq=5)
    assert again.feed(Event(seq=5, time=0.0, source="launcher", kind="restart", step=0)) == []


def test_an_sft_runs_steps_wait_for_the_trainer_alone() -> None:
    def metrics(step: int, seq: int, **values: float) -> Event:
        return Event(seq=seq, time=0.0, source="trainer", kind="metrics", step=step, data=values)

    steps = StepAssembler(sources=("trainer",))
    assert steps.feed(metrics(1, 1, **{"loss/mean": 2.0})) == []
    assert steps.feed(metrics(1, 2, **{"val/loss": 2.5})) == []  # validation comes after the step's metrics
    assert steps.feed(metrics(2, 3, **{"loss/mean": 1.5})) == [StepRecord(1, {"loss/mean": 2.0, "val/loss": 2.5})]


SYSTEM_SAMPLE = {"interval_s": 5.0, "processes": [
    {"role": "trainer", "rank": 0, "pid": 10, "cpu_percent": 97.5, "rss_bytes": 2_000_000, "threads": 12},
    {"role": "sampler", "rank": 0, "pid": 11, "cpu_percent": 150.0, "rss_bytes": 3_000_000, "threads": 30}],
    "gpus": [{"index": 0, "name": "NVIDIA H100", "utilization_percent": 55.0, "memory_used_bytes": 10**9,
              "memory_total_bytes": 8 * 10**10}]}
SYSTEM_SCALARS = {"system/trainer.0/cpu_percent": 97.5, "system/trainer.0/rss_bytes": 2e6,
                  "system/trainer.0/threads": 12.0, "system/sampler.0/cpu_percent": 150.0,
                  "system/sampler.0/rss_bytes": 3e6, "system/sampler.0/threads": 30.0,
                  "system/gpu.0/utilization_percent": 55.0, "system/gpu.0/memory_used_bytes": 1e9}


def test_a_system_sample_joins_the_step_the_trainer_is_on() -> None:
    def event(source: str, kind: str, step: int | None, seq: int, data: dict[str, Any]) -> Event:
        return Event(seq=seq, time=0.0, source=source, kind=kind, step=step, data=data)

    later = {**SYSTEM_SAMPLE, "processes": [{**SYSTEM_SAMPLE["processes"][0], "cpu_percent": 50.0}]}
    steps = StepAssembler(max_async_level=2)
    assert steps.feed(event("launcher", "system", None, 1, SYSTEM_SAMPLE)) == []  # before any step: step 0
    steps.feed(event("orchestrator", "metrics", 1, 2, {"reward": 0.1}))
    steps.feed(event("orchestrator", "metrics", 2, 3, {"reward": 0.2}))
    assert steps.feed(event("trainer", "metrics", 1, 4, {"loss": 1.0})) == [StepRecord(0, SYSTEM_SCALARS)]
    steps.feed(event("launcher", "system", None, 5, SYSTEM_SAMPLE))
    steps.feed(event("launcher", "system", None, 6, later))  # the trainer is still on step 1: the newest wins
    out = steps.feed(event("trainer", "metrics", 2, 7, {"loss": 2.0}))
    assert out == [StepRecord(1, {"reward": 0.1, "loss": 1.0, **SYSTEM_SCALARS, "system/trainer.0/cpu_percent": 50.0})]


def test_importing_the_mirror_loads_no_wandb() -> None:
    """The launcher imports it to build the command; wandb (and torch, textual) load only in the mirror process."""
    code = ("import sys, prime_lab.monitors.wandb_mirror; "
            "print(sorted(m for m in ('wandb', 'torch', 'textual') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_wanted_needs_a_wandb_section() -> None:
    assert wanted({"wandb": {"project": "p"}}) and wanted({"wandb": {}})
    assert not wanted({"wandb": None}) and not wanted({})


def test_offline_run_has_every_metric_of_every_step(tmp_path: Path, lab_home: Path) -> None:
    run = make_run(lab_home)
    run.set_state("running")
    mirror = start_mirror(run, mirror_env(tmp_path))  # follows the log while the run writes it
    expected = write_steps(run, range(1, 9), pause=0.05)
    with run.writer("launcher") as launcher:  # the supervisor's system sample, after the trainer's last step
        launcher.emit("system", SYSTEM_SAMPLE)
    expected[8].update(SYSTEM_SCALARS)
    run.set_state("completed")
    _, stderr = mirror.communicate(timeout=60)
    assert mirror.returncode == 0, stderr

    [wandb_file] = offline_files(run)
    recs = records(wandb_file)
    state = json.loads((run.dir / "wandb" / "run.json").read_text())
    assert run_record(recs)["run_id"] == state["id"] and state["logged"] == 8
    assert run_record(recs)["project"] == "prime-lab-tests" and run_record(recs)["display_name"] == "mirror-test"
    assert run_record(recs)["config"]["update"]["max_steps"] == 8  # the resolved config
    items = history(recs)
    assert_steps(items, expected)
    # a table of the step's sample rollouts, written in the run folder
    step3 = next(i for i in items if i["_step"] == 3)
    table = json.loads((wandb_file.parent / "files" / step3["samples.path"]).read_text())
    assert table["columns"][:5] == ["step", "env", "example_id", "prompt", "completion"]
    assert table["data"] == [[3, "reverse-text", 3, "user: reverse step 3", "completion 1/3", "x", 0.5, 0.1,
                              '{"correct": 0.5}']]
    alerts = [r["alert"] for r in recs if r["type"] == "alert"]
    assert [(a["title"], a["text"]) for a in alerts] == [("reward_drop", "reward fell 40%")]
    # offline said once, on the console and in the run's log, with the command that uploads it
    sync = f"wandb sync {wandb_file.parent}"
    assert stderr.count("wandb sync") == 1 and sync in stderr
    notes = launcher_logs(run)
    assert len(notes) == 1 and sync in notes[0].data["message"]


def test_restart_rewinds_the_same_wandb_run(tmp_path: Path, lab_home: Path) -> None:
    """Attempt 1 logs steps 1-8; a restart from the step-6 checkpoint runs 7-10 again with other values.

    The offline files: folder 1 holds steps 1-8 of attempt 1; folder 2, the same run id, holds a run record with
    `branch_point {run: ID, metric: _step, value: 6}` (W&B's rewind) and steps 7-10 of attempt 2 only. The final
    view is folder 1 up to the branch point, then folder 2: steps 1-10 once each, 7-10 with attempt-2 values."""
    env = mirror_env(tmp_path)
    run = make_run(lab_home, max_steps=10)
    run.set_state("running")
    first = write_steps(run, range(1, 9))
    run.set_state("failed", reason="killed")
    run_mirror(run, env)

    run.update_status(attempt=2)  # what `prime rl restart` does, then the restart event, then the new attempt
    with run.writer("launcher") as launcher:
        launcher.emit("restart", {"checkpoint": "checkpoints/step_6"}, step=6)
    run.set_state("running")
    second = write_steps(run, range(7, 11), attempt=2)
    run.set_state("completed")
    run_mirror(run, env)

    before, after = (records(f) for f in offline_files(run))
    run_id = json.loads((run.dir / "wandb" / "run.json").read_text())["id"]
    assert run_record(before)["run_id"] == run_record(after)["run_id"] == run_id
    assert run_record(after)["branch_point"] == {"metric": "_step", "run": run_id, "value": 6}
    assert_steps(history(before), first)
    assert_steps(history(after), {s: v for s, v in second.items() if s > 6})  # nothing before the rewind again
    final = {i["_step"]: i for i in history(before) if i["_step"] <= 6} | {i["_step"]: i for i in history(after)}
    assert sorted(final) == list(range(1, 11))
    assert all(final[s]["loss"] == pytest.approx(trainer_metrics(s, 2)["loss"]) for s in range(7, 11))


def test_a_restarted_mirror_logs_no_step_twice(tmp_path: Path, lab_home: Path) -> None:
    env = mirror_env(tmp_path)
    run = make_run(lab_home)
    run.set_state("running")
    expected = write_steps(run, range(1, 5))
    mirror = start_mirror(run, env)
    deadline = time.monotonic() + 30
    while logged_step(run) < 3:  # steps 1-3 logged; step 4 waits for a later step (or the end)
        assert time.monotonic() < deadline and mirror.poll() is None
        time.sleep(0.1)
    mirror.send_signal(signal.SIGINT)  # the mirror stopped mid-run: it logs what it holds, finishes, starts again
    assert mirror.wait(timeout=30) == 0
    assert logged_step(run) == 4
    expected.update(write_steps(run, range(5, 9)))
    run.set_state("completed")
    run_mirror(run, env)

    files = offline_files(run)
    assert len(files) == 2
    logged = [history(records(f)) for f in files]
    assert max(i["_step"] for i in logged[0]) < min(i["_step"] for i in logged[1])
    assert_steps(logged[0] + logged[1], expected)


def logged_step(run: Run) -> int:
    try:
        return int(json.loads((run.dir / "wandb" / "run.json").read_text())["logged"])
    except (OSError, ValueError, KeyError):
        return -1


def test_a_stopping_run_keeps_its_last_steps(tmp_path: Path, lab_home: Path) -> None:
    """`prime rl stop` sends SIGTERM to the run's process group, the mirror too; the trainer still finishes its step
    after that, so the mirror keeps following until the run is `stopped`."""
    run = make_run(lab_home)
    run.set_state("running")
    mirror = start_mirror(run, mirror_env(tmp_path))
    deadline = time.monotonic() + 30
    while not (run.dir / "wandb" / "run.json").exists():  # the W&B run is open: the mirror is following
        assert time.monotonic() < deadline and mirror.poll() is None
        time.sleep(0.1)
    mirror.send_signal(signal.SIGTERM)
    expected = write_steps(run, range(1, 5), pause=0.05)  # written after the signal
    run.set_state("stopped")
    _, stderr = mirror.communicate(timeout=60)
    assert mirror.returncode == 0, stderr
    [wandb_file] = offline_files(run)
    assert_steps(history(records(wandb_file)), expected)


def test_the_key_is_never_written(tmp_path: Path, lab_home: Path) -> None:
    run = make_run(lab_home)
    run.set_state("running")
    expected = write_steps(run, range(1, 9))
    run.set_state("completed")
    run_mirror(run, mirror_env(tmp_path, WANDB_API_KEY=FAKE_KEY, WANDB_MODE="offline"))
    [wandb_file] = offline_files(run)
    assert_steps(history(records(wandb_file)), expected)  # it did mirror the run
    written = [p for p in run.dir.rglob("*") if p.is_file()]
    assert len(written) > 10
    assert [p for p in written if FAKE_KEY.encode() in p.read_bytes()] == []


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_unreachable_wandb_is_reported_and_the_run_still_mirrored(tmp_path: Path, lab_home: Path) -> None:
    env = mirror_env(tmp_path, WANDB_API_KEY=FAKE_KEY, WANDB_BASE_URL=f"http://127.0.0.1:{closed_port()}",
                     WANDB_INIT_TIMEOUT="3")
    run = make_run(lab_home)
    run.set_state("running")
    started = time.monotonic()
    mirror = start_mirror(run, env)
    expected = write_steps(run, range(1, 9))
    writing = time.monotonic() - started
    run.set_state("completed")
    _, stderr = mirror.communicate(timeout=60)
    assert mirror.returncode == 0, stderr
    assert writing < 5  # the run's writers never wait on W&B
    warnings = [e for e in launcher_logs(run) if e.data.get("level") == "WARNING"]
    assert len(warnings) == 1 and "offline" in warnings[0].data["message"], launcher_logs(run)
    [wandb_file] = offline_files(run)
    assert_steps(history(records(wandb_file)), expected)
    assert [p for p in run.dir.rglob("*") if p.is_file() and FAKE_KEY.encode() in p.read_bytes()] == []
