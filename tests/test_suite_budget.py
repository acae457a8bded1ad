"""scripts/suite_budget.py, the last lines of scripts/test: the times, and the verdict on the 30-minute budget and
the 60-minute limit (the exit status past it)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "suite_budget.py"


@pytest.fixture(scope="module")
def budget() -> ModuleType:
    spec = importlib.util.spec_from_file_location("suite_budget", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_within_over_and_past_the_limit(budget: ModuleType) -> None:
    within = budget.verdict(0, 150, 210, 25 * 60, 0, [])
    assert within.lines == ["scripts/test: 25 min 00 s wall clock (set-up 150 s, ruff, mypy and import contracts "
                            "60 s, pytest 1290 s; pytest exit 0)", "scripts/test: within the 30-minute budget"]
    assert (within.exit_code, within.to_stderr) == (0, False)

    over = budget.verdict(0, 150, 210, 45 * 60 + 7, 0, [])
    assert over.lines[0].startswith("scripts/test: 45 min 07 s wall clock")
    assert over.lines[1].startswith("scripts/test: OVER BUDGET: the suite took more than 30 minutes")
    assert (over.exit_code, over.to_stderr) == (0, True)  # a warning: the tests passed

    past = budget.verdict(0, 150, 210, 61 * 60, 0, [])
    assert past.lines[1].startswith("scripts/test: FAILED: past 60 minutes")
    assert (past.exit_code, past.to_stderr) == (3, True)
    assert budget.verdict(0, 150, 210, 61 * 60, 1, []).exit_code == 1  # pytest's own failure is kept


def test_a_part_of_the_suite_gets_its_times_and_the_limit_only(budget: ModuleType) -> None:
    part = budget.verdict(100, 102, 160, 100 + 40 * 60, 0, ["-m", "not slow"])
    assert part.lines[1] == "scripts/test: a part of the suite (pytest -m not slow): the budget is the whole suite's"
    assert part.exit_code == 0
    assert budget.verdict(0, 1, 2, 3601, 0, ["-k", "x"]).exit_code == 3


def test_the_script_prints_and_exits_as_it_says() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "0", "100", "160", str(70 * 60), "0"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 3
    assert done.stdout.startswith("scripts/test: 70 min 00 s wall clock") and "FAILED" in done.stderr
    bad = subprocess.run([sys.executable, str(SCRIPT), "x"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("usage: suite_budget.py")
