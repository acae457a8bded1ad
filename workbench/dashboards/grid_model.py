"""The metrics grid of a run page, textual-free: every metric the runs logged as a cell, filtered by a glob or a
regex, pinned cells first, log-Y per cell, columns x rows a page, a stable colour per run, and each cell's points
smoothed, scaled and downsampled to its width once per change of the series (`PointsCache`, keyed by the series'
version), so an idle cell costs nothing and a busy one costs its few hundred points. Also: the runs a page overlays,
each folded in a process of its own (`fold_metrics_apart`), and a GEPA run's numbers as metrics
(`gepa_metric_events`: it logs no `metrics` events).

The filter (`/`): empty shows every metric. `re:PATTERN` is a regular expression; so is any text with syntax only a
regex has (one of `^ $ + ( ) | { } \\` or `.*`). Anything else is a glob: one or more patterns split by spaces or
commas, a metric shown when one matches; a pattern with `*`, `?` or `[...]` matches the whole name
(`reward/*`), one without is a part of it (`loss`). Both ignore case; a regex matches anywhere in the name (`^`/`$`
anchor it). A pinned cell stays at the top whatever the filter.
"""

from __future__ import annotations

import math
import re
import subprocess
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import TYPE_CHECKING, Literal, NamedTuple, Protocol

from prime_lab.workbench.dashboards.event_folds import MetricsFold, RawEvent
from prime_lab.workbench.dashboards.files import child_result, cyclic_gc_paused, read_events, start_child
from prime_lab.workbench.dashboards.series import ema

if TYPE_CHECKING:
    import numpy as np  # (imported where a cell is drawn: a process that only folds a run does without it)

CHOICES = (1, 2, 3, 4)  # columns, and rows, the keys cycle through
CELL_WIDTH = 40  # columns a cell wants when the grid picks how many fit side by side
CELL_HEIGHT = 9  # lines a cell wants when the grid picks how many rows fit
REGEX_ONLY = frozenset("^$+()|{}\\")
GLOB_WILDCARDS = frozenset("*?[")
# Distinct on a dark terminal, none of them the grid's highlight; a run's is picked from its id.
RUN_COLOURS = ("#4EBF71", "#0178D4", "#FFA62B", "#E06C75", "#C678DD", "#56B6C2", "#D19A66", "#E5C07B", "#98C379",
               "#FF79C6")


class FilterError(ValueError):
    """A filter that does not parse (a bad regular expression); its message says what to fix."""


class Series(Protocol):
    """What a cell reads of a metric's series (`workbench.dashboards.series.DownsampledSeries`)."""

    @property
    def version(self) -> int: ...

    @property
    def last(self) -> tuple[float, float] | None: ...

    def points(self) -> tuple[list[float], list[float]]: ...


RunSeries = tuple[str, Mapping[str, Series]]  # a run's id and its series by metric name


@dataclass(frozen=True)
class MetricFilter:
    """Which metrics the grid shows: every one (`kind` "all"), those a glob matches, or those a regex finds."""

    text: str = ""
    kind: Literal["all", "glob", "regex"] = "all"
    match: Callable[[str], bool] = field(default=lambda name: True, compare=False, repr=False)

    @classmethod
    def parse(cls, text: str) -> MetricFilter:
        """The filter `text` names (see the module's docstring); raises FilterError for a bad regex."""
        text = text.strip()
        if not text:
            return cls()
        if text.startswith("re:") or REGEX_ONLY.intersection(text) or ".*" in text:
            pattern = text.removeprefix("re:")
            try:
                compiled = re.compile(pattern, re.IGNORECASE)
            except re.error as exc:
                raise FilterError(f"bad regex {pattern!r}: {exc}; fix it, or press / and Enter on an empty "
                                  f"filter to show every metric") from None
            return cls(text, "regex", lambda name: compiled.search(name) is not None)
        patterns = [p.lower() for p in re.split(r"[\s,]+", text) if p]

        def matches(name: str) -> bool:
            lowered = name.lower()
            return any(fnmatchcase(lowered, p) if GLOB_WILDCARDS.intersection(p) else p in lowered
                       for p in patterns)

        return cls(text, "glob", matches)

    def __call__(self, name: str) -> bool:
        return self.match(name)

    def describe(self) -> str:
        return "all metrics" if self.kind == "all" else f"{self.kind} {self.text.removeprefix('re:')}"


