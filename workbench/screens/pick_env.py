"""Pick an environment to add as an [[env]] entry (its arguments and defaults shown)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

from prime_lab.envs import EnvInfo
from prime_lab.workbench.widgets.env_picker import EnvPicker


class PickEnvScreen(ModalScreen[EnvInfo | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel", id="pick_env.cancel")]

    def compose(self) -> ComposeResult:
        with Vertical(id="pick-env-box", classes="dialog"):
            yield Static("Add an environment (enter picks, esc cancels)", classes="dialog-title")
            yield EnvPicker(id="pick-env")

    def on_mount(self) -> None:
        picker = self.query_one(EnvPicker)
        if picker.option_count:
            picker.highlighted = 0
        picker.focus()

    def on_env_picker_picked(self, event: EnvPicker.Picked) -> None:
        self.dismiss(event.env)

    def action_cancel(self) -> None:
        self.dismiss(None)
