"""A run's log lines (log events and the processes' text logs), filtered by process and by lowest level."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import RichLog, Static

from prime_lab.runs.events import LEVELS
from prime_lab.workbench.dashboards.event_folds import LogLine

ALL = "all"
LEVEL_STYLE = {"DEBUG": "dim", "WARNING": "yellow", "ERROR": "bold red", "SUCCESS": "green"}
SHOWN_LINES = 2000


class LogsPane(Vertical):
    DEFAULT_CSS = """
    LogsPane { height: 1fr; }
    LogsPane #logs-filter { height: 1; padding: 0 1; color: $text-muted; }
    LogsPane RichLog { height: 1fr; border: round $primary-darken-2; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.process = ALL
        self.min_level = "DEBUG"
        self.processes: list[str] = [ALL]
        self._shown = 0  # lines of the source already written (when no filter changed)
        self._lines: Sequence[LogLine] = ()

    def compose(self) -> ComposeResult:
        yield Static("", id="logs-filter")
        yield RichLog(id="logs-view", max_lines=SHOWN_LINES, wrap=False, markup=False, highlight=False)

    def passes(self, line: LogLine) -> bool:
        rank = LEVELS.index(line.level) if line.level in LEVELS else LEVELS.index("INFO")
        return (self.process == ALL or line.process == self.process) and rank >= LEVELS.index(self.min_level)

    def show(self, lines: Sequence[LogLine], *, total: int) -> None:
        """Write what is new since the last call (`total` counts every line ever added to `lines`)."""
        for process in sorted({line.process for line in lines}):
            if process not in self.processes:
                self.processes.append(process)
        log = self.query_one(RichLog)
        new = total - self._shown
        if new < 0 or new > len(lines) or lines is not self._lines:
            log.clear()
            new = len(lines)
        self._lines = lines
        start = len(lines) - new
        for i in range(start, len(lines)):
            line = lines[i]
            if self.passes(line):
                log.write(Text.assemble((f"{line.process:<12} ", "cyan"), (f"{line.level:<7} ",
                                        LEVEL_STYLE.get(line.level, "")), line.text))
        self._shown = total
        self.query_one("#logs-filter", Static).update(
            f"process: {self.process}  ·  level ≥ {self.min_level}  ·  p: next process  v: next level")

    def cycle_process(self) -> None:
        self.process = self.processes[(self.processes.index(self.process) + 1) % len(self.processes)]
        self._shown = -1

    def cycle_level(self) -> None:
        self.min_level = LEVELS[(LEVELS.index(self.min_level) + 1) % len(LEVELS)]
        self._shown = -1
