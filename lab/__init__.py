"""prime-lab's shared foundation: run registry, event bus, config problems, environments, models, inference.

Imports nothing from `trainer`, `gepa` or `workbench`, and nothing heavy (torch, transformers, textual) at import.
"""

__version__ = "0.1.0"
