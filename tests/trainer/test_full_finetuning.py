"""Full fine-tuning (`[lora] enabled = false`) in the trainer process's own class, on the tiny model: every weight
trains, each step publishes the whole model as `weights/step_N/`, a checkpoint holds the weights and the optimizer
state, and a resume continues exactly as if the run had never stopped. Batches are written the way the orchestrator
writes them, with the sampler's logprobs from the base model (what a sampler serving version 0 reports)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from prime_lab.trainer.batch import Sample
from prime_lab.trainer.config import validate_rl_config
from prime_lab.trainer.runtime import step_dirs
from tests.support.trainer_runs import STEPS, base_batches, config_text, new_run, train, trainer_metrics, weights


@pytest.fixture(scope="module")
def batches(tiny_model_dir: Path) -> list[list[Sample]]:
    return base_batches(tiny_model_dir, STEPS)


def test_every_weight_trains_and_each_step_publishes_the_whole_model(tiny_model_dir: Path,
                                                                     batches: list[list[Sample]]) -> None:
    from transformers import AutoModelForCausalLM

    run = new_run(tiny_model_dir, config_text(tiny_model_dir), batches)
    trainer = train(run, tiny_model_dir)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert sum(p.numel() for p in trainer.params) == sum(p.numel() for p in base.parameters())
    assert not run.adapters_dir.exists() or not any(run.adapters_dir.iterdir())
    published = step_dirs(run.dir / "weights")
    assert sorted(published) == [1, 2, 3]  # [adapters] keep_last = 3 (and at least 3) stay
    final = weights(published[3])
    start = {n: p.detach() for n, p in base.named_parameters()}
    moved = [n for n, t in final.items() if not t.equal(start[n])]
    assert len(moved) == len(final) and "model.embed_tokens.weight" in final  # tied head: saved once, trained
    # the published folder is a model folder transformers loads as the trainer's policy
    loaded = AutoModelForCausalLM.from_pretrained(published[3])
    for name, parameter in trainer.model.named_parameters():
        assert parameter.detach().equal(dict(loaded.named_parameters())[name].detach()), name
    # step 1: the sampler served the base model, the policy is the base model: no mismatch
    metrics = trainer_metrics(run)
    assert abs(metrics[1]["policy/kl"]) < 1e-6 and metrics[1]["optim/grad_norm"] > 0


def test_a_resume_continues_exactly(tiny_model_dir: Path, batches: list[list[Sample]]) -> None:
    """A run stopped after its step-1 checkpoint (with the versions it had published after it still on disk) and
    resumed ends with the same weights and optimizer state as a run that never stopped: Adam's moments come back,
    not only the weights (without them, steps 2 and 3 would move the weights differently)."""
    import torch

    straight = new_run(tiny_model_dir, config_text(tiny_model_dir), batches)
    train(straight, tiny_model_dir)
    state = torch.load(straight.checkpoints_dir / "step_3" / "trainer_state.pt", weights_only=False)
    assert len(state["optimizer"]["state"]) == len(weights(straight.checkpoints_dir / "step_3"))

    stopped = new_run(tiny_model_dir, config_text(tiny_model_dir), batches)
    for sub in ("checkpoints", "weights"):
        shutil.copytree(straight.dir / sub, stopped.dir / sub, dirs_exist_ok=True)
    for step in (2, 3):
        shutil.rmtree(stopped.checkpoints_dir / f"step_{step}")
    assert sorted(step_dirs(stopped.dir / "weights")) == [1, 2, 3]

    from prime_lab.trainer.runtime import load_config
    from prime_lab.trainer.train import Trainer

    resumed = Trainer(stopped, load_config(stopped), tiny_model_dir, resume=True)
    assert sorted(step_dirs(stopped.dir / "weights")) == [1]  # the stopped attempt's later versions are gone
    assert resumed.start_step == 1 and resumed.train() == 0
    assert sorted(trainer_metrics(stopped)) == [2, 3]
    for name, tensor in weights(stopped.dir / "weights" / "step_3").items():
        assert tensor.equal(weights(straight.dir / "weights" / "step_3")[name]), name
    resumed_state = torch.load(stopped.checkpoints_dir / "step_3" / "trainer_state.pt", weights_only=False)
    for key, moments in state["optimizer"]["state"].items():
        for name in ("exp_avg", "exp_avg_sq"):
            assert resumed_state["optimizer"]["state"][key][name].equal(moments[name])


def test_the_kl_penalty_is_to_a_frozen_copy_of_the_base_model(tiny_model_dir: Path,
                                                              batches: list[list[Sample]]) -> None:
    run = new_run(tiny_model_dir, config_text(tiny_model_dir, extra="[kl_penalty]\nenabled = true\nbeta = 0.1\n"),
                  batches)
    trainer = train(run, tiny_model_dir)
    assert trainer.reference is not None and not any(p.requires_grad for p in trainer.reference.parameters())
    metrics = trainer_metrics(run)
    assert abs(metrics[1]["policy/ref_kl"]) < 1e-6  # step 1: the policy is the base model
    assert metrics[3]["policy/ref_kl"] > 1e-6  # after two updates it has moved away from it


def test_full_finetuning_validates_and_a_lora_rate_gets_a_note(tiny_model_dir: Path) -> None:
    text = config_text(tiny_model_dir).replace("learning_rate = 1e-3\n", "")
    result = validate_rl_config(text, file="rl.toml")
    assert result.ok and result.config is not None and result.config.lora.enabled is False
    assert [n.key for n in result.notes] == ["lora.enabled"] and "1e-06" in result.notes[0].message
    result = validate_rl_config(text.replace("max_steps", "learning_rate = 3e-4\nmax_steps"))
    assert [n.key for n in result.notes] == ["learning_rate"]
    assert validate_rl_config(text.replace("max_steps", "learning_rate = 1e-6\nmax_steps")).notes == []
    lora_rate = text.replace("max_steps", "learning_rate = 3e-4\nmax_steps")
    assert validate_rl_config(lora_rate.replace("enabled = false", "enabled = true")).notes == []
    external = text.replace("[sampling]", '[inference]\nbackend = "external"\nbase_url = "http://127.0.0.1:8000/v1"\n'
                                          "\n[sampling]")
    notes = validate_rl_config(external.replace("max_steps", "learning_rate = 1e-6\nmax_steps")).notes
    assert [n.key for n in notes] == ["lora.enabled"] and "WeightUpdateExtension" in notes[0].message


def test_checkpoint_id_must_be_full_weights(tiny_model_dir: Path, tmp_path: Path) -> None:
    from prime_lab.models.random_lora import build_random_lora_adapter
    from prime_lab.trainer.versions import warm_start_weights

    assert warm_start_weights(str(tiny_model_dir), tmp_path) == tiny_model_dir
    adapter = build_random_lora_adapter(tiny_model_dir, tmp_path / "adapter")
    with pytest.raises(ValueError, match="holds a LoRA adapter"):
        warm_start_weights(str(adapter), tmp_path)
    with pytest.raises(ValueError, match="neither a run id"):
        warm_start_weights("no-such-run", tmp_path)


def test_full_finetuning_requests_carry_a_cache_salt_per_policy_version(
    tiny_model_dir: Path, batches: list[list[Sample]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM keeps prompt state cached under old weights while requests are in flight (tests/inference/
    test_vllm_full_weights.py shows a request without a new salt served stale); the orchestrator's requests of each
    policy version carry their own salt. LoRA requests need none: the adapter's name and path key the cache."""
    from prime_lab.trainer.orchestrator import Orchestrator
    from prime_lab.trainer.runtime import load_config

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "fixtures" / "envs"))
    full = new_run(tiny_model_dir, config_text(tiny_model_dir), batches)
    orchestrator = Orchestrator(full, load_config(full), "http://127.0.0.1:9/v1", "tiny")
    salts = {orchestrator.sampling_at(v).extra_body["cache_salt"] for v in (0, 1, 2)}
    assert len(salts) == 3 and orchestrator.sampling_at(1).max_tokens == 5
    lora = new_run(tiny_model_dir, config_text(tiny_model_dir).replace("enabled = false", "enabled = true"), batches)
    lora_orchestrator = Orchestrator(lora, load_config(lora), "http://127.0.0.1:9/v1", "tiny")
    assert "cache_salt" not in lora_orchestrator.sampling_at(1).extra_body
