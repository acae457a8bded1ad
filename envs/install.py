"""`prime env install PATH`: an environment package into the environment prime-lab runs in, usable by id at once;
`prime env uninstall ID` takes one away.

Beside prime-lab, pip runs with this interpreter (`sys.executable -m pip`); a folder is installed editable (edits
apply at the next run). What is installed there stays as it is. Under one lock (a file in prime-lab's environment,
`LOCK`), pip first runs dry (`--dry-run --report`) with the constraints file of the prime-lab checkout
(`constraints.txt`, which pins torch) and one that holds every installed distribution at its version
(`held_requirements`; only the package itself, and what only its installed version needs, may change). A package
that cannot have them (`tokenizers==0.21` where transformers needs 0.23), or that would bring a console script of
prime-lab's own (PyPI's `prime`), is not installed beside prime-lab (`HeldBack`): the command sends it to a release
environment of its own, or refuses it in one line. Then pip installs what the dry run said. Whatever fails after
that (pip itself, the environments' import, a script replaced all the same) is taken back: every distribution pip
added is uninstalled, every one it changed put back (`take_back_in`, which serves a release's environment too). What
an install added and changed is recorded in the environment (`INSTALLS`), so that `prime env uninstall` takes it
away again, except what another installed distribution needs. What `pip check` would list is read before and after
(`releases.conflicts`): a conflict it did not list before is named. When the package's build backend is already
installed, pip builds without an isolated build environment, which works offline. An install into a release's
environment (`install_isolated`) runs under that release's lock and is taken back too when pip fails, when the
package does not import, or when another environment recorded there no longer imports after it.
"""

from __future__ import annotations

import configparser
import contextlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import tomllib
import urllib.parse
import zipfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from prime_lab.envs import releases
from prime_lab.envs.installed import canonical
from prime_lab.runs.atomic import write_json_atomic
from prime_lab.runs.paths import constraints_file, lab_home, project_name

_REQUIREMENT_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_ARCHIVES = (".whl", ".tar.gz", ".zip")
PIP_TIMEOUT_S = 1800.0  # one install beside prime-lab (its dependencies downloaded)
CHECK_TIMEOUT_S = 300.0  # importing an environment in a fresh interpreter
LOCK = ".prime-lab-install.lock"  # in the environment's folder: one install or uninstall there at a time
INSTALLS = "prime-lab-installs.json"  # in the environment's folder: what each install added and changed


class InstallError(ValueError):
    """The target cannot be installed; the message says why and what to do."""


class HeldBack(InstallError):
    """The package cannot go beside prime-lab without changing what is installed there (pip's resolver found no
    way with the installed distributions held at their versions), or it would bring a console script of
    prime-lab's own (`reason` says so)."""

    def __init__(self, project: str, cause: list[str], message: str, reason: str = "",
                 remedy: str = "Loosen its pin", users: dict[str, list[str]] | None = None) -> None:
        super().__init__(message)
        self.project = project
        self.cause = cause
        self.reason = reason
        self.remedy = remedy
        self.users = users or {}

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
        """`it needs tokenizers==0.21.0 (for foo 1.0), and prime-lab keeps tokenizers==0.23.3 (installed, needed by
        transformers)`: what pip's resolver said, in one line; or the reason it was refused."""
        if self.reason:
            return self.reason
        needs = self.needs()
        held = [line.split("(constraint)", 1)[1].strip() for line in self.cause if "(constraint)" in line]
        if needs and held:
            kept = []
            for pin in held:
                users = self.users.get(canonical(re.split(r"[=<>!~ ;\[]", pin, maxsplit=1)[0]), [])
                kept.append(f"{pin} (installed" + (f", needed by {', '.join(users)})" if users else ")"))
            return f"it needs {', '.join(needs)}, and prime-lab keeps {', '.join(kept)}"
        return ("; ".join(self.cause) or "pip finds no versions that satisfy it") + " beside prime-lab"


