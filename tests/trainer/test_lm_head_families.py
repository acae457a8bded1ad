"""Model families that scale their logits (Granite and GraniteMoE divide by `logits_scaling`, Cohere and Cohere2
multiply by `logit_scale`, FalconH1 by `lm_head_multiplier`, and their siblings): the chunked LM head
(trainer/lm_head.py) gives the logprobs, entropies and gradients of the model's own forward, and at load the trainer
checks the chunked head against that forward, falling back to the dense head, with one warning, for a model whose
head it does not reproduce. Tiny models of each family, built from their transformers config classes (2 layers,
hidden size 32)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from prime_lab.trainer import lm_head
from prime_lab.trainer.lm_head import sampling_logits
from prime_lab.trainer.model import score_row
from tests.support.trainer_runs import base_batches, config_text, new_run, train, trainer_log, trainer_metrics

# A spread of logits like a trained model's (transformers' 0.02 init gives a near-uniform next-token distribution,
# where a scale barely shows) and a scale far from 1.
SIZES = dict(vocab_size=160, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, initializer_range=0.3, bos_token_id=None, eos_token_id=1, pad_token_id=0)


def family_config(family: str, **extra: Any) -> tuple[Any, Any]:
    """The transformers config of a tiny `family` model and its causal-LM class."""
    import transformers as t

    sizes = {**SIZES, **extra}
    experts: dict[str, Any] = {"num_local_experts": 4, "num_experts_per_tok": 2}
    mamba: dict[str, Any] = {"mamba_d_state": 8, "mamba_n_heads": 4, "mamba_chunk_size": 8}  # in plain torch here
    configs: dict[str, tuple[Any, Any]] = {
        "granite": (t.GraniteConfig(**sizes, logits_scaling=8.0), t.GraniteForCausalLM),
        "granitemoe": (t.GraniteMoeConfig(**sizes, **experts, logits_scaling=8.0), t.GraniteMoeForCausalLM),
        # its own head (Cohere ties it to the embeddings by default)
        "cohere": (t.CohereConfig(**sizes, logit_scale=3.0, tie_word_embeddings=False), t.CohereForCausalLM),
        "cohere2": (t.Cohere2Config(**sizes, logit_scale=3.0), t.Cohere2ForCausalLM),
        # attention and Mamba-2 mixers side by side
        "falcon_h1": (t.FalconH1Config(**sizes, **mamba, lm_head_multiplier=5.0, mamba_d_ssm=32, mamba_d_head=8),
                      t.FalconH1ForCausalLM),
        # the same scalings in the families' siblings
        "granitemoeshared": (t.GraniteMoeSharedConfig(**sizes, **experts, logits_scaling=8.0,
                                                      shared_intermediate_size=32), t.GraniteMoeSharedForCausalLM),
        "granitemoehybrid": (t.GraniteMoeHybridConfig(**sizes, **experts, **mamba, logits_scaling=8.0,
                                                      shared_intermediate_size=32, mamba_d_head=16,
                                                      layer_types=["mamba", "attention"]),
                             t.GraniteMoeHybridForCausalLM),
        "granite_swa": (t.GraniteSWAConfig(**sizes, logits_scaling=8.0), t.GraniteSWAForCausalLM),
        "granitemoe_swa": (t.GraniteMoeSWAConfig(**sizes, **experts, logits_scaling=8.0),
                           t.GraniteMoeSWAForCausalLM),
        "cohere2_moe": (t.Cohere2MoeConfig(**sizes, logit_scale=3.0), t.Cohere2MoeForCausalLM),
        "hyperclovax": (t.HyperCLOVAXConfig(**sizes, logits_scaling=3.0), t.HyperCLOVAXForCausalLM),  # multiplies
    }
    return configs[family]


FAMILIES = ("granite", "granitemoe", "cohere", "cohere2", "falcon_h1", "granitemoeshared", "granitemoehybrid",
            "granite_swa", "granitemoe_swa", "cohere2_moe", "hyperclovax")


def tiny_model(family: str, dtype: torch.dtype = torch.float32) -> Any:
    config, model_class = family_config(family)
    torch.manual_seed(0)
    return model_class(config).to(dtype)


def _row(model: Any, temperature: float = 1.0, top_p: float = 1.0, seed: int = 0) -> tuple[dict[str, Any],
                                                                                          torch.Tensor]:
    """A row of 20 random tokens scored at its last 12 positions: the model's inputs (as trainer/attention.py
    `row_inputs` builds them for one sample) and targets drawn from the model's sampling distribution, as a sampler
    draws them, but the last: the model's least likely token (outside the nucleus where top_p < 1)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, model.config.vocab_size, (1, 20), generator=gen)
    sources = torch.arange(7, 19)
    inputs = {"input_ids": ids, "position_ids": torch.arange(20)[None], "logits_to_keep": sources,
              "attention_mask": None}
    with torch.no_grad():
        logits = model(**inputs).logits[0].float()
    targets = torch.multinomial(torch.softmax(sampling_logits(logits, temperature, top_p), -1), 1,
                                generator=gen).squeeze(-1)
    targets[-1] = logits[-1].argmin()
    return inputs, targets


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9)])
def test_the_chunked_head_gives_the_model_s_own_logprobs_and_gradients(family: str, temperature: float,
                                                                        top_p: float) -> None:
    """The trainer's row scoring through the chunked head (chunks of 5 tokens) against the dense head on the
    model's own logits: the same logprobs, entropies and gradients of every weight."""
    model = tiny_model(family)
    inputs, targets = _row(model, temperature, top_p)
    upstream = torch.linspace(-1.0, 1.0, len(targets))
    scored, grads = [], []
    for chunk in (5, 0):
        model.zero_grad(set_to_none=True)
        logprobs, entropy = score_row(model, model, inputs, targets, temperature, top_p, chunk)
        (logprobs[0].masked_fill(logprobs[0].isneginf(), 0.0) * upstream).sum().backward()
        scored.append((logprobs.detach(), entropy))
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    (chunked, chunked_entropy), (dense, dense_entropy) = scored
    assert bool(torch.isfinite(dense[0, :-1]).all()) and float(dense_entropy.mean()) > 0.1
    assert bool(dense[0, -1].isneginf()) == (top_p < 1.0)  # the least likely token: outside the nucleus
    torch.testing.assert_close(chunked, dense, rtol=0, atol=2e-5)
    torch.testing.assert_close(chunked_entropy, dense_entropy, rtol=0, atol=2e-5)
    assert grads[0].keys() == grads[1].keys() == {n for n, _ in model.named_parameters()}  # every weight, the head's
    for name, want in grads[1].items():
        torch.testing.assert_close(grads[0][name], want, rtol=1e-4, atol=1e-5 * float(want.abs().max()) + 1e-9,
                                   msg=name)


