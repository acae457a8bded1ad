"""Installed environments as pip leaves them: a folder (put on PYTHONPATH or sys.path) with modules and their
`.dist-info` metadata."""

from __future__ import annotations

from pathlib import Path

import pytest


def distribution(site: Path, name: str, version: str, *, requires: tuple[str, ...] = (),
                 entry_points: str = "", summary: str = "") -> None:
    """The metadata pip writes for an installed distribution."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", f"Summary: {summary}",
             *(f"Requires-Dist: {r}" for r in requires)]
    (info / "METADATA").write_text("\n".join(lines) + "\n")
    if entry_points:
        (info / "entry_points.txt").write_text(entry_points)


ENV_MODULE = '''\
"""{doc}"""
import os
from pathlib import Path

from prime_lab.envs import Rubric, SingleTurnEnv

Path(os.environ.get("IMPORT_MARKS", os.devnull)).open("a").write("{name}\\n")


def load_environment(flavour: str = "{name}", size: int = 2, seed=len("ab")):
    rows = [{{"question": f"{{flavour}} {{i}}", "answer": str(i)}} for i in range(size)]
    return SingleTurnEnv(dataset=rows, system_prompt="{name} speaking",
                         rubric=Rubric([lambda completion, answer: float(completion[-1]["content"] == answer)]))
'''


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """Installed environments: reverse-text (verifiers' convention; takes the built-in's name), sums-plugin (an
    entry point to a module of another name), an unrelated package named `wordle`, and a verifiers-dependent
    package without an environment."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "reverse_text.py").write_text(ENV_MODULE.format(doc="reverse-text: the installed one.",
                                                            name="reverse_text"))
    distribution(site, "reverse-text", "0.1.4", requires=("verifiers>=0.1.5", "datasets"))
    (site / "plugin_impl").mkdir()
    (site / "plugin_impl" / "__init__.py").write_text(ENV_MODULE.format(doc="sums: a plugin.", name="plugin_impl"))
    distribution(site, "sums-plugin", "1.0", summary="Sums as a plugin.",
                 entry_points="[prime_lab.environments]\nsums-plugin = plugin_impl\n")
    (site / "wordle.py").write_text("def solve():\n    return 'crane'\n")
    distribution(site, "wordle", "2.0")
    (site / "vf_helpers.py").write_text("X = 1\n")
    distribution(site, "vf-helpers", "0.3", requires=("verifiers",))
    return site
