"""The run registry as a table: id, kind, state, model, environments, step / max, reward, started; evaluations
marked for comparison carry their letter (`[A] id`: A is the one the others are compared against)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rich.markup import escape
from textual.widgets import DataTable

from prime_lab.runs.registry import RunRegistry


def ago(then: Any, now: float) -> str:
    if not isinstance(then, (int, float)):
        return "-"
    seconds = max(0, int(now - then))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def short_env(env_id: str) -> str:
    return env_id.split("/")[-1]


def run_row(status: dict[str, Any], now: float) -> tuple[str, ...]:
    step, max_steps = status.get("step"), status.get("max_steps")
    progress = f"{step or 0}/{max_steps}" if max_steps else (str(step) if step else "-")
    reward = status.get("reward")
    return (str(status.get("id", "?")), str(status.get("kind", "?")), str(status.get("state", "?")),
            str(status.get("model") or "-"), ",".join(short_env(e) for e in status.get("envs") or []) or "-",
            progress, f"{reward:.3f}" if isinstance(reward, (int, float)) else "-",
            ago(status.get("started_at") or status.get("created_at"), now))


def mark_letter(index: int) -> str:
    """The letter of the `index`th marked evaluation, as the comparison names it."""
    return chr(ord("A") + index) if index < 26 else f"E{index + 1}"


class RunsTable(DataTable[str]):
    """Every run, newest first; `refresh_runs` keeps the cursor on the same run. `marked`: the evaluations marked
for comparison, in the order they were marked."""

    COLUMNS = ("run", "kind", "state", "model", "envs", "step", "reward", "started")

    def __init__(self, registry: RunRegistry, clock: Callable[[], float] = time.time, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self.registry = registry
        self.clock = clock
        self.marked: list[str] = []

    def on_mount(self) -> None:
        self.add_columns(*self.COLUMNS)
        self.refresh_runs()

    def refresh_runs(self) -> None:
        selected = self.selected_run()
        self.clear()
        now = self.clock()
        runs = self.registry.runs()
        self.marked = [run_id for run_id in self.marked if run_id in {run.id for run in runs}]
        for run in runs:
            row = run_row(run.read_status(), now)
            if run.id in self.marked:
                row = (escape(f"[{mark_letter(self.marked.index(run.id))}] ") + row[0], *row[1:])
            self.add_row(*row, key=run.id)
        if selected is not None and selected in self.rows:
            self.move_cursor(row=self.get_row_index(selected))

    def toggle_mark(self, run_id: str) -> None:
        """Mark the run for comparison, or unmark it (the letters of those marked after it move up)."""
        if run_id in self.marked:
            self.marked.remove(run_id)
        else:
            self.marked.append(run_id)
        self.refresh_runs()

    def selected_run(self) -> str | None:
        if not self.row_count:
            return None
        key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key
        return str(key.value) if key.value is not None else None
