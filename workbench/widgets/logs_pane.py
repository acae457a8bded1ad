"""A run's log lines (log events and the processes' text logs), filtered by process and by lowest level.

The processes are the log events' sources and the run's `logs/<process>.log` files: the launcher, the orchestrator,
the trainer (every rank), each sampler server (`inference`, `inference-2`, ...), a teacher, each environment server
of an isolated environment (`env-<name>`), the W&B mirror. `p` steps through them in that order (`all` first) and
follows the one shown live. The view sits on the Logs tab (`LogsPane`) or beside the charts (`copy_filter` keeps the
two alike)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import RichLog, Static

from prime_lab.runs.events import LEVELS
from prime_lab.workbench.dashboards.event_folds import LogLine
from prime_lab.workbench.widgets.tail_log import TailLog

ALL = "all"
LEVEL_STYLE = {"DEBUG": "dim", "WARNING": "yellow", "ERROR": "bold red", "SUCCESS": "green"}
SHOWN_LINES = 2000
# The order processes are stepped through (by the start of their names; the rest after them, by name).
PROCESS_ORDER = ("launcher", "orchestrator", "trainer", "inference", "teacher", "env-", "gepa", "eval", "wandb")


def process_order(process: str) -> tuple[int, str]:
    rank = next((i for i, start in enumerate(PROCESS_ORDER) if process.startswith(start)), len(PROCESS_ORDER))
    return rank, process


def describe(process: str) -> str:
    """What a process name is, where the name does not say it."""
    if process == "inference":
        return "sampler"
    if process.startswith("inference-"):
        return "sampler " + process.removeprefix("inference-")
    if process.startswith("env-"):
        return "environment server " + process.removeprefix("env-")
    return {"wandb": "W&B mirror", "launcher": "supervisor"}.get(process, "")


class LogsView(Vertical):
    """A run's log lines, filtered; `LogsPane` is the Logs tab's, a plain one sits beside the charts (the pages find
    the Logs tab's by its type)."""

    DEFAULT_CSS = """
    LogsView { height: 1fr; }
    LogsView.beside { width: 1fr; height: 1fr; }
    LogsView .logs-filter { height: 1; padding: 0 1; color: $text-muted; }
    LogsView RichLog { height: 1fr; border: round $primary-darken-2; }
    """
    PART_IDS = False  # its filter line and log have the ids logs-filter and logs-view (the Logs tab's)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.process = ALL
        self.min_level = "DEBUG"
        self.processes: list[str] = [ALL]
        self._shown = 0  # lines of the source already written (when no filter changed)
        self._lines: Sequence[LogLine] = ()

    def compose(self) -> ComposeResult:
        ids = self.PART_IDS
        yield Static("", id="logs-filter" if ids else None, classes="logs-filter", markup=False)
        yield TailLog(id="logs-view" if ids else None, classes="logs-view", max_lines=SHOWN_LINES, wrap=False,
                      markup=False, highlight=False)

    def passes(self, line: LogLine) -> bool:
        rank = LEVELS.index(line.level) if line.level in LEVELS else LEVELS.index("INFO")
        return (self.process == ALL or line.process == self.process) and rank >= LEVELS.index(self.min_level)

    def learn_processes(self, lines: Sequence[LogLine]) -> None:
        """Add the processes of `lines` not known yet, keeping `PROCESS_ORDER`."""
        known = set(self.processes)
        new = {line.process for line in lines} - known
        if new:
            self.processes = [ALL, *sorted(known - {ALL} | new, key=process_order)]

    def show(self, lines: Sequence[LogLine], *, total: int) -> None:
        """Write what is new since the last call (`total` counts every line ever added to `lines`)."""
        self.learn_processes(lines)
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
        what = describe(self.process)
        position = f"{self.processes.index(self.process) + 1}/{len(self.processes)}"
        self.query_one(".logs-filter", Static).update(
            f"process: {self.process}{f' ({what})' if what else ''} {position}  ·  level ≥ {self.min_level}  ·  "
            "p: next process  v: next level")

    def cycle_process(self) -> None:
        self.process = self.processes[(self.processes.index(self.process) + 1) % len(self.processes)]
        self._shown = -1

    def cycle_level(self) -> None:
        self.min_level = LEVELS[(LEVELS.index(self.min_level) + 1) % len(LEVELS)]
        self._shown = -1

    def copy_filter(self, other: LogsView) -> None:
        """Show what `other` shows (its process and lowest level)."""
        self.processes = [ALL, *sorted(set(self.processes + other.processes) - {ALL}, key=process_order)]
        if (self.process, self.min_level) != (other.process, other.min_level):
            self.process, self.min_level = other.process, other.min_level
            self._shown = -1


class LogsPane(LogsView):
    """The Logs tab's log lines."""

    PART_IDS = True
