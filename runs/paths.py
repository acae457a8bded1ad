"""Where prime-lab keeps things on disk.

`PRIME_LAB_HOME` (default `~/.prime-lab`) holds `runs/` and `models/`. `PRIME_LAB_MODELS` moves the models folder
on its own (tests share one materialised model folder across a session while each test gets an empty home).
`cache_dir` holds what can be computed again (model outlines for the LoRA target checks).
`constraints_file` finds the checkout's `constraints.txt`, which every pip install prime-lab runs goes through.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
import tomllib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote, urlparse


def lab_home() -> Path:
    return Path(os.environ.get("PRIME_LAB_HOME") or Path.home() / ".prime-lab").expanduser()


def cache_dir() -> Path:
    """What prime-lab can always compute again, kept between runs: `$PRIME_LAB_CACHE`, else `$XDG_CACHE_HOME/prime-lab`
    (`~/.cache/prime-lab`)."""
    given = os.environ.get("PRIME_LAB_CACHE")
    if given:
        return Path(given).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "prime-lab"


def runs_dir() -> Path:
    return lab_home() / "runs"


def models_dir() -> Path:
    override = os.environ.get("PRIME_LAB_MODELS")
    return Path(override).expanduser() if override else lab_home() / "models"


def child_python() -> list[str]:
    """The interpreter command for prime-lab's child processes (`-m`/`-c` after it).

    `-P`: the current folder is not put first on `sys.path`, so a project folder holding `runs/`, `models/`,
    `environments/` or a module named like a dependency shadows nothing in the servers, the trainer or the orchestrator.
    """
    return [sys.executable, "-P"]


def constraints_file() -> Path | None:
    """`constraints.txt` of the prime-lab checkout this interpreter runs (found through the install's
    direct_url.json, then through the source of `prime_lab`), or None when prime-lab was not installed from one.
    It pins torch: every pip install prime-lab runs (environments, verifiers releases) goes through it."""
    roots: list[Path] = []
    try:
        direct = json.loads(importlib.metadata.distribution("prime-lab").read_text("direct_url.json") or "{}")
    except (importlib.metadata.PackageNotFoundError, ValueError):
        direct = {}
    url = urlparse(str(direct.get("url", "")))
    if url.scheme == "file":
        roots.append(Path(unquote(url.path)))
    import prime_lab

    roots.extend(Path(prime_lab.__file__).resolve().parents)
    for root in roots:
        pyproject = root / "pyproject.toml"
        if (root / "constraints.txt").is_file() and pyproject.is_file() and project_name(pyproject) == "prime-lab":
            return root / "constraints.txt"
    return None


def project_name(pyproject: Path) -> str:
    """`[project] name` of a pyproject.toml, or "" when it has none or cannot be read."""
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return ""
    return str(data.get("project", {}).get("name", ""))


def restore_environ(before: Mapping[str, str | None]) -> None:
    """Put this process's variables back as `before` holds them (None: unset)."""
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@contextmanager
def environ_set(values: Mapping[str, str], *, keep: tuple[str, ...] = ()) -> Iterator[None]:
    """`values` in this process's environment for a block, then the variables as they were (those in `keep` stay
    set)."""
    before = {name: os.environ.get(name) for name in values if name not in keep}
    os.environ.update(values)
    try:
        yield
    finally:
        restore_environ(before)
