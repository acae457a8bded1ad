"""The workbench's environment picker lists what `prime env list` lists: installed environments first (read from
their source, not imported), then the built-in ones, a shadowed built-in shown but not pickable."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from textual.app import App, ComposeResult

from prime_lab.workbench.widgets.env_picker import EnvPicker, known_environments
from tests.workbench.lab_fixtures import until


class PickerApp(App[None]):
    def __init__(self) -> None:
        super().__init__()
        self.picked: list[str] = []

    def compose(self) -> ComposeResult:
        yield EnvPicker(id="picker")

    def on_env_picker_picked(self, event: EnvPicker.Picked) -> None:
        self.picked.append(event.env.id)


def test_installed_environments_are_listed_and_picked(site: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    marks = tmp_path / "imported.txt"
    monkeypatch.setenv("IMPORT_MARKS", str(marks))
    monkeypatch.syspath_prepend(str(site))
    known_environments.cache_clear()

    async def scenario() -> None:
        app = PickerApp()
        async with app.run_test() as pilot:
            picker = app.query_one(EnvPicker)
            ids = [e.id for e in picker.envs]
            assert ids[:2] == ["reverse-text", "sums-plugin"] and "primeintellect/gsm8k" in ids
            labels = {e.id: str(picker.get_option(e.id).prompt) for e in picker.envs}
            assert "(installed: sums-plugin 1.0)" in labels["sums-plugin"] and "flavour='plugin_impl'" in \
                labels["sums-plugin"]
            shadowed = picker.get_option("primeintellect/reverse-text")
            assert shadowed.disabled and "shadowed" in str(shadowed.prompt)
            picker.select_id("primeintellect/reverse-text")  # the id loads the installed one: that is highlighted
            assert picker.highlighted_env() is not None and picker.highlighted_env().id == "reverse-text"
            picker.select_id("sums-plugin")
            picker.focus()
            await pilot.press("enter")
            await until(pilot, lambda: bool(app.picked))
            assert app.picked == ["sums-plugin"]

    asyncio.run(scenario())
    assert not marks.exists()  # listing imported none of them
    known_environments.cache_clear()
