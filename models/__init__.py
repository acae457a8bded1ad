"""Models: presets (`prime rl models`), resolving a model name to a local folder, tiny test models.

Importing `models` does not import torch or transformers; building or materialising a model does, lazily.
"""

from prime_lab.models.presets import PRESETS, Availability, ModelPreset, list_presets
from prime_lab.models.resolve import ModelNotFoundError, resolve_model
from prime_lab.models.tiny import TinyModelShape, build_tiny_model

__all__ = [
    "PRESETS",
    "Availability",
    "ModelNotFoundError",
    "ModelPreset",
    "TinyModelShape",
    "build_tiny_model",
    "list_presets",
    "resolve_model",
]
