"""What the training dashboards (RL and SFT) share: a header (state, step/max, elapsed, ETA and the run kind's own
numbers), progress, alerts, live charts with smoothing and series chosen by key, other runs of the same kind
overlaid for comparison, the logs, and beside every tab the latest metrics and the event tail.

The Charts tab has two layouts (`g` switches): the picked charts (`m` picks them) and the metrics grid
(workbench.widgets.metrics_grid: every metric the runs logged, with its own keys while it has focus).

A dashboard names its charts (`CHARTS`), the metrics of its Latest panel (`LATEST_KEYS`) and of its header
(`THROUGHPUT`, `HEADLINE`), its model (`new_model`) and its keys (`dashboard_bindings`); it may add tabs after Charts
(`compose_tabs`) and widgets above them (`compose_top`)."""

from __future__ import annotations

import time
from typing import ClassVar, Generic, TypeVar

from rich.cells import cell_len
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Header, ProgressBar, RichLog, Static, TabbedContent, TabPane

from prime_lab.runs.display import duration
from prime_lab.runs.events import BadLine
from prime_lab.runs.registry import FINAL_STATES, Run
from prime_lab.workbench.dashboards.event_folds import MetricsFold, RawEvent
from prime_lab.workbench.dashboards.files import settle_heap
from prime_lab.workbench.dashboards.grid_model import RunSeries, StartedFolds, collect_folds, start_folds
from prime_lab.workbench.screens.pick_many import PickManyScreen
from prime_lab.workbench.screens.run import LOG_LINES, DashboardScreen
from prime_lab.workbench.widgets.alerts_pane import AlertsPane
from prime_lab.workbench.widgets.charts import SMOOTHING_STEPS, ChartSpec, MetricChart, custom_chart
from prime_lab.workbench.widgets.key_footer import KeyFooter
from prime_lab.workbench.widgets.logs_pane import LogsPane
from prime_lab.workbench.widgets.metrics_grid import MetricsGrid
from prime_lab.workbench.widgets.tail_log import TailLog

M = TypeVar("M", bound=MetricsFold)

CHART_EVERY = 0.25  # seconds between chart redraws while data flows
TAIL_EVERY = 0.5  # and between writes to the event tail (a live run's lines: each write measures and renders them)
GRID_EVERY = 0.5  # and between redraws of the grid (up to 16 cells, each a few runs: a key waits less for them)
CHART_WIDTH = 48  # columns per chart when the grid decides how many fit side by side
COMPARED_CAPACITY = 256  # points kept per series of a run overlaid (a chart or a grid cell is narrower than that)


