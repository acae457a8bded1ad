"""prime_sandboxes' clients, local (sandbox/client.py) and put in prime_sandboxes' place (sandbox/shim.py): their
methods against real local sandboxes, answering with prime_sandboxes' own models and raising its own exceptions;
verifiers' own SandboxEnv built unmodified and its bash tool run in a sandbox; the same in a release environment's
interpreter (driver.py, where prime-lab cannot be imported); the `[sandbox]` table as the processes receive it."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sys
import sysconfig
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import prime_sandboxes
import pytest
from prime_sandboxes import (
    APIClient,
    BackgroundJob,
    CommandResponse,
    CommandTimeoutError,
    Sandbox,
    SandboxFileNotFoundError,
    SandboxNotRunningError,
    SandboxOOMError,
    StartCommand,
)

from prime_lab.envs import loader
from prime_lab.envs.env_server import run_driver
from prime_lab.envs.verifiers_adapter import VerifiersEnvironment
from prime_lab.evals.launcher import read_config
from prime_lab.gepa.config import validate_gepa_config
from prime_lab.runs.registry import pid_alive
from prime_lab.sandbox import client as ours
from prime_lab.sandbox import local, settings, shim, stats
from prime_lab.sandbox.config import SandboxConfig, applied, parse
from prime_lab.trainer.config import validate_rl_config
from tests.support import cli


@pytest.fixture(scope="module")
def sandbox_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One home for this file's sandboxes: an image's Python environment is made once (a few seconds)."""
    return tmp_path_factory.mktemp("sandboxes")


