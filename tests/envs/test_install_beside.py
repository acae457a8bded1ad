"""Installs beside prime-lab that cannot change what prime-lab runs on: real pip, offline, on wheels the test writes.

Each test runs `prime` in a virtual environment laid over prime-lab's (`lab`): its own site-packages first, then
prime-lab's environment as a site folder (its .pth files run), and its own `bin/prime`. There, prime-lab and all it
needs are installed (transformers, tokenizers, verifiers ...), exactly as beside prime-lab; but pip installs into
the layer's folder and never uninstalls outside it, so an install that goes wrong changes the layer, never the
environment the suite runs in. pip runs with `--no-index` and a folder of stub wheels (PIP_NO_INDEX,
PIP_FIND_LINKS).
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import os
import subprocess
import sys
import sysconfig
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from prime_lab.envs import install, releases
from tests.envs.stub_wheels import env_module, wheel

LAB_SITE = sysconfig.get_path("purelib")  # prime-lab's environment's site-packages


@dataclass(frozen=True)
class Lab:
    """A virtual environment laid over prime-lab's (the module docstring)."""

    folder: Path
    site: Path
    env: dict[str, str]

    @property
    def python(self) -> Path:
        return self.folder / "bin" / "python"

    @property
    def script(self) -> Path:
        return self.folder / "bin" / "prime"

    def prime(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([str(self.python), "-c", "from prime_lab.workbench.cli import main; main()", *args],
                              capture_output=True, text=True, env=self.env, timeout=timeout)
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([str(self.python), "-c", "from prime_lab.workbench.cli import main; main()", *args],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env)

    def installed(self) -> dict[str, str]:
        """What pip installed into the layer (canonical name -> version)."""
        return {name: dist.version for name, dist in releases.installed_dists([str(self.site)]).items()}

    def unpacked(self, *wheels: Path) -> None:
        """`wheels` installed into the layer as pip leaves them, without pip (a console script as pip writes it)."""
        for path in wheels:
            with zipfile.ZipFile(path) as archive:
                archive.extractall(self.site)
                [info] = {name.split("/")[0] for name in archive.namelist() if ".dist-info/" in name}
                points = archive.read(f"{info}/entry_points.txt").decode() if f"{info}/entry_points.txt" in \
                    archive.namelist() else ""
            (self.site / info / "INSTALLER").write_text("pip\n")
            for line in points.split("[console_scripts]", 1)[-1].splitlines() if points else []:
                name, _, value = line.partition("=")
                if value.strip():
                    module, _, function = value.strip().partition(":")
                    self.script.write_text(f"#!{self.python}\nimport sys\nfrom {module} import {function}\n"
                                           f"sys.exit({function}())\n")
                    with (self.site / info / "RECORD").open("a") as record:
                        record.write(f"../../../bin/{name.strip()},,\n")


@pytest.fixture
def wheels(tmp_path: Path) -> Path:
    folder = tmp_path / "wheels"
    folder.mkdir()
    return folder


@pytest.fixture
def lab(tmp_path: Path, wheels: Path) -> Iterator[Lab]:
    folder = tmp_path / "lab"
    subprocess.run([releases._base_python(), "-m", "venv", "--without-pip", str(folder)], check=True)
    [site] = folder.glob("lib/python*/site-packages")
    (site / "_prime_lab_layer.pth").write_text(f"import site; site.addsitedir({LAB_SITE!r})\n")
    layer = Lab(folder, site, {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)})
    layer.script.write_text((Path(sys.executable).parent / "prime").read_text().replace(
        f"#!{sys.executable}", f"#!{layer.python}", 1))
    layer.script.chmod(0o755)
    yield layer


def error_line(proc: subprocess.CompletedProcess[str]) -> str:
    [line] = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    return line


