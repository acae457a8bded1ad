"""verifiers releases: which ones exist, which one an environment needs, and a virtual environment for each.

An environment's release is what its metadata declares (`verifiers>=0.1.8`, `verifiers==0.1.12`), narrowed by what
it imports and calls when the declaration is too loose: a module or name that a release does not have, or a keyword
the environment passes to a verifiers class whose `__init__` in that release takes no such keyword (and no
`**kwargs`), rules the release out (all read from that release's wheel, without installing it). Releases from
`DRIVABLE_FROM` on can be driven (`driver.py`: verifiers' own environment server from 0.1.10, ours before); 0.4.0
dropped the classic API.

Each release gets one virtual environment, `releases_home()/<release>/` (`$PRIME_LAB_HOME/verifiers`, or
`$PRIME_LAB_VERIFIERS_HOME`), shared by every environment that needs that release: created with pip from the
package registry, through prime-lab's constraints file (which pins torch; verifiers does not need torch and none
is installed for it; a module is compiled to bytecode when first imported, not at install), with the driver's
transport (pyzmq, msgpack) beside verifiers. One lock per release (`ReleaseEnv.locked`) keeps two processes from
creating, installing into or removing the same one at once, and every install into it holds verifiers and the
transport at their installed versions (a constraints file in its folder).
"""

from __future__ import annotations

import ast
import contextlib
import fcntl
import importlib.metadata
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import tomllib
import urllib.parse
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from prime_lab.envs.installed import canonical
from prime_lab.runs.paths import constraints_file, lab_home

DRIVABLE_FROM, FIRST_UNDRIVABLE = Version("0.1.5"), Version("0.4")
# verifiers v1 tasksets (verifiers 0.4's API: envs/v1.py, driver_v1.py) run at one tested release of this range
V1_RANGE, V1_RELEASE = SpecifierSet(">=0.4,<0.5"), "0.4.0"
TRANSPORT = ("pyzmq>=25", "msgpack>=1.0")  # what driver.py needs beside verifiers (0.1.5 - 0.1.9 do not bring them)
# A v1 release's environment also holds uv and a folder of wheels for the harness program's own dependencies (its
# PEP 723 header), so that `uv sync --script` prepares the program offline (driver_v1.py points uv at them)
V1_TOOLS = ("uv",)
V1_WHEELS = "uv-wheels"
CHAT_PROGRAM_DEPS = """\
import json, tomllib
from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE
block = CHAT_PROGRAM_SOURCE.split("# /// script", 1)[1].split("# ///", 1)[0]
header = tomllib.loads("\\n".join(line[2:] for line in block.splitlines() if line.startswith("# ")))
print(json.dumps(header.get("dependencies", [])))
"""
READY = ".prime-lab-ready"  # written last: a folder without it is a half-built environment, built again
HOLDS = "prime-lab-holds.txt"  # in a release's folder: the constraints every install into it runs with


class ReleaseError(RuntimeError):
    """A release cannot be listed, downloaded or set up; the message says why and what to do."""


def releases_home() -> Path:
    override = os.environ.get("PRIME_LAB_VERIFIERS_HOME")
    return Path(override).expanduser() if override else lab_home() / "verifiers"


def _pip(*args: str, python: str | None = None, timeout: float = 1800,
         constraints: tuple[Path, ...] = ()) -> subprocess.CompletedProcess[str]:
    """pip with `python` (this interpreter by default), through prime-lab's constraints file and `constraints` when
    it installs or downloads; a time-out is a ReleaseError naming the command to rerun."""
    command = [python or sys.executable, "-m", "pip", *args, "--disable-pip-version-check"]
    if args and args[0] in ("install", "download"):
        for path in (constraints_file(), *constraints):
            if path is not None:
                command += ["-c", str(path)]
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise ReleaseError(timed_out(command, timeout)) from None


def timed_out(command: list[str], timeout: float) -> str:
    """The one line a pip time-out gets: how long it waited and the command to rerun."""
    waited = f"{timeout / 60:g} min" if timeout >= 120 else f"{timeout:g} s"
    return (f"pip did not finish within {waited} (the package registry slow or out of reach?); rerun it to see "
            f"where it stops: {shlex.join(command)}")


