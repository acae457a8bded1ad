"""`prime gepa run` as a real process against the built-in server: stopped with SIGTERM while a round of parallel
proposals is in flight it ends `stopped` with its state and outputs saved, and `--resume` finishes the search
without spending any call twice (the seed's validation included)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from prime_lab.runs.events import Event, EventLog
from prime_lab.runs.registry import Run
from tests.gepa.reflection_standin import reflection_standin
from tests.support.cli import PRIME, prime, without_site_reports

BUDGET = 40


def gepa_events(run_dir: Path) -> list[Event]:
    path = run_dir / "events.jsonl"
    return [e for e in EventLog(path).events() if e.kind.startswith("gepa.")] if path.exists() else []


def wait_for_a_round_in_flight(proc: subprocess.Popen[str], run_dir: Path, timeout: float = 120) -> None:
    """Until a round after the first has spent calls (its parents' minibatches) and not finished."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1]
        events = gepa_events(run_dir)
        iterations = [e.seq for e in events if e.kind == "gepa.iteration"]
        if iterations and any(e.kind == "gepa.budget" and e.seq > iterations[-1] for e in events):
            return
        time.sleep(0.05)
    raise AssertionError("the search never reached a second round")


def test_sigterm_mid_round_then_resume_spends_nothing_twice(builtin_server: Any, tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "stop-me"
    with reflection_standin(delay=1.5) as reflection:
        config = tmp_path / "gepa.toml"
        config.write_text(f'model = "{builtin_server.model_name}"\nreflection_model = "stand-in"\n'
                          f'base_url = "{builtin_server.base_url}"\nreflection_base_url = "{reflection.base_url}"\n'
                          f'[env]\nid = "reverse-text"\n[gepa]\nmax_calls = {BUDGET}\nnum_train = 8\nnum_val = 4\n'
                          'minibatch_size = 2\nnum_parallel_proposals = 2\nreflection_temperature = 0.0\nseed = 3\n'
                          '[sampling]\nmax_tokens = 8\ntemperature = 0.0\n')
        proc = subprocess.Popen([PRIME, "gepa", "run", f"@{config}", "-o", str(run_dir)], cwd=tmp_path,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            wait_for_a_round_in_flight(proc, run_dir)
            proc.send_signal(signal.SIGTERM)
            stderr = without_site_reports(proc.communicate(timeout=60)[1])
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 1, stderr
        assert "Traceback" not in stderr and "stopped" in stderr and f"--resume {run_dir}" in stderr
        assert reflection.requests and all(r["temperature"] == 0.0 for r in reflection.requests)

        out = run_dir / "gepa"
        assert Run(run_dir).state == "stopped"
        saved = json.loads((out / "state.json").read_text())
        assert saved["stop_reason"] == "interrupted" and not saved["finished"]
        spent_before = sum(e.data["spent"] for e in gepa_events(run_dir) if e.kind == "gepa.budget")
        assert saved["metric_calls"] == spent_before, "calls spent by the interrupted round were not counted"
        assert saved["iteration"] == max(e.data["iteration"] for e in gepa_events(run_dir)
                                         if e.kind == "gepa.iteration")
        meta = json.loads((out / "metadata.json").read_text())
        assert meta["completed_at"] is None and meta["total_metric_calls"] == spent_before
        assert (out / "best_prompt.txt").exists() and (out / "pareto_frontier.jsonl").exists()

        resumed = prime("gepa", "run", "--resume", str(run_dir), cwd=tmp_path, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "best prompt:" in resumed.stdout
    assert Run(run_dir).state == "completed"
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["completed_at"] and meta["config"]["max_metric_calls"] == BUDGET
    assert spent_before < meta["total_metric_calls"] <= BUDGET
    events = gepa_events(run_dir)
    # every call either process spent is counted once: the resumed run began from the saved count
    assert sum(e.data["spent"] for e in events if e.kind == "gepa.budget") == meta["total_metric_calls"]
    assert [e.data["idx"] for e in events if e.kind == "gepa.candidate"].count(0) == 1, "the seed was re-scored"
    candidates = [json.loads(line) for line in (out / "candidates.jsonl").read_text().splitlines()]
    assert len(candidates) == meta["num_candidates"]
    assert candidates[0]["texts"] == saved["candidates"][0]
    assert (out / "best_prompt.txt").read_text() == candidates[meta["best_idx"]]["texts"]["system_prompt"]
    rows = [json.loads(line) for line in (out / "pareto_frontier.jsonl").read_text().splitlines()]
    assert [r["valset_row"] for r in rows] == [0, 1, 2, 3]
    # the resumed search carried on where it stopped, with rounds of two parallel proposals
    iterations = [e.data for e in events if e.kind == "gepa.iteration"]
    assert [d["iteration"] for d in iterations] == list(range(1, len(iterations) + 1))
    assert any(d["round_size"] == 2 for d in iterations)
