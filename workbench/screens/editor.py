"""The config editor: the form and the raw TOML, two synchronised views of ONE tomlkit document, validated live
with the CLI's problems collector."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, cast

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer, Header, Static, TextArea

from prime_lab.envs import EnvInfo
from prime_lab.workbench.config_document import ConfigDocument, schema_for
from prime_lab.workbench.launch import LaunchError, config_argv
from prime_lab.workbench.screens.confirm import ConfirmScreen
from prime_lab.workbench.screens.pick_env import PickEnvScreen
from prime_lab.workbench.widgets.config_form import ConfigForm, FieldRow
from prime_lab.workbench.widgets.problems_panel import ProblemsPanel
from prime_lab.workbench.widgets.toml_editor import TomlEditor

if TYPE_CHECKING:
    from prime_lab.workbench.app import LabApp

NARROW = 110  # below this width one view shows at a time (ctrl+t switches)


class EditorScreen(Screen[None]):
    BINDINGS = [
        Binding("ctrl+s", "save", "Save", id="editor.save", priority=True),
        Binding("ctrl+r", "launch", "Launch", id="editor.launch", priority=True),
        Binding("ctrl+t", "toggle_view", "Form/TOML", id="editor.toggle_view", priority=True),
        Binding("ctrl+g", "problems", "Problems", id="editor.problems", priority=True),
        Binding("escape", "close", "Back", id="editor.close"),
    ]

    view: reactive[str] = reactive("form")

    def __init__(self, path: Path, *, focus_toml: bool = False) -> None:
        super().__init__()
        self.document = ConfigDocument.load(path)
        self.focus_toml = focus_toml
        self._syncing = False

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
        yield Footer()

    async def on_mount(self) -> None:
        self.sub_title = str(self.document.path.name)
        await self._show_document(update_text=False)
        self.view = "toml" if self.focus_toml else "form"
        (self.query_one(TomlEditor) if self.focus_toml else self.query_one(ConfigForm)).focus()
        self.call_after_refresh(self._populate_form)

    async def _populate_form(self) -> None:
        form = self.query_one(ConfigForm)
        await form.populate()
        await self._show_document(update_text=False)

    def on_resize(self, event: events.Resize) -> None:
        self.set_class(event.size.width < NARROW, "-narrow")

    def watch_view(self, view: str) -> None:
        self.set_class(view == "form", "-show-form")
        self.set_class(view == "toml", "-show-toml")

    # Sync: every edit goes into the document, then both views and the problems show it ---------------------
    async def _show_document(self, *, update_text: bool = True) -> None:
        document = self.document
        self._syncing = True
        try:
            if update_text:
                self.query_one(TomlEditor).replace_text(document.text)
            await self.query_one(ConfigForm).show(document)
        finally:
            self._syncing = False
        self.query_one(ProblemsPanel).show(document.problems or [])
        errors = len(document.errors)
        state = "modified" if document.dirty else "saved"
        verdict = "valid" if not errors else f"{errors} error{'s' if errors != 1 else ''}"
        self.query_one("#editor-status", Static).update(
            f" {document.path.name} · {document.kind} config · {state} · {verdict}")

    async def on_text_area_changed(self, event: TextArea.Changed) -> None:
        if self._syncing:
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

    def action_toggle_view(self) -> None:
        self.view = "toml" if self.view == "form" else "form"
        (self.query_one(TomlEditor) if self.view == "toml" else self.query_one(ConfigForm)).focus()

    def action_problems(self) -> None:
        self.query_one(ProblemsPanel).focus()

    def action_close(self) -> None:
        if not self.document.dirty:
            self.dismiss()
            return

        def answered(discard: bool | None) -> None:
            if discard:
                self.dismiss()

        self.app.push_screen(ConfirmScreen(f"Discard unsaved changes to {self.document.path.name}?",
                                           yes="Discard"), answered)
