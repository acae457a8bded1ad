"""`prime sandbox list | exec | logs | kill` as a user runs them (the installed console script) against real local
sandboxes: made here by the core (sandbox/local.py) as an environment makes them, one with a job spinning inside."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import psutil
import pytest

from prime_lab.sandbox import local
from tests.support import cli

prime = partial(cli.prime, timeout=60)
SPIN = "python3 -c 'while True: pass'"


@pytest.fixture(scope="module")
def sandbox_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One sandbox home for the file: its images' pip environment is made once (seconds), not once a test."""
    return tmp_path_factory.mktemp("sandboxes")


@pytest.fixture
def sandboxes(sandbox_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[local.Sandbox]]:
    """The sandboxes a test makes (in the home `prime` reads too), deleted after it."""
    monkeypatch.setenv("PRIME_LAB_SANDBOXES", str(sandbox_home))
    made: list[local.Sandbox] = []
    yield made
    for sandbox in made:
        sandbox.delete()


def make(made: list[local.Sandbox], name: str, run_dir: Path | None = None) -> local.Sandbox:
    sandbox = local.create(local.SandboxSpec(name=name, run_dir=str(run_dir) if run_dir else None))
    made.append(sandbox)
    return sandbox


def running(sandbox: local.Sandbox, count: int) -> None:
    """Wait until `count` processes run in it (a job's bwrap, its shell, what it runs)."""
    deadline = time.monotonic() + 20
    while len(sandbox.processes()) < count:
        assert time.monotonic() < deadline, sandbox.processes()
        time.sleep(0.02)


def test_list_shows_each_sandbox_its_run_and_what_its_processes_cost(sandboxes: list[local.Sandbox],
                                                                     tmp_path: Path) -> None:
    busy = make(sandboxes, "busy", run_dir=tmp_path / "rl-abc123")
    idle = make(sandboxes, "idle")
    busy.write_file("data.bin", b"x" * 5000)
    busy.start_job(SPIN)  # runs while this test's process lives
    running(busy, 4)
    listed = json.loads(prime("sandbox", "list", "-o", "json").stdout)
    assert [s["id"] for s in listed] == [busy.id, idle.id]  # oldest first
    first = listed[0]
    assert (first["name"], first["image"], first["run_dir"], first["app_bytes"]) == ("busy", "python:3.11-slim",
                                                                                     str(tmp_path / "rl-abc123"), 5000)
    assert len(first["pids"]) >= 4 and first["cpu_percent"] > 0 and first["rss_bytes"] > 1_000_000, first
    assert (listed[1]["pids"], listed[1]["cpu_percent"], listed[1]["rss_bytes"]) == ([], 0.0, 0)
    table = prime("--plain", "sandbox", "list")
    assert table.returncode == 0, table.stderr
    rows = [line.split("\t") for line in table.stdout.splitlines()]
    assert rows[0] == ["ID", "NAME", "IMAGE", "AGE", "RUN", "PROCESSES", "CPU %", "RSS", "APP"]
    assert rows[1][:3] == [busy.id, "busy", "python:3.11-slim"] and rows[1][4] == "rl-abc123"
    assert int(rows[1][5]) >= 4 and rows[1][8] == "4.9 KiB"
    assert rows[2][:2] == [idle.id, "idle"] and rows[2][4:] == ["-", "0", "0.0", "0 B", "0 B"]


def test_exec_runs_in_the_sandbox_and_exits_with_its_code_and_logs_show_it(sandboxes: list[local.Sandbox]) -> None:
    sandbox = make(sandboxes, "debug")
    words = prime("sandbox", "exec", sandbox.id, "python3", "-c", "import os, sys; print(os.getcwd(), 1 + 2); "
                  "print('to stderr', file=sys.stderr); sys.exit(3)")  # several words: each stays one argument
    assert (words.returncode, words.stdout, words.stderr) == (3, "/app 3\n", "to stderr\n")
    line = prime("sandbox", "exec", "-e", "WHO=you", sandbox.id, "echo hi $WHO | tr a-z A-Z")
    assert (line.returncode, line.stdout) == (0, "HI YOU\n"), line.stderr  # one word: a shell command line
    slow = prime("sandbox", "exec", "-t", "0.3", sandbox.id, "sleep 30")
    assert slow.returncode == 124 and slow.stderr.count("\n") == 1, slow.stderr
    assert slow.stderr.startswith(f"Error: the command ran past its time limit (0.3 s) in sandbox {sandbox.id}")

    logs = prime("sandbox", "logs", sandbox.id)
    assert logs.returncode == 0, logs.stderr
    heads = [line for line in logs.stdout.splitlines() if " $ " in line]
    assert [head.split(" $ ")[0].split()[1:3] for head in heads] == [["exit", "3"], ["exit", "0"], ["timed", "out"]]
    assert heads[2].endswith("$ sleep 30") and "to stderr" in logs.stdout and "HI YOU" in logs.stdout
    last = json.loads(prime("sandbox", "logs", sandbox.id, "-n", "1", "-o", "json").stdout)
    assert [(r["command"], r["exit_code"], r["timed_out"]) for r in last] == [("sleep 30", 124, True)]


def test_kill_ends_a_sandbox_and_its_processes_and_unknown_ids_fail_in_one_line(
        sandboxes: list[local.Sandbox]) -> None:
    sandbox = make(sandboxes, "doomed")
    sandbox.start_job(SPIN)
    running(sandbox, 4)
    pids = sandbox.processes()
    killed = prime("sandbox", "kill", sandbox.id)
    assert killed.returncode == 0 and f"killed sandbox {sandbox.id}" in killed.stderr, killed.stderr
    assert not sandbox.folder.exists()
    gone = [pid for pid in pids if not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"]
    assert gone == pids
    for verb in (("exec", sandbox.id, "true"), ("logs", "nope")):
        proc = prime("sandbox", *verb)
        assert proc.returncode == 1 and proc.stderr.count("\n") == 1, (verb, proc.stderr)
        assert proc.stderr.startswith("Error: ") and "`prime sandbox list`" in proc.stderr, proc.stderr
    empty = prime("sandbox", "list")
    assert (empty.returncode, empty.stdout) == (0, "") and "no live sandboxes" in empty.stderr
