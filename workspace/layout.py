"""`prime lab setup`: a workspace folder with configs that run on this machine, an example environment, a .gitignore.

The config templates ship inside the package (`templates/configs/`, package data), so an installed prime-lab sets up
the same workspace as a checkout. They are a copy of the repository's `configs/` (the configs its README and tests
use), and tests/workspace/test_workspace.py fails, naming the file to copy, when the two differ.

Setting up is idempotent: a file that exists is left as it is (reported `kept` when it differs from the template)
unless `force`; the `.gitignore` only ever gains the lines it lacks.
"""

from __future__ import annotations

import fnmatch
import importlib.resources
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from prime_lab.envs.installed import canonical, module_name
from prime_lab.envs.scaffold import ScaffoldError, check_name, package_contents, refuse_both

CONFIG_KINDS = ("rl", "sft", "gepa", "eval")
FOLDERS = ("configs", *(f"configs/{kind}" for kind in CONFIG_KINDS), "environments")
EXAMPLE_ENVIRONMENT = "my-env"
GITIGNORE = ".gitignore"
GITIGNORE_HEADER = "# prime-lab: secrets, run outputs and caches (prime lab setup; prime lab doctor checks them)"
# (pattern, what it keeps out of git); `required` ones are checked by `prime lab doctor` as failures.
GITIGNORE_LINES: tuple[tuple[str, str], ...] = (
    (".env", "secrets: env_file, KEY=VALUE"),
    ("/outputs/", "evaluation results: prime eval run"),
    ("/environments/*/outputs/", "evaluations run from inside an environment's folder"),
    ("/.prime-lab/", "runs and models when PRIME_LAB_HOME=.prime-lab"),
    ("__pycache__/", "caches"),
    (".pytest_cache/", "caches"),
    (".ruff_cache/", "caches"),
    (".mypy_cache/", "caches"),
    ("*.egg-info/", "build metadata of environment packages"),
    ("dist/", "built environment packages"),
)
REQUIRED_IGNORES = (".env", "/outputs/")


class Change(StrEnum):
    CREATED = "created"
    OVERWRITTEN = "overwritten"  # it differed from the template, and `force` was given
    UPDATED = "updated"  # the .gitignore gained lines
    UNCHANGED = "unchanged"  # already as the template has it
    KEPT = "kept"  # it differs from the template (a user's edit, say): left alone without `force`
    SKIPPED = "skipped"  # could not be written; `detail` says why


@dataclass(frozen=True)
class Action:
    path: Path
    change: Change
    detail: str = ""


@dataclass(frozen=True)
class SetupResult:
    folder: Path
    actions: tuple[Action, ...]

    @property
    def changed(self) -> bool:
        return any(a.change in (Change.CREATED, Change.OVERWRITTEN, Change.UPDATED) for a in self.actions)


def template_root() -> Path:
    """The templates folder inside the installed package (`templates/`, holding `configs/`)."""
    return Path(str(importlib.resources.files("prime_lab.workspace") / "templates"))


def config_templates() -> Iterator[tuple[str, bytes]]:
    """Every template file as (path relative to the workspace, e.g. `configs/rl/reverse-text.toml`, contents)."""
    root = template_root()
    for path in sorted((root / "configs").rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            yield path.relative_to(root).as_posix(), path.read_bytes()


def setup_workspace(folder: Path, *, force: bool = False, verifiers: bool = False, v1: bool = False) -> SetupResult:
    """Create (or complete) the workspace in `folder`; with `force`, files that differ from the templates are
    overwritten. `verifiers` writes the example environment in verifiers' classic API, `v1` as a verifiers v1
    taskset (verifiers 0.4); both at once are refused (ScaffoldError), before anything is written."""
    refuse_both(verifiers, v1)
    actions: list[Action] = []
    for rel in (".", *FOLDERS):
        path = folder / rel
        if not path.is_dir():
            path.mkdir(parents=True, exist_ok=True)
            actions.append(Action(path, Change.CREATED))
    for rel, data in config_templates():
        actions.append(_write(folder / rel, data, force))
    actions += _example_environment(folder / "environments", force=force, verifiers=verifiers, v1=v1)
    actions.append(ensure_gitignore(folder))
    return SetupResult(folder, tuple(actions))


def _write(path: Path, data: bytes, force: bool) -> Action:
    if path.exists():
        if path.read_bytes() == data:
            return Action(path, Change.UNCHANGED)
        if not force:
            return Action(path, Change.KEPT, "differs from the template; --force overwrites it")
        path.write_bytes(data)
        return Action(path, Change.OVERWRITTEN)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return Action(path, Change.CREATED)


def _example_environment(parent: Path, *, force: bool, verifiers: bool, v1: bool) -> list[Action]:
    """`prime env init my-env` into `environments/`: written whole when its folder is new; file by file as any
    template (kept, or overwritten with `force`) when it exists."""
    folder = parent / EXAMPLE_ENVIRONMENT
    name = canonical(EXAMPLE_ENVIRONMENT)
    module = module_name(name)
    if not folder.exists():
        try:
            check_name(name)  # another installed module of that name would shadow the example
        except ScaffoldError as exc:
            return [Action(folder, Change.SKIPPED, str(exc))]
    contents = package_contents(name, module, verifiers=verifiers, v1=v1)
    return [_write(folder / rel, text.encode("utf-8"), force) for rel, text in contents.items()]


# ------------------------------------------------------------------------------------------------------------
# .gitignore

def ignore_patterns(text: str) -> list[str]:
    """The patterns of a .gitignore (comments, blank lines and negations left out)."""
    lines = (line.strip() for line in text.splitlines())
    return [line for line in lines if line and not line.startswith(("#", "!"))]


def covers(patterns: list[str], entry: str) -> bool:
    """Whether one of `patterns` ignores `entry` (a line of GITIGNORE_LINES): the same line, or a pattern that
    matches it (`outputs` or `outputs/` anywhere also cover `/outputs/` and `/environments/*/outputs/`)."""
    target = entry.strip("/")
    last = target.rsplit("/", 1)[-1]
    for pattern in patterns:
        bare = pattern.removeprefix("**/").rstrip("/")
        anchored = pattern.startswith("/") or "/" in bare
        bare = bare.lstrip("/")
        if bare == target or fnmatch.fnmatchcase(target, bare):
            return True
        if not anchored and fnmatch.fnmatchcase(last, bare):
            return True
    return False


def missing_ignores(folder: Path) -> list[str]:
    """The GITIGNORE_LINES patterns the workspace's .gitignore lacks (all of them when it has none)."""
    path = folder / GITIGNORE
    patterns = ignore_patterns(path.read_text(encoding="utf-8", errors="replace")) if path.is_file() else []
    return [entry for entry, _ in GITIGNORE_LINES if not covers(patterns, entry)]


def ensure_gitignore(folder: Path) -> Action:
    """Add the lines the .gitignore lacks (creating it if need be); a user's own lines stay as they are."""
    path = folder / GITIGNORE
    missing = missing_ignores(folder)
    if not missing:
        return Action(path, Change.UNCHANGED)
    block = [GITIGNORE_HEADER, *missing]
    if not path.exists():
        path.write_text("\n".join(block) + "\n", encoding="utf-8")
        return Action(path, Change.CREATED)
    text = path.read_text(encoding="utf-8", errors="replace")
    separator = "" if not text or text.endswith("\n") else "\n"
    path.write_text(text + separator + ("\n" if text.strip() else "") + "\n".join(block) + "\n", encoding="utf-8")
    return Action(path, Change.UPDATED, "added " + ", ".join(missing))
