"""What sandboxes did, read back: a run's `sandbox/*` metrics per RL step and a sandbox's log of commands.

The core (sandbox/local.py, stdlib only) writes two records, one JSON object a line, each line one `write` on an
`O_APPEND` descriptor (so the many processes of a run, each with its own sandboxes, never tear one another's lines):

- the run's stats, `<run_dir>/sandbox_stats.jsonl` (`STATS_FILE`) for a sandbox whose spec names its run: one line
  per sandbox created, `{"time", "event": "created", "id"}`, and one per command that ended, `{"time",
  "event": "command", "id", "seconds", "exit_code", "timed_out", "oom"}`. It outlives the sandboxes (each is deleted
  after its rollout), so the orchestrator folds what was appended since its previous step (`StatsFollower`):
  `sandbox/created`, `sandbox/commands`, `sandbox/timed_out`, `sandbox/oom` (counts) and `sandbox/command_seconds`
  (their mean wall time; 0 in a step without commands); a run that never made a sandbox has none of them.
- notices, in the same file: `{"time", "event": "notice", "key", "message"}`, a line a user must read (client.py's
  `say_once`: a command that failed for want of the network names `[sandbox] network = true`), written by whichever
  process made the sandbox (an environment server's log is read by nobody). `NoticeFollower` gives each key once:
  `prime eval run` prints it and keeps it in metadata.json, an RL run's launcher makes it a `sandbox` alert.
- a sandbox's own log of commands, `<folder>/logs/commands.log` (`COMMAND_LOG`): one line per command that ended,
  `{"time" (when it ended), "command", "exit_code", "timed_out", "oom", "seconds", "stdout", "stderr"}` (the last
  2000 characters of each output), which `prime sandbox logs ID` and the client's `get_logs` print (after the start
  command's own output, where the sandbox has one: logs/start.out, start.err). It goes with its sandbox.

A line that is not a JSON object (one left unfinished by a process killed mid-write) is skipped.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STATS_FILE = "sandbox_stats.jsonl"  # in a run's folder
NOTICE = "notice"  # a line of it that is said to the user
COMMAND_LOG = "commands.log"  # in a sandbox's logs/
METRICS = ("sandbox/created", "sandbox/commands", "sandbox/timed_out", "sandbox/oom", "sandbox/command_seconds")


def records(lines: Iterable[bytes | str]) -> list[dict[str, Any]]:
    """The JSON objects among `lines`; anything else (a torn line, a blank one) left out."""
    out = []
    for line in lines:
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


@dataclass
class StepStats:
    """What a run's sandboxes did in one step: made, commands ended, of those timed out and out of memory, and the
    commands' seconds in all."""

    created: int = 0
    commands: int = 0
    timed_out: int = 0
    oom: int = 0
    seconds: float = 0.0

    def add(self, record: dict[str, Any]) -> None:
        event = record.get("event")
        if event == "created":
            self.created += 1
        elif event == "command":
            self.commands += 1
            self.timed_out += record.get("timed_out") is True
            self.oom += record.get("oom") is True
            seconds = record.get("seconds")
            if isinstance(seconds, int | float) and not isinstance(seconds, bool) and seconds >= 0:
                self.seconds += seconds

    def metrics(self) -> dict[str, float]:
        return {"sandbox/created": float(self.created), "sandbox/commands": float(self.commands),
                "sandbox/timed_out": float(self.timed_out), "sandbox/oom": float(self.oom),
                "sandbox/command_seconds": self.seconds / self.commands if self.commands else 0.0}


def fold(items: Iterable[dict[str, Any]]) -> StepStats:
    stats = StepStats()
    for record in items:
        stats.add(record)
    return stats


class StatsFollower:
    """A run's sandbox stats step by step: `take()` folds the lines appended to `<run_dir>/sandbox_stats.jsonl`
    since the previous take (a partial last line waits for the next). It starts at the file's end as it is now, so a
    resumed run does not count an earlier attempt's sandboxes in its first step. Before the run's first sandbox,
    `take()` is {} (a run without sandboxes gets no sandbox/* metrics); from then on every step has them."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / STATS_FILE
        self.offset = _size(self.path)
        self.seen = self.offset > 0

    def take(self) -> dict[str, float]:
        whole, self.offset = _appended(self.path, self.offset)
        stats = fold(whole)
        self.seen = self.seen or bool(whole)
        return stats.metrics() if self.seen else {}


class NoticeFollower:
    """A run's sandbox notices: `take()` gives the messages appended since the previous take, each key once (every
    process that makes sandboxes says each once). `from_start=False` starts at the file's end (a resumed run's
    processes say theirs again). Without a run (`run_dir` None) there is nothing to take."""

    def __init__(self, run_dir: Path | None, from_start: bool = True) -> None:
        self.path = Path(run_dir) / STATS_FILE if run_dir is not None else None
        self.offset = 0 if from_start or self.path is None else _size(self.path)
        self.keys: set[str] = set()
        self.messages: list[str] = []  # every one taken so far

    def take(self) -> list[str]:
        if self.path is None:
            return []
        whole, self.offset = _appended(self.path, self.offset)
        new = []
        for record in whole:
            key, message = record.get("key"), record.get("message")
            if record.get("event") == NOTICE and isinstance(message, str) and str(key or message) not in self.keys:
                self.keys.add(str(key or message))
                new.append(message)
        self.messages += new
        return new


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _appended(path: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    """The records of the whole lines appended to `path` after `offset`, and the offset after them (a partial last
    line waits for the next read)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            chunk = fh.read()
    except OSError:
        chunk = b""
    whole = chunk[:chunk.rfind(b"\n") + 1]
    return records(whole.splitlines()), offset + len(whole)


def command_log(folder: Path | str) -> list[dict[str, Any]]:
    """The commands the sandbox in `folder` ran, oldest first ([] where it has run none); a sandbox made with a start
    command has it first, `{"start": true, "command", "time" (when the sandbox was made), "stdout", "stderr"}` (the
    ends of what it has written so far to logs/start.out and start.err; it runs for the sandbox's life, so no exit
    code)."""
    folder = Path(folder)
    try:
        data = (folder / "logs" / COMMAND_LOG).read_bytes()
    except OSError:
        data = b""
    start = _start_record(folder)
    return ([start] if start else []) + records(data.splitlines())


def _start_record(folder: Path) -> dict[str, Any] | None:
    try:
        made = json.loads((folder / "sandbox.json").read_text())
        command, created = made["spec"].get("start_command"), made.get("created")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not command:
        return None
    return {"start": True, "command": command, "time": created,
            **{stream: _tail(folder / "logs" / f"start.{name}") for stream, name in (("stdout", "out"),
                                                                                    ("stderr", "err"))}}


def _tail(path: Path, size: int = 2000) -> str:
    """The last `size` bytes of `path` as text ('' where it cannot be read)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, _size(path) - size))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""
