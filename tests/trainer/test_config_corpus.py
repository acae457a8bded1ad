"""A corpus of broken configs: each yields its stated problem, on the stated line, at the stated key.

Every file in corpus/ says in its header what must be reported (`# expect: LINE KEY: TEXT`, optionally
`# suggest: NAME` for the did-you-mean); see tests/trainer/expect.py. Validation must never raise, and a config
with an error is never returned.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from prime_lab.trainer.config import validate_rl_config, validate_rl_file
from tests.trainer.expect import read_expectations

CORPUS = sorted(Path(__file__).with_name("corpus").glob("*.toml"))


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_broken_config_reports_its_problem(path: Path) -> None:
    expectations = read_expectations(path)
    assert expectations.errors and not expectations.ok
    result = validate_rl_file(path)
    expectations.check(result)
    assert result.config is None
    assert all(p.file == str(path) for p in result.problems)


def test_corpus_is_large_and_covers_every_kind() -> None:
    kinds = {p.stem.split("_")[1] for p in CORPUS}
    assert len(CORPUS) >= 70
    assert kinds >= {"typo", "type", "range", "missing", "conflict", "env", "tailscale", "toml", "lines"}


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_every_prefix_of_a_broken_config_validates_without_raising(path: Path) -> None:
    """Cut anywhere (an editor validates half-typed text), the collector still answers with problems."""
    text = path.read_text(encoding="utf-8")
    for end in range(0, len(text), max(1, len(text) // 40)):
        result = validate_rl_config(text[:end])
        assert result.config is None or not result.errors