def _last_lines(text: str, count: int = 8) -> str:
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("WARNING: Location")]
    return "\n".join(lines[-count:])


def conflict_lines(text: str) -> list[str] | None:
    """What pip's resolver says caused a conflict (`x 1.0 depends on tomlkit==0.12.0`, `The user requested
    (constraint) tomlkit==0.15.2`), or None when its output is no resolution failure."""
    if "ResolutionImpossible" not in text and "conflicting dependencies" not in text:
        return None
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == "The conflict is caused by:"), None)
    if start is None:
        return []
    cause = []
    for line in lines[start + 1:]:
        if not line.strip():
            break
        cause.append(line.strip())
    return cause


def pip_failed(done: subprocess.CompletedProcess[str], what: str) -> str:
    """`WHAT (pip exit N; to see it again: COMMAND):` and pip's own last lines (its conflict, when it says one)."""
    output = (done.stderr or "") + "\n" + (done.stdout or "")
    cause = conflict_lines(output)
    lines = "\n".join(["The conflict is caused by:", *cause]) if cause else _last_lines(done.stderr or done.stdout)
    command = shlex.join(str(a) for a in done.args) if isinstance(done.args, list | tuple) else str(done.args)
    return f"{what} (pip exit {done.returncode}; to see it again: {command})" + (f":\n{lines}" if lines else "")


# Which releases exist, and which ones an environment accepts ---------------------------------------------------

def available_releases() -> list[Version]:
    """Every release of verifiers the package registry serves, newest first."""
    done = _pip("index", "versions", "verifiers", timeout=120)
    match = re.search(r"Available versions:\s*(.+)", done.stdout)
    if done.returncode != 0 or match is None:
        raise ReleaseError(pip_failed(done, "cannot list verifiers' releases from the package registry"))
    versions = []
    for text in match.group(1).split(","):
        with contextlib.suppress(InvalidVersion):
            versions.append(Version(text.strip()))
    return sorted(versions, reverse=True)


def drivable(version: Version) -> bool:
    """A release whose classic API (`load_environment`) prime-lab drives."""
    return DRIVABLE_FROM <= version < FIRST_UNDRIVABLE and not version.is_prerelease


def v1_release(version: Version | str) -> bool:
    """A release of the range verifiers v1 tasksets run at (driver_v1.py)."""
    try:
        return V1_RANGE.contains(Version(str(version)), prereleases=False)
    except InvalidVersion:
        return False


def candidates(specifier: str, releases: Iterable[Version]) -> list[Version]:
    """The releases `specifier` accepts that can be driven, newest first; of a release's post-releases only the
    newest (0.1.9.post3, not 0.1.9)."""
    spec = SpecifierSet(specifier)
    out: dict[tuple[int, ...], Version] = {}
    for version in sorted(releases, reverse=True):
        if drivable(version) and spec.contains(version, prereleases=False):
            out.setdefault(version.release, version)
    return list(out.values())


def requirement_specifier(requirements: Iterable[str]) -> str | None:
    """The version specifier of the `verifiers` requirement among `requirements` ('' when it has none; None when
    there is no verifiers requirement)."""
    for text in requirements:
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            continue
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue  # an extra's requirement, or another platform's
        if requirement.name.lower().replace("_", "-") == "verifiers":
            return str(requirement.specifier)
    return None


