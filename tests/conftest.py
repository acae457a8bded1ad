"""Test-wide set-up: every test gets its own PRIME_LAB_HOME, so no test sees a user's runs or another test's.

Shared, expensive things (tiny model folders, running servers) are session fixtures in tests/plugins/, so one
server serves a whole test session.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest_plugins = ["tests.plugins.models", "tests.plugins.releases", "tests.plugins.scheduling", "tests.plugins.servers",
                  "tests.plugins.vllm"]


@pytest.fixture(autouse=True)
def lab_home(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory,
             monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty PRIME_LAB_HOME for this test (models materialised once per session live elsewhere)."""
    home = tmp_path / "prime-lab-home"
    home.mkdir()
    monkeypatch.setenv("PRIME_LAB_HOME", str(home))
    # Sandboxes' per-image pip environments (sandbox/local.py) are made once per machine, not once per test: in
    # ~/.cache, or where PRIME_LAB_SANDBOX_IMAGES already points; root's where uid 65534 reaches (/var/tmp).
    images = os.environ.get("PRIME_LAB_SANDBOX_IMAGES") or str(Path.home() / ".cache" / "prime-lab-test-sandbox-images")
    monkeypatch.setenv("PRIME_LAB_SANDBOX_IMAGES", images)
    # What prime-lab can compute again (runs/paths.py cache_dir: model outlines) is shared by the session's tests, as
    # a user's runs share ~/.cache/prime-lab (the xdist workers' run folder, or the session's temp folder)
    base = tmp_path_factory.getbasetemp()
    monkeypatch.setenv("PRIME_LAB_CACHE", str((base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base)
                                              / "prime-lab-cache"))
    yield home
    if (home / "sandboxes").is_dir():  # what a test (or a process it ran) left: root's live in a shared /var/tmp
        from prime_lab.sandbox import local

        monkeypatch.setenv("PRIME_LAB_SANDBOXES", str(home / "sandboxes"))
        for sandbox in local.list_sandboxes():
            sandbox.delete()


@pytest.fixture
def uninstall_after() -> Iterator[list[str]]:
    """Distribution names a test installs beside prime-lab (its own interpreter's pip): uninstalled after it."""
    names: list[str] = []
    yield names
    for name in names:
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "-q", "-y", name], timeout=300, check=False)
