"""The RL and GEPA dashboards, fed by recorded event logs (tests/workbench/fixtures/), driven by keys; a live test
where another process appends events while the app runs."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable, RichLog, Static, TabbedContent

from prime_lab.runs.events import EventWriter
from prime_lab.workbench.dashboards.files import MAX_READ
from prime_lab.workbench.screens.dashboard_gepa import FrontierChart, GepaDashboard
from prime_lab.workbench.screens.dashboard_rl import RLDashboard
from prime_lab.workbench.screens.home import HomeScreen
from prime_lab.workbench.screens.pick_many import PickManyScreen
from prime_lab.workbench.widgets.alerts_pane import AlertsPane
from prime_lab.workbench.widgets.charts import MetricChart
from prime_lab.workbench.widgets.logs_pane import LogsPane
from prime_lab.workbench.widgets.metrics_grid import MetricsGrid
from prime_lab.workbench.widgets.runs_table import RunsTable
from prime_lab.workbench.widgets.samples_browser import SamplesBrowser
from tests.workbench.lab_fixtures import (
    REPO,
    SIZE,
    caught_up,
    fixture_lines,
    lab_folder,
    make_app,
    recorded_run,
    settle,
    until,
)

BIG = (120, 40)


@asynccontextmanager
async def dashboard(tmp_path: Path, run_id: str, ready: Callable[[Any], bool]) -> AsyncIterator[tuple[Pilot[Any], Any]]:
    """The app opened on a run's dashboard, once `ready(screen)`."""
    app = make_app(lab_folder(tmp_path), run_id=run_id)
    async with app.run_test(size=BIG) as pilot:
        await until(pilot, lambda: isinstance(app.screen, (RLDashboard, GepaDashboard)) and ready(app.screen))
        yield pilot, app.screen


def rl_ready(screen: Any) -> bool:
    return isinstance(screen, RLDashboard) and screen.model.latest_step == 30 and caught_up(screen)


def text_of(screen: Any, selector: str) -> str:
    return str(screen.query_one(selector, Static).render())


def test_rl_dashboard_replays_a_recorded_run(tmp_path: Path) -> None:
    recorded_run("rl-run")

    async def scenario() -> None:
        async with dashboard(tmp_path, "rl-run", rl_ready) as (pilot, screen):
            assert isinstance(screen, RLDashboard)
            header = text_of(screen, "#dash-status")
            assert "completed" in header and "step 30/30" in header and "tok/s" in header
            assert "1 corrupt line(s) skipped" in header  # the cut line in the fixture, skipped, no crash
            # The log has no alert events (an older run): the dashboard raises the entropy collapse itself.
            alerts = screen.query_one(AlertsPane)
            assert alerts.display and alerts.count == 1
            assert "Entropy collapsing at step 26" in str(alerts.render())
            reward = screen.query_one("#chart-reward", MetricChart)
            await until(pilot, lambda: reward.drawn_points >= 30 * 4)  # charts redraw at most every 0.25 s
            assert reward.drawn_points >= 30 * 4  # mean, 2 envs, the std band
            assert reward._labels.count("val_reward/mean") == 1  # eval points on the reward chart
            assert "policy/entropy" in text_of(screen, "#latest")
            assert not screen.query_one("#chart-teacher-kl", MetricChart).display  # no opd loss, no teacher/kl
            assert any("checkpoint" in str(line.text) for line in screen.query_one("#run-log", RichLog).lines)
            # Smoothing by key: the header says it and the charts redraw with it.
            before = list(reward._datasets[2].y)
            await pilot.press("e")
            await until(pilot, lambda: list(reward._datasets[2].y) != before)
            assert "smoothing 0.6" in text_of(screen, "#dash-status")

    asyncio.run(scenario())


