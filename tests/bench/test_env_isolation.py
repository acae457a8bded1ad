"""bench/env_isolation.py run small: the fixture installed at its own release (its virtual environment created with
pip from the package registry, or reused from `$PRIME_LAB_VERIFIERS_HOME`), a few groups on each side against the
stand-in model, and the figures it prints (ms per group on both sides, the overhead and the ratio)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "env_isolation.py"
NUMBER = r"(\d+\.\d\d)"
LAST = re.compile(rf"^in-process: {NUMBER} ms/group  isolated: {NUMBER} ms/group  overhead: ([+-]\d+\.\d\d) ms/group "
                  rf"\(ratio {NUMBER}\)$", re.M)


@pytest.mark.slow
def test_the_bench_prints_both_sides_the_overhead_and_the_ratio(releases_home: Path, tmp_path: Path) -> None:
    # the session's releases (a release's environment made once, reused by every test that needs it)
    done = subprocess.run([sys.executable, str(BENCH), "--groups", "4", "--group-size", "2", "--warmup", "1",
                           "--home", str(tmp_path / "home"), "--verifiers-home", str(releases_home)],
                          capture_output=True, text=True, timeout=550)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    found = LAST.search(out)
    assert found is not None, out
    inside, isolated, overhead, ratio = (float(g) for g in found.groups())
    assert inside > 0 and isolated > 0, out
    assert overhead == pytest.approx(isolated - inside, abs=0.02)
    assert ratio == pytest.approx(isolated / inside, rel=0.01, abs=0.01)
    assert re.search(r"^the stand-in answered 20 requests \(20 expected\)$", out, re.M), out  # 2 sides x 5 x 2
    start = re.search(r"^isolated server start: (\d+\.\d\d) s \(its first group, which starts it, took", out, re.M)
    assert start is not None and float(start.group(1)) > 0, out
    assert (tmp_path / "home" / "environments" / "isolated.json").is_file()  # installed into the bench's own home


V1_LAST = re.compile(rf"^classic in-process: {NUMBER} ms/group  v1: {NUMBER} ms/group  overhead: ([+-]\d+\.\d\d) "
                     rf"ms/group \(ratio {NUMBER}\)$", re.M)


@pytest.mark.slow
def test_the_v1_row_prints_the_taskset_against_its_classic_twin(releases_home: Path, tmp_path: Path) -> None:
    """`--v1`: the v1 taskset installed at verifiers 0.4.0 and run through driver_v1.py, its classic twin in the
    bench's process, both on the built-in server; both sides' figures, the overhead and the ratio."""
    done = subprocess.run([sys.executable, str(BENCH), "--v1", "--groups", "2", "--group-size", "2", "--warmup", "1",
                           "--max-tokens", "4", "--home", str(tmp_path / "home"), "--verifiers-home",
                           str(releases_home)], capture_output=True, text=True, timeout=550)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found = V1_LAST.search(done.stdout)
    assert found is not None, done.stdout
    classic, v1, overhead, ratio = (float(g) for g in found.groups())
    assert classic > 0 and v1 > 0 and overhead == pytest.approx(v1 - classic, abs=0.02)
    assert ratio == pytest.approx(v1 / classic, rel=0.01, abs=0.01)
    assert "v1 first group (starts its server, prepares the harness program)" in done.stdout
