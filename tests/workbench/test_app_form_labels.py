"""The config form's label column fits the longest field name: `gradient_accumulation_steps` shows whole, its value
after it, instead of being cut into its value ("gradient_accumulation_st1")."""

from __future__ import annotations

import asyncio
from pathlib import Path

from textual.widgets import Label

from prime_lab.workbench.schema_fields import FieldSpec
from prime_lab.workbench.screens.editor import EditorScreen
from prime_lab.workbench.widgets.config_form import LABEL_MAX, FieldRow, label_width
from tests.workbench.conftest import screen_rows
from tests.workbench.lab_fixtures import SIZE, lab_folder, make_app, until

LONG = ("gradient_accumulation_steps", "online_difficulty_filtering")  # the longest names of the RL form


def test_long_field_names_show_whole_beside_their_value(tmp_path: Path) -> None:
    path = lab_folder(tmp_path) / "configs" / "rl" / "reverse-text.toml"

    async def scenario() -> None:
        app = make_app(path)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: isinstance(app.screen, EditorScreen)
                        and {r.key.split(".")[-1] for r in app.screen.query(FieldRow)} >= set(LONG))
            rows = {r.key.split(".")[-1]: r for r in app.screen.query(FieldRow)}
            for name in LONG:
                row = rows[name]
                row.scroll_visible(animate=False, top=True)
                await pilot.pause(0.2)
                label = row.query_one(".field-name", Label)
                control = row.query_one(".field-control")
                assert label.region.width >= len(name) + 1 and control.region.x >= label.region.right
                shown = screen_rows(app.export_screenshot())
                assert any(line.startswith(f"│{name}") for line in shown), "\n".join(shown)  # not cut short

    asyncio.run(scenario())


def test_the_label_column_has_a_limit() -> None:
    def spec(name: str, required: bool = False) -> FieldSpec:
        return FieldSpec(path=(name,), kind="str", help="", default="", required=required)

    assert label_width([spec("model", required=True), spec("learning_rate")]) == len("learning_rate") + 1
    assert label_width([spec("rollouts_per_example", required=True)]) == len("rollouts_per_example *") + 1
    assert label_width([spec("x" * 80)]) == LABEL_MAX