def test_an_opd_runs_teacher_kl_gets_a_chart_beside_the_rl_ones(tmp_path: Path) -> None:
    run = recorded_run("rl-run")
    with EventWriter(run.events_path, "trainer") as writer:  # what the trainer logs with loss = "opd"
        for step in range(1, 31):
            writer.metrics({"teacher/kl": 0.5 / step}, step)

    async def scenario() -> None:
        async with dashboard(tmp_path, "rl-run", rl_ready) as (pilot, screen):
            chart = screen.query_one("#chart-teacher-kl", MetricChart)
            await until(pilot, lambda: chart.display and chart.drawn_points == 30)
            charts = [c.id for c in screen.query(MetricChart) if c.display]
            assert charts.index("chart-teacher-kl") == charts.index("chart-kl") + 1  # next to the KL chart
            assert "teacher/kl" in text_of(screen, "#latest")

    asyncio.run(scenario())


def test_rl_samples_browser_and_logs_filter(tmp_path: Path) -> None:
    recorded_run("rl-run")

    async def scenario() -> None:
        async with dashboard(tmp_path, "rl-run", rl_ready) as (pilot, screen):
            await pilot.press("2")
            browser = screen.query_one(SamplesBrowser)
            await until(pilot, lambda: browser.step == 30 and len(browser.records) == 4)
            table = screen.query_one("#sample-table", DataTable)
            assert table.row_count == 4
            browser.show_detail(2)  # a reverse-text rollout that used the tags
            detail = text_of(screen, "#sample-detail")
            # The environment's parser (XMLParser of reverse-text) reads the answer out of the tags.
            assert "parsed 'wodaem'" in detail and "<reversed_text>" in detail and "lcs_ratio" in detail
            await pilot.press("[")
            await until(pilot, lambda: browser.step == 29 and browser.records[0]["step"] == 29)
            # Steps without a rollouts file show that step's sample events.
            browser.select_step(25)
            await until(pilot, lambda: browser.step == 25 and browser.source == "sample events")
            assert len(browser.records) == 1
            await pilot.press("3")
            pane = screen.query_one(LogsPane)

            def lines() -> list[str]:
                return [str(line.text) for line in pane.query_one(RichLog).lines]

            await until(pilot, lambda: any("serving 2 environments" in line for line in lines()))  # orchestrator.log
            assert any("trainer started" in line for line in lines())  # a log event
            for _ in range(3):  # DEBUG -> INFO -> SUCCESS -> WARNING
                await pilot.press("v")
            await until(pilot, lambda: bool(lines()) and all("WARNING" in line for line in lines()))
            await pilot.press("p")  # all -> launcher? the processes come in sorted order after "all"
            await until(pilot, lambda: pane.process != "all")

    asyncio.run(scenario())


def test_alert_events_in_the_log_replace_the_dashboards_own(tmp_path: Path) -> None:
    run = recorded_run("rl-run")

    async def scenario() -> None:
        async with dashboard(tmp_path, "rl-run", rl_ready) as (pilot, screen):
            with run.writer("launcher") as writer:
                writer.emit("alert", {"name": "entropy_collapse", "level": "WARNING",
                                      "message": "Entropy collapsing at step 26 (from the launcher)"}, step=26)
                writer.emit("alert", {"name": "loss_diverging", "level": "ERROR",
                                      "message": "Loss diverging at step 30: loss = nan"}, step=30)
            alerts = screen.query_one(AlertsPane)
            await until(pilot, lambda: alerts.count == 2)
            shown = str(alerts.render())
            assert "from the launcher" in shown and "loss = nan" in shown
            assert shown.index("loss = nan") < shown.index("from the launcher")  # newest first

    asyncio.run(scenario())


def test_compare_overlays_another_runs_curves(tmp_path: Path) -> None:
    recorded_run("rl-run")
    recorded_run("rl-run", "rl-other")

    async def scenario() -> None:
        async with dashboard(tmp_path, "rl-run", rl_ready) as (pilot, screen):
            await pilot.press("c")
            await until(pilot, lambda: isinstance(pilot.app.screen, PickManyScreen))
            await pilot.press("space", "enter")
            assert isinstance(screen, RLDashboard)
            await until(pilot, lambda: "rl-other" in screen.compared)
            entropy = screen.query_one("#chart-entropy", MetricChart)
            await until(pilot, lambda: entropy._labels == ["rl-run policy/entropy", "rl-other policy/entropy"])
            assert "comparing rl-other" in text_of(screen, "#dash-status")

    asyncio.run(scenario())


