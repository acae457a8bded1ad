"""`prime lab` launches an RL config from the editor (ctrl+r) through the same detached path as `prime rl run`, opens
the run's dashboard, and its stop and delete keys act on the real run (sampler, orchestrator and trainer)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from prime_lab.lab.runs import RunRegistry
from prime_lab.workbench.screens.dashboard_rl import RLDashboard
from prime_lab.workbench.screens.editor import EditorScreen
from tests.support.rl_runs import FIXTURE_ENVS, write_config
from tests.workbench.lab_fixtures import SIZE, lab_folder, make_app

pytestmark = pytest.mark.slow


def test_launch_an_rl_config_then_stop_and_delete_it(learnable_model_dir: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(FIXTURE_ENVS))
    root = lab_folder(tmp_path)
    config = write_config(root / "configs" / "rl" / "learn.toml", learnable_model_dir, steps=200)

    async def scenario() -> None:
        app = make_app(config)
        async with app.run_test(size=SIZE) as pilot:
            deadline = time.monotonic() + 30
            while not isinstance(app.screen, EditorScreen) and time.monotonic() < deadline:
                await pilot.pause(0.1)
            await pilot.press("ctrl+r")
            deadline = time.monotonic() + 60
            while not isinstance(app.screen, RLDashboard) and time.monotonic() < deadline:
                await pilot.pause(0.1)
            screen = app.screen
            assert isinstance(screen, RLDashboard)
            run = screen.run
            assert run.read_status()["config_file"] == str(config.resolve())
            while int(run.read_status().get("step") or 0) < 1 and time.monotonic() < deadline + 60:
                assert run.state not in ("failed", "stopped"), run.status()
                await pilot.pause(0.2)
            await pilot.press("s")  # stop: the trainer checkpoints, every process exits
            deadline = time.monotonic() + 120
            while (run.state != "stopped" or run.live_processes()) and time.monotonic() < deadline:
                await pilot.pause(0.2)
            assert run.state == "stopped" and not run.live_processes()
            assert list(run.checkpoints_dir.glob("step_*"))
            await pilot.press("x", "y")  # delete asks first
            deadline = time.monotonic() + 30
            while run.dir.exists() and time.monotonic() < deadline:
                await pilot.pause(0.1)
            assert not run.dir.exists()
            assert RunRegistry().runs() == []

    asyncio.run(scenario())
