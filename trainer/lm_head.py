"""The trainer's LM head: the logprob of each trained token, and the entropy, under the distribution the sampler drew
it from, a chunk of tokens at a time.

The distribution (`sampling_logits`): the model's logits divided by the temperature, the tokens outside the top-p
nucleus at -inf, renormalised. Both samplers report their logprobs under it (vLLM with `--logprobs-mode
processed_logprobs`, the built-in server always), so at step 1 the trainer's logprobs equal the sampler's and the
importance ratio is 1 at any temperature and top_p. Both use inference/nucleus.py's rule, ties at the nucleus edge
included, so they agree in bfloat16 too. A trained token outside the current policy's nucleus (drawn by an older
policy) gets logprob -inf here; the loss leaves it out (trainer/loss.py).

A [tokens, vocabulary] float32 tensor is ~10 GB at 16k tokens and a 152k vocabulary, and the dense way
(`chosen_logprobs`: logits, divided, sorted for the nucleus, log-softmax, softmax for the entropy) holds several.
`sampled_logprobs` never holds one: for each chunk of `chunk_size` tokens it computes the chunk's logits from the
hidden states, in float32, and keeps per token only its logprob, its entropy, the log-normaliser and, with top_p < 1,
the nucleus threshold (the smallest logit kept: the vocabulary is sorted once per token, in the forward pass). The
backward pass recomputes each chunk's logits and takes the nucleus from the saved threshold, so the gradient is that
of the dense computation at a chunk's memory. prime-rl's `lm_head.py`, verl's and Liger's chunked losses do the same
without top_p.

The model's forward reaches the head through `sampled_head`: for the duration of one forward call the output
embedding's `forward` returns [1, n, 2] (logprob, entropy) at the kept positions instead of [1, n, vocabulary]
logits, inside the model's own forward, so DDP's and FSDP2's hooks see the head's weight used as usual.

Some families scale the head's output in their forward (`LOGIT_SCALING`: Granite divides by `logits_scaling`,
Cohere multiplies by `logit_scale`, FalconH1 by `lm_head_multiplier`); that scaling would land on the logprobs. The
chunked head applies it to its logits, as the model does (in the head's dtype), and returns its outputs with the
inverse applied, so the model's own scaling gives them back. Whatever else a model does to its logits the chunked
head cannot know: at load (`head_matches_model`) it is checked against the model's own forward on a short random
input, and a model it does not reproduce gets the dense head.

torch is imported inside the functions.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

DEFAULT_CHUNK_SIZE = 1024  # tokens a chunk: 2.8 GiB of LM-head peak at 16k tokens and a 152k vocabulary (H200)
SORT_ELEMENTS = 1 << 25  # the nucleus sort takes at most this many logits at a time (a sub-chunk of the chunk)
CHECK_TOKENS, CHECK_POSITIONS = 16, 6  # the check at load: a random input this long, scored at its last positions

# model_type -> (the config field, whether the forward divides the head's output by it or multiplies): each
# family's causal-LM forward in transformers 5.19, e.g. Granite's `logits = self.lm_head(h) / config.logits_scaling`.
LOGIT_SCALING: dict[str, tuple[str, bool]] = {
    **dict.fromkeys(("granite", "granitemoe", "granitemoeshared", "granitemoehybrid", "granite_swa",
                     "granitemoe_swa"), ("logits_scaling", True)),
    **dict.fromkeys(("cohere", "cohere2", "cohere2_moe"), ("logit_scale", False)),
    "falcon_h1": ("lm_head_multiplier", False),
    "hyperclovax": ("logits_scaling", False),
}


@dataclass(frozen=True)
class LogitScaling:
    """How a model scales its head's output: `logits / factor` (`divide`) or `logits * factor`."""

    factor: float
    divide: bool

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """As the model's forward does it (a division stays a division: the same rounding)."""
        return logits / self.factor if self.divide else logits * self.factor

    def invert(self, values: torch.Tensor) -> torch.Tensor:
        """`values` such that the model's scaling of them gives back `values` (to float rounding)."""
        return values * self.factor if self.divide else values / self.factor

    @property
    def multiplier(self) -> float:
        """d scaled logit / d logit."""
        return 1.0 / self.factor if self.divide else self.factor


@dataclass(frozen=True)
class ChunkedHead:
    """The model's output Linear the chunked head stands in for, and the scaling its forward applies after it."""

    linear: Any
    scaling: LogitScaling | None = None


