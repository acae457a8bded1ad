"""Deleting a run from its own page: asked first, done in a worker thread (stopping an active run first can take the
stop's grace period, which must not freeze the app), then the page closes; a failure is shown and the page stays."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from textual.pilot import Pilot

from prime_lab.runs.registry import RunError, RunRegistry
from prime_lab.workbench.screens.confirm import ConfirmScreen
from prime_lab.workbench.screens.home import HomeScreen
from prime_lab.workbench.screens.run import RunScreen
from prime_lab.workbench.widgets.runs_table import RunsTable
from tests.workbench.lab_fixtures import SIZE, caught_up, fixed_run, lab_folder, make_app, record_notifications, until


async def at_home(pilot: Pilot[Any]) -> None:
    """Until home is up with its runs listed, then until its header has drawn its title: a test that ends while
    home is still mounting races its teardown (the header's title callback finds its children gone)."""
    await until(pilot, lambda: isinstance(pilot.app.screen, HomeScreen) and bool(pilot.app.screen.query(RunsTable)))
    await pilot.pause(0.2)


def test_delete_runs_off_the_ui_thread_then_closes_the_page(tmp_path: Path) -> None:
    fixed_run("rl-done")
    root = lab_folder(tmp_path)

    async def scenario() -> None:
        app = make_app(root, run_id="rl-done")
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: isinstance(app.screen, RunScreen) and caught_up(app.screen))
            page = app.screen
            assert isinstance(page, RunScreen)
            notes = record_notifications(app)
            delete = app.registry.delete
            entered, release = threading.Event(), threading.Event()
            threads: list[threading.Thread] = []

            def slow_delete(run_id: str, *, force: bool = False) -> Any:  # as slow as stopping an active run
                threads.append(threading.current_thread())
                entered.set()
                release.wait(10)
                return delete(run_id, force=force)

            app.registry.delete = slow_delete  # type: ignore[method-assign]
            await pilot.press("x")
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            await pilot.press("y")
            await until(pilot, entered.is_set)
            assert threads[0] is not threading.main_thread()
            await pilot.pause(0.2)  # the app keeps running meanwhile: the page is still redrawn, still shown
            page.changed.set()
            await until(pilot, lambda: not page.changed.is_set())
            assert app.screen is page
            await pilot.press("x")  # a second delete while the first runs is refused, not asked again
            await until(pilot, lambda: "Already deleting rl-done" in notes)
            assert app.screen is page
            release.set()
            await until(pilot, lambda: "Deleted rl-done" in notes)
            await at_home(pilot)  # the page closed
            assert not (RunRegistry().root / "rl-done").exists()
            assert "rl-done" not in app.screen.query_one(RunsTable).rows

    asyncio.run(scenario())


def test_a_failed_delete_is_shown_and_the_page_stays(tmp_path: Path) -> None:
    fixed_run("rl-done")
    root = lab_folder(tmp_path)

    async def scenario() -> None:
        app = make_app(root, run_id="rl-done")
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: isinstance(app.screen, RunScreen) and caught_up(app.screen))
            page = app.screen
            notes = record_notifications(app)

            def refuse(run_id: str, *, force: bool = False) -> Any:
                raise RunError(f"cannot delete {run_id}: busy")

            app.registry.delete = refuse  # type: ignore[method-assign]
            await pilot.press("x", "y")
            await until(pilot, lambda: "cannot delete rl-done: busy" in notes)
            await pilot.pause(0.2)
            assert app.screen is page and "Deleted rl-done" not in notes
            assert (RunRegistry().root / "rl-done").exists()

    asyncio.run(scenario())


def test_leaving_the_page_while_it_is_deleted_does_not_close_the_next_one(tmp_path: Path) -> None:
    fixed_run("rl-done")
    root = lab_folder(tmp_path)

    async def scenario() -> None:
        app = make_app(root, run_id="rl-done")
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: isinstance(app.screen, RunScreen) and caught_up(app.screen))
            notes = record_notifications(app)
            delete = app.registry.delete
            entered, release = threading.Event(), threading.Event()

            def slow_delete(run_id: str, *, force: bool = False) -> Any:
                entered.set()
                release.wait(10)
                return delete(run_id, force=force)

            app.registry.delete = slow_delete  # type: ignore[method-assign]
            await pilot.press("x", "y")
            await until(pilot, entered.is_set)
            await pilot.press("escape")  # back home before the deletion ended
            await at_home(pilot)
            home = app.screen
            release.set()
            await until(pilot, lambda: "Deleted rl-done" in notes)
            await pilot.pause(0.2)
            assert app.screen is home  # home stays: only the run's own page closes itself

    asyncio.run(scenario())
