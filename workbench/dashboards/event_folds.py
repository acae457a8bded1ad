"""What every run dashboard folds from a run's events, apart from what its kind adds: `EventFold` (state changes, log
lines, corrupt-line notices, a change counter; the GEPA dashboard's model builds on it) and `MetricsFold` (the metric
series of a training run, RL's or SFT's), with the log line they keep and the raw event they read.

A `restart` event at step k (the run resumed from the checkpoint of step k) rewinds what `MetricsFold` folded for the
steps after k, as `runs.events.final_timeline` does for the other readers: each step shows its latest attempt."""

from __future__ import annotations

import heapq
import re
from collections import OrderedDict, deque
from collections.abc import Iterable
from typing import Any, NamedTuple

from prime_lab.runs.events import RESTART, BadLine, Event
from prime_lab.workbench.dashboards.series import DEFAULT_CAPACITY, DownsampledSeries

RawEvent = dict[str, Any]  # one line of events.jsonl as parsed
MAX_SERIES = 256  # metric names kept (a run emitting more has a bug; the rest are dropped)
MAX_LOG_LINES = 5000
MAX_ALERTS = 200
RECENT_STEPS = 8
_FLOAT = frozenset({float})
_NUMBER = frozenset({float, int})

_LEVEL_RE = re.compile(r"\b(DEBUG|INFO|SUCCESS|WARNING|WARN|ERROR|CRITICAL|Traceback)\b")


class LogLine(NamedTuple):  # (a tuple: a replayed log makes thousands)
    process: str
    level: str
    text: str


def guess_level(line: str) -> str:
    """The level a plain text log line shows (INFO when it shows none)."""
    match = _LEVEL_RE.search(line)
    if match is None:
        return "INFO"
    word = match.group(1)
    return {"WARN": "WARNING", "CRITICAL": "ERROR", "Traceback": "ERROR"}.get(word, word)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class EventFold:
    """What every dashboard folds from a log: state changes, log lines, corrupt-line notices, a change counter."""

    def __init__(self) -> None:
        self.logs: deque[LogLine] = deque(maxlen=MAX_LOG_LINES)
        self.log_total = 0  # lines ever added to `logs` (the logs pane writes only what is new)
        self.bad_lines = 0
        self.last_bad: BadLine | None = None
        self.events = 0
        self.state: str | None = None  # the latest `status` event's state
        self.version = 0

    def feed(self, items: Iterable[RawEvent | Event | BadLine]) -> None:
        """Fold events: the raw JSON objects of the log (what the dashboards' reader gives, no Event built per
        line: a 100,000-event log must fold in well under a second) or Events."""
        fold, logs = self.fold, self.logs
        events = logged = 0
        for item in items:
            if isinstance(item, BadLine):
                self.bad_lines += 1
                self.last_bad = item
                continue
            raw = item.to_json() if isinstance(item, Event) else item
            events += 1
            kind = raw["kind"]
            data = raw.get("data")
            if data.__class__ is not dict:
                data = {}
            if kind == "log":
                logs.append(LogLine(str(raw.get("source", "")), str(data.get("level", "INFO")).upper(),
                                    str(data.get("message", ""))))
                logged += 1
            elif kind == "status":
                self.state = str(data.get("state")) if data.get("state") else self.state
            fold(kind, raw.get("step"), data, raw)
        self.events += events
        self.log_total += logged
        self.version += 1

    def fold(self, kind: str, step: Any, data: dict[str, Any], raw: RawEvent) -> None:
        """Per-dashboard handling of one event."""

    def add_log_lines(self, process: str, lines: Iterable[str]) -> None:
        """Lines of a process's text log (logs/<process>.log)."""
        for line in lines:
            if line.strip():
                self.logs.append(LogLine(process, guess_level(line), line.rstrip()))
                self.log_total += 1
        self.version += 1


