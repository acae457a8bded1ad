"""`prime rl metrics ID --system` as a user runs it (the installed console script), on a run whose log holds the
supervisor's `system` events, written by the real EventWriter in the format runs/system_metrics.py emits."""

from __future__ import annotations

import json

from prime_lab.runs.registry import Run, RunRegistry
from tests.support.cli import prime

GIB = 2**30


def process(role: str, pid: int, cpu: float, rss: int, threads: int, **extra: object) -> dict[str, object]:
    return {"role": role, **extra, "pid": pid, "cpu_percent": cpu, "rss_bytes": rss, "threads": threads}


def finished_run() -> Run:
    """A run that ended: two samples, the orchestrator gone before the second (its last values stay)."""
    run = RunRegistry().create("rl", config_text="", resolved={}, model="m", envs=["gsm8k"], max_steps=2)
    first = [process("supervisor", 100, 0.4, GIB // 10, 3), process("trainer", 101, 99.0, 3 * GIB, 12, rank=0),
             process("orchestrator", 102, 20.0, GIB // 2, 6),
             process("env_server", 103, 5.0, GIB // 4, 2, env="gsm8k")]
    second = [process("supervisor", 100, 0.5, GIB // 10, 3), process("trainer", 101, 87.5, 4 * GIB, 13, rank=0),
              process("env_server", 103, 6.0, GIB // 4, 2, env="gsm8k")]
    gpu = {"index": 0, "name": "NVIDIA H100 80GB HBM3", "utilization_percent": 55.0, "memory_used_bytes": 20 * GIB,
           "memory_total_bytes": 80 * GIB}
    with run.writer("launcher") as writer:
        writer.emit("system", {"interval_s": 5.0, "processes": first, "gpus": [gpu]})
        writer.metrics({"loss": 1.0}, step=1)
        writer.emit("system", {"interval_s": 5.0, "processes": second, "gpus": [gpu]})
    run.set_state("completed")
    return run


def test_system_shows_each_process_latest_sample_and_the_gpus() -> None:
    run = finished_run()
    proc = prime("rl", "metrics", run.id, "--system")
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if line.strip()]
    assert rows[0] == ["PROCESS", "PID", "CPU", "%", "RSS", "THREADS"]
    assert rows[1:5] == [["supervisor", "100", "0.5", "102.4", "MiB", "3"],
                         ["trainer.0", "101", "87.5", "4.0", "GiB", "13"],  # the newest sample's
                         ["orchestrator", "102", "20.0", "512.0", "MiB", "6"],  # exited: its last sample's
                         ["env_server.gsm8k", "103", "6.0", "256.0", "MiB", "2"]]
    assert rows[5][:2] == ["GPU", "NAME"] and rows[6] == ["0", "NVIDIA", "H100", "80GB", "HBM3", "55", "20.0", "GiB",
                                                          "80.0", "GiB"]
    assert "the latest of 2 samples, every 5 s" in proc.stderr

    samples = json.loads(prime("rl", "metrics", run.id, "--system", "-o", "json").stdout)
    assert [len(s["processes"]) for s in samples] == [4, 3] and all(s["gpus"][0]["index"] == 0 for s in samples)
    assert samples[1]["processes"][1] == process("trainer", 101, 87.5, 4 * GIB, 13, rank=0)
    assert isinstance(samples[0]["time"], float) and samples[0]["interval_s"] == 5.0
    last = json.loads(prime("rl", "metrics", run.id, "--system", "-n", "1", "-o", "json").stdout)
    assert last == samples[1:]


def test_system_without_samples_and_with_step_options() -> None:
    run = RunRegistry().create("rl", config_text="", resolved={}, model="m", envs=[], max_steps=2)
    proc = prime("rl", "metrics", run.id, "--system")
    assert proc.returncode == 0 and proc.stdout == "" and f"No system metrics for {run.id} yet" in proc.stderr
    bad = prime("rl", "metrics", run.id, "--system", "--min-step", "2")
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1, bad.stderr
    assert bad.stderr.startswith("Error: --min-step and --max-step do not apply to --system")


def test_logs_leave_the_system_samples_to_metrics_system_but_with_raw() -> None:
    run = finished_run()
    plain = prime("rl", "logs", run.id)
    assert plain.returncode == 0, plain.stderr
    assert "loss" in plain.stdout and "system" not in plain.stdout.lower()
    raw = [json.loads(line) for line in prime("rl", "logs", run.id, "--raw").stdout.splitlines()]
    assert [e["kind"] for e in raw].count("system") == 2


def test_system_shows_the_sandboxes_as_one_row_with_their_count() -> None:
    run = RunRegistry().create("rl", config_text="", resolved={}, model="m", envs=["code-tests"], max_steps=2)
    sandboxes = process("sandbox", 200, 140.0, GIB // 4, 9, count=3, processes=7)
    with run.writer("launcher") as writer:
        writer.emit("system", {"interval_s": 5.0, "processes": [process("supervisor", 100, 0.5, GIB // 10, 3),
                                                                sandboxes], "gpus": []})
    proc = prime("--plain", "rl", "metrics", run.id, "--system")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[2].split("\t") == ["sandbox ×3", "-", "140.0", "256.0 MiB", "9"]
    samples = json.loads(prime("rl", "metrics", run.id, "--system", "-o", "json").stdout)
    assert samples[0]["processes"][1] == sandboxes  # count and processes kept
