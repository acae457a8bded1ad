"""Session fixture: where verifiers releases' virtual environments live for a test session.

- `releases_home`: one folder per test run, shared by the xdist workers (their session temp folders' parent), or
  `$PRIME_LAB_VERIFIERS_HOME` when the environment names one, so that a developer's runs reuse what earlier ones
  created. Each release's environment is created there once, with pip from the package registry (about 40 s), by
  the first `prime env install` that needs it; two workers asking at once wait on the release's lock
  (`ReleaseEnv.locked`), and the second finds it made.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def releases_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("PRIME_LAB_VERIFIERS_HOME")
    if given:
        return Path(given)
    if os.environ.get("PYTEST_XDIST_WORKER"):  # basetemp is <run>/popen-gwN: the run's folder is the workers' own
        shared = tmp_path_factory.getbasetemp().parent / "verifiers-releases"
        shared.mkdir(exist_ok=True)
        return shared
    return tmp_path_factory.mktemp("verifiers-releases")
