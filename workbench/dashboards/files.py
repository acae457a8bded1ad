"""Growing files of a run read from byte offsets: JSON-lines files and the processes' text logs."""

from __future__ import annotations

import gc
import json
import pickle
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prime_lab.runs.events import BadLine, read_event_objects

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


def read_events(path: Path, offset: int, max_bytes: int = MAX_READ) -> tuple[list[dict[str, Any] | BadLine], int]:
    """`runs.events.read_event_objects` in chunks short enough for the UI thread."""
    return read_event_objects(path, offset, max_bytes)


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while a chunk of the log is parsed and folded. A chunk is some 10,000 new dicts
    that live until it is folded and hold no cycles; the collector, triggered by their count, would traverse them
    and promote them until full collections of the whole heap ran every few chunks (0.4 s of a 1.5 s replay)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def settle_heap() -> None:
    """Take every object alive now out of the cyclic collector's sight (`gc.freeze`): what a page's replay built,
    the runs it overlays and the app's own objects live as long as the page. A full collection walked all of them
    (150,000 objects with a grid of three runs) every few seconds of a live run, 100-160 ms each, holding the UI and a
    key pressed meanwhile. Objects frozen are still freed when their last reference goes; `unsettle_heap` before a
    replay lets the collector look at what the old one built again."""
    gc.freeze()


def unsettle_heap() -> None:
    gc.unfreeze()


def start_child(script: str, *args: str) -> subprocess.Popen[bytes]:
    """This interpreter running `script` (`python -c`) with `args`, its stdout piped back (`child_result`)."""
    return subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)


def child_result(child: subprocess.Popen[bytes]) -> object | None:
    """What a child of `start_child` pickled to its stdout, once it ended (None: it failed)."""
    out, _ = child.communicate()
    if child.returncode != 0:
        return None
    try:
        return pickle.loads(out)  # (our own child's)
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, ValueError, TypeError):
        return None
