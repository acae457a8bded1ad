"""`prime sft` as a user runs it: init, validate, run's refusals, and the run verbs scoped to SFT runs."""

from __future__ import annotations

import json
from pathlib import Path

from prime_lab.runs.registry import RunRegistry
from prime_lab.trainer.sft_config import validate_sft_config
from tests.support.cli import prime


def test_init_prints_a_template_that_validates_and_writes_it_once(tmp_path: Path) -> None:
    printed = prime("sft", "init")
    assert printed.returncode == 0 and "[data]" in printed.stdout
    assert validate_sft_config(printed.stdout).ok
    target = tmp_path / "sft.toml"
    assert prime("sft", "init", str(target)).returncode == 0 and target.read_text() == printed.stdout
    again = prime("sft", "init", str(target))
    assert again.returncode == 1 and "--force" in again.stderr


def test_validate_prints_file_line_key_message_and_exits_1(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('max_steps = 3\nlearning_rate = 1e-4\n[model]\nname = "m"\n[data]\nname = "d.jsonl"\n'
                   "sq_len = 64\n[optim]\nlr = 2e-5\n")
    proc = prime("sft", "validate", f"@{bad}")
    assert proc.returncode == 1
    assert f"{bad}:7: data.sq_len: unknown key (did you mean `seq_len`?)" in proc.stdout.splitlines()
    assert f"{bad}:9: optim.lr: learning_rate and optim.lr both set the learning rate: keep one" in proc.stdout
    as_json = json.loads(prime("sft", "validate", f"@{bad}", "-o", "json").stdout)
    assert as_json[0]["ok"] is False and {p["key"] for p in as_json[0]["problems"]} == {"data.sq_len", "optim.lr"}


def test_run_refuses_a_missing_dataset_and_an_unknown_model(tmp_path: Path) -> None:
    config = tmp_path / "sft.toml"
    config.write_text('model = "smollm2-135m"\nmax_steps = 2\n[data]\nname = "nowhere.jsonl"\n')
    proc = prime("sft", "run", f"@{config}", cwd=tmp_path)
    assert proc.returncode == 1 and "'nowhere.jsonl': no such file" in proc.stderr
    (tmp_path / "data.jsonl").write_text('{"prompt": "a", "completion": "b"}\n')
    config.write_text('model = "someone/not-here"\nmax_steps = 2\n[data]\nname = "data.jsonl"\n')
    proc = prime("sft", "run", f"@{config}")
    assert proc.returncode == 1 and "'someone/not-here' is not on this machine" in proc.stderr
    assert RunRegistry().runs() == []  # nothing was created


def test_the_run_verbs_address_sft_runs(tmp_path: Path) -> None:
    empty = prime("sft", "list")
    assert empty.returncode == 0 and "prime sft run @configs/sft/reverse-text.toml" in empty.stderr
    registry = RunRegistry()
    sft = registry.create("sft", config_text="", resolved={}, name="warm-up", max_steps=3)
    rl = registry.create("rl", config_text="", resolved={}, max_steps=3)
    listed = json.loads(prime("sft", "list", "-o", "json").stdout)
    assert [r["id"] for r in listed] == [sft.id]
    assert [r["id"] for r in json.loads(prime("rl", "list", "-k", "sft", "-o", "json").stdout)] == [sft.id]
    wrong = prime("sft", "logs", rl.id)
    assert wrong.returncode == 1 and f"prime rl logs {rl.id}" in wrong.stderr
    sft.update_status(state="failed")
    refused = prime("sft", "restart", sft.id)
    assert refused.returncode == 1 and "no checkpoint yet" in refused.stderr and "prime sft run" in refused.stderr


def test_progress_and_checkpoints_speak_of_sft() -> None:
    run = RunRegistry().create("sft", config_text="", resolved={}, max_steps=4)
    run.update_status(state="completed", step=2)
    with run.writer("trainer") as trainer:
        for step, loss in ((1, 2.5), (2, 2.25)):
            trainer.metrics({"loss/mean": loss, "perf/throughput": 1000.0}, step)
        trainer.metrics({"val/loss": 2.75}, 2)
    shown = prime("sft", "progress", run.id)
    assert shown.returncode == 0 and "loss 2.25  val loss 2.75  tokens/s 1000" in shown.stdout, shown.stdout
    (run.checkpoints_dir / "step_2").mkdir()
    (run.checkpoints_dir / "step_2" / "trainer_state.pt").write_bytes(b"x")
    listed = prime("sft", "checkpoints", run.id)
    assert f"`prime sft restart {run.id}` resumes after step 2" in listed.stderr
