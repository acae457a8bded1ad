"""Model folders on disk: what counts as one, and writing one atomically.

A model is materialised into a temporary sibling folder and renamed into place only when it is complete
(runs/atomic.py's folder publisher), so a crash (or Ctrl-C during a 15 s dequantisation) never leaves half a model
where a loader would find it.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prime_lab.runs.atomic import staging_leftovers, write_folder_atomic

STALE_PARTIAL_SECONDS = 3600


def is_model_folder(path: Path) -> bool:
    """A Hugging Face model folder: a directory with a `config.json`."""
    return path.is_dir() and (path / "config.json").is_file()


def holds_full_weights(path: Path) -> bool:
    """A model folder with its weights as safetensors (what full fine-tuning starts from and publishes), not only a
    config (a LoRA adapter's base, a folder being written)."""
    return is_model_folder(path) and any(path.glob("*.safetensors"))


def experts_of(path: Path) -> int:
    """How many routed experts the model folder's config.json declares (0: a dense model, or no readable config):
    `num_experts` (Qwen3-MoE, OLMoE) or `num_local_experts` (Mixtral)."""
    import json

    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return 0
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    value = text.get("num_experts") or text.get("num_local_experts") or 0
    return int(value) if isinstance(value, int) else 0


def materialise(final: Path, build: Callable[[Path], None]) -> Path:
    """Return `final`, building it with `build(folder)` first if it is not a model folder yet.

    `build` writes into a fresh temporary folder next to `final`; the folder is renamed to `final` only after
    `build` returns. When another process finishes first, its folder wins and ours is discarded.
    """
    if is_model_folder(final):
        return final
    _remove_stale_partials(final)
    try:
        with write_folder_atomic(final, replace=False) as partial:
            build(partial)
            if not is_model_folder(partial):
                raise RuntimeError(f"building {final.name} wrote no config.json into {partial}")
    except FileExistsError:
        if not is_model_folder(final):
            raise
    return final


def _remove_stale_partials(final: Path) -> None:
    """Remove temporary folders that crashed builds of `final` left behind (older than an hour)."""
    cutoff = time.time() - STALE_PARTIAL_SECONDS
    for leftover in staging_leftovers(final):
        try:
            if leftover.stat().st_mtime < cutoff:
                shutil.rmtree(leftover, ignore_errors=True)
        except OSError:
            pass


def tokenizer_difference(a: Any, b: Any) -> str | None:
    """How tokenizers `a` and `b` (transformers tokenizers, or model folders to load them from) differ (None: the
    same vocabulary, token for id), in words. A folder is loaded with transformers."""
    vocab_a, vocab_b = (_tokenizer(t).get_vocab() for t in (a, b))
    if vocab_a == vocab_b:
        return None
    if len(vocab_a) != len(vocab_b):
        return f"vocabularies of {len(vocab_a):,} and {len(vocab_b):,} tokens"
    differ = sum(vocab_b.get(token) != i for token, i in vocab_a.items())
    return f"{differ:,} of their {len(vocab_a):,} tokens have other ids"


def _tokenizer(source: Any) -> Any:
    if not isinstance(source, Path):
        return source
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(source)