def sampling_logits(logits: torch.Tensor, temperature: float = 1.0, top_p: float = 1.0) -> torch.Tensor:
    """The logits of the distribution a sampled token was drawn from: divided by the temperature, then the tokens
    outside the top-p nucleus at -inf. The nucleus is chosen without gradient; the gradient flows through the kept
    logits. At step 1 the sampled token is inside it; a token an older policy drew may not be (logprob -inf, left
    out of the loss: trainer/loss.py). Temperature 0 (greedy) is left as 1, as the samplers report
    it. The dense form, for tests and for the dense head (`lm_head_chunk_size = 0`)."""
    from prime_lab.inference.nucleus import keep_top_p

    logits = logits.float()
    if _scales(temperature):
        logits = logits / temperature
    if _nucleus(temperature, top_p):
        outside = keep_top_p(logits.detach(), top_p).isneginf()
        logits = logits.masked_fill(outside, float("-inf"))
    return logits


def chosen_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0, top_p: float = 1.0, *,
                    with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprobs of `targets` [batch, n] under `logits` [batch, n, vocab] as sampled (`sampling_logits`), and
    (without gradient) the entropies of those distributions when asked: the dense head."""
    import torch

    from prime_lab.trainer.loss import token_entropy

    logits = sampling_logits(logits, temperature, top_p)
    chosen = torch.log_softmax(logits, dim=-1).gather(-1, targets[:, :, None]).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = token_entropy(logits)
    return chosen, entropy


def _scales(temperature: float) -> bool:
    return temperature > 0 and temperature != 1.0


def _nucleus(temperature: float, top_p: float) -> bool:
    return top_p < 1.0 and temperature > 0


def nucleus_threshold(scaled: torch.Tensor, top_p: float) -> torch.Tensor:
    """[n, vocab] scaled logits -> [n]: the smallest logit inside each row's top-p nucleus, by the samplers' rule
    (inference/nucleus.py `top_p_threshold`: a token stays while the probability of the tokens ranked above it is at
    most top_p, and so does every token tied with the last one kept). A token is in the nucleus iff its logit >= the
    threshold, ties included, as the samplers keep them. Sorted a sub-chunk of rows at a time, so the sort's int64
    indices stay small."""
    import torch

    from prime_lab.inference.nucleus import top_p_threshold

    rows = max(1, SORT_ELEMENTS // max(1, scaled.shape[-1]))
    return torch.cat([top_p_threshold(part.sort(dim=-1, descending=True).values, top_p).squeeze(-1)
                      for part in scaled.split(rows)])


def _chunk_logits(hidden: torch.Tensor, weight: torch.Tensor, temperature: float,
                  threshold: torch.Tensor | None, scaling: LogitScaling | None = None) -> torch.Tensor:
    """One chunk's sampling logits: the head's matmul and the model's scaling in the model's dtype (as its forward
    computes them), then float32 (float64 stays float64), divided by the temperature, the tokens below the nucleus
    threshold at -inf."""
    import torch

    logits = torch.nn.functional.linear(hidden, weight)
    if scaling is not None:
        logits = scaling.apply(logits)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if _scales(temperature):
        logits = logits / temperature
    if threshold is not None:
        logits = logits.masked_fill(logits < threshold[:, None], float("-inf"))
    return logits


def _chunked_function() -> Any:
    import torch

    class ChunkedSampledLogprobs(torch.autograd.Function):
        """hidden [n, d], weight [vocab, d], targets [n] -> logprob [n] (differentiable), entropy [n] (not)."""

        @staticmethod
        def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                    temperature: float, top_p: float, chunk_size: int,
                    scaling: LogitScaling | None) -> tuple[torch.Tensor, torch.Tensor]:
            dtype = torch.promote_types(hidden.dtype, torch.float32)
            n = hidden.shape[0]
            logprob = torch.empty(n, dtype=dtype, device=hidden.device)
            entropy = torch.empty_like(logprob)
            log_normaliser = torch.empty_like(logprob)
            threshold = torch.empty_like(logprob) if _nucleus(temperature, top_p) else None
            for start in range(0, n, chunk_size):
                end = min(n, start + chunk_size)
                logits = _chunk_logits(hidden[start:end], weight, temperature, None, scaling)
                if threshold is not None:  # the nucleus from these logits, then masked as _chunk_logits masks
                    threshold[start:end] = nucleus_threshold(logits, top_p)
                    logits.masked_fill_(logits < threshold[start:end, None], float("-inf"))
                lse = torch.logsumexp(logits, dim=-1)
                logprob[start:end] = logits.gather(-1, targets[start:end, None]).squeeze(-1) - lse
                logits -= lse[:, None]  # now log-probabilities: -inf outside the nucleus, where p log p is 0
                probs = logits.exp()
                entropy[start:end] = -torch.where(probs > 0, probs * logits, 0.0).sum(-1)
                log_normaliser[start:end] = lse
                del logits, probs
            ctx.save_for_backward(hidden, weight, targets, log_normaliser,
                                  *([threshold] if threshold is not None else []))
            ctx.temperature, ctx.chunk_size, ctx.scaling = temperature, chunk_size, scaling
            device = hidden.device.type  # under autocast the head's matmul ran in its dtype: recomputed the same way
            ctx.autocast = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
            ctx.mark_non_differentiable(entropy)
            return logprob, entropy

        @staticmethod
        def backward(ctx: Any, grad_logprob: torch.Tensor | None,
                     _grad_entropy: torch.Tensor | None) -> tuple[Any, ...]:
            hidden, weight, targets, log_normaliser, *rest = ctx.saved_tensors
            threshold = rest[0] if rest else None
            temperature, chunk_size, scaling = ctx.temperature, ctx.chunk_size, ctx.scaling
            need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
            if grad_logprob is None or not (need_hidden or need_weight):
                return None, None, None, None, None, None, None
            dtype = torch.promote_types(hidden.dtype, torch.float32)
            grad_hidden = torch.empty_like(hidden) if need_hidden else None
            grad_weight = torch.zeros(weight.shape, dtype=dtype, device=weight.device) if need_weight else None
            scale = (1.0 / temperature if _scales(temperature) else 1.0) * (scaling.multiplier if scaling else 1.0)
            for start in range(0, hidden.shape[0], chunk_size):
                end = min(hidden.shape[0], start + chunk_size)
                chunk_threshold = threshold[start:end] if threshold is not None else None
                with torch.autocast(hidden.device.type, dtype=ctx.autocast, enabled=ctx.autocast is not None):
                    logits = _chunk_logits(hidden[start:end], weight, temperature, chunk_threshold, scaling)
                g = grad_logprob[start:end].to(dtype)
                # d logprob / d logits = onehot(target) - p (0 outside the nucleus), times 1/T for the division and
                # the model's scaling's factor
                d_logits = torch.exp(logits - log_normaliser[start:end, None]).mul_(-g[:, None])
                d_logits.scatter_add_(-1, targets[start:end, None], g[:, None])
                if scale != 1.0:
                    d_logits.mul_(scale)
                d_logits = d_logits.to(hidden.dtype)
                if grad_hidden is not None:
                    grad_hidden[start:end] = d_logits @ weight
                if grad_weight is not None:
                    grad_weight += (d_logits.T @ hidden[start:end]).to(dtype)
                del logits, d_logits
            return (grad_hidden, grad_weight.to(weight.dtype) if grad_weight is not None else None,
                    None, None, None, None, None)

    return ChunkedSampledLogprobs


_FUNCTION: Any = None


def sampled_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                     top_p: float = 1.0, chunk_size: int = DEFAULT_CHUNK_SIZE, *,
                     scaling: LogitScaling | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The logprob of each of `targets` [n] (differentiable, to `hidden` [n, d] and `weight` [vocab, d]) and the
    entropy at each position (no gradient), under the sampling distribution of the logits `hidden @ weight.T`
    (scaled as `scaling` says), `chunk_size` tokens at a time. Equals `chosen_logprobs` on the full logits, to float
    rounding."""
    global _FUNCTION
    if _FUNCTION is None:
        _FUNCTION = _chunked_function()
    logprob, entropy = _FUNCTION.apply(hidden, weight, targets, temperature, top_p, max(1, chunk_size), scaling)
    return logprob, entropy


