"""evals.policies: which folder `--adapter RUN[:STEP]` names, on which base model, and what it refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prime_lab.evals.policies import PolicyNotFoundError, lora_rank, parse_policy_spec, resolve_policy
from prime_lab.inference.control import adapter_targets_parameters
from prime_lab.inference.vllm import VLLMSettings, vllm_argv
from prime_lab.runs.registry import Run, RunRegistry


def model_folder(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_text("")
    return path


def adapter(path: Path, rank: int = 8) -> Path:
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(json.dumps({"r": rank}))
    return path


def trained_run(base: Path, kind: str = "rl", model: str = "tiny") -> Run:
    run = RunRegistry().create(kind, config_text="", resolved={}, model=model)
    run.update_status(model_path=str(base), state="completed")
    return run


@pytest.fixture
def base(tmp_path: Path) -> Path:
    return model_folder(tmp_path / "tiny")


def test_spec_is_a_run_with_an_optional_step() -> None:
    assert parse_policy_spec("rl-abc") == ("rl-abc", None)
    assert parse_policy_spec("rl-abc:20") == ("rl-abc", 20)
    assert parse_policy_spec("rl-abc:step_3") == ("rl-abc", 3)
    with pytest.raises(PolicyNotFoundError, match="STEP must be a step number"):
        parse_policy_spec("rl-abc:last")


def test_the_newest_step_or_the_one_asked_for(base: Path) -> None:
    run = trained_run(base)
    for step in (1, 2):
        adapter(run.adapters_dir / f"step_{step}")
    adapter(run.checkpoints_dir / "step_3")
    (run.adapters_dir / "step_4.tmp").mkdir()  # a version being written: not a step
    newest = resolve_policy(run.id)
    assert (newest.step, newest.kind, newest.source) == (3, "adapter", "checkpoints/step_3")
    assert newest.base_model == "tiny" and newest.base_model_path == base and newest.name == f"{run.id}-step-3"
    assert resolve_policy(f"{run.id}:2").path == (run.adapters_dir / "step_2").resolve()
    adapter(run.checkpoints_dir / "step_2")
    assert resolve_policy(f"{run.id}:2").source == "adapters/step_2"  # the published version before its checkpoint
    with pytest.raises(PolicyNotFoundError, match="has no policy of step 7; steps it kept: 1, 2, 3"):
        resolve_policy(f"{run.id}:7")
    recorded = resolve_policy(f"{run.id}:1").metadata()
    assert recorded["run_id"] == run.id and recorded["step"] == 1 and recorded["base_model_path"] == str(base)
    assert recorded["served_name"] == f"{run.id}-step-1" and recorded["source"] == "adapters/step_1"


def test_full_fine_tuning_weights(base: Path) -> None:
    run = trained_run(base)
    model_folder(run.dir / "weights" / "step_2")
    policy = resolve_policy(run.id)
    assert (policy.kind, policy.source) == ("weights", "weights/step_2")


def test_an_sft_run_gives_its_model_folder_or_a_step(base: Path) -> None:
    run = trained_run(base, kind="sft")
    adapter(run.adapters_dir / "step_5")
    model_folder(run.model_dir)
    final = resolve_policy(run.id)
    assert (final.kind, final.step, final.name, final.source) == ("model", None, f"{run.id}-model", "model")
    assert resolve_policy(f"{run.id}:5").kind == "adapter"


def test_the_base_model_given_must_be_the_runs(base: Path, tmp_path: Path) -> None:
    run = trained_run(base)
    adapter(run.adapters_dir / "step_1")
    assert resolve_policy(run.id, "tiny").step == 1  # as the run's user wrote it
    assert resolve_policy(run.id, str(base)).step == 1  # the same folder
    other = model_folder(tmp_path / "other")
    with pytest.raises(PolicyNotFoundError, match=f"-m {other} is not the model {run.id} was trained from \\(tiny, "):
        resolve_policy(run.id, str(other))


def test_runs_without_a_policy_are_refused_with_what_to_do(base: Path) -> None:
    empty = trained_run(base)
    with pytest.raises(PolicyNotFoundError, match="has no trained policy yet"):
        resolve_policy(empty.id)
    gepa = RunRegistry().create("gepa", config_text="", resolved={})
    with pytest.raises(PolicyNotFoundError, match="is a gepa run.*--system-prompt-file"):
        resolve_policy(gepa.id)
    with pytest.raises(PolicyNotFoundError, match="no run 'rl-nope'"):
        resolve_policy("rl-nope")


def adapter_folder(path: Path, config: object) -> Path:
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(json.dumps(config))
    return path


def test_vllm_serves_a_policy_adapter_at_a_rank_it_accepts(tmp_path: Path) -> None:
    """The rank start_policy_sampler asks vLLM for: the adapter's largest, rounded up to one vLLM accepts."""

    def served_rank(adapter: Path) -> int:
        argv = vllm_argv(VLLMSettings(model=tmp_path, max_lora_rank=lora_rank(adapter)), 8123, on_gpu=True)
        return int(argv[argv.index("--max-lora-rank") + 1])

    assert served_rank(adapter_folder(tmp_path / "r4", {"r": 4})) == 8  # vLLM refuses 4
    assert served_rank(adapter_folder(tmp_path / "r24", {"r": 24})) == 32
    assert served_rank(adapter_folder(tmp_path / "pattern", {"r": 8, "rank_pattern": {"q_proj": 48}})) == 64
    assert served_rank(adapter_folder(tmp_path / "unreadable", ["r", 8])) == 16  # not a config: our default


def test_an_adapter_on_moe_experts_is_told_apart(tmp_path: Path) -> None:
    """start_policy_sampler starts vLLM with expert LoRA for exactly these (peft `target_parameters`)."""
    assert adapter_targets_parameters(adapter_folder(tmp_path / "experts", {
        "r": 8, "target_modules": ["q_proj"], "target_parameters": ["mlp.experts.gate_up_proj"]}))
    assert not adapter_targets_parameters(adapter_folder(tmp_path / "dense", {
        "r": 8, "target_modules": ["q_proj"], "target_parameters": None}))
    assert not adapter_targets_parameters(tmp_path / "missing")
