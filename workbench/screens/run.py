"""A run's page (until the dashboards land): status, progress, the event log tail and, for an evaluation, its
results table. Reads the run's files in a worker: events.jsonl from a byte offset (replayed from zero on open)."""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, ProgressBar, RichLog, Static

from lab.events import Event
from lab.runs import ACTIVE_STATES, Run
from workbench.screens.confirm import ConfirmScreen
from workbench.widgets.runs_table import ago, short_env

if TYPE_CHECKING:
    from workbench.app import LabApp

LOG_LINES = 500
RESULT_ROWS = 200


def event_line(event: Event) -> str:
    """One event as a log line: step, source, and its message or metrics."""
    step = f"step {event.step:>4} " if event.step is not None else ""
    data = event.data or {}
    if event.kind == "log":
        body = f"{data.get('level', 'INFO'):<7} {data.get('message', '')}"
    elif event.kind == "metrics":
        body = "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in data.items())
    elif event.kind == "status":
        body = f"state -> {data.get('state')}" + (f" ({data['reason']})" if data.get("reason") else "")
    else:
        body = json.dumps(data, default=str)[:200]
    return f"{step}[{event.source}] {event.kind}: {body}"


def result_row(record: dict[str, Any]) -> tuple[str, ...]:
    completion = record.get("completion")
    if isinstance(completion, list):
        completion = " ".join(str(m.get("content", "")) for m in completion if isinstance(m, dict))
    reward = record.get("reward")
    return (str(record.get("example_id", "-")), f"{reward:.3f}" if isinstance(reward, (int, float)) else "-",
            str(record.get("answer", ""))[:30], str(completion or "").replace("\n", " ")[:60])


@dataclass
class RunSnapshot:
    status: dict[str, Any]
    lines: list[str] = field(default_factory=list)
    results: list[tuple[str, ...]] = field(default_factory=list)


class RunScreen(Screen[None]):
    BINDINGS = [
        Binding("s", "stop", "Stop", id="run.stop"),
        Binding("x,delete", "delete", "Delete", id="run.delete"),
        Binding("r", "replay", "Replay log", id="run.replay"),
        Binding("escape", "close", "Back", id="run.close"),
    ]

    @dataclass
    class Polled(Message):
        snapshot: RunSnapshot

    def __init__(self, run: Run) -> None:
        super().__init__()
        self.run = run
        self.event_offset = 0
        self.results_offset = 0
        self.lines: deque[str] = deque(maxlen=LOG_LINES)

    @property
    def lab(self) -> LabApp:
        return cast("LabApp", self.app)

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        with Vertical(id="run-page"):
            yield Static("", id="run-status", markup=False)
            yield ProgressBar(id="run-progress", show_eta=False)
            log = RichLog(id="run-log", max_lines=LOG_LINES, wrap=False, markup=False, highlight=False)
            log.border_title = "Events"
            yield log
            results = DataTable[str](id="run-results", cursor_type="row", zebra_stripes=True)
            results.border_title = "Results"
            yield results
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = self.run.id
        self.query_one("#run-results", DataTable).add_columns("example", "reward", "answer", "completion")
        self.poll()
        self.set_interval(self.lab.settings.poll_interval, self.poll)

    def poll(self) -> None:
        self.run_worker(self._read, thread=True, exclusive=True, group="run-poll", exit_on_error=False)

    def _read(self) -> None:
        """In a worker: the status, new events from the byte offset, new result rows."""
        status = self.run.read_status() if not self.run.dir.exists() else self.run.status()
        items, self.event_offset = self.run.event_log().read(self.event_offset)
        snapshot = RunSnapshot(status, [event_line(e) for e in items if isinstance(e, Event)])
        output_dir = status.get("output_dir")
        if status.get("kind") == "eval" and output_dir:
            snapshot.results = self._read_results(Path(output_dir) / "results.jsonl")
        self.post_message(self.Polled(snapshot))

    def _read_results(self, path: Path) -> list[tuple[str, ...]]:
        try:
            with open(path, "rb") as fh:
                fh.seek(self.results_offset)
                chunk = fh.read()
        except OSError:
            return []
        end = chunk.rfind(b"\n")
        if end < 0:
            return []
        self.results_offset += end + 1
        rows = []
        for raw in chunk[: end + 1].splitlines():
            try:
                record = json.loads(raw)
            except ValueError:
                continue
            if isinstance(record, dict):
                rows.append(result_row(record))
        return rows

    def on_run_screen_polled(self, message: RunScreen.Polled) -> None:
        snapshot = message.snapshot
        status = snapshot.status
        envs = ",".join(short_env(e) for e in status.get("envs") or []) or "-"
        started = ago(status.get("started_at") or status.get("created_at"), self.lab.clock())
        reason = f"\n{status['reason']}" if status.get("reason") else ""
        reward = status.get("reward")
        reward_text = f" · reward {reward:.3f}" if isinstance(reward, (int, float)) else ""
        self.query_one("#run-status", Static).update(
            f"{self.run.id} · {status.get('kind', '?')} · {status.get('state', '?')} · {status.get('model') or '-'}"
            f" · {envs} · started {started}{reward_text}{reason}")
        bar = self.query_one(ProgressBar)
        step, max_steps = status.get("step") or 0, status.get("max_steps")
        if isinstance(max_steps, int) and max_steps > 0:
            bar.update(total=max_steps, progress=step)
        elif status.get("state") in ("completed", "failed", "stopped"):
            bar.update(total=1, progress=1)
        log = self.query_one(RichLog)
        for line in snapshot.lines:
            log.write(line)
        table = self.query_one("#run-results", DataTable)
        table.display = status.get("kind") == "eval"
        for row in snapshot.results[: max(0, RESULT_ROWS - table.row_count)]:
            table.add_row(*row)

    def action_replay(self) -> None:
        """Replay the event log from zero."""
        self.event_offset = 0
        self.query_one(RichLog).clear()
        self.poll()

    def action_stop(self) -> None:
        def stop() -> None:
            result = self.lab.registry.stop(self.run.id)
            self.app.call_from_thread(self.notify, result.message)

        self.run_worker(stop, thread=True, group="stop", exit_on_error=False)

    def action_delete(self) -> None:
        active = self.run.state in ACTIVE_STATES

        def answered(yes: bool | None) -> None:
            if yes:
                try:
                    self.lab.registry.delete(self.run.id, force=active)
                except Exception as exc:  # shown, never raised into the UI loop
                    self.lab.report(exc)
                    return
                self.notify(f"Deleted {self.run.id}")
                self.dismiss()

        note = "\nIt is still running: it will be stopped first." if active else ""
        self.app.push_screen(ConfirmScreen(f"Delete run {self.run.id} and its directory?{note}", yes="Delete"),
                             answered)

    def action_close(self) -> None:
        self.dismiss()