def test_series_picker_adds_a_chart_for_any_metric(tmp_path: Path) -> None:
    recorded_run("rl-run")

    async def scenario() -> None:
        async with dashboard(tmp_path, "rl-run", rl_ready) as (pilot, screen):
            await pilot.press("m")
            await until(pilot, lambda: isinstance(pilot.app.screen, PickManyScreen))
            picker = pilot.app.screen
            assert isinstance(picker, PickManyScreen)
            values = [value for _, value, _ in picker.options]
            assert "m-buffer-hard" in values  # a metric no standard chart draws
            picker.query_one("SelectionList").select("m-buffer-hard")  # type: ignore[attr-defined]
            await pilot.press("enter")
            await until(pilot, lambda: bool(screen.query("#chart-m-buffer-hard")))
            assert isinstance(screen, RLDashboard)
            assert screen.specs[-1].lines == ("buffer/hard",)

    asyncio.run(scenario())


def test_gepa_dashboard_shows_budget_frontier_matrix_and_candidates(tmp_path: Path) -> None:
    recorded_run("gepa-run")

    async def scenario() -> None:
        async with dashboard(tmp_path, "gepa-run", lambda screen: screen.model.iteration == 8 and caught_up(screen)) \
                as (pilot, screen):
            assert isinstance(screen, GepaDashboard)
            header = text_of(screen, "#gepa-status")
            assert "best 0.476 (candidate 6)" in header and "calls 90/90" in header
            verdicts = screen.query_one("#gepa-verdicts", DataTable)
            assert verdicts.row_count == 8
            newest = [str(cell) for cell in verdicts.get_row_at(0)]
            assert newest[:3] == ["8", "reflect", "3"] and newest[5] == "not_validated"
            assert screen.model.on_front() == {2, 4, 5, 6}
            await pilot.press("3")
            matrix = screen.query_one("#gepa-matrix", DataTable)
            await until(pilot, lambda: matrix.row_count == 6)
            assert matrix.row_count == 6 and len(matrix.columns) == 7 + 2
            stars = [str(cell) for row in range(6) for cell in matrix.get_row_at(row) if str(cell).startswith("★")]
            assert len(stars) >= 6  # someone is best on every instance
            await pilot.press("2")
            await until(pilot, lambda: "candidate 6" in text_of(screen, "#gepa-candidate"))
            detail = text_of(screen, "#gepa-candidate")
            assert "candidate 6" in detail and "diff against its parent #3" in detail
            assert "+Think step by step, briefly." in detail and "diff against the seed #0" in detail

    asyncio.run(scenario())


def test_gepa_grid_tab_charts_every_number_of_the_iterations(tmp_path: Path) -> None:
    recorded_run("gepa-run")

    async def scenario() -> None:
        async with dashboard(tmp_path, "gepa-run", lambda screen: screen.model.iteration == 8 and caught_up(screen)) \
                as (pilot, screen):
            assert isinstance(screen, GepaDashboard)
            await pilot.press("6")
            grid = screen.query_one(MetricsGrid)
            await until(pilot, lambda: grid.has_focus and grid.view is not None and grid.drawn > 0)
            assert grid.view is not None
            assert {"frontier/best_score", "iteration/child_score", "budget/used"} <= set(grid.view.ordered)
            best = screen.metrics.series["frontier/best_score"]
            assert max(best.ys) == pytest.approx(0.476, abs=1e-3)  # the header's best, as a chart

    asyncio.run(scenario())


