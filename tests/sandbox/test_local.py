"""The local sandbox core (sandbox/local.py): create, commands sync and async, files, jobs, lifetime, images, pip,
delete, and get/list from another process. What it keeps out is tests/sandbox/test_security.py."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from prime_lab.runs.registry import pid_alive
from prime_lab.sandbox import local
from prime_lab.sandbox.local import Sandbox, SandboxSpec

PROBLEM = local.isolation_problem()
needs_namespaces = pytest.mark.skipif(PROBLEM is not None, reason=f"user namespaces unavailable here: {PROBLEM}")


@pytest.fixture
def sandbox() -> Iterator[Sandbox]:
    made = local.create(SandboxSpec(name="t", labels={"suite": "local"}))
    yield made
    made.delete()


@needs_namespaces
def test_create_is_fast_and_lays_out_its_folder() -> None:
    local.create(SandboxSpec()).delete()  # the image's pip environment, made once
    times = []
    for _ in range(5):
        started = time.perf_counter()
        made = local.create(SandboxSpec())
        times.append(time.perf_counter() - started)
        made.delete()
    sandbox = local.create(SandboxSpec(name="layout"))
    try:
        started = time.perf_counter()
        first = sandbox.execute("echo ready")
        round_trip = time.perf_counter() - started
        print(f"create: median {sorted(times)[2] * 1000:.1f} ms; `echo ready` round trip {round_trip * 1000:.1f} ms")
        assert sorted(times)[2] < 0.25 and first.stdout == "ready\n"
        assert {"app", "tmp", "logs", "sandbox.json"} <= set(os.listdir(sandbox.folder))
        assert json.loads((sandbox.folder / "sandbox.json").read_text())["spec"]["name"] == "layout"
    finally:
        sandbox.delete()


@needs_namespaces
def test_execute_runs_sh_in_app(sandbox: Sandbox) -> None:
    result = sandbox.execute("pwd; echo out; echo err >&2; echo $GREETING $HOME; exit 3", env={"GREETING": "hi"})
    assert (result.stdout, result.stderr, result.exit_code) == ("/app\nout\nhi /app\n", "err\n", 3)
    assert not result.timed_out and not result.oom and result.seconds > 0
    sandbox.execute("mkdir -p sub && echo inside > sub/f")
    assert sandbox.execute("cat f; pwd", working_dir="/app/sub").stdout == "inside\n/app/sub\n"
    made = local.create(SandboxSpec(env={"FROM_SPEC": "yes"}))
    try:
        assert made.execute("echo $FROM_SPEC").stdout == "yes\n"
    finally:
        made.delete()
    late = sandbox.execute("echo before; sleep 5; echo after", timeout=0.5)
    assert late.timed_out and late.exit_code == 124 and late.stdout == "before\n"
    log = (sandbox.folder / "logs" / "commands.log").read_text().splitlines()
    assert json.loads(log[-1])["exit_code"] == 124


@needs_namespaces
def test_aexecute_and_its_cancellation(sandbox: Sandbox) -> None:
    async def scenario() -> tuple[list[local.CommandResult], list[int]]:
        results = await asyncio.gather(*(sandbox.aexecute(f"echo {i}") for i in range(4)))
        task = asyncio.ensure_future(sandbox.aexecute("sleep 60"))
        while not sandbox.processes():
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return list(results), sandbox.processes()

    results, left = asyncio.run(scenario())
    assert [result.stdout for result in results] == ["0\n", "1\n", "2\n", "3\n"]
    assert left == []
    timed = asyncio.run(sandbox.aexecute("sleep 5", timeout=0.3))
    assert timed.timed_out and timed.exit_code == 124


@needs_namespaces
def test_aexecute_on_uvloop(sandbox: Sandbox) -> None:
    """verifiers 0.3.1's env workers run uvloop, whose subprocesses take no user or group: root's commands still run
    as the sandbox uid, and past their timeout are stopped."""
    import uvloop

    result = uvloop.run(sandbox.aexecute("id -u"))
    assert result.exit_code == 0, result
    assert result.stdout == f"{local.SANDBOX_UID if os.geteuid() == 0 else os.geteuid()}\n"
    stopped = uvloop.run(sandbox.aexecute("sleep 30", timeout=0.5))
    assert stopped.timed_out and stopped.exit_code == 124 and stopped.seconds < 5


@needs_namespaces
def test_files_in_and_out(sandbox: Sandbox) -> None:
    sandbox.write_file("data/in.txt", b"hello sandbox")
    sandbox.write_file("/tmp/t.bin", bytes(range(256)))
    assert sandbox.execute("cat /app/data/in.txt; wc -c < /tmp/t.bin").stdout == "hello sandbox256\n"
    assert sandbox.read_file("/app/data/in.txt", offset=6, length=3) == b"san"
    assert sandbox.read_file("/tmp/t.bin") == bytes(range(256))
    sandbox.execute("echo made inside > out.txt; ln -s out.txt link.txt")
    assert sandbox.read_file("out.txt") == b"made inside\n"
    assert sandbox.read_file("link.txt") == b"made inside\n"  # a link inside is followed inside
    assert b"include-system-site-packages" in sandbox.read_file("/opt/venv/pyvenv.cfg")  # read through the sandbox
    with pytest.raises(FileNotFoundError, match="nothing.txt"):
        sandbox.read_file("nothing.txt")
    sandbox.execute("chmod 700 data")
    sandbox.write_file("data/second.txt", b"2")  # the host writes as the sandbox's owner
    assert sandbox.execute("cat data/second.txt && echo >> data/second.txt && echo ok").stdout == "2ok\n"


@needs_namespaces
def test_background_jobs(sandbox: Sandbox) -> None:
    job = sandbox.start_job("echo started; sleep 0.5; echo done; echo oops >&2; exit 4")
    assert job.stdout_file == f"/tmp/job_{job.job_id}.stdout" and job.exit_file.startswith("/tmp/")
    assert sandbox.job_status(job) is None
    deadline = time.monotonic() + 10
    result = None
    while result is None and time.monotonic() < deadline:
        time.sleep(0.05)
        result = sandbox.job_status(job)
    assert result is not None and (result.stdout, result.stderr, result.exit_code) == ("started\ndone\n", "oops\n", 4)
    assert sandbox.execute(f"cat {job.exit_file}").stdout == "4\n"
    assert sandbox.processes() == []



@needs_namespaces
def test_a_job_that_ends_while_its_status_is_read_keeps_its_exit_code(sandbox: Sandbox,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """job_status reads the exit file, then looks at the job's process: a job that ends between the two is its own
    exit code, not a killed one (137)."""
    job = sandbox.start_job("while [ ! -e /tmp/go ]; do sleep 0.01; done; exit 5")
    running = local._pid_running

    def ends_in_between(pid: int, start: str | None) -> bool:  # the job ends after its exit file was read
        (Path(os.path.realpath(sandbox.folder)) / "tmp" / "go").write_text("")
        while running(pid, start):
            time.sleep(0.01)
        return running(pid, start)

    monkeypatch.setattr(local, "_pid_running", ends_in_between)
    result = sandbox.job_status(job)
    assert result is not None and result.exit_code == 5 and not result.oom, result


GET_AND_LIST = """
import json, sys
from prime_lab.sandbox import local
sandbox = local.get(sys.argv[1])
print(json.dumps({"out": sandbox.execute("cat marker.txt").stdout,
                  "listed": [s.id for s in local.list_sandboxes({"suite": "local"})],
                  "others": [s.id for s in local.list_sandboxes({"suite": "nope"})],
                  "pids": sandbox.info()["pids"]}))
