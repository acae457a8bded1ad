"""Shared set-up for the workbench tests: a folder with configs, fixed runs, the app in test mode."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from textual.pilot import Pilot

from prime_lab.runs.registry import Run, RunRegistry
from prime_lab.workbench.app import LabApp, create_app
from prime_lab.workbench.screens.run import RunScreen

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
WAIT = 30.0  # seconds a test waits for the app before failing: generous, a loaded CI machine is slow


async def until(pilot: Pilot[Any], condition: Callable[[], bool], timeout: float = WAIT,
                what: Callable[[], object] = lambda: "") -> None:
    """Wait (letting the app run) until `condition()`; fail after `timeout` seconds, saying `what()`. Tests wait
    for what they assert instead of pausing a fixed time, which a loaded machine outlasts."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for the app {what()}"
        await pilot.pause(0.05)


def caught_up(screen: Any) -> bool:
    """A run page that has folded its whole event log, gone live and drawn it (not a run page: True)."""
    if not isinstance(screen, RunScreen):
        return True
    return screen.shown_live and screen.event_offset >= screen.run.events_path.stat().st_size \
        and not screen.changed.is_set()


def record_notifications(app: LabApp) -> list[str]:
    """Every message the app notifies from now on (the app's own list drops a toast once its timeout passed, which a
    slow test can outlast)."""
    messages: list[str] = []
    notify = app.notify

    def recorded(message: str, *args: Any, **kwargs: Any) -> None:
        messages.append(message)
        notify(message, *args, **kwargs)

    app.notify = recorded  # type: ignore[method-assign]
    return messages


async def settle(pilot: Pilot[Any]) -> None:
    """Before a snapshot: until a run page has folded its whole event log and redrawn (a fixed pause was too short
    on a loaded machine), then let the last redraw and animations land."""
    await pilot.pause()
    await until(pilot, lambda: caught_up(pilot.app.screen))
    await pilot.pause(0.5)
    await pilot.wait_for_scheduled_animations()
    await pilot.pause(0.2)


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
