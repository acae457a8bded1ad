"""What every run dashboard folds from a run's events, apart from what its kind adds: `EventFold` (state changes, log
lines, corrupt-line notices, a change counter; the GEPA dashboard's model builds on it) and `MetricsFold` (the metric
series of a training run, RL's or SFT's), with the log line they keep and the raw event they read.

A `restart` event at step k (the run resumed from the checkpoint of step k) rewinds what `MetricsFold` folded for the
steps after k, as `runs.events.final_timeline` does for the other readers: each step shows its latest attempt."""

from __future__ import annotations

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
        self._points: dict[str, tuple[list[float], list[float]]] = {}  # per series, the points of the current feed
        self.series_version = 0  # bumped when a feed adds points (what the charts show; log lines do not count)

    def feed(self, items: Iterable[RawEvent | Event | BadLine]) -> None:
        super().feed(items)
        self._flush_points()

    def _flush_points(self) -> None:
        for key, (xs, ys) in self._points.items():  # into each series at once (a chunk holds thousands of steps)
            self.series[key].extend(xs, ys)
        if self._points:
            self.series_version += 1
        self._points.clear()

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
        merged = self.recent.get(step)
        if merged is None:
            merged = self.recent[step] = {}
            while len(self.recent) > RECENT_STEPS:
                self.recent.popitem(last=False)
        x = float(step)
        all_points = self._points
        for key, value in data.items():
            if value.__class__ is not float and (value.__class__ is not int):  # (bool is not int here)
                continue
            value = float(value)
            merged[key] = value
            points = all_points.get(key)
            if points is None:
                if key not in self.series:
                    if len(self.series) >= MAX_SERIES:
                        continue
                    self.series[key] = DownsampledSeries(self.capacity)
                points = all_points[key] = ([], [])
            points[0].append(x)
            points[1].append(value)
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
