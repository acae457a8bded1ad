"""bench/mixed_releases.py run small: vf_fruit_task installed at verifiers 0.1.12 (that release's virtual environment
created with pip from the package registry, or reused from the session's `releases_home`), an RL run of a tiny model
for 2 steps on it and vf_legacy_sort (beside prime-lab, in-process), and the two environments' lines it prints:
release, where each ran, the mean reward over the first and the last third of the steps and their ratio (on a tiny
model the rewards mean nothing, so only their form and arithmetic are checked)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from prime_lab.runs.registry import RunRegistry

BENCH = Path(__file__).resolve().parents[2] / "bench" / "mixed_releases.py"
REWARDS = (r"\n    reward: first third (\d\.\d{3}) \([^)]*\)  last third (\d\.\d{3}) \([^)]*\)  "
           r"ratio (\d+\.\d\d|n/a \(first third 0\))$")


@pytest.mark.slow
def test_the_bench_prints_both_environments_where_they_ran_and_their_rewards(
        learnable_model_dir: Path, releases_home: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    done = subprocess.run([sys.executable, str(BENCH), "--model", str(learnable_model_dir), "--steps", "2",
                           "--home", str(home), "--verifiers-home", str(releases_home)],
                          capture_output=True, text=True, timeout=550)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout

    lines = {
        "vf-fruit-task": rf"^vf-fruit-task +verifiers 0\.1\.12 +isolated interpreter {re.escape(str(releases_home))}"
                         r"/0\.1\.12/bin/python$",
        "vf-legacy-sort": r"^vf-legacy-sort +verifiers 0\.3\.\d+\S* +beside prime-lab, in-process \(\S+\)$",
    }
    for env_id, where in lines.items():
        found = re.search(where + REWARDS, out, re.M)
        assert found is not None, f"no lines for {env_id} in:\n{out}"
        first, last, ratio = float(found.group(1)), float(found.group(2)), found.group(3)
        assert 0.0 <= first <= 1.0 and 0.0 <= last <= 1.0, out
        if first > 0:
            assert float(ratio) == pytest.approx(last / first, abs=0.01), out
        else:
            assert ratio.startswith("n/a"), out

    # the run completed in the bench's own home, with vf-fruit-task's server among its processes
    run_id = re.search(r"^run (rl-\S+): 2 steps in ", out, re.M)
    assert run_id is not None, out
    status = RunRegistry(root=home / "runs").get(run_id.group(1)).read_status()
    assert status["state"] == "completed" and "env-vf-fruit-task" in status["processes"], status
    assert (home / "environments" / "isolated.json").is_file()  # installed into the bench's own home
