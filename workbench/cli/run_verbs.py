"""The verbs every kind of run shares: `list`, `get`, `logs`, `stop` and `delete`.

One implementation serves `prime train|rl`, `prime eval` and `prime gepa` (`add_run_verbs`). A group says which
kind of run its verbs address with `run_views.scope(kind)` as its callback: `prime eval list` lists evaluations
only, and `prime eval logs ID` of an RL run fails naming the command that fits. The RL group has no scope:
`prime rl list|get|logs|...` take runs of every kind, as they always have.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from prime_lab.workbench.cli import run_views
from prime_lab.workbench.cli.common import OUTPUT_OPTION, OutputFormat, err, fail, parse_duration, print_json
from prime_lab.workbench.cli.render import format_event, runs_table
from prime_lab.workbench.cli.run_views import NOUNS, RUN_ID, find_run, scoped_kind

if TYPE_CHECKING:
    from prime_lab.monitors.health import Health

NUM_OPTION = typer.Option(20, "-n", "--num", min=1, help="How many runs (newest first).")
EMPTY_HINTS = {
    None: "Evaluate with `prime eval run reverse-text`, or validate an RL config with "
          "`prime rl validate @configs/rl/reverse-text.toml`.",
    "rl": "Start one with `prime rl run @configs/rl/reverse-text.toml`.",
    "sft": "Start one with `prime sft run @configs/sft/reverse-text.toml`.",
    "eval": "Run one with `prime eval run reverse-text`.",
    "gepa": "Start one with `prime gepa run @configs/gepa/reverse-text.toml`.",
}


# list -----------------------------------------------------------------------------------------------------------
HEALTH_KINDS = ("rl", "sft")  # the runs whose metrics have a health (monitors/health.py)
HEALTH_TAIL = 512 << 10  # bytes of a run's events.jsonl read back from its end for its health: any run, one read
HEALTH_EVENTS = 80  # metrics events folded from there: the orchestrator's and the trainer's of the last 40 steps


def recent_health(events_path: Path, max_bytes: int = HEALTH_TAIL) -> Health | None:
    """A training run's health from the newest metrics events (`HEALTH_EVENTS`) in the last `max_bytes` of its log
    (None: none there). Only the tail is read and only those lines are parsed: a long run lists as fast as a short
    one. The health's windows are shorter (`AlertThresholds`: 20 steps at most)."""
    from prime_lab.monitors.health import HealthTracker

    try:
        with open(events_path, "rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(max(0, size - max_bytes))
            chunk = fh.read(max_bytes)
    except OSError:
        return None
    lines = chunk.split(b"\n")
    if size > max_bytes:
        lines = lines[1:]  # the first line is cut
    newest: list[bytes] = []  # the last HEALTH_EVENTS metrics lines, newest first
    for line in reversed(lines):
        if b'"kind":"metrics"' in line:
            newest.append(line)
            if len(newest) == HEALTH_EVENTS:
                break
    tracker = HealthTracker()
    for line in reversed(newest):
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            tracker.feed([event])
    health = tracker.health()
    return health if health.items else None


def show_runs(kind: str | None, output: OutputFormat, num: int) -> None:
    """The newest `num` runs of `kind` (None: every kind) as a table or json; a training run's with its health
    (`health`: its level, line and items, read from the tail of its log)."""
    from prime_lab.runs.registry import RunRegistry

    runs = [r for r in RunRegistry().runs() if kind is None or r.read_status().get("kind") == kind][:num]
    statuses = [r.status() for r in runs]
    healths: dict[str, Health] = {}
    for run, status in zip(runs, statuses, strict=True):
        if status.get("kind") in HEALTH_KINDS and (health := recent_health(run.events_path)) is not None:
            healths[run.id] = health
    if output is OutputFormat.json:
        print_json([{**s, "health": healths[r.id].to_json()} if r.id in healths else s
                    for r, s in zip(runs, statuses, strict=True)])
        return
    if not statuses:
        err(f"No {NOUNS[kind][1] if kind else 'runs'} yet. {EMPTY_HINTS[kind]}")
        return
    runs_table(statuses, {run_id: health.short() for run_id, health in healths.items()})


def list_runs(
    output: OutputFormat = OUTPUT_OPTION,
    num: int = NUM_OPTION,
    kind: str | None = typer.Option(None, "-k", "--kind", help="Only runs of this kind: rl, sft, eval or gepa."),
) -> None:
    """Local runs of every kind (RL, evaluations, GEPA), newest first (alias: ls)."""
    from prime_lab.runs.registry import KINDS

    if kind is not None and kind not in KINDS:
        fail(f"unknown kind '{kind}': use one of {', '.join(KINDS)}")
    show_runs(kind, output, num)


def list_scoped(ctx: typer.Context, output: OutputFormat = OUTPUT_OPTION, num: int = NUM_OPTION) -> None:
    """This kind's local runs, newest first (alias: ls)."""
    show_runs(scoped_kind(ctx), output, num)


# logs -----------------------------------------------------------------------------------------------------------
def logs(
    ctx: typer.Context,
    run_id: str = RUN_ID,
    follow: bool = typer.Option(False, "-f", "--follow", help="Keep printing new events until the run ends."),
    tail: int | None = typer.Option(None, "-n", "--tail", min=0, help="Only the last N events."),
    component: list[str] = typer.Option(
        [], "-c", "--component", help="Only these sources: orchestrator, trainer, inference, eval, gepa, launcher."),
    level: str | None = typer.Option(None, "--level", help="Only log lines at this level or above."),
    since: str | None = typer.Option(None, "--since", help="Only events of the last 30s, 15m, 2h, 1d, ..."),
    search: str | None = typer.Option(None, "--search", help="Only events whose line contains TEXT (any case)."),
    regex: str | None = typer.Option(None, "--regex", help="Only events whose line matches PATTERN (any case)."),
    raw: bool = typer.Option(False, "-r", "--raw", help="Print the events as JSON lines."),
) -> None:
    """A run's events: logs, metrics, status changes, alerts.

    --search and --regex look at the event as printed without --raw (its time, source, level and text). The
    system samples (CPU, memory, GPUs, every few seconds) are left out but with --raw: `metrics --system` shows them.
    """
    from prime_lab.runs.events import LEVELS, SOURCES, BadLine, Event, level_rank
    from prime_lab.runs.registry import FINAL_STATES
    from prime_lab.runs.system_metrics import SYSTEM

    for c in component:
        if c not in SOURCES:
            fail(f"unknown component '{c}': use one of {', '.join(SOURCES)}")
    if level is not None and level.upper() not in LEVELS:
        fail(f"unknown level '{level}': use one of {', '.join(LEVELS)}")
    min_level = LEVELS.index(level.upper()) if level else 0
    not_before = time.time() - parse_duration(since, "--since") if since is not None else None
    try:
        pattern = re.compile(regex, re.IGNORECASE) if regex is not None else None
    except re.error as exc:
        fail(f"--regex {regex!r} is not a regular expression: {exc}")
    needle = search.casefold() if search is not None else None
    run = find_run(ctx, run_id)
    log = run.event_log()

    def keep(event: Event) -> bool:
        if event.kind == SYSTEM and not raw:  # every few seconds: `prime rl metrics --system` shows them
            return False
        if component and event.source not in component:
            return False
        if not_before is not None and event.time < not_before:
            return False
        if level is not None and not (event.kind == "log" and level_rank(event) >= min_level):
            return False
        if needle is None and pattern is None:
            return True
        line = format_event(event)
        return (needle is None or needle in line.casefold()) and (pattern is None or bool(pattern.search(line)))

    def show(event: Event) -> None:
        typer.echo(json.dumps(event.to_json(), separators=(",", ":")) if raw else format_event(event))

    def skipped(bad: BadLine) -> None:
        err(f"(skipped a corrupt event line at byte {bad.offset})")

    # One read gives the history and the offset to follow from, so nothing written in between is lost.
    items, offset = log.read(0)
    for bad in (i for i in items if isinstance(i, BadLine)):
        skipped(bad)
    events = [e for e in items if isinstance(e, Event) and keep(e)]
    for event in events[-tail:] if tail is not None else events:
        show(event)
    if not follow:
        return
    done_at: list[float] = []

    def finished() -> bool:
        # Keep reading for a moment after the final status, so the last events are not cut off.
        if run.state in FINAL_STATES:
            done_at.append(time.monotonic())
            return done_at[-1] - done_at[0] > 0.5
        return False

    try:
        for event in log.tail(offset, follow=True, poll=0.2, stop=finished, on_bad_line=skipped):
            if keep(event):
                show(event)
    except KeyboardInterrupt:
        pass


# stop and delete ------------------------------------------------------------------------------------------------
def stop(
    ctx: typer.Context,
    run_id: str = RUN_ID,
    grace: float = typer.Option(30.0, "--grace", min=0.0, help="Seconds to wait for a clean exit before killing."),
) -> None:
    """Stop a run gracefully (an RL run checkpoints first); stopping a finished run does nothing."""
    from prime_lab.runs.registry import RunRegistry

    result = RunRegistry().stop(find_run(ctx, run_id).id, grace=grace)
    err(result.message)


def delete(
    ctx: typer.Context,
    run_id: str = RUN_ID,
    force: bool = typer.Option(False, "-f", "--force", help="Delete even a running run (it is stopped first)."),
) -> None:
    """Delete a run and everything it wrote."""
    from prime_lab.runs.registry import RunRegistry

    run = RunRegistry().delete(find_run(ctx, run_id).id, force=force)
    err(f"Deleted {run.id}")


def add_run_verbs(app: typer.Typer, kind: str | None) -> None:
    """Register list (and its alias ls), get, logs, stop and delete on `app`, addressing runs of `kind` (None:
    every kind, and `list -k KIND` picks one; else `app` gets `run_views.scope(kind)` as its callback)."""
    if kind is not None:
        app.callback()(run_views.scope(kind))
    listing = list_runs if kind is None else list_scoped
    app.command("ls", hidden=True, help="Same as `list`.")(listing)
    app.command("list", help=None if kind is None else f"Local {NOUNS[kind][1]}, newest first (alias: ls).")(listing)
    app.command("get")(run_views.get)
    app.command("logs")(logs)
    app.command("stop")(stop)
    app.command("delete")(delete)
