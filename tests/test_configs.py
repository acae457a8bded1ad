"""Every runnable config under configs/rl/ validates, and its environments load with the arguments it gives."""

from __future__ import annotations

from pathlib import Path

import pytest

from prime_lab.lab.envs import load_environment
from prime_lab.trainer.config import validate_rl_file

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs" / "rl").glob("*.toml"))


def test_the_documented_configs_exist() -> None:
    names = {p.stem for p in CONFIGS}
    assert names >= {"reverse-text", "alphabet-sort", "multi-env", "with-eval", "difficulty-buffer"}


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_config_validates(path: Path) -> None:
    result = validate_rl_file(path)
    assert not result.problems, [p.format() for p in result.problems]
    config = result.config
    assert config is not None and config.model == "smollm2-135m"
    assert config.batch_size <= 32 and config.sampling.max_tokens <= 128, "too big for a 2-core CPU"


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_config_environments_load_with_their_args(path: Path) -> None:
    config = validate_rl_file(path).config
    assert config is not None
    envs = [(e.id, e.args) for e in config.env] + [(e.id, e.args) for e in (config.eval.env if config.eval else [])]
    for env_id, args in envs:
        assert load_environment(env_id, **args) is not None
