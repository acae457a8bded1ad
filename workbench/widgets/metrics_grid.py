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
from textual.geometry import Region
from textual.message import Message
from textual.strip import Strip
from textual.timer import Timer
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
# New points are drawn a few cells at a time, a slice every few hundredths of a second: a page of 16 cells of
# three runs took 10-15 ms to redraw at once, and a key pressed meanwhile waited for all of it.
LIVE_SLICE = 4
LIVE_SLICE_EVERY = 0.03
LABEL_WIDTH = 8  # the y axis' labels and a space
GUTTER = 1  # columns between cells side by side


class GridCell:
    """One metric's chart in the grid: the curves as braille dots, each run in its colour, the y range on the left,
    the steps under it, in a rounded frame titled with the metric (its newest value under it). Not a widget: the
    grid's canvas (`GridCanvas`) draws every cell itself. As widgets, a page of 16 cells cost the page a layout on
    each change of columns or rows (a key waited 80-250 ms for it) and a render of each cell's lines through its own
    styles; drawn here, a key costs the cells it changed."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.metric: str | None = None
        self.display = False
        self.region = Region(0, 0, 0, 0)  # in the canvas
        self.border_title = ""
        self.border_subtitle = ""
        self.highlighted = False
        self.signature: tuple[object, ...] | None = None
        self.drawn_size: tuple[int, int] | None = None  # the plot's columns x rows when last drawn
        self.drawn_points = 0  # points drawn by the last redraw (tests and the bench read it)
        self.drawn_runs: list[str] = []  # the runs of the last redraw, in drawing order (the top one last)
        self.drawn_colours: list[str] = []  # and their colours
        self.redraws = 0
        self.note = ""  # what a log-Y cell left out, under it
        self.raster: Raster | None = None
        self.painted = False  # the screen shows the last redraw (the bench waits for it)
        self._body: list[list[Segment]] = []  # the plot's lines with their labels, and the steps' line

    @property
    def classes(self) -> frozenset[str]:
        return frozenset({"highlighted"}) if self.highlighted else frozenset()

    @property
    def plot_size(self) -> tuple[int, int]:
        """The plot's columns and rows (inside the frame, the y labels beside it, the steps under it); a guess before
        the grid has a size."""
        if not self.region.width:
            return 32, 6
        return max(4, self.region.width - 2 - LABEL_WIDTH), max(1, self.region.height - 3)

    @property
    def needs_draw(self) -> bool:
        return self.display and self.drawn_size is not None and self.drawn_size != self.plot_size

    def show(self, data: CellData, signature: tuple[object, ...], styles: CellStyles) -> None:
        """Draw `data`'s curves (the run on top last)."""
        width, height = self.plot_size
        raster = rasterize([(line.xs, line.ys) for line in data.lines], width, height)
        colours = [styles.colour(line.colour) for line in data.lines]
        labels = {0: raster.y_range[1], height - 1: raster.y_range[0]}
        if height >= 5:
            labels[(height - 1) // 2] = (raster.y_range[0] + raster.y_range[1]) / 2
        body = []
        for row, (text, owners) in enumerate(zip(raster.rows, raster.owners, strict=True)):
            value = labels.get(row)
            label = "" if value is None else compact(10 ** value if data.log_y else value)
            segments = [Segment(f"{label:>{LABEL_WIDTH - 1}} ", styles.axis)]
            start = 0
            for i in range(1, width + 1):  # runs of characters of one colour
                if i == width or owners[i] != owners[start]:
                    segments.append(Segment(text[start:i], colours[owners[start]] if owners[start] >= 0
                                            else styles.base))
                    start = i
            body.append(segments)
        if data.lines:
            first, last = (step_label(x) for x in raster.x_range)
            steps = f"{first}{last:>{max(1, width - len(first))}}"
            body.append([Segment(" " * LABEL_WIDTH + steps[:width], styles.axis)])
        self.raster = raster
        self._body = body
        self.signature, self.drawn_size = signature, (width, height)
        self.drawn_points = data.points
        self.drawn_runs = [line.run_id for line in data.lines]
        self.drawn_colours = [line.colour for line in data.lines]
        self.redraws += 1
        self.painted = False

    def line(self, y: int, styles: CellStyles) -> list[Segment]:
        """The cell's line `y` (0: the frame's top), `region.width` cells wide."""
        width, height = self.region.width, self.region.height
        frame = styles.highlight if self.highlighted else styles.border
        inner = max(0, width - 2)
        if y == 0 or y == height - 1:
            left, right = ("╭", "╮") if y == 0 else ("╰", "╯")
            text, style = (self.border_title, styles.title) if y == 0 else (self.border_subtitle, styles.subtitle)
            text = text if len(text) <= inner - 4 else (text[:max(0, inner - 5)] + "…" if inner > 5 else "")
            if not text:
                return [Segment(left + "─" * inner + right, frame)]
            if y == 0:  # the title on the left, the subtitle on the right
                return [Segment(left + "─ ", frame), Segment(text, style),
                        Segment(" " + "─" * (inner - len(text) - 3) + right, frame)]
            return [Segment(left + "─" * (inner - len(text) - 3) + " ", frame), Segment(text, style),
                    Segment(" ─" + right, frame)]
        row = y - 1
        segments = [Segment("│", frame)]
        used = 0
        if row < len(self._body):
            for segment in self._body[row]:
                segments.append(segment)
                used += len(segment.text)
        if used < inner:
            segments.append(Segment(" " * (inner - used), styles.base))
        elif used > inner:
            segments = list(Strip(segments).crop(0, inner + 1))
        segments.append(Segment("│", frame))
        return segments


class CellStyles:
    """The rich styles a cell is drawn in, taken from the canvas' component classes once, and again after a change
    of its styles (each costs a walk up the DOM), and a style per run colour."""

    def __init__(self, canvas: GridCanvas) -> None:
        self.base = canvas.rich_style
        part = canvas.get_component_rich_style
        self.border = self.base + part("grid-canvas--border", partial=True)
        self.highlight = self.base + part("grid-canvas--highlight", partial=True)
        self.title = self.base + part("grid-canvas--title", partial=True)
        self.subtitle = self.base + part("grid-canvas--subtitle", partial=True)
        self.axis = self.base + part("grid-canvas--axis", partial=True)
        self._colours: dict[str, Style] = {}

    def key(self) -> tuple[Style, ...]:
        return self.base, self.border, self.highlight, self.title, self.subtitle, self.axis

    def colour(self, colour: str) -> Style:
        style = self._colours.get(colour)
        if style is None:
            style = self._colours[colour] = self.base + Style(color=colour)
        return style


def cell_regions(width: int, height: int, columns: int, rows: int) -> list[Region]:
    """The cells of a `columns` x `rows` page on `width` x `height`, row by row: a gutter between cells side by
    side, the room left over given to the first columns and rows."""
    usable = max(0, width - GUTTER * (columns - 1))
    widths = [usable // columns + (1 if c < usable % columns else 0) for c in range(columns)]
    heights = [height // rows + (1 if r < height % rows else 0) for r in range(rows)]
    regions = []
    y = 0
    for row_height in heights:
        x = 0
        for column_width in widths:
            regions.append(Region(x, y, column_width, row_height))
            x += column_width + GUTTER
        y += row_height
    return regions


class GridCanvas(Widget, can_focus=False):
    """Draws the grid's cells (`GridCell`), each line put together from the cells it crosses and kept until one of
    them changes: a key redraws the lines of the cells it changed, and no layout of the page."""

    DEFAULT_CSS = """
    GridCanvas { height: 1fr; }
    GridCanvas > .grid-canvas--border { color: $primary-darken-2; }
    GridCanvas > .grid-canvas--highlight { color: $accent; }
    GridCanvas > .grid-canvas--title { color: $text; }
    GridCanvas > .grid-canvas--subtitle { color: $text-muted; }
    GridCanvas > .grid-canvas--axis { color: $text-muted; }
    """
    COMPONENT_CLASSES = {"grid-canvas--border", "grid-canvas--highlight", "grid-canvas--title",
                         "grid-canvas--subtitle", "grid-canvas--axis"}

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.cells = [GridCell(index) for index in range(MAX_CELLS)]
        self.styles_now: CellStyles | None = None
        self._lines: dict[int, Strip] = {}

    def cell_styles(self) -> CellStyles:
        """The styles cells are drawn in: taken once, and again after a change of the styles (a theme)."""
        if self.styles_now is None:
            self.styles_now = CellStyles(self)
        return self.styles_now

    def on_resize(self) -> None:
        self._lines.clear()

    def notify_style_update(self) -> None:
        super().notify_style_update()
        if self.styles_now is None or not self.is_mounted:
            return
        old, self.styles_now = self.styles_now, None
        if self.cell_styles().key() != old.key():  # (a theme: each cell drawn again in its colours)
            self._lines.clear()
            for cell in self.cells:
                cell.signature = None
            if isinstance(self.parent, MetricsGrid):
                self.parent.changed()

    def repaint(self, regions: Sequence[Region]) -> None:
        """Draw these parts of the canvas again (the cells in them changed)."""
        if not regions:
            return
        for region in regions:
            for y in range(region.y, region.bottom):
                self._lines.pop(y, None)
        self.refresh(*regions)

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        strip = self._lines.get(y)
        if strip is not None and strip.cell_length == width:
            return strip
        styles = self.cell_styles()
        segments: list[Segment] = []
        x = 0
        for cell in self.cells:
            region = cell.region
            if not cell.display or not region.y <= y < region.bottom:
                continue
            if region.x > x:
                segments.append(Segment(" " * (region.x - x), styles.base))
            segments.extend(cell.line(y - region.y, styles))
            x = region.right
            cell.painted = True
        strip = Strip(segments).crop_extend(0, width, styles.base)
        self._lines[y] = strip
        return strip


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
    MetricsGrid GridCanvas { height: 1fr; }
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

    class Behind(Message):
        """Cells wait to show new points (`behind`): the page draws the next few (`draw`, under its lock)."""

        def can_replace(self, message: Message) -> bool:
            return isinstance(message, MetricsGrid.Behind)

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.state = GridState()
        self.cache = PointsCache()
        self.names: list[str] = []  # the metrics of the last draw
        self.run_ids: list[str] = []  # the runs of the last draw, the page's own first
        self.view: GridView | None = None
        self.drawn = False  # every cell of the page drawn since the last change (the bench waits for it)
        self._header = Text()
        self._deferred = 0  # draws in a row that found the canvas without a size yet
        self.behind = False  # cells on show wait to show new points (drawn a few at a time: `LIVE_SLICE`)
        self._next_live = 0  # the cell the next slice of new points starts at (round robin)
        self._slice_timer: Timer | None = None

    def compose(self) -> ComposeResult:
        yield Static("", id="grid-header", markup=False)
        yield FilterInput(placeholder="filter: glob (reward/*, loss) or regex (re:^eval/.*avg); Enter, Esc",
                          id="grid-filter", compact=True)
        yield Static("No metrics logged yet.", id="grid-empty")
        yield GridCanvas(id="grid-cells")

    @property
    def canvas(self) -> GridCanvas:
        return self.query_one(GridCanvas)

    @property
    def cells(self) -> list[GridCell]:
        return self.canvas.cells

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
        canvas = self.canvas
        width, height = canvas.size
        view = self.view = self.state.view(self.names, width or 120, height or 30)
        header = self.header_text(view)
        if header != self._header:  # (an update lays the page out again: only when it says something new)
            self._header = header
            self.query_one("#grid-header", Static).update(header, layout=False)  # (one line, always)
        empty = self.query_one("#grid-empty")
        if empty.display != (not view.metrics):
            empty.display = not view.metrics
            canvas.display = bool(view.metrics)
        pending = not width or not height  # not laid out yet: drawn once it has a size
        regions = cell_regions(width, height, view.columns, view.rows) if not pending else []
        styles = canvas.cell_styles()
        dirty: list[Region] = []
        redrawn = live = 0
        behind = False
        top = self.state.top_run
        cells = self.cells
        order = cells[self._next_live:] + cells[:self._next_live]  # (new points: round robin over the cells)
        for cell in order:
            index = cell.index
            metric = view.metrics[index] if index < len(view.metrics) and not pending else None
            if metric is None:
                if cell.display:
                    cell.display = False
                    dirty.append(cell.region)
                cell.metric = None
                continue
            region = regions[index]
            if not cell.display or cell.region != region:
                if cell.display:
                    dirty.append(cell.region)  # (where it was: blank now, or another cell's)
                cell.display, cell.region = True, region
                dirty.append(region)
            cell.metric = metric
            log_y = metric in self.state.log_y
            framed = self._frame(cell, metric, runs, log_y, highlighted=metric == view.highlighted)
            signature = cell_signature(metric, runs, cell.plot_size, log_y, smoothing, top)
            data_only = cell.signature is not None and only_data_moved(signature, cell.signature)
            if signature == cell.signature or (data_only and (not new_data or live >= LIVE_SLICE)):
                behind = behind or signature != cell.signature
                if framed:
                    dirty.append(cell.region)
                continue
            if data_only:
                live += 1
                self._next_live = (index + 1) % len(cells)
            plot_width, _ = cell.plot_size
            data = cell_data(metric, runs, plot_width * 2, log_y, smoothing, top, self.cache)
            cell.show(data, signature, styles)
            cell.note = "log-Y: no value > 0" if log_y and not data.log_y else \
                f"log-Y, {data.hidden} value(s) <= 0 left out" if data.hidden else "log-Y" if log_y else ""
            self._frame(cell, metric, runs, log_y, highlighted=metric == view.highlighted)
            dirty.append(cell.region)
            redrawn += 1
        canvas.repaint(dirty)
        self.behind = behind
        if behind and self._slice_timer is None:
            self._slice_timer = self.set_timer(LIVE_SLICE_EVERY, self._next_slice)
        self.drawn = not pending
        self._deferred = self._deferred + 1 if pending else 0
        if pending and self._deferred <= 3:  # (a grid with no room lays out to no size: it does not try forever)
            self.call_after_refresh(self.post_message, self.Changed())
        return redrawn

    def _next_slice(self) -> None:
        self._slice_timer = None
        if self.behind:
            self.post_message(self.Behind())

    def _frame(self, cell: GridCell, metric: str, runs: Sequence[RunSeries], log_y: bool, highlighted: bool) -> bool:
        """Set the cell's title (the metric), subtitle (the page's own run's newest value, what log-Y left out) and
        highlight; whether any of them changed."""
        own = runs[0][1].get(metric) if runs else None
        latest = own.last if own is not None else None
        title = ("★ " if metric in self.state.pinned else "") + metric
        note = cell.note if log_y else ""
        subtitle = " · ".join(part for part in (f"{latest[1]:.4g}" if latest else "", note) if part)
        frame = (title, subtitle, highlighted)
        if frame == (cell.border_title, cell.border_subtitle, cell.highlighted):
            return False
        cell.border_title, cell.border_subtitle, cell.highlighted = frame
        return True

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
