"""What a run's sandboxes say once reaches the user, whichever process made them (sandbox/stats.py notices): a
command that failed for want of the network names `[sandbox] network = true` on `prime eval run`'s console, once,
and in its metadata.json; in an RL run it is a `sandbox` alert, once, which `prime rl logs` and the run page show."""

from __future__ import annotations

import json
import signal
import textwrap
from pathlib import Path

import pytest

from prime_lab.envs import loader
from prime_lab.evals.launcher import EvalJob, create_run, evaluate
from prime_lab.monitors.alerts import SANDBOX_NOTICE
from prime_lab.sandbox import client as ours
from prime_lab.sandbox import local
from prime_lab.sandbox.config import applied
from prime_lab.sandbox.stats import STATS_FILE
from prime_lab.trainer import launcher
from tests.envs.scripted import scripted_endpoint
from tests.support.trainer_runs import new_run

REACH = "python -c \"import socket; socket.create_connection(('1.1.1.1', 80), timeout=0.5)\""
SETTING = "local sandboxes have none unless [sandbox] network = true"

NETWORK_ENV = f'''
import verifiers as vf
from datasets import Dataset
from prime_sandboxes import AsyncSandboxClient, CreateSandboxRequest


async def reached(completion, **kwargs) -> float:
    """Its scorer runs a command that needs the network, in a sandbox of its own (Prime's API, made local)."""
    client = AsyncSandboxClient()
    box = await client.create(CreateSandboxRequest(name="scorer", docker_image="python:3.11-slim",
                                                   start_command="tail -f /dev/null"))
    try:
        done = await client.execute_command(box.id, {REACH!r}, timeout=20)
    finally:
        await client.delete(box.id)
    return float(done.exit_code == 0)


def load_environment():
    rows = Dataset.from_list([{{"question": "q", "answer": "a"}}, {{"question": "r", "answer": "b"}}])
    return vf.SingleTurnEnv(dataset=rows, rubric=vf.Rubric(funcs=[reached]))
'''


def test_an_evaluation_says_once_on_its_console_and_keeps_in_its_metadata_what_its_sandboxes_said(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "modules").mkdir()
    (tmp_path / "modules" / "notice_network_env.py").write_text(textwrap.dedent(NETWORK_ENV))
    monkeypatch.syspath_prepend(str(tmp_path / "modules"))
    environment = loader.load_environment("notice_network_env")  # the loader makes prime_sandboxes local
    announced: list[str] = []
    with scripted_endpoint(["x", "y"]) as ep:
        job = EvalJob("notice-network-env", model="scripted", num_examples=2, rollouts_per_example=1,
                      base_url=ep.base_url, max_concurrent=2)
        run, out = create_run(job, output_dir=tmp_path / "out")
        result = evaluate(run, out, job, environment, announce=announced.append)
    said = [line for line in announced if SETTING in line]
    assert len(said) == 1 and said[0].startswith("WARNING: a command in sandbox "), announced
    assert "prime-lab sandbox" not in capfd.readouterr().err  # not a second time, raw, on the console
    assert [r.reward for r in result.rollouts] == [0.0, 0.0]
    metadata = json.loads((out / "metadata.json").read_text())
    assert metadata["sandbox_notices"] == [said[0].removeprefix("WARNING: ")]
    logged = [e.data["message"] for e in run.event_log().events() if e.kind == "log" and SETTING in
              str(e.data.get("message"))]
    assert logged == metadata["sandbox_notices"]
    assert local.list_sandboxes() == []


def test_an_rl_run_makes_what_its_sandboxes_said_an_alert_once(tiny_model_dir: Path) -> None:
    """Said by two processes of the run (an environment server and its restart, say): one `sandbox` alert."""
    run = new_run(tiny_model_dir, f'model = "{tiny_model_dir}"\nmax_steps = 2\nbatch_size = 4\n'
                  'rollouts_per_example = 2\n[sampling]\nmax_tokens = 4\n[[env]]\nid = "reverse-text"\n', [])
    with applied(None, run.dir):  # what the run's orchestrator hands its environments
        client = ours.SandboxClient()
        box = client.create(ours._ps().CreateSandboxRequest(name="probe", docker_image="python:3.11-slim"))
        assert client.execute_command(box.id, REACH, timeout=20).exit_code == 1
        assert client.execute_command(box.id, REACH, timeout=20).exit_code == 1
        client.delete(box.id)
    records = [json.loads(line) for line in (run.dir / STATS_FILE).read_text().splitlines()]
    notice = next(r for r in records if r["event"] == "notice")
    with (run.dir / STATS_FILE).open("a") as fh:  # another process of the run says it too
        fh.write(json.dumps({**notice, "message": notice["message"].replace(box.id, "sbx-another0")}) + "\n")
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        supervisor = launcher.Supervisor(run)
        supervisor.follow_events()
        supervisor.follow_events()
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    alerts = [e.data for e in run.event_log().events() if e.kind == "alert"]
    assert alerts == [{"name": SANDBOX_NOTICE, "message": notice["message"], "level": "WARNING"}]
    assert f"a command in sandbox {box.id} (probe) could not reach the network: {SETTING}" in notice["message"]