# Models whose head the check at load found the chunked head does not reproduce, and why (`head_matches_model`).
_NOT_REPRODUCED: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def logit_scaling(model: Any) -> LogitScaling | None:
    """How `model`'s forward scales its head's output (`LOGIT_SCALING`), None where it does not (as far as the
    table knows: the check at load finds the rest)."""
    config = getattr(model, "config", None)
    known = LOGIT_SCALING.get(str(getattr(config, "model_type", "")))
    factor = getattr(config, known[0], None) if known else None
    if known is None or factor is None or float(factor) == 1.0:
        return None
    return LogitScaling(float(factor), known[1])


def chunkable_head(model: Any) -> tuple[ChunkedHead | None, str]:
    """The model's output embedding, with the scaling its forward applies, when the chunked head can stand in for
    it (a plain Linear without bias, logits not soft-capped, the check at load passed or not run), else None and
    why not."""
    import torch

    config = getattr(model, "config", None)
    if model in _NOT_REPRODUCED:
        return None, _NOT_REPRODUCED[model]
    if getattr(config, "final_logit_softcapping", None):
        return None, "the model soft-caps its logits"
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if type(head) is not torch.nn.Linear:
        return None, f"its output layer is a {type(head).__name__}, not a plain Linear (LoRA on lm_head?)"
    if head.bias is not None:
        return None, "its output layer has a bias"
    return ChunkedHead(head, logit_scaling(model)), ""


