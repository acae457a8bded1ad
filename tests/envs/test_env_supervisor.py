"""The supervisor of isolated environments' servers, with real `driver.py serve` processes: a server killed with -9
between groups or under one is started again and the group sent once more; one that dies too often fails the
environment (EnvironmentDown, with its log's last lines); one that hangs (its loop blocked, or SIGSTOP) is found by
the ping watchdog, killed and started again, while one alive and slow is left to finish; a rollout cancelled by its
time limit leaves the client clean and is cancelled on its server (verifiers' cancel, which the driver honours: the
model endpoint sees its connection closed); two `[[env]]` entries of one id have their restarts counted each. Also:
records written under a lock by two processes at once, and server logs outside runs pruned.

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
import textwrap
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from prime_lab.envs import SamplingArgs, env_server, isolated
from prime_lab.envs.env_server import (
    PING,
    EnvironmentDown,
    EnvServerClient,
    group_request,
    health_check,
    takes_cancel,
)
from prime_lab.envs.environment import timed_out
from prime_lab.envs.isolated import IsolatedEnvironment, IsolatedRecord
from tests.envs.verifiers_standins import release_interpreter

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
`die` calls kill their server (-9), the next `hang` block its event loop; every call then awaits `slow` seconds
(alive: its server answers pings meanwhile) and, with `model`, a chat completion from the client's base URL through
httpx (which the real openai client runs on), which the test's endpoint never answers. A call cancelled says so in
the server's log."""
import asyncio
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

    def __init__(self, calls, die, hang, slow, model):
        self.calls, self.die, self.hang, self.slow, self.model = Path(calls), die, hang, slow, model

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
        try:
            await asyncio.sleep(self.slow)
            if self.model:
                import httpx

                async with httpx.AsyncClient(timeout=None) as http:
                    await http.post(client.options["base_url"] + "/chat/completions", json={"model": model})
        except asyncio.CancelledError:
            print(f"supervised_env: call {call} cancelled", flush=True)
            raise
        return [{"example_id": i.get("example_id"), "prompt": i["prompt"], "reward": 1.0, "metrics": {},
                 "completion": [{"role": "assistant", "content": "fine"}], "server_pid": os.getpid()}
                for i in inputs]


def load_environment(calls, die=0, hang=0, slow=0.0, model=False):
    if model:
        import httpx  # noqa: F401 (at load, not in the rollout's time)
    return SupervisedEnv(calls, die, hang, slow, model)
