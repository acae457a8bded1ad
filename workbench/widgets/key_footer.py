"""The footer of keys, rebuilt only when the keys it shows change."""

from __future__ import annotations

from typing import Any

from textual.screen import Screen
from textual.widgets import Footer


class KeyFooter(Footer):
    """Textual's footer rebuilds itself whenever the focus moves, and each rebuild lays out the whole screen again
    (a tenth of a second with the RL form's several hundred widgets, several times per key). This one rebuilds when
    the keys it shows differ."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._shown_keys: tuple[object, ...] | None = None

    def bindings_changed(self, screen: Screen[Any]) -> None:
        shown = tuple((binding.key, binding.description, enabled, tooltip)
                      for _, binding, enabled, tooltip in screen.active_bindings.values() if binding.show)
        if screen.app.app_focus:  # (without it the footer waits: nothing to compare yet)
            if shown == self._shown_keys:
                return
            self._shown_keys = shown
        super().bindings_changed(screen)
