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
from urllib.parse import unquote, urlparse

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


def constraints_file() -> Path | None:
    """`constraints.txt` of the prime-lab checkout this interpreter runs (found through the install's
    direct_url.json, then through the source of `prime_lab`), or None when prime-lab was not installed from one."""
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
        if (root / "constraints.txt").is_file() and pyproject.is_file() and _project_name(pyproject) == "prime-lab":
            return root / "constraints.txt"
    return None


def _project_name(pyproject: Path) -> str:
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return ""
    return str(data.get("project", {}).get("name", ""))


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
        return InstallPlan(target, True, _project_name(pyproject) if pyproject.is_file() else "",
                           constraints_file(), not all(_installed(r) for r in requires))
    if target.is_file() and target.name.endswith(_ARCHIVES):
        project = target.name.split("-")[0].replace("_", "-") if target.suffix == ".whl" else ""
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
from prime_lab.lab.envs.hub import offline_unless_chosen
from prime_lab.lab.envs.loader import describe
from prime_lab.lab.envs.installed import canonical, installed_environments
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