@dataclass(frozen=True)
class InstallPlan:
    target: Path
    editable: bool
    project: str  # the distribution's name when the target says it (a folder's pyproject, a wheel's file name)
    constraints: Path | None
    build_isolation: bool
    also: tuple[str, ...] = ()  # requirements pip installs with it (an Environments Hub release's url_dependencies)

    def command(self, *held: Path, report: Path | None = None) -> list[str]:
        """pip's command beside prime-lab, through prime-lab's constraints file and `held` (more constraints);
        with `report`, a dry run that writes there what it would install."""
        cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check"]
        if report is not None:
            cmd += ["--dry-run", "--report", str(report)]
        for path in (self.constraints, *held):
            if path is not None:
                cmd += ["-c", str(path)]
        if not self.build_isolation:
            cmd.append("--no-build-isolation")
        return [*cmd, *(["-e", str(self.target)] if self.editable else [str(self.target)]), *self.also]


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


# Where installs go: beside prime-lab, or a release's environment ----------------------------------------------------

class Site(Protocol):
    """A virtual environment installs go into: its folder, what is installed there, and pip there."""

    @property
    def folder(self) -> Path: ...

    def dists(self) -> dict[str, releases.Installed]: ...

    def pip(self, *args: str) -> subprocess.CompletedProcess[str]: ...


@dataclass(frozen=True)
class Beside:
    """The environment prime-lab runs in: this interpreter's, its distributions as `import` finds them, pip with
    prime-lab's constraints file; one lock (a file in it) for every install and uninstall there."""

    @property
    def folder(self) -> Path:
        return Path(sys.prefix)

    def dists(self) -> dict[str, releases.Installed]:
        return releases.installed_dists()

    def pip(self, *args: str) -> subprocess.CompletedProcess[str]:
        return releases._pip(*args, timeout=PIP_TIMEOUT_S)

    def locked(self) -> AbstractContextManager[None]:
        return releases.file_lock(self.folder / LOCK)


def take_back_in(site: Site, before: dict[str, releases.Installed], project: str) -> str:
    """Put `site` back as it was before an install (`before`: what `site.dists()` said then): uninstall what it
    added, reinstall at its old version what it changed or removed (from the index, or the archive it came from;
    what came from a folder is left as pip left it). What was done, in words."""
    after = site.dists()
    added = sorted(set(after) - set(before))
    changed = [before[name] for name in sorted(before)
               if name not in after or after[name].version != before[name].version]
    again = {dist.name: dist.put_back() for dist in changed}
    done = []
    try:
        if added:
            out = site.pip("uninstall", "-y", *added)
            done.append(f"uninstalled {', '.join(added)}" if out.returncode == 0 else
                        releases.pip_failed(out, f"could not uninstall {', '.join(added)}"))
        back = [dist for dist in changed if again[dist.name]]
        if back:
            out = site.pip("install", "--no-deps", *(str(again[dist.name]) for dist in back))
            words = ", ".join(f"{dist.name} {dist.version}" for dist in back)
            done.append(f"put back {words}" if out.returncode == 0 else
                        releases.pip_failed(out, f"could not put back {words}"))
    except releases.ReleaseError as exc:  # pip timed out
        done.append(f"not all taken back: {exc}")
    done += [f"{dist.name} {dist.version} was installed before" + (f" from {dist.url}" if dist.url else "")
             + "; left as pip left it" for dist in changed if not again[dist.name]]
    return "; ".join(done) or "nothing to take back"


def _remember(site: Site, project: str, before: dict[str, releases.Installed],
              after: dict[str, releases.Installed]) -> None:
    """Record in `site` what installing `project` added and changed (kept across reinstalls: what its first
    install found stays what `prime env uninstall` puts back; a record of one uninstalled by pip alone is dropped)."""
    name = canonical(project)
    records = _records(site)
    old = records.get(name, {}) if name in before else {}
    added = sorted((set(old.get("added", [])) | set(after) - set(before)) - {name})
    changed = {n: {"version": d.version, "from": d.put_back() or ""} for n, d in before.items()
               if n != name and n in after and after[n].version != d.version}
    changed = {n: c for n, c in {**changed, **old.get("changed", {})}.items() if n not in added}
    records[name] = {"added": added, "changed": changed}
    _write_records(site, records)


