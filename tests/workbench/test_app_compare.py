"""The compare view: evaluations marked on the home screen's runs table (space), compared (c) as `prime eval compare`
does (means, each difference to the first with its paired bootstrap interval, per-example rewards, the examples that
changed most); evaluations that do not compare say why on the page. The evaluations are synthetic: runs of kind
"eval" whose status names an output folder with results.jsonl and metadata.json as evals/evaluation.py writes them."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from textual.widgets import DataTable, Static

from prime_lab.runs.registry import Run, RunRegistry
from prime_lab.workbench.screens.compare import CompareScreen
from prime_lab.workbench.screens.home import HomeScreen
from prime_lab.workbench.widgets.runs_table import RunsTable
from tests.workbench.lab_fixtures import FROZEN, fixed_run, lab_folder, make_app, record_notifications, until

ENV = "primeintellect/reverse-text"
WIDE = (160, 50)


def eval_run(folder: Path, run_id: str, rewards: dict[int, float], *, env: str = ENV, age: float = 0.0,
             metadata: dict[str, Any] | None = None) -> Run:
    """A completed evaluation of `rewards` (example id -> reward, two rollouts each) with its output folder."""
    run = RunRegistry().create("eval", config_text="", resolved={}, model="smollm2-135m", envs=[env], run_id=run_id)
    out = folder / run_id
    out.mkdir(parents=True)
    rows = [{"example_id": i, "task": "reverse-text", "reward": r, "error": None, "answer": "",
             "prompt": [{"role": "system", "content": "Reverse the text."},
                        {"role": "user", "content": f"Reverse [this] sentence number {i}, please."}],
             "completion": [{"role": "assistant", "content": "..."}]}
            for i, r in rewards.items() for _ in range(2)]
    (out / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    meta: dict[str, Any] = {"env_id": env, "env_args": {}, "model": "smollm2-135m", "base_model": "smollm2-135m",
                            "policy": None, "system_prompt": None, "run_id": run_id,
                            "avg_reward": sum(rewards.values()) / len(rewards)}
    (out / "metadata.json").write_text(json.dumps({**meta, **(metadata or {})}))
    run.update_status(state="completed", output_dir=str(out), created_at=FROZEN - 600 + age,
                      started_at=FROZEN - 600 + age)
    return run


async def mark(pilot: Any, table: RunsTable, run_id: str) -> None:
    table.move_cursor(row=table.get_row_index(run_id))
    await pilot.press("space")
    await pilot.pause()


def cells(table: DataTable[Any]) -> list[list[str]]:
    return [[str(cell) for cell in table.get_row_at(i)] for i in range(table.row_count)]


def test_two_marked_evaluations_compare_with_means_an_interval_and_the_examples(tmp_path: Path) -> None:
    root = lab_folder(tmp_path)
    eval_run(tmp_path / "out", "eval-base", {0: 0.0, 1: 0.5, 2: 0.0, 3: 0.5})
    eval_run(tmp_path / "out", "eval-trained", {0: 1.0, 1: 1.0, 2: 0.5, 3: 1.0}, age=60,
             metadata={"model": "rl-x-step-2", "policy": {"run_id": "rl-x", "source": "adapters/step_2", "step": 2},
                       "system_prompt": {"text": "Be brief.", "source": "/tmp/best.txt", "gepa_run": "gepa-y"}})
    fixed_run("rl-x")

    async def scenario() -> None:
        app = make_app(root)
        async with app.run_test(size=WIDE) as pilot:
            notes = record_notifications(app)
            await pilot.pause()
            await pilot.press("tab")  # the runs table: space marks, c compares
            table = app.screen.query_one(RunsTable)
            await until(pilot, lambda: table.has_focus and table.row_count == 3)
            await mark(pilot, table, "rl-x")  # not an evaluation: refused, with how to evaluate it
            assert table.marked == [] and any("rl-x is a rl run; only evaluations are compared" in n and
                                              "--adapter rl-x" in n for n in notes)
            await pilot.press("c")  # nothing marked yet: says what to do
            assert any("Mark two evaluations or more" in n for n in notes)
            await mark(pilot, table, "eval-base")
            await mark(pilot, table, "eval-trained")
            assert table.marked == ["eval-base", "eval-trained"]
            ids = [str(table.get_row_at(i)[0]) for i in range(table.row_count)]
            assert "[A] eval-base" in ids and "[B] eval-trained" in ids
            await pilot.press("c")
            await until(pilot, lambda: isinstance(app.screen, CompareScreen) and app.screen.view is not None)
            screen = app.screen
            assert isinstance(screen, CompareScreen) and screen.view is not None
            status = str(screen.query_one("#compare-status", Static).render())
            assert f"{ENV} · 4 examples in common · paired bootstrap 95% interval" in status
            evaluations = cells(screen.query_one("#compare-evaluations", DataTable))
            [difference] = screen.view.comparison.differences
            assert evaluations[0] == ["A", "0.250", "-", "smollm2-135m", "reference", "eval-base"]
            assert evaluations[1][:3] == ["B", "0.875", f"+0.625 [{difference.low:+.3f}, {difference.high:+.3f}]"]
            assert 0 < difference.low < 0.625 < difference.high  # every example improved, by 0.5 or 1
            assert evaluations[1][3:] == ["smollm2-135m + rl-x adapters/step_2, prompt of gepa-y", "better",
                                          "eval-trained"]
            examples = screen.query_one("#compare-examples", DataTable)
            assert [str(c.label) for c in examples.columns.values()] == ["example", "A", "B", "B-A", "prompt"]
            assert cells(examples)[0][:4] == ["0", "0.000", "1.000", "+1.000"]
            assert "Reverse [this] sentence number 0" in cells(examples)[0][4]  # brackets shown, not markup
            changed = str(screen.query_one("#compare-changed", Static).render())
            assert "B vs A: +0.625 better" in changed
            assert "example 0: 0.000 -> 1.000 (+1.000)  Reverse [this]" in changed
            await pilot.press("escape")
            await until(pilot, lambda: isinstance(app.screen, HomeScreen))
            await mark(pilot, table, "eval-base")  # unmarked: the trained one is A now
            assert table.marked == ["eval-trained"]

    asyncio.run(scenario())


def test_evaluations_that_do_not_compare_say_why(tmp_path: Path) -> None:
    root = lab_folder(tmp_path)
    eval_run(tmp_path / "out", "eval-reverse", {0: 0.0, 1: 1.0})
    eval_run(tmp_path / "out", "eval-wordle", {0: 1.0}, env="primeintellect/wordle", age=60)

    async def scenario() -> None:
        app = make_app(root)
        async with app.run_test(size=WIDE) as pilot:
            await pilot.pause()
            await pilot.press("tab")
            table = app.screen.query_one(RunsTable)
            await until(pilot, lambda: table.has_focus and table.row_count == 2)
            await mark(pilot, table, "eval-reverse")
            await mark(pilot, table, "eval-wordle")
            await pilot.press("c")
            await until(pilot, lambda: isinstance(app.screen, CompareScreen) and app.screen.refusal is not None)
            screen = app.screen
            assert isinstance(screen, CompareScreen)
            status = str(screen.query_one("#compare-status", Static).render())
            assert "do not compare" in status and "different environments" in status
            assert not screen.query_one("#compare-evaluations", DataTable).display
            await pilot.press("escape")
            await until(pilot, lambda: isinstance(app.screen, HomeScreen))

    asyncio.run(scenario())

