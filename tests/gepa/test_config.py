"""gepa/config.py: the GEPA config is as strict as the RL one (TOML's types are reported, not coerced)."""

from __future__ import annotations

from prime_lab.gepa.config import validate_gepa_config


def test_a_quoted_number_or_boolean_is_a_problem_at_its_line() -> None:
    text = '[env]\nid = "reverse-text"\n\n[gepa]\nnum_train = "16"\nperfect_score = 1.0\nuse_merge = "true"\n'
    result = validate_gepa_config(text, file="gepa.toml")
    assert [p.format() for p in result.problems] == [
        "gepa.toml:5: gepa.num_train: must be a whole number, not a string: write 16 without quotes",
        "gepa.toml:7: gepa.use_merge: must be true or false without quotes: write true",
    ]
    assert result.config is None


def test_a_whole_number_is_still_a_float() -> None:
    text = '[env]\nid = "reverse-text"\n\n[gepa]\nperfect_score = 1\nreflection_temperature = 0\n'
    result = validate_gepa_config(text, file="gepa.toml")
    assert not result.problems and result.config is not None
    assert (result.config.gepa.perfect_score, result.config.gepa.reflection_temperature) == (1.0, 0.0)
