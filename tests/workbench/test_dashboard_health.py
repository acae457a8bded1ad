"""The run page's health line, System tab and logs beside the charts, and `prime rl list`'s HEALTH column, on runs
written with the runs' own EventWriter (and text logs where the processes write theirs)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from textual.widgets import DataTable, RichLog, Static, TabbedContent

from prime_lab.runs.events import EventWriter
from prime_lab.runs.registry import Run, RunRegistry
from prime_lab.workbench.cli.run_verbs import recent_health
from prime_lab.workbench.screens.dashboard_rl import RLDashboard
from prime_lab.workbench.widgets.alerts_pane import AlertsPane
from prime_lab.workbench.widgets.health_line import HealthLine
from prime_lab.workbench.widgets.logs_pane import LogsPane, LogsView
from tests.support.cli import prime
from tests.workbench.lab_fixtures import FROZEN, SIZE, caught_up, lab_folder, make_app, until

BIG = (140, 40)


def rl_run(run_id: str = "rl-health", state: str = "running") -> Run:
    run = RunRegistry().create("rl", config_text="", resolved={}, model="smollm2-135m", envs=["tools"], max_steps=20,
                               run_id=run_id)
    run.update_status(state=state, step=0, created_at=FROZEN - 600, started_at=FROZEN - 540)
    return run


def write_steps(run: Run, steps: range, errored: float, env: str = "tools") -> None:
    """What the orchestrator and the trainer log at each RL step."""
    with run.writer("orchestrator") as orchestrator, run.writer("trainer") as trainer:
        for step in steps:
            orchestrator.metrics({"reward/mean": 0.4, "reward/std": 0.2, f"env/{env}/errored": errored,
                                  f"env/{env}/timed_out": 0.0, "time/wait_for_weights": 0.1,
                                  "rollout/generation_time": 2.0}, step)
            trainer.metrics({"loss": 0.05, "policy/entropy": 1.0, "policy/kl": 0.002, "optim/grad_norm": 0.5,
                             "time/wait_for_batch": 0.1, "time/step": 1.5}, step)


def ready(app: Any) -> bool:
    return isinstance(app.screen, RLDashboard) and caught_up(app.screen)


def test_the_health_line_turns_to_warn_when_errored_rollouts_stay_above_five_percent(tmp_path: Path) -> None:
    run = rl_run()
    write_steps(run, range(1, 6), errored=0.0)

    async def scenario() -> None:
        app = make_app(lab_folder(tmp_path), run_id=run.id)
        async with app.run_test(size=BIG) as pilot:
            await until(pilot, lambda: ready(app))
            screen = app.screen
            assert screen.health.monitor is screen.model.monitor  # each metric folded once, by the page's model
            line = screen.query_one(HealthLine)
            await until(pilot, lambda: line.display and line.plain.startswith("ok"), what=lambda: line.plain)
            assert line.plain == ("ok · balanced (wait_for_batch 0.1 s vs policy 0.1 s) · errored/empty 0% · "
                                  "mismatch KL flat · grad norm steady")
            write_steps(run, range(6, 8), errored=0.08)  # 2 steps above 5%: not sustained yet
            await until(pilot, lambda: "errored/empty 8%" in line.plain, what=lambda: line.plain)
            assert line.plain.startswith("ok")
            write_steps(run, range(8, 9), errored=0.12)  # the third: a warning, and the env_errored alert with it
            await until(pilot, lambda: line.plain.startswith("warn"), what=lambda: line.plain)
            assert "errored/empty 12% (tools, 3 steps above 5%)" in line.plain
            assert "logs/env-<name>.log" in str(line.tooltip)
            alerts = app.screen.query_one(AlertsPane)
            await until(pilot, lambda: alerts.count == 1)
            assert "Environment tools is failing at step 8" in str(alerts.render())

    asyncio.run(scenario())


def system_sample(processes: list[dict[str, Any]], gpus: list[dict[str, Any]]) -> dict[str, Any]:
    return {"interval_s": 5.0, "processes": processes, "gpus": gpus}


def process(role: str, pid: int, cpu: float, rss: int, threads: int, **more: Any) -> dict[str, Any]:
    return {"role": role, "pid": pid, "cpu_percent": cpu, "rss_bytes": rss, "threads": threads, **more}


def test_the_system_tab_shows_each_process_and_gpu_of_an_ended_run(tmp_path: Path) -> None:
    run = rl_run(state="completed")
    gib = 1 << 30
    with EventWriter(run.events_path, "launcher") as launcher:
        launcher.emit("system", system_sample(
            [process("supervisor", 10, 1.0, 80 << 20, 3), process("trainer", 11, 97.5, 2 * gib, 12, rank=0),
             process("orchestrator", 12, 30.0, 400 << 20, 8), process("sampler", 13, 150.0, 3 * gib, 20, rank=0),
             process("env_server", 14, 5.0, 200 << 20, 4, env="tools")], []))
        launcher.emit("system", system_sample(  # the environment server exited before the last sample
            [process("supervisor", 10, 2.0, 80 << 20, 3), process("trainer", 11, 99.0, 2 * gib, 12, rank=0),
             process("orchestrator", 12, 25.0, 400 << 20, 8), process("sampler", 13, 160.0, 3 * gib, 20, rank=0),
             process("sandbox", 15, 40.0, 100 << 20, 9, count=2, processes=6)],  # 2 sandboxes' 6 processes
            [{"index": 0, "name": "NVIDIA H100", "utilization_percent": 55.0, "memory_used_bytes": 40 * gib,
              "memory_total_bytes": 80 * gib}]))

    async def scenario() -> None:
        app = make_app(lab_folder(tmp_path), run_id=run.id)
        async with app.run_test(size=BIG) as pilot:
            await until(pilot, lambda: ready(app))
            await pilot.press("4")
            screen = app.screen
            await until(pilot, lambda: screen.query_one(TabbedContent).active == "system")
            table = screen.query_one("#system-processes", DataTable)
            await until(pilot, lambda: table.row_count == 6)
            rows = [[str(cell) for cell in table.get_row_at(i)] for i in range(table.row_count)]
            assert [row[0] for row in rows] == ["supervisor", "trainer.0", "orchestrator", "sampler.0",
                                                "env_server.tools", "sandbox ×2"]
            assert rows[1][1:5] == ["11", "99.0", "2.0 GiB", "12"]  # the newest sample's values
            assert rows[4][2:] == ["5.0", "200.0 MiB", "4", "exited"]  # its last values, marked
            assert rows[5][1:5] == ["-", "40.0", "100.0 MiB", "9"]  # the sandboxes summed: no one pid
            summary = str(screen.query_one("#system-summary", Static).render())
            assert summary.startswith("10 processes · 2 sandboxes · CPU 326% · RSS 5.6 GiB · the run's last sample")
            gpus = screen.query_one("#system-gpus", DataTable)
            assert gpus.display and [str(c) for c in gpus.get_row_at(0)] == [
                "0", "NVIDIA H100", "55", "40.0 GiB / 80.0 GiB (50%)"]
            assert not any("system" in line for line in screen.tail)  # the samples stay out of the events' tail

    asyncio.run(scenario())


def test_the_logs_beside_the_charts_switch_to_an_environment_servers_log_and_follow_it(tmp_path: Path) -> None:
    run = rl_run()  # no metrics: no charts to lay out again when the logs take their side (a slow machine's time)
    run.logs_dir.mkdir(parents=True, exist_ok=True)
    (run.logs_dir / "trainer.log").write_text("[trainer] step 1/20 loss 0.05\n")
    env_log = run.logs_dir / "env-tools.log"
    env_log.write_text("serving tools on 127.0.0.1\n")

    async def scenario() -> None:
        app = make_app(lab_folder(tmp_path), run_id=run.id)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: ready(app))
            screen = app.screen
            side = screen.query_one("#side-logs", LogsView)
            assert not side.display
            await pilot.press("l")

            def lines() -> list[str]:
                return [str(line.text) for line in side.query_one(RichLog).lines]

            await until(pilot, lambda: side.display and any("serving tools" in line for line in lines()))
            assert screen.query_one(TabbedContent).active == "charts"  # beside the charts
            assert side.processes == ["all", "trainer", "env-tools"] and side.process == "all"
            await pilot.press("p", "p")
            await until(pilot, lambda: bool(lines()) and all(line.startswith("env-tools") for line in lines()))
            filter_line = str(side.query_one(".logs-filter", Static).render())
            assert filter_line.startswith("process: env-tools (environment server tools) 3/3")
            with env_log.open("a") as fh:  # it follows the log as the server writes it
                fh.write("rollout 7 failed: tool timed out\n")
            await until(pilot, lambda: any("tool timed out" in line for line in lines()))
            await pilot.press("3")  # the Logs tab shows the same process; the pane beside the charts hides
            await until(pilot, lambda: not side.display and screen.query_one(LogsPane).process == "env-tools")

    asyncio.run(scenario())


def test_prime_rl_list_has_a_health_column(tmp_path: Path) -> None:
    healthy, failing = rl_run("rl-healthy"), rl_run("rl-failing")
    write_steps(healthy, range(1, 6), errored=0.0)
    write_steps(failing, range(1, 6), errored=0.3)
    RunRegistry().create("eval", config_text="", resolved={}, run_id="an-eval")
    table = prime("rl", "list", env={**os.environ, "COLUMNS": "250"}).stdout
    rows = {line.split()[0]: line for line in table.splitlines()[1:]}
    assert "HEALTH" in table.splitlines()[0]
    assert "  ok  " in rows["rl-healthy"] and "warn: errored/empty 30% (tools)" in rows["rl-failing"]
    listed = {r["id"]: r for r in json.loads(prime("rl", "list", "-o", "json").stdout)}
    assert listed["rl-failing"]["health"]["level"] == "warn" and "health" not in listed["an-eval"]
    assert listed["rl-healthy"]["health"]["text"].startswith("ok · ")


def test_the_list_reads_only_the_tail_of_a_long_log(tmp_path: Path) -> None:
    run = rl_run()
    write_steps(run, range(1, 200), errored=0.5, env="old")  # an environment that failed early on
    write_steps(run, range(200, 206), errored=0.0)
    whole = recent_health(run.events_path, max_bytes=1 << 30)
    tail = recent_health(run.events_path, max_bytes=2000)  # the last few steps only
    assert whole is not None and tail is not None
    assert whole.short() == "warn: errored/empty 50% (old)"
    assert tail.short() == "ok" and tail.step == 205
    assert recent_health(tmp_path / "missing.jsonl") is None


def test_an_sft_runs_health_line_has_its_grad_norm(tmp_path: Path) -> None:
    run = RunRegistry().create("sft", config_text="", resolved={}, model="smollm2-135m", envs=["data.jsonl"],
                               max_steps=20, run_id="sft-health")
    run.update_status(state="completed", created_at=FROZEN - 600, started_at=FROZEN - 540)
    norms = [0.5] * 8 + [6.0, 0.5, 7.0, 0.5, 9.0, 0.5]  # three spikes of 12x its median and more
    with run.writer("trainer") as writer:
        for step, norm in enumerate(norms, start=1):
            writer.metrics({"loss/mean": 1.0 / step, "optim/grad_norm": norm, "time/step": 0.5}, step)

    async def scenario() -> None:
        app = make_app(lab_folder(tmp_path), run_id=run.id)
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: caught_up(app.screen) and app.screen.query_one(HealthLine).display)
            line = app.screen.query_one(HealthLine)
            assert line.plain == "warn · grad norm 3 spikes in 20 steps (up to 18x median)"
            assert "max_grad_norm" in str(line.tooltip)

    asyncio.run(scenario())
