"""What validation and `prime rl run` refuse in a distillation config before any process starts: on-policy
distillation at a sampling distribution other than the model's raw one, and a teacher whose tokenizer is not the
model's, also when the teacher is a preset not built on this machine yet."""

from __future__ import annotations

from pathlib import Path

import pytest

from prime_lab.models import PRESETS, ModelPreset, TinyModelShape, build_tiny_model
from prime_lab.trainer.config import validate_rl_config, validate_rl_file
from tests.support.cli import prime


def opd_config(model: str, teacher: str, *, loss: str = "opd", sampling: str = "") -> str:
    return f"""loss = "{loss}"
model = "{model}"
max_steps = 2
batch_size = 8
rollouts_per_example = 4

[sampling]
max_tokens = 8
{sampling}
[[env]]
id = "reverse-text"

[teacher]
model = "{teacher}"
"""


@pytest.fixture
def private_models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A models folder of this test's own: no preset is built in it yet."""
    folder = tmp_path / "models"
    monkeypatch.setenv("PRIME_LAB_MODELS", str(folder))
    return folder


def registered_runs(lab_home: Path) -> list[Path]:
    return sorted((lab_home / "runs").glob("*/status.json"))


# -- on-policy distillation samples the model at its raw distribution -------------------------------------------

@pytest.mark.parametrize(("sampling", "key", "line"), [("temperature = 0.7", "sampling.temperature", 9),
                                                       ("top_p = 0.9", "sampling.top_p", 9)])
def test_opd_refuses_a_sampling_distribution_the_teacher_does_not_score(sampling: str, key: str, line: int) -> None:
    result = validate_rl_config(opd_config("tiny-qwen3", "tiny-qwen3", sampling=sampling), "opd.toml")
    problems = [p for p in result.errors if p.key == key]
    assert not result.ok and len(problems) == 1, [p.format() for p in result.problems]
    problem = problems[0]
    assert (problem.file, problem.line) == ("opd.toml", line)
    assert "temperature 1" in problem.message and 'loss = "sft"' in problem.message, problem.message


def test_opd_at_temperature_1_and_sft_at_any_temperature_validate() -> None:
    raw = validate_rl_config(opd_config("tiny-qwen3", "tiny-qwen3", sampling="temperature = 1.0\ntop_p = 1.0"))
    assert raw.ok, [p.format() for p in raw.problems]
    sft = validate_rl_config(opd_config("tiny-qwen3", "tiny-qwen3", loss="sft", sampling="temperature = 0.7\n"
                                        "top_p = 0.9"))
    assert sft.ok, [p.format() for p in sft.problems]


# -- a teacher's tokenizer, compared before any process starts --------------------------------------------------

@pytest.mark.slow
def test_a_preset_teacher_not_built_yet_with_another_tokenizer_is_refused(
        tmp_path: Path, smollm2_dir: Path, private_models: Path, lab_home: Path) -> None:
    """SmolLM2 beside `tiny-qwen3`, which is not on this machine: its tokenizer is built alone (no weights), and
    both `prime rl validate` and `prime rl run` refuse the config with one message; no run is registered."""
    config = tmp_path / "opd.toml"
    config.write_text(opd_config(str(smollm2_dir), "tiny-qwen3"))
    validated = prime("rl", "validate", f"@{config}", timeout=120)
    assert validated.returncode == 1, validated.stdout + validated.stderr
    refusals = [line for line in validated.stdout.splitlines() if "different tokenizers" in line]
    assert len(refusals) == 1 and ": teacher.model: " in refusals[0], validated.stdout
    assert "tiny-qwen3" in refusals[0] and str(smollm2_dir) in refusals[0]
    assert not (private_models / "tiny-qwen3").exists(), "validation built the teacher"
    ran = prime("rl", "run", f"@{config}", timeout=120)
    assert ran.returncode == 1 and "different tokenizers" in ran.stderr, ran.stderr
    assert registered_runs(lab_home) == []


@pytest.mark.slow
def test_a_preset_teacher_not_built_yet_with_the_same_tokenizer_is_accepted(
        tmp_path: Path, tiny_model_dir: Path, private_models: Path) -> None:
    config = tmp_path / "opd.toml"
    config.write_text(opd_config(str(tiny_model_dir), "tiny-qwen3"))
    validated = prime("rl", "validate", f"@{config}", timeout=120)
    assert validated.returncode == 0 and "ok" in validated.stderr, validated.stdout + validated.stderr
    assert "tokenizer" not in validated.stdout + validated.stderr
    assert not (private_models / "tiny-qwen3").exists(), "validation built the teacher"


def test_a_teacher_whose_tokenizer_needs_the_model_is_checked_at_run_once_built(
        tmp_path: Path, tiny_model_dir: Path, private_models: Path, lab_home: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A preset with no tokenizer of its own (as SmolLM2's, inside its GGUF): `prime rl validate` says it checks
    it at run; `prime rl run` builds the model, compares the tokenizers and refuses before registering a run."""
    from typer.testing import CliRunner

    from prime_lab.workbench.cli.app import app
    from prime_lab.workbench.cli.common import UserError

    def build(dest: Path) -> None:
        build_tiny_model(dest, shape=TinyModelShape(tokenizer_vocab_size=600))

    monkeypatch.setitem(PRESETS, "tiny-other", ModelPreset(name="tiny-other", parameters=0, source="test",
                                                           description="another tokenizer", build=build))

    def started(*args: object, **kwargs: object) -> None:
        raise AssertionError("a run was started")

    monkeypatch.setattr("prime_lab.trainer.launcher.start_supervisor", started)
    config = tmp_path / "opd.toml"
    config.write_text(opd_config(str(tiny_model_dir), "tiny-other"))
    validated = validate_rl_file(config)
    assert validated.ok, [p.format() for p in validated.errors]
    notes = [p for p in validated.notes if p.key == "teacher.model"]
    assert len(notes) == 1 and "prime rl run" in notes[0].message, [p.format() for p in validated.problems]
    assert not (private_models / "tiny-other").exists()

    result = CliRunner().invoke(app, ["rl", "run", f"@{config}"])
    assert isinstance(result.exception, UserError), result.output
    assert "Invalid config" in str(result.exception)
    assert "teacher.model" in result.output and "different tokenizers" in result.output, result.output
    assert (private_models / "tiny-other").is_dir()  # built before the comparison, as the run would have
    assert registered_runs(lab_home) == []
