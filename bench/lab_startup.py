"""Time to the first frame of `prime lab` on the default config, in a real terminal (tmux), and no torch loaded.

    .venv/bin/python bench/lab_startup.py [--runs 5]

Prints the time from starting the installed `prime lab configs/rl/reverse-text.toml` until its editor shows the
config as valid (goal: under 1 s on a 2-core machine), median and worst of several runs, and whether building the
app imports torch (it must not).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from workbench.terminal import TmuxPane  # noqa: E402

NO_TORCH = """
import sys
from workbench.app import create_app
create_app(None)
print("torch" in sys.modules)
"""


def first_frame_seconds(home: str) -> float:
    prime = str(Path(sys.executable).parent / "prime")
    pane = TmuxPane([prime, "lab", "configs/rl/reverse-text.toml"], cwd=REPO, env={"PRIME_LAB_HOME": home})
    try:
        return pane.wait_for("reverse-text.toml", "valid", timeout=60, interval=0.005)
    finally:
        pane.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as home:
        first_frame_seconds(home)  # warm the file cache once, as a user's second start would be
        times = [first_frame_seconds(home) for _ in range(args.runs)]
    torch_loaded = subprocess.run([sys.executable, "-c", NO_TORCH], capture_output=True, text=True, cwd=REPO,
                                  timeout=120).stdout.strip()
    print(f"prime lab first frame (editor on the default config, valid): median {statistics.median(times):.3f} s, "
          f"worst {max(times):.3f} s over {len(times)} runs (goal < 1 s)")
    print(f"torch imported by the app: {torch_loaded}")


if __name__ == "__main__":
    main()
