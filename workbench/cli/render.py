"""Terminal rendering of runs and events for the headless CLI (rich tables, one-line events)."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.table import Table

from prime_lab.lab.events import Event

# The few numbers a person wants on a metrics line, in this order; the rest follow alphabetically.
HEADLINE_METRICS = ("reward/mean", "reward/std", "policy/entropy", "policy/kl", "loss", "perf/tokens_per_s",
                    "time/step")


def clock(ts: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts)) if ts else "-"


def when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts)) if ts else "-"


def number(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, int):
        return str(value)
    return f"{value:.4g}"


def format_event(event: Event) -> str:
    head = f"{clock(event.time)} {event.source:<12}"
    step = f"step {event.step} " if event.step is not None else ""
    data = event.data
    if event.kind == "log":
        return f"{head} {str(data.get('level', 'INFO')):<7} {step}{data.get('message', '')}"
    if event.kind == "metrics":
        keys = [k for k in HEADLINE_METRICS if k in data] + sorted(k for k in data if k not in HEADLINE_METRICS)
        return f"{head} METRICS {step}" + " ".join(f"{k}={number(data[k])}" for k in keys)
    if event.kind == "status":
        reason = f" ({data['reason']})" if data.get("reason") else ""
        return f"{head} STATUS  {step}{data.get('state', '?')}{reason}"
    if event.kind == "alert":
        return f"{head} ALERT   {step}{data.get('message', data)}"
    fields = " ".join(f"{k}={number(v)}" for k, v in data.items() if not isinstance(v, dict | list))
    return f"{head} {event.kind.upper():<7} {step}{fields}"


def runs_table(statuses: list[dict[str, Any]]) -> None:
    table = Table(box=None, header_style="bold")
    for column in ("ID", "STATE", "KIND", "MODEL", "ENVIRONMENTS", "STEP", "REWARD", "STARTED"):
        table.add_column(column)
    for s in statuses:
        step = f"{s.get('step', 0)}/{s['max_steps']}" if s.get("max_steps") else str(s.get("step", 0))
        reward = s.get("reward")
        table.add_row(str(s.get("id")), str(s.get("state")), str(s.get("kind")), str(s.get("model") or "-"),
                      ", ".join(s.get("envs") or []) or "-", step,
                      f"{reward:.3f}" if isinstance(reward, int | float) else "-",
                      when(s.get("started_at") or s.get("created_at")))
    Console().print(table)