@pytest.mark.parametrize("family", FAMILIES)
def test_under_autocast_the_backward_recomputes_the_logits_the_forward_used(family: str) -> None:
    """Float32 weights under bfloat16 autocast (full fine-tuning's master weights): the head's matmul runs in
    bfloat16 in the forward, and its backward recomputes the same logits (recomputed in float32 they disagree with
    the saved log-normaliser, by up to 20% of the head's gradient where the model multiplies its logits)."""
    model = tiny_model(family)
    inputs, targets = _row(model)
    grads = []
    for chunk in (5, 0):
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logprobs = score_row(model, model, inputs, targets, 1.0, 1.0, chunk)[0]
        logprobs.sum().backward()
        grads.append(model.get_output_embeddings().weight.grad.clone())
    chunked, dense = grads  # the dense head's backward runs its matmuls in bfloat16: equal to bfloat16 rounding
    assert float((chunked - dense).abs().max()) < 0.015 * float(dense.abs().max())


def test_every_family_the_head_folds_in_has_a_tiny_model_here() -> None:
    assert sorted(lm_head.LOGIT_SCALING) == sorted(FAMILIES)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_the_check_at_load_passes_each_family(family: str, dtype: torch.dtype) -> None:
    """The check against the model's own forward passes for each family, in float32 and bfloat16, and leaves the
    chunked head in use."""
    model = tiny_model(family, dtype).train()
    assert lm_head.head_matches_model(model, "cpu") is None
    assert lm_head.chunkable_head(model)[0] is not None
    assert model.training  # the check runs in eval mode and gives the model back as it found it


