"""An SFT config in the editor: read as SFT, validated by the SFT schema, its form built from it (the model's
`model = "..."` spelling edited by the [model] name field), and launched as `prime sft run @file --yes`."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from textual.widgets import Input, Static

from prime_lab.trainer.sft_config import template_path
from prime_lab.workbench.screens.editor import EditorScreen
from prime_lab.workbench.widgets.config_form import FieldRow
from prime_lab.workbench.widgets.problems_panel import ProblemsPanel
from prime_lab.workbench.widgets.toml_editor import TomlEditor
from tests.workbench.lab_fixtures import SIZE, lab_folder, make_app, until


def sft_config(tmp_path: Path) -> Path:
    path = lab_folder(tmp_path) / "configs" / "sft" / "reverse-text.toml"
    path.parent.mkdir()
    path.write_text(template_path().read_text())
    return path


def test_an_sft_config_edits_validates_and_launches_as_sft(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = sft_config(tmp_path)

    async def scenario() -> None:
        app = make_app(path)
        launched: list[list[str]] = []
        monkeypatch.setattr(app, "start_launch", launched.append)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: isinstance(app.screen, EditorScreen) and bool(app.screen.query(FieldRow)))
            screen = app.screen
            assert isinstance(screen, EditorScreen)
            assert "sft config · saved · valid" in str(screen.query_one("#editor-status", Static).render())
            rows = {r.key: r for r in screen.query(FieldRow)}
            assert {"max_steps", "model.name", "data.seq_len", "data.loss_mask.assistant", "val.data.name"} <= set(rows)
            model = rows["model.name"].query_one(Input)
            assert model.value == "smollm2-135m"  # the template's `model = "..."`
            model.focus()
            await pilot.press("ctrl+u", *"tiny-qwen3")
            toml = screen.query_one(TomlEditor)
            await until(pilot, lambda: 'model = "tiny-qwen3"' in toml.text)
            lines = toml.text.splitlines()  # edited on its line: no [model] table added
            assert len(lines) == len(path.read_text().splitlines()) and not any(li.startswith("[model") for li in lines)

            # The SFT schema's problems (not RL's): [data] seq_len below its minimum.
            rows["data.seq_len"].query_one(Input).focus()
            await pilot.press("ctrl+u", *"0")
            problems = screen.query_one(ProblemsPanel)
            await until(pilot, lambda: [p.key for p in problems.problems if p.severity == "error"] == ["data.seq_len"])
            await pilot.press("ctrl+u", *"256")
            await until(pilot, lambda: not [p for p in problems.problems if p.severity == "error"])
            await pilot.press("ctrl+s", "ctrl+r")
            await until(pilot, lambda: bool(launched))
            assert launched == [["sft", "run", f"@{path}", "--yes"]]

    asyncio.run(scenario())
