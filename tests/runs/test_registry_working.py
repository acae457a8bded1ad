"""`runs.registry.working`: the lifecycle an in-process run (an evaluation, a GEPA search) goes through, with a real
`RunRegistry.stop` (SIGTERM) from another process."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prime_lab.runs.registry import RunRegistry, RunStopped, working

WORKER = """
import sys, time
from prime_lab.runs.registry import Run, RunStopped, working
run = Run(sys.argv[1])
try:
    with working(run, "eval") as cleanup:
        cleanup.callback(lambda: run.writer("eval").log("sampler stopped"))
        run.set_state("running", source="eval")
        time.sleep(60)
except RunStopped:
    sys.exit(3)
"""


def test_a_stop_from_another_process_leaves_the_run_stopped_after_its_cleanup(tmp_path: Path) -> None:
    registry = RunRegistry(tmp_path / "runs")
    run = registry.create("eval", config_text="", resolved={}, name="eval x")
    proc = subprocess.Popen([sys.executable, "-c", WORKER, str(run.dir)], start_new_session=True)  # as `launch`
    deadline = time.monotonic() + 60
    while run.state != "running" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert run.state == "running" and run.read_status()["processes"]["eval"]["pid"] == proc.pid
    registry.stop(run.id, grace=30)
    assert proc.wait(timeout=30) == 3  # RunStopped reached the caller, which chose its exit code
    status = run.read_status()
    assert (status["state"], status["reason"]) == ("stopped", "stopped by the user")
    messages = [e.data.get("message") for e in run.event_log().events()]
    assert "sampler stopped" in messages


def test_ctrl_c_is_interrupted_and_sigterm_handler_comes_back(tmp_path: Path) -> None:
    run = RunRegistry(tmp_path / "runs").create("gepa", config_text="", resolved={}, name="gepa x")
    before = signal.getsignal(signal.SIGTERM)
    stopped: list[str] = []
    with pytest.raises(KeyboardInterrupt), working(run, "gepa") as cleanup:
        cleanup.callback(stopped.append, "sampler")
        assert signal.getsignal(signal.SIGTERM) is not before
        raise KeyboardInterrupt
    assert stopped == ["sampler"] and signal.getsignal(signal.SIGTERM) is before
    assert (run.state, run.read_status()["reason"]) == ("stopped", "interrupted")
    with pytest.raises(RunStopped), working(run, "gepa"):
        signal.raise_signal(signal.SIGTERM)
    assert run.state == "stopped"


def test_an_unexpected_exception_fails_the_run_in_one_line_with_its_traceback_in_the_log(tmp_path: Path) -> None:
    """Any other exception leaves the run `failed` (not `running`) with its type and message's first line as the
    reason, its traceback in the run's log, and goes on up after the cleanup; a run its caller already failed (with
    a reason of its own) keeps that reason."""
    run = RunRegistry(tmp_path / "runs").create("eval", config_text="", resolved={}, name="eval x")
    stopped: list[str] = []
    with pytest.raises(ValueError, match="bad rows"), working(run, "eval") as cleanup:
        cleanup.callback(stopped.append, "sampler")
        run.set_state("running", source="eval")
        raise ValueError("bad rows\nrow 3 has no prompt")
    status = run.read_status()
    assert (status["state"], status["reason"], stopped) == ("failed", "ValueError: bad rows", ["sampler"])
    log = run.log_path("eval").read_text()
    assert "Traceback (most recent call last)" in log and "ValueError: bad rows\nrow 3 has no prompt" in log
    with pytest.raises(KeyError), working(run, "eval"):  # no message: its type alone
        raise KeyError()
    assert run.read_status()["reason"] == "KeyError"
    with pytest.raises(RuntimeError), working(run, "eval"):
        run.set_state("failed", source="eval", reason="the sampler did not start")
        raise RuntimeError("its own error")
    assert (run.state, run.read_status()["reason"]) == ("failed", "the sampler did not start")