@pytest.fixture(autouse=True)
def sandboxes(sandbox_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("PRIME_LAB_SANDBOXES", str(sandbox_home))
    for name in settings.VARIABLES:
        monkeypatch.delenv(name, raising=False)
    shim.install()  # as the loader does before an environment loads
    yield sandbox_home
    for sandbox in local.list_sandboxes():  # nothing a test made outlives it
        sandbox.delete()


def request(**fields: Any) -> Any:
    return prime_sandboxes.CreateSandboxRequest(**{"name": "probe", "docker_image": "python:3.11-slim", **fields})


def test_a_sandboxs_logs_begin_with_what_its_start_command_wrote() -> None:
    """`get_logs` and `prime sandbox logs` (stats.command_log, cli record_head) show the start command first, with
    what it has written so far (it runs for the sandbox's life), then each command."""
    from prime_lab.sandbox import stats
    from prime_lab.workbench.cli.sandbox import record_head

    client = ours.SandboxClient(APIClient())
    box = client.create(request(start_command="echo held up; echo a warning >&2; exec sleep 60"))
    try:
        deadline = time.monotonic() + 20
        # what it wrote, not the command's own text (which holds the same words)
        while "\nheld up\na warning\n" not in client.get_logs(box.id):
            assert time.monotonic() < deadline, client.get_logs(box.id)
            time.sleep(0.05)
        assert client.execute_command(box.id, "echo after").exit_code == 0
        logs = client.get_logs(box.id)
        assert logs.startswith("$ echo held up; echo a warning >&2; exec sleep 60  (start command, running)\n"
                               "held up\na warning\n$ echo after  (exit 0, "), logs
        first, then = stats.command_log(local.get(box.id).folder)
        assert (first["start"], then["command"]) == (True, "echo after")
        assert record_head(first).endswith(" start command $ echo held up; echo a warning >&2; exec sleep 60")
    finally:
        client.delete(box.id)


def test_the_sync_client_runs_commands_files_and_jobs_with_prime_sandboxes_models(tmp_path: Path) -> None:
    client = ours.SandboxClient(APIClient())  # as environments build it: the API client is never called
    box = client.create(request(start_command=StartCommand(executable="tail", args=["-f", "/dev/null"]),
                                labels=["rollout-7"], environment_vars={"GREETING": "hello"}))
    assert isinstance(box, Sandbox) and box.status == "RUNNING" and box.labels == ["rollout-7"]
    client.wait_for_creation(box.id)
    assert client.bulk_wait_for_creation([box.id]) == {box.id: "RUNNING"}
    assert client.get(box.id).id == box.id
    assert [s.id for s in client.list(labels=["rollout-7"]).sandboxes] == [box.id]
    assert client.list(labels=["another"]).sandboxes == []

    done = client.execute_command(box.id, 'echo "$GREETING from $(pwd)"; echo oops >&2; exit 3')
    assert isinstance(done, CommandResponse)
    assert (done.stdout, done.stderr, done.exit_code) == ("hello from /app\n", "oops\n", 3)
    assert client.execute_command(box.id, "pwd", working_dir="/tmp", env={"X": "1"}).stdout == "/tmp\n"

    client.upload_bytes(box.id, "/app/data/input.txt", b"42\n", "input.txt")
    (tmp_path / "script.py").write_text("print(int(open('data/input.txt').read()) + 1)\n")
    uploaded = client.upload_file(box.id, "/app/script.py", str(tmp_path / "script.py"))
    assert uploaded.success and uploaded.path == "/app/script.py"
    assert client.execute_command(box.id, "python script.py > out.txt").exit_code == 0
    assert client.read_file(box.id, "/app/out.txt").content == "43\n"
    client.download_file(box.id, "/app/out.txt", str(tmp_path / "down" / "out.txt"))
    assert (tmp_path / "down" / "out.txt").read_text() == "43\n"
    with pytest.raises(SandboxFileNotFoundError, match="/app/missing.txt"):
        client.read_file(box.id, "/app/missing.txt")

    job = client.start_background_job(box.id, "sleep 0.2; echo background; exit 5")
    assert isinstance(job, BackgroundJob) and job.stdout_log_file.startswith("/tmp/job_")
    finished = client.run_background_job(box.id, "echo ran; echo warned >&2", timeout=30)
    assert (finished.completed, finished.exit_code, finished.stdout, finished.stderr) == (True, 0, "ran\n",
                                                                                        "warned\n")
    while not (status := client.get_background_job(box.id, job)).completed:
        time.sleep(0.01)
    assert (status.exit_code, status.stdout) == (5, "background\n")
    assert "$ python script.py > out.txt  (exit 0" in client.get_logs(box.id)

    other = client.create(request(labels=["rollout-7"]))
    assert client.delete(box.id)["success"]
    with pytest.raises(SandboxNotRunningError, match=box.id):
        client.execute_command(box.id, "true")
    gone = client.bulk_delete(labels=["rollout-7"])
    assert (gone.succeeded, gone.failed) == ([other.id], [])
    assert client.list().sandboxes == []


def test_the_async_client_raises_prime_sandboxes_timeout_and_oom_errors() -> None:
    async def scenario() -> None:
        async with ours.AsyncSandboxClient() as client:
            box = await client.create(request(start_command="tail -f /dev/null", memory_gb=0.25))
            await client.wait_for_creation(box.id)
            said = await client.execute_command(box.id, "python -c 'print(6 * 7)'")
            assert (said.stdout, said.exit_code) == ("42\n", 0)
            with pytest.raises(CommandTimeoutError, match="timed out after 1s"):
                await client.execute_command(box.id, "sleep 30", timeout=1)
            with pytest.raises(SandboxOOMError, match="ran out of memory"):
                await client.execute_command(box.id, "python -c 'x = bytearray(1 << 30)'")
            job = await client.run_background_job(box.id, "echo async", timeout=30)
            assert job.stdout == "async\n"
            assert (await client.bulk_delete([box.id])).succeeded == [box.id]

    asyncio.run(scenario())


def test_the_run_settings_win_over_the_request_and_an_allowlist_opens_nothing(
        capfd: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with applied(SandboxConfig(memory_gb=0.5, timeout=1), run_dir):
        client = ours.SandboxClient()
        box = client.create(request(memory_gb=4, network_allowlist=["pypi.org"]))
        made = local.get(box.id)
        assert (made.spec.memory_gb, made.spec.network, made.spec.run_dir) == (0.5, False, str(run_dir))
        assert box.memory_gb == 0.5
        with pytest.raises(CommandTimeoutError):  # no timeout given: [sandbox] timeout
            client.execute_command(box.id, "sleep 30")
        client.create(request(network_allowlist=["github.com"]))
        reach = "python -c \"import socket; socket.create_connection(('1.1.1.1', 80), timeout=0.5)\""
        assert client.execute_command(box.id, reach, timeout=10).exit_code == 1
    # said once each, to the run (its console or its alerts read them: stats.NoticeFollower), not on stderr
    notices = stats.NoticeFollower(run_dir).take()
    assert notices[0] == ("an environment asks for network access (network_allowlist); local sandboxes have none "
                          "unless [sandbox] network = true")
    assert notices[1].startswith(f"a command in sandbox {box.id} (probe) could not reach the network") \
        and len(notices) == 2
    assert "prime-lab sandbox" not in capfd.readouterr().err
    assert settings.RUN_DIR not in os.environ  # the block's settings are gone after it
    ours.say_once("outside a run", None)
    assert capfd.readouterr().err == "prime-lab sandbox: outside a run\n"


def write_module(folder: Path, name: str, text: str) -> None:
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.py").write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")


SANDBOX_ENV = """
    import verifiers as vf
    from datasets import Dataset


    def load_environment():
        return vf.SandboxEnv(dataset=Dataset.from_list([{"question": "q", "answer": "a"}]), max_turns=2)
"""


def test_verifiers_own_sandbox_env_loads_unmodified_and_its_bash_tool_runs_in_a_local_sandbox(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """verifiers 0.3.1's SandboxEnv passes start_command as a string, which prime-sandboxes 0.5.1 refuses (a
    ValidationError) and would reach Prime's cloud; loaded through prime-lab it builds, and one rollout's bash call
    runs in a local sandbox, deleted with the rollout."""
    shim.install("prime")  # Prime's clients back: the loader must make them local again
    write_module(tmp_path / "modules", "bash_sandbox_env", SANDBOX_ENV)
    monkeypatch.syspath_prepend(str(tmp_path / "modules"))
    wrapped = loader.load_environment("bash_sandbox_env")
    assert isinstance(wrapped, VerifiersEnvironment)
    env = wrapped.env  # verifiers' own environment object, as its load_environment returned it
    import verifiers.legacy.utils.threaded_sandbox_client as threaded

    assert threaded.AsyncSandboxClient is ours.AsyncSandboxClient
    assert prime_sandboxes.SandboxClient is ours.SandboxClient
    assert env.sandbox_request.start_command == StartCommand(executable="sh", args=["-c", "tail -f /dev/null"])

    async def rollout() -> tuple[str, str]:
        state = await env.setup_state({"sandbox_id": None})
        said = await env.bash("echo $((6 * 7)) from $(hostname); ls /root 2>&1; exit 0", state["sandbox_id"],
                              state["sandbox_state"])
        await env.destroy_sandbox(state)
        return state["sandbox_id"], said

    sandbox_id, said = asyncio.run(rollout())
    assert said.startswith("42 from ") and "No such file or directory" in said  # /root is not there inside
    with pytest.raises(local.SandboxGone):
        local.get(sandbox_id)
    env.sandbox_client.teardown()


PYTHON_ENV = """
    import verifiers as vf
    from datasets import Dataset


    def load_environment():
        return vf.PythonEnv(dataset=Dataset.from_list([{"question": "q", "answer": "a"}]), max_turns=3,
                            pip_install_packages="")
"""


def test_verifiers_python_env_keeps_its_python_worker_across_tool_calls(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """verifiers 0.3.1's PythonEnv, unmodified: its start command starts a Python worker in the background and
    writes its pid; each `python` call checks /proc/<pid> and talks to it through FIFOs in /tmp. The sandbox's
    commands run in its start command's namespaces, so the worker is there for each call and keeps its state."""
    write_module(tmp_path / "modules", "python_env_probe", PYTHON_ENV)
    monkeypatch.syspath_prepend(str(tmp_path / "modules"))
    wrapped = loader.load_environment("python_env_probe")
    assert isinstance(wrapped, VerifiersEnvironment)
    env = wrapped.env  # verifiers' own PythonEnv

    async def rollout() -> tuple[str, list[str], list[int]]:
        state = await env.setup_state({"sandbox_id": None})
        try:
            said = [await env.python(code, state["sandbox_id"], state["sandbox_state"], state["python_state"])
                    for code in ("x = 1", "x + 1", "import os; os.getpid() > 1, x * 10")]
            pids = local.get(state["sandbox_id"]).processes()
        finally:
            await env.destroy_sandbox(state)
        return state["sandbox_id"], said, pids

    sandbox_id, said, pids = asyncio.run(rollout())
    assert said == ["(no output)", "Out[2]: 2", "Out[3]: (True, 10)"], said
    assert pids and not [pid for pid in pids if pid_alive(pid)]  # its processes ended with the rollout
    with pytest.raises(local.SandboxGone):
        local.get(sandbox_id)
    env.sandbox_client.teardown()


def test_with_provider_prime_prime_sandboxes_keeps_its_hosted_clients() -> None:
    original = shim._originals["SandboxClient"] if shim._originals else prime_sandboxes.SandboxClient
    try:
        assert shim.install("prime") == "prime"
        assert prime_sandboxes.SandboxClient is original and prime_sandboxes.sandbox.SandboxClient is original
        # the request still takes the string form: that fix is no part of where sandboxes run
        assert request(start_command="sleep infinity").start_command == StartCommand(
            executable="sh", args=["-c", "sleep infinity"])
    finally:
        shim.install("local")
    assert prime_sandboxes.SandboxClient is ours.SandboxClient


RELEASE_MODULE = '''
    """Made at import."""
    import importlib.util

    from prime_sandboxes import APIClient, CreateSandboxRequest, SandboxClient

    client = SandboxClient(APIClient())
    box = client.create(CreateSandboxRequest(name="probe", docker_image="python:3.11-slim",
                                             start_command="tail -f /dev/null"))
    said = client.execute_command(box.id, "echo uid $(id -u)").stdout.strip()
    client.delete(box.id)
    __doc__ = (f"{type(client).__module__}: {said}; prime_lab importable: "
               f"{importlib.util.find_spec('prime_lab') is not None}")


    def load_environment():
        raise NotImplementedError
'''


def bare_interpreter(tmp_path: Path, modules: Path) -> Path:
    """This project's Python as a release environment's own: its packages, but not prime-lab (`-S`: no .pth file
    runs, so the editable install's finder is not there), and the module folder on its path."""
    script = tmp_path / "bin" / "python"
    script.parent.mkdir(exist_ok=True)
    path = f"{modules}:{sysconfig.get_paths()['purelib']}"
    script.write_text(f'#!/bin/sh\n[ "$1" = -I ] && shift\nPYTHONPATH={shlex.quote(path)} '
                      f'exec {shlex.quote(sys.executable)} -S -s -P "$@"\n')
    script.chmod(0o755)
    return script


def test_in_a_release_interpreter_the_driver_makes_prime_sandboxes_local(tmp_path: Path) -> None:
    """driver.py loads prime-lab's sandbox folder by path before the environment imports: the environment's own
    `SandboxClient(APIClient())` makes and uses a local sandbox where prime-lab cannot be imported."""
    modules = tmp_path / "modules"
    write_module(modules, "release_probe", RELEASE_MODULE)
    with applied(None):  # what a run's process hands its environment servers
        environ = dict(os.environ)
    answer = run_driver(bare_interpreter(tmp_path, modules), "check", "release_probe", env=environ, timeout=120)
    assert answer.get("ok"), answer
    assert answer["doc"] == "_prime_lab_sandbox.client: uid 65534; prime_lab importable: False"
    assert local.list_sandboxes() == []


def test_a_process_the_release_interpreter_spawns_gets_local_sandboxes_too(tmp_path: Path) -> None:
    """verifiers 0.3.1's server loads the environment in workers it starts with multiprocessing's spawn: a fresh
    interpreter that runs driver.py again (as __mp_main__), not its main(); prime_sandboxes is local there too."""
    modules = tmp_path / "modules"
    write_module(modules, "spawned_child", """
        def client_module():
            import prime_sandboxes

            return prime_sandboxes.AsyncSandboxClient.__module__
    """)
    write_module(modules, "spawning_env", """
        import multiprocessing

        import spawned_child

        with multiprocessing.get_context("spawn").Pool(1) as pool:
            __doc__ = pool.apply(spawned_child.client_module)


        def load_environment():
            raise NotImplementedError
    """)
    with applied(None):
        environ = dict(os.environ)
    answer = run_driver(bare_interpreter(tmp_path, modules), "check", "spawning_env", env=environ, timeout=120)
    assert answer.get("ok"), answer
    assert answer["doc"] == "_prime_lab_sandbox.client"


def test_the_sandbox_table_is_one_schema_in_the_rl_eval_and_gepa_configs(tmp_path: Path) -> None:
    rl = validate_rl_config(textwrap.dedent("""
        model = "smollm2-135m"
        max_steps = 2
        batch_size = 4
        rollouts_per_example = 2
        [sampling]
        max_tokens = 8
        [[env]]
        id = "reverse-text"
        [sandbox]
        network = true
        isolation = "weak"
        provider = "docker"
    """), file="rl.toml")
    assert [p.format() for p in rl.problems] == [
        "rl.toml:13: sandbox.provider: must be one of 'local' or 'prime' (got \"docker\")"]
    gepa = validate_gepa_config('[env]\nid = "reverse-text"\n[sandbox]\nmemory_gb = 2.0\n')
    assert gepa.config is not None and gepa.config.sandbox.memory_gb == 2.0
    (tmp_path / "eval.toml").write_text('[env]\nid = "reverse-text"\n[sandbox]\nnetwork = true\n')
    job = read_config(tmp_path / "eval.toml")
    assert job.sandbox == {"network": True} and job.to_json()["sandbox"] == {"network": True}
    with job.sandbox_settings():
        assert settings.from_environ() == settings.Settings(network=True)
    with pytest.raises(ValueError, match="--sandbox: network: "):
        parse({"network": "yes"}, "--sandbox")
    assert json.loads(json.dumps(SandboxConfig().resolved("/runs/x").environ())) == {
        settings.PROVIDER: "local", settings.NETWORK: "0", settings.ISOLATION: "strong", settings.TIMEOUT: "300",
        settings.RUN_DIR: "/runs/x"}


def test_a_bad_sandbox_flag_is_one_line() -> None:
    done = cli.prime("eval", "run", "reverse-text", "--sandbox", '{"network": "yes"}')
    assert done.returncode != 0
    assert "--sandbox: network: " in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
