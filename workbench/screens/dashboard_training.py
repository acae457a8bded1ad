"""What the RL and SFT run pages add to the charts dashboard (workbench.screens.dashboard_charts): the health line
above the tabs (monitors/health.py: errored rollouts, who waits on whom, the mismatch KL's trend, grad-norm spikes;
hidden until the run logged one of them), a System tab after Logs (each process's CPU, memory and threads and each
GPU, from the run's `system` events), and the logs beside the charts (`l`: a second logs pane at the Charts tab's
side, following live, with the Logs tab's `p` and `v`).

A page that uses it lists `("system", "System")` last among its tabs in `dashboard_bindings` and `LOGS_BESIDE` among
its extra keys."""

from __future__ import annotations

from typing import cast

from textual.app import ComposeResult
from textual.binding import Binding
from textual.widget import Widget
from textual.widgets import TabbedContent, TabPane

from prime_lab.monitors.alerts import AlertMonitor
from prime_lab.monitors.health import HealthTracker
from prime_lab.runs.events import BadLine
from prime_lab.runs.registry import FINAL_STATES, Run
from prime_lab.workbench.dashboards.event_folds import RawEvent
from prime_lab.workbench.dashboards.system_model import SystemModel
from prime_lab.workbench.screens.dashboard_charts import ChartsDashboard, M
from prime_lab.workbench.widgets.health_line import HealthLine
from prime_lab.workbench.widgets.logs_pane import LogsPane, LogsView
from prime_lab.workbench.widgets.system_pane import SystemPane

LOG_ACTIONS = ("next_process", "next_level")


def logs_beside_binding(prefix: str) -> Binding:
    return Binding("l", "logs_beside", "Logs beside", id=f"{prefix}.logs_beside")


class TrainingDashboard(ChartsDashboard[M]):
    """A training run's page with a health line, a System tab and the logs beside the charts."""

    def __init__(self, run: Run) -> None:
        super().__init__(run)
        self.health = self.new_health()  # (folded under the lock, like the model)
        self.system = SystemModel()
        self.logs_beside = False

    # Layout -------------------------------------------------------------------------------------------------
    def compose_top(self) -> ComposeResult:
        yield HealthLine(id="health-line")

    def on_mount(self) -> None:
        """The System tab after Logs (the tabs keep their numbers) and the logs pane beside the tabs, hidden (both
        mounted by the time the follower's first events are drawn)."""
        tabs = self.query_one(TabbedContent)
        tabs.add_pane(TabPane("System", SystemPane(id="system-pane"), id="system"))
        beside = LogsView(id="side-logs", classes="beside")
        beside.display = False
        cast(Widget, tabs.parent).mount(beside, after=tabs)

    @property
    def side_logs(self) -> LogsView:
        return self.query_one("#side-logs", LogsView)

    def side_logs_shown(self) -> bool:
        return self.logs_beside and self.query_one(TabbedContent).active == "charts"

    # Following ----------------------------------------------------------------------------------------------
    def reset(self) -> None:
        super().reset()
        self.health = self.new_health()
        self.system = SystemModel()

    def new_health(self) -> HealthTracker:
        """A tracker on the model's own alert monitor where it has one (an RL run's folds every metric already),
        else on one of its own."""
        monitor = getattr(self.model, "monitor", None)
        return HealthTracker(monitor=monitor if isinstance(monitor, AlertMonitor) else None)

    def consume(self, items: list[RawEvent | BadLine]) -> None:
        super().consume(items)
        health, system = self.health, self.system
        for item in items:
            if isinstance(item, BadLine):
                continue
            kind = item["kind"]
            if kind == "metrics":
                data, step = item.get("data"), item.get("step")
                if data.__class__ is dict:
                    health.observe_metrics(data, step if isinstance(step, int) else None)
            elif kind == "system":
                system.add(item.get("data"), item.get("time"))

    # Drawing ------------------------------------------------------------------------------------------------
    def redraw(self) -> None:
        super().redraw()
        if not self.live:
            return
        self.query_one(HealthLine).show(self.health.health())
        active = self.query_one(TabbedContent).active
        if active == "system":  # (the tab is there: it was activated)
            self.query_one(SystemPane).show(self.system, ended=self.status.get("state") in FINAL_STATES)
        if self.side_logs_shown():
            self.side_logs.show(self.model.logs, total=self.model.log_total)

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        self.place_side_logs()

    def place_side_logs(self) -> None:
        shown = self.side_logs_shown()
        found = self.query("#side-logs").results(LogsView)  # (none yet when the first tab is activated)
        side = next(found, None)
        if side is not None and side.display != shown:
            side.display = shown
            self.call_after_refresh(self.on_resize)  # the charts' columns follow the width left to them

    # Keys ---------------------------------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in LOG_ACTIONS and self.side_logs_shown():
            return True
        return super().check_action(action, parameters)

    def action_logs_beside(self) -> None:
        """Show or hide the logs beside the charts."""
        self.logs_beside = not self.logs_beside
        if self.logs_beside and self.query_one(TabbedContent).active != "charts":
            self.query_one(TabbedContent).active = "charts"  # (placed when the tab is activated)
        self.place_side_logs()
        self.refresh_bindings()
        self.show_logs()

    def shown_logs(self) -> tuple[LogsView, LogsView]:
        """The logs pane the keys act on (beside the charts, or the Logs tab's) and the other one."""
        tab, side = self.query_one(LogsPane), self.side_logs
        return (side, tab) if self.side_logs_shown() else (tab, side)

    def show_logs(self) -> None:
        """Redraw the logs pane shown now, and nothing else (the charts beside it stay as they are)."""
        shown, _ = self.shown_logs()
        if self.live and (self.side_logs_shown() or self.query_one(TabbedContent).active == "logs"):
            with self.fold_lock:
                shown.show(self.model.logs, total=self.model.log_total)

    def action_next_process(self) -> None:
        """Show the next process's log lines (or all)."""
        shown, other = self.shown_logs()
        shown.cycle_process()
        other.copy_filter(shown)
        self.show_logs()

    def action_next_level(self) -> None:
        """Raise the lowest level shown (wrapping around)."""
        shown, other = self.shown_logs()
        shown.cycle_level()
        other.copy_filter(shown)
        self.show_logs()
