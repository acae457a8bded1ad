"""Every runnable config under configs/rl/ and configs/sft/ validates, its environments load with the arguments it
gives, and it is small enough for a 2-core CPU; the SFT configs' data files are there, every row of them is a chat,
and they are what scripts/reverse_text_sft_data.py writes."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from prime_lab.envs import load_environment
from prime_lab.trainer.config import validate_rl_file
from prime_lab.trainer.sft_config import DataSourceConfig, SFTConfig, validate_sft_file
from prime_lab.trainer.sft_data import read_source, row_chat
from prime_lab.workbench.cli.sft import local_dataset

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs" / "rl").glob("*.toml"))
SFT_CONFIGS = sorted((ROOT / "configs" / "sft").glob("*.toml"))
BASE_MODEL = "smollm2-135m"


def sft_run_names() -> dict[str, Path]:
    """The `--name` each SFT config's header starts it with (`prime sft run @configs/sft/X.toml --name NAME`)."""
    names = {}
    for path in SFT_CONFIGS:
        found = re.search(rf"prime sft run @configs/sft/{re.escape(path.name)} --name (\S+)", path.read_text())
        if found:
            names[found.group(1)] = path
    return names


def test_the_documented_configs_exist() -> None:
    names = {p.stem for p in CONFIGS}
    assert names >= {"reverse-text", "alphabet-sort", "multi-env", "with-eval", "difficulty-buffer",
                     "reverse-text-after-sft"}
    assert {p.stem for p in SFT_CONFIGS} >= {"reverse-text"}


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_config_validates(path: Path) -> None:
    result = validate_rl_file(path)
    assert not result.problems, [p.format() for p in result.problems]
    config = result.config
    assert config is not None
    # the base model, or the SFT run one of configs/sft/ makes with the command in its header (its base model)
    sft = sft_run_names().get(config.model)
    assert config.model == BASE_MODEL or sft is not None, f"{config.model!r} is neither {BASE_MODEL} nor the " \
        f"--name of an SFT config's command ({sorted(sft_run_names())})"
    if sft is not None:
        assert sft_config(sft).model.name == BASE_MODEL
        assert f"prime rl run @configs/rl/{path.name}" in sft.read_text(), "the SFT config says what comes next"
    assert config.batch_size <= 32 and config.sampling.max_tokens <= 128, "too big for a 2-core CPU"


def test_the_after_sft_config_is_the_default_one_on_the_sft_model() -> None:
    default, after = (validate_rl_file(ROOT / "configs" / "rl" / f"{n}.toml").config
                      for n in ("reverse-text", "reverse-text-after-sft"))
    assert default is not None and after is not None
    assert after.model == "reverse-text-sft" and after.model_copy(update={"model": default.model}) == default


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_config_environments_load_with_their_args(path: Path) -> None:
    config = validate_rl_file(path).config
    assert config is not None
    envs = [(e.id, e.args) for e in config.env] + [(e.id, e.args) for e in (config.eval.env if config.eval else [])]
    for env_id, args in envs:
        assert load_environment(env_id, **args) is not None


def sft_config(path: Path) -> SFTConfig:
    result = validate_sft_file(path)
    assert not result.problems, [p.format() for p in result.problems]
    assert result.config is not None
    return result.config


def sft_data_files(path: Path) -> list[Path]:
    """The training and validation files, found as `prime sft run` finds them (beside the config)."""
    config = sft_config(path)
    names = [s.dataset for s in config.data.datasets]
    if config.val is not None:
        names += [s.dataset for s in config.val.data.source] + ([config.val.data.name] if config.val.data.name else [])
    return [Path(local_dataset(name, path)) for name in names]


@pytest.mark.parametrize("path", SFT_CONFIGS, ids=[p.stem for p in SFT_CONFIGS])
def test_sft_config_validates_and_fits_a_small_cpu(path: Path) -> None:
    config = sft_config(path)
    assert config.model.name == BASE_MODEL
    assert config.data.batch_size * config.data.seq_len <= 4096 and config.max_steps <= 100, \
        "too big for a 2-core CPU"
    assert config.lora.enabled, "full fine-tuning of every weight is not a few minutes on 2 cores"


@pytest.mark.parametrize("path", SFT_CONFIGS, ids=[p.stem for p in SFT_CONFIGS])
def test_sft_data_files_are_there_and_every_row_is_a_chat(path: Path) -> None:
    files = sft_data_files(path)
    assert len(files) >= 2, "a training file and a held-out validation file"
    for file in files:
        assert file.is_file() and file.is_relative_to(ROOT / "configs"), file
        rows = read_source(DataSourceConfig(dataset=str(file)))
        assert rows, file
        for row in rows:
            messages, _ = row_chat(row)
            assert messages[-1]["role"] == "assistant" and messages[-1]["content"], (file, row)


def generator() -> ModuleType:
    path = ROOT / "scripts" / "reverse_text_sft_data.py"
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_reverse_text_data_are_what_the_generator_writes(tmp_path: Path) -> None:
    committed = sft_data_files(ROOT / "configs" / "sft" / "reverse-text.toml")
    written = generator().write_reverse_text_data(tmp_path)
    assert [p.name for p in written] == [p.name for p in committed]
    for new, old in zip(written, committed, strict=True):
        assert new.read_text() == old.read_text(), f"{old} drifted: run scripts/reverse_text_sft_data.py"


def test_reverse_text_val_phrases_are_held_out() -> None:
    train, val = generator().reverse_text_sft_data()

    def phrases(rows: list[dict]) -> set[str]:
        return {next(m["content"] for m in r["messages"] if m["role"] == "user") for r in rows}

    evaluated = {r["prompt"][-1]["content"] for r in load_environment("primeintellect/reverse-text").get_eval_dataset()}
    assert len(train) == 400 and len(val) == 50 and len(phrases(val)) == 50
    assert not phrases(val) & phrases(train) and not (phrases(train) | phrases(val)) & evaluated
