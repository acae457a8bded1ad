"""What the launcher's watch loop (trainer/launcher.py `Supervisor.watch`) names as a run's failure. Its children and
servers are real processes here: an orchestrator that exited with an error and a judge server killed with -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from prime_lab.runs.processes import RunningServer, ServerProcess, free_port
from prime_lab.runs.registry import Run, RunRegistry
from prime_lab.trainer import launcher
from prime_lab.trainer.config import validate_rl_config
from tests.support.rl_runs import write_config

SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]


def rl_run(model: Path, tmp_path: Path) -> Run:
    text = write_config(tmp_path / "rl.toml", model, steps=3).read_text()
    result = validate_rl_config(text)
    assert result.config is not None, result.problems
    run = RunRegistry().create("rl", config_text=text, resolved=result.config.model_dump(mode="json"))
    run.update_status(model_path=str(model))
    return run


@pytest.fixture
def supervisor(tiny_model_dir: Path, tmp_path: Path) -> Iterator[launcher.Supervisor]:
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    supervisor = launcher.Supervisor(rl_run(tiny_model_dir, tmp_path))
    yield supervisor
    for process in supervisor.children.values():
        process.kill()
        process.wait()
    if supervisor.judge_server is not None:
        supervisor.judge_server.stop()
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


def exited(code: int) -> subprocess.Popen[bytes]:
    process = subprocess.Popen([sys.executable, "-c", f"import sys; sys.exit({code})"])
    process.wait()
    return process


def test_a_child_that_failed_after_a_server_died_names_the_server(supervisor: launcher.Supervisor,
                                                                  tmp_path: Path) -> None:
    """The judge is killed; its environment's groups fail at once and the orchestrator exits with an error before the
    loop next looks at the servers: the run's failure is the judge's death, the cause, not the orchestrator's."""
    judge_log = tmp_path / "judge.log"
    judge_log.write_text("serving on http://127.0.0.1\n")
    judge = ServerProcess(SLEEP, port=free_port(), log_path=judge_log, name="judge").start()
    supervisor.judge_server = RunningServer(judge, tmp_path, "judge")
    supervisor.children["trainer"] = subprocess.Popen(SLEEP)
    supervisor.children["orchestrator"] = exited(1)
    supervisor.last_error["orchestrator"] = "OrchestratorError: 10 groups in a row were dropped (Connection error.)"
    assert judge.pid is not None
    os.kill(judge.pid, signal.SIGKILL)
    judge._process.wait()  # type: ignore[union-attr]
    with pytest.raises(launcher.LaunchFailed) as failed:
        supervisor.watch()
    first, *rest = str(failed.value).splitlines()
    assert first == "the inference server (the judge) exited with code -9; its log ends:", str(failed.value)
    assert rest == ["serving on http://127.0.0.1"]


def test_a_child_that_failed_while_its_servers_run_is_the_failure(supervisor: launcher.Supervisor,
                                                                  tmp_path: Path) -> None:
    judge = ServerProcess(SLEEP, port=free_port(), log_path=tmp_path / "judge.log", name="judge").start()
    supervisor.judge_server = RunningServer(judge, tmp_path, "judge")
    supervisor.children["trainer"] = subprocess.Popen(SLEEP)
    supervisor.children["orchestrator"] = exited(3)
    with pytest.raises(launcher.LaunchFailed) as failed:
        supervisor.watch()
    assert str(failed.value).splitlines()[0] == "the orchestrator exited with code 3"
