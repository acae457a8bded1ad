"""Event bus throughput: events/s written by N writer processes into one log, and events/s read back.

    .venv/bin/python bench/events.py [--writers 4] [--events 20000]

Prints events/s written (all writers together), events/s replayed by a reader from offset 0, and events/s seen
by a reader following the log live while the writers run. The peer is a plain JSON-lines append without the
lock and the global sequence number, measured in the same run, so the ratio shows what the guarantees cost.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prime_lab.runs.events import EventLog  # noqa: E402

OURS = """
import sys
from prime_lab.runs.events import EventWriter
path, count = sys.argv[1], int(sys.argv[2])
with EventWriter(path, "trainer") as w:
    for i in range(count):
        w.emit("metrics", {"reward/mean": 0.5, "loss": 1.25, "i": i}, step=i)
"""

# The peer: what a run would do with no bus at all (append json lines, no lock, no seq).
PLAIN = """
import json, os, sys, time
path, count = sys.argv[1], int(sys.argv[2])
fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
for i in range(count):
    line = json.dumps({"time": time.time(), "source": "trainer", "kind": "metrics", "step": i,
                       "data": {"reward/mean": 0.5, "loss": 1.25, "i": i}}, separators=(",", ":")) + "\\n"
    os.write(fd, line.encode())
"""


def write_with(script: str, path: Path, writers: int, count: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    start = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", script, str(path), str(count)], env=env)
             for _ in range(writers)]
    for p in procs:
        if p.wait() != 0:
            raise SystemExit("a writer failed")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--events", type=int, default=20_000, help="events per writer")
    args = parser.parse_args()
    total = args.writers * args.events
    with tempfile.TemporaryDirectory() as tmp:
        ours, plain = Path(tmp) / "ours.jsonl", Path(tmp) / "plain.jsonl"
        seen = [0]
        done = threading.Event()

        def follow() -> None:
            for _ in EventLog(ours).tail(0, follow=True, poll=0.005, stop=done.is_set):
                seen[0] += 1

        follower = threading.Thread(target=follow)
        follower.start()
        t_ours = write_with(OURS, ours, args.writers, args.events)
        done.set()
        follower.join()
        t_plain = write_with(PLAIN, plain, args.writers, args.events)
        start = time.perf_counter()
        replayed = len(EventLog(ours).events())
        t_read = time.perf_counter() - start
    assert replayed == total and seen[0] == total, (replayed, seen[0], total)
    print(f"writers: {args.writers} processes x {args.events} events = {total} events")
    print(f"written, event bus (flock + global seq): {total / t_ours:12,.0f} events/s  ({t_ours:.2f} s)")
    print(f"written, plain append (no lock, no seq):  {total / t_plain:12,.0f} events/s  ({t_plain:.2f} s)")
    print(f"ratio event bus / plain append:           {t_plain / t_ours:12.2f}")
    print(f"replayed from offset 0:                   {total / t_read:12,.0f} events/s  ({t_read:.2f} s)")
    print(f"followed live while writing:              {seen[0]:12,} of {total} events seen")
    print(json.dumps({"write_eps": total / t_ours, "plain_write_eps": total / t_plain,
                      "ratio": t_plain / t_ours, "read_eps": total / t_read}))


if __name__ == "__main__":
    main()
