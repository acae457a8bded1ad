"""Home: the configs found here and the runs in the registry, with keys to open, edit, duplicate, launch, stop,
delete and open a run, and to mark evaluations and compare them (workbench.screens.compare)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, cast

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import DataTable, Footer, Header

from prime_lab.runs.registry import ACTIVE_STATES
from prime_lab.workbench.config_document import ConfigDocument
from prime_lab.workbench.launch import LaunchError, config_argv, first_use_note
from prime_lab.workbench.screens.confirm import ConfirmScreen
from prime_lab.workbench.screens.launch_eval import LaunchEvalScreen
from prime_lab.workbench.screens.reporting import ReportingScreen
from prime_lab.workbench.widgets.config_list import ConfigList
from prime_lab.workbench.widgets.runs_table import RunsTable

if TYPE_CHECKING:
    from prime_lab.workbench.app import LabApp
    from prime_lab.workbench.launch import EvalRequest

CONFIG_ACTIONS = {"open", "edit", "duplicate", "launch"}
RUN_ACTIONS = {"open", "stop", "delete", "mark"}


def duplicate_path(path: Path) -> Path:
    """`name-copy.toml`, `name-copy2.toml`, ... next to the original."""
    stem = path.stem
    candidate = path.with_name(f"{stem}-copy.toml")
    number = 2
    while candidate.exists():
        candidate = path.with_name(f"{stem}-copy{number}.toml")
        number += 1
    return candidate


class HomeScreen(ReportingScreen):
    BINDINGS = [
        Binding("enter", "open", "Open", id="home.open", priority=True),
        Binding("e", "edit", "Edit", id="home.edit"),
        Binding("d", "duplicate", "Duplicate", id="home.duplicate"),
        Binding("l", "launch", "Launch", id="home.launch"),
        Binding("n", "new_eval", "Eval", id="home.new_eval"),
        Binding("s", "stop", "Stop", id="home.stop"),
        Binding("x,delete", "delete", "Delete", id="home.delete"),
        Binding("r", "refresh", "Refresh", id="home.refresh"),
        Binding("space", "mark", "Mark", id="home.mark"),
        Binding("c", "compare", "Compare", id="home.compare"),
    ]

    @property
    def lab(self) -> LabApp:
        return cast("LabApp", self.app)

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        with Vertical(id="home"):
            configs = ConfigList(self.lab.settings.root, id="configs")
            configs.border_title = "Configs"
            yield configs
            runs = RunsTable(self.lab.registry, clock=self.lab.clock, id="runs")
            runs.border_title = "Runs"
            yield runs
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(ConfigList).focus()
        self.set_interval(self.lab.settings.poll_interval * 4, self._refresh_runs)

    def on_screen_resume(self) -> None:
        self.action_refresh()

    def _refresh_runs(self) -> None:
        if self.is_active:  # (not is_current: that is also true beneath a run page, where nobody sees the table)
            self.query_one(RunsTable).refresh_runs()

    def on_descendant_focus(self, event: events.DescendantFocus) -> None:
        self.refresh_bindings()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self.refresh_bindings()

    # What works here: config keys on the config list, run keys on the runs table ---------------------------
    def _pane(self) -> str:
        focused = self.focused
        return "runs" if isinstance(focused, RunsTable) else "configs"

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "compare":  # on the runs, or wherever once evaluations are marked
            return self._pane() == "runs" or bool(self.query_one(RunsTable).marked)
        if action not in CONFIG_ACTIONS | RUN_ACTIONS:
            return True
        if self._pane() == "runs":
            return action in RUN_ACTIONS and self.query_one(RunsTable).selected_run() is not None
        return action in CONFIG_ACTIONS and self.query_one(ConfigList).selected_config() is not None

    def _config(self) -> Path | None:
        return self.query_one(ConfigList).selected_config()

    def _run_id(self) -> str | None:
        return self.query_one(RunsTable).selected_run()

    # Actions ------------------------------------------------------------------------------------------------
    def action_open(self) -> None:
        if self._pane() == "runs":
            run_id = self._run_id()
            if run_id:
                self.lab.open_run(run_id)
        elif (path := self._config()) is not None:
            self.lab.open_config(path)

    def action_edit(self) -> None:
        if (path := self._config()) is not None:
            self.lab.open_config(path, focus_toml=True)

    def action_duplicate(self) -> None:
        path = self._config()
        if path is None:
            return
        target = duplicate_path(path)
        try:
            shutil.copyfile(path, target)
        except OSError as exc:
            self.lab.report(f"cannot duplicate {path.name}: {exc}")
            return
        self.query_one(ConfigList).refresh_configs(select=target)
        self.notify(f"Duplicated as {target.name}")

    def action_launch(self) -> None:
        path = self._config()
        if path is None:
            return
        try:
            document = ConfigDocument.load(path)
            if document.errors:
                first = document.errors[0]
                raise LaunchError(f"{path.name} has {len(document.errors)} problem(s), first: {first.format()}; "
                                  "open it (enter) to fix")
            argv = config_argv(document.kind, path)
            # RL and SFT always build their model locally (the trainer needs it); eval and GEPA only without a base_url
            self._launch(argv, document.model_name(),
                         served_locally=document.kind in ("rl", "sft") or not document.get(("base_url",)))
        except (LaunchError, OSError) as exc:
            self.lab.report(exc)

    def _launch(self, argv: list[str], model: object, *, served_locally: bool) -> None:
        """Launch, first saying so when the command has a model to build before its run exists (~20 s)."""
        note = first_use_note(model, served_locally=served_locally)
        if note is not None:
            self.notify(note, title="First use", timeout=25)
        self.lab.start_launch(argv)

    def action_new_eval(self) -> None:
        env_id = model = None
        path = self._config()
        if path is not None and self._pane() == "configs":
            try:
                document = ConfigDocument.load(path)
                envs = document.env_entries()
                env_id = str(envs[0].get("id")) if envs else None
                model = document.model_name()
            except OSError:
                pass

        def launch(request: EvalRequest | None) -> None:
            if request is not None:
                self._launch(request.argv(), request.model, served_locally=request.base_url is None)

        self.app.push_screen(LaunchEvalScreen(env_id, model if isinstance(model, str) else None,
                                              blink=self.lab.blink), launch)

    def action_stop(self) -> None:
        run_id = self._run_id()
        if run_id is None:
            return

        def stop() -> None:
            result = self.lab.registry.stop(run_id)
            self.app.call_from_thread(self.notify, result.message)
            self.app.call_from_thread(self.action_refresh)

        self.run_worker(stop, thread=True, group="stop", exit_on_error=False)

    def action_delete(self) -> None:
        run_id = self._run_id()
        if run_id is None:
            return
        state = self.lab.registry.get(run_id).state
        active = state in ACTIVE_STATES
        question = f"Delete run {run_id} ({state}) and its directory?" + (
            "\nIt is still running: it will be stopped first." if active else "")

        def answered(yes: bool | None) -> None:
            if yes:
                self.run_worker(lambda: self._delete(run_id, active), thread=True, group="delete",
                                exit_on_error=False)

        self.app.push_screen(ConfirmScreen(question, yes="Delete"), answered)

    def _delete(self, run_id: str, force: bool) -> None:
        self.lab.registry.delete(run_id, force=force)
        self.app.call_from_thread(self.notify, f"Deleted {run_id}")
        self.app.call_from_thread(self.action_refresh)

    def action_mark(self) -> None:
        """Mark the evaluation under the cursor for comparison (again: unmark it)."""
        run_id = self._run_id()
        if run_id is None:
            return
        table = self.query_one(RunsTable)
        kind = self.lab.registry.get(run_id).read_status().get("kind")
        if kind != "eval" and run_id not in table.marked:
            hint = f": evaluate its policy with `prime eval run ENV --adapter {run_id}`" if kind in ("rl", "sft") \
                else ""
            self.notify(f"{run_id} is a {kind} run; only evaluations are compared{hint}", severity="warning")
            return
        table.toggle_mark(run_id)
        self.refresh_bindings()

    def action_compare(self) -> None:
        """Compare the marked evaluations against the first marked."""
        from prime_lab.workbench.screens.compare import CompareScreen

        marked = list(self.query_one(RunsTable).marked)
        if len(marked) < 2:
            self.notify("Mark two evaluations or more (space on the runs), then compare (c)")
            return
        self.app.push_screen(CompareScreen(marked))

    def action_refresh(self) -> None:
        self.query_one(ConfigList).refresh_configs()
        self.query_one(RunsTable).refresh_runs()
        self.refresh_bindings()
