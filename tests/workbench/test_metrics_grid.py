"""The metrics grid on the RL dashboard, driven by keys: every metric as a cell, the grid's keys while it has focus
(the page's keys of the same letters elsewhere), the filter by glob and by regex, pin, log-Y, columns, rows and
pages, other runs overlaid in their own colours, and only the cells whose series moved redrawn."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from textual.pilot import Pilot
from textual.widgets import Static, TabbedContent

from prime_lab.workbench.dashboards.grid_model import run_colours
from prime_lab.workbench.screens.dashboard_rl import RLDashboard
from prime_lab.workbench.screens.pick_many import PickManyScreen
from prime_lab.workbench.widgets.metrics_grid import LIVE_SLICE, FilterInput, GridCell, MetricsGrid
from tests.workbench.lab_fixtures import caught_up, lab_folder, make_app, record_notifications, recorded_run, until

SIZE = (120, 40)
METRICS = 22  # the recorded RL run's


@asynccontextmanager
async def grid_page(tmp_path: Path, run_id: str = "rl-run") -> AsyncIterator[tuple[Pilot[Any], RLDashboard,
                                                                                   MetricsGrid]]:
    """The app on a recorded run's dashboard, its Charts tab switched to the grid (`g`), the grid drawn."""
    app = make_app(lab_folder(tmp_path), run_id=run_id)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, RLDashboard) and app.screen.model.latest_step == 30
                    and caught_up(app.screen))
        screen = app.screen
        assert isinstance(screen, RLDashboard)
        grid = screen.query_one(MetricsGrid)
        await press(pilot, "g", lambda: grid.has_focus and grid.drawn and grid.view is not None and bool(shown(grid)))
        yield pilot, screen, grid


def shown(grid: MetricsGrid) -> list[GridCell]:
    return [cell for cell in grid.cells if cell.display]


def header(grid: MetricsGrid) -> str:
    return str(grid.query_one("#grid-header", Static).render())


def cell_of(grid: MetricsGrid, metric: str) -> GridCell:
    return next(cell for cell in shown(grid) if cell.metric == metric)


async def drawn(pilot: Pilot[Any], grid: MetricsGrid, what: str) -> None:
    """Until the header says `what` and every cell on show is drawn."""
    await until(pilot, lambda: what in header(grid) and grid.drawn and all(c.drawn_size == c.plot_size
                                                                           for c in shown(grid)),
                what=lambda: header(grid))


async def press(pilot: Pilot[Any], key: str, answered: Callable[[], bool]) -> None:
    """Press `key` as a terminal delivers it and wait until `answered()` (pilot.press waits for the page to go
    idle after each key, which a page redrawing every poll takes long to)."""
    pilot.app.simulate_key(key)
    await until(pilot, answered)


async def filter_by(pilot: Pilot[Any], grid: MetricsGrid, text: str) -> None:
    field = grid.query_one(FilterInput)
    await press(pilot, "slash", lambda: field.display and field.has_focus)
    field.value = text
    pilot.app.simulate_key("enter")


def test_the_grid_shows_every_metric_and_its_keys_work_while_it_has_focus(tmp_path: Path) -> None:
    recorded_run("rl-run")

    async def scenario() -> None:
        async with grid_page(tmp_path) as (pilot, screen, grid):
            assert grid.has_focus and not screen.query_one("#charts-grid").display  # the picked charts: hidden
            assert grid.view is not None and len(grid.view.ordered) == METRICS == len(screen.model.series)
            columns, rows = grid.view.columns, grid.view.rows
            await drawn(pilot, grid, f"{columns}x{rows} · page 1/")
            assert [c.metric for c in shown(grid)] == sorted(screen.model.series)[:columns * rows]
            assert all(c.drawn_runs == ["rl-run"] and c.drawn_points >= 1 for c in shown(grid))
            assert "grid (g)" in str(screen.query_one("#dash-status", Static).render())
            await press(pilot, "c", lambda: f"{columns + 1}x{rows}" in header(grid))  # one column more
            await drawn(pilot, grid, f"{columns + 1}x{rows}")
            assert not isinstance(pilot.app.screen, PickManyScreen) and len(shown(grid)) == (columns + 1) * rows
            await press(pilot, "r", lambda: f"{columns + 1}x{rows + 1}" in header(grid))  # one row more
            per_page = (columns + 1) * (rows + 1)
            await press(pilot, "pagedown", lambda: "page 2/" in header(grid))
            await drawn(pilot, grid, "page 2/")
            view = grid.view
            assert view.metrics == sorted(screen.model.series)[per_page:2 * per_page]
            assert view.highlighted == view.metrics[0] and "highlighted" in shown(grid)[0].classes
            await press(pilot, "down", lambda: grid.state.highlighted == view.metrics[columns + 1])
            await press(pilot, "right", lambda: grid.state.highlighted == view.metrics[columns + 2])
            await press(pilot, "pageup", lambda: "page 1/" in header(grid))
            # Focus elsewhere: the page's keys of the same letters are the page's again (compare: no other run).
            messages = record_notifications(pilot.app)  # type: ignore[arg-type]
            await press(pilot, "tab", lambda: not grid.has_focus)
            await press(pilot, "c", lambda: "No other RL runs to compare with." in messages)
            assert grid.view.columns == columns + 1
            await press(pilot, "2", lambda: screen.query_one(TabbedContent).active == "samples")
            await press(pilot, "1", lambda: grid.has_focus)  # back on the Charts tab: the grid has the keys
            await press(pilot, "g", lambda: screen.query_one("#charts-grid").display and not grid.display)

    asyncio.run(scenario())


