"""Every built-in environment evaluates end to end against the real built-in server (tiny model; SmolLM2 slow)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lab.runs import RunRegistry

PRIME = str(Path(sys.executable).parent / "prime")
ENVS = ["reverse-text", "alphabet-sort", "gsm8k", "wordle", "math-python"]


def prime(*args: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([PRIME, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def results(run_id: str) -> list[dict[str, Any]]:
    out = Path(RunRegistry().get(run_id).status()["output_dir"])
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("env", ENVS)
def test_builtin_env_against_the_builtin_server(env: str, builtin_server: Any, tmp_path: Path,
                                                lab_home: Path) -> None:
    proc = prime("eval", "run", env, "-b", builtin_server.base_url, "-m", builtin_server.model_name, "-n", "2",
                 "-r", "2", "-t", "12", "-S", '{"seed": 1}', cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    [run] = RunRegistry().runs()
    rows = results(run.id)
    assert len(rows) == 4
    assert all(r["error"] is None for r in rows), [r["error"] for r in rows]
    assert all(r["completion"] and r["completion"][0]["role"] == "assistant" for r in rows)
    assert all(0.0 <= r["reward"] <= 1.0 for r in rows)
    assert all(r["token_usage"]["completion_tokens"] > 0 for r in rows)


def test_eval_starts_and_stops_its_own_sampler(tiny_model_dir: Path, tmp_path: Path, lab_home: Path) -> None:
    proc = prime("eval", "run", "reverse-text", "-m", str(tiny_model_dir), "-n", "2", "-r", "2", "-t", "8",
                 cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    [run] = RunRegistry().runs()
    status = run.status()
    assert status["state"] == "completed"
    assert not run.live_processes()  # the sampler it started is gone
    assert run.log_path("inference").exists()
    assert len(results(run.id)) == 4


@pytest.mark.slow
def test_default_model_smollm2_evaluates_reverse_text(smollm2_dir: Path, tmp_path: Path, lab_home: Path) -> None:
    proc = prime("eval", "run", "primeintellect/reverse-text", "-n", "2", "-r", "2", "-t", "24", cwd=tmp_path,
                 timeout=900)
    assert proc.returncode == 0, proc.stderr
    [run] = RunRegistry().runs()
    assert run.status()["model"] == "smollm2-135m"
    rows = results(run.id)
    assert len(rows) == 4 and all(r["error"] is None for r in rows)
    assert any(r["reward"] > 0 for r in rows)  # the real model reverses at least a little
