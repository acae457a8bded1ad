"""Terminal rendering of runs and events for the headless CLI (rich tables, one-line events).

Plain output (`prime --plain ...`, or `--plain` after any command) is for scripts and agents: tables print as
tab-separated lines under a header line, with no colours, markup or progress bars. The choice is made once per
process, here, and every table, progress bar and rewritten line asks for it.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console, JustifyMethod, OverflowMethod
from rich.table import Column, Table

from prime_lab.runs.display import size as size
from prime_lab.runs.evaluations import Evaluation, Failures, mean_of, with_failures
from prime_lab.runs.events import Event

# The few numbers a person wants on a metrics line, in this order; the rest follow alphabetically.
HEADLINE_METRICS = ("reward/mean", "reward/std", "policy/entropy", "policy/kl", "loss", "perf/tokens_per_s",
                    "time/step")


_plain = False


def set_plain(on: bool) -> None:
    """Plain output for the rest of this process (or not)."""
    global _plain
    _plain = on


def is_plain() -> bool:
    return _plain


def live_output() -> bool:
    """Whether progress may be drawn live (bars, a line rewritten in place): on a terminal, and not --plain."""
    return not _plain and sys.stderr.isatty()


PIPE_WIDTH = 200  # columns for rich output that goes to a file or a pipe (rich's default there is 80)


def console(stderr: bool = False) -> Console:
    """A rich console for `prime`'s output. On a terminal, its width; into a file or a pipe (no COLUMNS set), room
    for a table's natural width: rich would squeeze it into 80 columns, cutting ids and wrapping notes a word a line."""
    stream = sys.stderr if stderr else sys.stdout
    wide = not stream.isatty() and "COLUMNS" not in os.environ
    return Console(stderr=stderr, width=PIPE_WIDTH if wide else None)


def progress_console() -> Console:
    """Where progress is drawn: stderr, whose terminal `live_output` asks about (stdout stays the results)."""
    return Console(stderr=True)


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


def _tsv_cell(value: Any) -> str:
    return " ".join(str(value).replace("\t", " ").splitlines())


def print_table(columns: Sequence[str | Column], rows: Iterable[Sequence[str]], *,
                overflow: OverflowMethod = "ellipsis", justify: dict[str, JustifyMethod] | None = None,
                styles: Sequence[str | None] | None = None, stderr: bool = False) -> None:
    """A borderless table with bold headers on stdout (or stderr), the one look of every `prime` table; under
    --plain, tab-separated lines (the header first) with every value whole.

    A column given as a rich `Column` keeps its own settings; `styles` styles each row (say "dim")."""
    if _plain:
        out = sys.stderr if stderr else sys.stdout
        for line in ([c.header if isinstance(c, Column) else c for c in columns], *rows):
            out.write("\t".join(_tsv_cell(value) for value in line) + "\n")
        return
    table = Table(*(c if isinstance(c, Column) else Column(c, overflow=overflow,
                                                           justify=(justify or {}).get(c, "left"))
                    for c in columns), box=None, header_style="bold")
    for i, row in enumerate(rows):
        table.add_row(*row, style=styles[i] if styles is not None else None)
    console(stderr).print(table)


def steps_of(status: dict[str, Any]) -> str:
    """`12/30`, or `12` when the run has no step count."""
    step = status.get("step") or 0
    return f"{step}/{status['max_steps']}" if status.get("max_steps") else str(step)


def runs_table(statuses: list[dict[str, Any]], healths: dict[str, str] | None = None) -> None:
    """The runs, newest first; with `healths` (run id -> its health in a few words) a HEALTH column too."""
    rows = []
    for s in statuses:
        reward = s.get("reward")
        health = (healths.get(str(s.get("id")), "-"),) if healths else ()
        rows.append((str(s.get("id")), str(s.get("state")), str(s.get("kind")), str(s.get("model") or "-"),
                     ", ".join(s.get("envs") or []) or "-", steps_of(s),
                     f"{reward:.3f}" if isinstance(reward, int | float) else "-", *health,
                     when(s.get("started_at") or s.get("created_at"))))
    # the id is what every other command takes: whole, whatever the terminal's width (the rest may be cut)
    whole = [Column(name, no_wrap=True, min_width=max([len(name), *(len(r[i]) for r in rows)]))
             for i, name in ((0, "ID"), (1, "STATE"))]
    print_table((*whole, "KIND", "MODEL", "ENVIRONMENTS", "STEP", "REWARD", *(("HEALTH",) if healths else ()),
                 "STARTED"), rows)


def print_evaluations(evaluations: list[Evaluation], max_steps: Any = None, *, stderr: bool = False) -> None:
    """A run's evaluations before and after training, under a line that says what each mean is of: per
    environment the base model's mean reward (step 0), the final policy's (the newest evaluation; `step N` while
    it is not the run's last step), each with the rollouts that failed and counted 0 (`0.207 (3 of 16 timed out,
    counted 0)`), and the change; an SFT run's validation loss the same way. Nothing when the run has none."""
    if not evaluations:
        return
    reward = any(e.is_reward for e in evaluations)
    digits = 3 if reward else 4
    steps = [e.final_step for e in evaluations if e.final_step is not None]
    last = max(steps) if steps else None
    final = "FINAL" if last is None or last == max_steps else "LATEST"
    sizes = len({e.over() for e in evaluations}) > 1

    def value(x: float | None, step: int | None = None, sign: str = "", failures: Failures | None = None) -> str:
        if x is None:
            return "-"
        shown = with_failures(f"{x:{sign}.{digits}f}", failures)
        return shown + (f" (step {step})" if step is not None and step != last else "")

    head = ["ENV" if reward else "METRIC", *(["OVER"] if sizes else []), "BASE (step 0)",
            f"{final} (step {last})" if last is not None else final, "CHANGE"]
    rows = [[e.env or e.metric, *([e.over()] if sizes else []), value(e.base, failures=e.base_failures),
             value(e.final, e.final_step, failures=e.final_failures), value(e.change, sign="+")] for e in evaluations]
    title = f"{'evaluation' if reward else 'validation'} ({mean_of(evaluations)})"
    (sys.stderr if stderr else sys.stdout).write(title + "\n")
    print_table(head, rows, justify={h: "right" for h in head[1:] if h != "OVER"}, stderr=stderr)
