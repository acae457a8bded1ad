"""Environment packages installed beside prime-lab, found from distribution metadata and read from source.

Nothing here imports an environment (a verifiers environment imports verifiers, datasets and more): a package is
found from its metadata, and its `load_environment` arguments are read from the module's source. An installed
environment is a distribution that either
- declares an entry point in the group `prime_lab.environments` (`prime env init` writes one): the entry point's
  name is the environment's name, its value the module (`my_env`, or `my_env:load` for another function name); or
- follows verifiers' convention (`vf-init`, the Environments Hub): it depends on `verifiers` (or on `prime-lab`) and
  ships a top-level module named like the distribution (`reverse-text` -> `reverse_text`) that defines
  `load_environment`. The module is found as the package ships it, whatever its case (`UncertaintyBench.py` for the
  distribution `uncertaintybench`): read from the distribution's files; the id stays the canonical name.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENTRY_POINT_GROUP = "prime_lab.environments"
LOAD_FUNCTION = "load_environment"
# A distribution that depends on one of these may follow verifiers' convention.
_FRAMEWORKS = {"verifiers", "prime-lab"}
_REQUIREMENT_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def canonical(name: str) -> str:
    """A distribution or environment name as PyPI compares them (`My_Env` -> `my-env`)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def module_name(env_id: str) -> str:
    """The module an environment id names: `owner/my-env` -> `my_env`."""
    return env_id.rsplit("/", 1)[-1].replace("-", "_").replace(".", "_")


@dataclass(frozen=True)
class InstalledEnvironment:
    name: str  # what a user types: the entry point's name or the distribution's
    module: str
    function: str  # the load function's name in `module`
    distribution: str
    version: str
    summary: str


@dataclass(frozen=True)
class SourceDefault:
    """A default argument that is an expression, not a literal (shown as written)."""

    source: str

    def __repr__(self) -> str:
        return self.source

    def __str__(self) -> str:
        return self.source


def _entry_point_target(value: str) -> tuple[str, str]:
    module, _, attr = value.partition(":")
    return module.strip(), attr.strip() or LOAD_FUNCTION


