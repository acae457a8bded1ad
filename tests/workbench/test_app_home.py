"""Home and run pages, driven by keys: duplicate, delete with confirmation, open a run, launch an eval."""

from __future__ import annotations

import asyncio
from pathlib import Path

from textual.widgets import DataTable, Input, RichLog

from prime_lab.inference.builtin.launcher import BuiltinServer
from prime_lab.runs.registry import RunRegistry
from prime_lab.workbench.screens.editor import EditorScreen
from prime_lab.workbench.screens.home import HomeScreen
from prime_lab.workbench.screens.launch_eval import LaunchEvalScreen
from prime_lab.workbench.screens.run import RunScreen
from prime_lab.workbench.widgets.env_picker import EnvPicker
from prime_lab.workbench.widgets.runs_table import RunsTable
from tests.workbench.lab_fixtures import SIZE, caught_up, fixed_run, lab_folder, make_app, until


def test_home_lists_configs_and_runs_and_keys_act_on_them(tmp_path: Path) -> None:
    root = lab_folder(tmp_path)
    fixed_run("rl-done")

    async def scenario() -> None:
        app = make_app(root)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            assert isinstance(app.screen, HomeScreen)
            await pilot.press("d")  # duplicate the first config
            await pilot.pause()
            assert (root / "configs" / "rl" / "multi-env-copy.toml").exists()
            await pilot.press("enter")  # open it in the editor
            await pilot.pause()
            assert isinstance(app.screen, EditorScreen)
            await pilot.press("escape")
            await pilot.pause()
            await pilot.press("tab")  # to the runs table: run keys now
            await pilot.pause()
            assert app.screen.query_one(RunsTable).has_focus
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, RunScreen) and caught_up(app.screen))
            assert isinstance(app.screen, RunScreen)
            log = app.screen.query_one("#run-log", RichLog)
            await until(pilot, lambda: any("reward/mean=0.25" in str(line.text) for line in log.lines))
            await pilot.press("escape", "x")  # delete asks first; n keeps it, y deletes it
            await pilot.pause()
            await pilot.press("n")
            await pilot.pause()
            assert (RunRegistry().root / "rl-done").exists()
            await pilot.press("x", "y")
            await until(pilot, lambda: not (RunRegistry().root / "rl-done").exists())  # deleted in a worker

    asyncio.run(scenario())


def test_launch_eval_from_home_opens_its_run_page_with_results(tmp_path: Path, builtin_server: BuiltinServer) -> None:
    root = lab_folder(tmp_path)

    async def scenario() -> None:
        app = make_app(root)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            await pilot.press("n")
            await pilot.pause()
            modal = app.screen
            assert isinstance(modal, LaunchEvalScreen)
            modal.query_one(EnvPicker).select_id("primeintellect/reverse-text")
            for name, value in (("model", builtin_server.model_name), ("base-url", builtin_server.base_url),
                                ("num", "2"), ("rollouts", "1")):
                modal.query_one(f"#eval-{name}", Input).value = value
            await pilot.press("ctrl+r")
            await until(pilot, lambda: isinstance(app.screen, RunScreen), 60)
            screen = app.screen
            assert isinstance(screen, RunScreen)
            await until(pilot, lambda: screen.run.state == "completed", 60, screen.run.status)
            table = screen.query_one("#run-results", DataTable)
            await until(pilot, lambda: table.row_count >= 2)  # the page reads results.jsonl at its next poll
            assert table.row_count == 2
            await pilot.press("escape")
            await pilot.pause()
            assert screen.run.id in app.screen.query_one(RunsTable).rows

    asyncio.run(scenario())


def test_a_failing_worker_of_a_page_reaches_the_user(tmp_path: Path) -> None:
    """A screen's worker posts its state to the screen only (the message does not bubble): the page hands the error
    to the app, which shows it."""
    from tests.workbench.lab_fixtures import record_notifications

    root = lab_folder(tmp_path)
    fixed_run("rl-done")

    def fails() -> None:
        raise ValueError("the registry is on a read-only disk")

    async def scenario() -> None:
        app = make_app(root)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            messages = record_notifications(app)
            assert isinstance(app.screen, HomeScreen)
            app.screen.run_worker(fails, thread=True, exit_on_error=False)
            await until(pilot, lambda: any("read-only disk" in m for m in messages))
            await pilot.press("tab", "enter")
            await until(pilot, lambda: isinstance(app.screen, RunScreen))
            app.screen.run_worker(fails, thread=True, exit_on_error=False)
            await until(pilot, lambda: sum("read-only disk" in m for m in messages) == 2)

    asyncio.run(scenario())
