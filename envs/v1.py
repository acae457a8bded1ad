"""verifiers v1 tasksets (verifiers 0.4's API), recognised from a package's source.

verifiers 0.4 removed the classic API: an environment is a `vf.Taskset` subclass exported from its package, with
no `load_environment` (../shared/notes/verifiers-v1.md). `taskset_marks` reads a package folder or wheel, as
releases.py reads its imports, without importing it: a package that defines no `load_environment` function and
subclasses verifiers' `Taskset` or imports `verifiers.v1` is a v1 taskset. A classic environment that also uses
`verifiers.v1` (releases 0.1.14 - 0.3.x carry both APIs) defines `load_environment` and stays classic.
"""

from __future__ import annotations

import ast
from pathlib import Path

from prime_lab.envs import releases


def _base_path(base: ast.expr, bound: dict[str, str]) -> str | None:
    """The verifiers path of a class base (`vf.Taskset[MyTask, MyConfig]` -> `verifiers.v1.Taskset`), or None."""
    if isinstance(base, ast.Subscript):
        base = base.value
    parts = releases.dotted(base)
    if parts is None or parts[0] not in bound:
        return None
    return ".".join([bound[parts[0]], *parts[1:]])


def taskset_marks(target: Path) -> list[str]:
    """Why the package at `target` (a folder or a wheel) is a verifiers v1 taskset, in words with file:line
    (`class ReverseTaskset(verifiers.v1.Taskset) at reverse/taskset.py:27`); [] for a classic environment (one that
    defines `load_environment`) or a package that is neither."""
    marks: list[str] = []
    for name, tree in releases.parsed_sources(target):
        bound = releases.verifiers_bindings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "load_environment" \
                    and node in tree.body:
                return []
            if isinstance(node, ast.ClassDef):
                for base in node.bases:
                    path = _base_path(base, bound)
                    if path is not None and path.rsplit(".", 1)[-1] == "Taskset":
                        marks.append(f"class {node.name}({path}) at {name}:{node.lineno}")
    if not marks:
        marks = [f"{found.words()} at {found.where}" for found in releases.verifiers_imports(target)
                 if found.module.startswith("verifiers.v1") or found.module == "verifiers" and "v1" in found.names]
    return marks


def api_of(release: str) -> str:
    """`v1` for an environment that runs at verifiers `release` 0.4 or later (a v1 taskset: 0.4 has no other API),
    `classic` for an earlier release and for prime-lab's own protocol (`release` '')."""
    from packaging.version import InvalidVersion, Version

    try:
        return "v1" if release and Version(release).release[:2] >= (0, 4) else "classic"
    except InvalidVersion:
        return "classic"
