"""`prime env install PATH`: an environment package into the environment prime-lab runs in, usable by id at once.

pip runs with this interpreter (`sys.executable -m pip`), so the package lands beside prime-lab; a folder is
installed editable (edits apply at the next run). The constraints file of the prime-lab checkout this install comes
from (`constraints.txt`, which pins torch) is passed when there is one, so an environment's dependencies cannot move
prime-lab's pins. When the package's build backend is already installed, pip builds without an isolated build
environment, which works offline.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prime_lab.runs.paths import constraints_file, project_name

_REQUIREMENT_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_ARCHIVES = (".whl", ".tar.gz", ".zip")


class InstallError(ValueError):
    """The target cannot be installed; the message says why and what to do."""


@dataclass(frozen=True)
class InstallPlan:
    target: Path
    editable: bool
    project: str  # the distribution's name when the target says it (a folder's pyproject, a wheel's file name)
    constraints: Path | None
    build_isolation: bool

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        if self.constraints is not None:
            cmd += ["-c", str(self.constraints)]
        if not self.build_isolation:
            cmd.append("--no-build-isolation")
        return [*cmd, *(["-e", str(self.target)] if self.editable else [str(self.target)])]


def _build_requires(pyproject: Path) -> list[str]:
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise InstallError(f"{pyproject} is not valid TOML: {exc}") from exc
    return list(data.get("build-system", {}).get("requires", ["setuptools>=40.8.0"]))


def _installed(requirement: str) -> bool:
    match = _REQUIREMENT_NAME.match(requirement)
    if match is None:
        return False
    try:
        importlib.metadata.version(match.group(1))
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def plan(target: Path) -> InstallPlan:
    """How `target` (a package folder, or a wheel or sdist file) would be installed."""
    target = target.expanduser().resolve()
    if target.is_dir():
        pyproject = target / "pyproject.toml"
        if not pyproject.is_file() and not (target / "setup.py").is_file():
            raise InstallError(f"{target} has no pyproject.toml: not a Python package (`prime env init NAME` "
                               "writes one)")
        requires = _build_requires(pyproject) if pyproject.is_file() else ["setuptools"]
        return InstallPlan(target, True, project_name(pyproject) if pyproject.is_file() else "",
                           constraints_file(), not all(_installed(r) for r in requires))
    if target.is_file() and target.name.endswith(_ARCHIVES):
        # a wheel's name is `dist-version-...`, an sdist's `dist-version.tar.gz` (both with `_` for `-` in dist)
        stem = target.name.removesuffix(".tar.gz").removesuffix(".zip")
        project = (target.name.split("-")[0] if target.suffix == ".whl" else stem.rpartition("-")[0]).replace("_", "-")
        return InstallPlan(target, False, project, constraints_file(), True)
    if target.exists():
        raise InstallError(f"{target} is neither a package folder nor a wheel or sdist ({', '.join(_ARCHIVES)})")
    raise InstallError(f"no such folder or file: {target}")


def install(target: Path) -> InstallPlan:
    """Install `target` with pip (its output goes to this process's stderr); raises InstallError when pip fails."""
    how = plan(target)
    done = subprocess.run(how.command(), stdout=sys.stderr, stderr=sys.stderr, check=False)
    if done.returncode != 0:
        raise InstallError(f"pip could not install {how.target} (exit {done.returncode}; its messages are above)")
    return how


_CHECK = """
import json
from prime_lab.envs.hub import offline_unless_chosen
from prime_lab.envs.loader import describe
from prime_lab.envs.installed import canonical, installed_environments
found = []
for env in installed_environments():
    if canonical(env.distribution) == canonical({project!r}):
        try:
            with offline_unless_chosen():
                info = describe(env.name)
            found.append({{"id": env.name, "module": info.module, "args": [a.name for a in info.args]}})
        except Exception as exc:
            found.append({{"id": env.name, "module": env.module, "error": str(exc)}})
print(json.dumps(found))
"""


def environments_of(project: str) -> list[dict[str, object]]:
    """The environments the installed distribution `project` provides, each imported in a fresh interpreter (as
    the next `prime` command will): its id, module and arguments, or the error that loading it gives."""
    out = subprocess.run([sys.executable, "-c", _CHECK.format(project=project)], capture_output=True, text=True,
                         timeout=300, check=False)
    if out.returncode != 0:
        raise InstallError(f"checking the installed package failed: {out.stderr.strip().splitlines()[-1:]}")
    found: list[dict[str, object]] = json.loads(out.stdout.strip().splitlines()[-1])
    return found


# At the environment's own verifiers release ----------------------------------------------------------------------

@dataclass(frozen=True)
class ReleaseChoice:
    """Where an environment goes: beside prime-lab (`release` is None), or into `release`'s environment, in order
    of preference (`candidates`), with the reasons each release above them was ruled out."""

    release: str | None
    candidates: tuple[str, ...]
    reason: str
    ruled_out: tuple[tuple[str, str], ...] = ()  # (release, what it lacks that the package imports, and where)

    def ruled_out_words(self) -> list[str]:
        """`0.3.1, 0.3.0: no module verifiers.utils.token_utils (imported at game.py:13)`, one line per reason."""
        by_reason: dict[str, list[str]] = {}
        for release, why in self.ruled_out:
            by_reason.setdefault(why, []).append(release)
        return [f"{', '.join(found)}: {why}" for why, found in by_reason.items()]


MAX_TRIES = 3  # releases tried (each installed into) before giving up


def choose_release(target: Path, requested: str | None = None, isolate: bool = False) -> ReleaseChoice:
    """The release an environment package needs: `requested`, else what it declares narrowed by what it imports
    (newest first); beside prime-lab when the release installed there will do and isolation was not asked for."""
    from packaging.version import InvalidVersion, Version

    from prime_lab.envs import releases
    from prime_lab.envs.verifiers_adapter import installed_release

    beside = installed_release()
    declared = releases.declared_specifier(target)
    if requested is not None:
        try:
            version = Version(requested)
        except InvalidVersion:
            raise InstallError(f"--verifiers {requested}: not a release (e.g. 0.1.12; `pip index versions "
                               "verifiers` lists them)") from None
        if not releases.drivable(version):
            raise InstallError(f"verifiers {requested} cannot be driven: prime-lab drives the classic API of releases "
                               f"{releases.DRIVABLE_FROM} to before {releases.FIRST_UNDRIVABLE}")
        outside = (f" (outside what it declares, verifiers{declared})" if declared and not
                   releases.candidates(declared, [version]) else "")
        if not isolate and beside is not None and Version(beside) == version:
            return ReleaseChoice(None, (), f"verifiers {beside}, asked for{outside}, is the one installed here")
        return ReleaseChoice(str(version), (str(version),), f"verifiers {version}, asked for with --verifiers{outside}")
    if declared is None and not isolate:
        return ReleaseChoice(None, (), "it does not depend on verifiers")
    spec = declared or ""
    said = f"verifiers{spec}" if spec else "verifiers (any release)"
    wanted = [i for i in releases.verifiers_imports(target) if i.module != "verifiers" or i.names]
    if not isolate and beside is not None and releases.candidates(spec, [Version(beside)]):
        contents = releases.installed_contents()
        if contents is not None and all(contents.lacks(i) is None for i in wanted):  # no need to ask the registry
            return ReleaseChoice(None, (), f"verifiers {beside} (installed here) satisfies {said} and has what "
                                           "it imports")
    found = releases.candidates(spec, releases.available_releases())
    if not found:
        raise InstallError(f"{target} declares {said}, and no release it accepts can be driven (prime-lab drives "
                           f"{releases.DRIVABLE_FROM} to before {releases.FIRST_UNDRIVABLE}); install one with "
                           "--verifiers VERSION")
    passing: list[str] = []
    ruled_out: list[tuple[str, str]] = []
    for version in found:
        lacking = None
        if wanted:
            contents = releases.release_contents(version)
            lacking = next(((i, why) for i in wanted if (why := contents.lacks(i)) is not None), None)
        if lacking is None:
            passing.append(str(version))
        else:
            ruled_out.append((str(version), f"{lacking[1]} (imported at {lacking[0].where})"))
        if len(passing) >= MAX_TRIES:
            break
    if not passing:
        words = "; ".join(ReleaseChoice(None, (), "", tuple(ruled_out)).ruled_out_words())
        raise InstallError(f"{target} declares {said}, but every release it accepts lacks something it imports: "
                           f"{words}. Fix the import or the declaration, or install it with --verifiers VERSION")
    why = f"the newest release that satisfies {said} (declared)" + (" and has what it imports" if ruled_out else "")
    return ReleaseChoice(passing[0], tuple(passing), why, tuple(ruled_out))


def _site_packages(folder: Path) -> list[str]:
    return [str(p) for p in folder.glob("lib/python*/site-packages")]


def _installed_into(project: str, folder: Path) -> tuple[str, list[tuple[str, str]]]:
    """The version of the distribution `project` installed into a release's environment, and (name, module) of
    each environment it provides: its `prime_lab.environments` entry points, else the module named like it."""
    from prime_lab.envs.installed import ENTRY_POINT_GROUP, canonical, module_name

    named_like = [(canonical(project), module_name(project))]
    for dist in importlib.metadata.distributions(path=_site_packages(folder)):
        if canonical(dist.metadata["Name"] or "") == canonical(project):
            entries = [(canonical(ep.name), ep.value.partition(":")[0].strip()) for ep in dist.entry_points
                       if ep.group == ENTRY_POINT_GROUP]
            return dist.version or "", entries or named_like
    return "", named_like


def install_isolated(target: Path, choice: ReleaseChoice, say: Any = None) -> list[Any]:
    """Install `target` into the environment of the first of `choice.candidates` it imports under (stepping down
    on an import failure) and record it; the records. Raises InstallError naming every release tried and what
    failed."""
    from prime_lab.envs import isolated, releases
    from prime_lab.envs.env_server import run_driver

    how = plan(target)
    if not how.project:
        raise InstallError(f"{how.target}: its distribution name cannot be read (a folder with a pyproject.toml "
                           "[project] name, or a wheel)")
    tried: list[str] = []
    for release in choice.candidates:
        env = releases.ReleaseEnv(release)
        try:
            env.ensure(say)
        except releases.ReleaseError as exc:
            raise InstallError(str(exc)) from None
        done = env.pip("install", "-q", *(["-e"] if how.editable else []), str(how.target))
        if done.returncode != 0:
            raise InstallError(f"pip could not install {how.target} into verifiers {release}'s environment "
                               f"({env.folder}):\n{releases._last_lines(done.stderr or done.stdout)}")
        found = []
        failure = None
        version, provided = _installed_into(how.project, env.folder)
        for name, module in provided:
            checked = run_driver(env.python, "check", module, timeout=300)
            if not checked.get("ok"):
                failure = (module, checked)
                break
            found.append(isolated.IsolatedRecord(
                name=name, module=module, distribution=how.project, version=version,
                release=release, python=str(env.python), target=str(how.target),
                reason=f"verifiers {release}: " + (choice.reason if release == choice.candidates[0] else
                                                  f"{choice.reason}; the newer ones failed to import it ("
                                                  + "; ".join(tried) + ")"),
                summary=str(checked.get("doc") or ""),
                args=tuple(tuple(a) for a in checked.get("args") or ()), any_args=bool(checked.get("any_args"))))
        if failure is None:
            for record in found:
                isolated.save_record(record)
            return found
        module, checked = failure
        where = f" at {checked['where']}" if checked.get("where") else ""
        tried.append(f"{release}: {checked.get('error')}{where}")
        env.pip("uninstall", "-q", "-y", how.project)
        if callable(say):
            say(f"verifiers {release} cannot import {module}: {checked.get('error')}{where}")
        if not checked.get("import_error"):
            break
    raise InstallError(f"{how.project} cannot import under any release it was tried with: " + "; ".join(tried)
                       + (f" (ruled out before trying, by what it imports: {'; '.join(choice.ruled_out_words())})"
                          if choice.ruled_out else "")
                       + ". Install it at another release with --verifiers VERSION")

