"""The supervisor of isolated environments' servers, with real `driver.py serve` processes: a server killed with -9
between groups or under one is started again and the group sent once more; one that dies too often fails the
environment (EnvironmentDown, with its log's last lines); one that hangs is found by the ping watchdog, killed and
started again; a rollout cancelled by its time limit leaves the client clean. Also: records written under a lock by
two processes at once, and server logs outside runs pruned.

The environment's interpreter is a small virtual environment made once per session: the project's packages (pyzmq,
msgpack) through a `.pth` file; stand-ins for a verifiers release without a server of its own (as 0.1.8;
`load_environment` only, so prime-lab's driver serves it) and for openai (the client the driver builds, which these
rollouts never call): the real ones take seconds to import, at each of a server's starts; and `supervised_env`, whose
rollouts answer, die or hang as its arguments say.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import sysconfig
import textwrap
import time
import venv
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from prime_lab.envs import SamplingArgs, env_server, isolated
from prime_lab.envs.env_server import PING, EnvironmentDown, EnvServerClient, group_request, health_check
from prime_lab.envs.isolated import IsolatedEnvironment, IsolatedRecord

STAND_IN_VERIFIERS = '''\
"""A stand-in for a verifiers release without a server of its own (0.1.8): load_environment only."""
import importlib


def load_environment(env_id, **kwargs):
    return importlib.import_module(env_id.replace("-", "_")).load_environment(**kwargs)
'''

STAND_IN_OPENAI = '''\
"""A stand-in for openai: the client prime-lab's driver builds for rollouts that never call a model."""


class AsyncOpenAI:
    def __init__(self, **options):
        self.options = options
'''

SUPERVISED_ENV = '''\
"""Rollouts that answer, die or hang: `calls` (a file) counts run_group calls across the server's lives; the first
`die` calls kill their server (-9), the next `hang` block its event loop."""
import os
import signal
import time
from pathlib import Path

ROWS = [{"prompt": [{"role": "user", "content": f"question {i}"}], "answer": str(i), "example_id": i}
        for i in range(4)]


class Rubric:
    reward_funcs = []


class SupervisedEnv:
    system_prompt = None
    sampling_args = {}
    message_type = "chat"
    parser = None
    rubric = Rubric()
    eval_dataset = None
    dataset = ROWS
    timeout_seconds = 42.0

    def __init__(self, calls, die, hang):
        self.calls, self.die, self.hang = Path(calls), die, hang

    def get_dataset(self):
        return list(ROWS)

    async def run_group(self, inputs, client, model, sampling_args, state_columns=None):
        with self.calls.open("a") as out:
            out.write(f"{os.getpid()}\\n")
        call = len(self.calls.read_text().splitlines())
        print(f"supervised_env: call {call}", flush=True)
        if call <= self.die:
            os.kill(os.getpid(), signal.SIGKILL)
        if call <= self.die + self.hang:
            time.sleep(600)
        return [{"example_id": i.get("example_id"), "prompt": i["prompt"], "reward": 1.0, "metrics": {},
                 "completion": [{"role": "assistant", "content": "fine"}], "server_pid": os.getpid()}
                for i in inputs]


def load_environment(calls, die=0, hang=0):
    return SupervisedEnv(calls, die, hang)