def test_the_filter_takes_a_glob_or_a_regex(tmp_path: Path) -> None:
    recorded_run("rl-run")

    async def scenario() -> None:
        async with grid_page(tmp_path) as (pilot, screen, grid):
            await filter_by(pilot, grid, "reward/*")
            await drawn(pilot, grid, "glob reward/* · ")
            assert [c.metric for c in shown(grid)] == ["reward/alphabet-sort", "reward/mean", "reward/reverse-text",
                                                       "reward/std"]
            assert f" 4/{METRICS} metrics" in header(grid) and grid.has_focus
            await filter_by(pilot, grid, "^(loss|optim/)")  # regex syntax: a regex
            await drawn(pilot, grid, "regex ^(loss|optim/)")
            assert [c.metric for c in shown(grid)] == ["loss", "optim/grad_norm", "optim/lr"]
            await filter_by(pilot, grid, "")
            await drawn(pilot, grid, "all metrics · ")
            assert f"{METRICS}/{METRICS} metrics" in header(grid)

    asyncio.run(scenario())


def test_a_bad_regex_is_a_message_and_escape_leaves_the_filter_line_not_the_page(tmp_path: Path) -> None:
    recorded_run("rl-run")

    async def scenario() -> None:
        async with grid_page(tmp_path) as (pilot, screen, grid):
            messages = record_notifications(pilot.app)  # type: ignore[arg-type]
            await filter_by(pilot, grid, "re:^loss")
            await drawn(pilot, grid, "regex ^loss")
            await filter_by(pilot, grid, "re:(loss")
            await until(pilot, lambda: any("bad regex '(loss'" in m for m in messages))
            field = grid.query_one(FilterInput)
            assert field.display and field.has_focus  # open, to fix it
            assert "regex ^loss" in header(grid) and [c.metric for c in shown(grid)] == ["loss"]  # as it was
            await press(pilot, "escape", lambda: not field.display and grid.has_focus)
            assert pilot.app.screen is screen

    asyncio.run(scenario())


def test_pin_puts_a_chart_on_top_and_log_y_leaves_out_values_at_or_below_zero(tmp_path: Path) -> None:
    recorded_run("rl-run")

    async def scenario() -> None:
        async with grid_page(tmp_path) as (pilot, screen, grid):
            ordered = sorted(screen.model.series)
            grid.state.highlighted = "loss"  # (as the arrows move it: tested above)
            await press(pilot, "p", lambda: "1 pinned" in header(grid))
            await drawn(pilot, grid, "1 pinned")
            first = shown(grid)[0]
            assert first.metric == "loss" and first.border_title == "★ loss" and "highlighted" in first.classes
            assert [c.metric for c in shown(grid)[1:3]] == ordered[:2]  # the others after it, in order
            linear = first.raster
            assert linear is not None and linear.y_range[0] < 0  # the fixture's loss goes below zero
            await press(pilot, "y", lambda: "log-Y 1" in header(grid) and first.raster is not linear)
            loss = screen.model.series["loss"].points()[1]
            left_out = sum(1 for v in loss if v <= 0)
            assert left_out and f"log-Y, {left_out} value(s) <= 0 left out" in str(first.border_subtitle)
            assert first.raster is not None and first.raster.y_range[1] < 0  # log10 of values below 1
            second = shown(grid)[1].raster
            assert second is not None and second.y_range[0] >= 0  # log-Y is the one cell's only
            await press(pilot, "y", lambda: "log-Y" not in header(grid))
            await press(pilot, "p", lambda: "pinned" not in header(grid))
            await drawn(pilot, grid, "page 2/")  # its place in order, on the second page of four cells
            assert grid.state.highlighted == "loss" and cell_of(grid, "loss").border_title == "loss"

    asyncio.run(scenario())


