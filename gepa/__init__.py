"""prime-lab's GEPA: reflective prompt evolution with per-instance Pareto fronts under a hard metric-call budget.

`gepa.engine.GepaEngine` is the pure algorithm over a `gepa.adapter.Adapter`; `gepa.env_adapter` runs an
environment's rollouts with a candidate system prompt; `gepa.runner` writes the run's outputs and `gepa.*` events.
Importing this package is cheap (no torch, no textual).
"""

from __future__ import annotations

# Marks this package as prime-lab's own: the reference `gepa` (PyPI) and DSPy/verifiers import the same name.
PRIME_LAB_GEPA = True

__all__ = ["PRIME_LAB_GEPA"]
