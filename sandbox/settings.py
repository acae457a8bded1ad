"""A run's `[sandbox]` settings as its processes receive them: environment variables, read here with the standard
library only (a release environment's own interpreter reads them too, where prime-lab cannot be imported).

`sandbox/config.py` writes them from a config's `[sandbox]` table (the eval, GEPA and RL processes, before their
environments load); environment servers inherit them. Unset, each has the default a user who set nothing gets.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

PROVIDER = "PRIME_LAB_SANDBOX_PROVIDER"  # "local" (default) or "prime" (Prime's hosted service, untouched)
NETWORK = "PRIME_LAB_SANDBOX_NETWORK"  # "1": sandboxes reach the network; else closed
ISOLATION = "PRIME_LAB_SANDBOX_ISOLATION"  # "strong" (default: bubblewrap namespaces) or "weak" (rlimits only)
MEMORY_GB = "PRIME_LAB_SANDBOX_MEMORY_GB"  # every sandbox's memory limit, over what the environment asks for
TIMEOUT = "PRIME_LAB_SANDBOX_TIMEOUT"  # seconds a command may take when the environment gives no timeout
RUN_DIR = "PRIME_LAB_RUN_DIR"  # the run the sandboxes belong to (its reaper and `stop` end them)
VARIABLES = (PROVIDER, NETWORK, ISOLATION, MEMORY_GB, TIMEOUT, RUN_DIR)

LOCAL, PRIME = "local", "prime"
PROVIDERS = (LOCAL, PRIME)
ISOLATIONS = ("strong", "weak")
DEFAULT_TIMEOUT_S = 300.0  # prime_sandboxes' own default for execute_command


@dataclass(frozen=True)
class Settings:
    provider: str = LOCAL
    network: bool = False
    isolation: str = "strong"
    memory_gb: float | None = None  # None: what each request asks for
    timeout: float = DEFAULT_TIMEOUT_S
    run_dir: str | None = None

    def environ(self) -> dict[str, str]:
        """These settings as the variables a child process reads (`from_environ` gives them back)."""
        values = {PROVIDER: self.provider, NETWORK: "1" if self.network else "0", ISOLATION: self.isolation,
                  TIMEOUT: f"{self.timeout:g}"}
        if self.memory_gb is not None:
            values[MEMORY_GB] = f"{self.memory_gb:g}"
        if self.run_dir is not None:
            values[RUN_DIR] = self.run_dir
        return values


def _number(environ: Mapping[str, str], name: str) -> float | None:
    text = environ.get(name, "").strip()
    try:
        value = float(text) if text else None
    except ValueError:
        return None
    return value if value is not None and value > 0 else None


def from_environ(environ: Mapping[str, str] | None = None) -> Settings:
    """The settings the variables give (`os.environ` by default); a value that does not parse counts as unset."""
    env = os.environ if environ is None else environ
    provider = env.get(PROVIDER, "").strip().lower()
    isolation = env.get(ISOLATION, "").strip().lower()
    return Settings(provider=provider if provider in PROVIDERS else LOCAL,
                    network=env.get(NETWORK, "").strip().lower() in ("1", "true", "yes", "on"),
                    isolation=isolation if isolation in ISOLATIONS else "strong",
                    memory_gb=_number(env, MEMORY_GB), timeout=_number(env, TIMEOUT) or DEFAULT_TIMEOUT_S,
                    run_dir=env.get(RUN_DIR) or None)
