"""A run's page. `RunScreen` is what every run page shares: the stop/delete/replay/back keys and ONE follower thread
(`workbench.dashboards.follower.RunFollower`) that reads the run's status and events.jsonl from a byte offset
(replayed from zero on open), folds new events into the page's model under a lock, and marks it changed; a UI timer
redraws what changed. Once the replay caught up the page is `live` and draws at once (`CaughtUp`). The evaluation page
(`EvalRunScreen`) shows status, progress, the event tail and the results; RL, SFT and GEPA runs get their dashboards
(workbench.screens.dashboard_rl / dashboard_sft / dashboard_gepa, built on `DashboardScreen`).
`workbench.screens.run_pages.page_for(run)` picks the page for a run (this module does not import the dashboards).
"""

from __future__ import annotations

import threading
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.css.query import NoMatches
from textual.message import Message
from textual.widgets import DataTable, Footer, Header, ProgressBar, RichLog, Static, TabbedContent
from textual.worker import get_current_worker

from prime_lab.runs.events import BadLine
from prime_lab.runs.registry import ACTIVE_STATES, Run
from prime_lab.workbench.dashboards.event_folds import EventFold, RawEvent
from prime_lab.workbench.dashboards.files import TextLogs, read_jsonl_from
from prime_lab.workbench.dashboards.follower import RunFollower
from prime_lab.workbench.screens.confirm import ConfirmScreen
from prime_lab.workbench.screens.reporting import ReportingScreen
from prime_lab.workbench.widgets.logs_pane import LogsPane
from prime_lab.workbench.widgets.runs_table import ago, short_env
from prime_lab.workbench.widgets.tail_log import TailLog

if TYPE_CHECKING:
    from prime_lab.workbench.app import LabApp

LOG_LINES = 500
RESULT_ROWS = 200


def result_row(record: dict[str, Any]) -> tuple[str, ...]:
    completion = record.get("completion")
    if isinstance(completion, list):
        completion = " ".join(str(m.get("content", "")) for m in completion if isinstance(m, dict))
    reward = record.get("reward")
    return (str(record.get("example_id", "-")), f"{reward:.3f}" if isinstance(reward, (int, float)) else "-",
            str(record.get("answer", ""))[:30], str(completion or "").replace("\n", " ")[:60])


def status_line(run: Run, status: dict[str, Any], now: float) -> str:
    envs = ",".join(short_env(e) for e in status.get("envs") or []) or "-"
    started = ago(status.get("started_at") or status.get("created_at"), now)
    return (f"{run.id} · {status.get('kind', '?')} · {status.get('state', '?')} · {status.get('model') or '-'}"
            f" · {envs} · started {started}")


