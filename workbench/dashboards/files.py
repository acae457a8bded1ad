"""Growing files of a run read from byte offsets: JSON-lines files and the processes' text logs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from prime_lab.lab.events import BadLine

FIRST_READ = 256 << 10  # of a text log first seen, only its last 256 KiB
MAX_READ = 1 << 20  # a chunk parses in one call, which holds the GIL: keep it short for the UI


def read_jsonl_from(path: Path, offset: int, max_bytes: int | None = None) -> tuple[list[dict[str, Any]], int]:
    """Complete JSON-object lines of a growing file after `offset` (corrupt ones skipped), and the next offset."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            chunk = fh.read() if max_bytes is None else fh.read(max_bytes)
    except OSError:
        return [], offset
    end = chunk.rfind(b"\n")
    if end < 0:
        return [], offset
    records = []
    for raw in chunk[: end + 1].splitlines():
        try:
            record = json.loads(raw)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records, offset + end + 1


class TextLogs:
    """Tails every `<process>.log` in a run's logs/ folder; `read()` returns the new complete lines per process."""

    def __init__(self, logs_dir: Path) -> None:
        self.logs_dir = logs_dir
        self.offsets: dict[str, int] = {}

    def read(self) -> list[tuple[str, list[str]]]:
        try:
            paths = sorted(p for p in self.logs_dir.iterdir() if p.suffix == ".log" and p.is_file())
        except OSError:
            return []
        out = []
        for path in paths:
            try:
                size = path.stat().st_size
                offset = self.offsets.get(path.name)
                if offset is None or offset > size:  # first seen, or rotated/truncated
                    offset = max(0, size - FIRST_READ)
                with open(path, "rb") as fh:
                    fh.seek(offset)
                    chunk = fh.read(MAX_READ)
            except OSError:
                continue
            end = chunk.rfind(b"\n")
            if end < 0:
                self.offsets[path.name] = offset
                continue
            self.offsets[path.name] = offset + end + 1
            lines = chunk[: end + 1].decode("utf-8", "replace").splitlines()
            if lines:
                out.append((path.stem, lines))
        return out


_decode_json = msgspec.json.Decoder().decode


def _json_array(text: bytes) -> Any:
    """msgspec's decoder, 3x json's speed on a replayed log; json's for what only it reads (NaN, Infinity: Python's
    json writes them for a metric that is not finite)."""
    try:
        return _decode_json(text)
    except msgspec.DecodeError:
        return json.loads(text)


def _is_event(obj: Any) -> bool:
    return isinstance(obj, dict) and isinstance(obj.get("seq"), int) and isinstance(obj.get("kind"), str)


def read_events(path: Path, offset: int, max_bytes: int = MAX_READ) -> tuple[list[dict[str, Any] | BadLine], int]:
    """The events after `offset` (at most about `max_bytes` of them) as parsed JSON objects, corrupt lines as
    BadLine, and the offset to continue from; a partial last line is left for the next read. A read that returns
    less than `max_bytes` past `offset` reached the end of the file.

    The same contract as `lab.events.EventLog.read`, built for replaying a large log into a dashboard: a chunk is
    parsed as one JSON array (falling back to line by line when a line in it is blank, corrupt or not one
    event) and no Event is built per line."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            chunk = fh.read(max_bytes)
            if chunk and not chunk.endswith(b"\n") and len(chunk) == max_bytes:
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