def human(value: float) -> str:
    for unit, size in (("M", 1e6), ("k", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.1f}{unit}"
    return f"{value:.0f}"


def show_text(static: Static, text: str) -> None:
    """Show `text` in `static`, laying the page out again only when its height may change: another number of
    lines, or a line as wide as the widget (it may wrap). A live run's header and Latest panel change at every
    poll, and a layout of the page costs tens of milliseconds, which a key pressed meanwhile waits for."""
    old = static.content
    if old == text:
        return
    width = static.content_size.width
    fits = isinstance(old, str) and old.count("\n") == text.count("\n") and width > 0 and \
        all(cell_len(line) < width for line in (*old.splitlines(), *text.splitlines()))
    static.update(text, layout=not fits)


def dashboard_bindings(prefix: str, tabs: list[tuple[str, str]], extra: tuple[Binding, ...] = ()) -> list[BindingType]:
    """A training dashboard's keys (ids `prefix.*`): a number per tab (id, title), smoothing, series, compare, the
    `extra` keys, and the logs' filters."""
    numbered: list[BindingType] = [Binding(str(number), f"tab('{tab}')", title, id=f"{prefix}.tab_{tab}")
                                   for number, (tab, title) in enumerate(tabs, 1)]
    return [*numbered,
            Binding("e", "smoothing", "Smoothing", id=f"{prefix}.smoothing"),
            Binding("m", "pick_series", "Series", id=f"{prefix}.series"),
            Binding("c", "compare", "Compare", id=f"{prefix}.compare"),
            Binding("g", "grid_layout", "Grid", id=f"{prefix}.grid"),
            *extra,
            Binding("p", "next_process", "Process", id=f"{prefix}.next_process"),
            Binding("v", "next_level", "Level", id=f"{prefix}.next_level")]


class ChartsDashboard(DashboardScreen, Generic[M]):
    """A training run's page: charts of its metrics, its logs, the latest values and the event tail."""

    CHARTS: ClassVar[tuple[ChartSpec, ...]] = ()
    LATEST_KEYS: ClassVar[tuple[str, ...]] = ()
    THROUGHPUT: ClassVar[str] = ""  # the tokens/s metric
    HEADLINE: ClassVar[tuple[tuple[str, str], ...]] = ()  # (metric, its format) shown in the header
    KIND: ClassVar[str] = ""  # the run kind offered for comparison
    KIND_NAME: ClassVar[str] = ""  # as the page says it ("RL")
    TAB_ACTIONS = {"charts": {"smoothing", "pick_series", "compare", "grid_layout"},
                   "logs": {"next_process", "next_level"}}

    def __init__(self, run: Run) -> None:
        super().__init__(run)
        self.model: M = self.new_model()
        self.compared: dict[str, MetricsFold] = {}  # the runs overlaid: their metric series
        self.smoothing = 0
        self.specs: list[ChartSpec] = list(self.CHARTS)
        self._alerts_seen = 0  # alerts the page has drawn so far
        self._alerts_replayed = 0  # alerts folded during the replay: shown in the pane, never as a pop-up
        self._alerts_shown: tuple[int, object] | None = None  # what the alerts pane shows (their number, the last)
        self._charts_drawn_at = 0.0
        self._tail_written_at = 0.0
        self._charts_key: tuple[object, ...] | None = None
        self.charts: list[MetricChart] = []  # (a query per redraw costs more than drawing)
        self.grid_shown = False  # the Charts tab shows the metrics grid (else the picked charts)

    def new_model(self) -> M:
        """An empty model of this kind of run."""
        raise NotImplementedError

    def header_numbers(self, latest: dict[str, float]) -> list[str]:
        """The run kind's numbers in the header's first line: tokens/s, then `HEADLINE`'s metrics."""
        parts = [f"{human(latest[self.THROUGHPUT])} tok/s"] if self.THROUGHPUT in latest else []
        return parts + [text.format(latest[key]) for key, text in self.HEADLINE if key in latest]

    def latest_notes(self) -> list[str]:
        """Lines under the Latest panel's metrics."""
        return []

    # Layout -------------------------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        with Vertical(id="dash"):
            yield Static("", id="dash-status", markup=False)
            yield ProgressBar(id="run-progress", show_eta=False)
            yield AlertsPane(id="alerts")
            yield from self.compose_top()
            with Horizontal(id="dash-row"):
                with TabbedContent(initial="charts", id="dash-tabs"):
                    with TabPane("Charts", id="charts"):
                        with VerticalScroll(id="charts-grid"):
                            yield from self.new_charts(self.specs)
                        grid = MetricsGrid(id="metrics-grid")
                        grid.display = False
                        yield grid
                    yield from self.compose_tabs()
                    with TabPane("Logs", id="logs"):
                        yield LogsPane(id="logs-pane")
                with Vertical(id="dash-side"):  # beside every tab: the latest metrics and the event tail
                    latest = Static("", id="latest", markup=False)
                    latest.border_title = "Latest"
                    yield latest
                    log = TailLog(id="run-log", max_lines=LOG_LINES, wrap=False, markup=False, highlight=False)
                    log.border_title = "Events"
                    yield log
        yield KeyFooter()  # (rebuilt only when its keys change: the grid takes and gives back the focus)

    def compose_top(self) -> ComposeResult:
        """Widgets between the alerts and the tabs."""
        yield from ()

    def compose_tabs(self) -> ComposeResult:
        """Tabs between Charts and Logs."""
        yield from ()

    def on_mount(self) -> None:
        self.charts = list(self.query(MetricChart))
        self.grid = self.query_one(MetricsGrid)

    @staticmethod
    def new_charts(specs: list[ChartSpec]) -> list[MetricChart]:
        charts = [MetricChart(spec) for spec in specs]
        for chart in charts:
            chart.display = False  # until it has data (an empty plot costs a render)
        return charts

    def on_resize(self) -> None:
        grid = self.query_one("#charts-grid")
        grid.styles.grid_size_columns = max(1, grid.size.width // CHART_WIDTH)

    def covered(self, key: str) -> bool:
        """Whether a standard chart draws this metric."""
        return any(key in spec.keys() or key in spec.line_keys([key]) or key in spec.point_keys([key])
                   for spec in self.CHARTS)

    # Following ----------------------------------------------------------------------------------------------
    def reset(self) -> None:
        self.model = self.new_model()
        self._alerts_seen = self._alerts_replayed = 0

    def consume(self, items: list[RawEvent | BadLine]) -> None:
        self.model.feed(items)
        if not self.live:
            self._alerts_replayed = len(self.model.alerts)

    def apart(self) -> str | None:
        model_class = type(self.model)
        return f"{model_class.__module__}:{model_class.__qualname__}"

    def adopt(self, model: object) -> bool:
        if type(model) is not type(self.model):
            return False
        self.model = model
        self._alerts_replayed = len(self.model.alerts)
        return True

    # Drawing ------------------------------------------------------------------------------------------------
    def _refresh_if_changed(self) -> None:
        super()._refresh_if_changed()
        if not self.live:
            return  # the charts are drawn once, when the replay caught up (CaughtUp)
        now = time.monotonic()
        every = GRID_EVERY if self.grid_shown else CHART_EVERY
        if now - self._charts_drawn_at >= every:  # a flood of events redraws the charts a few times a second
            with self.fold_lock:
                key = self.charts_key()
                if key != self._charts_key:  # idle charts cost nothing
                    self._charts_drawn_at = now
                    self.draw_charts()
                    self._charts_key = self.charts_key()

    def charts_key(self) -> tuple[object, ...]:
        """What the charts show depends on, compared before drawing: the runs' series versions (log lines and
        samples leave them alone) and which charts were resized (keys that change what is shown go through
        refresh_now)."""
        if self.grid_shown:
            return (self.model.series_version, *(model.series_version for model in self.compared.values()),
                    "grid", self.grid.needs_draw)
        return (self.model.series_version, *(model.series_version for model in self.compared.values()),
                *(chart.needs_draw for chart in self.charts))

    def refresh_now(self) -> None:
        self._charts_drawn_at = self._tail_written_at = 0.0  # a key changed what is shown: draw at once
        self._charts_key = None
        super().refresh_now()

    def redraw(self) -> None:
        model = self.model
        show_text(self.query_one("#dash-status", Static), self.header_text())
        if not self.live:
            return  # replaying: the status line says how far; the rest is drawn once it caught up
        self.update_progress(self.query_one(ProgressBar))
        alerts = model.alerts
        shown = (len(alerts), alerts[-1] if alerts else None)
        if shown != self._alerts_shown:  # (it lays the page out: only when there is something new)
            self._alerts_shown = shown
            self.query_one(AlertsPane).show(alerts)
        if len(alerts) > max(self._alerts_seen, self._alerts_replayed):  # a pop-up only for an alert raised live
            newest = alerts[-1]
            self.notify(str(newest.get("message", "")), title=f"Alert: {newest.get('name')}",
                        severity="error" if newest.get("level") == "ERROR" else "warning", timeout=8)
        self._alerts_seen = len(alerts)
        latest = model.latest()
        step = f"step {model.latest_step}" if model.latest_step is not None else "no metrics yet"
        rows = [f"{key:<18}{latest[key]:>9.4g}" for key in self.LATEST_KEYS if key in latest]
        show_text(self.query_one("#latest", Static), "\n".join([step, *rows, *self.latest_notes()]))
        now = time.monotonic()
        if now - self._tail_written_at >= TAIL_EVERY or self.follower.clear_tail:  # (the newest lines wait a little)
            self._tail_written_at = now
            self.write_tail(self.query_one("#run-log", RichLog))
        elif self.tail:
            self.changed.set()  # (written at a later poll, even when nothing new comes)
        if self.query_one(TabbedContent).active == "logs":
            self.query_one(LogsPane).show(model.logs, total=model.log_total)

    def header_text(self) -> str:
        status, model = self.status, self.model
        state = status.get("state") or model.state or "?"
        step, max_steps = status.get("step") or model.latest_step or 0, status.get("max_steps")
        now = self.lab.clock()
        started = status.get("started_at") or status.get("created_at")
        end = status.get("ended_at") if state in FINAL_STATES else None
        elapsed = (end or now) - started if isinstance(started, (int, float)) else None
        eta = None
        if elapsed is not None and isinstance(max_steps, int) and step and state not in FINAL_STATES:
            eta = elapsed / step * max(0, max_steps - step)
        parts = [self.run.id, str(state), f"step {step}/{max_steps or '?'}", f"elapsed {duration(elapsed)}"]
        if eta is not None:
            parts.append(f"ETA {duration(eta)}")
        parts += self.header_numbers(model.latest())
        second = [f"smoothing {SMOOTHING_STEPS[self.smoothing]:g} (e)", "grid (g)" if self.grid_shown else
                  "picked charts (g)"]
        if note := self.replay_note():
            second.append(note)
        if self.compared:
            second.append("comparing " + ", ".join(self.compared))
        if status.get("reason"):
            second.append(str(status["reason"]))
        if self.bad_lines:
            second.append(f"{self.bad_lines} corrupt line(s) skipped")
        return " · ".join(parts) + "\n" + " · ".join(second)

    def grid_runs(self) -> list[RunSeries]:
        """What the metrics grid overlays: this run's series, then each compared run's (lock held)."""
        return [(self.run.id, self.model.series), *((run_id, m.series) for run_id, m in self.compared.items())]

    def draw_charts(self) -> None:
        if self.query_one(TabbedContent).active != "charts":
            return
        if self.grid_shown:
            self.grid.draw(self.grid_runs(), SMOOTHING_STEPS[self.smoothing])
            return
        runs: list[tuple[str, MetricsFold]] = [(self.run.id, self.model), *self.compared.items()]
        available = set(self.model.series)
        for other in self.compared.values():
            available |= set(other.series)
        smoothing = SMOOTHING_STEPS[self.smoothing]
        for chart in self.charts:
            has_data = bool(chart.spec.line_keys(sorted(available)) or chart.spec.point_keys(sorted(available)))
            if chart.display != has_data:
                chart.display = has_data
            if has_data:  # (off screen too: drawing sets data, the compositor renders only what is visible)
                chart.draw(runs, smoothing)

    def on_metrics_grid_changed(self, event: MetricsGrid.Changed) -> None:
        """A grid key changed what it shows: draw it now (the data under the lock), not at the next poll."""
        event.stop()
        self._draw_grid(new_data=False)  # (only the cells the key changed: new points wait for the next redraw)

    def on_metrics_grid_behind(self, event: MetricsGrid.Behind) -> None:
        """Cells wait to show new points: the next few."""
        event.stop()
        self._draw_grid(new_data=True)

    def _draw_grid(self, new_data: bool) -> None:
        if self.grid_shown and self.query_one(TabbedContent).active == "charts":
            with self.fold_lock:
                self.grid.draw(self.grid_runs(), SMOOTHING_STEPS[self.smoothing], new_data=new_data)

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        if self.grid_shown and self.query_one(TabbedContent).active == "charts":
            self.grid.focus()  # back on the Charts tab: the grid's keys at once

    # Keys ---------------------------------------------------------------------------------------------------
    def action_grid_layout(self) -> None:
        """Switch the Charts tab between the picked charts and the metrics grid (which takes the focus: its keys)."""
        self.show_grid(not self.grid_shown)

    def show_grid(self, shown: bool = True) -> None:
        self.grid_shown = shown
        self.grid.display = shown
        self.query_one("#charts-grid").display = not shown
        if shown:
            self.grid.focus()
        self.refresh_now()

    def action_smoothing(self) -> None:
        """Cycle the EMA smoothing of every chart."""
        self.smoothing = (self.smoothing + 1) % len(SMOOTHING_STEPS)
        self.refresh_now()

    def action_pick_series(self) -> None:
        """Choose the charts: the standard ones and any other metric of the run."""
        shown = {spec.id for spec in self.specs}
        with self.fold_lock:
            keys = set(self.model.series)
            for other in self.compared.values():
                keys |= set(other.series)
        options = [(spec.title, spec.id, spec.id in shown) for spec in self.CHARTS]
        for key in sorted(k for k in keys if not self.covered(k)):
            spec = custom_chart(key)
            options.append((key, spec.id, spec.id in shown))
        by_id = {spec.id: spec for spec in self.CHARTS} | {custom_chart(k).id: custom_chart(k) for k in keys}

        def picked(ids: list[str] | None) -> None:
            if ids is not None:
                self.call_later(self.set_charts, [by_id[i] for i in [o[1] for o in options] if i in ids])

        self.app.push_screen(PickManyScreen("Charts to show", options), picked)

    async def set_charts(self, specs: list[ChartSpec]) -> None:
        self.specs = specs
        grid = self.query_one("#charts-grid")
        await grid.remove_children()
        self.charts = self.new_charts(specs)
        await grid.mount_all(self.charts)
        self.call_after_refresh(self.refresh_now)

    def action_compare(self) -> None:
        """Overlay other runs' curves (of the same kind) on these charts."""
        runs = [r for r in self.lab.registry.runs() if r.id != self.run.id]
        options = []
        for other in runs:
            status = other.read_status()
            if status.get("kind") == self.KIND:
                label = f"{other.id}  {status.get('state', '?')}  step {status.get('step') or 0}  " \
                        f"{status.get('name') or ''}"
                options.append((label, other.id, other.id in self.compared))
        if not options:
            self.notify(f"No other {self.KIND_NAME} runs to compare with.")
            return

        def picked(ids: list[str] | None) -> None:
            if ids is not None:
                self.overlay(ids)

        self.app.push_screen(PickManyScreen("Runs to overlay", options), picked)

    def overlay(self, ids: list[str]) -> None:
        """Overlay these runs (of the same kind; none: []) on the charts and the grid: each folded in a process of
        its own (`grid_model.start_folds`, started here at once), collected in a worker thread."""
        paths = [self.lab.registry.get(run_id).events_path for run_id in ids]
        started = start_folds(paths, COMPARED_CAPACITY)
        self.run_worker(lambda: self._load_compared(ids, started), thread=True, exclusive=True, group="compare",
                        exit_on_error=False)

    def _load_compared(self, ids: list[str], started: StartedFolds) -> None:
        """Each run's metrics, nothing else (an overlay draws only those), keeping a quarter of the points the page's
        own run keeps."""
        loaded = dict(zip(ids, collect_folds(started), strict=True))
        with self.fold_lock:
            self.compared = loaded
        settle_heap()  # (they live as long as the overlay)
        self.app.call_from_thread(self.refresh_now)
