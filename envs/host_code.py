"""Environments whose own code runs what the model wrote on this machine, outside the sandbox: found, and said once.

Some published environments run a completion with `subprocess`, `exec` or `eval` in the process that scores it,
as the user, with the user's files, keys and network. `scan_source` reads an environment's source (nothing is
imported or run) for calls that run code: `exec`, `eval` and `compile`; `subprocess.run`, `Popen`, `call`,
`check_call`, `check_output`, `getoutput`, `getstatusoutput`; `os.system`, `os.popen`, the `os.exec*`, `os.spawn*`
and `os.posix_spawn*` families; `asyncio.create_subprocess_exec` and `_shell`; `pty.spawn`. A call counts only
where an argument is built at run time (a variable, an f-string with a field, a call): `subprocess.run(["git",
"status"])` and `eval("1 + 1")` run nothing the model wrote; a module-level name bound once to a literal, and
`sys.executable`, count as literals. It is a static check: code that reaches a runner some other way
(`getattr(os, name)`, a helper of another package) is not seen.

What is read: an installed environment's module (a package: its folder, its tests/ left out; a module inside a
package: that package's folder), an isolated environment's installed target, a folder, wheel or sdist at
`prime env install`.
Built-in environments run model code in the sandbox only and are not read.

The line (`warning`) is said at `prime env install` and when a run, an evaluation or a GEPA run loads the
environment (once each), unless `PRIME_LAB_ALLOW_HOST_CODE` accepts it: a comma-separated list of environment ids
(`my-env,owner/other`; compared by name) or `all`.
"""

from __future__ import annotations

import ast
import importlib.util
import io
import os
import tarfile
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ALLOW_VAR = "PRIME_LAB_ALLOW_HOST_CODE"
WORDS = "runs model-written code on this machine, outside the sandbox"
MAX_FILES = 300  # source files read per environment
MAX_BYTES = 2_000_000  # a larger file is not read
_SKIPPED_DIRS = {"tests", "test", ".venv", "venv", "build", "dist", "__pycache__", ".git", "node_modules"}

_RUNNERS = {f"subprocess.{n}" for n in ("run", "Popen", "call", "check_call", "check_output", "getoutput",
                                         "getstatusoutput")} \
    | {f"os.{n}" for n in ("system", "popen", "execv", "execve", "execl", "execle", "execlp", "execlpe", "execvp",
                           "execvpe", "spawnl", "spawnle", "spawnlp", "spawnlpe", "spawnv", "spawnve", "spawnvp",
                           "spawnvpe", "posix_spawn", "posix_spawnp")} \
    | {"asyncio.create_subprocess_exec", "asyncio.create_subprocess_shell", "pty.spawn",
       "builtins.exec", "builtins.eval", "builtins.compile"}
_BUILTINS = {"exec", "eval", "compile"}
_LITERAL_ATTRIBUTES = {"sys.executable"}


@dataclass(frozen=True)
class HostCall:
    """A call that runs code built at run time: where it is and how it reads."""

    path: str
    line: int
    call: str

    def words(self) -> str:
        return f"{self.call} at {self.path}:{self.line}"


class _Scope:
    """What a module's names stand for: imports (local name -> dotted name) and module-level literals."""

    def __init__(self, tree: ast.Module) -> None:
        self.imports: dict[str, str] = {}
        self.literals: set[str] = set()
        assigned: dict[str, int] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    local = alias.asname or alias.name.split(".")[0]
                    self.imports[local] = alias.name if alias.asname else local
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    self.imports[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, ast.AnnAssign) and node.value is not None else []
            for target in targets:
                if isinstance(target, ast.Name):
                    assigned[target.id] = assigned.get(target.id, 0) + 1
        for node in tree.body:
            value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, ast.AnnAssign) else []
            for target in targets:
                if isinstance(target, ast.Name) and assigned.get(target.id) == 1 and value is not None \
                        and self.literal(value):
                    self.literals.add(target.id)

    def dotted(self, node: ast.expr) -> str | None:
        """`subprocess.run` for `sp.run` after `import subprocess as sp`, `run` imported from subprocess, ..."""
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        root = self.imports.get(node.id)
        if root is None:
            return node.id if not parts and node.id in _BUILTINS else None
        return ".".join([root, *reversed(parts)])

    def literal(self, node: ast.expr) -> bool:
        """Whether `node` is fixed in the source (nothing the model could have written)."""
        if isinstance(node, ast.Constant):
            return True
        if isinstance(node, ast.List | ast.Tuple | ast.Set):
            return all(self.literal(e) for e in node.elts)
        if isinstance(node, ast.Starred):
            return self.literal(node.value)
        if isinstance(node, ast.JoinedStr):
            return all(isinstance(v, ast.Constant) for v in node.values)
        if isinstance(node, ast.BinOp):
            return self.literal(node.left) and self.literal(node.right)
        if isinstance(node, ast.Name):
            return node.id in self.literals
        if isinstance(node, ast.Attribute):
            return self.dotted(node) in _LITERAL_ATTRIBUTES
        return False