'''


@pytest.fixture(scope="session")
def env_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The environment's interpreter: a virtual environment beside ours (no pip, made in ~0.1 s)."""
    return release_interpreter(tmp_path_factory.mktemp("supervised-venv"), "0.1.8", {
        "verifiers/__init__.py": STAND_IN_VERIFIERS, "openai/__init__.py": STAND_IN_OPENAI,
        "supervised_env.py": SUPERVISED_ENV})


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
    assert event == {"env": "supervised-env", "role": env.server_role, "restarts": 1,
                     "max_restarts": isolated.MAX_RESTARTS, "exit_code": -9, "reason": "its server exited (code -9)",
                     "log_tail": event["log_tail"]}
    assert str(env.server_role).startswith("env-supervised-env")
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


def test_alive_and_slow_is_not_killed(env_python: Path, tmp_path: Path, fast: None,
                                      restarts: list[dict[str, Any]]) -> None:
    """A group that takes more than 8 watchdog intervals (a 2-minute group at 10 s, scaled) on a server that answers
    every ping completes on that server: no restart."""
    assert env_server.WATCHDOG_MISSES * env_server.WATCHDOG_INTERVAL_S < 1.0
    env = environment(env_python, tmp_path, slow=2.5)
    pid = answered(group(env))
    assert calls(tmp_path) == [pid] and restarts == []


def test_stopped_server_is_killed_within_the_bound(env_python: Path, tmp_path: Path, fast: None,
                                                   restarts: list[dict[str, Any]]) -> None:
    """A server that stops answering (SIGSTOP: alive, silent) under a group is killed after WATCHDOG_MISSES
    intervals and started again; the group is answered by the new one."""
    found: list[float] = []

    def restarted(info: dict[str, Any]) -> None:
        restarts.append(info)
        found.append(time.monotonic())

    isolated.serve_into(tmp_path / "logs", on_restart=restarted)
    env = environment(env_python, tmp_path, slow=1.0)

    async def main() -> tuple[list[Any], float]:
        rows = env.get_dataset(2)
        work = asyncio.ensure_future(env.run_group(MODEL, "m", rows, SamplingArgs(max_tokens=4)))
        while not (tmp_path / "calls").is_file():  # the server is in the group
            await asyncio.sleep(0.02)
        os.kill(calls(tmp_path)[0], signal.SIGSTOP)
        stopped = time.monotonic()
        return await asyncio.wait_for(work, 15), stopped

    done, stopped = asyncio.run(main())
    [first, second] = calls(tmp_path)
    assert answered(done) == second != first
    [event] = restarts
    assert event["reason"] == "its server answered none of 3 pings in 0.9 s (hung) and was killed"
    bound = (env_server.WATCHDOG_MISSES + 1) * env_server.WATCHDOG_INTERVAL_S + env_server.POLL_S
    assert found[0] - stopped < bound + 1.0  # the kill, and the first back-off (0.05 s); slack for a loaded machine


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


def test_a_rollout_past_its_limit_is_cancelled_on_its_server(env_python: Path, tmp_path: Path, fast: None,
                                                            restarts: list[dict[str, Any]]) -> None:
    """A group cut by its time limit sends verifiers' cancel; the driver cancels the group's task, and the model
    endpoint sees the connection of the request it was answering closed, at once, and no other."""
    env = environment(env_python, tmp_path, model=True)

    async def main() -> None:
        opened, closed = asyncio.Event(), asyncio.Event()
        connections = 0

        async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal connections
            connections += 1
            opened.set()
            await reader.read()  # until the client closes
            closed.set()
            writer.close()

        endpoint = await asyncio.start_server(never_answer, "127.0.0.1", 0)
        model = SimpleNamespace(base_url=f"http://127.0.0.1:{endpoint.sockets[0].getsockname()[1]}/v1", api_key="x")
        await env._ready_client("x")  # started, and answering pings
        [rollout] = await env.run_rollouts(model, "m", env.get_dataset(1), SamplingArgs(max_tokens=4), timeout=1.5)
        cut = time.monotonic()
        assert timed_out(rollout) and opened.is_set() and not closed.is_set()
        await asyncio.wait_for(closed.wait(), 5.0)
        assert time.monotonic() - cut < 2.0 and connections == 1  # at once: a loaded machine's slack
        endpoint.close()

    asyncio.run(main())
    assert env._server is not None and env._server.poll() is None and restarts == []  # cancelled, not killed
    log = env._server.log_path.read_text()
    assert "cancelled by its client" in log and "supervised_env: call 1 cancelled" in log


@pytest.mark.parametrize("cancels", [True, False])
def test_cancel_on_the_wire(cancels: bool) -> None:
    """What a server sees from a request its caller stopped waiting for, against a ZMQ stand-in of verifiers' ROUTER:
    the request, then verifiers' cancel (its id, an empty payload); a release without a cancel (0.1.10) gets none."""
    import zmq

    router: Any = zmq.Context.instance().socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    stand_in = SimpleNamespace(address=f"tcp://127.0.0.1:{port}", health=PING, cancels=cancels, poll=lambda: None)
    client = EnvServerClient(stand_in)  # type: ignore[arg-type]

    async def main() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(client.request({"request_type": "run_group"}), timeout=0.3)
        assert requests_pending(client) == set()
        client.close()

    try:
        asyncio.run(main())
        frames = []
        while router.poll(300):
            frames.append(router.recv_multipart())
    finally:
        router.close()
    requests = [f for f in frames if f[2] != PING]  # the watchdog's pings aside
    assert msgspec.msgpack.decode(requests[0][2]) == {"request_type": "run_group"}
    assert requests[1:] == ([[requests[0][0], requests[0][1], b""]] if cancels else [])
    assert [takes_cancel(v) for v in ("0.1.8", "0.1.9.post3", "0.1.10", "0.1.11", "0.1.12", "0.3.1")] == \
        [True, True, False, True, True, True]


def test_two_entries_of_one_id_count_their_own_restarts(env_python: Path, tmp_path: Path, fast: None,
                                                        restarts: list[dict[str, Any]]) -> None:
    """Two `[[env]]` entries of one isolated id have a server each: a restart of the second's is counted under its
    name (`env/<name>/restarts`), not the first's."""
    from prime_lab.runs.registry import RunRegistry
    from prime_lab.trainer.config import validate_rl_config
    from prime_lab.trainer.orchestrator import Orchestrator
    from prime_lab.trainer.runtime import load_config

    isolated.save_record(replace(environment(env_python, tmp_path).record, any_args=True))
    text = f"""model = "tiny"
max_steps = 1
batch_size = 4
rollouts_per_example = 2

[sampling]
max_tokens = 2

[[env]]
id = "supervised-env"
name = "first"
args = {{ calls = "{tmp_path / 'calls-first'}" }}

[[env]]
id = "supervised-env"
name = "second"
args = {{ calls = "{tmp_path / 'calls-second'}" }}
"""
    result = validate_rl_config(text)
    assert result.ok and result.config is not None, [p.format() for p in result.problems]
    run = RunRegistry().create("rl", config_text=text, resolved=result.config.model_dump(mode="json"))
    orchestrator = Orchestrator(run, load_config(run), "http://127.0.0.1:9/v1", "tiny")
    first, second = orchestrator.envs["first"], orchestrator.envs["second"]
    assert isinstance(first, IsolatedEnvironment) and isinstance(second, IsolatedEnvironment)
    answered(group(first))
    os.killpg(answered(group(second)), signal.SIGKILL)
    answered(group(second))  # restarted
    assert first.server_role != second.server_role
    assert orchestrator.env_metrics({}) == {"env/first/restarts": 0.0, "env/second/restarts": 1.0}
    [alert] = [e for e in run.event_log().events() if e.kind == "alert"]
    assert alert.data["env"] == "second" and alert.data["message"].startswith("environment second: its server died")


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
