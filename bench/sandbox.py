"""What a local sandbox costs: create + one `python -c` + delete against a bare subprocess of the same command.

    .venv/bin/python bench/sandbox.py [--rounds 30] [--concurrent 64] [--home DIR]

The sandboxes are prime-lab's own (sandbox/local.py: bubblewrap namespaces, rlimits, a wall clock), in a sandbox home
of the bench's own (a temporary folder unless --home); the image `python:3.11-slim`, which maps to this machine's
python3.11 (its pip environment is made once per machine, before anything is timed). The peer is a bare
`subprocess.run` of the same interpreter with the same `-c` (no namespaces, no limits), measured in the same run,
the two taking turns round by round so that other work on the machine slows both alike.

Printed:
- create-to-first-output: `create` + `execute(python -c ...)` (its output back), and `delete`, p50 and p95 of
  --rounds, beside the bare subprocess's p50 and p95; the ratio of the p50s.
- --concurrent sandboxes at once on this machine's cores: each created and its command run through `aexecute`
  concurrently (asyncio); the wall clock, and each sandbox's create-to-output p50 and p95.
- memory per idle sandbox: the bench process's RSS grown by holding --concurrent idle sandboxes, plus the RSS of any
  process they run (an idle sandbox runs none), divided by their count.

Goals (issue 44): create-to-first-output <= 3x the bare subprocess, p95 < 150 ms; memory per idle sandbox < 5 MB.
The last line says each goal's verdict; the exit code is 0 whether or not they are met (a figure, not a test), and
1 when a sandbox cannot be made here (no user namespaces: the one-line reason).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMAND = "print(6 * 7)"
EXPECTED = "42"


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def rss_bytes(pid: int) -> int:
    import psutil

    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--concurrent", type=int, default=64)
    parser.add_argument("--home", type=Path, default=None, help="the sandbox home (default: a temporary folder)")
    args = parser.parse_args(argv)
    home = args.home or Path(tempfile.mkdtemp(prefix="prime-lab-bench-sandbox-"))
    os.environ["PRIME_LAB_SANDBOXES"] = str(home)

    from prime_lab.sandbox import SandboxError, SandboxSpec, create
    from prime_lab.sandbox.local import resolve_image

    spec = SandboxSpec(name="bench", image="python:3.11-slim")
    try:
        python = resolve_image(spec.image).python  # the pip environment, made once, before anything is timed
        warm = create(spec)
        warm.execute(f"python -c '{COMMAND}'")
        warm.delete()
    except SandboxError as exc:
        print(f"Error: no sandbox on this machine: {exc}", file=sys.stderr)
        return 1
    print(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; interpreter {python}; home {home}")

    bare: list[float] = []
    first_output: list[float] = []
    whole: list[float] = []
    for _ in range(args.rounds):
        started = time.perf_counter()
        done = subprocess.run([python, "-c", COMMAND], capture_output=True, text=True, check=False)
        bare.append(time.perf_counter() - started)
        assert done.stdout.strip() == EXPECTED, done
        started = time.perf_counter()
        sandbox = create(spec)
        result = sandbox.execute(f"python -c '{COMMAND}'")
        first_output.append(time.perf_counter() - started)
        sandbox.delete()
        whole.append(time.perf_counter() - started)
        assert result.stdout.strip() == EXPECTED and result.exit_code == 0, result
    ratio = statistics.median(first_output) / statistics.median(bare)
    print(f"\n{'':28}{'p50':>10}{'p95':>10}   ({args.rounds} rounds)")
    print(f"{'bare subprocess':28}{ms(statistics.median(bare)):>10}{ms(quantile(bare, 0.95)):>10}")
    print(f"{'sandbox create-to-output':28}{ms(statistics.median(first_output)):>10}"
          f"{ms(quantile(first_output, 0.95)):>10}   {ratio:.2f}x the bare subprocess")
    print(f"{'sandbox create+run+delete':28}{ms(statistics.median(whole)):>10}{ms(quantile(whole, 0.95)):>10}")

    async def one() -> float:
        started = time.perf_counter()
        sandbox = await asyncio.to_thread(create, spec)
        result = await sandbox.aexecute(f"python -c '{COMMAND}'")
        assert result.stdout.strip() == EXPECTED, result
        seconds = time.perf_counter() - started
        await asyncio.to_thread(sandbox.delete)
        return seconds

    async def crowd() -> list[float]:
        return list(await asyncio.gather(*(one() for _ in range(args.concurrent))))

    started = time.perf_counter()
    each = asyncio.run(crowd())
    wall = time.perf_counter() - started
    print(f"\n{args.concurrent} sandboxes at once on {os.cpu_count()} cores: all done in {wall:.2f} s; "
          f"each create-to-output p50 {ms(statistics.median(each))}, p95 {ms(quantile(each, 0.95))}")

    before = rss_bytes(os.getpid())
    idle = [create(spec) for _ in range(args.concurrent)]
    grown = rss_bytes(os.getpid()) - before
    processes = sum(rss_bytes(pid) for sandbox in idle for pid in sandbox.processes())
    per = (max(grown, 0) + processes) / len(idle)
    for sandbox in idle:
        sandbox.delete()
    print(f"{args.concurrent} idle sandboxes: this process +{grown / 2**20:.2f} MiB, their processes "
          f"{processes / 2**20:.2f} MiB: {per / 2**20:.3f} MiB per idle sandbox")

    p95 = quantile(first_output, 0.95)
    goals = [(f"create-to-output {ratio:.2f}x bare (goal <= 3x)", ratio <= 3.0),
             (f"p95 {ms(p95)} (goal < 150 ms)", p95 < 0.150),
             (f"{per / 2**20:.3f} MiB per idle sandbox (goal < 5 MB)", per < 5e6)]
    print("\ngoals: " + "; ".join(f"{text}: {'met' if ok else 'NOT met'}" for text, ok in goals))
    return 0


if __name__ == "__main__":
    sys.exit(main())
