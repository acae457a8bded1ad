"""A log that grows at its end (a run page's event tail, the logs beside the charts): Textual's RichLog, except that
its growth does not lay the page out.

RichLog sets its virtual size on every write (the lines it holds, up to `max_lines`, and its widest line), and a
change of virtual size lays out the whole screen: on a run page with the metrics grid, 30 ms on an idle machine and
100-150 ms while a live run's events are folded, which a key pressed meanwhile waited for (bench/dashboard.py, the
grid's keys). A layout matters only when a scrollbar comes or goes; otherwise the log repaints itself and its
scrollbars.
"""

from __future__ import annotations

from typing import Any

from textual.geometry import Size
from textual.reactive import Reactive
from textual.widgets import RichLog


class TailLog(RichLog):
    """RichLog whose writes lay the page out only when they add or remove a scrollbar."""

    virtual_size: Reactive[Size] = Reactive(Size(0, 0), layout=False)  # (Widget's lays the page out)

    _thumbs_pending = False

    def write(self, *args: Any, **kwargs: Any) -> TailLog:
        before = self._scrollbars_needed()
        super().write(*args, **kwargs)
        if self._scrollbars_needed() != before:
            self.refresh(layout=True)
        elif self.is_mounted and not self._thumbs_pending:  # (once per frame, however many lines are written)
            self._thumbs_pending = True
            self.call_after_refresh(self._update_thumbs)
        return self

    def _update_thumbs(self) -> None:
        """The scrollbars' thumbs follow the new size."""
        self._thumbs_pending = False
        self._scroll_update(self.virtual_size)

    def _scrollbars_needed(self) -> tuple[bool, bool]:
        width, height = self.scrollable_content_region.size
        virtual = self.virtual_size
        return virtual.width > width, virtual.height > height
