"""The SFT dashboard: its textual-free model folded from an SFT run's event log (written with the runs' own
EventWriter), and the page the workbench opens for an SFT run, from home (which lists SFT configs and runs) and from
the command line."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

from textual.widgets import RichLog, Static

from prime_lab.runs.events import EventWriter
from prime_lab.runs.registry import Run, RunRegistry
from prime_lab.trainer.sft_config import template_path
from prime_lab.workbench.dashboards.files import read_events
from prime_lab.workbench.dashboards.sft_model import SFTRunModel, model_usage
from prime_lab.workbench.screens.dashboard_sft import SFTDashboard
from prime_lab.workbench.widgets.charts import MetricChart
from prime_lab.workbench.widgets.config_list import ConfigList
from prime_lab.workbench.widgets.runs_table import RunsTable
from tests.workbench.lab_fixtures import FROZEN, SIZE, caught_up, lab_folder, make_app, until

STEPS = 10
VAL_EVERY = 5


def train_loss(step: int, attempt: int = 1) -> float:
    return 2.0 / step + (attempt - 1) * 0.5


def val_loss(step: int, attempt: int = 1) -> float:
    return 2.5 - 0.1 * step + (attempt - 1) * 0.5


def write_steps(writer: EventWriter, steps: range, attempt: int = 1) -> None:
    """What prime_lab.trainer.sft logs: a metrics event per step and val/loss every VAL_EVERY steps."""
    for step in steps:
        loss = train_loss(step, attempt)
        writer.metrics({"loss/mean": loss, "loss/perplexity": math.exp(loss), "loss/nan_count": 0.0,
                        "optim/lr": 1e-4, "optim/grad_norm": 0.5, "progress/num_tokens": 1000.0 * step,
                        "progress/num_samples": 4.0 * step, "progress/epoch": step / STEPS,
                        "train/loss_tokens": 400.0, "time/step": 0.5, "perf/throughput": 2000.0,
                        "perf/peak_memory": 1.5}, step)
        if step % VAL_EVERY == 0:
            writer.metrics({"val/loss": val_loss(step, attempt), "val/perplexity": math.exp(val_loss(step, attempt))},
                           step)


def sft_run(run_id: str = "sft-demo", *, model: bool = True) -> Run:
    """A completed SFT run of STEPS steps: validation at step 0 (eval_on_start) and every VAL_EVERY steps, log lines,
    and (with `model`) the model folder and its checkpoint event."""
    run = RunRegistry().create("sft", config_text="", resolved={}, model="smollm2-135m",
                               envs=["data/reverse-text-sft.jsonl"], max_steps=STEPS, run_id=run_id)
    run.update_status(state="completed", step=STEPS, created_at=FROZEN - 600, started_at=FROZEN - 540,
                      ended_at=FROZEN - 60)
    with run.writer("trainer") as writer:
        writer.log("trainer started", step=0)
        writer.metrics({"val/loss": val_loss(0), "val/perplexity": math.exp(val_loss(0))}, 0)
        write_steps(writer, range(1, STEPS + 1))
        if model:
            run.model_dir.mkdir()
            writer.emit("checkpoint", {"path": str(run.model_dir), "step": STEPS, "model": True}, step=STEPS)
            writer.log(f"model written to {run.model_dir}", step=STEPS)
    return run


def folded(run: Run) -> SFTRunModel:
    model = SFTRunModel()
    model.feed(read_events(run.events_path, 0)[0])
    return model


# The model, without the app -----------------------------------------------------------------------------------
def test_the_model_holds_the_training_and_validation_curves_and_the_model_folder() -> None:
    run = sft_run()
    model = folded(run)
    xs, ys = model.series["loss/mean"].points()
    assert xs == [float(s) for s in range(1, STEPS + 1)] and ys == [train_loss(s) for s in range(1, STEPS + 1)]
    assert model.series["val/loss"].points() == ([0.0, 5.0, 10.0], [val_loss(0), val_loss(5), val_loss(10)])
    assert model.series["progress/num_tokens"].last == (10.0, 10_000.0)
    latest = model.latest()
    assert model.latest_step == STEPS and latest["loss/mean"] == train_loss(STEPS)
    assert latest["val/loss"] == val_loss(STEPS)  # the trainer's and the validation's metrics of a step, merged
    assert model.best_val_loss() == (10, val_loss(10))
    assert model.model_path == str(run.model_dir) and model.checkpoints == [STEPS]
    assert [line.text for line in model.logs][0] == "trainer started"


def test_a_run_without_validation_or_model_has_neither() -> None:
    run = RunRegistry().create("sft", config_text="", resolved={}, max_steps=3)
    with run.writer("trainer") as writer:
        writer.metrics({"loss/mean": 1.0}, 1)
    model = folded(run)
    assert model.best_val_loss() is None and model.model_path is None and model.latest() == {"loss/mean": 1.0}


def test_a_restart_shows_each_step_of_the_latest_attempt() -> None:
    run = RunRegistry().create("sft", config_text="", resolved={}, max_steps=STEPS)
    with run.writer("trainer") as writer:
        write_steps(writer, range(1, 9))  # validated at 5 (0.5 below the second attempt's values)
    with EventWriter(run.events_path, "launcher", attempt=2) as writer:
        writer.emit("restart", {"from_step": 3}, step=3)
    with EventWriter(run.events_path, "trainer", attempt=2) as writer:
        write_steps(writer, range(4, STEPS + 1), attempt=2)
    model = folded(run)
    xs, ys = model.series["loss/mean"].points()
    assert xs == [float(s) for s in range(1, STEPS + 1)]
    assert ys == [train_loss(s) for s in range(1, 4)] + [train_loss(s, 2) for s in range(4, STEPS + 1)]
    assert model.series["val/loss"].points() == ([5.0, 10.0], [val_loss(5, 2), val_loss(10, 2)])
    assert model.best_val_loss() == (10, val_loss(10, 2))


def test_the_model_imports_no_textual() -> None:
    check = ("import sys, prime_lab.workbench.dashboards.sft_model\n"
             "print(sorted(m for m in ('textual', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr


def test_the_model_note_says_where_the_model_is_and_how_to_use_it() -> None:
    note = model_usage("sft-abc123", "/runs/sft-abc123/model")
    assert note.splitlines()[0] == "/runs/sft-abc123/model"
    assert 'model = "sft-abc123"' in note and "prime eval run ENV -m sft-abc123" in note


# The page -----------------------------------------------------------------------------------------------------
def sft_ready(screen: Any) -> bool:
    return isinstance(screen, SFTDashboard) and screen.model.latest_step == STEPS and caught_up(screen)


def text_of(screen: Any, selector: str) -> str:
    return str(screen.query_one(selector, Static).render())


def test_an_sft_run_page_shows_loss_with_val_loss_perplexity_tokens_logs_and_the_model(tmp_path: Path) -> None:
    run = sft_run()

    async def scenario() -> None:
        app = make_app(lab_folder(tmp_path), run_id=run.id)
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: sft_ready(app.screen))
            screen = app.screen
            assert isinstance(screen, SFTDashboard)
            header = text_of(screen, "#dash-status")
            assert f"completed · step {STEPS}/{STEPS}" in header and "2.0k tok/s" in header
            assert f"loss {train_loss(STEPS):.4f}" in header and f"val {val_loss(STEPS):.4f}" in header
            loss = screen.query_one("#chart-loss", MetricChart)
            await until(pilot, lambda: loss.drawn_points == STEPS + 3)  # charts redraw at most every 0.25 s
            assert loss.display and loss._labels == ["loss/mean", "val/loss"]  # validation points on the loss chart
            for chart in ("perplexity", "lr", "grad", "tokens", "throughput"):
                assert screen.query_one(f"#chart-{chart}", MetricChart).display, chart
            latest = text_of(screen, "#latest")
            assert "loss/mean" in latest and "val/loss" in latest and "progress/num_tokens" in latest
            assert f"best val/loss {val_loss(STEPS):.4g} @{STEPS}" in latest
            panel = screen.query_one("#sft-model", Static)
            assert panel.display and f'model = "{run.id}"' in text_of(screen, "#sft-model")
            assert str(run.model_dir) in text_of(screen, "#sft-model")
            await pilot.press("2")
            log = screen.query_one("#logs-view", RichLog)
            await until(pilot, lambda: any("model written to" in str(line.text) for line in log.lines))

    asyncio.run(scenario())


def test_a_running_sft_run_shows_no_model_yet(tmp_path: Path) -> None:
    run = sft_run(model=False)
    run.update_status(state="running")

    async def scenario() -> None:
        app = make_app(lab_folder(tmp_path), run_id=run.id)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: sft_ready(app.screen))
            assert not app.screen.query_one("#sft-model", Static).display
            assert "running" in text_of(app.screen, "#dash-status")

    asyncio.run(scenario())


def test_home_lists_an_sft_config_and_run_and_opens_the_runs_dashboard(tmp_path: Path) -> None:
    run = sft_run()
    root = lab_folder(tmp_path)
    config = root / "mine-sft.toml"
    config.write_text(template_path().read_text())

    async def scenario() -> None:
        app = make_app(root)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: bool(app.screen.query(RunsTable)))
            configs = app.screen.query_one(ConfigList)
            await until(pilot, lambda: str(config) in configs.rows)
            assert configs.get_row(str(config)) == ["sft", "mine-sft.toml"]
            table = app.screen.query_one(RunsTable)
            await until(pilot, lambda: run.id in table.rows)
            assert table.get_row(run.id)[1:3] == ["sft", "completed"]
            await pilot.press("tab", "enter")
            await until(pilot, lambda: isinstance(app.screen, SFTDashboard))

    asyncio.run(scenario())
