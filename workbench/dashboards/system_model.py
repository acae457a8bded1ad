"""A run's `system` events (runs/system_metrics.py) folded for its System pane: each process's newest values (one
that exited keeps its last ones, marked), the GPUs of the newest sample, when it was taken. Textual-free."""

from __future__ import annotations

from typing import Any

from prime_lab.runs.system_metrics import ROLES, ProcessSample, SystemSample


class SystemModel:
    def __init__(self) -> None:
        self.processes: dict[str, ProcessSample] = {}  # by label, every process any sample had
        self.running: set[str] = set()  # the labels of the newest sample
        self.newest: SystemSample | None = None
        self.samples = 0  # samples folded (the pane redraws when it moves)

    def add(self, data: Any, time: Any = None) -> None:
        """One `system` event's data (and its time); data that is not a dict is skipped."""
        if not isinstance(data, dict):
            return
        sample = SystemSample.from_event_data(data, time if isinstance(time, int | float) else None)
        by_label = sample.by_label()
        self.processes.update(by_label)
        self.running = set(by_label)
        self.newest = sample
        self.samples += 1

    def rows(self) -> list[tuple[str, ProcessSample, bool]]:
        """(label, values, running) per process, in role order (supervisor, trainer ranks, orchestrator, samplers,
        teacher, environment servers, mirror, other)."""
        def order(item: tuple[str, ProcessSample]) -> tuple[int, int, str]:
            label, process = item
            role = ROLES.index(process.role) if process.role in ROLES else len(ROLES)
            return role, process.rank if process.rank is not None else -1, label

        return [(label, process, label in self.running)
                for label, process in sorted(self.processes.items(), key=order)]
