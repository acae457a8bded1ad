"""The raw TOML view: a TextArea with TOML highlighting and line numbers."""

from __future__ import annotations

from textual.widgets import TextArea


class TomlEditor(TextArea):
    """TOML text with highlighting; `replace_text` swaps the text (from a form edit) keeping the cursor."""

    def __init__(self, text: str, *, blink: bool = True, id: str | None = None) -> None:
        super().__init__(text, language="toml", show_line_numbers=True, tab_behavior="indent", soft_wrap=False,
                         id=id)
        self.cursor_blink = blink

    def replace_text(self, text: str) -> None:
        if text == self.text:
            return
        row, column = self.cursor_location
        self.load_text(text)
        last = max(0, self.document.line_count - 1)
        row = min(row, last)
        self.cursor_location = (row, min(column, len(self.document.get_line(row))))

    def jump_to_line(self, line: int) -> None:
        """Put the cursor at the start of a 1-based line and show it."""
        row = max(0, min(line - 1, self.document.line_count - 1))
        self.cursor_location = (row, 0)
        self.scroll_cursor_visible(center=True)
        self.focus()
