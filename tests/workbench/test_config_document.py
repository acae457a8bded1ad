"""The editor's document model picks the right schema per config kind (RL, SFT, GEPA, eval) and validates like the
CLI; the form's layout comes from the schema."""

from __future__ import annotations

from pathlib import Path

import pytest

from prime_lab.trainer.config import RLConfig
from prime_lab.trainer.sft_config import SFTConfig, template_path
from prime_lab.workbench.config_document import ConfigDocument, detect_kind
from prime_lab.workbench.launch import config_argv
from prime_lab.workbench.schema_fields import sections

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("path", sorted((REPO / "configs").rglob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_config_opens_without_errors(path: Path) -> None:
    document = ConfigDocument.load(path)
    assert document.kind == next((kind for kind in ("gepa", "sft", "eval") if kind in path.parts), "rl")
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


PRIME_RL_SFT = """\
max_steps = 10

[model]
name = "smollm2-135m"

[data]
name = "data/train.jsonl"
seq_len = 256

[optim]
lr = 2e-5
"""


def test_sft_configs_are_known_by_their_data_table_or_their_folder(tmp_path: Path) -> None:
    assert detect_kind(tmp_path / "mine.toml", template_path().read_text()) == "sft"  # ours: model = "...", [data]
    assert detect_kind(tmp_path / "mine.toml", PRIME_RL_SFT) == "sft"  # prime-rl's: [model] name, [data], [optim]
    sources = 'max_steps = 5\nmodel = "m"\n\n[[data.source]]\ndataset = "a.jsonl"\n'
    assert detect_kind(tmp_path / "mine.toml", sources) == "sft"
    assert detect_kind(tmp_path / "sft" / "bare.toml", 'max_steps = 5\nmodel = "m"\n') == "sft"  # by its folder
    rl = (REPO / "configs" / "rl" / "reverse-text.toml").read_text()
    assert detect_kind(tmp_path / "mine.toml", rl) == "rl"
    # An RL config stays RL wherever it is, with a [data]-like table in an env's args or loss = "sft".
    distill = rl + '\nloss = "sft"\n[teacher]\nmodel = "smollm2-135m"\n[env.args.data]\nx = 1\n'
    assert detect_kind(tmp_path / "sft" / "distill.toml", distill) == "rl"


def test_sft_config_problems_come_from_the_sft_schema(tmp_path: Path) -> None:
    path = tmp_path / "sft.toml"
    path.write_text(PRIME_RL_SFT.replace("seq_len = 256", "seq_lne = 256\nbatch_size = 0"))
    document = ConfigDocument.load(path)
    assert document.kind == "sft"
    problems = {p.key: p for p in document.errors}
    assert set(problems) == {"data.seq_lne", "data.batch_size"}
    assert problems["data.seq_lne"].suggestion == "seq_len" and problems["data.seq_lne"].line == 8
    path.write_text(template_path().read_text())
    assert ConfigDocument.load(path).errors == []


def test_an_sft_configs_model_is_one_field_in_either_spelling(tmp_path: Path) -> None:
    ours, theirs = tmp_path / "ours.toml", tmp_path / "theirs.toml"
    ours.write_text(template_path().read_text())
    theirs.write_text(PRIME_RL_SFT)
    for path, line in ((ours, 'model = "tiny-qwen3"'), (theirs, 'name = "tiny-qwen3"')):
        document = ConfigDocument.load(path)
        assert document.get(("model", "name")) == document.model_name() == "smollm2-135m"
        document.set_value(("model", "name"), "tiny-qwen3")
        assert document.errors == [] and document.model_name() == "tiny-qwen3"
        [changed] = [new for old, new in zip(path.read_text().splitlines(), document.text.splitlines(), strict=True)
                     if old != new]
        assert changed.startswith(line), path.name


def test_the_forms_show_sfts_tables_and_rls_loss_and_teacher() -> None:
    sft = {section.title: [field.key for field in section.fields] for section in sections(SFTConfig)}
    assert "model.name" in sft["[model]"] and "data.seq_len" in sft["[data]"]
    assert sft["[val.data]"] == ["val.data.name", "val.data.subsets", "val.data.splits"]
    assert "data.loss_mask.assistant" in sft["[data.loss_mask]"] and "[monitors]" not in sft  # (no fields of its own)
    rl = {section.title: section for section in sections(RLConfig)}
    [loss] = [field for field in rl["Core"].fields if field.key == "loss"]
    assert loss.kind == "choice" and loss.choices == ("rl", "sft", "opd") and loss.default == "'rl'"
    assert [f.key for f in rl["[teacher]"].fields] == ["teacher.model", "teacher.backend",
                                                        "teacher.gpu_memory_utilization"]
    assert "teacher.sampling.temperature" in [f.key for f in rl["[teacher.sampling]"].fields]
    assert "teacher.client.base_url" in [f.key for f in rl["[teacher.client]"].fields]


def test_each_config_kind_launches_with_its_own_command(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    assert config_argv("sft", path) == ["sft", "run", f"@{path}", "--yes"]
    assert config_argv("rl", path) == ["rl", "run", f"@{path}", "--yes"]
    assert config_argv("gepa", path) == ["gepa", "run", f"@{path}"]
    assert config_argv("eval", path) == ["eval", "run", f"@{path}"]
