"""An evaluation's system prompt: read from a file or a GEPA run, and put into the rows as GEPA puts a candidate."""

from __future__ import annotations

from pathlib import Path

import pytest

from prime_lab.envs import load_environment
from prime_lab.evals.evaluation import SystemPromptError, read_system_prompt, with_system_prompt
from prime_lab.runs.registry import RunRegistry


def test_a_file_or_a_gepa_runs_best_prompt(tmp_path: Path, lab_home: Path) -> None:
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text("Reverse the text, character by character.\n")
    read = read_system_prompt(str(prompt_file))
    assert read.text == "Reverse the text, character by character." and read.gepa_run is None
    assert read.metadata() == {"text": read.text, "source": str(prompt_file.resolve()), "gepa_run": None}
    gepa = RunRegistry().create("gepa", config_text="", resolved={})
    with pytest.raises(SystemPromptError, match=f"GEPA run {gepa.id} has no best prompt yet"):
        read_system_prompt(gepa.id)
    gepa.gepa_dir.mkdir()
    (gepa.gepa_dir / "best_prompt.txt").write_text("Think, then answer.")
    best = read_system_prompt(gepa.id)
    assert (best.text, best.gepa_run, best.path) == ("Think, then answer.", gepa.id, gepa.gepa_dir / "best_prompt.txt")


def test_what_is_neither_is_refused(tmp_path: Path, lab_home: Path) -> None:
    rl = RunRegistry().create("rl", config_text="", resolved={})
    with pytest.raises(SystemPromptError, match=f"run {rl.id} is a rl run, not a GEPA run"):
        read_system_prompt(rl.id)
    with pytest.raises(SystemPromptError, match="neither a file nor a GEPA run's id"):
        read_system_prompt("best-prompt.txt")
    with pytest.raises(SystemPromptError, match="no such file"):
        read_system_prompt(str(tmp_path / "missing" / "p.txt"))


def test_the_rows_system_message_is_replaced_and_the_rest_kept() -> None:
    rows = load_environment("reverse-text").get_eval_dataset(3)
    assert rows[0]["prompt"][0]["role"] == "system"
    ours = with_system_prompt(rows, "Write it backwards.")
    assert [r["prompt"][0] for r in ours] == [{"role": "system", "content": "Write it backwards."}] * 3
    assert [r["prompt"][1:] for r in ours] == [r["prompt"][1:] for r in rows]
    assert with_system_prompt(rows, None) is rows
    bare = [{**r, "prompt": r["prompt"][1:]} for r in rows]  # a prompt without a system message gets one
    assert [r["prompt"][0]["content"] for r in with_system_prompt(bare, "Be brief.")] == ["Be brief."] * 3
