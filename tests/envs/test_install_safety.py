"""Installing an environment never breaks another, and can be undone: real pip, real packages built in the test.

Beside prime-lab, pip holds verifiers and prime-lab's own dependencies at their installed versions (a package that
pins another is sent to a release environment of its own, or refused); a module is found as the package spells it;
a failed install is taken back; `prime env uninstall` removes one. In a release's environment, installs run under
that release's lock, and one that breaks another environment recorded there is taken back.

A release's environment here is a real virtual environment made from prime-lab's base interpreter, with prime-lab's
pip on its path and a stand-in `verifiers` distribution (what `driver.py check` reads), so that nothing reaches the
package registry: pip runs with `--no-index` and a folder of wheels the test writes (PIP_NO_INDEX, PIP_FIND_LINKS).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import zipfile
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from prime_lab.envs import install, isolated, loader, releases
from prime_lab.envs.env_server import run_driver
from prime_lab.envs.installed import installed_environments, module_of, shipped_modules
from tests.envs.stub_wheels import env_module, wheel
from tests.support import cli
from tests.support.installed_envs import distribution

RELEASE = "0.1.12"
prime = partial(cli.prime, timeout=120)


# Packages, written as pip would find them -------------------------------------------------------------------------

def folder_package(folder: Path, name: str, dependencies: list[str], module: str, source: str) -> Path:
    """A package folder (setuptools, installed editable), as `prime env init` or the Hub leave one."""
    folder.mkdir(parents=True)
    deps = ", ".join(json.dumps(d) for d in dependencies)
    (folder / "pyproject.toml").write_text(textwrap.dedent(f"""
        [project]
        name = "{name}"
        version = "0.1.0"
        dependencies = [{deps}]

        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"
        """))
    (folder / f"{module}.py").write_text(source)
    return folder


@pytest.fixture
def wheels(tmp_path: Path) -> Path:
    """The folder pip finds packages in (the registry is out of reach), with stand-in verifiers releases."""
    folder = tmp_path / "wheels"
    for version in (RELEASE, "0.1.5"):
        wheel(folder, "verifiers", version, {"verifiers/__init__.py": f"__version__ = {version!r}\n"})
    return folder


@pytest.fixture
def pip_env(wheels: Path, tmp_path: Path) -> dict[str, str]:
    """What the `prime` subprocesses run with: releases under the test's folder, pip offline on `wheels`."""
    return {**os.environ, "PRIME_LAB_VERIFIERS_HOME": str(tmp_path / "releases"), "PIP_NO_INDEX": "1",
            "PIP_FIND_LINKS": str(wheels)}


