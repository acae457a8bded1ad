"""The `prime eval run @eval.toml` config is as strict as the RL one (TOML's types are reported, not coerced)."""

from __future__ import annotations

from pathlib import Path

from prime_lab.evals.evaluation import validate_eval_file


def test_a_quoted_number_or_a_boolean_for_a_number_is_a_problem_at_its_line(tmp_path: Path) -> None:
    path = tmp_path / "eval.toml"
    path.write_text('model = "smollm2-135m"\nnum_examples = "16"\nrollouts_per_example = true\n\n'
                    '[env]\nid = "reverse-text"\n')
    result = validate_eval_file(path)
    assert [p.format() for p in result.problems] == [
        f"{path}:2: num_examples: must be a whole number, not a string: write 16 without quotes",
        f"{path}:3: rollouts_per_example: must be a whole number (got true)",
    ]
    assert result.config is None


def test_a_valid_config_keeps_its_values(tmp_path: Path) -> None:
    path = tmp_path / "eval.toml"
    path.write_text('num_examples = -1\n\n[sampling]\ntemperature = 1\n\n[env]\nid = "reverse-text"\n'
                    'args = { max_turns = 2 }\n')
    result = validate_eval_file(path)
    assert not result.problems and result.config is not None
    assert (result.config.num_examples, result.config.sampling, result.config.env.args) == \
        (-1, {"temperature": 1}, {"max_turns": 2})
