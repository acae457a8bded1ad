"""A screen whose workers' errors reach the user: Textual posts `Worker.StateChanged` to the worker's own node and
does not bubble it, so the app's handler (`LabApp.report`) never sees a screen's failed worker by itself."""

from __future__ import annotations

from typing import Any

from textual.screen import Screen
from textual.worker import Worker, WorkerState


class ReportingScreen(Screen[None]):
    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        report: Any = getattr(self.app, "report", None)
        if event.state == WorkerState.ERROR and event.worker.error is not None and report is not None:
            report(event.worker.error)
