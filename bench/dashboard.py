"""The RL dashboard under load; prints the figures.

(a) attach: open `prime lab --run ID` on a finished run whose events.jsonl holds 100,000 events, and time until the
    charts show the whole run (goal: under 2 s);
(b) live: a writer process appends 1,000 events/s while the dashboard follows; measures how long a key press takes to
    show on screen (`e` changes the smoothing named in the header), the event loop's lag, and how far behind the
    writer the charts are at the end.
(c) grid attach: three finished runs of 60 metrics x 10,000 steps; open the first with the metrics grid and the
    other two overlaid, and time until every cell of the grid's page is drawn with the three runs (goal: < 1.5 s);
(d) grid keys: while a writer appends 1,000 metrics events/s (30 metrics each) to the first run, press the grid's
    keys (log-Y, pages, columns, rows, highlight, pin, run on top) and time each until the grid drew what it changed
    (goal: p95 < 50 ms).

    .venv/bin/python bench/dashboard.py [--part charts|grid|all] [--events 100000] [--rate 1000] [--seconds 10]
        [--repeat 5] [--metrics 60] [--steps 10000]

Headless (Textual's test driver), so the figures measure the app, not a terminal emulator. Each attach runs in a
fresh interpreter, as `prime lab --run ID` starts (its clock starts once the app's modules are imported); the load
average is printed beside the figures, since another process on the machine moves them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SIZE = (160, 48)

WRITER = """
import sys, time
from prime_lab.runs.events import EventWriter
path, rate, seconds, start_step = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
orchestrator, trainer = EventWriter(path, "orchestrator"), EventWriter(path, "trainer")
t0 = time.monotonic(); sent = 0; step = start_step
while time.monotonic() - t0 < seconds:
    due = int((time.monotonic() - t0) * rate)
    while sent < due:
        if sent % 4 == 0:
            step += 1
            orchestrator.metrics({"reward/mean": (step % 100) / 100, "reward/std": 0.2, "perf/tokens_per_s": 1500.0,
                                  "rollout/mean_length": 80.0}, step=step)
        elif sent % 4 == 1:
            trainer.metrics({"loss": 0.05, "policy/entropy": 1.0, "policy/kl": 0.001, "optim/lr": 1e-5}, step=step)
        elif sent % 4 == 2:
            orchestrator.log(f"step {step} done", step=step)
        else:
            orchestrator.emit("sample", {"env": "reverse-text", "example_id": str(step), "reward": 0.5,
                                         "completion": [{"role": "assistant", "content": f"answer {step}"}]}, step=step)
        sent += 1
    time.sleep(0.005)
