"""Runs: the run registry, the event bus, atomic writes, paths, the reaper, child processes, the hardware probe."""