'''


@pytest.fixture(scope="session")
def env_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The environment's interpreter: a virtual environment beside ours (no pip, made in ~0.1 s)."""
    folder = tmp_path_factory.mktemp("supervised-venv")
    venv.EnvBuilder(with_pip=False).create(folder)
    python = folder / "bin" / "python"
    site = Path(subprocess.run([str(python), "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "project.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # after its own site-packages
    (site / "verifiers").mkdir()
    (site / "verifiers" / "__init__.py").write_text(STAND_IN_VERIFIERS)
    (site / "verifiers-0.1.8.dist-info").mkdir()
    (site / "verifiers-0.1.8.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: verifiers\n"
                                                                 "Version: 0.1.8\n")
    (site / "openai").mkdir()
    (site / "openai" / "__init__.py").write_text(STAND_IN_OPENAI)
    (site / "supervised_env.py").write_text(SUPERVISED_ENV)
    return python


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    """Back-offs, the check that a server lives and the watchdog in tenths of seconds."""
    monkeypatch.setattr(isolated, "RESTART_BACKOFF_S", (0.05, 0.1, 0.2))
    monkeypatch.setattr(env_server, "POLL_S", 0.1)
    monkeypatch.setattr(env_server, "WATCHDOG_INTERVAL_S", 0.3)


@pytest.fixture
def restarts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """Servers log into this test's folder; each restart lands in the list; every server ends with the test."""
    monkeypatch.setattr(isolated, "_context", dict(isolated._context))
    events: list[dict[str, Any]] = []
    isolated.serve_into(tmp_path / "logs", on_restart=events.append)
    yield events
    isolated.stop_servers()


def environment(python: Path, tmp_path: Path, **args: Any) -> IsolatedEnvironment:
    record = IsolatedRecord(name="supervised-env", module="supervised_env", distribution="supervised-env",
                            version="0.1", release="0.1.8", python=str(python), target=str(tmp_path),
                            reason="a test's")
    return IsolatedEnvironment(record, "supervised-env", {"calls": str(tmp_path / "calls"), **args})


MODEL = SimpleNamespace(base_url="http://127.0.0.1:9/v1", api_key="x")  # the rollouts never call it


def group(env: IsolatedEnvironment) -> list[Any]:
    return asyncio.run(env.run_group(MODEL, "m", env.get_dataset(2), SamplingArgs(max_tokens=4)))


def answered(rollouts: list[Any]) -> int:
    """The pid of the server that answered every rollout (errors fail the test, with their message)."""
    assert [r.error for r in rollouts] == [None] * len(rollouts)
    [pid] = {r.state["server_pid"] for r in rollouts}
    return int(pid)


def calls(tmp_path: Path) -> list[int]:
    """The pid of the server each run_group call reached, in order."""
    return [int(line) for line in (tmp_path / "calls").read_text().splitlines()]


def requests_pending(client: EnvServerClient) -> set[bytes]:
    """What the client waits for besides its health ping."""
    return set(client._pending) - ({client._ping[0]} if client._ping else set())


def test_killed_between_groups_is_restarted(env_python: Path, tmp_path: Path, fast: None,
                                            restarts: list[dict[str, Any]], caplog: pytest.LogCaptureFixture) -> None:
    env = environment(env_python, tmp_path)
    assert env.timeout_seconds == 42.0  # the environment's own time limit, as its interpreter describes it
    first = answered(group(env))
    os.killpg(first, signal.SIGKILL)
    second = answered(group(env))
    assert second != first and calls(tmp_path) == [first, second]
    [event] = restarts
    assert event == {"env": "supervised-env", "restarts": 1, "max_restarts": isolated.MAX_RESTARTS, "exit_code": -9,
                     "reason": "its server exited (code -9)", "log_tail": event["log_tail"]}
    assert "supervised_env: call 1" in event["log_tail"]
    assert "environment 'supervised-env' (verifiers 0.1.8): its server exited (code -9); starting it again " \
           "(restart 1 of 3)" in caplog.text


def test_killed_under_a_group_sends_it_again(env_python: Path, tmp_path: Path, fast: None,
                                             restarts: list[dict[str, Any]]) -> None:
    env = environment(env_python, tmp_path, die=1)  # the first group's server is killed (-9) while it serves it
    pid = answered(group(env))
    [died, served] = calls(tmp_path)
    assert served == pid != died
    assert [e["restarts"] for e in restarts] == [1]


def test_groups_in_flight_restart_it_once(env_python: Path, tmp_path: Path, fast: None,
                                          restarts: list[dict[str, Any]]) -> None:
    """Groups waiting on one server when it dies are each sent again, to one server started anew."""
    env = environment(env_python, tmp_path, die=1)
    rows = env.get_dataset(2)

    async def groups() -> list[list[Any]]:
        return await asyncio.gather(*(env.run_group(MODEL, "m", rows, SamplingArgs(max_tokens=4)) for _ in range(4)))

    pids = {answered(g) for g in asyncio.run(groups())}
    assert len(pids) == 1 and [e["restarts"] for e in restarts] == [1]


def test_dying_past_the_bound_fails_the_environment(env_python: Path, tmp_path: Path, fast: None,
                                                    restarts: list[dict[str, Any]]) -> None:
    """Killed four times (the first group twice, the next twice): three restarts, then EnvironmentDown, which every
    later group gets at once."""
    env = environment(env_python, tmp_path, die=4)
    failed = group(env)  # died under it, and again on the restarted server: its rollouts fail, as before
    assert all(r.error is not None and "its server exited (code -9)" in r.error for r in failed)
    with pytest.raises(EnvironmentDown) as down:
        group(env)
    message = str(down.value)
    assert message.startswith("environment 'supervised-env' (verifiers 0.1.8, in its own interpreter) is down: its "
                              "server died 4 times (3 restarts tried, the most allowed); the last time its server "
                              "exited (code -9). Last lines of its log (")
    assert "supervised_env: call 4" in message  # the log's last lines
    assert [e["restarts"] for e in restarts] == [1, 2, 3] and len(set(calls(tmp_path))) == 4
    assert env._server is None  # nothing of it is left running
    started = time.monotonic()
    with pytest.raises(EnvironmentDown):
        group(env)
    assert time.monotonic() - started < 0.5


def test_hung_server_is_killed_and_restarted(env_python: Path, tmp_path: Path, fast: None,
                                            restarts: list[dict[str, Any]]) -> None:
    env = environment(env_python, tmp_path, hang=1)  # the first group blocks its server's event loop
    started = time.monotonic()
    pid = answered(group(env))
    [hung, served] = calls(tmp_path)
    assert served == pid != hung
    [event] = restarts
    assert event["exit_code"] == -9 and event["reason"] == "its server answered none of 3 pings in 0.9 s (hung) " \
                                                           "and was killed"
    assert time.monotonic() - started < 8


def test_cancelled_request_leaves_the_client_clean(env_python: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   restarts: list[dict[str, Any]]) -> None:
    """A rollout past its time limit (asyncio.wait_for) takes its request with it: nothing pending, no task but the
    receiver; a request after it is answered."""
    monkeypatch.setattr(isolated, "RESTART_BACKOFF_S", (0.05,))
    monkeypatch.setattr(env_server, "POLL_S", 0.1)
    env = environment(env_python, tmp_path, hang=1)
    rows = env.get_dataset(1)
    request = group_request([{"prompt": rows[0]["prompt"], "example_id": 0}], MODEL.base_url, "K", "m", {})

    async def main() -> None:
        client: EnvServerClient = await env._ready_client("x")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(client.request(request), timeout=1.0)
        assert requests_pending(client) == set()
        assert asyncio.all_tasks() == {asyncio.current_task(), client._receiver}
        while not (tmp_path / "calls").is_file():  # it reached the rollout, which hangs
            await asyncio.sleep(0.05)
        os.killpg(calls(tmp_path)[0], signal.SIGKILL)
        while env._server is not None and env._server.poll() is None:
            await asyncio.sleep(0.05)
        client = await env._ready_client("x")  # started anew
        answer = await asyncio.wait_for(client.request(request), timeout=5.0)
        assert answer["success"] and requests_pending(client) == set()

    asyncio.run(main())


def test_health_check_per_release() -> None:
    """0.1.10's and 0.1.11's own servers take a health request (b"ping" gets an error and a traceback in their log);
    the rest, prime-lab's driver included, b"ping"."""
    assert [health_check(v) == PING for v in ("0.1.8", "0.1.9.post3", "0.1.10", "0.1.11", "0.1.12", "0.3.1")] == \
        [True, True, False, False, True, True]
    assert msgspec.msgpack.decode(health_check("0.1.10")) == {"request_type": "health"}


def test_records_saved_at_once_are_all_kept(lab_home: Path) -> None:
    """Two processes save records into one file at once, many times each: none is lost."""
    script = textwrap.dedent("""
        import sys
        from prime_lab.envs.isolated import IsolatedRecord, save_record
        for i in range(40):
            save_record(IsolatedRecord(name=f"{sys.argv[1]}-{i}", module="m", distribution="d", version="1",
                                       release="0.1.8", python="p", target="t", reason="r"))
    """)
    workers = [subprocess.Popen([sys.executable, "-c", script, name]) for name in ("a", "b")]
    assert [w.wait(timeout=30) for w in workers] == [0, 0]
    names = set(json.loads(isolated.registry_path().read_text())["environments"])
    assert names == {f"{n}-{i}" for n in ("a", "b") for i in range(40)}
    isolated.remove_record("a-0")
    assert set(isolated.records()) == names - {"a-0"}


def test_logs_outside_runs_are_pruned(lab_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server started outside a run keeps the newest KEEP_LOGS logs (with their folders) in the logs folder."""
    monkeypatch.setattr(isolated, "_context", {"log_dir": None, "on_start": None, "on_restart": None})
    folder = lab_home / "environments" / "logs"
    folder.mkdir(parents=True)
    for i in range(25):
        log = folder / f"env-old-{i}.log"
        log.write_text("old\n")
        (folder / f"env-old-{i}.d").mkdir()
        os.utime(log, (1_000_000 + i, 1_000_000 + i))
    (folder / "notes.txt").write_text("not a server's log\n")
    path = isolated._log_path("fresh")
    assert path.parent == folder and path.name.startswith("env-fresh-")
    kept = sorted(int(p.stem.split("-")[-1]) for p in folder.glob("env-old-*.log"))
    assert kept == list(range(25 - isolated.KEEP_LOGS + 1, 25))  # 19 old ones and the new one make 20
    assert sorted(int(p.name[:-2].split("-")[-1]) for p in folder.glob("env-old-*.d")) == kept
    assert (folder / "notes.txt").is_file()