def declared_specifier(target: Path) -> str | None:
    """What a package folder (its pyproject.toml) or a wheel (its METADATA) declares for verifiers."""
    if target.is_dir():
        try:
            project = tomllib.loads((target / "pyproject.toml").read_text(encoding="utf-8")).get("project", {})
        except (OSError, tomllib.TOMLDecodeError):
            return None
        return requirement_specifier(project.get("dependencies", []))
    if target.suffix == ".whl":
        with zipfile.ZipFile(target) as wheel:
            meta = next((n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")), None)
            text = wheel.read(meta).decode() if meta else ""
        return requirement_specifier(line.split(":", 1)[1].strip() for line in text.splitlines()
                                     if line.startswith("Requires-Dist:"))
    return None


def check_specifier(specifier: str) -> str:
    try:
        SpecifierSet(specifier)
    except InvalidSpecifier as exc:
        raise ReleaseError(f"'{specifier}' is not a version specifier ({exc})") from None
    return specifier


# What an environment imports and calls from verifiers, and whether a release has it -----------------------------

@dataclass(frozen=True)
class VerifiersImport:
    module: str  # verifiers.utils.token_utils
    names: tuple[str, ...]  # from-imported names ('' for a plain `import`)
    where: str  # file:line

    def words(self) -> str:
        return f"from {self.module} import {', '.join(self.names)}" if self.names else f"import {self.module}"

    @property
    def at(self) -> str:
        return f"imported at {self.where}"


@dataclass(frozen=True)
class VerifiersCall:
    """A verifiers name called with keywords: `vf.Rubric(parser=parser, reward_funcs=[reward])` is module
    `verifiers`, name `Rubric`, keywords `parser`, `reward_funcs`. Checked where the release defines a class of that
    name."""

    module: str  # where the name is taken from, as the source says it: verifiers, verifiers.rubrics
    name: str
    keywords: tuple[str, ...]
    where: str  # file:line

    def words(self) -> str:
        return f"{self.module}.{self.name}({', '.join(k + '=...' for k in self.keywords)})"

    @property
    def at(self) -> str:
        return f"called at {self.where}"


VerifiersUse = VerifiersImport | VerifiersCall


def _sources(target: Path) -> Iterator[tuple[str, str]]:
    """(name, source) of the package's Python files (a folder's, skipping virtual environments and builds; or a
    wheel's)."""
    if target.is_dir():
        for path in sorted(target.rglob("*.py")):
            parts = set(path.relative_to(target).parts)
            if parts & {".venv", "venv", "build", "dist", ".git", "tests", "__pycache__"}:
                continue
            with contextlib.suppress(OSError, UnicodeDecodeError):
                yield str(path.relative_to(target)), path.read_text(encoding="utf-8")
    elif target.suffix == ".whl":
        with zipfile.ZipFile(target) as wheel:
            for name in wheel.namelist():
                if name.endswith(".py"):
                    yield name, wheel.read(name).decode("utf-8", errors="replace")


def parsed_sources(target: Path) -> Iterator[tuple[str, ast.Module]]:
    for name, source in _sources(target):
        with contextlib.suppress(SyntaxError, ValueError):
            yield name, ast.parse(source)


def _is_verifiers(module: str) -> bool:
    return module == "verifiers" or module.startswith("verifiers.")


def verifiers_imports(target: Path) -> list[VerifiersImport]:
    """Every `import verifiers.X` and `from verifiers[.X] import ...` in the package's source."""
    found: list[VerifiersImport] = []
    for name, tree in parsed_sources(target):
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found += [VerifiersImport(a.name, (), f"{name}:{node.lineno}") for a in node.names
                          if a.name.startswith("verifiers.")]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and _is_verifiers(node.module):
                found.append(VerifiersImport(node.module, tuple(a.name for a in node.names if a.name != "*"),
                                             f"{name}:{node.lineno}"))
    return found


def dotted(node: ast.expr) -> list[str] | None:
    """`vf.rubrics.Rubric` as ['vf', 'rubrics', 'Rubric']; None for anything but names and attributes."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.insert(0, node.attr)
        node = node.value
    return [node.id, *parts] if isinstance(node, ast.Name) else None


def verifiers_bindings(tree: ast.Module) -> dict[str, str]:
    """A name the file's imports bind -> the verifiers path it stands for (`vf` -> `verifiers.v1` after `import
    verifiers.v1 as vf`; `import verifiers.x` binds `verifiers`)."""
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _is_verifiers(alias.name):
                    bound[alias.asname or "verifiers"] = alias.name if alias.asname else "verifiers"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and _is_verifiers(node.module):
            bound.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names if a.name != "*"})
    return bound


def verifiers_calls(target: Path) -> list[VerifiersCall]:
    """Every call with keywords of a name taken from verifiers (`vf.Rubric(parser=...)` after `import verifiers as
    vf`, `Rubric(funcs=...)` after `from verifiers import Rubric`) in the package's source; `**kwargs` passed on is
    no keyword."""
    found: list[VerifiersCall] = []
    for name, tree in parsed_sources(target):
        bound = verifiers_bindings(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            keywords = tuple(k.arg for k in node.keywords if k.arg is not None)
            parts = dotted(node.func)
            if not keywords or parts is None or parts[0] not in bound:
                continue
            module, _, called = ".".join([bound[parts[0]], *parts[1:]]).rpartition(".")
            if module:
                found.append(VerifiersCall(module, called, keywords, f"{name}:{node.lineno}"))
    return found


def verifiers_uses(target: Path) -> list[VerifiersUse]:
    """What a release must have for the package: its verifiers imports (but a bare `import verifiers`) and its
    calls of verifiers names with keywords."""
    imports: list[VerifiersUse] = [i for i in verifiers_imports(target) if i.module != "verifiers" or i.names]
    return imports + list(verifiers_calls(target))


@dataclass(frozen=True)
class ReleaseContents:
    """The modules of one release (from its wheel or an installed copy) and their sources, to check imports."""

    version: str
    sources: dict[str, str]  # module name -> source

    def _sources_of(self, module: str) -> list[tuple[str, str]]:
        """(module, source) of the module, and of its classic-API twin where the release keeps that under
        `verifiers.legacy` and aliases it at `verifiers.*` (0.3.1)."""
        twin = "verifiers.legacy" + module[len("verifiers"):] if "verifiers.legacy" in self.sources else None
        return [(m, self.sources[m]) for m in (module, twin) if m is not None and m in self.sources]

    def _star_imported(self, module: str, source: str) -> list[str]:
        """The modules `source` (of `module`) star-imports (`from .types import *`, `from verifiers.x import *`)."""
        package = module if any(m.startswith(module + ".") for m in self.sources) else module.rpartition(".")[0]
        found = []
        for dots, name in _STAR_IMPORT.findall(source):
            if not dots:
                found.append(name)
                continue
            base = package.rsplit(".", len(dots) - 1)[0] if len(dots) > 1 else package
            found.append(f"{base}.{name}" if name else base)
        return found

    def _has(self, module: str, name: str, seen: set[str]) -> bool:
        """Whether `module` names `name` (defines or imports it), following its star imports."""
        if module in seen:
            return False
        seen.add(module)
        for of, source in self._sources_of(module):
            if re.search(rf"\b{re.escape(name)}\b", source):
                return True
            if any(self._has(star, name, seen) for star in self._star_imported(of, source)):
                return True
        return False

    def lacks(self, wanted: VerifiersUse) -> str | None:
        """What of `wanted` this release does not have, in words (None: it has all of it)."""
        if isinstance(wanted, VerifiersCall):
            return self._rejects(wanted)
        if not self._sources_of(wanted.module):
            return f"no module {wanted.module}"
        for name in wanted.names:
            if self._sources_of(f"{wanted.module}.{name}"):
                continue
            if not self._has(wanted.module, name, set()):
                return f"no {name} in {wanted.module}"
        return None


    def _classes(self, name: str, module: str) -> list[ast.ClassDef]:
        """The release's top-level classes called `name`: those of `module` (or its classic-API twin) when it
        defines one, else every one (a package re-exports its classes from the module that defines them)."""
        pattern = re.compile(rf"^class[ \t]+{re.escape(name)}\b", re.MULTILINE)
        found: dict[str, list[ast.ClassDef]] = {}
        for of, source in self.sources.items():
            if pattern.search(source) is None:
                continue
            with contextlib.suppress(SyntaxError, ValueError):
                found[of] = [n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == name]
        own = [c for of, _ in self._sources_of(module) for c in found.get(of, [])]
        return own or [c for classes in found.values() for c in classes]

    def _takes(self, cls: ast.ClassDef, keyword: str, seen: set[str]) -> bool | None:
        """Whether the class's `__init__` (its own, else the first of its bases' in the release) takes `keyword`;
        `**kwargs` takes any. None when that cannot be read (a decorated class, a base from another package)."""
        init = next((n for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
                     and n.name == "__init__"), None)
        if init is not None:
            args = init.args
            return args.kwarg is not None or keyword in {a.arg for a in args.args[1:] + args.kwonlyargs}
        if cls.decorator_list or cls.keywords or cls.name in seen:
            return None
        seen.add(cls.name)
        for base in cls.bases:
            parts = dotted(base.value if isinstance(base, ast.Subscript) else base)
            if parts is None:
                return None
            if parts[-1] in ("object", "ABC", "Generic", "Protocol"):
                continue
            bases = self._classes(parts[-1], ".".join(parts[:-1]))
            if not bases:
                return None
            answers = [self._takes(b, keyword, seen) for b in bases]
            return None if None in answers else any(answers)
        return False  # object.__init__ takes no keyword

    def _rejects(self, call: VerifiersCall) -> str | None:
        """The first keyword of `call` that every class of its name in this release refuses, in words."""
        classes = self._classes(call.name, call.module)
        for keyword in call.keywords:
            if classes and all(self._takes(c, keyword, set()) is False for c in classes):
                return f"no keyword {keyword} in {call.module}.{call.name}"
        return None


_STAR_IMPORT = re.compile(r"^[ \t]*from[ \t]+(\.*)([\w.]*)[ \t]+import[ \t]+\*", re.MULTILINE)


def _module_name(path: str) -> str | None:
    if not path.startswith("verifiers/") or not path.endswith(".py"):
        return None
    parts = path[:-3].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def release_contents(version: Version) -> ReleaseContents:
    """A release's modules, read from its wheel (downloaded once into `releases_home()/wheels`)."""
    folder = releases_home() / "wheels"
    wheel = next(folder.glob(f"verifiers-{version}-*.whl"), None) if folder.is_dir() else None
    if wheel is None:
        folder.mkdir(parents=True, exist_ok=True)
        # into a folder of its own, then moved in whole: a process reading the wheels folder at the same time
        # (another install choosing its release) never finds a wheel pip is still writing
        with tempfile.TemporaryDirectory(prefix=".download-", dir=folder) as partial:
            done = _pip("download", "-q", "--no-deps", "--only-binary", ":all:", f"verifiers=={version}", "-d",
                        partial, timeout=300)
            fetched = next(Path(partial).glob(f"verifiers-{version}-*.whl"), None)
            if fetched is not None:
                os.replace(fetched, folder / fetched.name)
        wheel = next(folder.glob(f"verifiers-{version}-*.whl"), None)
        if done.returncode != 0 or wheel is None:
            raise ReleaseError(pip_failed(done, f"cannot download verifiers {version} from the package registry"))
    sources: dict[str, str] = {}
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            module = _module_name(name)
            if module is not None:
                sources[module] = archive.read(name).decode("utf-8", errors="replace")
    return ReleaseContents(str(version), sources)


def installed_contents() -> ReleaseContents | None:
    """The modules of the verifiers installed beside prime-lab (read from its files; nothing is imported)."""
    import importlib.util

    try:
        version = importlib.metadata.version("verifiers")
        spec = importlib.util.find_spec("verifiers")
    except (importlib.metadata.PackageNotFoundError, ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0])
    sources = {}
    for path in root.rglob("*.py"):
        module = _module_name("verifiers/" + path.relative_to(root).as_posix())
        if module is not None:
            with contextlib.suppress(OSError, UnicodeDecodeError):
                sources[module] = path.read_text(encoding="utf-8")
    return ReleaseContents(version, sources)


# What is installed, and who needs what ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Installed:
    """One installed distribution: its version, where pip installed it from (`url`, from direct_url.json: '' when
    from an index), and its requirements (Requires-Dist)."""

    name: str  # as its metadata spells it
    version: str
    url: str
    editable: bool
    requires: tuple[str, ...]
    dist: importlib.metadata.Distribution = field(compare=False, repr=False)

    def put_back(self) -> str | None:
        """What pip installs to put this version back: `name==version` from the index, the archive it came from
        while that file is still there; None when it came from a folder or an archive that is gone."""
        if not self.url:
            return f"{self.name}=={self.version}"
        path = Path(urllib.parse.unquote(urllib.parse.urlparse(self.url).path)) if self.url.startswith("file:") \
            else None
        if path is not None and not self.editable and path.is_file():
            return str(path)
        return None

    def files(self) -> list[str]:
        """The paths its RECORD lists, relative to its site-packages (`../../../bin/prime` for a script)."""
        return [str(f) for f in self.dist.files or ()]


def installed_dists(paths: list[str] | None = None) -> dict[str, Installed]:
    """The distributions installed on `paths` (default: this interpreter's `sys.path`), by canonical name; of two
    with one name, the first on the path (the one `import` finds)."""
    importlib.invalidate_caches()
    found: dict[str, Installed] = {}
    for dist in importlib.metadata.distributions(path=sys.path if paths is None else paths):
        name = dist.metadata["Name"] or ""
        if not name or canonical(name) in found:
            continue
        url, editable = "", False
        with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
            direct = json.loads(dist.read_text("direct_url.json") or "{}")
            url, editable = str(direct.get("url") or ""), bool((direct.get("dir_info") or {}).get("editable"))
        found[canonical(name)] = Installed(name, dist.version or "", url, editable, tuple(dist.requires or ()), dist)
    return found


def _requirements(dist: Installed, extras: frozenset[str]) -> Iterator[tuple[str, frozenset[str]]]:
    """(canonical name, extras asked) of each requirement of `dist` that applies here with `extras` requested."""
    for text in dist.requires:
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            continue
        marker = requirement.marker
        if marker is None or any(marker.evaluate({"extra": extra}) for extra in ("", *extras)):
            yield canonical(requirement.name), frozenset(requirement.extras)


def needed(dists: dict[str, Installed], roots: Iterable[str]) -> set[str]:
    """`roots` and every installed distribution they need, directly or through another (requested extras
    followed)."""
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [(canonical(r), frozenset[str]()) for r in roots]
    while todo:
        node = todo.pop()
        if node in seen or node[0] not in dists:
            continue
        seen.add(node)
        todo += _requirements(dists[node[0]], node[1])
    return {name for name, _ in seen}


def only_needed_by(dists: dict[str, Installed], going: Iterable[str], forced: Iterable[str] = ()) -> set[str]:
    """Of `going` (and `forced`, which go whatever needs them), what may go: what no distribution that stays
    needs."""
    forced = {canonical(n) for n in forced}
    out = {canonical(n) for n in going if canonical(n) in dists} | forced
    while True:
        kept = needed(dists, set(dists) - out) & out - forced
        if not kept:
            return out
        out -= kept


def needed_by(dists: dict[str, Installed], name: str) -> list[str]:
    """The other installed distributions that require `name` directly (their requirements that apply here, extras
    not asked), by name."""
    wanted = canonical(name)
    return sorted(d.name for key, d in dists.items()
                  if key != wanted and any(n == wanted for n, _ in _requirements(d, frozenset())))


def conflicts(dists: dict[str, Installed]) -> set[str]:
    """What `pip check` says of `dists`, in its words: each requirement (extras not asked) that is not installed, or
    installed at a version it does not accept."""
    found = set()
    for dist in dists.values():
        for text in dist.requires:
            try:
                requirement = Requirement(text)
                if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
                    continue
                have = dists.get(canonical(requirement.name))
                if have is None:
                    found.add(f"{dist.name} {dist.version} requires {requirement.name}, which is not installed.")
                elif not requirement.specifier.contains(have.version, prereleases=True):
                    found.add(f"{dist.name} {dist.version} has requirement {requirement}, but you have {have.name} "
                              f"{have.version}.")
            except (InvalidRequirement, InvalidVersion):
                continue
    return found


# Locks ------------------------------------------------------------------------------------------------------------

_held = threading.local()  # the locks this thread holds, and how many times over


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive `flock` on `path` (created when missing): one process at a time. Taken again by the thread
    that holds it, it is already held."""
    key = str(path)
    counts: dict[str, int] = _held.__dict__.setdefault("counts", {})
    if counts.get(key):
        counts[key] += 1
        try:
            yield
        finally:
            counts[key] -= 1
        return
    with open(key, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        counts[key] = 1
        try:
            yield
        finally:
            counts.pop(key, None)
            fcntl.flock(lock, fcntl.LOCK_UN)


# One virtual environment per release ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReleaseEnv:
    """The virtual environment of one verifiers release."""

    release: str

    @property
    def folder(self) -> Path:
        return releases_home() / self.release

    @property
    def python(self) -> Path:
        return self.folder / "bin" / "python"

    def ready(self) -> bool:
        return (self.folder / READY).is_file() and self.python.is_file()

    def locked(self) -> contextlib.AbstractContextManager[None]:
        """This release's lock: held while its environment is created, installed into, uninstalled from or removed,
        so that one process at a time changes it. Taken again by the thread that holds it, it is already held."""
        releases_home().mkdir(parents=True, exist_ok=True)
        return file_lock(releases_home() / f".{self.release}.lock")

    def ensure(self, say: object = None) -> bool:
        """Create it if it is not there yet (pip, from the registry; a minute or so). True when it was created."""
        with self.locked():
            if self.ready():
                return False
            if callable(say):
                say(f"creating the virtual environment of verifiers {self.release} in {self.folder} (pip, from the "
                    "package registry; once per release)")
            shutil.rmtree(self.folder, ignore_errors=True)
            made = subprocess.run([_base_python(), "-m", "venv", str(self.folder)], capture_output=True, text=True,
                                  check=False)
            if made.returncode != 0:
                raise ReleaseError(f"cannot create a virtual environment in {self.folder}: "
                                   f"{_last_lines(made.stderr or made.stdout)}")
            # --no-compile: each module is compiled when it is first imported, not every module of verifiers'
            # dependencies (pyarrow, pandas, sympy, ...) now, most of which no environment imports (half the time)
            v1 = v1_release(self.release)
            try:
                done = self.pip("install", "-q", "--no-compile", f"verifiers=={self.release}", *TRANSPORT,
                                *(V1_TOOLS if v1 else ()))
                if done.returncode == 0 and v1:
                    done = self.harness_wheels()
            except ReleaseError:
                shutil.rmtree(self.folder, ignore_errors=True)
                raise
            if done.returncode != 0:
                shutil.rmtree(self.folder, ignore_errors=True)
                raise ReleaseError(pip_failed(done, f"pip could not install verifiers {self.release} into a new "
                                                    "virtual environment"))
            (self.folder / READY).write_text(self.release + "\n")
            return True

    def harness_wheels(self) -> subprocess.CompletedProcess[str]:
        """Download, for this interpreter, the wheels of what verifiers v1's chat program (the `null` and `bash`
        harnesses' program) declares in its PEP 723 header into `V1_WHEELS`: `uv sync --script` installs from
        them, offline, when a rollout prepares the program."""
        read = subprocess.run([str(self.python), "-I", "-c", CHAT_PROGRAM_DEPS], capture_output=True, text=True,
                              timeout=300, check=False)
        if read.returncode != 0:
            return read
        deps = [str(d) for d in json.loads(read.stdout.strip().splitlines()[-1])]
        return _pip("download", "-q", "--only-binary", ":all:", "-d", str(self.folder / V1_WHEELS), *deps,
                    python=str(self.python), timeout=900)

    def installed(self) -> dict[str, str]:
        """What is installed in it: canonical distribution name -> version."""
        return {name: dist.version for name, dist in self.dists().items()}

    def dists(self) -> dict[str, Installed]:
        """What is installed in it, each distribution as `installed_dists` reads it."""
        return installed_dists([str(p) for p in self.folder.glob("lib/python*/site-packages")])

    def holds(self) -> Path:
        """The constraints file every install into it runs with: verifiers at this release, the driver's transport
        at the versions installed (written afresh each time)."""
        installed = self.installed()
        pins = [f"verifiers=={self.release}"] + [f"{n}=={installed[n]}" for n in ("pyzmq", "msgpack") if n in installed]
        path = self.folder / HOLDS
        path.write_text("# what every install into this environment leaves as it is (prime-lab)\n"
                        + "\n".join(pins) + "\n")
        return path

    def pip(self, *args: str) -> subprocess.CompletedProcess[str]:
        """pip in this environment; an install holds verifiers and the transport (`holds()`)."""
        held = (self.holds(),) if args and args[0] == "install" and self.folder.is_dir() else ()
        return _pip(*args, python=str(self.python), constraints=held)

    def remove(self) -> None:
        """Delete it (under its lock; the next install that needs this release creates it again)."""
        with self.locked():
            (self.folder / READY).unlink(missing_ok=True)
            shutil.rmtree(self.folder, ignore_errors=True)


def _base_python() -> str:
    """The interpreter prime-lab's own virtual environment was made from (a release's is made from it too)."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    return str(base)