print(sent, step)
"""


def write_finished_run(runs: Path, run_id: str, events: int) -> int:
    """A completed RL run with `events` events (two metrics events per step, a log line and a sample every few
    steps); returns its last step."""
    run = runs / run_id
    (run / "logs").mkdir(parents=True)
    (run / "rollouts").mkdir()
    t0 = time.time() - 3600
    seq, step, lines = 0, 0, []

    def add(source: str, kind: str, data: dict[str, Any], at_step: int | None) -> None:
        nonlocal seq
        seq += 1
        lines.append(json.dumps({"seq": seq, "time": t0 + seq * 0.01, "source": source, "kind": kind, "step": at_step,
                                 "data": data}, separators=(",", ":")))

    add("launcher", "status", {"state": "running"}, None)
    while seq < events - 1:
        step += 1
        add("orchestrator", "metrics", {"reward/mean": min(1.0, step / 20000), "reward/std": 0.2,
                                        "reward/reverse-text": min(1.0, step / 18000), "rollout/mean_length": 80.0,
                                        "rollout/truncated": 0.01, "perf/tokens_per_s": 1500.0}, step)
        add("trainer", "metrics", {"loss": 0.05, "policy/entropy": 1.0 - step / 100000, "policy/kl": 0.001,
                                   "optim/lr": 1e-5, "optim/grad_norm": 0.7}, step)
        if step % 2 == 0:
            add("orchestrator", "log", {"level": "INFO", "message": f"step {step}: 256 rollouts"}, step)
        if step % 4 == 0:
            add("orchestrator", "sample", {"env": "reverse-text", "example_id": str(step), "reward": 0.5,
                                           "completion": [{"role": "assistant", "content": "olleh"}]}, step)
    add("launcher", "status", {"state": "completed"}, None)
    (run / "events.jsonl").write_text("\n".join(lines[:events]) + "\n")
    status = {"id": run_id, "kind": "rl", "state": "completed", "step": step, "max_steps": step, "model": "bench",
              "envs": ["primeintellect/reverse-text"], "created_at": t0, "started_at": t0, "ended_at": t0 + 3600}
    (run / "status.json").write_text(json.dumps(status))
    return step


async def attach(run_id: str, last_step: int) -> dict[str, float]:
    from prime_lab.workbench.app import create_app
    from prime_lab.workbench.screens.dashboard_rl import RLDashboard
    from prime_lab.workbench.widgets.charts import MetricChart

    started, cpu = time.perf_counter(), time.process_time()
    app = create_app(REPO, run_id=run_id, poll_interval=0.1)
    async with app.run_test(size=SIZE):
        first_chart = None
        while True:
            screen = app.screen
            if isinstance(screen, RLDashboard):
                chart = screen.query_one("#chart-reward", MetricChart)
                if first_chart is None and chart.drawn_points:
                    first_chart = time.perf_counter() - started
                if screen.model.latest_step == last_step and chart.drawn_points and \
                        screen.model.series["reward/mean"].count == last_step:
                    break
            await asyncio.sleep(0.01)
        complete = time.perf_counter() - started
        cpu = time.process_time() - cpu
        points = max(len(s) for s in screen.model.series.values())
    return {"first_chart": first_chart or complete, "complete": complete, "cpu": cpu, "max_points": points}


async def sample_lag(writer: subprocess.Popen[str], lags: list[float]) -> None:
    """The event loop's lag (how late a 50 ms sleep wakes) while `writer` runs, into `lags`."""
    loop = asyncio.get_running_loop()
    while writer.poll() is None:
        due = loop.time() + 0.05
        await asyncio.sleep(0.05)
        lags.append(loop.time() - due)


async def writer_done(writer: subprocess.Popen[str], lag_task: asyncio.Task[None], pilot: Any, screen: Any
                      ) -> tuple[int, float]:
    """Once the live writer ended: the events it sent, and the seconds the page took after it to reach its last
    step."""
    await lag_task
    sent, final_step = (int(x) for x in (writer.stdout.read() if writer.stdout else "0 0").split())
    finished = time.perf_counter()
    while screen.model.latest_step != final_step:
        await pilot.pause(0.01)
    return sent, time.perf_counter() - finished


async def live(runs: Path, run_id: str, last_step: int, rate: int, seconds: float) -> dict[str, Any]:
    from prime_lab.workbench.app import create_app
    from prime_lab.workbench.screens.dashboard_rl import RLDashboard
    from prime_lab.workbench.widgets.charts import SMOOTHING_STEPS

    app = create_app(REPO, run_id=run_id, poll_interval=0.1)
    async with app.run_test(size=SIZE) as pilot:
        while not (isinstance(app.screen, RLDashboard) and app.screen.model.latest_step == last_step):
            await pilot.pause(0.05)
        screen = app.screen
        assert isinstance(screen, RLDashboard)
        events_before = screen.model.events
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(runs / run_id / "events.jsonl"), str(rate),
                                   str(seconds), str(last_step)], cwd=REPO, stdout=subprocess.PIPE, text=True)
        lags: list[float] = []
        keys: list[float] = []

        lag_task = asyncio.create_task(sample_lag(writer, lags))
        await asyncio.sleep(0.5)
        while writer.poll() is None:
            want = f"smoothing {SMOOTHING_STEPS[(screen.smoothing + 1) % len(SMOOTHING_STEPS)]:g} "
            pressed = time.perf_counter()
            app.simulate_key("e")  # as a terminal would deliver it (pilot.press also waits for the app to idle)
            header = screen.query_one("#dash-status")
            while want not in str(header.render()):
                await asyncio.sleep(0.002)
            keys.append(time.perf_counter() - pressed)
            await asyncio.sleep(0.2)
        sent, catch_up = await writer_done(writer, lag_task, pilot, screen)
        events_seen = screen.model.events - events_before
    return {"sent": sent, "seen": events_seen, "keys": keys, "lags": lags, "catch_up": catch_up,
            "rate": sent / seconds}