@dataclass(frozen=True)
class GridView:
    """What one page of the grid shows, given the metrics the runs logged and the room it has."""

    ordered: list[str]  # every metric shown, pinned first: the pages cut from it
    metrics: list[str]  # this page's, at most columns x rows
    columns: int
    rows: int
    page: int
    total: int  # metrics the runs logged
    highlighted: str | None

    @property
    def per_page(self) -> int:
        return self.columns * self.rows

    @property
    def pages(self) -> int:
        return max(1, math.ceil(len(self.ordered) / self.per_page))


class GridState:
    """What the user set on the grid: the filter, pinned and log-Y cells, columns and rows (None: as many as fit),
    the highlighted cell (by metric name, so it stays on its metric as new ones come) and the run drawn on top."""

    def __init__(self) -> None:
        self.filter = MetricFilter()
        self.pinned: list[str] = []  # in the order they were pinned
        self.log_y: set[str] = set()
        self.columns: int | None = None
        self.rows: int | None = None
        self.highlighted: str | None = None
        self.top_run: str | None = None  # None: the page's own run

    # What is shown --------------------------------------------------------------------------------------------
    def set_filter(self, text: str) -> None:
        """Filter by `text`; a bad regex raises FilterError and leaves the filter as it was."""
        self.filter = MetricFilter.parse(text)

    def ordered(self, names: Sequence[str]) -> list[str]:
        """The metrics shown: the pinned ones the runs logged (whatever the filter), then those the filter keeps."""
        logged = set(names)
        pinned = [m for m in self.pinned if m in logged]
        return pinned + sorted(m for m in logged if m not in pinned and self.filter(m))

    def layout(self, width: int, height: int) -> tuple[int, int]:
        """Columns and rows: as set, or as many cells of `CELL_WIDTH` x `CELL_HEIGHT` as fit (1 to 4 each)."""
        columns = self.columns or min(max(CHOICES), max(1, width // CELL_WIDTH))
        rows = self.rows or min(max(CHOICES), max(1, height // CELL_HEIGHT))
        return columns, rows

    def view(self, names: Sequence[str], width: int, height: int) -> GridView:
        ordered = self.ordered(names)
        columns, rows = self.layout(width, height)
        per_page = columns * rows
        if self.highlighted not in ordered:
            self.highlighted = ordered[0] if ordered else None
        page = ordered.index(self.highlighted) // per_page if self.highlighted is not None else 0
        return GridView(ordered, ordered[page * per_page:(page + 1) * per_page], columns, rows, page, len(names),
                        self.highlighted)

    # Keys -------------------------------------------------------------------------------------------------------
    def toggle_pin(self, metric: str) -> None:
        if metric in self.pinned:
            self.pinned.remove(metric)
        else:
            self.pinned.append(metric)
        self.highlighted = metric  # (its page follows it: pinned, it is on the first)

    def toggle_log(self, metric: str) -> None:
        self.log_y ^= {metric}

    def cycle_columns(self, view: GridView) -> None:
        self.columns = CHOICES[(CHOICES.index(view.columns) + 1) % len(CHOICES)] if view.columns in CHOICES else 1

    def cycle_rows(self, view: GridView) -> None:
        self.rows = CHOICES[(CHOICES.index(view.rows) + 1) % len(CHOICES)] if view.rows in CHOICES else 1

    def move(self, view: GridView, dx: int, dy: int) -> None:
        """Move the highlight a cell across (`dx`) or a row down (`dy`); past the page's edge to the next page or
        the one before, and no further than the first or last metric."""
        if view.highlighted is None:
            return
        index = view.ordered.index(view.highlighted) + dx + dy * view.columns
        self.highlighted = view.ordered[min(max(index, 0), len(view.ordered) - 1)]

    def turn_page(self, view: GridView, delta: int) -> None:
        """To the first cell of the next page (`delta` 1) or of the one before (-1)."""
        if not view.ordered:
            return
        page = min(max(view.page + delta, 0), view.pages - 1)
        self.highlighted = view.ordered[page * view.per_page]

    def cycle_top(self, run_ids: Sequence[str]) -> None:
        """Draw the next run on top (of `run_ids`, the page's own run first)."""
        if not run_ids:
            return
        ids = list(run_ids)
        current = ids.index(self.top_run) if self.top_run in ids else 0
        self.top_run = ids[(current + 1) % len(ids)]

    def header(self, view: GridView) -> str:
        """The grid's line: filter, layout, page, what is shown, pinned and log-Y counts."""
        parts = [self.filter.describe(), f"{view.columns}x{view.rows}", f"page {view.page + 1}/{view.pages}",
                 f"{len(view.ordered)}/{view.total} metrics"]
        pinned = sum(1 for m in self.pinned if m in view.ordered)
        if pinned:
            parts.append(f"{pinned} pinned")
        logged = sum(1 for m in self.log_y if m in view.ordered)
        if logged:
            parts.append(f"log-Y {logged}")
        return " · ".join(parts)


# Runs and their colours -------------------------------------------------------------------------------------------
def run_colour(run_id: str) -> str:
    """A run's own colour, from its id: the same on every redraw, screen and app."""
    return RUN_COLOURS[zlib.crc32(run_id.encode()) % len(RUN_COLOURS)]


def run_colours(run_ids: Sequence[str]) -> dict[str, str]:
    """Each run's colour in an overlay: its own (`run_colour`), unless a run earlier in id order took it: then the
    next free one (so the same runs overlaid get the same colours whatever order they were picked in)."""
    colours: dict[str, str] = {}
    taken: set[str] = set()
    for run_id in sorted(set(run_ids)):
        start = RUN_COLOURS.index(run_colour(run_id))
        for step in range(len(RUN_COLOURS)):
            colour = RUN_COLOURS[(start + step) % len(RUN_COLOURS)]
            if colour not in taken or len(taken) >= len(RUN_COLOURS):
                break
        colours[run_id] = colour
        taken.add(colour)
    return colours


def draw_order(run_ids: Sequence[str], top: str | None) -> list[str]:
    """The runs in drawing order: the one on top (None: the first, the page's own run) drawn last."""
    if not run_ids:
        return []
    on_top = top if top is not None and top in run_ids else run_ids[0]
    return [r for r in run_ids if r != on_top] + [on_top]


def metric_names(runs: Sequence[RunSeries]) -> list[str]:
    """Every metric any of the runs logged, sorted."""
    names: set[str] = set()
    for _, series in runs:
        names.update(series)
    return sorted(names)


# A cell's points ----------------------------------------------------------------------------------------------
def min_max_buckets(xs: Sequence[float], ys: Sequence[float], buckets: int) -> tuple[list[float], list[float]]:
    """At most 2 x `buckets` points: per bucket of consecutive points its lowest and highest, in x order (a spike
    survives, which an average would flatten). Fewer points than that come back as they are."""
    n = len(xs)
    if n <= 2 * buckets or buckets < 1:
        return list(xs), list(ys)
    out_x: list[float] = []
    out_y: list[float] = []
    for b in range(buckets):
        start, end = b * n // buckets, (b + 1) * n // buckets
        chunk = ys[start:end]
        low, high = chunk.index(min(chunk)), chunk.index(max(chunk))
        for i in ((low, high) if low < high else (high, low) if high < low else (low,)):
            out_x.append(xs[start + i])
            out_y.append(chunk[i])
    return out_x, out_y


def log10_points(xs: Sequence[float], ys: Sequence[float]) -> tuple[list[float], list[float], int]:
    """log10 of the positive values, and how many values were left out (zero or negative: no logarithm)."""
    kept_x = [x for x, y in zip(xs, ys, strict=True) if y > 0]
    kept_y = [math.log10(y) for y in ys if y > 0]
    return kept_x, kept_y, len(ys) - len(kept_y)


def compact(value: float) -> str:
    """A number in at most 7 characters: 0.734, 1500, 1.2e4, 3e-5."""
    if value == 0:
        return "0"
    if abs(value) >= 1e4 or abs(value) < 1e-2:
        mantissa, exponent = f"{value:.1e}".split("e")
        return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def step_label(x: float) -> str:
    """A step under a cell: 950, 12k, 1.2M."""
    for unit, size in (("M", 1e6), ("k", 1e3)):
        if abs(x) >= 10 * size:
            return f"{x / size:.0f}{unit}"
    return f"{x:.0f}"


# Braille raster -----------------------------------------------------------------------------------------------
# A character is 2 x 4 dots: the bit of the dot at [row][column] inside it.
DOT_BITS = ((0x01, 0x08), (0x02, 0x10), (0x04, 0x20), (0x40, 0x80))
_BRAILLE = [" "] + [chr(0x2800 + bits) for bits in range(1, 256)]


@dataclass(frozen=True)
class Raster:
    """A cell's plot as text: per row its braille characters and, per character, the index of the curve whose
    colour it takes (the last curve drawn that put a dot there; -1: none)."""

    rows: list[str]
    owners: list[list[int]]
    x_range: tuple[float, float]
    y_range: tuple[float, float]


def data_range(values: Sequence[float]) -> tuple[float, float]:
    """Lowest and highest of `values`, widened when flat (one step, a constant metric) so the curve sits in the
    middle with room around it."""
    if not values:
        return 0.0, 1.0
    low, high = min(values), max(values)
    if high - low < 1e-12 * max(1.0, abs(high)):
        pad = max(abs(low) * 0.1, min(abs(low), 0.1)) or 0.1
        return low - pad, high + pad
    return low, high


def column_spans(x: np.ndarray, y: np.ndarray, columns: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Per dot column, the lowest and highest dot row a polyline through (x, y) (in dots, x increasing) covers
    there: its points, and where it crosses each column's edges (a steep segment fills its columns, a flat one a
    row). A column it does not reach has low > high."""
    import numpy as np

    low = np.full(columns, rows, dtype=np.int64)
    high = np.full(columns, -1, dtype=np.int64)
    px = np.clip(np.rint(x), 0, columns - 1).astype(np.int64)
    py = np.clip(np.rint(y), 0, rows - 1).astype(np.int64)
    starts = np.concatenate(([0], np.flatnonzero(np.diff(px)) + 1))  # (x increases: each column's points in a row)
    low[px[starts]] = np.minimum.reduceat(py, starts)
    high[px[starts]] = np.maximum.reduceat(py, starts)
    first, last = int(px[0]), int(px[-1])
    if last > first:  # the edges between the columns it spans: each edge's row counts for the columns on both sides
        left = np.arange(first, last)
        at = np.clip(np.rint(np.interp(left + 0.5, x, y)), 0, rows - 1).astype(np.int64)
        for side in (left, left + 1):  # (each column once per side: no repeated index)
            low[side] = np.minimum(low[side], at)
            high[side] = np.maximum(high[side], at)
    return low, high


def rasterize(curves: Sequence[tuple[Sequence[float], Sequence[float]]], width: int, height: int) -> Raster:
    """Draw `curves` ((xs, ys) each, xs increasing, in drawing order: the last on top) as lines of braille dots on
    `width` x `height` characters, scaled to the range of all of them."""
    import numpy as np

    width, height = max(1, width), max(1, height)
    x_range = data_range([x for xs, _ in curves for x in ((xs[0], xs[-1]) if len(xs) else ())])
    y_range = data_range([y for _, ys in curves for y in ys])
    columns, rows = width * 2, height * 4
    weights = np.array(DOT_BITS, dtype=np.int64).reshape(1, 4, 1, 2)
    sx = (columns - 1) / (x_range[1] - x_range[0])
    sy = (rows - 1) / (y_range[1] - y_range[0])
    bits = np.zeros((height, width), dtype=np.int64)
    owners = np.full((height, width), -1, dtype=np.int64)
    row_index = np.arange(rows)[:, None]
    for index, (xs, ys) in enumerate(curves):
        if not len(xs):
            continue
        low, high = column_spans((np.asarray(xs, dtype=float) - x_range[0]) * sx,
                                 (y_range[1] - np.asarray(ys, dtype=float)) * sy, columns, rows)
        dots = ((row_index >= low) & (row_index <= high)).reshape(height, 4, width, 2)
        cells = (dots * weights).sum(axis=(1, 3))
        bits |= cells
        owners[cells > 0] = index
    text = ["".join([_BRAILLE[b] for b in row]) for row in bits.tolist()]
    return Raster(text, owners.tolist(), x_range, y_range)


@dataclass(frozen=True)
class CellLine:
    """One run's curve in a cell."""

    run_id: str
    xs: list[float]
    ys: list[float]  # log10 of the values on a log-Y cell
    colour: str


@dataclass(frozen=True)
class CellData:
    """What a cell draws: a curve per run (the one on top last), whether the y axis is logarithmic, and how many
    values a log-Y cell left out (zero or negative)."""

    metric: str
    lines: list[CellLine]
    log_y: bool
    hidden: int = 0
    latest: float | None = None  # the newest value of the page's own run

    @property
    def points(self) -> int:
        return sum(len(line.xs) for line in self.lines)


class PointsCache:
    """Per run and metric: the points a cell draws (smoothed, on log-Y the logarithms, downsampled to the cell's
    width), computed again only when the series' version, the width, log-Y or the smoothing changed."""

    MAX_ENTRIES = 4096

    def __init__(self) -> None:
        self._entries: dict[tuple[str, str], tuple[tuple[object, ...], tuple[list[float], list[float], int]]] = {}
        self.computed = 0  # entries computed (tests and the bench read it)

    def points(self, run_id: str, metric: str, series: Series, width: int, log_y: bool,
               smoothing: float) -> tuple[list[float], list[float], int]:
        """(xs, ys, values left out) of `series` for a cell `width` points wide."""
        key = (series.version, width, log_y, smoothing)
        entry = self._entries.get((run_id, metric))
        if entry is not None and entry[0] == key:
            return entry[1]
        xs, ys = series.points()
        ys = ema(ys, smoothing)
        hidden = 0
        if log_y:
            xs, ys, hidden = log10_points(xs, ys)
        xs, ys = min_max_buckets(xs, ys, width)
        if len(self._entries) >= self.MAX_ENTRIES:
            self._entries.clear()  # (runs or metrics no longer shown: start over rather than keep them)
        self._entries[(run_id, metric)] = (key, (xs, ys, hidden))
        self.computed += 1
        return xs, ys, hidden


def cell_signature(metric: str, runs: Sequence[RunSeries], size: tuple[int, int], log_y: bool, smoothing: float,
                   top: str | None) -> tuple[object, ...]:
    """What a cell's drawing depends on: compared before drawing, so a cell whose series did not move is left
    alone (the versions are per metric: a new step of one metric redraws only its cell). `size`: the plot's."""
    versions = tuple((run_id, series[metric].version if metric in series else -1) for run_id, series in runs)
    return (metric, size, log_y, smoothing, top, versions)


def only_data_moved(signature: tuple[object, ...], drawn: tuple[object, ...]) -> bool:
    """Whether a cell drawn at `drawn` shows what `signature` asks for, only with older points (the same metric,
    size, log-Y, smoothing, runs and run on top)."""
    runs, drawn_runs = signature[-1], drawn[-1]
    return signature[:-1] == drawn[:-1] and isinstance(runs, tuple) and isinstance(drawn_runs, tuple) and \
        [run_id for run_id, _ in runs] == [run_id for run_id, _ in drawn_runs]


def cell_data(metric: str, runs: Sequence[RunSeries], width: int, log_y: bool, smoothing: float, top: str | None,
              cache: PointsCache) -> CellData:
    """The curves of `metric` for a cell `width` points wide: each run that logged it in its colour, the run on
    top (None: the first) drawn last. A log-Y cell whose runs logged no positive value is drawn linear."""
    colours = run_colours([run_id for run_id, _ in runs])
    by_id = dict(runs)
    latest = runs[0][1][metric].last if runs and metric in runs[0][1] else None

    def curves(log: bool) -> tuple[list[CellLine], int]:
        lines, hidden = [], 0
        for run_id in draw_order([run_id for run_id, _ in runs], top):
            series = by_id[run_id].get(metric)
            if series is None:
                continue
            xs, ys, left_out = cache.points(run_id, metric, series, width, log, smoothing)
            hidden += left_out
            if xs:
                lines.append(CellLine(run_id, xs, ys, colours[run_id]))
        return lines, hidden

    lines, hidden = curves(log_y)
    if log_y and not lines:
        lines, _ = curves(False)
        return CellData(metric, lines, False, hidden, latest[1] if latest else None)
    return CellData(metric, lines, log_y, hidden, latest[1] if latest else None)


# Runs overlaid ---------------------------------------------------------------------------------------------------
_FOLD_IN_CHILD = """
import pickle, sys
from pathlib import Path
from prime_lab.workbench.dashboards.grid_model import fold_metrics
sys.stdout.buffer.write(pickle.dumps(fold_metrics(Path(sys.argv[1]), int(sys.argv[2]))))
"""


def fold_metrics(path: Path, capacity: int) -> MetricsFold:
    """A run's metric series folded from its events.jsonl (its log lines left out: an overlay draws none)."""
    model, offset = MetricsFold(capacity), 0
    with cyclic_gc_paused():  # (each chunk is freed by the next read)
        while True:
            items, offset = read_events(path, offset)
            if not items:
                break
            model.feed(items)
    model.logs.clear()
    return model


def fold_metrics_apart(paths: Sequence[Path], capacity: int) -> list[MetricsFold]:
    """`fold_metrics` of each run in a process of its own (`start_folds`, then `collect_folds`)."""
    return collect_folds(start_folds(paths, capacity))


MAX_FOLDS_AT_ONCE = 8


class StartedFolds(NamedTuple):
    """Runs being folded apart: their paths, the capacity, and a child process per run (None: folded here)."""

    paths: list[Path]
    capacity: int
    children: list[subprocess.Popen[bytes] | None]


def start_folds(paths: Sequence[Path], capacity: int) -> StartedFolds:
    """Start `fold_metrics` of each run in a process of its own, all at once (up to `MAX_FOLDS_AT_ONCE`; the OS
    shares the cores between them and the page): in the page's process the GIL would fold them in turn, and hold up
    the page's own replay and its drawing meanwhile (a run of 20,000 events: half a second). Cheap: call it from
    the UI thread, and `collect_folds` from a worker thread."""
    children: list[subprocess.Popen[bytes] | None] = []
    for index, path in enumerate(paths):
        child = None
        if index < MAX_FOLDS_AT_ONCE:
            try:
                child = start_child(_FOLD_IN_CHILD, str(path), str(capacity))
            except OSError:
                child = None
        children.append(child)
    return StartedFolds(list(paths), capacity, children)


def collect_folds(started: StartedFolds) -> list[MetricsFold]:
    """The models of `start_folds`' runs, in their order; a run whose process failed (or got none) is folded here."""
    models: list[MetricsFold] = []
    for path, child in zip(started.paths, started.children, strict=True):
        model = child_result(child) if child is not None else None
        models.append(model if isinstance(model, MetricsFold) else fold_metrics(path, started.capacity))
    return models


# A GEPA run's numbers as metrics --------------------------------------------------------------------------------
def mean(values: object) -> float | None:
    numbers = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)] \
        if isinstance(values, list) else []
    return sum(numbers) / len(numbers) if numbers else None


def gepa_metrics(kind: str, data: dict[str, object]) -> dict[str, float]:
    """The numbers of one GEPA event as the grid's metrics (a GEPA run logs no `metrics` events): its budget, each
    iteration's scores before and after, its verdict and time, and the frontier's best score and size."""
    picked: dict[str, object] = {}
    if kind == "gepa.budget":
        picked = {"budget/used": data.get("used"), "budget/remaining": data.get("remaining")}
    elif kind == "gepa.iteration":
        picked = {"iteration/parent_score": mean(data.get("parent_scores")),
                  "iteration/child_score": mean(data.get("child_scores")),
                  "iteration/accepted": float(data.get("verdict") == "accepted"),
                  "iteration/metric_calls": data.get("metric_calls"), "iteration/seconds": data.get("seconds")}
    elif kind == "gepa.frontier":
        picked = {"frontier/best_score": data.get("best_score"), "frontier/candidates": data.get("num_candidates")}
    return {k: float(v) for k, v in picked.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def gepa_metric_events(items: Sequence[object]) -> list[RawEvent]:
    """GEPA events (raw, as a page's follower reads them) as `metrics` events at their step (the iteration), for a
    `MetricsFold` the grid draws."""
    events: list[RawEvent] = []
    for item in items:
        if not isinstance(item, dict) or not str(item.get("kind", "")).startswith("gepa."):
            continue
        data = item.get("data")
        values = gepa_metrics(str(item["kind"]), data if isinstance(data, dict) else {})
        if values and isinstance(item.get("step"), int):
            events.append({"kind": "metrics", "step": item["step"], "source": item.get("source"), "data": values})
    return events
