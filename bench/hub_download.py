"""What prime-lab's model download costs: a model from a loopback Hugging Face Hub, against `hf download` of the same
files in the same run.

    .venv/bin/python bench/hub_download.py [--size 500] [--shards 2] [--rounds 5] [--workdir DIR]

The model is made for the run in a temporary folder (deleted at the end): --shards `model-0000i-of-0000n.safetensors`
files of random bytes (a valid safetensors header, one uint8 tensor each), --size MB in all, with a config.json and a
tokenizer.json. The loopback Hub (tests/support/hf_hub.py) serves them from disk with `sendfile`, in this process.
Each download is a process of its own into an empty cache of its own (HF_HUB_CACHE): prime-lab's
`models/download.py download_model` (what `prime rl run`, `prime serve` and the rest call), and the huggingface_hub
CLI's `hf download` (.venv/bin/hf), the two taking turns round by round so that other work on the machine slows both
alike; each round's caches are deleted after it.

Printed, per round, and the median and the best of --rounds for each: the process's wall time from start to exit (its
imports included, as a user waits for it), MB/s over the model's bytes and its CPU seconds; prime-lab's against `hf
download`'s as a ratio (the goal reads the medians: on a shared machine the best is whoever ran while it was quiet);
the peak memory of each process (its VmHWM), and prime-lab's above its own baseline (its RSS once huggingface_hub and
prime-lab's download module are imported, before the download starts). The downloaded weights are checked against
the served ones (sha256) once.

Goals (issue 43): >= 0.95x the throughput of `hf download`; peak memory < 200 MB above the process's baseline. The
last line says each goal's verdict; the exit code is 0 whether or not they are met (a figure, not a test).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.hf_hub import HubRepo, loopback_hub  # noqa: E402

MB = 1_000_000
REPO_ID = "bench/random-weights"
# prime-lab's download in a process of its own: its RSS once the download's modules are imported (the baseline), the
# download, then its peak RSS (VmHWM: this process image's own; ru_maxrss would count the parent's RSS at the fork),
# as one JSON line on stdout
CHILD = """
import io, json, sys, time
import huggingface_hub.file_download, huggingface_hub.hf_api
from prime_lab.models.download import download_model
def status(key):
    with open("/proc/self/status") as file:
        return next(int(line.split()[1]) * 1024 for line in file if line.startswith(key + ":"))
