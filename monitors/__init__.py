"""Watching a run from its event log: `wandb_mirror` (the log mirrored into a W&B run, offline without a key) and
`alerts` (entropy collapse, reward std 0, KL explosion, ...: raised by the launcher as `alert` events)."""
