"""bench/trainer_throughput.py's --gpu flow run small on the CPU (`--tiny`): ours and the plain transformers + peft
GRPO loop each train a shape, and its block ends in the ratio ours / peer beside the goal."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "trainer_throughput.py"
RATIO = re.compile(r"^  ours / peer: (\d+\.\d\d)x tokens/s, (\d+\.\d\d)x peak memory \(goal: (.+)\)$", re.M)


@pytest.mark.slow
def test_each_shape_prints_ours_over_the_peer_beside_its_goal() -> None:
    done = subprocess.run([sys.executable, str(BENCH), "--tiny", "--steps", "2", "--shapes", "rl-varying,long-ac"],
                          capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    # the peer pads each micro-batch of varying completions to its longest; the card heads every block
    assert re.search(r"^\[CPU, \d+ cores\] rl-varying: .*peer: micro-batches \[4, \d+-\d+\], [1-9]\d*% of their "
                     r"positions padding$", out, re.M), out
    assert re.search(r"^\[CPU, \d+ cores\] long-ac: .*ours: micro_batch_size = 1, activation_checkpointing = true;",
                     out, re.M), out
    ratios = RATIO.findall(out)
    assert len(ratios) == 2, out
    assert all(float(speed) > 0 and float(memory) > 0 for speed, memory, _ in ratios)
    assert ratios[0][2].startswith("tokens/s >= 1.5x (")
    assert ratios[1][2] == "ours' peak <= 8 GiB (met)"  # a tiny model's process stays well under 8 GiB
    assert out.count("by prime-rl's count") == 4 and out.count("by PaLM's count") == 4  # ours and the peer, twice
