"""Pick several items from a list (runs to compare, metrics to chart): space toggles, enter confirms."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import SelectionList, Static


class PickManyScreen(ModalScreen[list[str] | None]):
    BINDINGS = [
        Binding("enter", "confirm", "Confirm", id="pick_many.confirm", priority=True),
        Binding("escape", "cancel", "Cancel", id="pick_many.cancel"),
    ]

    def __init__(self, title: str, options: list[tuple[str, str, bool]]) -> None:
        """`options`: (label, value, selected)."""
        super().__init__()
        self.title_text = title
        self.options = options

    def compose(self) -> ComposeResult:
        with Vertical(id="pick-many-box", classes="dialog"):
            yield Static(f"{self.title_text} (space toggles, enter confirms, esc cancels)", classes="dialog-title")
            yield SelectionList[str](*self.options, id="pick-many")

    def on_mount(self) -> None:
        self.query_one(SelectionList).focus()

    def action_confirm(self) -> None:
        self.dismiss(list(self.query_one(SelectionList).selected))

    def action_cancel(self) -> None:
        self.dismiss(None)
