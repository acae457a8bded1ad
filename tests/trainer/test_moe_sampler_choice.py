"""Which sampler may serve a Mixture-of-Experts run: vLLM's CPU build dies on the first request once LoRA is on for
an MoE model (its MoE LoRA kernel is Triton-only), so a run asking for it fails at start with the setting to change;
the built-in server and dense models are unaffected."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from prime_lab.models import build_tiny_model
from prime_lab.models.store import experts_of
from prime_lab.models.tiny import tiny_moe_shape
from prime_lab.runs.registry import RunRegistry
from prime_lab.trainer import launcher
from prime_lab.trainer.config import validate_rl_config


def _supervisor(model: Path, backend: str, lora: bool = True) -> launcher.Supervisor:
    text = (f'model = "{model}"\nmax_steps = 1\nbatch_size = 4\nrollouts_per_example = 2\n[sampling]\n'
            f'max_tokens = 4\n[[env]]\nid = "reverse-text"\n[inference]\nbackend = "{backend}"\n'
            f"[lora]\nenabled = {'true' if lora else 'false'}\n")
    result = validate_rl_config(text)
    assert result.config is not None, result.problems
    run = RunRegistry().create("rl", config_text=text, resolved=result.config.model_dump(mode="json"))
    run.update_status(model_path=str(model))
    return launcher.Supervisor(run)


@pytest.fixture
def restore_signals() -> Iterator[None]:
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


def test_vllm_on_a_cpu_is_refused_for_lora_on_experts(tmp_path: Path, tiny_model_dir: Path,
                                                      monkeypatch: pytest.MonkeyPatch, restore_signals: object) -> None:
    moe = build_tiny_model(tmp_path / "tiny-mixtral", shape=tiny_moe_shape("mixtral"))
    assert experts_of(moe) == 4 and experts_of(tiny_model_dir) == 0 and experts_of(tmp_path) == 0
    monkeypatch.setattr(launcher, "cuda_available", lambda: False)
    monkeypatch.setattr("prime_lab.inference.backend.vllm_installed", lambda: True)
    with pytest.raises(launcher.LaunchFailed, match=r'Mixture-of-Experts.*backend = "builtin"'):
        _supervisor(moe, "vllm").choose_backend()
    assert _supervisor(moe, "builtin").choose_backend().backend == "builtin"
    assert _supervisor(moe, "vllm", lora=False).choose_backend().backend == "vllm"  # full weights: no LoRA kernel
    assert _supervisor(tiny_model_dir, "vllm").choose_backend().backend == "vllm"
    monkeypatch.setattr(launcher, "cuda_available", lambda: True)  # on a GPU the Triton kernel runs
    assert _supervisor(moe, "vllm").choose_backend().backend == "vllm"