@pytest.fixture
def release_env(pip_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> releases.ReleaseEnv:
    """verifiers RELEASE's environment, ready: a virtual environment from prime-lab's base interpreter, prime-lab's pip
    on its path (a .pth file), and the stand-in verifiers installed as pip leaves a distribution."""
    for name in ("PRIME_LAB_VERIFIERS_HOME", "PIP_NO_INDEX", "PIP_FIND_LINKS"):
        monkeypatch.setenv(name, pip_env[name])
    env = releases.ReleaseEnv(RELEASE)
    subprocess.run([releases._base_python(), "-m", "venv", "--without-pip", str(env.folder)], check=True)
    [site] = env.folder.glob("lib/python*/site-packages")
    link = tmp_path / "pip-link"
    link.mkdir()
    pip_spec = importlib.util.find_spec("pip")
    assert pip_spec is not None and pip_spec.submodule_search_locations
    (link / "pip").symlink_to(list(pip_spec.submodule_search_locations)[0])
    (site / "_prime_lab_tests_pip.pth").write_text(f"{link}\n")
    unpacked(env, next(Path(pip_env["PIP_FIND_LINKS"]).glob(f"verifiers-{RELEASE}-*.whl")))
    (env.folder / releases.READY).write_text(RELEASE + "\n")
    assert env.ready() and env.installed() == {"verifiers": RELEASE}
    return env


def unpacked(env: releases.ReleaseEnv, *wheels: Path) -> None:
    """`wheels` installed into `env` as pip leaves them (unpacked, INSTALLER written), without running pip."""
    [site] = env.folder.glob("lib/python*/site-packages")
    for path in wheels:
        with zipfile.ZipFile(path) as archive:
            archive.extractall(site)
            [info] = {name.split("/")[0] for name in archive.namelist() if ".dist-info/" in name}
        (site / info / "INSTALLER").write_text("pip\n")


def record(env: releases.ReleaseEnv, name: str, module: str, distribution: str,
           target: Path) -> isolated.IsolatedRecord:
    """What `prime env install` records for an environment installed into `env`."""
    found = isolated.IsolatedRecord(name=name, module=module, distribution=distribution, version="1.0",
                                    release=RELEASE, python=str(env.python), target=str(target), reason="test")
    isolated.save_record(found)
    return found


def imports(env: releases.ReleaseEnv, module: str) -> bool:
    return bool(run_driver(env.python, "check", module).get("ok"))


# Beside prime-lab: what is installed stays as it is ----------------------------------------------------------------

def test_held_requirements_pin_every_installed_distribution_at_its_installed_version() -> None:
    """Transitive ones too (tokenizers under transformers, tenacity under verifiers), and the dev tools."""
    held = install.held_requirements()
    for name in ("tomlkit", "msgspec", "tokenizers", "huggingface-hub", "ruff"):
        assert f"{name}=={importlib.metadata.version(name)}" in held
    if install.installed_version("verifiers") is not None:
        assert f"verifiers=={importlib.metadata.version('verifiers')}" in held
        assert f"tenacity=={importlib.metadata.version('tenacity')}" in held
    text = install.held_constraints().read_text()
    assert all(line in text.splitlines() for line in held)


def test_a_package_installed_again_may_change_only_itself_and_what_only_it_needs(tmp_path: Path) -> None:
    """plab-env needs plab-helper (only it) and plab-common (plab-keeper too): installed again, plab-env and
    plab-helper may change; plab-common and plab-keeper are held. A first install holds everything."""
    site = tmp_path / "site"
    distribution(site, "plab-env", "1.0", requires=("plab-helper==1.0", "plab-common"))
    distribution(site, "plab-helper", "1.0", requires=("plab-deep",))
    distribution(site, "plab-deep", "1.0")
    distribution(site, "plab-common", "1.0")
    distribution(site, "plab-keeper", "2.0", requires=("plab-common>=1", "plab-absent; extra == 'x'"))
    dists = releases.installed_dists([str(site)])
    assert install.held_requirements("plab_env", dists) == ["plab-common==1.0", "plab-keeper==2.0"]
    assert install.held_requirements("", dists) == ["plab-common==1.0", "plab-deep==1.0", "plab-env==1.0",
                                                    "plab-helper==1.0", "plab-keeper==2.0"]
    assert install.held_requirements("plab-keeper", dists) == ["plab-common==1.0", "plab-deep==1.0", "plab-env==1.0",
                                                               "plab-helper==1.0"]


def test_a_package_pinning_what_prime_lab_holds_is_refused_and_nothing_changes(
        tmp_path: Path, wheels: Path, pip_env: dict[str, str]) -> None:
    """It pins tomlkit (one of prime-lab's dependencies) to another version and does not use verifiers: refused in
    one line that names the conflict; tomlkit as it was, the package not installed."""
    wheel(wheels, "tomlkit", "0.12.0", {"tomlkit/__init__.py": ""})
    before = importlib.metadata.version("tomlkit")
    package = folder_package(tmp_path / "pins-tomlkit", "plab-pins-tomlkit", ["tomlkit==0.12.0"], "plab_pins_tomlkit",
                             env_module("pins tomlkit"))
    proc = prime("env", "install", str(package), env=pip_env)
    assert proc.returncode == 1, proc.stderr
    [error] = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert error.startswith(f"Error: plab-pins-tomlkit is not installed: it needs tomlkit==0.12.0, and prime-lab "
                            f"keeps tomlkit=={before} (installed, needed by ")
    assert "prime-lab" in error.split("needed by ", 1)[1].split(")")[0]
    assert error.endswith("); it does not depend on verifiers, so no release environment of its own can take it. "
                          "Loosen its pin")
    assert importlib.metadata.version("tomlkit") == before
    assert install.installed_version("plab-pins-tomlkit") is None


def test_a_package_pinning_an_older_verifiers_leaves_the_installed_one(tmp_path: Path, wheels: Path,
                                                                      pip_env: dict[str, str]) -> None:
    """The issue's truthfulqa: `verifiers==0.1.5`, installed with --verifiers set to the release installed here.
    pip would downgrade verifiers; held, it cannot, and the install is refused in one line."""
    installed = install.installed_version("verifiers")
    if installed is None:
        pytest.skip("verifiers is not installed beside prime-lab")
    package = folder_package(tmp_path / "truthfulqa", "plab-truthfulqa", ["verifiers==0.1.5"], "plab_truthfulqa",
                             env_module("pins an old verifiers", "import verifiers"))
    proc = prime("env", "install", str(package), "--verifiers", installed, env=pip_env)
    assert proc.returncode == 1, proc.stderr
    assert (f"Error: plab-truthfulqa is not installed: it needs verifiers==0.1.5, and prime-lab keeps "
            f"verifiers=={installed} (installed") in proc.stderr
    assert (f"); with --verifiers {installed} its own environment would hold the same release") in proc.stderr
    assert importlib.metadata.version("verifiers") == installed
    assert install.installed_version("plab-truthfulqa") is None


def test_a_package_held_back_beside_prime_lab_goes_to_a_release_environment_of_its_own(
        wheels: Path, pip_env: dict[str, str], release_env: releases.ReleaseEnv) -> None:
    """It accepts the verifiers installed here but pins tomlkit: not beside prime-lab (one line says why and where
    instead), into the newest release it accepts; prime-lab's tomlkit as it was."""
    wheel(wheels, "tomlkit", "0.12.0", {"tomlkit/__init__.py": "OLD = True\n"})
    target = wheel(wheels, "plab-held-env", "1.0", {"plab_held_env.py": env_module("held env", "import tomlkit")},
                   requires=("verifiers>=0.1.8", "tomlkit==0.12.0"))
    before = importlib.metadata.version("tomlkit")
    proc = prime("env", "install", str(target), env=pip_env)
    assert proc.returncode == 0, proc.stderr
    assert f"not beside prime-lab: it needs tomlkit==0.12.0, and prime-lab keeps tomlkit=={before} (installed, " \
        in proc.stderr
    assert (f"); into verifiers {RELEASE}'s own environment instead (the newest release that satisfies "
            "verifiers>=0.1.8 (declared))") in proc.stderr
    assert proc.stdout.split() == ["plab-held-env", "plab_held_env"]
    assert isolated.records()["plab-held-env"].release == RELEASE
    assert release_env.installed()["tomlkit"] == "0.12.0" and importlib.metadata.version("tomlkit") == before
    assert install.installed_version("plab-held-env") is None


# Module names as the package spells them ----------------------------------------------------------------------------

@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on sys.path holding installed distributions as pip leaves them; what they import is dropped after."""
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    importlib.invalidate_caches()
    before = set(sys.modules)
    yield folder
    for name in set(sys.modules) - before:
        if name.lower().startswith("uncertaintybench"):
            del sys.modules[name]


def unpack(site: Path, wheel_path: Path, pth: str = "") -> None:
    """`wheel_path` installed into `site` as pip installs it; with `pth`, as an editable install whose .pth file
    adds that folder instead of the module (hatchling's way)."""
    with zipfile.ZipFile(wheel_path) as archive:
        archive.extractall(site)
    if pth:
        [info] = site.glob(f"{wheel_path.name.split('-')[0]}-*.dist-info")
        modules = [p for p in site.glob("*.py")]
        for module in modules:
            Path(pth).mkdir(parents=True, exist_ok=True)
            module.rename(Path(pth) / module.name)
        name = f"_{info.name.split('-')[0]}.pth"
        (site / name).write_text(pth + "\n")
        (info / "RECORD").write_text(f"{name},,\n{info.name}/RECORD,,\n")
    importlib.invalidate_caches()


UNCERTAINTY = '''\
"""UncertaintyBench: its module spelt with capitals."""
from prime_lab.envs import Rubric, SingleTurnEnv


def load_environment(size: int = 2):
    return SingleTurnEnv(dataset=[{"question": "q", "answer": "a"}] * size, rubric=Rubric([lambda completion: 1.0]))
'''


@pytest.mark.parametrize("editable", [False, True])
def test_a_module_spelt_with_capitals_is_found_and_its_canonical_id_loads(site: Path, tmp_path: Path, editable: bool,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """`UncertaintyBench.py` in the distribution `uncertaintybench` (its RECORD; or an editable install's .pth
    folder): listed under the canonical id, and that id resolves, describes and loads the module."""
    built = wheel(tmp_path / "built", "uncertaintybench", "0.1.0", {"UncertaintyBench.py": UNCERTAINTY},
                  requires=("verifiers>=0.1.8",))
    unpack(site, built, pth=str(tmp_path / "src") if editable else "")
    if editable:  # what the .pth file does when an interpreter starts
        monkeypatch.syspath_prepend(str(tmp_path / "src"))
    dist = importlib.metadata.distribution("uncertaintybench")
    assert "UncertaintyBench" in shipped_modules(dist)
    assert module_of(dist, "uncertaintybench") == module_of(dist, "uncertainty-bench") == "UncertaintyBench"
    [found] = [e for e in installed_environments() if e.distribution == "uncertaintybench"]
    assert (found.name, found.module) == ("uncertaintybench", "UncertaintyBench")
    assert loader.resolve("uncertaintybench").module == "UncertaintyBench"
    info = loader.describe("uncertaintybench")
    assert (info.id, info.module, [a.name for a in info.args]) == ("uncertaintybench", "UncertaintyBench", ["size"])
    assert len(loader.load_environment("uncertaintybench", size=3).get_dataset()) == 3


def test_a_module_spelt_with_capitals_installs_into_a_release_environment(
        wheels: Path, pip_env: dict[str, str], release_env: releases.ReleaseEnv) -> None:
    target = wheel(wheels, "capsbench", "1.0", {"CapsBench.py": env_module("CapsBench.", "import verifiers")},
                   requires=(f"verifiers=={RELEASE}",))
    proc = prime("env", "install", str(target), "--verifiers", RELEASE, env=pip_env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["capsbench", "CapsBench"]
    found = isolated.records()["capsbench"]
    assert (found.module, found.summary) == ("CapsBench", "CapsBench.")
    assert isolated.record_for("capsbench") == found


# Taking an install back --------------------------------------------------------------------------------------------

def test_an_isolated_install_that_does_not_import_is_taken_back(wheels: Path, pip_env: dict[str, str],
                                                                release_env: releases.ReleaseEnv) -> None:
    """Its module fails at import: the distribution and the dependency it brought are uninstalled, nothing recorded,
    one line says why."""
    wheel(wheels, "plab-helper", "1.0", {"plab_helper.py": "OLD = 1\n"})
    target = wheel(wheels, "plab-broken", "1.0", {"plab_broken.py": env_module("broken", "import plab_helper\n"
                                                                                     "raise ImportError('no luck')")},
                   requires=(f"verifiers=={RELEASE}", "plab-helper==1.0"))
    proc = prime("env", "install", str(target), "--verifiers", RELEASE, env=pip_env)
    assert proc.returncode == 1, proc.stderr
    assert f"Error: plab-broken cannot import under any release it was tried with: {RELEASE}: ImportError: no luck" \
        in proc.stderr
    assert release_env.installed() == {"verifiers": RELEASE}
    assert isolated.records() == {}


def test_an_install_that_breaks_another_environment_of_its_release_is_taken_back(
        wheels: Path, pip_env: dict[str, str], release_env: releases.ReleaseEnv) -> None:
    """env-b needs plab-helper 2.0, which env-a (installed there before) cannot import from: pip upgrades it all the
    same; the check after the install names env-a in one line, and the install is taken back: env-b uninstalled,
    plab-helper 1.0 put back, env-b not recorded, env-a imports again."""
    wheel(wheels, "plab-helper", "1.0", {"plab_helper.py": "OLD = 1\n"})
    wheel(wheels, "plab-helper", "2.0", {"plab_helper.py": "NEW = 2\n"})
    env_a = wheel(wheels, "plab-env-a", "1.0", {"plab_env_a.py": env_module("a", "from plab_helper import OLD")},
                  requires=(f"verifiers=={RELEASE}", "plab-helper==1.0"))
    env_b = wheel(wheels, "plab-env-b", "1.0", {"plab_env_b.py": env_module("b", "from plab_helper import NEW")},
                  requires=(f"verifiers=={RELEASE}", "plab-helper==2.0"))
    unpacked(release_env, env_a, wheels / "plab_helper-1.0-py3-none-any.whl")
    record(release_env, "plab-env-a", "plab_env_a", "plab-env-a", env_a)
    proc = prime("env", "install", str(env_b), "--verifiers", RELEASE, env=pip_env)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Error: plab-env-b is not installed"))
    assert (f"installing it into verifiers {RELEASE}'s environment ({release_env.folder}) broke 1 environment(s) "
            "installed there; taken back (uninstalled plab-env-b; put back plab-helper 1.0)") in lines[start]
    assert lines[start + 1].startswith("  plab-env-a (plab-env-a): ImportError: cannot import name 'OLD' from "
                                       "'plab_helper'")
    assert release_env.installed() == {"verifiers": RELEASE, "plab-env-a": "1.0", "plab-helper": "1.0"}
    assert set(isolated.records()) == {"plab-env-a"}
    assert imports(release_env, "plab_env_a")


def test_a_failed_pip_in_a_release_environment_is_taken_back(wheels: Path, pip_env: dict[str, str],
                                                              release_env: releases.ReleaseEnv) -> None:
    """pip installs plab-helper, then fails on the package's own wheel (a file that would land outside the
    environment): plab-helper is uninstalled again, nothing recorded, one line says so."""
    wheel(wheels, "plab-helper", "1.0", {"plab_helper.py": "OLD = 1\n"})
    target = wheel(wheels, "plab-bad-wheel", "1.0", {"plab_bad_wheel.py": env_module("bad"), "../../escape.py": ""},
                   requires=(f"verifiers=={RELEASE}", "plab-helper==1.0"))
    proc = prime("env", "install", str(target), "--verifiers", RELEASE, env=pip_env)
    assert proc.returncode == 1, proc.stderr
    [error] = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert error.startswith(f"Error: pip could not install {target} into verifiers {RELEASE}'s environment "
                            f"({release_env.folder}; taken back: uninstalled plab-helper) (pip exit 1; "), error
    assert release_env.installed() == {"verifiers": RELEASE}
    assert isolated.records() == {}


def test_two_installs_at_once_into_one_release_are_both_recorded_and_both_import(
        wheels: Path, pip_env: dict[str, str], release_env: releases.ReleaseEnv) -> None:
    targets = [wheel(wheels, f"plab-twin-{i}", "1.0", {f"plab_twin_{i}.py": env_module(f"twin {i}")},
                     requires=(f"verifiers=={RELEASE}",)) for i in (1, 2)]
    procs = [subprocess.Popen([cli.PRIME, "env", "install", str(t), "--verifiers", RELEASE], env=pip_env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for t in targets]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in outs]
    assert {r.name for r in isolated.records().values()} == {"plab-twin-1", "plab-twin-2"}
    assert imports(release_env, "plab_twin_1") and imports(release_env, "plab_twin_2")


def test_a_release_lock_is_one_process_at_a_time_and_taken_again_inside(tmp_path: Path) -> None:
    """Two processes each hold RELEASE's lock for a while (taking it again inside): their spans never overlap."""
    spans = tmp_path / "spans"
    script = textwrap.dedent(f"""
        import os, sys, time
        from prime_lab.envs.releases import ReleaseEnv
        env = ReleaseEnv({RELEASE!r})
        with env.locked():
            start = time.monotonic()
            with env.locked():
                time.sleep(0.4)
            end = time.monotonic()
        with open({str(spans)!r}, "a") as out:
            out.write(f"{{start}} {{end}}\\n")
        """)
    env = {**os.environ, "PRIME_LAB_VERIFIERS_HOME": str(tmp_path / "releases")}
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env) for _ in range(2)]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    (a_start, a_end), (b_start, b_end) = sorted(tuple(map(float, line.split())) for line in
                                                spans.read_text().splitlines())
    assert a_end <= b_start


# pip's time-outs ----------------------------------------------------------------------------------------------------

def test_a_pip_time_out_is_one_line_with_the_command_to_rerun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from prime_lab.workbench.cli.app import main

    with pytest.raises(releases.ReleaseError, match=r"^pip did not finish within 0.01 s \(the package registry slow "
                                                    r"or out of reach\?\); rerun it to see where it stops: .+ -m pip "
                                                    r"index versions verifiers"):
        releases._pip("index", "versions", "verifiers", timeout=0.01)
    package = folder_package(tmp_path / "slow", "plab-slow", [], "plab_slow", env_module("slow"))
    monkeypatch.setattr(install, "PIP_TIMEOUT_S", 0.01)
    with pytest.raises(SystemExit) as exit_:
        main(["env", "install", str(package)])
    assert exit_.value.code == 1
    [error] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("Error:")]
    assert error.startswith("Error: pip did not finish within 0.01 s") and f"-e {package}" in error
    assert install.installed_version("plab-slow") is None


# prime env uninstall -----------------------------------------------------------------------------------------------

def test_uninstall_removes_an_isolated_environment_and_its_release_environment_when_unused(
        wheels: Path, pip_env: dict[str, str], release_env: releases.ReleaseEnv) -> None:
    targets = {name: wheel(wheels, name, "1.0", {f"{name.replace('-', '_')}.py": env_module(name)},
                           requires=(f"verifiers=={RELEASE}",)) for name in ("plab-one", "plab-two")}
    unpacked(release_env, *targets.values())
    for name, target in targets.items():
        record(release_env, name, name.replace("-", "_"), name, target)

    first = prime("env", "uninstall", "plab-one", "--release-env", env=pip_env)
    assert first.returncode == 0, first.stderr
    assert first.stdout.split() == ["plab-one"]
    assert (f"uninstalled plab-one 1.0 (verifiers {RELEASE}'s own environment ({release_env.folder})): plab-one no "
            "longer installed") in first.stderr
    assert f"kept {release_env.folder}: still used by plab-two" in first.stderr
    assert "plab-one" not in release_env.installed() and set(isolated.records()) == {"plab-two"}

    second = prime("env", "uninstall", "plab_two", "--release-env", env=pip_env)
    assert second.returncode == 0, second.stderr
    assert f"removed {release_env.folder}" in second.stderr
    assert not release_env.folder.exists() and isolated.records() == {}


def test_uninstall_refuses_an_unknown_id_and_a_builtin_in_one_line() -> None:
    unknown = prime("env", "uninstall", "no-such-env")
    assert unknown.returncode == 1
    assert unknown.stderr.strip() == "Error: no installed environment 'no-such-env' (`prime env list` shows the " \
                                     "installed ones)"
    builtin = prime("env", "uninstall", "primeintellect/gsm8k")
    assert builtin.returncode == 1
    assert builtin.stderr.strip() == "Error: 'primeintellect/gsm8k' is built into prime-lab: there is nothing to " \
                                     "uninstall"
    assert "uninstall" in prime("env", "--help").stdout


# Beside prime-lab, through its own interpreter's pip (slow: pip in prime-lab's environment) -------------------------

@pytest.mark.slow
def test_a_module_spelt_with_capitals_installs_beside_prime_lab_loads_and_uninstalls(
        tmp_path: Path, uninstall_after: list[str]) -> None:
    uninstall_after.append("uncertaintybench")
    package = folder_package(tmp_path / "UncertaintyBench", "uncertaintybench", ["prime-lab"], "UncertaintyBench",
                             UNCERTAINTY)
    proc = prime("env", "install", str(package))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["uncertaintybench", "UncertaintyBench"]
    listed = {e["id"]: e for e in json.loads(prime("env", "list", "-o", "json").stdout)}
    assert listed["uncertaintybench"]["module"] == "UncertaintyBench"
    gone = prime("env", "uninstall", "uncertaintybench")
    assert gone.returncode == 0, gone.stderr
    assert gone.stdout.split() == ["uncertaintybench"]
    assert "uncertaintybench" not in {e["id"] for e in json.loads(prime("env", "list", "-o", "json").stdout)}


@pytest.mark.slow
def test_an_install_beside_prime_lab_that_does_not_import_is_taken_back(tmp_path: Path,
                                                                       uninstall_after: list[str]) -> None:
    uninstall_after.append("plab-fails-import")
    package = folder_package(tmp_path / "fails", "plab-fails-import", ["prime-lab"], "plab_fails_import",
                             env_module("fails", "import plab_no_such_module"))
    proc = prime("env", "install", str(package))
    assert proc.returncode == 1, proc.stderr
    [error] = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert error.startswith("Error: plab-fails-import is not installed (taken back: uninstalled plab-fails-import): ")
    assert "No module named 'plab_no_such_module'" in error
    assert install.installed_version("plab-fails-import") is None
