"""bench/dashboard.py's metrics-grid part run small: three runs attached and the grid drawn, then the grid's keys
pressed while a writer appends, each figure printed beside its goal."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "dashboard.py"


@pytest.mark.slow
def test_the_grid_part_prints_its_figures_beside_the_goals() -> None:
    done = subprocess.run([sys.executable, str(BENCH), "--part", "grid", "--metrics", "6", "--steps", "300",
                           "--seconds", "1.5", "--rate", "200"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    attach = re.search(r"^\(c\) grid: attach to 3 runs x 6 metrics x 300 steps \(.*\) and draw the grid's page "
                       r"\((\d+) cells, [\d,]+ points\): (\d+\.\d\d) s \(goal < 1\.5 s: (met|NOT met)\)", out, re.M)
    assert attach is not None, out
    assert int(attach.group(1)) == 6  # every metric fits a page: each one a cell, drawn with the three runs
    assert (float(attach.group(2)) < 1.5) == (attach.group(3) == "met")
    keys = re.search(r"^\(d\) grid keys during a live writer at \d+ events/s \(3 metrics each\) for 1\.5 s: key press "
                     r"to grid drawn median \d+ ms, p95 (\d+) ms \(goal < 50 ms: (met|NOT met)\).*\((\d+) presses;",
                     out, re.M)
    assert keys is not None, out
    assert int(keys.group(1)) == 50 or (int(keys.group(1)) < 50) == (keys.group(2) == "met")  # (50: rounded)
    assert int(keys.group(3)) >= 2
