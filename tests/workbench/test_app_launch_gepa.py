"""The workbench launches a GEPA config through its one launch path (`workbench.launch`): the detached
`prime gepa run @config` registers a run the app finds by pid, and that run reaches `completed` with its outputs,
against the real built-in server (tiny model) and a deterministic reflection stand-in."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from prime_lab.runs.registry import RunRegistry
from prime_lab.workbench.launch import config_argv, launch, wait_for_run
from tests.gepa.reflection_standin import reflection_standin


def test_a_gepa_config_launched_from_the_workbench_completes(builtin_server: Any, tmp_path: Path,
                                                             lab_home: Path) -> None:
    with reflection_standin() as reflection:
        config = tmp_path / "configs" / "gepa" / "quick.toml"
        config.parent.mkdir(parents=True)
        config.write_text(f'model = "{builtin_server.model_name}"\nreflection_model = "stand-in"\n'
                          f'base_url = "{builtin_server.base_url}"\nreflection_base_url = "{reflection.base_url}"\n'
                          '[env]\nid = "reverse-text"\n[gepa]\nmax_calls = 24\nnum_train = 6\nnum_val = 3\n'
                          'minibatch_size = 2\nseed = 2\n[sampling]\nmax_tokens = 8\ntemperature = 0.0\n')
        argv = config_argv("gepa", config)
        assert argv == ["gepa", "run", f"@{config}"]
        launched = launch(argv, cwd=tmp_path)
        try:
            run = wait_for_run(launched, RunRegistry(), timeout=60)
            assert run.dir.parent == lab_home / "runs"
            assert run.read_status().get("kind") == "gepa"
            deadline = time.monotonic() + 120
            while run.state not in ("completed", "failed", "stopped") and time.monotonic() < deadline:
                time.sleep(0.2)
            assert launched.process.wait(timeout=30) == 0, launched.log_path.read_text()
        finally:
            if launched.exit_code() is None:
                launched.process.kill()
        assert reflection.requests, "the search never reflected"
    assert run.state == "completed", launched.log_path.read_text()
    meta = json.loads((run.gepa_dir / "metadata.json").read_text())
    assert meta["completed_at"] and 0 < meta["total_metric_calls"] <= 24
    assert meta["config"]["env_id"] == "reverse-text" and meta["config"]["max_metric_calls"] == 24
    assert (run.gepa_dir / "best_prompt.txt").read_text()
    assert len((run.gepa_dir / "pareto_frontier.jsonl").read_text().splitlines()) == 3
    assert run.read_status().get("step", 0) >= 1
    assert "best prompt:" in launched.log_path.read_text()