def module_source(module: str) -> str | None:
    """The source text of a top-level module (a package's `__init__.py`), found without importing it."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    try:
        return Path(spec.origin).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def looks_like_environment(module: str) -> bool:
    """Whether an importable module mentions `load_environment` (defines it or re-exports it), by its source."""
    source = module_source(module)
    return source is not None and LOAD_FUNCTION in source


def _requires_any(requirements: list[str] | None, names: set[str]) -> bool:
    """Whether one of `requirements` (a distribution's Requires-Dist) names a distribution in `names`."""
    return any((m := _REQUIREMENT_NAME.match(r)) is not None and canonical(m.group(1)) in names
               for r in requirements or [])


def _framework_dependent(dist: importlib.metadata.Distribution) -> bool:
    return _requires_any(dist.requires, _FRAMEWORKS)


def depends_on_verifiers(distribution: str) -> bool:
    """Whether an installed distribution requires verifiers (it runs on the release installed beside prime-lab)."""
    try:
        return _requires_any(importlib.metadata.requires(distribution), {"verifiers"})
    except importlib.metadata.PackageNotFoundError:
        return False


def _module_of_path(path: str) -> str | None:
    """The top-level module a file installs (`UncertaintyBench.py`, `pkg/__init__.py` -> `pkg`), if any."""
    parts = path.replace("\\", "/").split("/")
    if not parts or parts[0] in ("", "..", "__pycache__") or parts[0].endswith((".dist-info", ".egg-info", ".data")):
        return None
    if len(parts) == 1:
        stem, dot, suffix = parts[0].partition(".")
        return stem if dot and suffix == "py" and not stem.startswith("__editable__") else None
    return parts[0] if parts[0].isidentifier() else None


def shipped_modules(dist: importlib.metadata.Distribution) -> list[str]:
    """The top-level modules a distribution ships, spelt as its files spell them: its top_level.txt, the modules
    its RECORD lists, and those in the folders its .pth files add (an editable install's)."""
    found = [line.strip() for line in (dist.read_text("top_level.txt") or "").splitlines() if line.strip()]
    for file in dist.files or []:
        module = _module_of_path(str(file))
        if module is not None:
            found.append(module)
        if file.suffix == ".pth" and len(file.parts) == 1:
            found += _modules_in_pth(Path(str(dist.locate_file(file))))
    return list(dict.fromkeys(found))


def _modules_in_pth(pth: Path) -> list[str]:
    """The top-level modules in the folders a .pth file adds to the path (its lines that are not code)."""
    try:
        lines = pth.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    found = []
    for line in lines:
        folder = Path(line.strip())
        if not line.strip() or line.startswith(("import ", "import\t", "#")) or not folder.is_dir():
            continue
        for child in sorted(folder.iterdir()):
            if child.is_file():
                module = _module_of_path(child.name)
            else:
                module = child.name if (child / "__init__.py").is_file() and child.name.isidentifier() else None
            if module is not None:
                found.append(module)
    return found


def module_of(dist: importlib.metadata.Distribution, name: str) -> str | None:
    """The module of `dist` named like `name` (a distribution or environment name), as the package spells it:
    the same name whatever its case and separators (`UncertaintyBench` for `uncertaintybench`), else the one
    module whose name differs from it only by separators (`UncertaintyBench` for `uncertainty-bench`)."""
    modules = shipped_modules(dist)
    wanted = canonical(name)
    same = [m for m in modules if canonical(m) == wanted]
    if same:
        return module_name(name) if module_name(name) in same else same[0]
    loose = [m for m in modules if canonical(m).replace("-", "") == wanted.replace("-", "")]
    return loose[0] if len(loose) == 1 else None


def installed_environments() -> list[InstalledEnvironment]:
    """Every installed environment (entry points first, then verifiers' convention), sorted by name."""
    found: dict[str, InstalledEnvironment] = {}
    for dist in importlib.metadata.distributions():
        dist_name = dist.metadata["Name"] or ""
        if not dist_name or canonical(dist_name) == "prime-lab":
            continue
        version, summary = dist.version or "", dist.metadata["Summary"] or ""
        entries = [ep for ep in dist.entry_points if ep.group == ENTRY_POINT_GROUP]
        for ep in entries:
            module, function = _entry_point_target(ep.value)
            found.setdefault(canonical(ep.name), InstalledEnvironment(
                canonical(ep.name), module, function, dist_name, version, summary))
        if entries or not _framework_dependent(dist):
            continue
        module = module_name(dist_name)
        if canonical(dist_name) not in found and not looks_like_environment(module):
            module = module_of(dist, dist_name) or module  # as the package spells it (`UncertaintyBench`)
        if canonical(dist_name) not in found and looks_like_environment(module):
            found[canonical(dist_name)] = InstalledEnvironment(canonical(dist_name), module, LOAD_FUNCTION, dist_name,
                                                               version, summary)
    return sorted(found.values(), key=lambda e: e.name)


def entry_point_for(env_id: str) -> tuple[str, str] | None:
    """(module, function) of the `prime_lab.environments` entry point named like `env_id`, if one is installed; else
    of the environment a distribution named like it ships under another spelling (`UncertaintyBench.py` for the id
    `uncertaintybench`), which the id's own module name does not reach."""
    wanted = canonical(module_name(env_id))
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if canonical(ep.name) == wanted:
            return _entry_point_target(ep.value)
    return _spelt_otherwise(env_id)


def _spelt_otherwise(env_id: str) -> tuple[str, str] | None:
    name = module_name(env_id)
    try:
        if importlib.util.find_spec(name) is not None:
            return None
    except (ImportError, ValueError):
        pass
    try:
        dist = importlib.metadata.distribution(env_id.rsplit("/", 1)[-1])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None
    if not _framework_dependent(dist):
        return None
    module = module_of(dist, dist.metadata["Name"] or name)
    if module is None or module == name or not looks_like_environment(module):
        return None
    return module, LOAD_FUNCTION


@dataclass(frozen=True)
class SourceSignature:
    doc: str  # the module docstring's first paragraph
    args: tuple[tuple[str, Any, bool, str], ...]  # (name, default, required, annotation)


def read_signature(module: str, function: str = LOAD_FUNCTION) -> SourceSignature | None:
    """The module's docstring and `function`'s arguments, parsed from its source (None when it is not defined
    there, e.g. re-exported from a submodule)."""
    source = module_source(module)
    if source is None:
        return None
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == function:
            doc = (ast.get_docstring(tree) or "").split("\n\n")[0]
            return SourceSignature(" ".join(doc.split()), _arguments(node.args))
    return None


def _arguments(args: ast.arguments) -> tuple[tuple[str, Any, bool, str], ...]:
    positional = [*args.posonlyargs, *args.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    pairs = list(zip(positional, defaults, strict=True)) + list(zip(args.kwonlyargs, args.kw_defaults, strict=True))
    out = []
    for arg, default in pairs:
        annotation = ast.unparse(arg.annotation) if arg.annotation is not None else ""
        out.append((arg.arg, None if default is None else _literal(default), default is None, annotation))
    return tuple(out)


def _literal(node: ast.expr) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return SourceDefault(ast.unparse(node))