class RunScreen(ReportingScreen):
    """The keys and the follower every run page shares. Subclasses fold events in `consume` (follower thread, under
    `self.fold_lock`) and redraw in `redraw` (UI thread, under the same lock, only after a change)."""

    BINDINGS = [
        Binding("s", "stop", "Stop", id="run.stop"),
        Binding("x,delete", "delete", "Delete", id="run.delete"),
        Binding("r", "replay", "Replay log", id="run.replay"),
        Binding("escape", "close", "Back", id="run.close"),
    ]

    class CaughtUp(Message):
        """The follower has folded everything the log held when the page opened (or was replayed)."""

    class Deleted(Message):
        """The delete worker removed the run: the page closes."""

    def __init__(self, run: Run) -> None:
        super().__init__()
        self.run = run
        self.follower = RunFollower(run, self)
        self.shown_live = False  # drawn since it went live: the page shows the whole replay (tests, the bench)
        self._deleting = False

    @property
    def lab(self) -> LabApp:
        return cast("LabApp", self.app)

    # What the follower thread writes (read under `fold_lock`) -------------------------------------------------
    @property
    def fold_lock(self) -> threading.Lock:
        return self.follower.lock

    @property
    def changed(self) -> threading.Event:
        return self.follower.changed

    @property
    def status(self) -> dict[str, Any]:
        return self.follower.status

    @property
    def live(self) -> bool:
        """False while replaying what the log held when the page opened (or on `r`)."""
        return self.follower.live

    @property
    def bad_lines(self) -> int:
        return self.follower.bad_lines

    @property
    def event_offset(self) -> int:
        return self.follower.event_offset

    @property
    def tail(self) -> deque[str]:
        """Event lines not yet written to the page's event log."""
        return self.follower.tail

    def on_mount(self) -> None:
        self.sub_title = self.run.id
        self.follower.start_apart()  # (a large log: a child process folds it while the page lays itself out)
        # The follower starts once the page is laid out and drawn: its thread and the mounting of the page's
        # widgets would share the GIL, and the page (and a key pressed on it) would wait for the replay.
        self.call_after_refresh(self._start_following)
        self.set_interval(self.lab.settings.poll_interval, self._refresh_if_changed)

    def _start_following(self) -> None:
        self.run_worker(self._follow, thread=True, exclusive=True, group="run-follow", exit_on_error=False)

    def _follow(self) -> None:
        worker = get_current_worker()
        self.follower.follow(self.lab.settings.poll_interval, lambda: worker.is_cancelled,
                             lambda: self.post_message(self.CaughtUp()))  # draw it all now, not at the next poll

    def replay_note(self) -> str:
        """While the log is replayed: how far it got, for the page's status line."""
        return self.follower.replay_note()

    def on_run_screen_caught_up(self) -> None:
        self.refresh_now()

    def reset(self) -> None:
        """Forget what was folded (replay). Called with the lock held."""

    def consume(self, items: list[RawEvent | BadLine]) -> None:
        """Fold new events (follower thread, lock held)."""

    def follow_files(self) -> None:
        """Read other growing files of the run (follower thread, lock NOT held)."""

    def apart(self) -> str | None:
        """The model class a large log's replay folds into in a child process (None: folded here)."""
        return None

    def adopt(self, model: object) -> bool:
        """Take the model a child process folded (lock held)."""
        return False

    def _refresh_if_changed(self) -> None:
        if not self.changed.is_set():
            return
        self.changed.clear()
        with self.fold_lock:
            self.redraw()  # each page says how many corrupt lines it skipped (bad_lines) in its status line
            self.shown_live = self.live

    def redraw(self) -> None:
        """Show what changed (UI thread, lock held)."""

    def write_tail(self, log: RichLog) -> None:
        """Write the new event lines (UI thread, lock held); after a replay, start the log over."""
        follower = self.follower
        if follower.clear_tail:
            log.clear()
            follower.clear_tail = False
        if follower.tail:
            log.write("\n".join(follower.tail))  # one write: RichLog measures and lays out per call
        follower.tail.clear()

    def refresh_now(self) -> None:
        """Redraw at once (after a key changed what is shown)."""
        self.changed.set()
        self._refresh_if_changed()

    # Keys ---------------------------------------------------------------------------------------------------
    def action_replay(self) -> None:
        """Replay the event log from zero."""
        self.follower.replay()

    def action_stop(self) -> None:
        app = self.lab  # (taken here: once the page is closed, a worker thread cannot reach the app through it)

        def stop() -> None:
            result = app.registry.stop(self.run.id)
            app.call_from_thread(app.notify, result.message)

        self.run_worker(stop, thread=True, group="stop", exit_on_error=False)

    def action_delete(self) -> None:
        if self._deleting:
            self.notify(f"Already deleting {self.run.id}")
            return
        active = self.run.state in ACTIVE_STATES

        def answered(yes: bool | None) -> None:
            if yes:
                self._deleting = True
                app = self.lab
                self.run_worker(lambda: self._delete(app, active), thread=True, group="delete", exit_on_error=False)

        note = "\nIt is still running: it will be stopped first." if active else ""
        self.app.push_screen(ConfirmScreen(f"Delete run {self.run.id} and its directory?{note}", yes="Delete"),
                             answered)

    def _delete(self, app: LabApp, force: bool) -> None:
        """Delete the run (worker thread: an active run is stopped first, which can take the stop's grace period).
        `app` is passed in: the user may close the page meanwhile, and a closed page no longer reaches it."""
        try:
            app.registry.delete(self.run.id, force=force)
        except Exception as exc:  # shown, never raised into the UI loop
            app.call_from_thread(self._delete_failed, exc)
            return
        app.call_from_thread(app.notify, f"Deleted {self.run.id}")
        self.post_message(self.Deleted())

    def _delete_failed(self, error: Exception) -> None:
        self._deleting = False
        self.lab.report(error)

    def on_run_screen_deleted(self) -> None:
        if self.is_current:  # not when a modal covers the page (nor once the user closed it: no message then)
            self.dismiss()

    def action_close(self) -> None:
        self.dismiss()

    # Shared pieces ------------------------------------------------------------------------------------------
    def update_progress(self, bar: ProgressBar) -> None:
        status = self.status
        step, max_steps = status.get("step") or 0, status.get("max_steps")
        if isinstance(max_steps, int) and max_steps > 0:
            bar.update(total=max_steps, progress=step)
        elif status.get("state") in ("completed", "failed", "stopped"):
            bar.update(total=1, progress=1)


