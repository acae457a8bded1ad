"""Shared set-up for the workbench tests: a folder with configs, fixed runs, the app in test mode."""

from __future__ import annotations

import shutil
from pathlib import Path

from lab.runs import Run, RunRegistry
from workbench.app import LabApp, create_app

REPO = Path(__file__).resolve().parents[2]
FROZEN = 1_750_000_000.0
SIZE = (80, 24)


def lab_folder(tmp_path: Path) -> Path:
    """A project folder with two RL configs (the commented default one among them)."""
    root = tmp_path / "project"
    (root / "configs" / "rl").mkdir(parents=True)
    for name in ("reverse-text.toml", "multi-env.toml"):
        shutil.copyfile(REPO / "configs" / "rl" / name, root / "configs" / "rl" / name)
    return root


def fixed_run(run_id: str, kind: str = "rl", state: str = "completed", **status: object) -> Run:
    run = RunRegistry().create(kind, config_text="", resolved={}, model="smollm2-135m",
                               envs=["primeintellect/reverse-text"], max_steps=30, run_id=run_id)
    run.update_status(state=state, created_at=FROZEN - 600, started_at=FROZEN - 540, **status)
    with run.writer("orchestrator") as writer:
        writer.log("orchestrator started", step=0)
        writer.metrics({"reward/mean": 0.25, "loss": 0.5}, step=1)
    return run


def make_app(path: Path, run_id: str | None = None) -> LabApp:
    return create_app(path, run_id=run_id, frozen_time=FROZEN, poll_interval=0.05)


FIXTURES = Path(__file__).resolve().parent / "fixtures"


def recorded_run(name: str, run_id: str | None = None, *, events: int | None = None) -> Run:
    """A recorded run from tests/workbench/fixtures/ copied into this test's registry (optionally only its first
    `events` lines of events.jsonl, for tests that append the rest while the app runs)."""
    target = RunRegistry().root / (run_id or name)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(FIXTURES / name, target)
    if events is not None:
        lines = (FIXTURES / name / "events.jsonl").read_text().splitlines(keepends=True)
        (target / "events.jsonl").write_text("".join(lines[:events]))
    return Run(target)


def fixture_lines(name: str) -> list[str]:
    return (FIXTURES / name / "events.jsonl").read_text().splitlines(keepends=True)
