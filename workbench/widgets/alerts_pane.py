"""Alerts, shown prominently above a dashboard: the newest first, errors in red; hidden while there are none."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import Static

SHOWN = 3


class AlertsPane(Static):
    DEFAULT_CSS = """
    AlertsPane { height: auto; max-height: 5; border: heavy $error; padding: 0 1; display: none; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__("", **kwargs)
        self.count = 0

    def show(self, alerts: list[dict[str, Any]]) -> None:
        self.count = len(alerts)
        self.display = bool(alerts)
        if not alerts:
            return
        self.border_title = f"Alerts ({len(alerts)})"
        text = Text()
        for alert in reversed(alerts[-SHOWN:]):
            if text:
                text.append("\n")
            level = str(alert.get("level", "WARNING")).upper()
            text.append("✖ " if level == "ERROR" else "▲ ", style="bold red" if level == "ERROR" else "bold yellow")
            text.append(str(alert.get("message", alert.get("name", ""))))
        self.update(text)
