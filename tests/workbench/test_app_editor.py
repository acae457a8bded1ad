"""The config editor, driven by keys: edit in the form, see the TOML, break it, see the problem, fix, save."""

from __future__ import annotations

import asyncio
import difflib
from pathlib import Path

from textual.widgets import Input

from prime_lab.workbench.screens.editor import EditorScreen
from prime_lab.workbench.widgets.config_form import FieldRow
from prime_lab.workbench.widgets.problems_panel import ProblemsPanel
from prime_lab.workbench.widgets.toml_editor import TomlEditor
from tests.workbench.lab_fixtures import SIZE, lab_folder, make_app, record_notifications


def row(screen: EditorScreen, key: str) -> FieldRow:
    return next(r for r in screen.query(FieldRow) if r.key == key)


def test_form_edit_shows_in_toml_problem_has_its_line_and_save_changes_one_line(tmp_path: Path) -> None:
    root = lab_folder(tmp_path)
    path = root / "configs" / "rl" / "reverse-text.toml"
    original = path.read_text()

    async def scenario() -> None:
        app = make_app(path)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            screen = app.screen
            assert isinstance(screen, EditorScreen)
            toml = screen.query_one(TomlEditor)
            problems = screen.query_one(ProblemsPanel)
            assert problems.problems == []

            # Edit max_steps in the form: the TOML view shows the new value on the same, commented line.
            field = row(screen, "max_steps").query_one(Input)
            field.focus()
            await pilot.press("end", "backspace", "backspace", "4", "0")
            await pilot.pause()
            assert "max_steps = 40                  # ~ a few minutes" in toml.text

            # Introduce an error: the problem names the key and its line, and the field is marked.
            await pilot.press("x")
            await pilot.pause()
            assert [(p.key, p.line) for p in problems.problems] == [("max_steps", 7)]
            assert row(screen, "max_steps").has_class("-invalid")
            assert 'max_steps = "40x"' in toml.text

            # Fix it.
            await pilot.press("backspace")
            await pilot.pause()
            assert problems.problems == []
            assert not row(screen, "max_steps").has_class("-invalid")

            await pilot.press("ctrl+s")
            await pilot.pause()
        saved = path.read_text()
        diff = [line for line in difflib.unified_diff(original.splitlines(), saved.splitlines(), lineterm="", n=0)
                if line[:1] in "+-" and not line.startswith(("+++", "---"))]
        assert diff == ["-max_steps = 30                  # ~ a few minutes on 2 cores; reward/mean should rise "
                        "within the first 10-20 steps",
                        "+max_steps = 40                  # ~ a few minutes on 2 cores; reward/mean should rise "
                        "within the first 10-20 steps"]

    asyncio.run(scenario())


def test_toml_edit_shows_in_form_and_problem_jumps_to_its_line(tmp_path: Path) -> None:
    path = lab_folder(tmp_path) / "configs" / "rl" / "reverse-text.toml"

    async def scenario() -> None:
        app = make_app(path)
        messages = record_notifications(app)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            screen = app.screen
            assert isinstance(screen, EditorScreen)
            await pilot.press("ctrl+t")  # to the TOML view
            toml = screen.query_one(TomlEditor)
            assert toml.has_focus
            toml.cursor_location = (toml.text.splitlines().index("[lora]"), len("[lora]"))
            await pilot.press("enter", *"dropout = 0.5", "enter", *"alpah = 8")
            await pilot.pause()
            problems = screen.query_one(ProblemsPanel).problems
            assert [(p.key, p.suggestion) for p in problems] == [("lora.alpah", "alpha")]
            line = problems[0].line
            assert line is not None and toml.document.get_line(line - 1).startswith("alpah")
            assert row(screen, "lora.dropout").query_one(Input).value == "0.5"

            toml.cursor_location = (0, 0)
            await pilot.press("ctrl+g", "enter")  # problems panel, select the first problem
            await pilot.pause()
            assert toml.has_focus and toml.cursor_location == (line - 1, 0)

            # Launching an invalid config is refused; saving it is allowed but warned.
            await pilot.press("ctrl+s")
            await pilot.pause()
            assert "alpah = 8" in path.read_text()
            await pilot.press("ctrl+r")
            await pilot.pause()
            assert any("Saved with 1 problem" in m for m in messages)
            assert any("cannot launch" in m for m in messages)

    asyncio.run(scenario())


def test_env_entries_added_moved_and_removed_by_key(tmp_path: Path) -> None:
    path = lab_folder(tmp_path) / "configs" / "rl" / "reverse-text.toml"

    async def scenario() -> None:
        app = make_app(path)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            screen = app.screen
            assert isinstance(screen, EditorScreen)
            row(screen, "model").query_one(Input).focus()
            await pilot.press("ctrl+n")  # the env picker: built-in environments with their arguments
            await pilot.pause()
            picker = app.screen
            await pilot.press("down", "enter")
            await pilot.pause()
            assert app.screen is screen and picker is not screen
            ids = [e["id"] for e in screen.document.env_entries()]
            assert len(ids) == 2 and ids[0] == "primeintellect/reverse-text"
            assert screen.query_one(TomlEditor).text.count("[[env]]") == 2

            row(screen, "env[1].id").query_one(Input).focus()
            await pilot.press("alt+up")
            await pilot.pause()
            assert [e["id"] for e in screen.document.env_entries()] == [ids[1], ids[0]]
            row(screen, "env[0].id").query_one(Input).focus()
            await pilot.press("alt+x")
            await pilot.pause()
            assert [e["id"] for e in screen.document.env_entries()] == [ids[0]]

    asyncio.run(scenario())
