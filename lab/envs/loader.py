"""Environment ids to environments: `owner/name` -> module `name` (dashes to underscores).

The module is looked up among prime-lab's built-ins (`prime_lab.environments.<name>`) first, then among installed
packages (`import <name>`), as verifiers does for Hub environments. Problems (no such environment, no
`load_environment`, an argument it does not take) raise `EnvironmentLoadError` with a message that names the id and
what to do.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import pkgutil
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from prime_lab.lab.envs.environment import Environment

# The built-in environments' package (the `environments/` folder), found by name: lab sits below it in the layers.
BUILTIN_PACKAGE = "prime_lab.environments"


class EnvironmentLoadError(Exception):
    """The environment id cannot be loaded; the message says why and what to do."""


def module_name(env_id: str) -> str:
    return env_id.rsplit("/", 1)[-1].replace("-", "_").replace(".", "_")


def _find_module(env_id: str) -> ModuleType:
    name = module_name(env_id)
    for candidate in (f"{BUILTIN_PACKAGE}.{name}", name):
        try:
            spec = importlib.util.find_spec(candidate)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            continue
        try:
            return importlib.import_module(candidate)
        except Exception as exc:
            raise EnvironmentLoadError(f"environment '{env_id}': importing module '{candidate}' failed: "
                                       f"{type(exc).__name__}: {exc}") from exc
    known = ", ".join(e.id for e in builtin_environments())
    raise EnvironmentLoadError(f"no environment '{env_id}': looked for module '{BUILTIN_PACKAGE}.{name}' (built-in) "
                               f"and an installed package '{name}'. Built-ins: {known}. Install a package that "
                               f"provides '{name}' (pip install ...) or fix the id")


@dataclass(frozen=True)
class EnvArg:
    name: str
    default: Any
    required: bool
    annotation: str


@dataclass(frozen=True)
class EnvInfo:
    id: str
    module: str
    doc: str
    args: tuple[EnvArg, ...]


def env_args(func: Any) -> tuple[EnvArg, ...]:
    out: list[EnvArg] = []
    for p in inspect.signature(func).parameters.values():
        if p.kind in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL):
            continue
        annotation = p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__", "")
        out.append(EnvArg(p.name, None if p.default is inspect.Parameter.empty else p.default,
                          p.default is inspect.Parameter.empty, str(annotation)))
    return tuple(out)


def _entry_point(env_id: str) -> tuple[ModuleType, Any]:
    """The environment's module and its `load_environment` function."""
    module = _find_module(env_id)
    func = getattr(module, "load_environment", None)
    if func is None or not callable(func):
        raise EnvironmentLoadError(f"environment '{env_id}': module '{module.__name__}' has no load_environment() "
                                   "function; define `def load_environment(**args) -> Environment`")
    return module, func


def describe(env_id: str) -> EnvInfo:
    module, func = _entry_point(env_id)
    return EnvInfo(env_id, module.__name__, (inspect.getdoc(module) or "").split("\n\n")[0], env_args(func))


def load_environment(env_id: str, **args: Any) -> Environment:
    """Load an environment by id with `args` for its `load_environment(**args)`."""
    _, func = _entry_point(env_id)
    params = inspect.signature(func).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        unknown = sorted(set(args) - set(params))
        if unknown:
            valid = ", ".join(f"{a.name}={a.default!r}" if not a.required else a.name for a in env_args(func))
            raise EnvironmentLoadError(f"environment '{env_id}' does not take argument(s) {', '.join(unknown)}; "
                                       f"its arguments are: {valid or '(none)'}")
    try:
        env = func(**args)
    except EnvironmentLoadError:
        raise
    except Exception as exc:
        raise EnvironmentLoadError(f"environment '{env_id}': load_environment({_fmt_args(args)}) raised "
                                   f"{type(exc).__name__}: {exc}") from exc
    if not isinstance(env, Environment):
        raise EnvironmentLoadError(f"environment '{env_id}': load_environment() returned {type(env).__name__}, "
                                   "not an Environment")
    env.env_id = env_id
    return env


def _fmt_args(args: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in args.items())


def builtin_environments() -> list[EnvInfo]:
    """The environments shipped in `environments/` (ids `primeintellect/<name>`), with their arguments."""
    # Discovered by name like any plugin (lab sits below `environments` and does not import it statically).
    spec = importlib.util.find_spec(BUILTIN_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return []
    infos: list[EnvInfo] = []
    for module in pkgutil.iter_modules(list(spec.submodule_search_locations)):
        if module.name.startswith("_"):
            continue
        infos.append(describe("primeintellect/" + module.name.replace("_", "-")))
    return infos
