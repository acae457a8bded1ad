"""Time to the first frame of `prime lab`, in a real terminal (tmux), and no torch loaded.

    .venv/bin/python bench/lab_startup.py [--runs 5]

Prints, median and worst of several runs, the time from starting the installed `prime lab` until its home screen
lists the default config (goal: under 1 s on a 2-core machine), and until `prime lab configs/rl/reverse-text.toml`
shows that config's editor as valid; and whether building the app imports torch (it must not).
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

from prime_lab.workbench.terminal import TmuxPane  # noqa: E402

NO_TORCH = """
import sys
from prime_lab.workbench.app import create_app
create_app(None)
print("torch" in sys.modules)
"""


SCREENS = {"home": ([], ("reverse-text.toml",)),
           "editor": (["configs/rl/reverse-text.toml"], ("reverse-text.toml", "valid"))}


def first_frame_seconds(home: str, screen: str) -> float:
    args, needles = SCREENS[screen]
    prime = str(Path(sys.executable).parent / "prime")
    pane = TmuxPane([prime, "lab", *args], cwd=REPO, env={"PRIME_LAB_HOME": home})
    try:
        return pane.wait_for(*needles, timeout=60, interval=0.005)
    finally:
        pane.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as home:
        for screen in SCREENS:
            first_frame_seconds(home, screen)  # warm the file cache once, as a user's second start would be
            times = [first_frame_seconds(home, screen) for _ in range(args.runs)]
            print(f"prime lab first frame, {screen:<6}: median {statistics.median(times):.3f} s, "
                  f"worst {max(times):.3f} s over {len(times)} runs")
    torch_loaded = subprocess.run([sys.executable, "-c", NO_TORCH], capture_output=True, text=True, cwd=REPO,
                                  timeout=120).stdout.strip()
    print(f"torch imported by the app: {torch_loaded}")


if __name__ == "__main__":
    main()
