"""What every `prime` command shares: config path arguments, output formats, user-facing errors."""

from __future__ import annotations

import enum
import json
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer

if TYPE_CHECKING:
    from prime_lab.runs.registry import Run


class OutputFormat(enum.StrEnum):
    table = "table"
    json = "json"


OUTPUT_OPTION = typer.Option(OutputFormat.table, "-o", "--output", help="table (people) or json (machines).")


class UserError(Exception):
    """A problem the user can fix; printed as `Error: ...` with exit code 1, never as a traceback."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def fail(message: str, code: int = 1) -> NoReturn:
    raise UserError(message, code)


def fail_unexpected(run: Run, role: str, exc: Exception) -> NoReturn:
    """An exception no part of an in-process run (`prime eval run`, `prime gepa run`) expected, in one line: the
    run's id, the exception's type and message, and the log its traceback went to (`runs.registry.working`)."""
    from prime_lab.runs.registry import exception_line

    fail(f"{run.id} failed: {exception_line(exc)} (its traceback: {run.log_path(role)})")


def join_at_args(argv: list[str]) -> list[str]:
    """`@ file` (two words) means the same as `@file`; the shell splits it, we join it back."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] == "@" and i + 1 < len(argv):
            out.append("@" + argv[i + 1])
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def config_path(arg: str) -> Path:
    """`@file`, `@ file` and a bare path all name a config file."""
    return Path(arg[1:] if arg.startswith("@") else arg).expanduser()


_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str, flag: str) -> float:
    """`30s`, `15m`, `2h`, `1d` (or `1h30m`) in seconds; anything else fails naming `flag`."""
    compact = text.strip().lower()
    parts = _DURATION.findall(compact)
    if not parts or "".join(n + u for n, u in parts) != compact:
        fail(f"{flag} takes a duration like 30s, 15m, 2h or 1d, not {text!r}")
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def err(message: str) -> None:
    typer.echo(message, err=True)


def write_new_file(text: str, path: Path, force: bool) -> None:
    """Write `text` to `path` (its folder made), refusing to replace an existing file without -f/--force."""
    if path.exists() and not force:
        fail(f"{path} exists: pass -f/--force to overwrite it")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
