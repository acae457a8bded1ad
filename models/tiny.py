"""Tiny models for tests: Qwen3-shaped (or a Mixture-of-Experts family's shape: Qwen3-MoE, OLMoE, Mixtral), random
weights, a byte-level BPE tokenizer trained here on fixed text.

Each is saved as an ordinary Hugging Face folder (config.json, model.safetensors, tokenizer.json,
tokenizer_config.json with a ChatML chat template, generation_config.json), so transformers, peft and vLLM load
it exactly like a downloaded model. Building one takes about a second and needs no network.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prime_lab.models.chat_templates import QWEN3_CHATML

IM_START, IM_END, END_OF_TEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
SPECIAL_TOKENS = [END_OF_TEXT, IM_START, IM_END]
THINK_TOKENS = ["<think>", "</think>"]

# Fixed training text, so the same tokenizer comes out on every machine. Chat-ish English, digits, arithmetic.
_CORPUS_LINES = [
    "You are a helpful assistant. Answer the question and think step by step.",
    "The user asks a question; the assistant answers it with a short, correct reply.",
    "What is the capital of France? The capital of France is Paris.",
    "Reverse the text: hello world -> dlrow olleh. Sort the letters in alphabetical order.",
    "Solve: 12 + 30 = 42. 7 * 8 = 56. 100 - 1 = 99. 81 / 9 = 9. The answer is 42.",
    "Put the final answer in \\boxed{} or after 'Answer:'. Respond in JSON with the keys name and value.",
    "system user assistant think reason reward score correct wrong true false yes no",
    "The quick brown fox jumps over the lazy dog. A small model learns from a tiny dataset.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))  # 5",
]


# The Mixture-of-Experts families a tiny model can take. In transformers 5 each keeps its experts as two fused 3-D
# parameters per layer (`mlp.experts.gate_up_proj`, `mlp.experts.down_proj`) and its router as `mlp.gate.weight`.
MOE_FAMILIES = ("qwen3-moe", "olmoe", "mixtral")


@dataclass(frozen=True)
class TinyModelShape:
    """The sizes of a tiny model of `family`: "qwen3" (dense) or one of `MOE_FAMILIES`, where `intermediate_size` is
    each expert's. vLLM's CPU attention needs head_dim >= 32; OLMoE's is hidden_size / num_attention_heads."""

    family: str = "qwen3"
    num_hidden_layers: int = 2
    hidden_size: int = 64
    intermediate_size: int = 128
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    max_position_embeddings: int = 4096
    tokenizer_vocab_size: int = 1024
    # Weight init std. transformers' 0.02 gives a near-uniform next-token distribution whose logits a LoRA adapter
    # can barely move (RMSNorm caps the hidden state); RL tests use a larger one so the policy can learn.
    initializer_range: float = 0.02
    # Add a shared direction per character class (letters, digits, spaces, punctuation, other) to each token's
    # embedding, as a pretrained model's embeddings would cluster them. With it, "write more letters" is a direction
    # a LoRA adapter can find in a few RL steps; without it, classes are random point clouds (tests of learning).
    char_class_strength: float = 0.0
    num_experts: int = 4
    num_experts_per_tok: int = 2


def tiny_moe_shape(family: str, **sizes: Any) -> TinyModelShape:
    """The shape of a tiny MoE model of `family`: 2 layers, 4 experts (top-2) of width 32, hidden 64, 2 query heads
    and 1 key/value head of head_dim 32 (so OLMoE, whose head_dim follows from the hidden size, has it too)."""
    if family not in MOE_FAMILIES:
        raise ValueError(f"unknown MoE family {family!r}; one of {', '.join(MOE_FAMILIES)}")
    return TinyModelShape(**{"family": family, "intermediate_size": 32, "num_attention_heads": 2,
                             "num_key_value_heads": 1, **sizes})