baseline = status("VmRSS")
started = time.perf_counter()
folder = download_model(sys.argv[1], out=io.StringIO())
seconds = time.perf_counter() - started
print(json.dumps({"folder": str(folder), "baseline": baseline, "download_s": seconds, "peak": status("VmHWM")}))
"""


def make_model(folder: Path, size: int, shards: int) -> dict[str, bytes | Path]:
    """--shards safetensors files of random bytes, `size` bytes of tensors in all, and two small files."""
    files: dict[str, bytes | Path] = {}
    each = size // shards
    for index in range(1, shards + 1):
        name = f"model-{index:05d}-of-{shards:05d}.safetensors"
        header = json.dumps({f"layer{index}.weight": {"dtype": "U8", "shape": [each], "data_offsets": [0, each]}})
        padded = header.encode().ljust((len(header) + 7) // 8 * 8)
        path = folder / name
        with path.open("wb") as file:
            file.write(len(padded).to_bytes(8, "little") + padded)
            left = each
            while left:
                piece = min(left, 16 << 20)
                file.write(os.urandom(piece))
                left -= piece
        files[name] = path
    files["config.json"] = json.dumps({"model_type": "bench", "architectures": ["Bench"]}).encode()
    files["tokenizer.json"] = json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": {}}}).encode()
    return files


@dataclass
class Run:
    seconds: float  # wall, start to exit
    cpu: float  # user + system seconds
    peak: int  # VmHWM, bytes
    report: dict[str, Any]  # prime-lab's child's JSON line ({} for hf download)


def run_child(command: list[str], env: dict[str, str], logs: Path) -> Run:
    """`command` to its exit: wall and CPU seconds (wait4), its peak RSS (its VmHWM, read every 20 ms while it runs:
    the growth of its last 20 ms can be missed), and the JSON line it printed last, if any."""
    logs.mkdir(parents=True, exist_ok=True)
    peak = 0
    with (logs / "out").open("w") as out, (logs / "err").open("w") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=err)
        while True:
            peak = max(peak, high_water(proc.pid))
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            time.sleep(0.02)
        seconds = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"Error: {Path(command[0]).name} {command[1]} failed ({proc.returncode}): "
                         f"{(logs / 'err').read_text().strip()[-500:]}")
    lines = (logs / "out").read_text().strip().splitlines()
    report = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}
    return Run(seconds, usage.ru_utime + usage.ru_stime, peak, report)


def high_water(pid: int) -> int:
    """A process's peak RSS so far (VmHWM, bytes); 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as file:
            return next((int(line.split()[1]) * 1024 for line in file if line.startswith("VmHWM:")), 0)
    except OSError:
        return 0


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(8 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def hf_download(cache: Path, env: dict[str, str]) -> Run:
    hf = str(Path(sys.executable).parent / "hf")
    return run_child([hf, "download", REPO_ID, "--cache-dir", str(cache)], {**env, "HF_HUB_CACHE": str(cache)},
                     cache.with_name("hf-logs"))


def prime_download(cache: Path, env: dict[str, str]) -> Run:
    return run_child([sys.executable, "-c", CHILD, REPO_ID], {**env, "HF_HUB_CACHE": str(cache)},
                     cache.with_name("prime-logs"))


def mb(value: float) -> str:
    return f"{value / MB:.1f} MB"


def row(seconds: float, cpu: float, total: int) -> str:
    return f"{seconds:>8.2f} s {total / seconds / MB:>7.1f} MB/s {cpu:>6.2f} cpu-s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=500, help="MB of weights in all (default 500)")
    parser.add_argument("--shards", type=int, default=2, help="safetensors files (default 2)")
    parser.add_argument("--rounds", type=int, default=5, help="downloads of each, taking turns (default 5)")
    parser.add_argument("--workdir", type=Path, default=None, help="where the model and caches go (default: a "
                        "temporary folder, deleted at the end)")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="prime-lab-bench-hub-", dir=args.workdir))
    try:
        return bench(args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def bench(args: argparse.Namespace, workdir: Path) -> int:
    (workdir / "model").mkdir()
    started = time.perf_counter()
    files = make_model(workdir / "model", args.size * MB, args.shards)
    repo = HubRepo(REPO_ID, files)  # hashes the files once, before anything is timed
    total = sum(size for size, _, _ in repo.hashes.values())
    print(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; model {REPO_ID}: {len(files)} files, "
          f"{mb(total)} ({args.shards} safetensors), made in {time.perf_counter() - started:.1f} s in {workdir}")
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_TOKEN", "HF_HOME")}
    env.update(HF_HUB_DISABLE_TELEMETRY="1")
    ours: list[Run] = []
    theirs: list[Run] = []
    with loopback_hub([repo]) as hub:
        env["HF_ENDPOINT"] = hub.url
        print(f"\n{'round':<8}{'hf download':>32}{'prime-lab':>32}")
        for index in range(args.rounds):
            caches = workdir / f"round-{index}"
            for who in ("hf", "prime") if index % 2 == 0 else ("prime", "hf"):
                if who == "hf":
                    theirs.append(hf_download(caches / "hf", env))
                else:
                    ours.append(prime_download(caches / "prime", env))
            if index == 0:
                folder = Path(ours[-1].report["folder"])
                for name, (_, _, sha256) in repo.hashes.items():
                    assert sha256_of(folder / name) == sha256, f"{name} differs from the Hub's"
            print(f"{index + 1:<8}{row(theirs[-1].seconds, theirs[-1].cpu, total)}"
                  f"{row(ours[-1].seconds, ours[-1].cpu, total)}")
            shutil.rmtree(caches)
    for label, pick in (("median", statistics.median), ("best", min)):
        wall_theirs, wall_ours = pick(r.seconds for r in theirs), pick(r.seconds for r in ours)
        print(f"{label:<8}{row(wall_theirs, pick(r.cpu for r in theirs), total)}"
              f"{row(wall_ours, pick(r.cpu for r in ours), total)}   {wall_theirs / wall_ours:.2f}x hf download's")
    ratio = statistics.median(r.seconds for r in theirs) / statistics.median(r.seconds for r in ours)
    cpu_ratio = statistics.median(r.cpu for r in theirs) / statistics.median(r.cpu for r in ours)
    transfer = statistics.median(float(r.report["download_s"]) for r in ours)
    above = max(int(r.report["peak"]) - int(r.report["baseline"]) for r in ours)
    baseline = max(int(r.report["baseline"]) for r in ours)
    print(f"\nCPU seconds (medians): prime-lab's {cpu_ratio:.2f}x as few as hf download's; prime-lab's download itself "
          f"(its imports left out): {transfer:.2f} s, {total / transfer / MB:.1f} MB/s (median)")
    print(f"peak memory: hf download's process {mb(max(r.peak for r in theirs))}; prime-lab's process "
          f"{mb(max(r.peak for r in ours))}, its baseline {mb(baseline)}: {mb(above)} above it (the most of "
          f"{len(ours)})")
    goals = [(f"throughput {ratio:.2f}x hf download, medians (goal >= 0.95x)", ratio >= 0.95),
             (f"peak memory {mb(above)} above the baseline (goal < 200 MB)", above < 200 * MB)]
    print("\ngoals: " + "; ".join(f"{text}: {'met' if ok else 'NOT met'}" for text, ok in goals))
    return 0


if __name__ == "__main__":
    sys.exit(main())