class MetricsFold(EventFold):
    """A training run's metrics as charts draw them: bounded series per metric name, the merged metrics of the
    latest steps, checkpoints and the log's alerts; a `restart` event rewinds them (the RL and SFT dashboards)."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        super().__init__()
        self.capacity = capacity
        self.series: dict[str, DownsampledSeries] = {}
        self.recent: OrderedDict[int, dict[str, float]] = OrderedDict()  # step -> metrics of every source
        self.latest_step: int | None = None
        self.log_alerts: deque[dict[str, Any]] = deque(maxlen=MAX_ALERTS)
        self.checkpoints: list[int] = []
        self._steps: list[int] = []  # the metrics events of the current feed: their steps and data, folded at its end
        self._data: list[dict[str, Any]] = []
        self.series_version = 0  # bumped when a feed adds points (what the charts show; log lines do not count)

    def feed(self, items: Iterable[RawEvent | Event | BadLine]) -> None:
        super().feed(items)
        self._flush_points()

    def _flush_points(self) -> None:
        """Fold the metrics events of this feed: column by column (a chunk holds thousands of steps of tens of
        metrics; a loop over every value of every event cost more than reading the log), each series extended once."""
        steps, datas = self._steps, self._data
        if not datas:
            return
        self._steps, self._data = [], []
        self._fold_recent(steps, datas)
        by_layout: dict[tuple[str, ...], list[int]] = {}  # the events logging the same keys (a source's, each step)
        for index, data in enumerate(datas):
            layout = tuple(data)
            members = by_layout.get(layout)
            if members is None:
                by_layout[layout] = [index]
            else:
                members.append(index)
        columns: dict[str, list[tuple[list[int], list[float], list[float]]]] = {}  # per key: (events, xs, ys) runs
        series = self.series
        new: list[tuple[int, int, str]] = []  # keys with no series yet: where each first has a number
        for layout, members in by_layout.items():
            xs = list(map(float, map(steps.__getitem__, members)))
            rows = map(tuple, map(dict.values, map(datas.__getitem__, members)))
            for position, (key, column) in enumerate(zip(layout, zip(*rows, strict=True), strict=True)):
                kinds = set(map(type, column))
                if kinds == _FLOAT:
                    part = (members, xs, list(column))
                elif kinds <= _NUMBER:  # (bool is not int here)
                    part = (members, xs, list(map(float, column)))
                else:  # other values are not drawn
                    kept = [i for i, value in enumerate(column) if value.__class__ is float or value.__class__ is int]
                    if not kept:
                        continue
                    part = ([members[i] for i in kept], [xs[i] for i in kept], [float(column[i]) for i in kept])
                runs = columns.get(key)
                if runs is None:
                    columns[key] = [part]
                else:
                    runs.append(part)
                if key not in series:
                    new.append((part[0][0], position, key))
        for _, _, key in sorted(new):  # series made in the order the events bring their first numbers
            if key not in series and len(series) < MAX_SERIES:
                series[key] = DownsampledSeries(self.capacity)
        for key, runs in columns.items():
            target = series.get(key)
            if target is None:
                continue
            if len(runs) == 1:
                target.extend(runs[0][1], runs[0][2])
            else:  # a key in events of several layouts: its points in the order of the events
                merged = list(heapq.merge(*(zip(*run, strict=True) for run in runs)))
                target.extend([x for _, x, _ in merged], [y for _, _, y in merged])
        if columns:
            self.series_version += 1

    def _fold_recent(self, steps: list[int], datas: list[dict[str, Any]]) -> None:
        """`recent` after these metrics events: the merged numbers of the last `RECENT_STEPS` steps they and the
        events before them logged (a step pushed out and logged again starts over), merging only what is kept."""
        recent = self.recent
        order: OrderedDict[int, tuple[dict[str, float], list[int]]] = OrderedDict(
            (step, (merged, [])) for step, merged in recent.items())
        for index, step in enumerate(steps):
            entry = order.get(step)
            if entry is None:
                entry = order[step] = ({}, [])
                while len(order) > RECENT_STEPS:
                    order.popitem(last=False)
            entry[1].append(index)
        recent.clear()
        for step, (merged, indices) in order.items():
            for index in indices:
                for key, value in datas[index].items():
                    if value.__class__ is float:
                        merged[key] = value
                    elif value.__class__ is int:  # (bool is not int here)
                        merged[key] = float(value)
            recent[step] = merged

    def rewind(self, step: int) -> None:
        """Forget what was folded for the steps after `step` (the run resumed from its checkpoint)."""
        self._flush_points()  # what came before the restart event in this chunk
        for series in self.series.values():
            series.rewind(float(step))
        for later in [s for s in self.recent if s > step]:
            del self.recent[later]
        self.checkpoints = [c for c in self.checkpoints if c <= step]
        if self.latest_step is not None and self.latest_step > step:
            self.latest_step = step
        self.series_version += 1

    def fold(self, kind: str, step: Any, data: dict[str, Any], raw: RawEvent) -> None:
        step = step if isinstance(step, int) else None
        if kind == "metrics" and step is not None:
            self._metrics(step, data)
        elif kind == "alert":
            self.log_alerts.append({**data, "step": step, "source": raw.get("source")})
        elif kind == "checkpoint" and step is not None:
            self.checkpoints.append(step)
        elif kind == RESTART and step is not None:
            self.rewind(step)

    def _metrics(self, step: int, data: dict[str, Any]) -> None:
        """Kept for the end of the feed (`_flush_points`); the latest step at once."""
        self._steps.append(step)
        self._data.append(data)
        if self.latest_step is None or step >= self.latest_step:
            self.latest_step = step

    # Views ------------------------------------------------------------------------------------------------
    @property
    def alerts(self) -> list[dict[str, Any]]:
        """The log's alerts."""
        return list(self.log_alerts)

    def latest(self) -> dict[str, float]:
        """The newest value of every metric (the latest step's first, then older steps' for keys it lacks)."""
        merged: dict[str, float] = {}
        for step in sorted(self.recent, reverse=True):
            for key, value in self.recent[step].items():
                merged.setdefault(key, value)
        return merged

    def metric_keys(self) -> list[str]:
        return sorted(self.series)
