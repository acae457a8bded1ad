"""What the system sampler costs: its thread's CPU time over the wall time, as a share of one core (goal: < 1%).

    .venv/bin/python bench/system_sampler.py [--seconds 20] [--interval 5] [--children 6] [--json out.json]

This process plays a run's supervisor: it starts a tree shaped like an RL run's (a trainer and a sampler busy half
the time and an orchestrator, each with a child of its own, as vLLM's engine core or an environment server; the W&B
mirror, the reaper and a teacher, asleep), registers them with a run as the supervisor does, and
samples it with `SystemSampler.for_run` (events written to the run's log, GPUs read through NVML where there are
any) at the run's interval for `--seconds`. The cost is the sampler thread's own CPU time (`time.thread_time`
around each sample, the thread's only work), so the children's load does not count; the time each sample takes
and how many processes the machine has (the tree walk reads every process's parent) are printed beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prime_lab.runs.registry import RunRegistry  # noqa: E402
from prime_lab.runs.system_metrics import DEFAULT_INTERVAL_S, SYSTEM, SystemSampler  # noqa: E402

GOAL = 0.01  # of one core

# Half busy, half asleep (a trainer or sampler between steps), with `threads` threads; `child`: one of its own.
WORKER = """
import subprocess, sys, threading, time
busy, threads, child = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
if child:
    kid = subprocess.Popen([sys.executable, "-c", "import time\\nwhile True: time.sleep(1)"])
def idle():
    while True:
        time.sleep(1)
for _ in range(threads - 1):
    threading.Thread(target=idle, daemon=True).start()
while True:
    end = time.perf_counter() + busy * 0.1
    while time.perf_counter() < end:
        pass
    time.sleep((1 - busy) * 0.1)
"""

# role as registered, busy share, threads, has a child
TREE = [("trainer", 0.5, 8, True), ("inference", 0.5, 12, True), ("orchestrator", 0.1, 4, True),
        ("wandb", 0.0, 2, False), ("reaper", 0.0, 1, False), ("teacher", 0.0, 6, False)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S)
    parser.add_argument("--children", type=int, default=len(TREE), help=f"processes started (1-{len(TREE)})")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    args = parser.parse_args()
    if not 1 <= args.children <= len(TREE):
        parser.error(f"--children must be between 1 and {len(TREE)}")
    with tempfile.TemporaryDirectory(prefix="system-sampler-") as home:
        run = RunRegistry(Path(home) / "runs").create("rl", config_text="", resolved={}, model="bench", envs=[],
                                                      max_steps=1)
        run.register_process("launcher", os.getpid())
        children = []
        try:
            for role, busy, threads, child in TREE[:args.children]:
                process = subprocess.Popen([sys.executable, "-c", WORKER, str(busy), str(threads), str(int(child))],
                                           start_new_session=True)  # its group: it and its child end together
                children.append(process)
                run.register_process(role, process.pid)
            time.sleep(0.5)  # the children's own children start
            sampler = SystemSampler.for_run(run, interval_s=args.interval)
            start = time.perf_counter()
            sampler.start()
            time.sleep(args.seconds)
            sampler.stop()
            wall = time.perf_counter() - start
        finally:
            for process in children:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        events = [e for e in run.event_log().events() if e.kind == SYSTEM]
    machine = len(os.listdir("/proc")) if Path("/proc").is_dir() else 0
    processes = len(events[-1].data["processes"]) if events else 0
    share = sampler.cpu_seconds / wall
    per_sample = sampler.cpu_seconds / max(1, sampler.samples + 1) * 1000  # +1: the priming walk
    figures = {"share_of_core": share, "cpu_seconds": sampler.cpu_seconds, "wall_seconds": wall,
               "samples": sampler.samples, "ms_per_sample": per_sample, "processes_sampled": processes,
               "interval_s": args.interval, "gpus": len(events[-1].data["gpus"]) if events else 0,
               "goal": GOAL, "met": share < GOAL}
    print(f"sampled {processes} processes (the run's tree) every {args.interval:g} s for {wall:.1f} s: "
          f"{sampler.samples} samples, {len(events)} system events written")
    print(f"the sampler thread's CPU time:   {sampler.cpu_seconds * 1000:10.1f} ms  ({per_sample:.1f} ms a sample, "
          f"/proc holds ~{machine} entries)")
    print(f"share of one core:               {share:10.3%}   goal < {GOAL:.0%}: {'met' if share < GOAL else 'NOT met'}")
    print(json.dumps(figures))
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
