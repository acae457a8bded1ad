"""The event bus: one append-only JSON-lines log per run, many writer processes, tailing readers.

A line is `{"seq", "time", "source", "kind", "step", "data", "attempt"}`. Writers hold an exclusive `flock` while
they read the last sequence number and append their line with one `write` on an `O_APPEND` descriptor, so `seq` is
global, gap-free and increasing in file order, and no line is ever torn by another writer. A line left unfinished by a
writer that died mid-write is closed with a newline by the next writer (readers skip it with a notice).

Readers keep a byte offset: `EventLog.read(offset)` returns the complete lines after it and the new offset, leaving
a partial last line for the next read; `tail()` replays from zero and, with `follow=True`, keeps polling. The TUI,
`prime rl logs` and the W&B mirror all read this file; nothing reads another process's memory.

Restarts (DESIGN.md, restart contract): the log keeps every attempt of a run. Each event carries its `attempt`
(1 for the first; `prime rl restart` makes the next), and a restart from the checkpoint of step k writes a
`restart` event with `step` k before anything of the new attempt. `final_timeline` turns the log into what every
reader shows: for each step, the latest attempt's events (an earlier attempt's events of steps after k are dropped);
events without a step (logs) all stay.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgspec

Source = Literal["orchestrator", "trainer", "inference", "eval", "gepa", "launcher"]
SOURCES: tuple[str, ...] = ("orchestrator", "trainer", "inference", "eval", "gepa", "launcher")
LEVELS: tuple[str, ...] = ("DEBUG", "INFO", "SUCCESS", "WARNING", "ERROR")

_TAIL_PROBE = 4096  # bytes first read back from the end to find the last seq (doubled until a line fits)


@dataclass(frozen=True)
class Event:
    seq: int
    time: float
    source: str
    kind: str
    step: int | None = None
    data: dict[str, Any] = field(default_factory=dict)
    attempt: int = 1

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "time": self.time, "source": self.source, "kind": self.kind, "step": self.step,
                "data": self.data, "attempt": self.attempt}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Event:
        if not isinstance(obj, dict) or not isinstance(obj.get("seq"), int) or not isinstance(obj.get("kind"), str):
            raise ValueError("not an event")
        data = obj.get("data")
        attempt = obj.get("attempt")
        return cls(seq=obj["seq"], time=float(obj.get("time", 0.0)), source=str(obj.get("source", "")),
                   kind=obj["kind"], step=obj.get("step"), data=data if isinstance(data, dict) else {},
                   attempt=attempt if isinstance(attempt, int) else 1)


RESTART = "restart"  # kind of the event a restart from the checkpoint of step `step` writes first


def final_timeline(events: Iterable[Event]) -> list[Event]:
    """The events a reader shows: a `restart` event at step k drops the events of steps after k that came before it
    (the attempt that is being replaced), so each step keeps only its latest attempt's events and the step numbers
    continue. Events without a step, and the restart events themselves, stay."""
    out: list[Event] = []
    for event in events:
        if event.kind == RESTART and event.step is not None:
            rewind = event.step
            out = [e for e in out if e.step is None or e.step <= rewind or e.kind == RESTART]
        out.append(event)
    return out


@dataclass(frozen=True)
class BadLine:
    """A line that is not a valid event (corrupt or truncated); readers report it and move on."""

    offset: int
    text: str


_decode_json = msgspec.json.Decoder().decode


def _json_array(text: bytes) -> Any:
    """msgspec's decoder, 3x json's speed on a replayed log; json's for what only it reads (NaN, Infinity: Python's
    json writes them for a metric that is not finite)."""
    try:
        return _decode_json(text)
    except msgspec.DecodeError:
        return json.loads(text)


def _is_event(obj: Any) -> bool:
    """What `Event.from_json` takes without raising."""
    return (isinstance(obj, dict) and isinstance(obj.get("seq"), int) and isinstance(obj.get("kind"), str)
            and isinstance(obj.get("time", 0.0), int | float))


def read_event_objects(path: Path, offset: int, max_bytes: int | None = None) -> \
        tuple[list[dict[str, Any] | BadLine], int]:
    """The events after `offset` (at most about `max_bytes` of them; all with None) as JSON objects, each one
    `Event.from_json` takes, corrupt lines as BadLine, and the offset to continue from; a partial last line is left
    for the next read. A read that returns less than `max_bytes` past `offset` reached the end of the file.

    Built for replaying a large log into a dashboard: a chunk is parsed as one JSON array (falling back to line by
    line when a line in it is blank, corrupt or not one event)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            chunk = fh.read() if max_bytes is None else fh.read(max_bytes)
            if max_bytes is not None and chunk and not chunk.endswith(b"\n") and len(chunk) == max_bytes:
                chunk += fh.readline()  # finish the line the limit cut
    except FileNotFoundError:
        return [], offset
    end = chunk.rfind(b"\n")
    if end < 0:
        return [], offset
    body = chunk[:end]
    try:
        objs = _json_array(b"[" + body.replace(b"\n", b",") + b"]")
        if len(objs) != body.count(b"\n") + 1 or not all(_is_event(obj) for obj in objs):
            raise ValueError("a line is not one event")
        items: list[dict[str, Any] | BadLine] = objs
    except ValueError:
        items = []
        position = offset
        for line in body.split(b"\n"):
            line_offset, position = position, position + len(line) + 1
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                obj = None
            items.append(obj if _is_event(obj) else BadLine(line_offset, line[:200].decode("utf-8", "replace")))
    return items, offset + end + 1


