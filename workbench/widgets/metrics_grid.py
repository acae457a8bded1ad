"""The metrics grid: every metric the runs logged as a small chart, a page of columns x rows at a time, the runs
overlaid in their own colours (`workbench.dashboards.grid_model` decides what is shown and computes the points).

Its keys work while it has focus (Tab moves focus away, and the page's keys of the same letters work again): `/`
filter (glob or regex), `p` pin the highlighted chart to the top, `y` log-Y on it, `c`/`r` cycle the columns and
rows (1 to 4), arrows move the highlight, PgUp/PgDn turn pages, `t` draws the next run on top. A key changes the
grid's state and posts `Changed`; the page then calls `draw` with its runs' series under its lock, which redraws
only the cells the key changed. A cell redraws only when its curves changed (the series' versions, its size,
log-Y, the smoothing, the run on top); new points wait for the page's next redraw of new data.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Container
from textual.message import Message
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import Input, Static

from prime_lab.workbench.dashboards.grid_model import (
    CHOICES,
    CellData,
    FilterError,
    GridState,
    GridView,
    PointsCache,
    Raster,
    RunSeries,
    cell_data,
    cell_signature,
    compact,
    metric_names,
    only_data_moved,
    rasterize,
    run_colours,
    step_label,
)

MAX_CELLS = max(CHOICES) ** 2
LABEL_WIDTH = 8  # the y axis' labels and a space


class GridCell(Widget, can_focus=False):
    """One metric's chart in the grid: the curves as braille dots, each run in its colour, the y range on the left
    and the steps under it. Drawn here, not with textual-plot's PlotWidget (the picked charts' widget): a page of
    16 of those took some 12 ms each to redraw and 30 ms each to mount, 200 ms for a page where a key must answer in
    50 ms. Not focusable: the grid's keys stay the grid's."""

    DEFAULT_CSS = """
    GridCell { height: 1fr; border: round $primary-darken-2; border-title-color: $text;
               border-subtitle-color: $text-muted; }
    GridCell.highlighted { border: round $accent; }
    GridCell > .grid-cell--axis { color: $text-muted; }
    """
    COMPONENT_CLASSES = {"grid-cell--axis"}

    def __init__(self, index: int) -> None:
        super().__init__(id=f"grid-cell-{index}")
        self.metric: str | None = None
        self.signature: tuple[object, ...] | None = None
        self.drawn_size: tuple[int, int] | None = None  # the plot's columns x rows when last drawn
        self.drawn_points = 0  # points drawn by the last redraw (tests and the bench read it)
        self.drawn_runs: list[str] = []  # the runs of the last redraw, in drawing order (the top one last)
        self.drawn_colours: list[str] = []  # and their colours
        self.redraws = 0
        self.note = ""  # what a log-Y cell left out, under it
        self.raster: Raster | None = None
        self.painted = False  # the screen shows the last redraw (the bench waits for it)
        self._strips: list[Strip] = []
        self._base = Style()  # (its rich_style costs a walk up the DOM: taken once per redraw, not per line)

    @property
    def plot_size(self) -> tuple[int, int]:
        """The plot's columns and rows (the y labels beside it, the steps under it); a guess before the layout."""
        width, height = self.size
        if not width:
            return 32, 6
        return max(4, width - LABEL_WIDTH), max(1, height - 1)

    @property
    def needs_draw(self) -> bool:
        return self.display and self.drawn_size is not None and self.drawn_size != self.plot_size

    def show(self, data: CellData, signature: tuple[object, ...]) -> None:
        """Draw `data`'s curves (the run on top last)."""
        width, height = self.plot_size
        raster = rasterize([(line.xs, line.ys) for line in data.lines], width, height)
        base = self._base = self.rich_style
        axis = base + self.get_component_rich_style("grid-cell--axis", partial=True)
        colours = [base + Style(color=line.colour) for line in data.lines]
        labels = {0: raster.y_range[1], height - 1: raster.y_range[0]}
        if height >= 5:
            labels[(height - 1) // 2] = (raster.y_range[0] + raster.y_range[1]) / 2
        strips = []
        for row, (text, owners) in enumerate(zip(raster.rows, raster.owners, strict=True)):
            value = labels.get(row)
            label = "" if value is None else compact(10 ** value if data.log_y else value)
            segments = [Segment(f"{label:>{LABEL_WIDTH - 1}} ", axis)]
            start = 0
            for i in range(1, width + 1):  # runs of characters of one colour
                if i == width or owners[i] != owners[start]:
                    segments.append(Segment(text[start:i], colours[owners[start]] if owners[start] >= 0 else base))
                    start = i
            strips.append(Strip(segments, LABEL_WIDTH + width))
        if data.lines:
            first, last = (step_label(x) for x in raster.x_range)
            steps = f"{first}{last:>{max(1, width - len(first))}}"
            strips.append(Strip([Segment(" " * LABEL_WIDTH + steps[:width], axis)], LABEL_WIDTH + width))
        self.raster = raster
        self._strips = strips
        self.signature, self.drawn_size = signature, (width, height)
        self.drawn_points = data.points
        self.drawn_runs = [line.run_id for line in data.lines]
        self.drawn_colours = [line.colour for line in data.lines]
        self.redraws += 1
        self.painted = False
        self.refresh()

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        self.painted = True
        if y < len(self._strips):
            return self._strips[y].crop_extend(0, width, self._base)
        return Strip.blank(width, self._base)


class FilterInput(Input):
    """The grid's filter line: Enter applies, Escape leaves it as it was (and does not close the page)."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="grid.filter_cancel")]

    def action_cancel(self) -> None:
        grid = self.parent
        if isinstance(grid, MetricsGrid):
            grid.close_filter()


class MetricsGrid(Widget, can_focus=True):
    """Every metric as a cell, a page at a time, with a one-line header (filter, layout, page, runs)."""

    DEFAULT_CSS = """
    MetricsGrid { height: 1fr; }
    MetricsGrid #grid-header { height: 1; padding: 0 1; background: $boost; }
    MetricsGrid:focus #grid-header { background: $primary-darken-2; }
    MetricsGrid FilterInput { height: 1; border: none; padding: 0 1; display: none; }
    MetricsGrid #grid-cells { height: 1fr; layout: grid; grid-gutter: 0 1; }
    MetricsGrid #grid-empty { height: 1fr; padding: 1 2; color: $text-muted; display: none; }
    """

    BINDINGS = [
        Binding("slash", "filter", "Filter", id="grid.filter"),
        Binding("p", "pin", "Pin", id="grid.pin"),
        Binding("y", "log_y", "Log-Y", id="grid.log_y"),
        Binding("c", "columns", "Columns", id="grid.columns"),
        Binding("r", "rows", "Rows", id="grid.rows"),
        Binding("t", "top_run", "Run on top", id="grid.top_run"),
        Binding("pagedown", "page(1)", "Page", id="grid.next_page"),
        Binding("pageup", "page(-1)", "Prev page", show=False, id="grid.prev_page"),
        Binding("left", "move(-1, 0)", "Left", show=False, id="grid.left"),
        Binding("right", "move(1, 0)", "Right", show=False, id="grid.right"),
        Binding("up", "move(0, -1)", "Up", show=False, id="grid.up"),
        Binding("down", "move(0, 1)", "Down", show=False, id="grid.down"),
    ]

    class Changed(Message):
        """The user changed what the grid shows: its page draws it again (`draw`, under the page's lock)."""

        def can_replace(self, message: Message) -> bool:
            return isinstance(message, MetricsGrid.Changed)  # (keys held down: one draw for the lot)

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.state = GridState()
        self.cache = PointsCache()
        self.names: list[str] = []  # the metrics of the last draw
        self.run_ids: list[str] = []  # the runs of the last draw, the page's own first
        self.view: GridView | None = None
        self.drawn = False  # every cell of the page drawn since the last change (the bench waits for it)
        self._header = Text()
        self._deferred = 0  # draws in a row that left cells for after the next layout

    def compose(self) -> ComposeResult:
        yield Static("", id="grid-header", markup=False)
        yield FilterInput(placeholder="filter: glob (reward/*, loss) or regex (re:^eval/.*avg); Enter, Esc",
                          id="grid-filter", compact=True)
        yield Static("No metrics logged yet.", id="grid-empty")
        with Container(id="grid-cells"):
            for index in range(MAX_CELLS):
                cell = GridCell(index)
                cell.display = False
                yield cell

    @property
    def cells(self) -> list[GridCell]:
        return list(self.query_one("#grid-cells").query_children(GridCell))

    @property
    def needs_draw(self) -> bool:
        """A cell on show was resized since it was drawn (its points are for another width)."""
        return any(cell.needs_draw for cell in self.cells)

    def on_resize(self) -> None:
        self.post_message(self.Changed())

    # Drawing ----------------------------------------------------------------------------------------------
    def draw(self, runs: Sequence[RunSeries], smoothing: float, new_data: bool = True) -> int:
        """Show `runs` (the page's own first): the header, and each cell whose curves changed; returns how many
        cells were redrawn. Without `new_data` (after a key) a cell that shows what it showed, only with newer
        points, is left for the next redraw of new data: a key redraws only the cells it changed."""
        self.names = metric_names(runs)
        self.run_ids = [run_id for run_id, _ in runs]
        width, height = self.size.width or 120, max(1, (self.size.height or 30) - 1)
        view = self.view = self.state.view(self.names, width, height)
        header = self.header_text(view)
        if header != self._header:  # (an update lays the page out again: only when it says something new)
            self._header = header
            self.query_one("#grid-header", Static).update(header, layout=False)  # (one line, always)
        container = self.query_one("#grid-cells")
        relaid = (container.styles.grid_size_columns, container.styles.grid_size_rows) != (view.columns, view.rows)
        if relaid:  # the cells change size: drawn once the page is laid out again, at their new size
            container.styles.grid_size_columns = view.columns
            container.styles.grid_size_rows = view.rows
        empty = self.query_one("#grid-empty")
        if empty.display != (not view.metrics):
            empty.display = not view.metrics
        redrawn, pending = 0, relaid
        top = self.state.top_run
        for index, cell in enumerate(self.cells):
            metric = view.metrics[index] if index < len(view.metrics) else None
            if metric is None:
                if cell.display:
                    cell.display = False
                cell.metric = None
                continue
            if not cell.display:
                cell.display = True
                pending = True  # (laid out at the next refresh: drawn then)
            cell.metric = metric
            log_y = metric in self.state.log_y
            width, height = cell.plot_size
            signature = cell_signature(metric, runs, (width, height), log_y, smoothing, top)
            self._title(cell, metric, runs, log_y, highlighted=metric == view.highlighted)
            if signature == cell.signature or (not new_data and cell.signature is not None
                                               and only_data_moved(signature, cell.signature)):
                continue
            if pending or not cell.size.width:  # not laid out yet: drawn at the next pass, at its size
                pending = True
                continue
            data = cell_data(metric, runs, width * 2, log_y, smoothing, top, self.cache)
            cell.show(data, signature)
            cell.note = "log-Y: no value > 0" if log_y and not data.log_y else \
                f"log-Y, {data.hidden} value(s) <= 0 left out" if data.hidden else "log-Y" if log_y else ""
            self._title(cell, metric, runs, log_y, highlighted=metric == view.highlighted)
            redrawn += 1
        self.drawn = not pending
        self._deferred = self._deferred + 1 if pending else 0
        if pending and self._deferred <= 3:  # (a grid with no room lays out to no size: it does not try forever)
            self.call_after_refresh(self.post_message, self.Changed())
        return redrawn

    def _title(self, cell: GridCell, metric: str, runs: Sequence[RunSeries], log_y: bool, highlighted: bool) -> None:
        own = runs[0][1].get(metric) if runs else None
        latest = own.last if own is not None else None
        title = ("★ " if metric in self.state.pinned else "") + metric
        note = cell.note if log_y else ""
        subtitle = " · ".join(part for part in (f"{latest[1]:.4g}" if latest else "", note) if part)
        if cell.border_title != title:
            cell.border_title = title
        if cell.border_subtitle != subtitle:
            cell.border_subtitle = subtitle
        cell.set_class(highlighted, "highlighted")

    def header_text(self, view: GridView) -> Text:
        text = Text(self.state.header(view))
        colours = run_colours(self.run_ids)
        if len(self.run_ids) > 1:
            top = self.state.top_run if self.state.top_run in self.run_ids else self.run_ids[0]
            text.append(" · runs")
            for run_id in self.run_ids:
                text.append(" ● ", style=colours[run_id])
                text.append(run_id + (" (top)" if run_id == top else ""))
        return text

    # Keys -------------------------------------------------------------------------------------------------
    def changed(self) -> None:
        self.drawn = False
        self.post_message(self.Changed())

    def action_filter(self) -> None:
        """Filter the metrics by a glob or a regex."""
        field = self.query_one(FilterInput)
        field.value = self.state.filter.text
        field.display = True  # in the header's place (the cells keep their size)
        self.query_one("#grid-header").display = False
        field.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        try:
            self.state.set_filter(event.value)
        except FilterError as exc:
            self.notify(str(exc), title="Filter", severity="error", timeout=8)
            return  # (the line stays open to fix it)
        self.close_filter()
        self.changed()

    def close_filter(self) -> None:
        self.query_one(FilterInput).display = False
        self.query_one("#grid-header").display = True
        self.focus()

    def action_pin(self) -> None:
        """Pin the highlighted chart to the top (or unpin it)."""
        if self.state.highlighted is not None:
            self.state.toggle_pin(self.state.highlighted)
            self.changed()

    def action_log_y(self) -> None:
        """Log-Y on the highlighted chart (or off)."""
        if self.state.highlighted is not None:
            self.state.toggle_log(self.state.highlighted)
            self.changed()

    def action_columns(self) -> None:
        """1, 2, 3, 4 columns."""
        if self.view is not None:
            self.state.cycle_columns(self.view)
            self.changed()

    def action_rows(self) -> None:
        """1, 2, 3, 4 rows."""
        if self.view is not None:
            self.state.cycle_rows(self.view)
            self.changed()

    def action_move(self, dx: int, dy: int) -> None:
        if self.view is not None:
            self.state.move(self.view, dx, dy)
            self.changed()

    def action_page(self, delta: int) -> None:
        if self.view is not None:
            self.state.turn_page(self.view, delta)
            self.changed()

    def action_top_run(self) -> None:
        """Draw the next run on top of the others."""
        self.state.cycle_top(self.run_ids)
        self.changed()
