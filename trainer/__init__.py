"""RL and SFT training: configs, the launcher (a run's supervisor), the orchestrator with its scheduler, samplers
and their GPU placement, and the trainer process (model, packing, attention, LM head, loss, torch.distributed)."""
