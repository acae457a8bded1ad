"""Following a run: its status and its events.jsonl, read from a byte offset and folded into a page's model.

`RunFollower` is what every run page runs in ONE background thread (no Textual here). It replays the log from zero on
open (and after `replay()`), reading on without pausing until a read comes back short; then it is `live` and calls
`on_caught_up` once. New events are folded a chunk at a time under `lock` (the UI redraws under the same lock, so the
lock is let go between chunks), and `changed` is set for the UI timer that redraws. The `FollowTarget` given to it
says what the events fold into (a run page: it feeds its RL or GEPA model).

A large log (`APART_BYTES`) is replayed in a child process when the target can say how (`FollowTarget.apart`: its
model's class): the child folds it and hands the model back (`replay_apart`), while this process mounts and draws
the page and folds the runs it overlays, each on a core of its own; the follower then reads on from where the child
stopped. Any failure of the child falls back to folding here.
"""

from __future__ import annotations

import importlib
import json
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple, Protocol

from prime_lab.runs.events import BadLine, Event
from prime_lab.runs.registry import Run
from prime_lab.runs.system_metrics import SYSTEM
from prime_lab.workbench.dashboards.event_folds import RawEvent
from prime_lab.workbench.dashboards.files import (
    MAX_READ,
    child_result,
    cyclic_gc_paused,
    read_events,
    settle_heap,
    start_child,
    unsettle_heap,
)

STATUS_EVERY = 0.5  # seconds between status.json reads while following
CHUNK = 5000  # events folded per lock hold
TAIL_LINES = 50  # newest event lines kept for the page's event log
SWITCH_INTERVAL = 0.001  # seconds a thread holds the GIL while another waits for it (Python's default: 0.005)


def event_line(event: Event) -> str:
    """One event as a log line: step, source, and its message or metrics."""
    step = f"step {event.step:>4} " if event.step is not None else ""
    data = event.data or {}
    if event.kind == "log":
        body = f"{data.get('level', 'INFO'):<7} {data.get('message', '')}"
    elif event.kind == "metrics":
        body = "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in data.items())
    elif event.kind == "status":
        body = f"state -> {data.get('state')}" + (f" ({data['reason']})" if data.get("reason") else "")
    elif event.kind == "alert":
        body = f"{data.get('level', 'WARNING')} {data.get('name')}: {data.get('message', '')}"
    else:
        body = json.dumps(data, default=str)[:200]
    return f"{step}[{event.source}] {event.kind}: {body}"


def bad_count(items: list[RawEvent | BadLine]) -> int:
    """The corrupt lines among `items`."""
    return sum(1 for item in items if isinstance(item, BadLine))


def tail_lines(items: list[RawEvent | BadLine]) -> list[str]:
    """The event-tail lines of the last `TAIL_LINES` of `items` (corrupt lines and system samples left out: the
    System tab shows those)."""
    return [event_line(Event.from_json(e)) for e in items[-TAIL_LINES:]
            if not isinstance(e, BadLine) and e.get("kind") != SYSTEM]


class FollowTarget(Protocol):
    """What a follower folds a run into (a run page). Every method is called on the follower's thread."""

    def reset(self) -> None:
        """Forget what was folded (a replay starts). Called with the follower's lock held."""

    def consume(self, items: list[RawEvent | BadLine]) -> None:
        """Fold new events. Called with the lock held."""

    def follow_files(self) -> None:
        """Read the run's other growing files (text logs, results). Called WITHOUT the lock: take it to fold."""

    def apart(self) -> str | None:
        """`module:Class` of the model a replay folds into, built with no arguments in a child process (None: fold
        here)."""

    def adopt(self, model: object) -> bool:
        """Take `model`, what a child process folded from the log's start (`apart`); False: not taken (the follower
        folds here). Called with the lock held."""


def _nothing() -> None:
    pass


APART_BYTES = 4 << 20  # a log this large is replayed in a child process, where the target can (`FollowTarget.apart`)
_REPLAY_IN_CHILD = """
import pickle, sys
from pathlib import Path
from prime_lab.workbench.dashboards.follower import replay_apart
sys.stdout.buffer.write(pickle.dumps(replay_apart(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3])))
"""


class Replayed(NamedTuple):
    """What a child process folded from a log's start: the model, the offset it read to, the corrupt lines it
    skipped and the last event lines (the page's event tail)."""

    model: object
    offset: int
    bad_lines: int
    tail: list[str]


def replay_apart(path: Path, end: int, model_class: str) -> Replayed:
    """Fold `path` from its start to at least `end` into a new `model_class` (`module:Class`), as a follower does."""
    module, _, name = model_class.partition(":")
    model = getattr(importlib.import_module(module), name)()
    offset, bad, tail = 0, 0, deque[str](maxlen=TAIL_LINES)
    with cyclic_gc_paused():
        while offset < end:
            items, offset = read_events(path, offset)
            if not items:
                break
            bad += bad_count(items)
            tail.extend(tail_lines(items))
            model.feed(items)
    return Replayed(model, offset, bad, list(tail))


class ApartReplay:
    """A child process replaying a log (`replay_apart`) for one generation of a follower."""

    def __init__(self, generation: int, path: Path, end: int, model_class: str) -> None:
        self.generation = generation
        self.child = start_child(_REPLAY_IN_CHILD, str(path), str(end), model_class)

    def result(self) -> Replayed | None:
        """The child's fold (None: it failed; the follower folds here)."""
        replayed = child_result(self.child)
        return replayed if isinstance(replayed, Replayed) else None


