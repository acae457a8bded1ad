"""Evaluation: `evaluation` (`prime eval run`'s engine: rollouts, rewards, results files), `readiness` (an
evaluation's verdict for RL: ready, not ready or not a baseline), `launcher` (an evaluation run's lifecycle: its run,
its sampler or trained policy, its states), `compare` (`prime eval compare`: paired bootstrap intervals), `policies`
(a trained run's adapter, weights or model to evaluate)."""
