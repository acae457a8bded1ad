"""`prime lab` launches an RL config from the editor (ctrl+r) through the same detached path as `prime rl run`, opens
the run's dashboard, and its stop and delete keys act on the real run (sampler, orchestrator and trainer)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from prime_lab.runs.registry import RunRegistry
from prime_lab.workbench.screens.dashboard_rl import RLDashboard
from prime_lab.workbench.screens.editor import EditorScreen
from tests.support.rl_runs import FIXTURE_ENVS, write_config
from tests.workbench.lab_fixtures import SIZE, lab_folder, make_app, until

pytestmark = pytest.mark.slow


def test_launch_an_rl_config_then_stop_and_delete_it(learnable_model_dir: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(FIXTURE_ENVS))
    root = lab_folder(tmp_path)
    config = write_config(root / "configs" / "rl" / "learn.toml", learnable_model_dir, steps=200)

    async def scenario() -> None:
        app = make_app(config)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: isinstance(app.screen, EditorScreen))
            await pilot.press("ctrl+r")
            await until(pilot, lambda: isinstance(app.screen, RLDashboard), 60)
            screen = app.screen
            assert isinstance(screen, RLDashboard)
            run = screen.run
            assert run.read_status()["config_file"] == str(config.resolve())

            def stepped() -> bool:
                assert run.state not in ("failed", "stopped"), run.status()
                return int(run.read_status().get("step") or 0) >= 1

            await until(pilot, stepped, 120, run.status)
            await pilot.press("s")  # stop: the trainer checkpoints, every process exits
            await until(pilot, lambda: run.state == "stopped" and not run.live_processes(), 120, run.status)
            assert list(run.checkpoints_dir.glob("step_*"))
            await pilot.press("x", "y")  # delete asks first
            await until(pilot, lambda: not run.dir.exists())
            assert RunRegistry().runs() == []

    asyncio.run(scenario())