def attach_in_child(home: str, last_step: int, grid: bool = False, page_only: bool = False) -> dict[str, float]:
    """`attach` (or `attach_grid`) in a fresh interpreter: its figures and its peak RSS."""
    out = subprocess.run([sys.executable, __file__, "--attach-grid" if grid else "--attach-only", home,
                          str(last_step), *(["--page-only"] if page_only else [])], cwd=REPO, check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    return dict(json.loads(out.splitlines()[-1]))


def attach_only(home: str, last_step: int, grid: bool = False, page_only: bool = False) -> None:
    os.environ["PRIME_LAB_HOME"] = home
    figures = asyncio.run(attach_grid(GRID_RUNS, last_step, page_only) if grid else attach("rl-bench", last_step))
    print(json.dumps({**figures, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


# The metrics grid -------------------------------------------------------------------------------------------------
GRID_RUNS = ("grid-a", "grid-b", "grid-c")

GRID_WRITER = """
import sys, time
from prime_lab.runs.events import EventWriter
path, rate, seconds, start_step, metrics = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), \
    int(sys.argv[5])
names = [f"group{i // 10}/metric{i % 10}" for i in range(metrics)]
half = len(names) // 2
writers = EventWriter(path, "orchestrator"), EventWriter(path, "trainer")
t0 = time.monotonic(); sent = 0; step = start_step
while time.monotonic() - t0 < seconds:
    due = int((time.monotonic() - t0) * rate)
    while sent < due:
        if sent % 2 == 0:
            step += 1
        keys = names[:half] if sent % 2 == 0 else names[half:]
        writers[sent % 2].metrics({k: 1.0 + (step % 97) / 97 + i for i, k in enumerate(keys)}, step=step)
        sent += 1
    time.sleep(0.005)
print(sent, step)
"""


def metric_value(i: int, step: int, seed: int) -> float:
    """Metric i's value at `step` in run `seed`: curves of different shapes and scales, a few crossing zero (the
    log-Y cells leave those values out)."""
    shape = i % 5
    if shape == 0:
        return 1 - math.exp(-step / (2000 + 500 * seed))
    if shape == 1:
        return 10 ** (-1 - 3 * step / 10_000) * (1 + 0.1 * seed)
    if shape == 2:
        return math.sin(step / 300 + seed) * (i + 1)
    if shape == 3:
        return 1500 + 100 * math.cos(step / 50 + i) + 20 * seed
    return 0.7 + (5.0 if step % 997 == 0 else 0.0) + 0.01 * seed  # spikes


def write_grid_run(runs: Path, run_id: str, metrics: int, steps: int, seed: int) -> int:
    """A completed RL run in the real format: per step an orchestrator and a trainer metrics event, the run's
    `metrics` metrics split between them. Returns the file's size."""
    run = runs / run_id
    (run / "logs").mkdir(parents=True)
    (run / "rollouts").mkdir()
    names = [f"group{i // 10}/metric{i % 10}" for i in range(metrics)]
    half = len(names) // 2
    t0 = time.time() - 3600
    seq = 0
    lines = []

    def add(source: str, kind: str, data: dict[str, Any], step: int | None) -> None:
        nonlocal seq
        seq += 1
        lines.append(json.dumps({"seq": seq, "time": t0 + seq * 0.01, "source": source, "kind": kind, "step": step,
                                 "data": data, "attempt": 1}, separators=(",", ":")))

    add("launcher", "status", {"state": "running"}, None)
    for step in range(1, steps + 1):
        add("orchestrator", "metrics", {k: metric_value(i, step, seed) for i, k in enumerate(names[:half])}, step)
        add("trainer", "metrics", {k: metric_value(i + half, step, seed) for i, k in enumerate(names[half:])}, step)
    add("launcher", "status", {"state": "completed"}, None)
    (run / "events.jsonl").write_text("\n".join(lines) + "\n")
    status = {"id": run_id, "kind": "rl", "state": "completed", "step": steps, "max_steps": steps, "model": "bench",
              "envs": ["primeintellect/reverse-text"], "created_at": t0, "started_at": t0, "ended_at": t0 + 3600}
    (run / "status.json").write_text(json.dumps(status))
    return (run / "events.jsonl").stat().st_size


def grid_complete(screen: Any, run_ids: tuple[str, ...], last_step: int) -> bool:
    """Every run folded to its last step and every cell of the grid's page drawn with all of them."""
    grid = screen.grid
    if screen.model.latest_step != last_step or len(screen.compared) != len(run_ids) - 1 or grid.view is None:
        return False
    if any(model.latest_step != last_step for model in screen.compared.values()):
        return False
    cells = [cell for cell in grid.cells if cell.display]
    return bool(cells) and grid.drawn and len(cells) == len(grid.view.metrics) and \
        all(len(cell.drawn_runs) == len(run_ids) and cell.painted for cell in cells)


async def attach_grid(run_ids: tuple[str, ...], last_step: int, page_only: bool = False) -> dict[str, float]:
    """Open the first run with the grid shown and the others overlaid (as `g`, then `c` and picking them, do), and
    time until the grid's page is drawn with every run's whole series. `page_only`: the page as it opens, on the
    first run alone (its picked charts), until it drew the whole run: what the grid and the overlays add to."""
    from prime_lab.workbench.app import create_app
    from prime_lab.workbench.screens.dashboard_rl import RLDashboard

    started, cpu = time.perf_counter(), time.process_time()
    app = create_app(REPO, run_id=run_ids[0], poll_interval=0.1)
    async with app.run_test(size=SIZE):
        asked = False
        while True:
            screen = app.screen
            if isinstance(screen, RLDashboard) and screen.is_mounted:
                if page_only:
                    if screen.shown_live and screen.model.latest_step == last_step and not screen.changed.is_set():
                        break
                elif not asked:
                    screen.show_grid()
                    screen.overlay(list(run_ids[1:]))
                    asked = True
                elif grid_complete(screen, run_ids, last_step):
                    break
            await asyncio.sleep(0.005)
        complete = time.perf_counter() - started
        cpu = time.process_time() - cpu
        if page_only:
            return {"complete": complete, "cpu": cpu}
        grid = screen.grid
        assert grid.view is not None
        cells, points = len(grid.view.metrics), sum(cell.drawn_points for cell in grid.cells if cell.display)
        metrics = len(grid.names)
    return {"complete": complete, "cpu": cpu, "cells": cells, "points": points, "metrics": metrics}


GRID_KEYS = ("y", "pagedown", "c", "right", "r", "pageup", "p", "t", "down", "y")


async def grid_live(runs: Path, run_ids: tuple[str, ...], last_step: int, metrics: int, rate: int,
                    seconds: float) -> dict[str, Any]:
    from prime_lab.workbench.app import create_app
    from prime_lab.workbench.screens.dashboard_rl import RLDashboard

    app = create_app(REPO, run_id=run_ids[0], poll_interval=0.1)
    async with app.run_test(size=SIZE) as pilot:
        while not (isinstance(app.screen, RLDashboard) and app.screen.is_mounted):
            await pilot.pause(0.01)
        screen = app.screen
        screen.show_grid()
        screen.overlay(list(run_ids[1:]))
        while not grid_complete(screen, run_ids, last_step):
            await pilot.pause(0.02)
        grid = screen.grid
        writer = subprocess.Popen([sys.executable, "-c", GRID_WRITER, str(runs / run_ids[0] / "events.jsonl"),
                                   str(rate), str(seconds), str(last_step), str(metrics)], cwd=REPO,
                                  stdout=subprocess.PIPE, text=True)
        keys: dict[str, list[float]] = {}
        lags: list[float] = []

        def answered(before: tuple[object, ...]) -> bool:
            cells = [cell for cell in grid.cells if cell.display]
            return grid.drawn and state_of(grid) != before and all(cell.painted for cell in cells)

        lag_task = asyncio.create_task(sample_lag(writer, lags))
        await asyncio.sleep(0.5)
        turn, unanswered = 0, 0
        while writer.poll() is None:
            key = GRID_KEYS[turn % len(GRID_KEYS)]
            turn += 1
            if not changes_something(grid, key):
                continue
            before = state_of(grid)
            pressed = time.perf_counter()
            app.simulate_key(key)  # as a terminal would deliver it (pilot.press also waits for the app to idle)
            while not answered(before) and time.perf_counter() - pressed < 5:
                await asyncio.sleep(0.001)
            if answered(before):
                keys.setdefault(key, []).append(time.perf_counter() - pressed)
            else:
                unanswered += 1
            await asyncio.sleep(0.2)
        sent, catch_up = await writer_done(writer, lag_task, pilot, screen)
    return {"sent": sent, "keys": keys, "lags": lags, "catch_up": catch_up, "rate": sent / seconds,
            "unanswered": unanswered}


def changes_something(grid: Any, key: str) -> bool:
    """Whether `key` changes what the grid shows now (no next page on the last one, no step right from the last
    metric)."""
    view = grid.view
    if view is None or view.highlighted is None:
        return False
    index = view.ordered.index(view.highlighted)
    return {"pagedown": view.page < view.pages - 1, "pageup": view.page > 0, "right": index < len(view.ordered) - 1,
            "down": index + view.columns < len(view.ordered), "t": len(grid.run_ids) > 1}.get(key, True)


def state_of(grid: Any) -> tuple[object, ...]:
    """What a grid key changes: the page's metrics, the layout, the highlight, pins, log-Y, the run on top."""
    view = grid.view
    state = grid.state
    return (tuple(view.metrics) if view else (), view.columns if view else 0, view.rows if view else 0,
            state.highlighted, tuple(state.pinned), tuple(sorted(state.log_y)), state.top_run)


def run_grid(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as home:
        os.environ["PRIME_LAB_HOME"] = home
        runs = Path(home) / "runs"
        size = sum(write_grid_run(runs, run_id, args.metrics, args.steps, seed) for seed, run_id in
                   enumerate(GRID_RUNS))
        load_before = load()
        attaches = [attach_in_child(home, args.steps, grid=True) for _ in range(max(1, args.repeat))]
        pages = [attach_in_child(home, args.steps, grid=True, page_only=True) for _ in range(max(1, args.repeat))]
        complete = [a["complete"] for a in attaches]
        median = statistics.median(complete)
        print(f"(c) grid: attach to {len(GRID_RUNS)} runs x {args.metrics} metrics x {args.steps:,} steps "
              f"({size / 1e6:.0f} MB of events) and draw the grid's page ({attaches[0]['cells']:.0f} cells, "
              f"{attaches[0]['points']:,.0f} points): {median:.2f} s (goal < 1.5 s: "
              f"{'met' if median < 1.5 else 'NOT met'})"
              + (f", median of {len(complete)}: {', '.join(f'{c:.2f}' for c in complete)} s" if len(complete) > 1
                 else "")
              + f" (CPU {statistics.median(a['cpu'] for a in attaches):.2f} s); the page alone on the first run "
              f"(its picked charts, no grid, no overlay) {statistics.median(p['complete'] for p in pages):.2f} s "
              f"(CPU {statistics.median(p['cpu'] for p in pages):.2f} s); peak RSS "
              f"{max(a['rss_mb'] for a in attaches):.0f} MB; load average {load_before} -> {load()}")
        d = asyncio.run(grid_live(runs, GRID_RUNS, args.steps, args.metrics, args.rate, args.seconds))
        every = [t for times in d["keys"].values() for t in times]
        common = [t for key, times in d["keys"].items() if key not in ("c", "r") for t in times]
        per_key = ", ".join(f"{key} {statistics.median(times) * 1000:.0f}" for key, times in d["keys"].items())
        print(f"(d) grid keys during a live writer at {d['rate']:.0f} events/s ({args.metrics // 2} metrics each) for "
              f"{args.seconds:g} s: key press to grid drawn median {statistics.median(every) * 1000:.0f} ms, p95 "
              f"{p95(every) * 1000:.0f} ms (goal < 50 ms: {'met' if p95(every) < 0.05 else 'NOT met'}), max "
              f"{max(every) * 1000:.0f} ms ({len(every)} presses; median per key, ms: {per_key}; p95 without c and r, "
              f"which redraw every cell at its new size, {p95(common) * 1000:.0f} ms; {d['unanswered']} unanswered "
              f"in 5 s); "
              f"event-loop lag "
              f"median {statistics.median(d['lags']) * 1000:.0f} ms, p95 {p95(d['lags']) * 1000:.0f} ms; the grid "
              f"caught up {d['catch_up']:.2f} s after the writer stopped; load average {load()}")


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def p95(values: list[float]) -> float:
    return sorted(values)[max(0, int(len(values) * 0.95) - 1)] if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--repeat", type=int, default=1, help="attach this many times (each in a fresh interpreter)")
    parser.add_argument("--part", choices=("charts", "grid", "all"), default="all",
                        help="charts: (a) and (b); grid: (c) and (d)")
    parser.add_argument("--metrics", type=int, default=60, help="metrics per run of the grid's runs")
    parser.add_argument("--steps", type=int, default=10_000, help="steps of each of the grid's runs")
    parser.add_argument("--attach-only", nargs=2, metavar=("HOME", "LAST_STEP"), help=argparse.SUPPRESS)
    parser.add_argument("--attach-grid", nargs=2, metavar=("HOME", "LAST_STEP"), help=argparse.SUPPRESS)
    parser.add_argument("--page-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.attach_only or args.attach_grid:
        home, last = args.attach_only or args.attach_grid
        attach_only(home, int(last), grid=bool(args.attach_grid), page_only=args.page_only)
        return
    if args.part in ("charts", "all"):
        run_charts(args)
    if args.part in ("grid", "all"):
        run_grid(args)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS of this process (app + bench): {rss:.0f} MB; load average {load()}")


def run_charts(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as home:
        os.environ["PRIME_LAB_HOME"] = home
        runs = Path(home) / "runs"
        last = write_finished_run(runs, "rl-bench", args.events)
        size = (runs / "rl-bench" / "events.jsonl").stat().st_size
        load_before = load()
        attaches = [attach_in_child(home, last) for _ in range(max(1, args.repeat))]
        complete = [a["complete"] for a in attaches]
        print(f"(a) attach to a finished run of {args.events:,} events ({size / 1e6:.1f} MB, {last:,} steps): "
              f"first chart {statistics.median(a['first_chart'] for a in attaches):.2f} s, all {last:,} steps "
              f"charted {statistics.median(complete):.2f} s (goal < 2 s)"
              + (f", median of {len(complete)}: {', '.join(f'{c:.2f}' for c in complete)} s" if len(complete) > 1
                 else "")
              + f" (CPU {statistics.median(a['cpu'] for a in attaches):.2f} s)"
              + f"; points kept per series <= {max(a['max_points'] for a in attaches):.0f}; peak RSS "
              f"{max(a['rss_mb'] for a in attaches):.0f} MB; load average {load_before} -> {load()}")
        b = asyncio.run(live(runs, "rl-bench", last, args.rate, args.seconds))
        print(f"(b) live writer at {b['rate']:.0f} events/s for {args.seconds:g} s: {b['seen']:,} of {b['sent']:,} "
              f"events followed; key press to screen median {statistics.median(b['keys']) * 1000:.0f} ms, "
              f"p95 {p95(b['keys']) * 1000:.0f} ms, max {max(b['keys']) * 1000:.0f} ms ({len(b['keys'])} presses); "
              f"event-loop lag median {statistics.median(b['lags']) * 1000:.0f} ms, p95 {p95(b['lags']) * 1000:.0f} "
              f"ms; charts caught up {b['catch_up']:.2f} s after the writer stopped")


if __name__ == "__main__":
    main()
