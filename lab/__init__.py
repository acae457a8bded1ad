"""prime-lab's shared foundation: run registry, event bus, config problems, environments, models, inference.

Imports nothing from `trainer`, `gepa` or `workbench`, and nothing heavy (torch, transformers, textual) at import.
"""

from prime_lab import __version__

__all__ = ["__version__"]
