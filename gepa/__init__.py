"""prime-lab's GEPA: reflective prompt evolution with per-instance Pareto fronts under a hard metric-call budget.

`engine.GepaEngine` is the pure algorithm over an `adapter.Adapter`; `env_adapter` runs an
environment's rollouts with a candidate system prompt; `runner` writes the run's outputs and `gepa.*` events.
Importing this package is cheap (no torch, no textual).
"""