def test_a_head_the_check_does_not_reproduce_falls_back_to_the_dense_head(monkeypatch: pytest.MonkeyPatch) -> None:
    """A family whose scaling the head does not fold in (Granite, with its entry taken out of the table): the check
    says so, the chunked head is not used for that model, and scoring gives the model's own logprobs."""
    monkeypatch.delitem(lm_head.LOGIT_SCALING, "granite")
    model = tiny_model("granite")
    inputs, targets = _row(model)
    unchecked = score_row(model, model, inputs, targets, 1.0, 1.0, 5)[0]
    note = lm_head.head_matches_model(model, "cpu")
    assert note is not None and "does not reproduce GraniteForCausalLM's own logits" in note, note
    assert lm_head.chunkable_head(model) == (None, "the chunked head differs from GraniteForCausalLM's own forward")
    checked = score_row(model, model, inputs, targets, 1.0, 1.0, 5)[0]
    dense = score_row(model, model, inputs, targets, 1.0, 1.0, 0)[0]
    assert float((unchecked - dense).detach().abs().max()) > 1.0  # what the chunked head would have trained on
    torch.testing.assert_close(checked, dense, rtol=0, atol=0)
    assert lm_head.head_matches_model(tiny_model("granite"), "cpu") is not None  # a check per model
    monkeypatch.undo()
    assert lm_head.head_matches_model(tiny_model("granite"), "cpu") is None


def _saved(family: str, dest: Path) -> Path:
    """A tiny `family` model folder with the tiny tokenizer, as the trainer loads it."""
    from prime_lab.models.tiny import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    config, model_class = family_config(family, vocab_size=len(tokenizer))
    config.architectures = [model_class.__name__]
    torch.manual_seed(0)
    model_class(config).save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    return dest


@pytest.mark.parametrize("known", [True, False], ids=["folded-in", "not-reproduced"])
def test_a_granite_run_trains_on_the_model_s_own_logprobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          known: bool) -> None:
    """A run on a Granite model (logits divided by 8), batches whose sampler logprobs are the model's own: at step 1
    the importance ratio is 1 (policy/kl ~ 0, no token masked), through the chunked head where the head folds the
    scaling in, through the dense head, with one warning, where it does not."""
    model_dir = _saved("granite", tmp_path / "tiny-granite")
    if not known:
        monkeypatch.delitem(lm_head.LOGIT_SCALING, "granite")
    batches = base_batches(model_dir, 1)
    run = new_run(model_dir, config_text(model_dir, steps=1), batches)
    train(run, model_dir)
    log = trainer_log(run)
    ready = next(m for _, m in log if m.startswith("trainer ready"))
    warnings = [m for level, m in log if level == "WARNING"]
    if known:
        assert "LM head 1024 tokens a chunk" in ready and not warnings, log
    else:
        assert "LM head whole (the chunked head differs from GraniteForCausalLM's own forward)" in ready, ready
        assert len(warnings) == 1 and "does not reproduce GraniteForCausalLM's own logits" in warnings[0] \
            and "training through the dense LM head" in warnings[0], log
    step = trainer_metrics(run)[1]
    assert abs(step["policy/kl"]) < 1e-5 and step["policy/masked_fraction"] == 0.0, step
