"""`prime env install PATH`: an environment package into the environment prime-lab runs in, usable by id at once;
`prime env uninstall ID` takes one away.

Beside prime-lab, pip runs with this interpreter (`sys.executable -m pip`); a folder is installed editable (edits
apply at the next run). What is installed there stays as it is: pip runs with the constraints file of the prime-lab
checkout this install comes from (`constraints.txt`, which pins torch) and one that holds verifiers and every
distribution prime-lab requires at the versions installed now (`held_requirements`). A package that cannot have
them is not installed beside prime-lab (`HeldBack`): the command sends it to a release environment of its own, or
refuses it. When the package's build backend is already installed, pip builds without an isolated build
environment, which works offline. An install whose environments do not then import is taken back (the distribution
it added uninstalled); an install into a release's environment (`install_isolated`) runs under that release's lock
and is taken back too when another environment recorded there no longer imports after it.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prime_lab.envs import releases
from prime_lab.envs.installed import canonical
from prime_lab.runs.paths import constraints_file, lab_home, project_name

_REQUIREMENT_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_ARCHIVES = (".whl", ".tar.gz", ".zip")
PIP_TIMEOUT_S = 1800.0  # one install beside prime-lab (its dependencies downloaded)
CHECK_TIMEOUT_S = 300.0  # importing an environment in a fresh interpreter


class InstallError(ValueError):
    """The target cannot be installed; the message says why and what to do."""


class HeldBack(InstallError):
    """pip cannot install the package beside prime-lab without changing what is installed there (verifiers, or one
    of prime-lab's own dependencies, held at its installed version)."""

    def __init__(self, project: str, cause: list[str], message: str) -> None:
        super().__init__(message)
        self.project = project
        self.cause = cause

    def needs(self) -> list[str]:
        """The requirements the conflict names: the package's own (`tomlkit==0.12.0`), and its dependencies' with
        whose they are (`tomlkit<0.13 (for foo 1.0)`)."""
        found = []
        for line in self.cause:
            who, _, requirement = line.partition(" depends on ")
            if requirement:
                own = canonical(who.split()[0]) == canonical(self.project) if who.split() else False
                found.append(requirement if own else f"{requirement} (for {who})")
        return found

    def words(self) -> str:
        """`it needs tomlkit==0.12.0, and prime-lab keeps tomlkit==0.15.2 (installed)`: what pip's resolver said,
        in one line."""
        needs = self.needs()
        held = [line.split("(constraint)", 1)[1].strip() for line in self.cause if "(constraint)" in line]
        if needs and held:
            return f"it needs {', '.join(needs)}, and prime-lab keeps {', '.join(held)} (installed)"
        return ("; ".join(self.cause) or "pip finds no versions that satisfy it") + " beside prime-lab"


@dataclass(frozen=True)
class InstallPlan:
    target: Path
    editable: bool
    project: str  # the distribution's name when the target says it (a folder's pyproject, a wheel's file name)
    constraints: Path | None
    build_isolation: bool

    def command(self, *held: Path) -> list[str]:
        """pip's command beside prime-lab, through prime-lab's constraints file and `held` (more constraints)."""
        cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check"]
        for path in (self.constraints, *held):
            if path is not None:
                cmd += ["-c", str(path)]
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


def installed_version(distribution: str) -> str | None:
    """The version of `distribution` installed beside prime-lab, or None."""
    try:
        return importlib.metadata.version(distribution)
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None


def held_requirements() -> list[str]:
    """verifiers and every distribution prime-lab requires (not its extras), each `==` the version installed now:
    what an install beside prime-lab must leave as it is."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.version import InvalidVersion, Version

    names = ["verifiers"]
    own = (importlib.metadata.requires("prime-lab") or []) if installed_version("prime-lab") is not None else []
    for text in own:
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            continue
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            names.append(requirement.name)
    pins: dict[str, str] = {}
    for name in names:
        version = installed_version(name)
        try:
            if version is not None and Version(version):
                pins.setdefault(canonical(name), f"{canonical(name)}=={version}")
        except InvalidVersion:
            continue
    return sorted(pins.values())


def held_constraints() -> Path:
    """`held_requirements()` as a constraints file (`$PRIME_LAB_HOME/environments/held.txt`, written afresh, kept
    so that the pip command an error names can be rerun)."""
    path = lab_home() / "environments" / "held.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = ("# what `prime env install` leaves as it is beside prime-lab: verifiers and prime-lab's own dependencies, "
            "at the versions installed\n" + "\n".join(held_requirements()) + "\n")
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(text)
    partial.replace(path)
    return path


def install(target: Path, say: Callable[[str], None] | None = None) -> InstallPlan:
    """Install `target` beside prime-lab with pip, holding what is installed (`held_constraints`). Raises HeldBack
    when pip cannot satisfy both, InstallError when pip fails or times out (what a killed pip left of the package
    taken back)."""
    how = plan(target)
    before = installed_version(how.project) if how.project else None
    command = how.command(held_constraints())
    if say is not None:
        say(f"pip: installing {how.project or how.target} beside prime-lab (verifiers and prime-lab's dependencies "
            "held at their installed versions)")
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        left = f" ({take_back(how.project, before)})" if how.project and installed_version(how.project) else ""
        raise InstallError(releases.timed_out(command, PIP_TIMEOUT_S) + left) from None
    if done.returncode != 0:
        cause = releases.conflict_lines(done.stdout + "\n" + done.stderr)
        if cause is not None and any("(constraint)" in line for line in cause):
            raise HeldBack(how.project, cause, releases.pip_failed(
                done, f"pip cannot install {how.target} beside prime-lab without changing what is installed here"))
        raise InstallError(releases.pip_failed(done, f"pip could not install {how.target}"))
    return how


@dataclass(frozen=True)
class BesideInstall:
    """An install beside prime-lab that holds: what pip ran, and the environments the package provides (`id`,
    `module`, `args` of each, imported in a fresh interpreter)."""

    plan: InstallPlan
    environments: list[dict[str, object]]


def install_beside(target: Path, say: Callable[[str], None] | None = None) -> BesideInstall:
    """`install`, then each environment the package provides imported as the next command will; taken back (the
    distribution uninstalled, when this install added it) when it provides none or one does not import."""
    from prime_lab.envs.isolated import remove_record

    how = plan(target)
    before = installed_version(how.project) if how.project else None
    install(target, say)
    if not how.project:
        return BesideInstall(how, [])
    try:
        found = environments_of(how.project)
    except InstallError as exc:
        raise InstallError(f"{exc} ({take_back(how.project, before)})") from None
    if not found:
        raise InstallError(f"{how.project} provides no environment prime-lab can find ({take_back(how.project, before)}"
                           "): declare an entry point in [project.entry-points.\"prime_lab.environments\"] (NAME = "
                           "\"module\"), or name its module like the package and depend on verifiers or prime-lab")
    broken = [str(f["error"]) for f in found if "error" in f]
    if broken:
        raise InstallError(f"{how.project} is not installed ({take_back(how.project, before)}): " + "; ".join(broken))
    remove_record(how.project)  # beside prime-lab now: an earlier install at its own release no longer applies
    return BesideInstall(how, found)


def take_back(project: str, before: str | None) -> str:
    """Undo an install beside prime-lab: uninstall `project` when this install added it (`before` is None), nothing
    else; what was done, in words."""
    if not project:
        return "nothing taken back (its distribution name is unknown)"
    if before is not None:
        return f"{project} {before} was installed before; left as pip left it"
    command = [sys.executable, "-m", "pip", "uninstall", "-y", "--disable-pip-version-check", project]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    except subprocess.TimeoutExpired:
        return f"not taken back: {releases.timed_out(command, 300)}"
    if done.returncode != 0:
        return f"not taken back: {releases.pip_failed(done, f'pip could not uninstall {project}')}"
    return f"taken back: {project} uninstalled"


def own_release_for(target: Path, requested: str | None, held: HeldBack) -> ReleaseChoice:
    """Where a package that cannot go beside prime-lab goes instead: a release environment of its own, chosen as
    `choose_release` chooses (isolated); InstallError (one line: why not beside, why not there) when none will do."""
    name = held.project or str(target)
    if releases.declared_specifier(target) is None:
        raise InstallError(f"{name} is not installed: {held.words()}; it does not depend on verifiers, so no "
                           "release environment of its own can take it. Loosen its pin")
    if requested is not None and any(canonical(need).startswith("verifiers") for need in held.needs()):
        raise InstallError(f"{name} is not installed: {held.words()}; with --verifiers {requested} its own "
                           "environment would hold the same release. Install it without --verifiers (the release "
                           "it declares), or loosen its pin")
    try:
        return choose_release(target, requested, isolate=True)
    except (InstallError, releases.ReleaseError) as exc:
        raise InstallError(f"{name} is not installed: {held.words()}; nor can a release environment of its own "
                           f"take it: {exc}") from None


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
    command = [sys.executable, "-c", _CHECK.format(project=project)]
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise InstallError(f"importing {project}'s environments did not finish within {CHECK_TIMEOUT_S:g} s (a "
                           "module that downloads or waits when it is imported?)") from None
    if out.returncode != 0:
        raise InstallError(f"checking the installed package failed: {releases._last_lines(out.stderr, 1)}")
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
    each environment it provides: its `prime_lab.environments` entry points, else the module named like it (as the
    package spells it: `UncertaintyBench`)."""
    from prime_lab.envs.installed import ENTRY_POINT_GROUP, module_name, module_of

    for dist in importlib.metadata.distributions(path=_site_packages(folder)):
        if canonical(dist.metadata["Name"] or "") == canonical(project):
            entries = [(canonical(ep.name), ep.value.partition(":")[0].strip()) for ep in dist.entry_points
                       if ep.group == ENTRY_POINT_GROUP]
            module = module_of(dist, project) or module_name(project)
            return dist.version or "", entries or [(canonical(project), module)]
    return "", [(canonical(project), module_name(project))]


def _take_back_in(env: releases.ReleaseEnv, before: dict[str, str], project: str) -> str:
    """Put a release's environment back as it was before an install (`before`: what `env.installed()` said then):
    uninstall what the install added, reinstall at its old version what it changed (except `project` itself when
    it was there before). What was done, in words."""
    after = env.installed()
    added = sorted(set(after) - set(before))
    changed = {name: version for name, version in before.items()
               if after.get(name) != version and name != canonical(project)}
    done = []
    try:
        if added:
            out = env.pip("uninstall", "-y", *added)
            done.append(f"uninstalled {', '.join(added)}" if out.returncode == 0 else
                        releases.pip_failed(out, f"could not uninstall {', '.join(added)}"))
        if changed:
            out = env.pip("install", "--no-deps", *(f"{name}=={version}" for name, version in sorted(changed.items())))
            words = ", ".join(f"{name} {version}" for name, version in sorted(changed.items()))
            done.append(f"put back {words}" if out.returncode == 0 else
                        releases.pip_failed(out, f"could not put back {words}"))
    except releases.ReleaseError as exc:  # pip timed out
        done.append(f"not all taken back: {exc}")
    if canonical(project) in before:
        done.append(f"{project} {before[canonical(project)]} was installed before; left as pip left it")
    return "; ".join(done) or "nothing to take back"


def _check(python: Path | str, module: str) -> dict[str, Any]:
    from prime_lab.envs.env_server import run_driver

    return run_driver(python, "check", module, timeout=CHECK_TIMEOUT_S)


def _failure_words(checked: dict[str, Any]) -> str:
    where = f" at {checked['where']}" if checked.get("where") else ""
    return f"{checked.get('error')}{where}"


def neighbours(env: releases.ReleaseEnv, project: str) -> list[Any]:
    """The environments recorded on `env` (the same interpreter) that `project` does not provide."""
    from prime_lab.envs import isolated

    return [r for r in isolated.records().values()
            if r.python == str(env.python) and canonical(r.distribution) != canonical(project)]


def broken_neighbours(env: releases.ReleaseEnv, project: str) -> list[tuple[Any, str]]:
    """Each environment recorded on `env` (other than `project`'s) that no longer imports there, with why (each
    checked by the driver in that interpreter, a few at once)."""
    others = neighbours(env, project)
    if not others:
        return []
    with ThreadPoolExecutor(max_workers=min(4, len(others))) as pool:
        checked = list(pool.map(lambda record: _check(env.python, record.module), others))
    return [(record, _failure_words(c)) for record, c in zip(others, checked, strict=True) if not c.get("ok")]


def install_isolated(target: Path, choice: ReleaseChoice, say: Any = None) -> list[Any]:
    """Install `target` into the environment of the first of `choice.candidates` it imports under (stepping down
    on an import failure) and record it; the records. Each try runs under that release's lock, holds verifiers at
    the release, and is taken back when the package does not import or another environment recorded there no
    longer does. Raises InstallError naming every release tried and what failed."""
    from prime_lab.envs import isolated

    how = plan(target)
    if not how.project:
        raise InstallError(f"{how.target}: its distribution name cannot be read (a folder with a pyproject.toml "
                           "[project] name, or a wheel)")
    tried: list[str] = []
    for release in choice.candidates:
        env = releases.ReleaseEnv(release)
        with env.locked():
            try:
                env.ensure(say)
            except releases.ReleaseError as exc:
                raise InstallError(str(exc)) from None
            before = env.installed()
            try:
                done = env.pip("install", *(["-e"] if how.editable else []), str(how.target))
            except releases.ReleaseError as exc:  # pip timed out: what it left is taken back
                raise InstallError(f"{exc} ({_take_back_in(env, before, how.project)})") from None
            if done.returncode != 0:
                raise InstallError(releases.pip_failed(done, f"pip could not install {how.target} into verifiers "
                                                             f"{release}'s environment ({env.folder})"))
            found = []
            failure = None
            version, provided = _installed_into(how.project, env.folder)
            for name, module in provided:
                checked = _check(env.python, module)
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
                broken = broken_neighbours(env, how.project)
                if broken:
                    undone = _take_back_in(env, before, how.project)
                    still = {r.name for r, _ in broken_neighbours(env, how.project)}
                    lines = [f"  {record.name} ({record.distribution}): {why}"
                             + (" (still, after the take-back: fix it with prime env install "
                                f"{record.target})" if record.name in still else "")
                             for record, why in broken]
                    raise InstallError(
                        f"{how.project} is not installed: installing it into verifiers {release}'s environment "
                        f"({env.folder}) broke {len(broken)} environment(s) installed there; taken back ({undone}). "
                        "Install it into another release with --verifiers VERSION:\n" + "\n".join(lines))
                for record in found:
                    isolated.save_record(record)
                return found
            _take_back_in(env, before, how.project)
        module, checked = failure
        tried.append(f"{release}: {_failure_words(checked)}")
        if callable(say):
            say(f"verifiers {release} cannot import {module}: {_failure_words(checked)}")
        if not checked.get("import_error"):
            break
    raise InstallError(f"{how.project} cannot import under any release it was tried with: " + "; ".join(tried)
                       + (f" (ruled out before trying, by what it imports: {'; '.join(choice.ruled_out_words())})"
                          if choice.ruled_out else "")
                       + ". Install it at another release with --verifiers VERSION")


# Taking one away ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Removal:
    """What `uninstall` did."""

    ids: tuple[str, ...]  # the environments that went (every one the distribution provided)
    distribution: str
    version: str
    where: str  # `beside prime-lab`, or `verifiers 0.1.12's own environment (FOLDER)`
    release_env: str = ""  # what became of the release's environment, in words ('' when not asked)


def uninstall(env_id: str, release_env: bool = False) -> Removal:
    """Uninstall the distribution that provides the environment `env_id` (beside prime-lab, or in its release's
    environment under that release's lock) and forget its isolated records; with `release_env`, also delete the
    release's environment when no other recorded environment uses it. InstallError for an id nothing installed
    provides."""
    from prime_lab.envs import isolated, loader
    from prime_lab.envs.installed import installed_environments

    record = isolated.record_for(env_id)
    if record is not None:
        return _uninstall_isolated(record, release_env)
    wanted = canonical(env_id.rsplit("/", 1)[-1])
    env = next((e for e in installed_environments() if e.name == wanted), None)
    if env is None:
        try:
            where = loader.resolve(env_id)
        except Exception:  # noqa: BLE001 - any id the loader cannot place is unknown here
            where = None
        if where is not None and where.source == loader.BUILTIN:
            raise InstallError(f"'{env_id}' is built into prime-lab: there is nothing to uninstall")
        if where is not None:
            raise InstallError(f"'{env_id}' loads the module {where.module}, which no pip-installed environment "
                               "package provides (`prime env list` shows the installed ones)")
        raise InstallError(f"no installed environment '{env_id}' (`prime env list` shows the installed ones)")
    ids = tuple(e.name for e in installed_environments() if canonical(e.distribution) == canonical(env.distribution))
    command = [sys.executable, "-m", "pip", "uninstall", "-y", "--disable-pip-version-check", env.distribution]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    except subprocess.TimeoutExpired:
        raise InstallError(releases.timed_out(command, 300)) from None
    if done.returncode != 0:
        raise InstallError(releases.pip_failed(done, f"pip could not uninstall {env.distribution}"))
    isolated.remove_record(env.distribution)  # a stale record of it at its own release goes too
    return Removal(ids, env.distribution, env.version, "beside prime-lab",
                   "it ran beside prime-lab: no release environment of its own" if release_env else "")


def _uninstall_isolated(record: Any, release_env: bool) -> Removal:
    from prime_lab.envs import isolated

    env = releases.ReleaseEnv(record.release)
    folder = Path(record.python).parents[1]
    with env.locked():
        ids = tuple(sorted(r.name for r in isolated.records().values() if r.python == record.python
                           and canonical(r.distribution) == canonical(record.distribution)))
        if Path(record.python).is_file():
            done = releases._pip("uninstall", "-y", record.distribution, python=record.python, timeout=300)
            if done.returncode != 0 and "not installed" not in (done.stdout + done.stderr):
                raise InstallError(releases.pip_failed(done, f"pip could not uninstall {record.distribution} from "
                                                             f"verifiers {record.release}'s environment ({folder})"))
        isolated.remove_record(record.distribution)
        what = ""
        if release_env:
            users = sorted(r.name for r in isolated.records().values() if r.python == record.python)
            if users:
                what = f"kept {folder}: still used by {', '.join(users)}"
            elif folder == env.folder:
                env.remove()
                what = f"removed {folder}"
            elif (folder / releases.READY).is_file():
                shutil.rmtree(folder, ignore_errors=True)
                what = f"removed {folder}"
            else:
                what = f"kept {folder}: not a release environment prime-lab made"
    return Removal(ids, record.distribution, record.version,
                   f"verifiers {record.release}'s own environment ({folder})", what)