sandbox.delete()
"""


@needs_namespaces
def test_get_list_and_delete_from_another_process(sandbox: Sandbox) -> None:
    sandbox.write_file("marker.txt", b"from the first process")
    job = sandbox.start_job("sleep 60")
    done = subprocess.run([sys.executable, "-c", GET_AND_LIST, sandbox.id], capture_output=True, text=True,
                          timeout=60, env=os.environ.copy())
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["out"] == "from the first process" and seen["listed"] == [sandbox.id] and seen["others"] == []
    assert len(seen["pids"]) >= 2  # the job's bwrap and what runs under it
    assert not os.path.exists(sandbox.folder) and sandbox.processes() == []
    with pytest.raises(local.SandboxGone):
        local.get(sandbox.id)
    with pytest.raises(local.SandboxGone):
        sandbox.execute("true")
    with pytest.raises(local.SandboxGone):
        sandbox.job_status(job)
    with pytest.raises(local.SandboxGone, match="no sandbox"):
        local.get("../../etc")


@needs_namespaces
def test_the_lifetime_ends_commands_then_the_sandbox() -> None:
    sandbox = local.create(SandboxSpec(timeout_minutes=1.5 / 60))
    forgotten = local.create(SandboxSpec(timeout_minutes=1 / 60))  # never deleted, and its home goes (as a test's)
    real = os.path.realpath(forgotten.folder)
    if real != str(forgotten.folder):  # root: the folder is in the shared /var/tmp one, the home held a link
        forgotten.folder.unlink()
    started = time.monotonic()
    result = sandbox.execute("sleep 30", timeout=60)
    assert result.timed_out and time.monotonic() - started < 5, result
    while time.time() < sandbox.expires:
        time.sleep(0.05)
    with pytest.raises(local.SandboxGone, match="lifetime"):
        sandbox.execute("true")
    assert not os.path.exists(sandbox.folder) and sandbox.id not in [s.id for s in local.list_sandboxes()]
    local._swept.clear()  # as in a fresh process: its first create sweeps the folders of ended sandboxes
    local.create(SandboxSpec()).delete()
    assert not os.path.exists(real)



def job_pid(sandbox: Sandbox, job: local.Job) -> int:
    return int(json.loads((sandbox.folder / "logs" / f"job_{job.job_id}.json").read_text())["pid"])


@needs_namespaces
def test_nothing_is_left_of_a_stopped_command_a_crashed_delete_or_a_removed_home(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Root's sandboxes live in a shared /var/tmp folder, which a test session must not fill: a command stopped at
    its timeout writes nothing after it returns (its delete leaves no half-removed folder), and a process's first
    create removes what a delete that died midway left and the sandboxes of a home that was removed."""
    data = local.data_home()
    for _ in range(3):
        writer = local.create(SandboxSpec())
        stopped = writer.execute("i=0; while :; do echo x > /tmp/f$i; i=$((i+1)); done", timeout=0.2)
        files = len(os.listdir(Path(os.path.realpath(writer.folder)) / "tmp"))
        time.sleep(0.05)
        assert stopped.timed_out and len(os.listdir(Path(os.path.realpath(writer.folder)) / "tmp")) == files
        writer.delete()
        assert not list(data.glob(f".deleted-{writer.id}-*"))
    crashed = local.create(SandboxSpec())
    pid = job_pid(crashed, crashed.start_job("sleep 60"))
    graveyard = data / f".deleted-{crashed.id}-000000"
    os.rename(os.path.realpath(crashed.folder), graveyard)  # delete()'s first step; its process died there
    home = tmp_path / "removed-home"
    monkeypatch.setenv("PRIME_LAB_SANDBOXES", str(home))
    forgotten = local.create(SandboxSpec())  # never deleted; then its home goes, as a test's temporary one does
    real = os.path.realpath(forgotten.folder)
    shutil.rmtree(home)
    monkeypatch.delenv("PRIME_LAB_SANDBOXES")
    local._swept.clear()  # as in a fresh process
    local.create(SandboxSpec()).delete()
    assert not os.path.exists(graveyard) and not os.path.exists(real) and not pid_alive(pid)


