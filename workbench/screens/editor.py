"""The config editor: the form and the raw TOML, two synchronised views of ONE tomlkit document, validated live
with the CLI's problems collector.

Three panes take the focus: the form (a field's control), the TOML and the problems. The one holding it has an accent
border and a reversed title; ctrl+t moves it to the other view, ctrl+g to the problems and back."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, cast

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.color import Color
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Header, Static, TextArea

from prime_lab.envs import EnvInfo
from prime_lab.problems.validation import Problem
from prime_lab.workbench.config_document import ConfigDocument, schema_for
from prime_lab.workbench.launch import LaunchError, config_argv, run_to_end
from prime_lab.workbench.screens.confirm import ConfirmScreen
from prime_lab.workbench.screens.pick_env import PickEnvScreen
from prime_lab.workbench.widgets.config_form import ConfigForm, FieldRow
from prime_lab.workbench.widgets.key_footer import KeyFooter
from prime_lab.workbench.widgets.problems_panel import ProblemsPanel
from prime_lab.workbench.widgets.toml_editor import TomlEditor

if TYPE_CHECKING:
    from prime_lab.workbench.app import LabApp

NARROW = 110  # below this width one view shows at a time (ctrl+t switches)
PANES = ("form", "toml", "problems")
FOCUSED_BORDER = ("border_top", "border_right", "border_bottom", "border_left", "border_title_style")


class EditorScreen(Screen[None]):
    AUTO_FOCUS = ""  # the editor puts the focus itself (_focus_view)
    BINDINGS = [
        Binding("ctrl+s", "save", "Save", id="editor.save", priority=True),
        Binding("ctrl+r", "launch", "Launch", id="editor.launch", priority=True),
        Binding("ctrl+t", "toggle_view", "Form/TOML", id="editor.toggle_view", priority=True),
        Binding("ctrl+g", "problems", "Problems", id="editor.problems", priority=True),
        # shown while an owner/name environment the config names is not installed (its problem line names the key)
        Binding("ctrl+o", "install_envs", "Install env", id="editor.install_envs", priority=True),
        Binding("escape", "close", "Back", id="editor.close"),
        Binding("q", "quit", "Quit", id="editor.quit"),  # (typed into a field, q is text; elsewhere it quits)
    ]

    def __init__(self, path: Path, *, focus_toml: bool = False) -> None:
        super().__init__()
        self.document = ConfigDocument.load(path)
        self.view = "toml" if focus_toml else "form"  # the view ctrl+t left the focus in (alone on screen if narrow)
        self._narrow = False
        self._focused_pane: Widget | None = None
        self._status = ""
        self._syncing = False
        self._installed: dict[str, bool] = {}  # environment id -> whether it resolves here (asked once per id)
        self._missing: list[str] = []  # the owner/name ids the config names that are not installed
        self._installing = False

    @property
    def lab(self) -> LabApp:
        return cast("LabApp", self.app)

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        yield Static("", id="editor-status", markup=False)
        with Horizontal(id="editor-views"):
            form = ConfigForm(schema_for(self.document.kind), blink=self.lab.blink, id="form")
            form.border_title = "Form"
            yield form
            toml = TomlEditor(self.document.text, blink=self.lab.blink, id="toml")
            toml.border_title = "TOML"
            yield toml
        with Vertical(id="problems-box"):
            yield ProblemsPanel(id="problems")
        yield KeyFooter()

    async def on_mount(self) -> None:
        self.sub_title = str(self.document.path.name)
        await self._show_document(update_text=False)
        self._focus_view()  # the form: marked now, its first field focused once mounted
        self.call_after_refresh(self._populate_form)

    async def _populate_form(self) -> None:
        form = self.query_one(ConfigForm)
        await form.populate()
        await self._show_document(update_text=False)
        if self.focused is None:
            self._focus_view()

    def on_resize(self, event: events.Resize) -> None:
        self._narrow = event.size.width < NARROW
        self._show_views()

    def _show_views(self) -> None:
        """Both views, or below NARROW columns the current one. Set on the two views alone: a class on the screen
        restyles every widget of the form (~1 s on 2 cores)."""
        try:
            form, toml = self.query_one(ConfigForm), self.query_one(TomlEditor)
        except NoMatches:
            return
        form.display = not self._narrow or self.view == "form"
        toml.display = not self._narrow or self.view == "toml"

    def _focus_view(self) -> None:
        """Focus the current view: the TOML, or the form's field focused last (its first shown field)."""
        self._show_views()
        if self.view == "toml":
            self.query_one(TomlEditor).focus()
            return
        form = self.query_one(ConfigForm)
        target = form.focus_target() or (form if form.can_focus else None)
        if target is None:  # fields not mounted yet: nothing takes keys, the pane shows where they will go
            self.set_focus(None)
            self._mark_focused(form)
        else:
            target.focus()

    # Focus: the pane holding it is marked -----------------------------------------------------------------------
    def on_descendant_focus(self, event: events.DescendantFocus) -> None:
        pane = next((node for node in event.widget.ancestors_with_self if node.id in PANES), None)
        if not isinstance(pane, Widget):
            return
        if pane.id in ("form", "toml") and pane.id != self.view:  # focused by a click or tab: ctrl+t goes on from it
            self.view = pane.id
            self._show_views()
        self._mark_focused(pane)

    def _mark_focused(self, pane: Widget) -> None:
        """Give the focused pane the accent border and a reversed title, taking them from the one before. Set inline
        on the pane alone: a class (or :focus-within) on the form restyles its hundreds of widgets at every focus
        change, ~0.5 s on 2 cores."""
        before = self._focused_pane
        if pane is before:
            return
        if before is not None:
            for rule in FOCUSED_BORDER:
                before.styles.clear_rule(rule)
            before.refresh()
        pane.styles.border = ("round", Color.parse(self.app.get_css_variables()["accent"]))
        pane.styles.border_title_style = "bold reverse"
        self._focused_pane = pane

    # Sync: every edit goes into the document, then both views and the problems show it ---------------------
    async def _show_document(self, *, update_text: bool = True) -> None:
        document = self.document
        with self.app.batch_update():  # one layout for it all (each is ~0.1 s with the RL form's widgets)
            self._syncing = True
            try:
                if update_text:
                    self.query_one(TomlEditor).replace_text(document.text)
                await self.query_one(ConfigForm).show(document)
            finally:
                self._syncing = False
            self.query_one(ProblemsPanel).show([*(document.problems or []), *self._env_notes()])
            errors = len(document.errors)
            state = "modified" if document.dirty else "saved"
            verdict = "valid" if not errors else f"{errors} error{'s' if errors != 1 else ''}"
            status = f" {document.path.name} · {document.kind} config · {state} · {verdict}"
            if status != self._status:  # (an update lays out the whole screen again: not at every keystroke)
                self._status = status
                self.query_one("#editor-status", Static).update(status)

    async def on_text_area_changed(self, event: TextArea.Changed) -> None:
        if self._syncing or event.text_area.text == self.document.text:  # (the echo of a form edit: shown already)
            return
        self.document.set_text(event.text_area.text)
        await self._show_document(update_text=False)

    async def on_field_row_edited(self, event: FieldRow.Edited) -> None:
        self.document.set_value(event.path, event.value)
        await self._show_document()

    async def on_config_form_env_action(self, event: ConfigForm.EnvAction) -> None:
        if event.action == "add":
            await self.app.push_screen(PickEnvScreen(), self._add_env)
            return
        if event.index is None:
            return
        if event.action == "remove":
            self.document.remove_env(event.index)
        else:
            self.document.move_env(event.index, event.offset)
        await self._show_document()

    async def _add_env(self, env: EnvInfo | None) -> None:
        if env is None:
            return
        defaults = {a.name: a.default for a in env.args if not a.required and isinstance(a.default, (int, float, str))}
        self.document.add_env(env.id, defaults)
        await self._show_document()

    def on_problems_panel_jump_to(self, event: ProblemsPanel.JumpTo) -> None:
        self.view = "toml"
        self._show_views()
        self.query_one(TomlEditor).jump_to_line(event.line)

    # Actions ------------------------------------------------------------------------------------------------
    def action_save(self) -> None:
        try:
            self.document.save()
        except OSError as exc:
            self.lab.report(f"cannot save {self.document.path}: {exc}")
            return
        errors = len(self.document.errors)
        if errors:
            self.notify(f"Saved with {errors} problem(s): it will not launch until they are fixed",
                        severity="warning")
        else:
            self.notify(f"Saved {self.document.path.name}")
        self.run_worker(self._show_document(update_text=False), exit_on_error=False)

    def action_launch(self) -> None:
        document = self.document
        if document.errors:
            self.lab.report(f"cannot launch: {len(document.errors)} problem(s) (ctrl+g shows them)")
            return
        if document.dirty:
            self.lab.report("save first (ctrl+s): a launch runs the file on disk")
            return
        try:
            self.lab.start_launch(config_argv(document.kind, document.path))
        except LaunchError as exc:
            self.lab.report(exc)

    # Environments the config names that are not installed: a note each, ctrl+o installs them -----------------
    def _env_notes(self) -> list[Problem]:
        """A note on each `owner/name` environment id the config names that no installed environment answers, saying
        that ctrl+o installs it (`prime env install ID`, as the CLI names it)."""
        from prime_lab.envs.envs_hub import parse_id
        from prime_lab.problems.toml_lines import KeyLocator, dotted
        from prime_lab.workspace.doctor import env_references

        data = self.document.doc.unwrap() if self.document.doc is not None else {}
        missing = [(path, env_id) for path, env_id in env_references(data)
                   if parse_id(env_id) is not None and not self._resolves(env_id)]
        ids = list(dict.fromkeys(env_id for _, env_id in missing))
        if ids != self._missing:
            self._missing = ids
            self.refresh_bindings()
        if not missing:
            return []
        locator = KeyLocator(self.document.text)
        return [Problem(dotted(path), f"{env_id} is not installed: ctrl+o installs it from the Environments Hub "
                        f"(prime env install {env_id})", locator.line_of(path), severity="note")
                for path, env_id in missing]

    def _resolves(self, env_id: str) -> bool:
        from prime_lab.envs import EnvironmentLoadError
        from prime_lab.envs.loader import resolve

        if env_id not in self._installed:
            try:
                resolve(env_id)
                self._installed[env_id] = True
            except EnvironmentLoadError:
                self._installed[env_id] = False
        return self._installed[env_id]

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return bool(self._missing) if action == "install_envs" else True

    def action_install_envs(self) -> None:
        """`prime env install ID` for each environment the notes name, one after another, as the CLI runs it."""
        if not self._missing:
            return
        if self._installing:
            self.notify("an install is running: its result shows when it ends")
            return
        self._installing = True
        ids = list(self._missing)
        self.notify(f"Installing: prime env install {' '.join(ids)}", timeout=4)
        self.run_worker(lambda: self._install(ids), thread=True, group="install-envs", exit_on_error=False)

    def _install(self, ids: list[str]) -> None:
        try:
            for env_id in ids:
                code, said = run_to_end(["env", "install", env_id], cwd=self.lab.settings.root)
                if code != 0:
                    self.app.call_from_thread(self.lab.report, f"prime env install {env_id} failed: {said}")
                    return
                self.app.call_from_thread(self.notify, f"Installed {env_id}")
        finally:
            self._installing = False
            self.app.call_from_thread(self._recheck)

    def _recheck(self) -> None:
        import importlib

        importlib.invalidate_caches()
        self._installed.clear()
        self.run_worker(self._show_document(update_text=False), exit_on_error=False)

    def action_toggle_view(self) -> None:
        self.view = "toml" if self.view == "form" else "form"
        self._focus_view()

    def action_problems(self) -> None:
        """To the problems, or from them back to the view."""
        problems = self.query_one(ProblemsPanel)
        if problems.has_focus:
            self._focus_view()
        else:
            problems.focus()

    def action_close(self) -> None:
        self._unless_unsaved(self.dismiss)

    def action_quit(self) -> None:
        """Quit the app; with unsaved edits, only once the user says to discard them."""
        self._unless_unsaved(self.app.exit)

    def _unless_unsaved(self, then: Callable[[], object]) -> None:
        if not self.document.dirty:
            then()
            return

        def answered(discard: bool | None) -> None:
            if discard:
                then()

        self.app.push_screen(ConfirmScreen(f"Discard unsaved changes to {self.document.path.name}?",
                                           yes="Discard"), answered)
