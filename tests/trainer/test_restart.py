"""An RL run's restart lifecycle (trainer/launcher.py `restart`, which `prime rl restart` calls): what it refuses,
with what to do, and what a new attempt writes before its supervisor starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from prime_lab.runs.events import RESTART
from prime_lab.runs.registry import Run, RunRegistry
from prime_lab.trainer import launcher


def _run(kind: str = "rl", max_steps: int = 5, checkpoints: tuple[int, ...] = ()) -> Run:
    run = RunRegistry().create(kind, config_text="", resolved={}, max_steps=max_steps)
    for step in checkpoints:
        folder = run.checkpoints_dir / f"step_{step}"
        folder.mkdir(parents=True)
        (folder / "trainer_state.pt").write_bytes(b"")
    run.set_state("failed", reason="killed")
    return run


@pytest.mark.parametrize(("kind", "state", "checkpoints", "says"), [
    ("eval", "failed", (1,), "only RL and SFT runs restart"),
    ("rl", "running", (1,), "stop it first"),
    ("rl", "failed", (), "no checkpoint yet"),
    ("rl", "failed", (5,), "already trained all 5 steps"),
    ("sft", "running", (1,), "stop it first \\(`prime sft stop"),
    ("sft", "failed", (), "no checkpoint yet.*prime sft run"),
])
def test_what_cannot_restart_is_refused_with_what_to_do(kind: str, state: str, checkpoints: tuple[int, ...],
                                                        says: str) -> None:
    run = _run(kind, checkpoints=checkpoints)
    run.set_state(state)
    with pytest.raises(launcher.LaunchFailed, match=says):
        launcher.restart(run)
    assert run.attempt == 1 and not any(e.kind == RESTART for e in run.event_log().events())


def test_a_restart_rewinds_to_the_newest_complete_checkpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    run = _run(checkpoints=(2, 4))
    (run.checkpoints_dir / "step_5").mkdir()  # cut short: no trainer_state.pt
    for step in (4, 5, 6):
        (run.rollouts_dir / f"step_{step}.jsonl").write_text("")
    started: list[tuple[Path, bool]] = []
    monkeypatch.setattr(launcher, "start_supervisor", lambda r, resume, env=None: started.append((r.dir, resume)))
    assert launcher.restart(run) == 4
    assert started == [(run.dir, True)]
    assert sorted(p.name for p in run.rollouts_dir.iterdir()) == ["step_4.jsonl"]
    status = run.status()
    assert status["state"] == "queued" and status["step"] == 4 and run.attempt == 2
    restarts = [e for e in run.event_log().events() if e.kind == RESTART]
    assert [(e.step, e.data) for e in restarts] == [(4, {"from_step": 4, "attempt": 2})]
