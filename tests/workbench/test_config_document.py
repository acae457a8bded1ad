"""The editor's document model picks the right schema per config kind (RL, GEPA, eval) and validates like the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

from prime_lab.workbench.config_document import ConfigDocument

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("path", sorted((REPO / "configs").rglob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_config_opens_without_errors(path: Path) -> None:
    document = ConfigDocument.load(path)
    assert document.kind == ("gepa" if "gepa" in path.parts else "rl")
    assert document.errors == []


def test_gepa_config_problems_come_from_the_gepa_schema(tmp_path: Path) -> None:
    source = next((REPO / "configs" / "gepa").glob("*.toml"))
    copy = tmp_path / "gepa" / source.name
    copy.parent.mkdir()
    copy.write_text(source.read_text().replace("[gepa]", "[gepa]\nminibatch_sise = 3", 1))
    document = ConfigDocument.load(copy)
    [problem] = document.errors
    assert problem.key == "gepa.minibatch_sise" and problem.suggestion == "minibatch_size"
    assert problem.line is not None and copy.read_text().splitlines()[problem.line - 1] == "minibatch_sise = 3"