def test_other_runs_overlay_in_their_own_colours_with_the_top_one_drawn_last(tmp_path: Path) -> None:
    recorded_run("rl-run")
    recorded_run("rl-run", "rl-other")

    async def scenario() -> None:
        async with grid_page(tmp_path) as (pilot, screen, grid):
            await press(pilot, "tab", lambda: not grid.has_focus)  # the page's `c`: pick runs to overlay
            await press(pilot, "c", lambda: isinstance(pilot.app.screen, PickManyScreen))
            await pilot.press("space", "enter")
            await until(pilot, lambda: all(c.drawn_runs == ["rl-other", "rl-run"] for c in shown(grid)))
            colours = run_colours(["rl-run", "rl-other"])
            assert colours["rl-run"] != colours["rl-other"]
            assert all(c.drawn_colours == [colours["rl-other"], colours["rl-run"]] for c in shown(grid))
            assert "● rl-run (top) ● rl-other" in header(grid)
            grid.focus()
            await press(pilot, "t", lambda: all(c.drawn_runs == ["rl-run", "rl-other"] for c in shown(grid)))
            assert "rl-other (top)" in header(grid)  # the other run on top
            assert all(c.drawn_colours == [colours["rl-run"], colours["rl-other"]] for c in shown(grid))
            await press(pilot, "pagedown", lambda: "page 2/" in header(grid))  # other cells: the same colours
            await drawn(pilot, grid, "page 2/")
            assert all(c.drawn_colours == [colours["rl-run"], colours["rl-other"]] for c in shown(grid))

    asyncio.run(scenario())


def test_only_the_cells_whose_series_moved_are_redrawn(tmp_path: Path) -> None:
    run = recorded_run("rl-run")

    async def scenario() -> None:
        async with grid_page(tmp_path) as (pilot, screen, grid):
            await filter_by(pilot, grid, "re:^(loss|reward/mean)$")
            await drawn(pilot, grid, f" · 2/{METRICS} metrics")
            loss, reward = cell_of(grid, "loss"), cell_of(grid, "reward/mean")
            redraws = loss.redraws, reward.redraws
            await pilot.pause(0.5)  # polls and chart periods with nothing new: nothing redrawn
            assert (loss.redraws, reward.redraws) == redraws
            with run.writer("trainer") as writer:
                writer.metrics({"loss": 0.5}, step=31)
            await until(pilot, lambda: loss.redraws > redraws[0])  # (one pass looked at both cells)
            assert reward.redraws == redraws[1] and screen.model.latest_step == 31
            assert loss.raster is not None and loss.raster.x_range[1] == 31.0

    asyncio.run(scenario())


def test_new_points_on_every_cell_are_drawn_a_few_cells_at_a_time(tmp_path: Path) -> None:
    run = recorded_run("rl-run")

    async def scenario() -> None:
        async with grid_page(tmp_path) as (pilot, screen, grid):
            grid.state.columns, grid.state.rows = 4, 3
            grid.changed()
            await drawn(pilot, grid, "4x3 · page 1/")
            cells = shown(grid)
            assert len(cells) == 12 > LIVE_SLICE  # (the page holds more cells than a slice)
            passes: list[int] = []
            draw = grid.draw

            def counted(*args: Any, **kwargs: Any) -> int:
                redrawn = draw(*args, **kwargs)
                if kwargs.get("new_data", True):
                    passes.append(redrawn)
                return redrawn

            grid.draw = counted  # type: ignore[method-assign]
            with run.writer("trainer") as writer:  # a new step of every metric on the page
                writer.metrics({cell.metric: 0.5 for cell in cells if cell.metric}, step=31)
            await until(pilot, lambda: all(c.raster is not None and c.raster.x_range[1] == 31.0 for c in cells))
            assert max(passes) <= LIVE_SLICE and sum(passes) >= len(cells)
            assert sum(1 for p in passes if p) >= -(-len(cells) // LIVE_SLICE)  # (at least ceil(n / slice) passes)
            assert not grid.behind

    asyncio.run(scenario())
