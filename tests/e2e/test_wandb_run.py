"""`[wandb]` in a real `prime rl run`: the supervisor starts the W&B mirror, which writes an offline W&B run under
the run directory (no network here) holding every metric of every step, readable with wandb's own reader; the key
given with --wandb-api-key reaches W&B through the environment only, never a file of the run."""

from __future__ import annotations

from pathlib import Path

import pytest

from prime_lab.runs.events import final_timeline
from tests.monitors.test_wandb_mirror import history, offline_files, records
from tests.support.rl_runs import fixture_envs, logs, prime, wait_final, write_config

pytestmark = pytest.mark.slow
__all__ = ["fixture_envs"]  # autouse: the run's processes find the tiny-chars environment
KEY = "local-0123456789abcdef0123456789abcdef01234567"


def test_an_rl_run_with_wandb_is_mirrored_offline(learnable_model_dir: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from prime_lab.runs.registry import RunRegistry

    monkeypatch.setenv("WANDB_MODE", "offline")
    config = write_config(tmp_path / "rl.toml", learnable_model_dir, steps=3, checkpoint_interval=3,
                          extra='[wandb]\nproject = "prime-lab-tests"\nname = "tiny-chars"\n')
    proc = prime("rl", "run", f"@{config}", "--wandb-api-key", KEY)
    assert proc.returncode == 0, proc.stderr
    run = RunRegistry().get(proc.stdout.strip())
    status = wait_final(run)
    assert status["state"] == "completed", logs(run)

    events = final_timeline(run.event_log().events())
    expected = {e.step: e.data for e in events if e.kind == "metrics" and e.source == "trainer"}
    assert sorted(expected) == [1, 2, 3]
    [wandb_file] = offline_files(run)
    items = {item["_step"]: item for item in history(records(wandb_file))}
    for step, values in expected.items():
        for name, value in values.items():
            assert items[step][name] == pytest.approx(value), (step, name)
        assert "reward/mean" in items[step]  # the orchestrator's metrics of the same step
    assert any("wandb sync" in str(e.data.get("message")) for e in events if e.kind == "log")

    leaked = [p for p in run.dir.rglob("*") if p.is_file() and KEY.encode() in p.read_bytes()]
    assert not leaked, f"the W&B key was written to {leaked}"