class DashboardScreen(RunScreen):
    """A run page with tabs (`1`..`4`) whose keys are live only on their tab (`TAB_ACTIONS`), and a logs pane that
    shows the log events and the processes' text logs, both folded into the page's `model`."""

    TAB_ACTIONS: dict[str, set[str]] = {}
    model: EventFold

    def __init__(self, run: Run) -> None:
        super().__init__(run)
        self.text_logs = TextLogs(run.logs_dir)

    def follow_files(self) -> None:
        lines = self.text_logs.read()
        with self.fold_lock:
            for process, chunk in lines:
                self.model.add_log_lines(process, chunk)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        for tab, actions in self.TAB_ACTIONS.items():
            if action in actions:
                try:
                    return self.query_one(TabbedContent).active == tab
                except NoMatches:  # before compose
                    return False
        return True

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        self.refresh_bindings()
        self.refresh_now()

    def action_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab

    def action_next_process(self) -> None:
        """Show the next process's log lines (or all)."""
        self.query_one(LogsPane).cycle_process()
        self.refresh_now()

    def action_next_level(self) -> None:
        """Raise the lowest level shown (wrapping around)."""
        self.query_one(LogsPane).cycle_level()
        self.refresh_now()


class EvalRunScreen(RunScreen):
    """An evaluation's page (and any run without a dashboard): status, progress, event tail, results."""

    def __init__(self, run: Run) -> None:
        super().__init__(run)
        self.results_offset = 0
        self.new_results: list[tuple[str, ...]] = []

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        with Vertical(id="run-page"):
            yield Static("", id="run-status", markup=False)
            yield ProgressBar(id="run-progress", show_eta=False)
            log = TailLog(id="run-log", max_lines=LOG_LINES, wrap=False, markup=False, highlight=False)
            log.border_title = "Events"
            yield log
            results = DataTable[str](id="run-results", cursor_type="row", zebra_stripes=True)
            results.border_title = "Results"
            yield results
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#run-results", DataTable).add_columns("example", "reward", "answer", "completion")

    def follow_files(self) -> None:
        output_dir = self.status.get("output_dir")
        if self.status.get("kind") == "eval" and output_dir and self.results_offset >= 0:
            records, self.results_offset = read_jsonl_from(Path(output_dir) / "results.jsonl", self.results_offset)
            with self.fold_lock:
                self.new_results.extend(result_row(r) for r in records)

    def redraw(self) -> None:
        status = self.status
        reason = f"\n{status['reason']}" if status.get("reason") else ""
        if self.bad_lines:
            reason += f"\n{self.bad_lines} corrupt line(s) in events.jsonl skipped"
        reward = status.get("reward")
        reward_text = f" · reward {reward:.3f}" if isinstance(reward, (int, float)) else ""
        self.query_one("#run-status", Static).update(status_line(self.run, status, self.lab.clock()) +
                                                     reward_text + reason)
        self.update_progress(self.query_one(ProgressBar))
        self.write_tail(self.query_one(RichLog))
        table = self.query_one("#run-results", DataTable)
        table.display = status.get("kind") == "eval"
        for row in self.new_results[: max(0, RESULT_ROWS - table.row_count)]:
            table.add_row(*row)
        self.new_results.clear()

