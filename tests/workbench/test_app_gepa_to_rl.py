"""GEPA -> RL from a GEPA run's page: `e` writes the RL config that starts from the best prompt (as `prime gepa
export --rl` does, validated) to configs/rl/from-<run id>.toml under the folder the workbench was opened on, never
over an existing file, says where and how the prompt goes in, and opens it in the editor."""

from __future__ import annotations

import asyncio
import json
import tomllib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from prime_lab.runs.registry import Run, RunRegistry
from prime_lab.trainer.config import validate_rl_file
from prime_lab.workbench.screens.dashboard_gepa import GepaDashboard
from prime_lab.workbench.screens.editor import EditorScreen
from tests.support.rl_runs import FIXTURE_ENVS
from tests.workbench.lab_fixtures import caught_up, lab_folder, make_app, record_notifications, until

BEST = "Answer with letters only.\nNever digits."


def gepa_run(env_id: str, env_args: dict | None = None) -> Run:
    """A GEPA run's folder as tests/gepa/test_export.py builds it: settings, best prompt, metadata, candidates."""
    settings = {"env_id": env_id, "env_args": env_args or {}, "model": "smollm2-135m", "num_val": 4,
                "sampling": {"max_tokens": 8, "temperature": 0.9}}
    run = RunRegistry().create("gepa", config_text="", resolved={"settings": settings}, model="smollm2-135m",
                               envs=[env_id])
    run.update_status(state="completed")
    run.gepa_dir.mkdir()
    (run.gepa_dir / "best_prompt.txt").write_text(BEST)
    (run.gepa_dir / "metadata.json").write_text(json.dumps({"best_score": 0.75, "best_idx": 1}))
    (run.gepa_dir / "candidates.jsonl").write_text(json.dumps({"candidate_idx": 0, "score": 0.5}) + "\n"
                                                   + json.dumps({"candidate_idx": 1, "score": 0.75}) + "\n")
    with run.writer("gepa") as writer:
        writer.log("gepa finished")
    return run


@asynccontextmanager
async def exported(root: Path, run: Run) -> AsyncIterator[tuple[Pilot[Any], list[str]]]:
    """The app on the GEPA run's page, once `e` was pressed there; and the notifications since it opened."""
    app = make_app(root, run_id=run.id)
    async with app.run_test(size=(120, 40)) as pilot:
        notes = record_notifications(app)
        await until(pilot, lambda: isinstance(app.screen, GepaDashboard) and caught_up(app.screen))
        await pilot.press("e")
        yield pilot, notes


def editing(pilot: Pilot[Any]) -> Path | None:
    """The file the editor is open on, None when the editor is not the screen."""
    screen = pilot.app.screen
    return screen.document.path if isinstance(screen, EditorScreen) else None


def test_the_key_writes_a_valid_config_beside_the_workspace_and_opens_it(tmp_path: Path) -> None:
    root = lab_folder(tmp_path)
    run = gepa_run("reverse-text", {"max_words": 2})

    async def scenario() -> None:
        async with exported(root, run) as (pilot, notes):
            path = root / "configs" / "rl" / f"from-{run.id}.toml"
            await until(pilot, lambda: editing(pilot) == path, what=lambda: notes)
            data = tomllib.loads(path.read_text())
            assert data["env"][0]["args"] == {"max_words": 2, "system_prompt": BEST}
            assert data["model"] == "smollm2-135m" and data["eval"]["eval_base_model"] is True
            checked = validate_rl_file(path, check_model=False)
            assert checked.problems == [], [p.format() for p in checked.problems]
            assert any(f"Wrote configs/rl/from-{run.id}.toml" in n and "[[env]].args" in n for n in notes)
            written = path.read_text()
            await pilot.press("escape")  # back on the GEPA page: again, a new file, the first one left as it was
            await until(pilot, lambda: isinstance(pilot.app.screen, GepaDashboard))
            await pilot.press("e")
            await until(pilot, lambda: editing(pilot) == root / "configs" / "rl" / f"from-{run.id}-2.toml")
            assert path.read_text() == written

    asyncio.run(scenario())


def test_an_environment_without_the_argument_gets_the_local_system_prompt(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(FIXTURE_ENVS))  # tiny-chars: load_environment takes no system_prompt
    root = lab_folder(tmp_path)
    run = gepa_run("tiny-chars")
    (root / "configs" / "rl" / f"from-{run.id}.toml").write_text("# mine\n")

    async def scenario() -> None:
        async with exported(root, run) as (pilot, notes):
            path = root / "configs" / "rl" / f"from-{run.id}-2.toml"
            await until(pilot, lambda: editing(pilot) == path, what=lambda: notes)
            assert (root / "configs" / "rl" / f"from-{run.id}.toml").read_text() == "# mine\n"
            assert tomllib.loads(path.read_text())["env"][0]["system_prompt"] == BEST
            assert any("takes no system_prompt argument: [[env]] system_prompt" in n for n in notes)

    asyncio.run(scenario())


def test_a_run_without_a_best_prompt_says_so(tmp_path: Path) -> None:
    root = lab_folder(tmp_path)
    run = gepa_run("reverse-text")
    (run.gepa_dir / "best_prompt.txt").unlink()

    async def scenario() -> None:
        async with exported(root, run) as (pilot, notes):
            await until(pilot, lambda: any("no best_prompt.txt yet" in n for n in notes), what=lambda: notes)
            assert isinstance(pilot.app.screen, GepaDashboard)
            assert not list((root / "configs" / "rl").glob("from-*"))

    asyncio.run(scenario())


def test_a_run_whose_best_is_the_seed_exports_with_a_warning(tmp_path: Path) -> None:
    root = lab_folder(tmp_path)
    run = gepa_run("reverse-text")
    (run.gepa_dir / "metadata.json").write_text(json.dumps({"best_score": 0.5, "best_idx": 0, "seed_score": 0.5}))

    async def scenario() -> None:
        async with exported(root, run) as (pilot, notes):
            path = root / "configs" / "rl" / f"from-{run.id}.toml"
            await until(pilot, lambda: editing(pilot) == path, what=lambda: notes)
            assert any(f"no candidate of GEPA run {run.id} beat the seed prompt" in n for n in notes), notes

    asyncio.run(scenario())
