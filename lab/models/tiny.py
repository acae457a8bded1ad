"""Tiny models for tests: Qwen3-shaped, random weights, a byte-level BPE tokenizer trained here on fixed text.

Each is saved as an ordinary Hugging Face folder (config.json, model.safetensors, tokenizer.json,
tokenizer_config.json with a ChatML chat template, generation_config.json), so transformers, peft and vLLM load
it exactly like a downloaded model. Building one takes about a second and needs no network.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prime_lab.lab.models.chat_templates import QWEN3_CHATML

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


@dataclass(frozen=True)
class TinyModelShape:
    """The sizes of a tiny Qwen3-shaped model. vLLM's CPU attention needs head_dim >= 32."""

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
    """Write a random-init Qwen3-shaped model with its tokenizer into `dest` (created if missing); return it.

    The same `seed` and `shape` give the same weights. Weights are float32 safetensors.
    """
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    shape = shape or TinyModelShape()
    tokenizer = build_tiny_tokenizer(shape.tokenizer_vocab_size)
    im_end, end_of_text = tokenizer.convert_tokens_to_ids([IM_END, END_OF_TEXT])
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=shape.max_position_embeddings,
        tie_word_embeddings=True,
        eos_token_id=im_end,
        pad_token_id=end_of_text,
        bos_token_id=None,
        dtype="float32",
        initializer_range=shape.initializer_range,
    )
    config.architectures = ["Qwen3ForCausalLM"]
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)  # float32: the config says so
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
