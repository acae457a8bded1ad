"""Every config example printed in the five reference documents validates here, unchanged.

Each file in reference_examples/ holds one example between `#>>> verbatim` and `#<<< verbatim`; a fragment (a lone
`[buffer]` block, say) has a minimal base config added around it, which its header comment says. Hosted-only
settings validate and leave a note that says what they mean locally.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from prime_lab.trainer.config import validate_rl_config, validate_rl_file
from tests.trainer.expect import read_expectations
from tests.trainer.test_template import uncomment_settings

HERE = Path(__file__).with_name("reference_examples")
EXAMPLES = sorted(HERE.glob("*.toml"))
REFERENCE = Path(__file__).resolve().parents[3] / "shared" / "reference"


def verbatim(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    block = text.split("#>>> verbatim\n", 1)[1].split("#<<< verbatim", 1)[0]
    return [line.strip() for line in block.splitlines() if line.strip()]


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_reference_example_validates(path: Path) -> None:
    read_expectations(path).check(validate_rl_file(path))


def test_every_document_has_examples() -> None:
    docs = {p.name[:3] for p in EXAMPLES}
    assert docs == {"000", "001", "002", "003", "004"}
    assert len(EXAMPLES) >= 35


@pytest.mark.skipif(not REFERENCE.is_dir(), reason="the reference documents are not next to this checkout")
@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_is_copied_verbatim(path: Path) -> None:
    """The verbatim block appears line for line in its document (which may have glued a line to prose)."""
    doc = next(REFERENCE.glob(path.name[:3] + "_*.txt")).read_text(encoding="utf-8")
    doc_lines = [line.strip() for line in doc.splitlines() if line.strip()]
    lines = verbatim(path)
    assert any(all(lines[k] in doc_lines[j + k] for k in range(len(lines)))
               for j in range(len(doc_lines) - len(lines) + 1)), f"{path.name} differs from its document"


@pytest.mark.parametrize("doc", ["000", "001"])
def test_full_reference_with_every_line_uncommented(doc: str) -> None:
    """Every `# key = value` line of the annotated reference switched on (reasoning_effort, which the reference
    calls mutually exclusive with enable_thinking, stays off) validates, with the second [[env]] and env_ratios.

    001 prints `# checkpoint_id = "..."` after `# [buffer]`, so switched on where it stands it lands in [buffer]:
    the one problem that gives says to move it to the top; moved there, the config validates.
    """
    text = uncomment_settings((HERE / f"{doc}_full_reference.toml").read_text(encoding="utf-8"),
                              keep_commented=("reasoning_effort",))
    if doc == "001":
        result = validate_rl_config(text)
        assert [(p.key, p.line, p.suggestion) for p in result.errors] == [
            ("buffer.checkpoint_id", _line_of(text, "checkpoint_id ="), "checkpoint_id")]
        assert "top-level setting" in result.errors[0].message
        moved = next(line for line in text.splitlines() if line.startswith("checkpoint_id ="))
        text = text.replace(moved + "\n", "")
        text = text.replace("rollouts_per_example = 8 ", moved + "\nrollouts_per_example = 8 ")
    result = validate_rl_config(text)
    assert not result.errors, [p.format() for p in result.errors]
    config = result.config
    assert config is not None
    assert [e.id for e in config.env] == ["primeintellect/alphabet-sort", "primeintellect/another-env"]
    assert config.env_weights == [0.5, 0.5]
    assert config.env[0].args == {"min_turns": 3, "max_turns": 5}
    assert config.env[1].args == {"split": "train", "max_examples": 1000}
    assert config.eval is not None and config.eval.env[0].num_examples == 30
    assert config.val is not None and config.val.interval == 5
    assert config.wandb is not None and config.wandb.entity == "my-team"
    assert config.lora.alpha == 16 and config.max_async_level == 2
    if doc == "001":
        assert config.checkpoint_id == "..." and config.sampling.enable_thinking is False
        assert config.checkpoints.keep_cloud == 5 and config.infrastructure.compute_size == "M"
        assert {p.key for p in result.notes} >= {"checkpoint_id", "checkpoints.keep_cloud",
                                                 "infrastructure.compute_size"}


def test_full_reference_thinking_and_reasoning_effort_together() -> None:
    """The two lines the reference documents as mutually exclusive give exactly that one problem."""
    text = uncomment_settings((HERE / "001_full_reference.toml").read_text(encoding="utf-8"),
                              keep_commented=("checkpoint_id",))
    result = validate_rl_config(text)
    assert [(p.key, p.line) for p in result.errors] == [
        ("sampling.reasoning_effort", _line_of(text, "reasoning_effort ="))]
    assert "cannot both be set" in result.errors[0].message


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if re.match(r"\s*" + re.escape(needle), line))