def test_an_install_that_would_downgrade_what_transformers_needs_is_refused_in_one_line_and_changes_nothing(
        lab: Lab, wheels: Path) -> None:
    """The environment (an entry point; it does not depend on prime-lab) needs plab-mid, which pins tokenizers
    0.21.0 (an older one, under the same name); prime-lab needs tokenizers through transformers. pip would
    downgrade it; refused before pip changes anything, in one line naming the package and both versions; nothing
    installed, `pip check` as it was."""
    installed = importlib.metadata.version("tokenizers")
    wheel(wheels, "tokenizers", "0.21.0", {"tokenizers/__init__.py": "OLD = True\n"})
    wheel(wheels, "plab-mid", "1.0", {"plab_mid.py": ""}, requires=("tokenizers==0.21.0",))
    target = wheel(wheels, "plab-old-tokenizers", "1.0", {"plab_old_tokenizers.py": env_module("old tokenizers")},
                   requires=("plab-mid",),
                   entry_points="[prime_lab.environments]\nold-tokenizers = plab_old_tokenizers\n")
    script = lab.script.read_bytes()
    conflicts = releases.conflicts(releases.installed_dists([str(lab.site), LAB_SITE]))  # as `pip check` lists them
    proc = lab.prime("env", "install", str(target))
    assert proc.returncode == 1, proc.stderr
    error = error_line(proc)
    assert error.startswith(f"Error: plab-old-tokenizers is not installed: it needs tokenizers==0.21.0 (for plab-mid "
                            f"1.0), and prime-lab keeps tokenizers=={installed} (installed, needed by "), error
    assert "transformers" in error.split("needed by ", 1)[1].split(")")[0]
    assert error.endswith("; it does not depend on verifiers, so no release environment of its own can take it. "
                          "Loosen its pin")
    assert lab.installed() == {} and lab.script.read_bytes() == script
    assert releases.conflicts(releases.installed_dists([str(lab.site), LAB_SITE])) == conflicts


def test_a_package_that_brings_a_prime_console_script_never_goes_beside_prime_lab(lab: Lab, wheels: Path) -> None:
    """It depends on `prime` (PyPI's CLI, whose console script is also `prime`): refused in one line before pip
    runs; prime-lab's `bin/prime` as it was, nothing installed."""
    wheel(wheels, "prime", "0.3.0", {"prime_cli.py": "def main():\n    print('not prime-lab')\n"},
          entry_points="[console_scripts]\nprime = prime_cli:main\n")
    target = wheel(wheels, "plab-brings-prime", "1.0", {"plab_brings_prime.py": env_module("brings prime")},
                   requires=("prime", "prime-lab"))
    script = lab.script.read_bytes()
    proc = lab.prime("env", "install", str(target))
    assert proc.returncode == 1, proc.stderr
    assert error_line(proc) == ("Error: plab-brings-prime is not installed: it brings prime 0.3.0, whose console "
                                "script `prime` would replace prime-lab's; it does not depend on verifiers, so no "
                                "release environment of its own can take it. Install it without prime")
    assert lab.installed() == {} and lab.script.read_bytes() == script