def test_gepa_frontier_updates_live(tmp_path: Path) -> None:
    lines = fixture_lines("gepa-run")
    first_frontier = next(i for i, line in enumerate(lines) if '"gepa.frontier"' in line)
    run = recorded_run("gepa-run", events=first_frontier + 1)

    async def scenario() -> None:
        async with dashboard(tmp_path, "gepa-run", lambda screen: screen.model.frontier_updates) as (pilot, screen):
            assert isinstance(screen, GepaDashboard)
            await until(pilot, lambda: caught_up(screen))
            assert "1 candidates" in text_of(screen, "#gepa-status")
            chart = screen.query_one(FrontierChart)
            assert chart._labels == ["best so far", "best"]
            with open(run.events_path, "a") as fh:
                fh.writelines(lines[first_frontier + 1:])
            await until(pilot, lambda: "7 candidates · 4 on the front" in text_of(screen, "#gepa-status"))
            await until(pilot, lambda: caught_up(screen))  # the appended lines may come in two reads
            assert chart._labels == ["best so far", "other", "front", "best"]

    asyncio.run(scenario())


WRITER = """
import os, sys, time
from prime_lab.runs.events import EventWriter
writer = EventWriter(sys.argv[1], "orchestrator")
for step in range(1, 41):
    writer.metrics({"reward/mean": step / 40, "reward/std": 0.2}, step=step)
    time.sleep(0.05)
    while step == 20 and not os.path.exists(sys.argv[2]):  # halfway: until the test saw the chart follow
        time.sleep(0.05)
writer.close()
"""


def test_live_writer_process_and_the_chart_follows(tmp_path: Path) -> None:
    run = recorded_run("rl-run", "rl-live", events=4)  # status events and the first logs only
    run.update_status(state="running", ended_at=None)
    halfway = tmp_path / "go-on"

    async def scenario() -> None:
        async with dashboard(tmp_path, "rl-live", lambda screen: True) as (pilot, screen):
            assert isinstance(screen, RLDashboard)
            chart = screen.query_one("#chart-reward", MetricChart)
            writer = subprocess.Popen([sys.executable, "-c", WRITER, str(run.events_path), str(halfway)], cwd=REPO)
            try:
                # The chart follows while the writer is still writing (it waits at step 20), not only at the end.
                await until(pilot, lambda: chart.drawn_points == 20 * 3)  # the mean and its std band
                assert writer.poll() is None
                halfway.touch()
                await until(pilot, lambda: writer.poll() is not None)
                assert writer.returncode == 0
            finally:
                if writer.poll() is None:
                    writer.kill()
            await until(pilot, lambda: screen.model.latest_step == 40)
            await until(pilot, lambda: chart.drawn_points == 40 * 3)
            assert list(chart._datasets[-1].y)[-1] == 1.0

    asyncio.run(scenario())


def test_event_writer_is_importable_without_textual() -> None:
    # The writer side used above is lab's (no textual), as the launcher uses it.
    assert EventWriter.__module__ == "prime_lab.runs.events"


def test_rl_dashboard_snapshot_with_an_alert(tmp_path: Path, snap_compare: Any) -> None:
    recorded_run("rl-run")
    assert snap_compare(make_app(lab_folder(tmp_path), run_id="rl-run"), terminal_size=SIZE, run_before=settle)


def test_gepa_dashboard_snapshot(tmp_path: Path, snap_compare: Any) -> None:
    recorded_run("gepa-run")
    assert snap_compare(make_app(lab_folder(tmp_path), run_id="gepa-run"), terminal_size=SIZE, run_before=settle)


def test_gepa_candidates_snapshot(tmp_path: Path, snap_compare: Any) -> None:
    recorded_run("gepa-run")

    async def candidates(pilot: Pilot[Any]) -> None:
        await settle(pilot)
        await pilot.press("2")
        await settle(pilot)
        assert pilot.app.screen.query_one(TabbedContent).active == "candidates"

    assert snap_compare(make_app(lab_folder(tmp_path), run_id="gepa-run"), terminal_size=SIZE,
                        run_before=candidates)


