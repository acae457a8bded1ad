"""envs/forkserver_v1.py with driver_v1.py's client: verifiers v1's harness program forked from a warm interpreter
behaves as `python SCRIPT ARGS` started afresh (arguments, environment, folder, output, exit status, its own session),
its imports made once, a cancelled run's process group killed."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest

from prime_lab.envs.driver_v1 import ForkServer, uv_program

PROGRAM = """\
import json, os, sys
import marker_module  # imported once, by the fork server: its counter file grows once

if sys.argv[1] == "sleep":
    open(sys.argv[2], "w").write(str(os.getpid()))
    import time
    time.sleep(60)
if sys.argv[1] == "raise":
    raise ValueError("the program failed")
print(json.dumps({"argv": sys.argv[1:], "x": os.environ.get("X"), "key": os.environ.get("OPENAI_API_KEY"),
                  "cwd": os.getcwd(), "own_group": os.getpgid(0) == os.getpid(), "stdin": sys.stdin.read(),
                  "first_path": sys.path[0]}))
print("to stderr", file=sys.stderr)
sys.exit(3)
"""


@pytest.fixture
def program(tmp_path: Path) -> Path:
    script = tmp_path / "prog" / "chat.py"
    script.parent.mkdir()
    script.write_text(PROGRAM)
    (script.parent / "marker_module.py").write_text(
        f"with open({str(tmp_path / 'imported')!r}, 'a') as f:\n    f.write('x')\n")
    return script


def test_a_forked_run_is_the_program_run_afresh(program: Path, tmp_path: Path) -> None:
    import json

    async def main() -> list[tuple[int, str, str]]:
        server = await ForkServer.get(sys.executable, str(program))
        try:
            runs = [server.run(["a", str(n)], {"X": str(n), "PATH": os.environ["PATH"]}, str(tmp_path))
                    for n in range(3)]
            return list(await asyncio.gather(*runs))
        finally:
            await ForkServer.stop_all()

    results = asyncio.run(main())
    for n, (code, out, err) in enumerate(results):
        assert code == 3 and err == "to stderr\n", (code, out, err)
        seen = json.loads(out)
        assert seen == {"argv": ["a", str(n)], "x": str(n), "key": None, "cwd": str(tmp_path), "own_group": True,
                        "stdin": "", "first_path": str(program.parent)}
    # the server's warm-up ran the script's top-level imports once; no run imported the module again
    assert (tmp_path / "imported").read_text() == "x"


def test_a_failing_or_cancelled_run(program: Path, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"

    async def main() -> tuple[int, str, str]:
        server = await ForkServer.get(sys.executable, str(program))
        try:
            failed = await server.run(["raise"], {}, str(tmp_path))
            sleeper = asyncio.create_task(server.run(["sleep", str(pid_file)], {}, str(tmp_path)))
            while not pid_file.exists() or not pid_file.read_text():
                await asyncio.sleep(0.02)
            sleeper.cancel()
            with pytest.raises(asyncio.CancelledError):
                await sleeper
            return failed
        finally:
            await ForkServer.stop_all()

    code, out, err = asyncio.run(main())
    assert code == 1 and out == "" and "ValueError: the program failed" in err and "Traceback" in err
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}") and \
            Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z":
        time.sleep(0.05)
    alive = os.path.exists(f"/proc/{pid}") and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    assert not alive, "the cancelled run's process kept running"


def test_only_a_uv_prepared_programs_argv_is_forked() -> None:
    argv = ["sh", "-c", "export VIRTUAL_ENV=...; shift; exec \"$@\"", "uv-script", "/venv", "/venv/bin/python",
            "/scripts/abc.py", "--endpoint", "http://x"]
    assert uv_program(argv) == ("/venv", "/venv/bin/python", "/scripts/abc.py", ["--endpoint", "http://x"])
    assert uv_program(["sh", "-c", "mv a b && uv sync --script b"]) is None
    assert uv_program(["python", "x.py"]) is None
    # the bash harness runs its program unactivated, `INTERPRETER SCRIPT ARGS`: forked where the runtime prepared that
    # interpreter, never for another program that happens to be a Python script
    prepared = {"/venv/bin/python"}
    assert uv_program(["/venv/bin/python", "/scripts/abc.py", "--bash"], prepared) == \
        (None, "/venv/bin/python", "/scripts/abc.py", ["--bash"])
    assert uv_program(["/usr/bin/python3", "/scripts/abc.py"], prepared) is None
