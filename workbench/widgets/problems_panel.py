"""The problems panel: one line per problem with its line number; selecting one jumps to that line."""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from prime_lab.problems.validation import Problem


class ProblemsPanel(OptionList):
    """Problems from the shared collector (the CLI prints the same ones)."""

    @dataclass
    class JumpTo(Message):
        line: int

    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id, markup=False)
        self.problems: list[Problem] = []

    def show(self, problems: list[Problem]) -> None:
        if problems == self.problems and self.option_count:
            return  # unchanged (a keystroke in a valid file): no new lines, no new layout
        self.problems = list(problems)
        self.clear_options()
        if not problems:
            self.add_option(Option("No problems", disabled=True))
        for problem in problems:
            where = f"L{problem.line:<4}" if problem.line else "     "
            mark = "note " if problem.severity == "note" else "error"
            key = f"{problem.key}: " if problem.key else ""
            hint = f" (did you mean `{problem.suggestion}`?)" if problem.suggestion else ""
            self.add_option(Option(f"{where} {mark} {key}{problem.message}{hint}"))
        if problems:
            self.highlighted = 0
        errors = sum(p.severity == "error" for p in problems)
        self.border_title = f"Problems ({errors} error{'s' if errors != 1 else ''})"
        self.set_class(errors > 0, "-errors")
        if self.has_focus:
            self._show_keys()

    def on_focus(self) -> None:
        self._show_keys()

    def on_blur(self) -> None:
        self.border_subtitle = ""

    def _show_keys(self) -> None:
        """While focused, the keys that act here (the problems hold no text to type)."""
        self.border_subtitle = ("enter: to its line · " if self.problems else "") + "ctrl+g: back"

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option_index < len(self.problems):
            line = self.problems[event.option_index].line
            if line:
                self.post_message(self.JumpTo(line))