def test_alerts_pop_up_only_when_raised_live(tmp_path: Path) -> None:
    run = recorded_run("rl-run")

    async def scenario() -> None:
        async with dashboard(tmp_path, "rl-run", rl_ready) as (pilot, screen):
            await until(pilot, lambda: screen.live)
            await pilot.pause(0.3)
            assert screen.query_one(AlertsPane).count == 1  # the replayed entropy collapse: in the pane ...
            assert not [n for n in pilot.app._notifications if n.title.startswith("Alert")]  # ... no pop-up
            with EventWriter(run.events_path, "launcher") as writer:
                for name in ("kl_exploding", "loss_diverging"):
                    writer.emit("alert", {"name": name, "message": f"{name} now", "level": "WARNING"}, step=31)
            await until(pilot, lambda: any(n.title == "Alert: loss_diverging" for n in pilot.app._notifications))

    asyncio.run(scenario())


def long_run(run_id: str, steps: int) -> tuple[Path, int]:
    """An RL run whose log is several reads long (a few MB), its entropy collapsing in the last steps."""
    run = recorded_run("rl-run", run_id, events=2)
    padding = "x" * 300  # long lines: a read holds fewer events than the follower folds per lock hold
    with run.events_path.open("a") as fh:
        for step in range(1, steps + 1):
            entropy = 1.0 if step < steps - 5 else 0.001
            fh.write(json.dumps({"seq": step + 2, "time": 1.0, "source": "trainer", "kind": "metrics", "step": step,
                                 "data": {"policy/entropy": entropy, "reward/mean": step / steps, "note": padding}})
                     + "\n")
    assert run.events_path.stat().st_size > 2 * MAX_READ
    return run.events_path, steps


def test_a_long_log_is_drawn_once_replayed_and_its_alerts_do_not_pop_up(tmp_path: Path) -> None:
    path, steps = long_run("rl-long", 8000)

    async def scenario() -> None:
        async with dashboard(tmp_path, "rl-long", lambda screen: screen.live) as (pilot, screen):
            assert screen.model.latest_step == steps  # live only once everything the log held was folded
            reward = screen.query_one("#chart-reward", MetricChart)
            await until(pilot, lambda: reward.drawn_points > 0)
            assert screen.query_one(AlertsPane).count == 1  # the entropy collapse of the last steps, replayed:
            assert not [n for n in pilot.app._notifications if n.title.startswith("Alert")]  # no pop-up
            assert "replaying" not in text_of(screen, "#dash-status")

    asyncio.run(scenario())


def test_idle_charts_are_not_redrawn_and_new_data_redraws_them(tmp_path: Path) -> None:
    run = recorded_run("rl-run")

    async def scenario() -> None:
        async with dashboard(tmp_path, "rl-run", rl_ready) as (pilot, screen):
            reward = screen.query_one("#chart-reward", MetricChart)
            await until(pilot, lambda: reward.drawn_points >= 30 * 4)
            compared = 0
            draw_charts = screen.draw_charts

            def counted() -> None:
                nonlocal compared
                if not any(chart.needs_draw for chart in screen.charts):  # a chart resized by a late layout
                    compared += 1  # pass (under load) must redraw; anything else here is an idle redraw
                draw_charts()

            screen.draw_charts = counted
            try:
                await pilot.pause(0.8)  # many polls, several chart periods, nothing new
                assert compared == 0
                points = reward.drawn_points
                with run.writer("orchestrator") as writer:
                    writer.metrics({"reward/mean": 0.9, "reward/std": 0.1}, step=31)
                await until(pilot, lambda: reward.drawn_points > points)
            finally:
                del screen.draw_charts

    asyncio.run(scenario())


def test_a_run_opened_from_the_command_line_goes_back_to_home(tmp_path: Path) -> None:
    recorded_run("rl-run")

    async def scenario() -> None:
        async with dashboard(tmp_path, "rl-run", rl_ready) as (pilot, screen):
            assert not any(isinstance(s, HomeScreen) for s in pilot.app.screen_stack)  # built when needed
            await pilot.press("escape")

            def home_listed() -> bool:
                home = pilot.app.screen
                return isinstance(home, HomeScreen) and bool(home.query(RunsTable)) \
                    and home.query_one(RunsTable).selected_run() is not None

            await until(pilot, home_listed)
            assert pilot.app.screen.query_one(RunsTable).selected_run() == "rl-run"

    asyncio.run(scenario())