def test_images_map_to_an_interpreter_or_are_refused() -> None:
    assert local.image_minor("python:3.11-slim") == 11
    assert local.image_minor("python:3.12-slim-bookworm") == 12
    assert local.image_minor("docker.io/library/python:3.10") == 10
    assert local.image_minor("python") is None and local.image_minor("python:latest") is None
    for image in ("ubuntu:22.04", "node:20", "python:2.7", "ghcr.io/org/python:3.11"):
        with pytest.raises(local.ImageNotSupported) as refused:
            local.image_minor(image)
        assert image in str(refused.value) and "python:3.11-slim" in str(refused.value)
        assert "\n" not in str(refused.value)
    with pytest.raises(local.ImageNotSupported):
        local.create(SandboxSpec(image="ubuntu:22.04"))


@needs_namespaces
def test_a_python_version_this_machine_lacks_runs_on_its_own_with_a_note() -> None:
    sandbox = local.create(SandboxSpec(image="python:3.99-slim"))
    try:
        assert "python3.99" in (sandbox.info()["image_note"] or "")
        assert sandbox.execute("python -c 'import sys; print(sys.version_info[0])'").stdout == "3\n"
    finally:
        sandbox.delete()


def stub_wheel(folder: Path) -> Path:
    """A pure-Python wheel, `stubpkg` 1.0, for an offline pip install."""
    path = folder / "stubpkg-1.0-py3-none-any.whl"
    files = {"stubpkg/__init__.py": "VALUE = 42\n",
             "stubpkg-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: stubpkg\nVersion: 1.0\n",
             "stubpkg-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                            "Tag: py3-none-any\n"}
    record = "".join(f"{name},,\n" for name in files) + "stubpkg-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in {**files, "stubpkg-1.0.dist-info/RECORD": record}.items():
            wheel.writestr(name, text)
    return path


@needs_namespaces
def test_pip_installs_into_the_sandbox_only(sandbox: Sandbox, tmp_path: Path) -> None:
    wheel = stub_wheel(tmp_path)
    sandbox.write_file(f"wheels/{wheel.name}", wheel.read_bytes())
    installed = sandbox.execute("pip install -q --no-index --find-links /app/wheels stubpkg && "
                                "python -c 'import stubpkg; print(stubpkg.VALUE)'", timeout=120)
    assert installed.stdout == "42\n", installed
    other = local.create(SandboxSpec())
    try:
        assert other.execute("python -c 'import stubpkg'").exit_code != 0  # the image's environment is untouched
    finally:
        other.delete()


@needs_namespaces
def test_network_true_shares_the_hosts_network() -> None:
    sandbox = local.create(SandboxSpec(network=True))
    try:
        with socket.create_server(("127.0.0.1", 0)) as server:
            port = server.getsockname()[1]
            result = sandbox.execute(f"python -c \"import socket; socket.create_connection(('127.0.0.1', {port}))"
                                     f".close(); print('connected')\"")
            assert result.stdout == "connected\n", result
    finally:
        sandbox.delete()


@needs_namespaces
def test_a_sandbox_with_network_gets_the_hosts_package_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pip.conf is not bound: the host's PIP_INDEX_URL (a real index on 127.0.0.1 here) reaches a sandbox only with
    network, and an index URL with credentials, a local path or a cert outside what is bound never does."""
    simple = tmp_path / "index" / "simple" / "stubpkg"
    simple.mkdir(parents=True)
    wheel = stub_wheel(simple)
    (simple / "index.html").write_text(f'<a href="{wheel.name}">{wheel.name}</a>')
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(SimpleHTTPRequestHandler, directory=str(tmp_path / "index")))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    index = f"http://127.0.0.1:{server.server_address[1]}/simple"
    monkeypatch.setenv("PIP_INDEX_URL", index)
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "https://user:token@example.invalid/simple file:///opt/pypi/simple")
    monkeypatch.setenv("PIP_FIND_LINKS", "/opt/wheels")
    monkeypatch.setenv("PIP_CERT", str(tmp_path / "ca.pem"))
    show = "echo ${PIP_INDEX_URL-none} ${PIP_EXTRA_INDEX_URL-none} ${PIP_FIND_LINKS-none} ${PIP_CERT-none}"
    networked, closed = local.create(SandboxSpec(network=True)), local.create(SandboxSpec())
    try:
        assert networked.execute(show).stdout == f"{index} none none none\n"
        installed = networked.execute("pip install -q --disable-pip-version-check stubpkg && "
                                      "python -c 'import stubpkg; print(stubpkg.VALUE)'", timeout=120)
        assert installed.stdout == "42\n", installed
        assert closed.execute(show).stdout == "none none none none\n"
    finally:
        networked.delete()
        closed.delete()
        server.shutdown()
        server.server_close()


def test_without_namespaces_it_says_so_at_once_and_weak_runs(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    blocked = tmp_path / "bwrap"
    blocked.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    blocked.chmod(0o755)
    monkeypatch.setenv("PRIME_LAB_BWRAP", str(blocked))
    started = time.monotonic()
    with pytest.raises(local.IsolationUnavailable) as refused:
        local.create(SandboxSpec())
    message = str(refused.value)
    assert "uid map: Permission denied" in message and 'isolation = "weak"' in message and "\n" not in message
    assert time.monotonic() - started < 5
    weak = local.create(SandboxSpec(isolation="weak", memory_gb=0.5))
    try:
        monkeypatch.setenv("FOO_API_KEY", "sk-weak-1")
        result = weak.execute("env; python -c 'bytearray(2 << 30)'")
        assert "sk-weak-1" not in result.stdout and result.oom, result
        assert weak.execute("sleep 5", timeout=0.3).timed_out
        weak.write_file("w.txt", b"weak")
        assert weak.execute("cat w.txt").stdout == "weak"
    finally:
        weak.delete()
    with pytest.raises(local.SandboxError, match="isolation"):
        local.create(SandboxSpec(isolation="none"))