def _records(site: Site) -> dict[str, dict[str, Any]]:
    try:
        data = json.loads((site.folder / INSTALLS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_records(site: Site, records: dict[str, dict[str, Any]]) -> None:
    write_json_atomic(site.folder / INSTALLS, records)


def _remove(site: Site, project: str, missing_ok: bool = False) -> list[str]:
    """Uninstall `project` from `site` and what its install added (recorded there) that nothing staying needs; put
    back what it changed. What was done beyond `project` itself, in words; InstallError when pip fails."""
    name = canonical(project)
    dists = site.dists()
    record = _records(site).get(name, {})
    added = [n for n in record.get("added", []) if n in dists]
    going = releases.only_needed_by(dists, added, forced=[name] if name in dists else [])
    words = []
    if going:
        done = site.pip("uninstall", "-y", *sorted(going))
        if done.returncode != 0 and not (missing_ok and "not installed" in done.stdout + done.stderr):
            raise InstallError(releases.pip_failed(done, f"pip could not uninstall {', '.join(sorted(going))} from "
                                                         f"{site.folder}"))
    if going - {name}:
        words.append(f"also uninstalled what its install added: {', '.join(sorted(going - {name}))}")
    now = site.dists()
    kept = [n for n in added if n not in going]
    if kept:
        words.append("kept " + ", ".join(f"{n} (needed by {', '.join(releases.needed_by(now, n)) or 'another'})"
                                         for n in kept))
    back = {n: c for n, c in record.get("changed", {}).items()
            if n in now and now[n].version != c.get("version") and c.get("from")}
    if back:
        done = site.pip("install", "--no-deps", *(str(c["from"]) for c in back.values()))
        what = ", ".join(f"{n} {c['version']}" for n, c in back.items())
        words.append(f"put back {what}" if done.returncode == 0 else
                     releases.pip_failed(done, f"could not put back {what}"))
    records = _records(site)
    if records.pop(name, None) is not None:
        _write_records(site, records)
    return words


# prime-lab's own console scripts ------------------------------------------------------------------------------------

def lab_scripts() -> dict[str, str]:
    """prime-lab's console scripts (`prime`): name -> `module:function`."""
    try:
        dist = importlib.metadata.distribution("prime-lab")
    except importlib.metadata.PackageNotFoundError:
        return {}
    return {ep.name: ep.value for ep in dist.entry_points if ep.group in ("console_scripts", "gui_scripts")}


def launcher(value: str) -> str:
    """The script pip writes for the entry point `module:function`, run by this interpreter."""
    module, _, function = value.partition(":")
    head = function.strip().split(".")[0]
    return (f"#!{sys.executable}\n# -*- coding: utf-8 -*-\nimport re\nimport sys\nfrom {module.strip()} import {head}\n"
            "if __name__ == '__main__':\n    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n"
            f"    sys.exit({function.strip()}())\n")


@dataclass(frozen=True)
class KeptScripts:
    """prime-lab's console scripts as they were before pip ran (`before`), and as they must be after (`good`:
    the same, or pip's launcher where another package had replaced one)."""

    before: dict[Path, bytes | None]
    good: dict[Path, bytes]

    @classmethod
    def save(cls) -> KeptScripts:
        folder = Path(sysconfig.get_path("scripts"))
        before: dict[Path, bytes | None] = {}
        good: dict[Path, bytes] = {}
        for name, value in lab_scripts().items():
            path = folder / name
            data = path.read_bytes() if path.is_file() else None
            module, _, function = value.partition(":")
            ours = f"from {module.strip()} import {function.strip().split('.')[0]}".encode()
            before[path] = data
            good[path] = data if data is not None and ours in data else launcher(value).encode()
        return cls(before, good)

    def changed(self) -> list[str]:
        """The scripts pip replaced or deleted."""
        return [p.name for p, data in self.before.items() if (p.read_bytes() if p.is_file() else None) != data]

    def restore(self) -> list[str]:
        """Write back each script that is not as it must be; their names."""
        done = []
        for path, data in self.good.items():
            if not path.is_file() or path.read_bytes() != data:
                path.write_bytes(data)
                path.chmod(0o755)
                done.append(path.name)
        return done


def _scripts_of(item: dict[str, Any], downloaded: Path) -> set[str] | None:
    """The console scripts a distribution pip would install declares (from its wheel, or a folder's pyproject);
    None when they cannot be read without building it (an sdist, a setup.py)."""
    url = str((item.get("download_info") or {}).get("url") or "")
    path = Path(urllib.parse.unquote(urllib.parse.urlparse(url).path)) if url.startswith("file:") else \
        downloaded / urllib.parse.unquote(url.rsplit("/", 1)[-1].split("#")[0])
    if path.is_dir():
        try:
            project = tomllib.loads((path / "pyproject.toml").read_text(encoding="utf-8")).get("project", {})
        except (OSError, tomllib.TOMLDecodeError):
            return None
        if "scripts" in project.get("dynamic", []) or "gui-scripts" in project.get("dynamic", []):
            return None
        return set(project.get("scripts", {})) | set(project.get("gui-scripts", {}))
    if path.suffix != ".whl" or not path.is_file():
        return None
    parser = configparser.ConfigParser(delimiters=("=",), interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    try:
        with zipfile.ZipFile(path) as wheel:
            names = [n for n in wheel.namelist() if n.count("/") == 1 and n.endswith(".dist-info/entry_points.txt")]
            parser.read_string(wheel.read(names[0]).decode() if names else "")
    except (OSError, zipfile.BadZipFile, configparser.Error, UnicodeDecodeError):
        return None
    return {name for group in ("console_scripts", "gui_scripts") if parser.has_section(group)
            for name in parser.options(group)}


# Beside prime-lab ---------------------------------------------------------------------------------------------------

def held_requirements(project: str = "", dists: dict[str, releases.Installed] | None = None) -> list[str]:
    """Every distribution installed beside prime-lab, `==` the version installed now, but `project` and what only
    it needs (so that it can be installed again at another version): what an install must leave as it is."""
    from packaging.version import InvalidVersion, Version

    dists = releases.installed_dists() if dists is None else dists
    free = _free(dists, project)
    pins = []
    for name, dist in sorted(dists.items()):
        if name in free:
            continue
        try:
            Version(dist.version)
        except InvalidVersion:
            continue
        pins.append(f"{name}=={dist.version}")
    return pins


def _free(dists: dict[str, releases.Installed], project: str) -> set[str]:
    """What an install of `project` may change: it, when installed and nothing else needs it, and what only it
    needs."""
    mine = releases.needed(dists, [project]) if project else set()
    return releases.only_needed_by(dists, mine) if mine else set()


def held_constraints(project: str = "", dists: dict[str, releases.Installed] | None = None,
                     also: list[str] | None = None) -> Path:
    """`held_requirements()` (and `also`) as a constraints file (`$PRIME_LAB_HOME/environments/held.txt`, written
    afresh, kept so that the pip command an error names can be rerun)."""
    path = lab_home() / "environments" / "held.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = ("# what `prime env install` leaves as it is beside prime-lab: every distribution installed, at its "
            "version\n" + "\n".join([*held_requirements(project, dists), *(also or [])]) + "\n")
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(text)
    partial.replace(path)
    return path


def _refusal(how: InstallPlan, done: subprocess.CompletedProcess[str],
             dists: dict[str, releases.Installed]) -> InstallError:
    """What a pip that failed before it changed anything says: HeldBack when the installed distributions held it."""
    cause = releases.conflict_lines(done.stdout + "\n" + done.stderr)
    if cause is not None and any("(constraint)" in line for line in cause):
        held = [line.split("(constraint)", 1)[1].strip() for line in cause if "(constraint)" in line]
        names = {canonical(re.split(r"[=<>!~ ;\[]", pin, maxsplit=1)[0]) for pin in held}
        return HeldBack(how.project, cause, releases.pip_failed(
            done, f"pip cannot install {how.target} beside prime-lab without changing what is installed here"),
            users={name: releases.needed_by(dists, name) for name in names})
    return InstallError(releases.pip_failed(done, f"pip could not install {how.target}"))


def _dry_run(how: InstallPlan, before: dict[str, releases.Installed]) -> list[dict[str, Any]]:
    """What pip would install (its `--dry-run --report`), every installed distribution held; refused (HeldBack)
    when that cannot be, when it would change one all the same, or when it would bring a console script of
    prime-lab's."""
    with tempfile.TemporaryDirectory(prefix="prime-lab-install-") as tmp:
        report = Path(tmp) / "report.json"
        command = how.command(held_constraints(how.project, before), report=report)
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise InstallError(releases.timed_out(command, PIP_TIMEOUT_S)) from None
        if done.returncode != 0:
            raise _refusal(how, done, before)
        items: list[dict[str, Any]] = json.loads(report.read_text(encoding="utf-8")).get("install", [])
        free = _free(before, how.project)
        for item in items:
            name, version = str(item["metadata"]["name"]), str(item["metadata"]["version"])
            was = before.get(canonical(name))
            if was is not None and was.version != version and canonical(name) not in free:
                users = releases.needed_by(before, name)
                raise HeldBack(how.project, [], f"pip would change {name} {was.version} to {version} beside prime-lab",
                               reason=f"it would change {name} {was.version} to {version}"
                                      + (f" (needed by {', '.join(users)})" if users else ""))
        _refuse_scripts(how, items, Path(tmp))
    return items


def _refuse_scripts(how: InstallPlan, items: list[dict[str, Any]], folder: Path) -> None:
    """HeldBack when a distribution pip would install declares a console script of prime-lab's (its wheel read;
    one from the package registry downloaded first, into pip's cache as well)."""
    ours = lab_scripts()
    remote = [str(item["download_info"]["url"]) for item in items
              if not str(item["download_info"]["url"]).startswith("file:")
              and urllib.parse.urlparse(str(item["download_info"]["url"])).path.endswith(".whl")]
    if remote:
        with contextlib.suppress(releases.ReleaseError):  # not read: the check after pip still guards
            releases._pip("download", "--no-deps", "-q", "-d", str(folder), *remote, timeout=PIP_TIMEOUT_S)
    for item in items:
        name, version = str(item["metadata"]["name"]), str(item["metadata"]["version"])
        if canonical(name) == canonical("prime-lab"):
            continue
        clash = sorted(set(ours) & (_scripts_of(item, folder) or set()))
        if clash:
            raise _script_clash(how.project, name, version, clash)


def _script_clash(project: str, name: str, version: str, scripts: list[str], taken: str = "") -> HeldBack:
    what = ", ".join(f"`{s}`" for s in scripts)
    brings = f"its console script {what}" if canonical(name) == canonical(project) else \
        f"it brings {name} {version}, whose console script {what}"
    reason = f"{brings} would replace prime-lab's"
    return HeldBack(project, [], f"{project} cannot go beside prime-lab: {reason}" + (f" ({taken})" if taken else ""),
                    reason=reason, remedy=f"Install it without {name}" if canonical(name) != canonical(project)
                    else "Rename its script")


def _undo(site: Beside, before: dict[str, releases.Installed], project: str, scripts: KeptScripts) -> str:
    """take_back_in beside prime-lab, prime-lab's scripts as they were."""
    words = take_back_in(site, before, project)
    restored = scripts.restore()
    return words + (f"; prime-lab's {', '.join(restored)} written again" if restored else "")


@dataclass(frozen=True)
class BesideInstall:
    """An install beside prime-lab that holds: what pip ran, the environments the package provides (`id`,
    `module`, `args` of each, imported in a fresh interpreter), and the `pip check` conflicts it brought."""

    plan: InstallPlan
    environments: list[dict[str, object]]
    conflicts: list[str] = field(default_factory=list)


def install_beside(target: Path, say: Callable[[str], None] | None = None,
                   also: tuple[str, ...] = ()) -> BesideInstall:
    """Install `target` beside prime-lab with pip, under the lock of prime-lab's environment: first a dry run with
    every installed distribution held (refused, HeldBack, when the package cannot have them, or would bring a
    console script of prime-lab's); then pip; then each environment the package provides imported as the next
    command will. Whatever fails after pip began is taken back (every distribution pip added or changed); what
    it added and changed is recorded for `uninstall`. `also`: requirements installed with it, held and taken back
    the same way (an Environments Hub release's url_dependencies). InstallError when pip fails or times out."""
    from prime_lab.envs.isolated import remove_record

    how = replace(plan(target), also=also)
    site = Beside()
    with site.locked():
        before = site.dists()
        scripts = KeptScripts.save()
        items = _dry_run(how, before)
        if say is not None:
            say(f"pip: installing {how.project or how.target} beside prime-lab ({len(items)} distribution(s); every "
                "installed one held at its version)")
        pins = [f"{canonical(str(i['metadata']['name']))}=={i['metadata']['version']}" for i in items
                if canonical(str(i["metadata"]["name"])) != canonical(how.project)]
        command = how.command(held_constraints(how.project, before, also=pins))
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise InstallError(releases.timed_out(command, PIP_TIMEOUT_S)
                               + f" (taken back: {_undo(site, before, how.project, scripts)})") from None
        if done.returncode != 0:
            raise InstallError(releases.pip_failed(done, f"pip could not install {how.target} (taken back: "
                                                         f"{_undo(site, before, how.project, scripts)})"))
        replaced = scripts.changed()
        if replaced:
            after = site.dists()
            who = next((d for n, d in after.items() if (n not in before or before[n].version != d.version)
                        and any(f.replace("\\", "/").endswith(tuple(f"bin/{s}" for s in replaced)) for f in d.files())),
                       None)
            taken = _undo(site, before, how.project, scripts)
            raise _script_clash(how.project, who.name if who else how.project, who.version if who else "", replaced,
                                f"taken back: {taken}")
        if not how.project:
            return BesideInstall(how, [])
        try:
            found = environments_of(how.project)
        except InstallError as exc:
            raise InstallError(f"{exc} (taken back: {_undo(site, before, how.project, scripts)})") from None
        if not found:
            raise InstallError(f"{how.project} provides no environment prime-lab can find (taken back: "
                               f"{_undo(site, before, how.project, scripts)}): declare an entry point in "
                               "[project.entry-points.\"prime_lab.environments\"] (NAME = \"module\"), or name its "
                               "module like the package and depend on verifiers or prime-lab")
        broken = [str(f["error"]) for f in found if "error" in f]
        if broken:
            taken = _undo(site, before, how.project, scripts)
            raise InstallError(f"{how.project} is not installed (taken back: {taken}): " + "; ".join(broken))
        after = site.dists()
        new = sorted(releases.conflicts(after) - releases.conflicts(before))
        if new and say is not None:
            say(f"pip check lists {len(new)} conflict(s) it did not before this install: " + " ".join(new))
        _remember(site, how.project, before, after)
        remove_record(how.project)  # beside prime-lab now: an earlier install at its own release no longer applies
        _say_host_code(how.target, [str(f["id"]) for f in found], say)
        return BesideInstall(how, found, new)


def own_release_for(target: Path, requested: str | None, held: HeldBack) -> ReleaseChoice:
    """Where a package that cannot go beside prime-lab goes instead: a release environment of its own, chosen as
    `choose_release` chooses (isolated); InstallError (one line: why not beside, why not there) when none will do."""
    name = held.project or str(target)
    if releases.declared_specifier(target) is None:
        raise InstallError(f"{name} is not installed: {held.words()}; it does not depend on verifiers, so no "
                           f"release environment of its own can take it. {held.remedy}")
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


def _say_host_code(target: Path, ids: list[str], say: Callable[[str], None] | None) -> None:
    """Say (a warning) where the installed package's own code runs model-written code on this machine, outside the
    sandbox (envs/host_code.py), unless PRIME_LAB_ALLOW_HOST_CODE accepts it."""
    from prime_lab.envs import host_code

    line = host_code.at_install(target, ids)
    if line is not None and callable(say):
        say(f"warning: {line}")


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
    from prime_lab.envs.v1 import taskset_marks
    from prime_lab.envs.verifiers_adapter import installed_release

    declared = releases.declared_specifier(target)
    marks = taskset_marks(target)
    if marks:
        return v1_choice(target, marks, declared, requested)
    beside = installed_release()
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
    wanted = releases.verifiers_uses(target)  # its imports, and its calls of verifiers classes with keywords
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
            ruled_out.append((str(version), f"{lacking[1]} ({lacking[0].at})"))
        if len(passing) >= MAX_TRIES:
            break
    if not passing:
        words = "; ".join(ReleaseChoice(None, (), "", tuple(ruled_out)).ruled_out_words())
        raise InstallError(f"{target} declares {said}, but every release it accepts lacks something it imports: "
                           f"{words}. Fix the import or the declaration, or install it with --verifiers VERSION")
    why = f"the newest release that satisfies {said} (declared)" + (" and has what it imports" if ruled_out else "")
    return ReleaseChoice(passing[0], tuple(passing), why, tuple(ruled_out))


def v1_choice(target: Path, marks: list[str], declared: str | None, requested: str | None) -> ReleaseChoice:
    """A verifiers v1 taskset runs at the tested v1 release (releases.V1_RELEASE), or at the one asked for within
    releases.V1_RANGE, in that release's own environment (driver_v1.py drives it)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    what = f"a verifiers v1 taskset ({marks[0]})"
    if requested is None:
        release, how = releases.V1_RELEASE, "the v1 release prime-lab is tested with"
    else:
        try:
            Version(requested)
        except InvalidVersion:
            raise InstallError(f"--verifiers {requested}: not a release (e.g. {releases.V1_RELEASE})") from None
        if not releases.v1_release(requested):
            raise InstallError(f"{target} is {what}: it runs at verifiers{releases.V1_RANGE} (e.g. "
                               f"{releases.V1_RELEASE}), not {requested}")
        release, how = requested, "asked for with --verifiers"
    outside = (f" (outside what it declares, verifiers{declared})" if declared and
               not SpecifierSet(declared).contains(release, prereleases=True) else "")
    return ReleaseChoice(release, (release,), f"{what}: verifiers {release}, {how}{outside}")


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


def install_isolated(target: Path, choice: ReleaseChoice, say: Any = None, also: tuple[str, ...] = ()) -> list[Any]:
    """Install `target` into the environment of the first of `choice.candidates` it imports under (stepping down
    on an import failure) and record it; the records. Each try runs under that release's lock, holds verifiers at
    the release, and is taken back when the package does not import or another environment recorded there no
    longer does; `also` (requirements installed with it) with it. Raises InstallError naming every release tried and
    what failed."""
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
            before = env.dists()
            try:
                done = env.pip("install", *(["-e"] if how.editable else []), str(how.target), *also)
            except releases.ReleaseError as exc:  # pip timed out: what it left is taken back
                raise InstallError(f"{exc} (taken back: {take_back_in(env, before, how.project)})") from None
            if done.returncode != 0:
                raise InstallError(releases.pip_failed(done, f"pip could not install {how.target} into verifiers "
                                                             f"{release}'s environment ({env.folder}; taken back: "
                                                             f"{take_back_in(env, before, how.project)})"))
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
                    undone = take_back_in(env, before, how.project)
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
                _remember(env, how.project, before, env.dists())
                _say_host_code(how.target, [record.name for record in found], say)
                return found
            take_back_in(env, before, how.project)
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
    also: str = ""  # what went or came back with it (what its install added, or changed), in words


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
    site = Beside()
    with site.locked():
        scripts = KeptScripts.save()
        try:
            words = _remove(site, env.distribution)
        except releases.ReleaseError as exc:  # pip timed out
            raise InstallError(str(exc)) from None
        finally:
            restored = scripts.restore()
    if restored:
        words.append(f"prime-lab's {', '.join(restored)} written again (the package had replaced it)")
    isolated.remove_record(env.distribution)  # a stale record of it at its own release goes too
    return Removal(ids, env.distribution, env.version, "beside prime-lab",
                   "it ran beside prime-lab: no release environment of its own" if release_env else "",
                   "; ".join(words))


def _uninstall_isolated(record: Any, release_env: bool) -> Removal:
    from prime_lab.envs import isolated

    env = releases.ReleaseEnv(record.release)
    folder = Path(record.python).parents[1]
    with env.locked():
        ids = tuple(sorted(r.name for r in isolated.records().values() if r.python == record.python
                           and canonical(r.distribution) == canonical(record.distribution)))
        words: list[str] = []
        if Path(record.python).is_file() and folder == env.folder:
            words = _remove(env, record.distribution, missing_ok=True)
        elif Path(record.python).is_file():
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
                   f"verifiers {record.release}'s own environment ({folder})", what, "; ".join(words))
