"""A large event log is replayed in a child process (workbench.dashboards.follower: `replay_apart`) while the page
lays itself out: the page shows the same model, tail and offset as a replay folded in the app, follows the live
events after it, and falls back to folding in the app when the child fails."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from prime_lab.workbench.dashboards import follower
from prime_lab.workbench.dashboards.files import read_events
from prime_lab.workbench.dashboards.rl_model import RLRunModel
from prime_lab.workbench.screens.dashboard_rl import RLDashboard
from tests.workbench.lab_fixtures import caught_up, lab_folder, make_app, recorded_run, until


def folded_here(path: Path) -> RLRunModel:
    model = RLRunModel()
    items, _ = read_events(path, 0, None)
    model.feed(items)
    return model


@pytest.mark.parametrize("apart", [True, False], ids=["in a child", "the child failed"])
def test_a_large_log_replayed_apart_shows_what_a_replay_here_shows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   apart: bool) -> None:
    run = recorded_run("rl-run")
    monkeypatch.setattr(follower, "APART_BYTES", 1)  # (the recorded run is small: replay it apart all the same)
    adopted: list[object] = []
    if not apart:  # a model the child cannot build: it fails, and the page folds the log itself
        monkeypatch.setattr(RLDashboard, "apart", lambda self: "prime_lab.workbench.dashboards.rl_model:Nothing")
    adopt = RLDashboard.adopt

    def recorded_adopt(self: RLDashboard, model: object) -> bool:
        adopted.append(model)
        return adopt(self, model)

    monkeypatch.setattr(RLDashboard, "adopt", recorded_adopt)
    want = folded_here(run.events_path)

    async def scenario() -> None:
        app = make_app(lab_folder(tmp_path), run_id="rl-run")
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: isinstance(app.screen, RLDashboard) and caught_up(app.screen))
            screen = app.screen
            assert isinstance(screen, RLDashboard)
            assert len(adopted) == (1 if apart else 0)
            model = screen.model
            assert (model is adopted[0]) if apart else not adopted
            assert model.latest_step == want.latest_step == 30
            assert sorted(model.series) == sorted(want.series)
            assert all(model.series[k].points() == want.series[k].points() for k in want.series)
            assert len(model.alerts) == len(want.alerts) == 1
            logged = list(want.logs)  # (the page adds the processes' text logs to its own: the events' lines in order)
            assert logged and [line for line in model.logs if line in logged] == logged
            assert screen.event_offset == run.events_path.stat().st_size
            assert list(screen.follower.tail) or screen.query_one("#run-log").lines  # the event tail is there
            with run.writer("trainer") as writer:  # and the page follows on from where the child stopped
                writer.metrics({"loss": 0.25}, step=31)
            await until(pilot, lambda: screen.model.latest_step == 31)
            assert screen.model.series["loss"].last == (31.0, 0.25)

    asyncio.run(scenario())
