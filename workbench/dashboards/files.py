"""Growing files of a run read from byte offsets: JSON-lines files and the processes' text logs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lab.events import BadLine

FIRST_READ = 256 << 10  # of a text log first seen, only its last 256 KiB
MAX_READ = 1 << 20  # a chunk parses in one json.loads call, which holds the GIL: keep it short for the UI


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


def _event_or_bad(obj: Any, offset: int, raw: bytes) -> dict[str, Any] | BadLine:
    if isinstance(obj, dict) and isinstance(obj.get("seq"), int) and isinstance(obj.get("kind"), str):
        return obj
    return BadLine(offset, raw[:200].decode("utf-8", "replace"))


def read_events(path: Path, offset: int, max_bytes: int = MAX_READ) -> tuple[list[dict[str, Any] | BadLine], int]:
    """The events after `offset` (at most about `max_bytes` of them) as parsed JSON objects, corrupt lines as
    BadLine, and the offset to continue from; a partial last line is left for the next read.

    The same contract as `lab.events.EventLog.read`, built for replaying a large log into a dashboard: a chunk is
    parsed by one `json.loads` call (falling back to line by line when a line in it is corrupt) and no Event is
    built per line."""
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
    lines = chunk[:end].split(b"\n")
    try:
        objs = json.loads(b"[" + b",".join(line for line in lines if line.strip()) + b"]")
        items: list[dict[str, Any] | BadLine] = [obj if isinstance(obj, dict) and isinstance(obj.get("seq"), int)
                                                 and isinstance(obj.get("kind"), str) else BadLine(offset, "")
                                                 for obj in objs]
        if any(isinstance(item, BadLine) for item in items):
            raise ValueError("a line is not an event")
    except ValueError:
        items = []
        position = offset
        for line in lines:
            line_offset, position = position, position + len(line) + 1
            if not line.strip():
                continue
            try:
                items.append(_event_or_bad(json.loads(line), line_offset, line))
            except ValueError:
                items.append(BadLine(line_offset, line[:200].decode("utf-8", "replace")))
    return items, offset + end + 1
