"""What the environment loader and the verifiers adapter share: the load error and a load function's arguments.

Its own module, so that the adapter needs nothing from the loader (which decides whether an environment is a
verifiers one and hands it over), and no import goes in a circle.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any


class EnvironmentLoadError(Exception):
    """The environment id cannot be loaded; the message says why and what to do."""


@dataclass(frozen=True)
class EnvArg:
    name: str
    default: Any
    required: bool
    annotation: str


def env_args(func: Any) -> tuple[EnvArg, ...]:
    out: list[EnvArg] = []
    for p in inspect.signature(func).parameters.values():
        if p.kind in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL):
            continue
        annotation = p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__", "")
        out.append(EnvArg(p.name, None if p.default is inspect.Parameter.empty else p.default,
                          p.default is inspect.Parameter.empty, str(annotation)))
    return tuple(out)
