"""`prime sandbox`: the live local sandboxes (sandbox/local.py) on this machine, for a user debugging an environment.

`list` shows each with its run, its processes and what they cost now (CPU % over a short look, RSS, by psutil over
`Sandbox.processes()`) and the size of its `/app`; `exec ID CMD...` runs a command in one as its environment would
(one word is a shell command line, several are quoted and joined: `exec ID python -c 'print(1)'`), prints its
stdout and stderr and exits with its exit code; `logs ID` shows the commands it ran (each with its exit code, time
and output, from its `logs/` folder); `kill ID` ends its processes and deletes it.
"""

from __future__ import annotations

import shlex
import sys
import time
from typing import TYPE_CHECKING, Any, NoReturn

import typer

from prime_lab.runs.display import duration, one_line, size
from prime_lab.workbench.cli.common import OUTPUT_OPTION, OutputFormat, err, fail, print_json

if TYPE_CHECKING:
    from prime_lab.sandbox.local import Sandbox

sandbox_app = typer.Typer(help="Local sandboxes, where environments run model-written code: list, exec, logs, kill.",
                          no_args_is_help=True)

ID_ARGUMENT = typer.Argument(..., metavar="ID", help="The sandbox's id, as `prime sandbox list` shows it.")
CPU_WINDOW_S = 0.2  # `list` measures CPU % over this long (once, for every sandbox's processes together)
TIMED_OUT_CODE = 124  # what `timeout` exits with; `exec` past its time limit exits with it too
COMMAND_WIDTH = 100  # a command's width in `logs` (all of it with -o json)


def _gone(exc: Exception) -> NoReturn:
    """The core's line (what is gone and why), and where the live ones are."""
    said = str(exc)
    fail(said if "prime sandbox list" in said else f"{said}; `prime sandbox list` shows the live ones")


def _get(sandbox_id: str) -> Sandbox:
    from prime_lab.sandbox.local import SandboxGone, get

    try:
        return get(sandbox_id)
    except SandboxGone as exc:
        _gone(exc)


# list -----------------------------------------------------------------------------------------------------------
def measure(pid_lists: list[list[int]], window_s: float = CPU_WINDOW_S) -> list[tuple[float, int]]:
    """(CPU %, RSS bytes) of each list of pids, summed over its live processes: CPU over one `window_s` look
    for all of them (100 = one core busy); a process gone meanwhile counts nothing."""
    import psutil

    processes: list[list[Any]] = []
    for pids in pid_lists:
        found = []
        for pid in pids:
            try:
                process = psutil.Process(pid)
                process.cpu_percent(None)  # primes it
                found.append(process)
            except psutil.Error:
                continue
        processes.append(found)
    if any(processes):
        time.sleep(window_s)
    out = []
    for found in processes:
        cpu, rss = 0.0, 0
        for process in found:
            try:
                with process.oneshot():
                    cpu += process.cpu_percent(None)
                    rss += process.memory_info().rss
            except psutil.Error:
                continue
        out.append((cpu, rss))
    return out


def run_of(run_dir: str | None) -> str:
    """The run a sandbox belongs to, by its id (its folder's name), or `-`."""
    return run_dir.rstrip("/").rsplit("/", 1)[-1] if run_dir else "-"


@sandbox_app.command("list")
def list_sandboxes(output: OutputFormat = OUTPUT_OPTION) -> None:
    """The live sandboxes, oldest first: id, name, image, age, run, processes, their CPU % and RSS now, /app's size."""
    from prime_lab.sandbox.local import list_sandboxes as live

    infos = [sandbox.info() for sandbox in live()]
    costs = measure([list(info.get("pids") or []) for info in infos])
    now = time.time()
    if output is OutputFormat.json:
        print_json([{**info, "cpu_percent": round(cpu, 1), "rss_bytes": rss} for info, (cpu, rss)
                    in zip(infos, costs, strict=True)])
        return
    if not infos:
        err("no live sandboxes (an environment makes one per rollout and deletes it after)")
        return
    from rich.table import Column

    from prime_lab.workbench.cli.render import print_table

    rows = [(str(info["id"]), str(info.get("name") or "-"), str(info.get("image") or "-"),
             duration(now - float(info["created"])), run_of(info.get("run_dir")), str(len(info.get("pids") or [])),
             f"{cpu:.1f}", size(rss), size(info.get("app_bytes")))
            for info, (cpu, rss) in zip(infos, costs, strict=True)]
    right = ("PROCESSES", "CPU %", "RSS", "APP")
    print_table((Column("ID", no_wrap=True), "NAME", "IMAGE", "AGE", "RUN", *right), rows,
                justify={name: "right" for name in right})


# exec -----------------------------------------------------------------------------------------------------------
def command_line(words: list[str]) -> str:
    """One word is a shell command line as it is (`"ls | wc -l"`); several are quoted and joined, so that each stays
    one argument (`python -c 'print(1 + 2)'`)."""
    return words[0] if len(words) == 1 else shlex.join(words)