class EventWriter:
    """Appends events for one source. Safe across processes and threads (the lock is per write)."""

    def __init__(self, path: Path, source: str, attempt: int = 1) -> None:
        self.path = Path(path)
        self.source = source
        self.attempt = attempt
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        # Where this writer's last line ended and its seq: if the file still ends there, nobody else wrote since,
        # and the next seq is known without reading the file back.
        self._end = -1
        self._seq = 0

    def emit(self, kind: str, data: dict[str, Any] | None = None, step: int | None = None) -> int:
        """Append one event and return its seq."""
        body = {"time": time.time(), "source": self.source, "kind": kind, "step": step, "data": data or {},
                "attempt": self.attempt}
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            size = os.fstat(self._fd).st_size
            if size == self._end:
                seq, needs_newline = self._seq, False
            else:
                seq, needs_newline = _last_seq(self.path, size)
            line = json.dumps({"seq": seq + 1, **body}, separators=(",", ":"), default=_jsonable) + "\n"
            payload = (("\n" if needs_newline else "") + line).encode()
            os.write(self._fd, payload)
            self._end, self._seq = size + len(payload), seq + 1
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        return seq + 1

    def log(self, message: str, level: str = "INFO", step: int | None = None, **extra: Any) -> int:
        return self.emit("log", {"level": level, "message": message, **extra}, step=step)

    def metrics(self, values: dict[str, float], step: int) -> int:
        return self.emit("metrics", values, step=step)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> EventWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy / torch scalars
        return value.item()
    if isinstance(value, Path):
        return str(value)
    return str(value)


def _last_seq(path: Path, size: int) -> tuple[int, bool]:
    """The seq of the last complete event in the file, and whether the file ends without a newline."""
    if size == 0:
        return 0, False
    probe = _TAIL_PROBE
    with open(path, "rb") as fh:
        while True:
            start = max(0, size - probe)
            fh.seek(start)
            chunk = fh.read(size - start)
            needs_newline = not chunk.endswith(b"\n")
            lines = chunk.split(b"\n")
            # The first piece may be a cut line unless we read from the start of the file.
            candidates = lines[1:] if start > 0 else lines
            for raw in reversed(candidates):
                try:
                    obj = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(obj, dict) and isinstance(obj.get("seq"), int):
                    return obj["seq"], needs_newline
            if start == 0:
                return 0, needs_newline
            probe *= 4


def level_rank(event: Event) -> int:
    """Position of a log event's level in LEVELS (unknown levels count as INFO)."""
    level = str(event.data.get("level", "INFO")).upper()
    return LEVELS.index(level) if level in LEVELS else LEVELS.index("INFO")


class EventLog:
    """Reads a run's event log from byte offsets; tolerant of a partial last line and of corrupt lines."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def read(self, offset: int = 0, max_bytes: int | None = None) -> tuple[list[Event | BadLine], int]:
        """Complete lines after `offset` (at most about `max_bytes` of them), parsed, and the offset to continue
        from; `read_event_objects` without building an Event per line."""
        items, end = read_event_objects(self.path, offset, max_bytes)
        return [item if isinstance(item, BadLine) else Event.from_json(item) for item in items], end

    def tail(
        self,
        offset: int = 0,
        *,
        follow: bool = False,
        poll: float = 0.1,
        stop: Callable[[], bool] | None = None,
        on_bad_line: Callable[[BadLine], None] | None = None,
    ) -> Iterator[Event]:
        """Events from `offset` on; with `follow`, wait for more until `stop()` is true."""
        while True:
            items, offset = self.read(offset)
            for item in items:
                if isinstance(item, Event):
                    yield item
                elif on_bad_line is not None:
                    on_bad_line(item)
            if not follow or (stop is not None and stop()):
                if follow and items:
                    continue  # drain what arrived before stopping
                return
            if not items:
                time.sleep(poll)

    def events(self) -> list[Event]:
        """Every valid event from the start (replay)."""
        return list(self.tail(0))
