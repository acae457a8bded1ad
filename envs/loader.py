"""Environment ids to environments: `owner/name` -> module `name` (dashes to underscores).

An installed environment comes first, being the user's intent: a `prime_lab.environments` entry point named `name`,
else an installed module `name` (`import name`, as verifiers does for Hub environments). prime-lab's built-in
(`prime_lab.envs.builtin.<name>`) is used when no installed environment has the name; an installed module that
does not mention `load_environment` (some unrelated package with the same name) does not hide a built-in.
`environments()` lists both, with what each id resolves to. Problems (no such environment, no `load_environment`,
an argument it does not take, a Hub dataset out of reach, a key it needs that is not set) raise
`EnvironmentLoadError` with a one-line message that names the id and what to do. Environments load with the Hub
offline unless it answered the command's probe or the user chose (`hub.py`). `import prime_sandboxes` in an
environment gives the local sandboxes unless `[sandbox] provider = "prime"` (sandbox/shim.py, installed before an
environment's module is imported).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import pkgutil
import sys
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any

from prime_lab.envs import hub, isolated, judges, verifiers_adapter  # the adapter never imports verifiers itself
from prime_lab.envs.arguments import EnvArg, EnvironmentLoadError, env_args
from prime_lab.envs.environment import Environment
from prime_lab.envs.installed import (
    ENTRY_POINT_GROUP,
    LOAD_FUNCTION,
    depends_on_verifiers,
    entry_point_for,
    installed_environments,
    looks_like_environment,
    module_name,
    read_signature,
)
from prime_lab.envs.secrets import missing_key_message
from prime_lab.sandbox import shim

# The built-in environments' package (`envs/builtin/`), found by name: its modules are imported when listed.
BUILTIN_PACKAGE = "prime_lab.envs.builtin"


INSTALLED, BUILTIN, ISOLATED = "installed", "built-in", "isolated"


@dataclass(frozen=True)
class Resolution:
    """Where an environment id leads: the module, its load function, and whether it is installed or built-in."""

    module: str
    function: str
    source: str


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def resolve(env_id: str) -> Resolution:
    """The module `env_id` loads (nothing is imported; the order is the module docstring's)."""
    name = module_name(env_id)
    record = isolated.record_for(env_id)
    if record is not None:
        return Resolution(record.module, LOAD_FUNCTION, ISOLATED)
    target = entry_point_for(env_id)
    if target is not None:
        return Resolution(target[0], target[1], INSTALLED)
    builtin = f"{BUILTIN_PACKAGE}.{name}"
    has_builtin = _importable(builtin)
    if _importable(name) and (not has_builtin or looks_like_environment(name)):
        return Resolution(name, LOAD_FUNCTION, INSTALLED)
    if has_builtin:
        return Resolution(builtin, LOAD_FUNCTION, BUILTIN)
    known = ", ".join(e.id for e in builtin_environments())
    owner, _, rest = env_id.partition("/")  # an Environments Hub id (envs_hub.py): owner/name
    how = (f"Install it from the Environments Hub (where there is a network): prime env install {env_id}; or fix "
           "the id (`prime env list` shows what is installed)" if owner and rest and "/" not in rest else
           "Install it (prime env install PATH; `prime env list` shows what is installed) or fix the id")
    raise EnvironmentLoadError(f"no environment '{env_id}': no installed package provides a module '{name}' or a "
                               f"'{ENTRY_POINT_GROUP}' entry point '{name.replace('_', '-')}', and there is no "
                               f"built-in '{name}'. Built-ins: {known}. {how}")


def _find_module(env_id: str) -> tuple[ModuleType, str]:
    """The environment's module, imported, and the name of its load function. Before it is imported,
    `import prime_sandboxes` is made to give the sandboxes `[sandbox] provider` names (local ones by default:
    sandbox/shim.py)."""
    where = resolve(env_id)
    shim.install()
    try:
        return importlib.import_module(where.module), where.function
    except Exception as exc:
        message = hub.failure_message(exc, env_id, {}) or missing_key_message(exc, env_id)
        release = ""
        if isinstance(exc, ImportError | AttributeError) and "verifiers" in str(exc):
            release = (f" ({verifiers_adapter.release_note(where.module)}; install it at the release it needs, in its "
                       "own environment: prime env install PATH [--verifiers VERSION])")
        raise EnvironmentLoadError(message or f"environment '{env_id}': importing module '{where.module}' failed: "
                                              f"{type(exc).__name__}: {exc}{release}") from exc


@dataclass(frozen=True)
class EnvInfo:
    id: str
    module: str
    doc: str
    args: tuple[EnvArg, ...]
    source: str = BUILTIN  # or INSTALLED
    distribution: str = ""  # an installed environment's distribution and version
    version: str = ""
    shadowed_by: str = ""  # a built-in whose ids load this installed environment instead
    release: str = ""  # the verifiers release it runs on ('' for prime-lab's own protocol)
    interpreter: str = ""  # the Python that runs it

    def where(self) -> str:
        """Where it comes from, in words: `installed: DIST VERSION`, `isolated: ...`, `built-in`, or a shadowed
        built-in."""
        if self.source in (INSTALLED, ISOLATED):
            return f"{self.source}: {self.distribution} {self.version}".rstrip()
        if self.shadowed_by:
            return f"built-in, shadowed: its ids load installed {self.shadowed_by}"
        return "built-in"


def _entry_point(env_id: str) -> tuple[ModuleType, Any]:
    """The environment's module and its `load_environment` function."""
    module, name = _find_module(env_id)
    func = getattr(module, name, None)
    if func is None or not callable(func):
        raise EnvironmentLoadError(f"environment '{env_id}': module '{module.__name__}' has no {name}() "
                                   f"function; define `def {name}(**args) -> Environment`")
    return module, func


def isolated_info(record: isolated.IsolatedRecord, env_id: str | None = None) -> EnvInfo:
    """An isolated environment as its install recorded it (nothing is imported here)."""
    return EnvInfo(env_id or record.name, record.module, record.summary, tuple(EnvArg(*a) for a in record.args),
                   ISOLATED, record.distribution, record.version, release=record.release, interpreter=record.python)


def describe(env_id: str) -> EnvInfo:
    """The environment `env_id` loads, imported, with its arguments."""
    record = isolated.record_for(env_id)
    if record is not None:
        return isolated_info(record, env_id)
    module, func = _entry_point(env_id)
    return EnvInfo(env_id, module.__name__, _first_paragraph(inspect.getdoc(module)), env_args(func),
                   source=resolve(env_id).source)


def _first_paragraph(doc: str | None) -> str:
    return " ".join((doc or "").split("\n\n")[0].split())


def load_environment(env_id: str, **args: Any) -> Environment:
    """Load an environment by id with `args` for its `load_environment(**args)`; the Hub is offline meanwhile
    unless the user chose (see hub.py)."""
    with hub.offline_unless_chosen():
        return _load(env_id, args)


def _load(env_id: str, args: dict[str, Any]) -> Environment:
    judge = judges.endpoint_from_environ()  # the run's judge, if it has one: the environment is wired to it
    record = isolated.record_for(env_id)
    if record is not None:  # in its own interpreter, at its own verifiers release
        known = {a[0] for a in record.args}
        unknown = sorted(set(args) - known)
        if unknown and not record.any_args:
            valid = ", ".join(a[0] if a[2] else f"{a[0]}={a[1]!r}" for a in record.args)
            raise EnvironmentLoadError(f"environment '{env_id}' does not take argument(s) {', '.join(unknown)}; "
                                       f"its arguments are: {valid}")
        wiring = judges.wire(record.args, args, judge) if judge is not None else None
        try:
            loaded: Environment = isolated.IsolatedEnvironment(record, env_id, wiring.args if wiring else args,
                                                               wiring.environ if wiring else None)
        except EnvironmentLoadError as exc:
            if judge is not None:
                raise
            raise EnvironmentLoadError(judges.local_judge_hint(str(exc), record.args)) from exc
        if wiring is not None and judge is not None:
            loaded.judge_wiring = wiring.describe(env_id, judge)
        return loaded
    _, func = _entry_point(env_id)
    params = inspect.signature(func).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        unknown = sorted(set(args) - set(params))
        if unknown:
            valid = ", ".join(f"{a.name}={a.default!r}" if not a.required else a.name for a in env_args(func))
            raise EnvironmentLoadError(f"environment '{env_id}' does not take argument(s) {', '.join(unknown)}; "
                                       f"its arguments are: {valid or '(none)'}")
    wiring = judges.wire(_with_defaults(func, {}), args, judge) if judge is not None else None
    if wiring is not None:
        args = wiring.args
    try:
        # a verifiers environment installs its own SIGINT/SIGTERM handlers when built (replacing a run's graceful
        # stop) and cannot be built off the main thread (the samples browser loads in a worker): keep ours
        with verifiers_adapter.kept_signal_handlers(), judges.environ_while_loading(wiring):
            env = func(**args)
    except EnvironmentLoadError:
        raise
    except Exception as exc:
        message = hub.failure_message(exc, env_id, _with_defaults(func, args)) or missing_key_message(exc, env_id)
        message = message or f"environment '{env_id}': load_environment({_fmt_args(args)}) raised " \
                             f"{type(exc).__name__}: {exc}"
        raise EnvironmentLoadError(message if judge is not None else
                                   judges.local_judge_hint(message, _with_defaults(func, {}))) from exc
    if not isinstance(env, Environment):
        if not verifiers_adapter.is_verifiers_environment(env):
            raise EnvironmentLoadError(f"environment '{env_id}': load_environment() returned {type(env).__name__}, "
                                       "not an Environment (prime-lab's or a verifiers one)")
        env = verifiers_adapter.wrap(env, env_id=env_id, load=func, load_args=args,
                                     reload=lambda **again: load_environment(env_id, **again))
    env.env_id = env_id
    if wiring is not None and judge is not None:
        env.judge_wiring = wiring.describe(env_id, judge)
    return env


def _fmt_args(args: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in args.items())


def _with_defaults(func: Any, args: dict[str, Any]) -> dict[str, Any]:
    """The load function's arguments for this call: its defaults, then `args`."""
    defaults = {a.name: a.default for a in env_args(func) if not a.required}
    return {**defaults, **args}


def builtin_environments() -> list[EnvInfo]:
    """The environments shipped in `envs/builtin/` (ids `primeintellect/<name>`), with their arguments."""
    spec = importlib.util.find_spec(BUILTIN_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return []
    infos: list[EnvInfo] = []
    for found in pkgutil.iter_modules(list(spec.submodule_search_locations)):
        if found.name.startswith("_"):
            continue
        module = importlib.import_module(f"{BUILTIN_PACKAGE}.{found.name}")
        infos.append(EnvInfo("primeintellect/" + found.name.replace("_", "-"), module.__name__,
                             _first_paragraph(inspect.getdoc(module)), env_args(module.load_environment)))
    return infos


def installed_environment_infos() -> list[EnvInfo]:
    """The installed environments: those at their own verifiers release (isolated.py), then those beside prime-lab
    (installed.py), described from their source without importing them (a package that re-exports
    `load_environment` from elsewhere is imported to read it)."""
    own = isolated.records()
    infos: list[EnvInfo] = [isolated_info(r) for r in own.values()]
    beside = verifiers_adapter.installed_release() or ""
    for env in installed_environments():
        if env.name in own:
            continue
        signature = read_signature(env.module, env.function)
        if signature is not None:
            doc = signature.doc or env.summary
            args = tuple(EnvArg(*a) for a in signature.args)
        else:
            try:
                described = describe(env.name)
                doc, args = described.doc or env.summary, described.args
            except Exception as exc:  # a broken package is listed with its problem, not left out
                doc, args = f"cannot be read: {type(exc).__name__}: {exc}", ()
        infos.append(EnvInfo(env.name, env.module, doc, args, INSTALLED, env.distribution, env.version,
                             release=beside if depends_on_verifiers(env.distribution) else "",
                             interpreter=sys.executable))
    return infos


def environments() -> list[EnvInfo]:
    """Installed and built-in environments; a built-in whose name an installed one takes says so (`shadowed_by`):
    its ids load the installed one."""
    installed = installed_environment_infos()
    infos = list(installed)
    for info in builtin_environments():
        where = resolve(info.id)
        if where.source in (INSTALLED, ISOLATED):
            by = next((i.id for i in installed if i.module == where.module), where.module)
            info = replace(info, shadowed_by=by)
        infos.append(info)
    return infos
