"""`prime rl run` on Mixture-of-Experts models end to end: the tiny Qwen3-MoE, OLMoE and Mixtral presets, the built-in
sampler, LoRA on the attention and on the experts (`[lora].target_parameters`), and full fine-tuning. Two steps each,
on-policy (max_async_level 0): step 2 is sampled with what the trainer published after step 1, so a sampler that
could not load it would fail the run or show as a mismatch KL."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from prime_lab.runs.registry import Run, RunRegistry
from tests.support.rl_runs import fixture_envs, logs, metrics, prime, write_config

pytestmark = pytest.mark.slow
__all__ = ["fixture_envs"]  # autouse: the run's processes find the tiny-chars environment

EXPERTS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]


def moe_config(path: Path, model: str, *, lora: bool) -> Path:
    write_config(path, Path(model), steps=2, async_level=0, lr=1e-2 if lora else 1e-3)
    text = path.read_text().replace("batch_size = 16", "batch_size = 8").replace("max_tokens = 8", "max_tokens = 6")
    targets = re.search(r"^target_modules = .*$", text, re.MULTILINE)
    assert targets is not None
    lora_lines = (f"target_modules = {json.dumps(ATTENTION)}\ntarget_parameters = {json.dumps(EXPERTS)}" if lora
                  else "enabled = false")
    path.write_text(text.replace(targets.group(0), lora_lines))
    return path


def run_in_foreground(config: Path) -> Run:
    proc = prime("rl", "run", f"@{config}", "--foreground")
    run = RunRegistry().get(proc.stdout.split()[0])
    assert proc.returncode == 0, proc.stderr + logs(run)
    status = run.status()
    assert status["state"] == "completed" and status["step"] == 2, status.get("reason", "") + logs(run)
    orchestrator, trainer = metrics(run, "orchestrator"), metrics(run, "trainer")
    assert [orchestrator[k]["policy/version"] for k in sorted(orchestrator)] == [0, 1]
    assert max(abs(trainer[k]["policy/kl"]) for k in trainer) < 1e-3, {k: trainer[k]["policy/kl"] for k in trainer}
    return run


@pytest.mark.parametrize("preset", ["tiny-qwen3-moe", "tiny-olmoe", "tiny-mixtral"])
def test_lora_on_attention_and_experts(preset: str, tmp_path: Path) -> None:
    run = run_in_foreground(moe_config(tmp_path / "rl.toml", preset, lora=True))
    adapter = json.loads((run.adapters_dir / "step_2" / "adapter_config.json").read_text())
    assert sorted(adapter["target_parameters"]) == sorted(EXPERTS)
    assert sorted(adapter["target_modules"]) == sorted(ATTENTION)
    loaded = re.findall(r"loaded LoRA adapter 'policy' from \S+/step_(\d+)", run.log_path("inference").read_text())
    assert loaded == ["1"], logs(run)
    assert "mlp.experts.gate_up_proj" in run.log_path("trainer").read_text()  # the ready line names the targets


def test_full_finetuning(tmp_path: Path) -> None:
    run = run_in_foreground(moe_config(tmp_path / "rl.toml", "tiny-qwen3-moe", lora=False))
    assert (run.dir / "weights" / "step_2" / "config.json").is_file()
    assert re.search(r"loaded full weights from \S+/step_1 ", run.log_path("inference").read_text()), logs(run)


def test_a_target_that_matches_nothing_is_refused_before_a_run_exists(tmp_path: Path) -> None:
    from prime_lab.models import resolve_model

    resolve_model("tiny-mixtral")  # on this machine: `prime rl run` checks the targets against it
    config = moe_config(tmp_path / "rl.toml", "tiny-mixtral", lora=True)
    config.write_text(config.read_text().replace('"mlp.experts.down_proj"', '"mlp.experts.w2"'))
    proc = prime("rl", "run", f"@{config}")
    assert proc.returncode == 1
    assert f"{config}:" in proc.stderr and "lora.target_parameters: mlp.experts.w2 matches no parameter" in proc.stderr
    assert "mlp.experts.gate_up_proj, mlp.experts.down_proj" in proc.stderr
    assert RunRegistry().runs() == []