class RunFollower:
    """Reads one run's status and events and folds them into `target`; the state a page draws from, under `lock`.

    `status`, `event_offset`, `bad_lines` (corrupt lines skipped), `live` and `tail` (new event lines not yet shown;
    `clear_tail` says the shown ones are from before a replay) are written by the follower's thread under `lock`.
    """

    def __init__(self, run: Run, target: FollowTarget) -> None:
        self.run = run
        self.target = target
        self.lock = threading.Lock()
        self.changed = threading.Event()  # set after anything was folded or read: the page redraws
        self.status = run.read_status()
        self.event_offset = 0
        self.replay_size = 0  # bytes the log held when the replay began (for "replaying NN%")
        self.bad_lines = 0
        self.live = False  # False while replaying what the log held when following began (or after `replay`)
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.clear_tail = False
        self._generation = 0  # bumped by `replay`: the follower starts over from byte 0
        self._following = -1  # the generation being read
        self._next_status = 0.0
        self._apart: ApartReplay | None = None

    def replay(self) -> None:
        """Start over from byte 0 at the next step (any thread)."""
        self._generation += 1

    def start_apart(self) -> None:
        """Start replaying a large log in a child process now (the page calls it as it mounts: the child folds
        while the page lays itself out); the next step takes its model."""
        generation = self._generation
        if self._apart is not None and self._apart.generation == generation:
            return
        size = self._log_size()
        model_class = self.target.apart() if size >= APART_BYTES else None
        if model_class:
            try:
                self._apart = ApartReplay(generation, self.run.events_path, size, model_class)
            except OSError:
                self._apart = None

    def replay_note(self) -> str:
        """While the log is replayed: how far it got, for the page's status line."""
        if self.live or not self.replay_size:
            return ""
        return f"replaying the event log: {min(1.0, self.event_offset / self.replay_size):.0%}"

    def follow(self, poll: float, cancelled: Callable[[], bool], on_caught_up: Callable[[], object] = _nothing) -> None:
        """Step until `cancelled()`, waiting `poll` seconds whenever it has caught up with the log."""
        while not cancelled():
            if self.step(min(STATUS_EVERY, poll), on_caught_up):
                time.sleep(poll)

    def step(self, status_every: float = STATUS_EVERY, on_caught_up: Callable[[], object] = _nothing) -> bool:
        """One read: the status (at most every `status_every` seconds) and the run's other files, then the next events.

        True when the read came back short (caught up: wait before the next); False when more is waiting or a
        replay began meanwhile. `on_caught_up` is called when it first catches up after starting (or a replay).
        """
        if self._following != self._generation:
            self._following = self._generation
            unsettle_heap()  # (what the last replay built may be garbage now)
            with self.lock:
                self.event_offset = 0
                self.bad_lines = 0
                self.live = False
                self.tail.clear()
                self.clear_tail = True
                self.replay_size = self._log_size()
                self.target.reset()
            self._adopt_apart()
        now = time.monotonic()
        if now >= self._next_status:
            status = self.run.read_status() if not self.run.dir.exists() else self.run.status()
            with self.lock:
                self.status = status
            self._next_status = now + status_every
            self.target.follow_files()
            self.changed.set()
        read_from = self.event_offset
        with cyclic_gc_paused():
            offset = self._fold_next(read_from, self._following)
        if offset is None:
            return False  # `replay` meanwhile: start over
        if offset - read_from >= MAX_READ:  # a full read: more is waiting, read on
            return False
        if not self.live:
            with self.lock:
                self.live = True  # events folded from now on arrived while following
            # From now on the UI answers keys while this thread folds what comes. The UI thread waiting for the GIL
            # gets it after the interpreter's switch interval (5 ms by default), each time it let it go (each read
            # of the terminal, each write): a key's few dozen of those took a tenth of a second. (Not while
            # replaying: the shorter interval costs the replay's switches.)
            if sys.getswitchinterval() > SWITCH_INTERVAL:
                sys.setswitchinterval(SWITCH_INTERVAL)
            settle_heap()  # (what the replay built lives as long as the page)
            on_caught_up()
        return True

    def _adopt_apart(self) -> None:
        """At the start of a replay: the model a child folded (started now if `start_apart` did not), and read on
        from where it stopped."""
        self.start_apart()
        apart, self._apart = self._apart, None
        if apart is None or apart.generation != self._following:
            return
        replayed = apart.result()
        if replayed is None or self._following != self._generation:
            return  # (folded here instead, or started over)
        with self.lock:
            if not self.target.adopt(replayed.model):
                return
            self.event_offset = replayed.offset
            self.bad_lines = replayed.bad_lines
            self.tail.extend(replayed.tail)
        self.changed.set()

    def _fold_next(self, read_from: int, generation: int) -> int | None:
        """Read the events after `read_from` and fold them; the offset reached (None: `replay` was called meanwhile)."""
        items, offset = read_events(self.run.events_path, read_from)
        if generation != self._generation:
            return None
        if items:
            for start in range(0, len(items), CHUNK):  # the lock is let go between chunks: the UI keeps up
                chunk = items[start:start + CHUNK]
                with self.lock:
                    self.bad_lines += bad_count(chunk)
                    self.tail.extend(tail_lines(chunk))
                    self.target.consume(chunk)
                self.changed.set()
            with self.lock:
                self.event_offset = offset
        return offset

    def _log_size(self) -> int:
        try:
            return self.run.events_path.stat().st_size
        except OSError:
            return 0
