"""The terminal view of a GEPA search: a budget bar, the best score and the last iteration's verdict."""

from __future__ import annotations

from types import TracebackType
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from prime_lab.workbench.cli.render import progress_console


class GepaProgress:
    def __init__(self, max_calls: int, *, enabled: bool) -> None:
        columns = (TextColumn("[bold]budget"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("best {task.fields[best]}"), TextColumn("{task.fields[last]}"), TimeElapsedColumn())
        self.progress = Progress(*columns, transient=False, disable=not enabled, console=progress_console())
        self.task = self.progress.add_task("budget", total=max_calls, best="-", last="seed validation")
        self.proposals = 0
        self.accepted = 0

    def on_event(self, kind: str, data: dict[str, Any]) -> None:
        if kind == "gepa.budget":
            self.progress.update(self.task, completed=data["used"])
        elif kind == "gepa.frontier":
            self.progress.update(self.task, best=f"{data['best_score']:.3f} (#{data['best_idx']} of "
                                                 f"{data['num_candidates']})")
        elif kind == "gepa.iteration":
            self.proposals += 1
            self.accepted += data["verdict"] == "accepted"
            self.progress.update(self.task, last=f"iter {data['iteration']} {data['type']}: {data['verdict']} "
                                                 f"({self.accepted} of {self.proposals} accepted)")

    def __enter__(self) -> GepaProgress:
        self.progress.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.progress.stop()