def build_tiny_tokenizer(vocab_size: int = 1024) -> Any:
    """A byte-level BPE tokenizer (a transformers fast tokenizer) trained on fixed text, with ChatML tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = _CORPUS_LINES + [" ".join(str(n) for n in range(start, start + 50)) for start in range(0, 1000, 50)]
    backend.train_from_iterator(corpus, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token=IM_END, pad_token=END_OF_TEXT, bos_token=None, unk_token=None
    )
    tokenizer.add_special_tokens({"additional_special_tokens": [IM_START, IM_END]})
    tokenizer.add_tokens(THINK_TOKENS)
    tokenizer.chat_template = QWEN3_CHATML
    tokenizer.model_max_length = TinyModelShape.max_position_embeddings
    return tokenizer


def build_tiny_model(dest: Path, *, seed: int = 0, shape: TinyModelShape | None = None) -> Path:
    """Write a random-init model of `shape` (default: Qwen3-shaped) with its tokenizer into `dest` (created if
    missing); return it.

    The same `seed` and `shape` give the same weights. Weights are float32 safetensors.
    """
    import torch
    from transformers import GenerationConfig

    shape = shape or TinyModelShape()
    tokenizer = build_tiny_tokenizer(shape.tokenizer_vocab_size)
    im_end, end_of_text = tokenizer.convert_tokens_to_ids([IM_END, END_OF_TEXT])
    config, model_class = _model_config(shape, vocab_size=len(tokenizer), eos_token_id=im_end,
                                        pad_token_id=end_of_text)
    config.architectures = [model_class.__name__]
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = model_class(config)  # float32: the config says so
    finally:
        torch.random.set_rng_state(generator_state)
    if shape.char_class_strength > 0:
        _add_char_class_directions(model, tokenizer, shape.char_class_strength, seed)
    model.generation_config = GenerationConfig(
        eos_token_id=[im_end, end_of_text], pad_token_id=end_of_text, bos_token_id=None
    )
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    return dest


def _model_config(shape: TinyModelShape, **tokens: Any) -> tuple[Any, Any]:
    """The transformers config of `shape` and the causal-LM class it builds."""
    import transformers

    common: dict[str, Any] = dict(
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        max_position_embeddings=shape.max_position_embeddings,
        tie_word_embeddings=shape.family == "qwen3",
        bos_token_id=None,
        dtype="float32",
        initializer_range=shape.initializer_range,
        **tokens,
    )
    experts: dict[str, Any] = {"num_experts_per_tok": shape.num_experts_per_tok}
    head_dim: dict[str, Any] = {"head_dim": shape.head_dim}  # Qwen3-MoE's config takes it through its **kwargs
    if shape.family == "qwen3":
        return transformers.Qwen3Config(**common, **head_dim), transformers.Qwen3ForCausalLM
    if shape.family == "qwen3-moe":  # every layer sparse (no mlp_only_layers)
        return (transformers.Qwen3MoeConfig(**common, **head_dim, **experts, num_experts=shape.num_experts,
                                            moe_intermediate_size=shape.intermediate_size),
                transformers.Qwen3MoeForCausalLM)
    if shape.family == "mixtral":
        return (transformers.MixtralConfig(**common, **head_dim, **experts, num_local_experts=shape.num_experts),
                transformers.MixtralForCausalLM)
    if shape.family == "olmoe":
        if shape.hidden_size // shape.num_attention_heads != shape.head_dim:
            raise ValueError(f"OLMoE's head_dim is hidden_size / num_attention_heads ({shape.hidden_size} / "
                             f"{shape.num_attention_heads}), not {shape.head_dim}")
        return (transformers.OlmoeConfig(**common, **experts, num_experts=shape.num_experts),
                transformers.OlmoeForCausalLM)
    raise ValueError(f"unknown tiny model family {shape.family!r}; one of qwen3, {', '.join(MOE_FAMILIES)}")


def char_class(text: str) -> str:
    """The character class of a token's text: the class most of its non-space characters are in."""
    stripped = "".join(text.split())
    if not stripped:
        return "space"
    counts = {"letters": sum(c.isascii() and c.isalpha() for c in stripped),
              "digits": sum(c.isdigit() for c in stripped),
              "punct": sum(c.isascii() and not c.isalnum() for c in stripped)}
    best = max(counts, key=lambda k: counts[k])
    return best if counts[best] * 2 > len(stripped) else "other"


def _add_char_class_directions(model: Any, tokenizer: Any, strength: float, seed: int) -> None:
    import torch

    classes = ["letters", "digits", "space", "punct", "other"]
    generator = torch.Generator().manual_seed(seed + 1)
    hidden = model.config.hidden_size
    directions = torch.linalg.qr(torch.randn(hidden, len(classes), generator=generator))[0].T  # orthonormal rows
    embed = model.get_input_embeddings().weight
    with torch.no_grad():
        for token_id in range(len(tokenizer)):
            text = tokenizer.decode([token_id])
            embed[token_id] += strength * directions[classes.index(char_class(text))]


def build_tiny_qwen3(dest: Path) -> None:
    """The `tiny-qwen3` preset: the default shape, seed 0."""
    build_tiny_model(dest)


def build_tiny_qwen3_moe(dest: Path) -> None:
    """The `tiny-qwen3-moe` preset: `tiny_moe_shape("qwen3-moe")`, seed 0."""
    build_tiny_model(dest, shape=tiny_moe_shape("qwen3-moe"))


def build_tiny_olmoe(dest: Path) -> None:
    """The `tiny-olmoe` preset: `tiny_moe_shape("olmoe")`, seed 0."""
    build_tiny_model(dest, shape=tiny_moe_shape("olmoe"))


def build_tiny_mixtral(dest: Path) -> None:
    """The `tiny-mixtral` preset: `tiny_moe_shape("mixtral")`, seed 0."""
    build_tiny_model(dest, shape=tiny_moe_shape("mixtral"))
