"""`prime gepa run` end to end through real HTTP: the built-in server with the tiny model is the task model, a
deterministic stand-in (the scripted endpoint) is the reflection model. The outputs match the documented schema."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

from prime_lab.runs.events import EventLog
from prime_lab.runs.registry import Run
from tests.envs.scripted import scripted_endpoint
from tests.gepa.reflection_standin import write_gepa_config
from tests.support import cli

prime = partial(cli.prime, timeout=300)
PROPOSALS = [f"```\nReverse the text character by character (attempt {i}). "
             "Answer inside <reversed_text> tags.\n```" for i in range(40)]


def test_gepa_run_through_the_builtin_server(builtin_server: Any, tmp_path: Path) -> None:
    with scripted_endpoint(list(PROPOSALS)) as reflection:
        config = write_gepa_config(tmp_path / "gepa.toml", builtin_server, reflection, "reverse-text", max_calls=30,
                                   num_train=6, num_val=4, seed=1)
        run_dir = tmp_path / "runs" / "my-gepa"
        proc = prime("gepa", "run", f"@{config}", "-o", str(run_dir), "--test", "3", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "best prompt:" in proc.stdout and "test (3 held-out)" in proc.stdout
    out = run_dir / "gepa"
    meta = json.loads((out / "metadata.json").read_text())
    assert set(meta) >= {"num_candidates", "best_idx", "best_score", "total_metric_calls", "completed_at", "config"}
    assert meta["config"] == {"env_id": "reverse-text", "env_args": {}, "model": builtin_server.model_name,
                              "reflection_model": "stand-in", "num_train": 6, "num_val": 4,
                              "max_metric_calls": 30, "minibatch_size": 2, "perfect_score": None,
                              "state_columns": [], "seed": 1}
    assert 0 < meta["total_metric_calls"] <= 30 and meta["completed_at"]
    rows = [json.loads(line) for line in (out / "pareto_frontier.jsonl").read_text().splitlines()]
    assert [r["valset_row"] for r in rows] == [0, 1, 2, 3]
    for row in rows:
        assert row["num_best_prompts"] == len(row["best_prompts"]) >= 1
        for best in row["best_prompts"]:
            assert set(best) == {"candidate_idx", "system_prompt", "score"}
            assert best["score"] == row["best_score"]
    candidates = [json.loads(line) for line in (out / "candidates.jsonl").read_text().splitlines()]
    assert len(candidates) == meta["num_candidates"]
    best_text = candidates[meta["best_idx"]]["texts"]["system_prompt"]
    assert (out / "best_prompt.txt").read_text() == best_text
    # the reflection stand-in was asked with our prompt, showing the task model's real outputs
    assert reflection.requests and "Generated Outputs" in reflection.requests[0]["messages"][0]["content"]
    for accepted in candidates[1:]:
        assert accepted["texts"]["system_prompt"].startswith("Reverse the text character by character (attempt")
    run = Run(run_dir)
    assert run.state == "completed"
    kinds = {e.kind for e in EventLog(run.events_path).events()}
    assert {"gepa.iteration", "gepa.candidate", "gepa.frontier", "gepa.budget"} <= kinds
    # a finished run resumes to the same result without spending anything
    again = prime("gepa", "run", "--resume", str(run_dir), cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert json.loads((out / "metadata.json").read_text())["total_metric_calls"] == meta["total_metric_calls"]