def head_matches_model(model: Any, device: str) -> str | None:
    """Check the chunked head against `model`'s own forward: a random input of CHECK_TOKENS tokens (the same on
    every rank), scored at its last CHECK_POSITIONS positions, logprobs of random targets and entropies compared
    within the model dtype's rounding. None when they agree (or the chunked head does not apply: `chunkable_head`
    says why), else a one-line warning; `chunkable_head` then gives None for this model (the dense head). Runs in
    eval mode, without gradient, compiled layers run eagerly, FlexAttention swapped for SDPA: the check is of the
    head."""
    import torch

    head, _ = chunkable_head(model)
    if head is None:
        return None
    vocab = head.linear.out_features
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(min(vocab, model.get_input_embeddings().num_embeddings), (1, CHECK_TOKENS),
                        generator=generator).to(device)
    targets = torch.randint(vocab, (CHECK_POSITIONS,), generator=generator).to(device)
    inputs = {"input_ids": ids,
              "logits_to_keep": torch.arange(CHECK_TOKENS - CHECK_POSITIONS, CHECK_TOKENS, device=device)}
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    attention = getattr(base.config, "_attn_implementation", None)
    swap = "flex" in str(attention)
    training = model.training
    model.eval()
    try:
        if swap:
            base.config._attn_implementation = "sdpa"
        with torch.no_grad(), torch.compiler.set_stance("force_eager"):
            logits = model(**inputs).logits
            dense, dense_entropy = chosen_logprobs(logits, targets[None], with_entropy=True)
            with sampled_head(head, targets, 1.0, 1.0, CHECK_POSITIONS):
                scored = model(**inputs).logits
    finally:
        if swap:
            base.config._attn_implementation = attention
        model.train(training)
    assert dense_entropy is not None
    want = torch.stack([dense[0], dense_entropy[0]], dim=-1)
    tolerance = max(1e-4, 4 * torch.finfo(logits.dtype).eps)  # relative: bfloat16 3%, float32 1e-4
    if tuple(scored.shape) != (1, CHECK_POSITIONS, 2):
        got = f"an output of shape {tuple(scored.shape)}"
    elif bool(((scored[0].float() - want).abs() <= tolerance * (1 + want.abs())).all()):
        return None
    else:
        got = f"logprob {float(scored[0, 0, 0]):.4g} where its forward gives {float(want[0, 0]):.4g}"
    name = type(base).__name__
    _NOT_REPRODUCED[model] = f"the chunked head differs from {name}'s own forward"
    return (f"the chunked LM head does not reproduce {name}'s own logits ({got}): its forward does something to "
            "them the chunked head does not know; training through the dense LM head (as lm_head_chunk_size = 0: "
            "[tokens, vocabulary] logits in memory)")


@contextmanager
def sampled_head(head: ChunkedHead, targets: torch.Tensor, temperature: float, top_p: float,
                 chunk_size: int) -> Iterator[None]:
    """While active, `head`'s Linear (the model's output layer) maps the hidden states at the kept positions
    [1, n, d] to [1, n, 2]: the logprob of each of `targets` [n] and the entropy, as `sampled_logprobs` computes
    them. The model's forward then returns those as its `logits` (so `logits_to_keep` must select exactly the
    targets' positions), after its own scaling: they go out with its inverse applied (`LogitScaling.invert`)."""
    import torch

    linear, scaling = head.linear, head.scaling

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        logprob, entropy = sampled_logprobs(hidden[0], linear.weight, targets, temperature, top_p, chunk_size,
                                            scaling=scaling)
        scored = torch.stack([logprob, entropy], dim=-1)[None]
        return scaling.invert(scored) if scaling is not None else scored

    linear.forward = forward
    try:
        yield
    finally:
        del linear.forward
