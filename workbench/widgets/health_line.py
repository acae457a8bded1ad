"""A training run's health in one line above its tabs (monitors/health.py): each sign ok (green) or warn (yellow,
with what usually helps in the tooltip); hidden until the run logged a metric it reads."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import Static

from prime_lab.monitors.health import WARN, Health


class HealthLine(Static):
    DEFAULT_CSS = """
    HealthLine { height: 1; padding: 0 1; display: none; text-wrap: nowrap; text-overflow: ellipsis; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__("", markup=False, **kwargs)
        self.health = Health()

    def show(self, health: Health) -> None:
        """Draw `health` (nothing when it is what is shown already)."""
        if health == self.health and self.display == bool(health.items):
            return
        self.health = health
        self.display = bool(health.items)
        if not health.items:
            return
        warn = health.level == WARN
        text = Text()
        text.append("▲ health " if warn else "● health ", style="bold yellow" if warn else "bold green")
        for i, item in enumerate(health.items):
            if i:
                text.append(" · ", style="dim")
            text.append(item.text, style="yellow" if item.level == WARN else "")
        self.update(text)
        hints = [f"{item.text}: {item.hint}" for item in health.warnings if item.hint]
        self.tooltip = "\n".join(hints) if hints else None

    @property
    def plain(self) -> str:
        """What the line says, as text (`health.text`)."""
        return self.health.text