def parse_env(pairs: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        name, eq, value = pair.partition("=")
        if not eq or not name:
            fail(f"-e takes NAME=VALUE, not {pair!r}")
        env[name] = value
    return env


@sandbox_app.command("exec", context_settings={"allow_interspersed_args": False})
def exec_command(
    sandbox_id: str = ID_ARGUMENT,
    command: list[str] = typer.Argument(..., metavar="CMD...",
                                        help="The command: one word is a shell command line, several are quoted "
                                             "and joined (put options of prime's before ID)."),
    timeout: float = typer.Option(300.0, "-t", "--timeout", min=0.001,
                                  help="Seconds it may run (the client's default); past it, it is killed."),
    workdir: str | None = typer.Option(None, "-w", "--workdir", help="Its working folder inside (default /app)."),
    env: list[str] = typer.Option([], "-e", "--env", help="NAME=VALUE for its environment (repeat for several)."),
) -> None:
    """Run a command in a live sandbox as its environment would (sh -c, in /app); exits with its exit code."""
    from prime_lab.sandbox.local import SandboxError, SandboxGone

    variables = parse_env(env)
    sandbox = _get(sandbox_id)
    try:
        result = sandbox.execute(command_line(command), timeout=timeout, working_dir=workdir, env=variables or None)
    except SandboxGone as exc:
        _gone(exc)
    except SandboxError as exc:
        fail(f"cannot run it in sandbox {sandbox_id}: {exc}")
    sys.stdout.write(result.stdout)
    sys.stdout.flush()
    sys.stderr.write(result.stderr)
    if result.timed_out:
        fail(f"the command ran past its time limit ({timeout:g} s) in sandbox {sandbox_id} and was killed "
             "(-t SECONDS gives it longer)", TIMED_OUT_CODE)
    if result.oom:
        fail(f"the command ran out of memory in sandbox {sandbox_id} (its memory limit; exit code "
             f"{result.exit_code})", result.exit_code or 137)
    raise typer.Exit(result.exit_code)


# logs -----------------------------------------------------------------------------------------------------------
@sandbox_app.command("logs")
def logs(
    sandbox_id: str = ID_ARGUMENT,
    tail: int | None = typer.Option(None, "-n", "--tail", min=1, help="Only its last N commands."),
    output: OutputFormat = OUTPUT_OPTION,
) -> None:
    """The commands a sandbox ran, oldest first: when, how long, the exit code, the command, and what it wrote."""
    from prime_lab.sandbox.stats import command_log

    records = command_log(_get(sandbox_id).folder)
    if tail is not None:
        records = records[-tail:]
    if output is OutputFormat.json:
        print_json(records)
        return
    if not records:
        err(f"sandbox {sandbox_id} has run no command yet")
        return
    for record in records:
        sys.stdout.write(record_head(record) + "\n")
        for stream, out in (("stdout", sys.stdout), ("stderr", sys.stdout)):
            text = str(record.get(stream) or "")
            if text:
                out.write(text if text.endswith("\n") else text + "\n")


def record_head(record: dict[str, Any]) -> str:
    """`12:04:05 exit 0 0.04s $ python -c 'print(1)'` (when it started; `timed out`, `out of memory` where it
    was)."""
    from prime_lab.workbench.cli.render import clock

    code, seconds, ended = record.get("exit_code"), record.get("seconds"), record.get("time")
    what = ("start command" if record.get("start") else "timed out" if record.get("timed_out")
            else "out of memory" if record.get("oom") else f"exit {code}")
    took = f" {seconds:.2f}s" if isinstance(seconds, int | float) else ""
    started = ended - seconds if isinstance(ended, int | float) and isinstance(seconds, int | float) else ended
    return f"{clock(started)} {what}{took} $ {one_line(record.get('command', ''), COMMAND_WIDTH)}"


# kill -----------------------------------------------------------------------------------------------------------
@sandbox_app.command("kill")
def kill(
    sandbox_ids: list[str] = typer.Argument(None, metavar="ID...", help="The sandboxes' ids."),
    every: bool = typer.Option(False, "-a", "--all", help="Every live sandbox."),
) -> None:
    """End a sandbox's processes and delete it (its /app with it)."""
    from prime_lab.sandbox.local import SandboxGone, get, list_sandboxes

    if every == bool(sandbox_ids):
        fail("name the sandboxes to kill (IDs from `prime sandbox list`), or pass --all for every one")
    targets = list_sandboxes() if every else []
    for sandbox_id in sandbox_ids or []:
        try:
            targets.append(get(sandbox_id))
        except SandboxGone as exc:
            _gone(exc)
    for sandbox in targets:
        pids = len(sandbox.processes())
        sandbox.delete()
        err(f"killed sandbox {sandbox.id}" + (f" ({pids} process{'es' * (pids != 1)})" if pids else ""))
    if every and not targets:
        err("no live sandboxes")
