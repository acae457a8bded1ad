"""Session fixture: where verifiers releases' virtual environments live for a test session.

- `releases_home`: one folder per session (or `$PRIME_LAB_VERIFIERS_HOME` when the environment names one, so that a
  developer's runs reuse what earlier ones created). Each release's environment is created there once, with pip from
  the package registry (about 40 s), by the first `prime env install` that needs it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def releases_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("PRIME_LAB_VERIFIERS_HOME")
    return Path(given) if given else tmp_path_factory.mktemp("verifiers-releases")
