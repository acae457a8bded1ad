"""The RL dashboard under load; prints the figures.

(a) attach: open `prime lab --run ID` on a finished run whose events.jsonl holds 100,000 events, and time until the
    charts show the whole run (goal: under 2 s);
(b) live: a writer process appends 1,000 events/s while the dashboard follows; measures how long a key press takes to
    show on screen (`e` changes the smoothing named in the header), the event loop's lag, and how far behind the
    writer the charts are at the end.

    .venv/bin/python bench/dashboard.py [--events 100000] [--rate 1000] [--seconds 10] [--repeat 5]

Headless (Textual's test driver), so the figures measure the app, not a terminal emulator. Each attach runs in a
fresh interpreter, as `prime lab --run ID` starts (its clock starts once the app's modules are imported); the load
average is printed beside the figures, since another process on the machine moves them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
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
        loop = asyncio.get_running_loop()

        async def sample_lag() -> None:
            while writer.poll() is None:
                due = loop.time() + 0.05
                await asyncio.sleep(0.05)
                lags.append(loop.time() - due)

        lag_task = asyncio.create_task(sample_lag())
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
        await lag_task
        sent, final_step = (int(x) for x in (writer.stdout.read() if writer.stdout else "0 0").split())
        finished = time.perf_counter()
        while screen.model.latest_step != final_step:
            await pilot.pause(0.01)
        catch_up = time.perf_counter() - finished
        events_seen = screen.model.events - events_before
    return {"sent": sent, "seen": events_seen, "keys": keys, "lags": lags, "catch_up": catch_up,
            "rate": sent / seconds}


def attach_in_child(home: str, last_step: int) -> dict[str, float]:
    """`attach` in a fresh interpreter: its figures and its peak RSS."""
    out = subprocess.run([sys.executable, __file__, "--attach-only", home, str(last_step)], cwd=REPO, check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    return dict(json.loads(out.splitlines()[-1]))


def attach_only(home: str, last_step: int) -> None:
    os.environ["PRIME_LAB_HOME"] = home
    figures = asyncio.run(attach("rl-bench", last_step))
    print(json.dumps({**figures, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


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
    parser.add_argument("--attach-only", nargs=2, metavar=("HOME", "LAST_STEP"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.attach_only:
        attach_only(args.attach_only[0], int(args.attach_only[1]))
        return
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
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"peak RSS of this process (app + bench): {rss:.0f} MB; load average {load()}")


if __name__ == "__main__":
    main()
