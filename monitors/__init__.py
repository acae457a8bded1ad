"""Watching a run: the W&B mirror of its event log, and the training alerts."""