def test_a_take_back_restores_what_the_install_changed_and_uninstall_removes_what_it_added(
        lab: Lab, wheels: Path) -> None:
    """plab-env 1.0 brings plab-helper 1.0 and plab-common; plab-keeper (installed after it) needs plab-common too.
    plab-env 2.0 upgrades plab-helper to 2.0, adds plab-extra, and does not import: taken back whole (plab-extra
    uninstalled, plab-env and plab-helper 1.0 put back). `prime env uninstall plab-env` then takes plab-helper with
    it and keeps plab-common, which plab-keeper needs."""
    wheel(wheels, "plab-helper", "1.0", {"plab_helper.py": "OLD = 1\n"})
    wheel(wheels, "plab-helper", "2.0", {"plab_helper.py": "NEW = 2\n"})
    wheel(wheels, "plab-common", "1.0", {"plab_common.py": ""})
    wheel(wheels, "plab-extra", "1.0", {"plab_extra.py": ""})
    first = wheel(wheels, "plab-env", "1.0", {"plab_env.py": env_module("one", "from plab_helper import OLD")},
                  requires=("plab-helper==1.0", "plab-common", "prime-lab"))
    second = wheel(wheels / "next", "plab-env", "2.0", {"plab_env.py": env_module("two", "from plab_helper import NEW\n"
                                                                                       "raise ImportError('no luck')")},
                   requires=("plab-helper==2.0", "plab-extra", "plab-common", "prime-lab"))
    keeper = wheel(wheels / "by-hand", "plab-keeper", "1.0", {"plab_keeper.py": ""}, requires=("plab-common",))

    done = lab.prime("env", "install", str(first))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["plab-env", "plab_env"]
    assert "pip check" not in done.stderr  # no conflict it did not list before
    lab.unpacked(keeper)
    kept = {"plab-env": "1.0", "plab-helper": "1.0", "plab-common": "1.0", "plab-keeper": "1.0"}
    assert lab.installed() == kept

    failed = lab.prime("env", "install", str(second))
    assert failed.returncode == 1, failed.stderr
    assert error_line(failed) == ("Error: plab-env is not installed (taken back: uninstalled plab-extra; put back "
                                  "plab-env 1.0, plab-helper 1.0): environment 'plab-env': importing module 'plab_env' "
                                  "failed: ImportError: no luck")
    assert lab.installed() == kept

    gone = lab.prime("env", "uninstall", "plab-env")
    assert gone.returncode == 0, gone.stderr
    assert gone.stdout.split() == ["plab-env"]
    assert ("also uninstalled what its install added: plab-helper; kept plab-common (needed by plab-keeper)"
            in gone.stderr)
    assert lab.installed() == {"plab-common": "1.0", "plab-keeper": "1.0"}


def test_the_conflicts_read_before_and_after_an_install_are_what_pip_check_lists() -> None:
    """prime-lab's environment has some by design (torchvision and friends left out, mcp held for verifiers)."""
    listed = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True).stdout
    assert sorted(releases.conflicts(releases.installed_dists())) == sorted(listed.splitlines())


def blocked_on(lock: Path, pid: int) -> bool:
    """Whether process `pid` waits for a flock on `lock` (a `->` line of /proc/locks)."""
    inode = os.stat(lock).st_ino
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "->" in fields and fields[fields.index("->") + 1] == "FLOCK":
            at = fields.index("->")
            if fields[at + 4] == str(pid) and fields[at + 5].rsplit(":", 1)[-1] == str(inode):
                return True
    return False


def test_uninstall_waits_for_the_lock_and_never_deletes_prime_lab_s_script(lab: Lab, wheels: Path) -> None:
    """An environment installed before any of this replaced `bin/prime` with its own script. `prime env uninstall`
    waits while another install holds the lock of prime-lab's environment; then removes it, and prime-lab's
    `prime` is there after, prime-lab's own."""
    target = wheel(wheels, "plab-own-prime", "1.0", {"plab_own_prime.py": env_module("own prime") +
                                                     "def main():\n    print('not prime-lab')\n"},
                   requires=("prime-lab",), entry_points="[console_scripts]\nprime = plab_own_prime:main\n")
    lab.unpacked(target)
    assert b"plab_own_prime" in lab.script.read_bytes()
    lock = lab.folder / install.LOCK
    with lock.open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        proc = lab.popen("env", "uninstall", "plab-own-prime")
        deadline = time.monotonic() + 60
        while proc.poll() is None and not blocked_on(lock, proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        waited = proc.poll() is None and blocked_on(lock, proc.pid)
        fcntl.flock(held, fcntl.LOCK_UN)
    out, err = proc.communicate(timeout=120)
    assert waited, err
    assert proc.returncode == 0, err
    assert out.split() == ["plab-own-prime"]
    assert "prime-lab's prime written again (the package had replaced it)" in err
    assert lab.installed() == {}
    assert b"from prime_lab.workbench.cli import main" in lab.script.read_bytes()
    assert os.access(lab.script, os.X_OK)
