"""Snapshots of the main screens at 80x24 with a frozen clock (update with `pytest --snapshot-update`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.workbench.lab_fixtures import SIZE, fixed_run, lab_folder, make_app, settle


def test_home_snapshot(tmp_path: Path, snap_compare: Any) -> None:
    root = lab_folder(tmp_path)
    fixed_run("rl-demo", step=12, reward=0.41, state="running")
    fixed_run("eval-demo", kind="eval")
    assert snap_compare(make_app(root), terminal_size=SIZE, run_before=settle)


def test_editor_with_problems_snapshot(tmp_path: Path, snap_compare: Any) -> None:
    path = lab_folder(tmp_path) / "configs" / "rl" / "reverse-text.toml"
    path.write_text(path.read_text().replace("max_steps = 30", "max_stpes = 30").replace("r = 16", "r = 0"))
    assert snap_compare(make_app(path), terminal_size=SIZE, run_before=settle)


def test_run_page_snapshot(tmp_path: Path, snap_compare: Any) -> None:
    root = lab_folder(tmp_path)
    fixed_run("rl-demo", step=12, reward=0.41)
    assert snap_compare(make_app(root, run_id="rl-demo"), terminal_size=SIZE, run_before=settle)
