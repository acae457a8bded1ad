"""bench/sft_then_rl.py end to end on a tiny random model (`--tiny`): the base eval, an SFT run and its eval, an RL run
from the SFT model (its adapter evaluated with `prime eval run --adapter`), and the summary with the three rewards and
the two lifts (on a random model the lifts mean nothing, so only their arithmetic is checked)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from prime_lab.runs.registry import RunRegistry

pytestmark = pytest.mark.slow

BENCH = Path(__file__).resolve().parents[2] / "bench" / "sft_then_rl.py"
NUMBER = r"(\d\.\d{3})"
LIFT = r"([+-]\d\.\d{3})"


def test_the_bench_prints_three_rewards_and_two_lifts() -> None:
    done = subprocess.run([sys.executable, str(BENCH), "--tiny", "--sft-steps", "2", "--rl-steps", "2",
                           "--eval-n", "3"], capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout

    def line(pattern: str) -> re.Match[str]:
        found = re.search(f"^{pattern}$", out, re.M)
        assert found is not None, f"no line {pattern!r} in:\n{out}"
        return found

    line(r"eval: primeintellect/reverse-text's eval split, 3 examples \(shuffled with seed 0\) x 1 rollouts, .*")
    base, after_sft, after_rl = (float(line(f"  {label} +{NUMBER}").group(1))
                                 for label in ("base reward", "after-SFT reward", "after-RL reward"))
    assert all(0.0 <= r <= 1.0 for r in (base, after_sft, after_rl)), out
    sft_lift = float(line(rf"  SFT lift {LIFT} \(after SFT - base\)").group(1))
    rl = line(rf"  RL lift  {LIFT} \(after RL - after SFT; the RL run's own evals: {LIFT}\)")
    assert sft_lift == pytest.approx(after_sft - base, abs=2e-3)
    assert float(rl.group(1)) == pytest.approx(after_rl - after_sft, abs=2e-3)
    line(r"  wall: base eval \d+ s, SFT \d+ s \(2 steps\), SFT eval \d+ s, RL \d+ s \(2 steps \+ 2 evals\), "
         r"RL eval \d+ s; total \d+ s")
    # the runs it made are in the registry, completed, the RL run on the SFT run's model
    sft_id, rl_id = line(r"    SFT run (sft-\S+): .*").group(1), line(r"    RL run (rl-\S+): .*").group(1)
    sft, rl_run = RunRegistry().get(sft_id).read_status(), RunRegistry().get(rl_id).read_status()
    assert sft["state"] == rl_run["state"] == "completed" and rl_run["model"] == sft_id