def scan_source(text: str, path: str = "<source>") -> list[HostCall]:
    """The calls in `text` (Python source) that run code built at run time; [] for source that does not parse."""
    try:
        tree = ast.parse(text, filename=path)
    except (SyntaxError, ValueError):
        return []
    scope = _Scope(tree)
    found: list[HostCall] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = scope.dotted(node.func)
        if name is None or (name not in _RUNNERS and name not in _BUILTINS):
            continue
        if name in _BUILTINS or name.startswith("builtins."):
            args: list[ast.expr] = node.args[:1] or [k.value for k in node.keywords if k.arg == "source"]
        else:
            args = list(node.args) + [k.value for k in node.keywords if k.arg in ("args", "cmd", "path", "argv")]
        if any(not scope.literal(a) for a in args):
            text_of = ast.unparse(node)
            found.append(HostCall(path, node.lineno, text_of if len(text_of) <= 60 else text_of[:57] + "..."))
    return found


def _wanted(relative: str) -> bool:
    parts = relative.replace("\\", "/").split("/")
    return parts[-1].endswith(".py") and parts[-1] != "conftest.py" and not _SKIPPED_DIRS & set(parts[:-1])


def _sources(target: Path) -> Iterator[tuple[str, str]]:
    """(path as shown, text) of the Python files of a folder, a .py file, a wheel or an sdist."""
    if target.is_file() and target.suffix == ".py":
        yield target.name, target.read_text(errors="replace")
    elif target.is_dir():
        for path in sorted(target.rglob("*.py")):
            relative = path.relative_to(target).as_posix()
            if _wanted(relative) and path.stat().st_size <= MAX_BYTES:
                yield relative, path.read_text(errors="replace")
    elif target.name.endswith((".whl", ".zip")):
        with zipfile.ZipFile(target) as archive:
            for info in archive.infolist():
                if _wanted(info.filename) and info.file_size <= MAX_BYTES:
                    yield info.filename, archive.read(info).decode(errors="replace")
    elif target.name.endswith((".tar.gz", ".tgz")):
        with tarfile.open(target) as archive:
            for member in archive.getmembers():
                if member.isfile() and _wanted(member.name) and member.size <= MAX_BYTES:
                    data = archive.extractfile(member)
                    if data is not None:
                        yield member.name, io.TextIOWrapper(data, errors="replace").read()


def scan(targets: Iterable[Path]) -> list[HostCall]:
    """The calls that run code built at run time in the sources of `targets` (`_sources`), at most MAX_FILES files;
    a target that cannot be read gives none."""
    found: list[HostCall] = []
    read = 0
    for target in targets:
        try:
            for path, text in _sources(target):
                read += 1
                if read > MAX_FILES:
                    return found
                found.extend(scan_source(text, path))
        except (OSError, zipfile.BadZipFile, tarfile.TarError):
            continue
    return found


def module_sources(module: str) -> list[Path]:
    """What `scan` reads of an installed module (nothing is imported but a dotted module's parents): a package's
    folder; a module inside a package, that package's top folder; a top-level module, its file."""
    top = module.split(".")[0]
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    if spec.submodule_search_locations:
        return [Path(p) for p in spec.submodule_search_locations]
    return [Path(spec.origin)] if spec.origin and spec.origin.endswith(".py") else []


def accepted(env_id: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether `PRIME_LAB_ALLOW_HOST_CODE` accepts `env_id` (`all`, or its name among the listed ids)."""
    value = (os.environ if environ is None else environ).get(ALLOW_VAR, "")
    names = {_name(v) for v in value.split(",") if v.strip()}
    return "all" in names or _name(env_id) in names


def _name(env_id: str) -> str:
    return env_id.strip().rsplit("/", 1)[-1].replace("_", "-").lower()


def message(who: str, calls: list[HostCall], ids: Iterable[str] = ()) -> str:
    """The one line that says so: who, the calls found (three at most), and the setting that accepts it."""
    shown = ", ".join(c.words() for c in calls[:3]) + (f" and {len(calls) - 3} more" if len(calls) > 3 else "")
    names = ",".join(dict.fromkeys(_name(i) for i in ids)) or _name(who)
    return (f"{who} {WORDS} ({shown}): what the model writes runs as you, with your files, keys and network. "
            f"{ALLOW_VAR}={names} accepts it (and silences this line)")


@cache
def _calls_of(env_id: str) -> tuple[HostCall, ...]:
    from prime_lab.envs import isolated
    from prime_lab.envs.loader import BUILTIN, EnvironmentLoadError, resolve

    record = isolated.record_for(env_id)
    if record is not None:
        return tuple(scan([Path(record.target)]))
    try:
        where = resolve(env_id)
    except EnvironmentLoadError:
        return ()
    if where.source == BUILTIN:
        return ()
    return tuple(scan(module_sources(where.module)))


def warning(env_id: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The line for environment `env_id` where its own code runs what it is given on this machine and
    `PRIME_LAB_ALLOW_HOST_CODE` does not accept it; None otherwise (read once per process)."""
    if accepted(env_id, environ):
        return None
    calls = list(_calls_of(env_id))
    return message(f"environment {env_id}", calls, [env_id]) if calls else None


def at_install(target: Path, ids: Iterable[str], environ: Mapping[str, str] | None = None) -> str | None:
    """The line for an install of `target` that provides the environments `ids`, where its source runs code built
    at run time and not every one of them is accepted; None otherwise."""
    ids = list(ids)
    if ids and all(accepted(i, environ) for i in ids):
        return None
    calls = scan([target])
    if not calls:
        return None
    who = ", ".join(ids) if ids else target.name
    return message(who, calls, ids)


def warnings_for(env_ids: Iterable[str], environ: Mapping[str, str] | None = None) -> list[str]:
    """The lines (`warning`) for the environments among `env_ids`, each environment once."""
    return [line for env_id in dict.fromkeys(env_ids) if (line := warning(env_id, environ)) is not None]
