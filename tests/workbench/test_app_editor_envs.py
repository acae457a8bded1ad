"""The editor and an environment the config names that is not installed: its problem line names the key that
installs it, and the key runs `prime env install ID` (the CLI, through the workbench's launch path) against a
loopback Environments Hub, whose answer the workbench shows."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from prime_lab.workbench.screens.editor import EditorScreen
from prime_lab.workbench.widgets.problems_panel import ProblemsPanel
from tests.support.envs_hub import EnvsHub, serve
from tests.workbench.lab_fixtures import SIZE, lab_folder, make_app, record_notifications, until


def test_ctrl_o_installs_what_the_config_names_and_the_hub_s_answer_shows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = lab_folder(tmp_path)
    path = root / "configs" / "rl" / "hub.toml"
    path.write_text((root / "configs" / "rl" / "reverse-text.toml").read_text().replace(
        'id = "primeintellect/reverse-text"', 'id = "acme/word-count"', 1))
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.prime/config.json of the machine's
    monkeypatch.delenv("PRIME_API_KEY", raising=False)
    monkeypatch.delenv("PRIME_BASE_URL", raising=False)

    async def scenario(hub: EnvsHub) -> None:
        app = make_app(path)
        messages = record_notifications(app)
        async with app.run_test(size=SIZE) as pilot:
            screen = app.screen
            assert isinstance(screen, EditorScreen)
            problems = screen.query_one(ProblemsPanel)
            await until(pilot, lambda: bool(problems.problems), what=lambda: problems.problems)
            assert [(p.severity, p.key, p.line, p.message) for p in problems.problems] == [
                ("note", "env[0].id", 18, "acme/word-count is not installed: ctrl+o installs it from the "
                                         "Environments Hub (prime env install acme/word-count)")]
            assert screen.document.errors == []  # a note: the config still launches (and says the same)
            await pilot.press("ctrl+o")
            await until(pilot, lambda: any("failed" in m for m in messages), what=lambda: messages)
            assert f"prime env install acme/word-count failed: Error: no environment acme/word-count on the " \
                   f"Environments Hub ({hub.url}) (Environment acme/word-count not found): check the id" in messages
            assert [p for _, p, _ in hub.requests] == ["/api/v1/environmentshub/acme/word-count/@latest"]
            await until(pilot, lambda: not screen._installing)
            assert [p.key for p in problems.problems] == ["env[0].id"]  # still not installed: still said

    with serve(EnvsHub()) as hub:
        monkeypatch.setenv("PRIME_API_BASE_URL", hub.url)
        asyncio.run(scenario(hub))
