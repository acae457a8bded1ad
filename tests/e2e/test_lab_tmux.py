"""Smoke test of the installed `prime lab` in a real terminal: tmux sends keys and reads the pane."""

from __future__ import annotations

import os
import time
from pathlib import Path

from prime_lab.workbench.terminal import TmuxPane
from tests.support.cli import PRIME

REPO = Path(__file__).resolve().parents[2]


def test_prime_lab_opens_the_default_config_navigates_and_quits(lab_home: Path) -> None:
    pane = TmuxPane([PRIME, "lab", "configs/rl/reverse-text.toml"], cwd=REPO,
                    env={"PRIME_LAB_HOME": os.environ["PRIME_LAB_HOME"]})
    try:
        pane.wait_for("reverse-text.toml", "valid", "No problems", timeout=60)
        pane.send("C-t")  # the raw TOML view
        pane.wait_for('model = "smollm2-135m"')
        pane.send("C-t")  # back to the form, whose Escape goes back to the home screen: configs and runs
        pane.wait_for("Rollouts per example")
        pane.send("Escape")
        pane.wait_for("configs/eval/code-tests.toml", "configs/gepa/reverse-text.toml")
        pane.send("q")
        deadline = time.monotonic() + 20
        while pane.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not pane.alive(), pane.text()
    finally:
        pane.close()
