"""Helpers of the end-to-end RL tests: a config on the tiny learnable model, `prime rl run` as a user runs it, and
waiting for and reading the run. A test module that starts runs imports `fixture_envs` too (autouse: the run's
processes find the test environments as installed modules)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from prime_lab.runs.registry import FINAL_STATES, Run, RunRegistry
from tests.support import cli

FIXTURE_ENVS = Path(__file__).resolve().parents[1] / "fixtures" / "envs"
def write_envs_config(path: Path, model: Path, envs: dict[str, dict[str, Any]], *, steps: int = 2,
                      batch_size: int = 16) -> Path:
    """A short LoRA run on `model` over `envs` (id -> load_environment arguments), sampling 8 tokens, on the
    built-in server: what the end-to-end tests of real (verifiers) environments run."""
    def table(args: dict[str, Any]) -> str:
        return "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in args.items()) + " }"

    tables = "".join(f'\n[[env]]\nid = "{e}"\n' + (f"args = {table(args)}\n" if args else "")
                     for e, args in envs.items())
    path.write_text(f"""
model = "{model}"
max_steps = {steps}
batch_size = {batch_size}
rollouts_per_example = 4
learning_rate = 1e-2
{tables}
[sampling]
max_tokens = 8
seed = 0

[buffer]
seed = 0

[inference]
backend = "builtin"

[lora]
r = 8
alpha = 16
target_modules = ["q_proj", "v_proj"]
""")
    return path


@pytest.fixture(autouse=True)
def fixture_envs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's processes find the test environment as an installed module (PYTHONPATH)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(FIXTURE_ENVS), os.environ.get("PYTHONPATH")])))


def write_config(path: Path, model: Path, *, steps: int = 20, backend: str = "builtin", seed: int = 0,
                 extra: str = "", lr: float = 1e-2, async_level: int = 1, checkpoint_interval: int = 10) -> Path:
    path.write_text(f"""
model = "{model}"
max_steps = {steps}
batch_size = 16
rollouts_per_example = 4
learning_rate = {lr}
max_async_level = {async_level}

[sampling]
max_tokens = 8
seed = {seed}

[[env]]
id = "tiny-chars"
args = {{ target = "letters" }}

[buffer]
seed = {seed}

[inference]
backend = "{backend}"

[lora]
r = 8
alpha = 16
target_modules = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

[checkpoints]
interval = {checkpoint_interval}
{extra}
""")
    return path


def prime(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`prime ARGS` (tests.support.cli's) with ten minutes to end: a run or restart in the foreground does."""
    return cli.prime(*args, timeout=timeout)


def start(config: Path, *extra: str, kind: str = "rl") -> Run:
    """`prime KIND run @config [EXTRA...]` as a user runs it: the run id on stdout, how to follow it on stderr."""
    proc = prime(kind, "run", f"@{config}", *extra)
    assert proc.returncode == 0, proc.stderr
    run_id = proc.stdout.strip()
    assert f"prime {kind} logs {run_id} -f" in proc.stderr
    return RunRegistry().get(run_id)


def wait_final(run: Run, timeout: float = 300.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = run.status()
        if status.get("state") in FINAL_STATES and not run.live_processes():
            return status
        time.sleep(0.25)
    raise AssertionError(f"{run.id} did not end within {timeout:g} s: {run.status()}\n" + logs(run))


def wait_step(run: Run, step: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while int(run.read_status().get("step") or 0) < step:
        assert time.monotonic() < deadline, f"{run.id} never reached step {step}: {run.status()}\n" + logs(run)
        assert run.state not in FINAL_STATES, logs(run)
        time.sleep(0.1)


def logs(run: Run) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(run.logs_dir.glob("*.log")))


def metrics(run: Run, source: str) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    for e in run.event_log().events():
        if e.kind == "metrics" and e.source == source and e.step is not None:
            out.setdefault(e.step, {}).update(e.data)
    return out


def rewards(run: Run) -> list[float]:
    by_step = metrics(run, "orchestrator")
    return [by_step[k]["reward/mean"] for k in sorted(by_step)]
