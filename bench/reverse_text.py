"""The default config (smollm2-135m on reverse-text, LoRA) for 50 steps on this machine: the reward curve and its rise.

    .venv/bin/python bench/reverse_text.py [--steps 50] [--config configs/rl/reverse-text.toml] [--lr 2e-4]
                                           [--temperature 0.8]

Runs `prime rl run @CONFIG --foreground` (the real sampler, orchestrator and trainer) with `max_steps` set to
`--steps`, then reads the run's events and prints the reward per step, the rise (mean of the last 10 steps minus the
first 10) and the wall time. Goal: a rise of at least 0.1 within 30 minutes on 2 CPU cores, the local echo of
prime-rl's reverse-text integration check. The run stays in the registry (`prime rl list`) for a look in `prime lab`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomlkit

from prime_lab.runs.registry import RunRegistry

ROOT = Path(__file__).resolve().parents[1]
PRIME = str(Path(sys.executable).parent / "prime")
GOAL_RISE, GOAL_MINUTES = 0.1, 30.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "rl" / "reverse-text.toml")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--lr", type=float, default=None, help="Override learning_rate.")
    parser.add_argument("--temperature", type=float, default=None, help="Override [sampling].temperature.")
    parser.add_argument("--window", type=int, default=10, help="Steps averaged at each end for the rise.")
    parser.add_argument("--run", default=None, help="Report on a finished run instead of starting one.")
    args = parser.parse_args()
    if args.run:
        run = RunRegistry().get(args.run)
        status = run.status()
        return report(run.id, float(status.get("ended_at", 0)) - float(status.get("created_at", 0)), args.window)

    doc = tomlkit.parse(args.config.read_text())
    doc["max_steps"] = args.steps
    if args.lr is not None:
        doc["learning_rate"] = args.lr
    if args.temperature is not None:
        doc["sampling"]["temperature"] = args.temperature  # type: ignore[index]
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as fh:
        fh.write(tomlkit.dumps(doc))
        config = Path(fh.name)
    print(f"config {args.config} with max_steps = {args.steps}" + (f", learning_rate = {args.lr:g}" if args.lr else "")
          + (f", temperature = {args.temperature:g}" if args.temperature is not None else ""))
    print(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}", flush=True)
    t0 = time.monotonic()
    proc = subprocess.run([PRIME, "rl", "run", f"@{config}", "--foreground"], capture_output=True, text=True)
    wall = time.monotonic() - t0
    config.unlink()
    run_id = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    if proc.returncode != 0 or not run_id:
        print(proc.stderr[-3000:])
        print(f"the run did not complete (exit {proc.returncode})")
        return 1
    return report(run_id, wall, args.window)


def report(run_id: str, wall: float, window: int) -> int:
    run = RunRegistry().get(run_id)
    by_step: dict[int, float] = {}
    for event in run.event_log().events():
        if event.kind == "metrics" and event.source == "orchestrator" and event.step is not None:
            by_step[event.step] = float(event.data["reward/mean"])
    curve = [by_step[k] for k in sorted(by_step)]
    for k, reward in zip(sorted(by_step), curve, strict=True):
        print(f"step {k:3d}  reward {reward:.3f}  {'#' * round(reward * 50)}")
    w = min(window, len(curve) // 2)
    first, last = sum(curve[:w]) / w, sum(curve[-w:]) / w
    rise = last - first
    print(f"run {run_id}: {len(curve)} steps in {wall / 60:.1f} min ({wall / max(1, len(curve)):.1f} s/step), "
          f"load {os.getloadavg()[0]:.2f}")
    print(f"reward: first {w} steps {first:.3f}, last {w} steps {last:.3f}, rise {rise:+.3f} "
          f"(goal >= {GOAL_RISE} within {GOAL_MINUTES:g} min: "
          f"{'met' if rise >= GOAL_RISE and wall / 60 <= GOAL_MINUTES else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
