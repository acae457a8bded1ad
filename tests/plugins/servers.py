"""Session fixtures: the built-in server.

- `builtin_server`: ONE built-in OpenAI-compatible server per test session, on the tiny model (`tiny_model_dir`),
  served as `tiny-qwen3`, float32. It yields a `inference.builtin.launcher.BuiltinServer`: `base_url` (for
  `openai.OpenAI(base_url=...)`), `root_url`, `model_path`, `model_name`, `adapters` (load/replace/unload LoRA
  adapters) and `log_path`. It starts in a few seconds. Tests that load adapters use their own adapter names.
- `builtin_smollm2_server`: the built-in server on the real SmolLM2-135M-Instruct (`smollm2_dir`), served as
  `smollm2-135m`, float32, for the tests that need a real model's distribution (a tiny random model's is near
  uniform at every temperature). One per session, started on first use.
- `trained_adapter`: a LoRA adapter as a run writes it: the trainer's policy on the tiny model after one optimizer
  step of its own loss pass, saved as `Trainer.publish_adapter` saves it (`save_pretrained`); with the trained
  policy's logprobs of a fixed sequence, to compare what loads it elsewhere against.
- `tiny_lora_adapters`: two LoRA adapters (rank 8, random non-zero A and B, different seeds) for the tiny model.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from prime_lab.inference.builtin.launcher import BuiltinServer, start_builtin_server
from prime_lab.inference.builtin.server import BuiltinServerSettings
from prime_lab.models.random_lora import build_random_lora_adapter

TINY_SERVED_NAME = "tiny-qwen3"


@pytest.fixture(scope="session")
def builtin_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BuiltinServer]:
    settings = BuiltinServerSettings(model=tiny_model_dir, served_model_name=TINY_SERVED_NAME, max_model_len=2048)
    server = start_builtin_server(settings, log_path=tmp_path_factory.mktemp("builtin") / "server.log", timeout=120)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def builtin_smollm2_server(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BuiltinServer]:
    settings = BuiltinServerSettings(model=smollm2_dir, served_model_name="smollm2-135m", max_model_len=2048)
    server = start_builtin_server(settings, log_path=tmp_path_factory.mktemp("builtin") / "smollm2.log", timeout=300)
    yield server
    server.stop()


class TrainedAdapter(NamedTuple):
    path: Path
    token_ids: list[int]  # a sequence of the tiny model's vocabulary
    logprobs: list[float]  # the trained policy's logprob of each token after the first (the trainer's own pass)


@pytest.fixture(scope="session")
def trained_adapter(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> TrainedAdapter:
    import torch

    from prime_lab.trainer.batch import Sample
    from prime_lab.trainer.model import accumulate_batch_gradients, load_policy, token_logprobs

    torch.manual_seed(0)
    policy = load_policy(tiny_model_dir, lora_r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj",
                                                                                    "o_proj"])
    rng = torch.Generator().manual_seed(1)
    vocab = policy.config.vocab_size
    samples = []
    for i in range(4):
        ids = torch.randint(0, vocab, (12,), generator=rng).tolist()
        samples.append(Sample(input_ids=ids, loss_mask=[0] * 4 + [1] * 8, sampler_logprobs=[0.0] * 4 + [-5.0] * 8,
                              advantage=1.0 if i % 2 else -1.0))
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=0.05)
    accumulate_batch_gradients(policy, samples, device="cpu", ratio_low=0.0, ratio_high=float("inf"))
    optimizer.step()
    path = tmp_path_factory.mktemp("trained") / "adapters" / "step_1"
    policy.save_pretrained(path)
    token_ids = torch.randint(0, vocab, (10,), generator=rng).tolist()
    policy.eval()
    with torch.no_grad():
        logprobs, _ = token_logprobs(policy, torch.tensor([token_ids]), torch.ones(1, len(token_ids)))
    return TrainedAdapter(path, token_ids, logprobs[0, 1:].tolist())


@pytest.fixture(scope="session")
def tiny_lora_adapters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return (
        build_random_lora_adapter(tiny_model_dir, root / "first", seed=1, b_std=0.05),
        build_random_lora_adapter(tiny_model_dir, root / "second", seed=2, b_std=0.05),
    )


class ReferenceForward:
    """Float32 transformers forward passes of the tiny model (optionally with a LoRA adapter, unmerged, via peft):
    the log-softmax at each position of `prompt + completion`, i.e. what a server's logprobs must match."""

    def __init__(self, model_dir: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model_dir = model_dir
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self._adapted: dict[Path, object] = {}

    def logprobs(self, prompt_ids: list[int], token_ids: list[int], adapter: Path | None = None, *,
                 temperature: float = 1.0, top_p: float = 1.0) -> list[float]:
        """The logprob of each of `token_ids` given the prompt and the tokens before it, under the distribution a
        sampler draws from at `temperature` and `top_p` (the trainer's `sampling_logits`)."""
        import torch

        from prime_lab.trainer.lm_head import sampling_logits

        model = self.base if adapter is None else self._adapter_model(adapter)
        ids = torch.tensor([prompt_ids + token_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].float()  # type: ignore[operator]
        logits = sampling_logits(logits[len(prompt_ids) - 1 : -1], temperature, top_p)
        logprobs = torch.log_softmax(logits, dim=-1)
        return logprobs.gather(1, torch.tensor(token_ids).unsqueeze(1)).squeeze(1).tolist()

    def _adapter_model(self, adapter: Path) -> object:
        if adapter not in self._adapted:
            import torch
            from peft import PeftModel
            from transformers import AutoModelForCausalLM

            base = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32)
            self._adapted[adapter] = PeftModel.from_pretrained(base, str(adapter)).eval()
        return self._adapted[adapter]


@pytest.fixture(scope="session")
def reference_forward(tiny_model_dir: Path) -> ReferenceForward:
    return ReferenceForward(tiny_model_dir)
