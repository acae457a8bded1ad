"""`import prime_sandboxes` gives prime-lab's local sandboxes (client.py) unless `[sandbox] provider = "prime"`:
an environment written for Prime's hosted sandboxes, directly or through verifiers' SandboxEnv, PythonEnv and their
threaded client, runs unmodified on this machine.

`install()` does it, in two places, before any environment is imported:
- this process: envs/loader.py calls it before it imports an environment's module;
- a release environment's own interpreter (which cannot import prime-lab): envs/driver.py loads this folder by
  path as a package of another name (`_prime_lab_sandbox`) and calls it. This module, settings.py and local.py
  import only the standard library; client.py imports prime_sandboxes, once that is being imported anyway.

How: prime_sandboxes' `SandboxClient` and `AsyncSandboxClient` are replaced in prime_sandboxes, in
prime_sandboxes.sandbox and in every module already loaded that bound them by name (verifiers' threaded client did
`from prime_sandboxes import AsyncSandboxClient` when it was imported). When prime_sandboxes is not imported yet
(it takes about 0.6 s), a finder on `sys.meta_path` does this right after its first import, so nothing is imported
for an environment that never asks. `CreateSandboxRequest` is replaced with either provider by one that also takes
`start_command` as a string (client.lenient_request): verifiers 0.3.1's SandboxEnv passes one, which
prime-sandboxes 0.5.1 refuses with a ValidationError. The provider comes from `PRIME_LAB_SANDBOX_PROVIDER`
(settings.py); "prime" puts prime_sandboxes' own clients back.
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

from . import settings

MODULE = "prime_sandboxes"
CLIENTS = ("SandboxClient", "AsyncSandboxClient")
REQUEST = "CreateSandboxRequest"
OURS = __name__.rpartition(".")[0]  # this folder's package: its modules keep their own names

_lock = threading.RLock()
_originals: dict[str, Any] = {}  # prime_sandboxes' own classes, by name
_applied: str | None = None  # the provider whose classes stand in prime_sandboxes now


def install(provider: str | None = None) -> str:
    """Make `import prime_sandboxes` give `provider`'s clients (default: the run's `[sandbox] provider`, local): now
    where it is imported, else right after its first import. Returns the provider."""
    chosen = provider or settings.from_environ().provider
    with _lock:
        module = sys.modules.get(MODULE)
        if module is not None and all(hasattr(module, n) for n in (*CLIENTS, REQUEST)):
            _apply(module, chosen)
        else:
            _finder().provider = chosen
    return chosen


def active() -> str | None:
    """The provider whose clients prime_sandboxes gives now (None: not imported since install)."""
    return _applied


def _apply(module: ModuleType, provider: str) -> None:
    global _applied
    if _applied == provider:
        return
    from . import client

    if not _originals:
        _originals.update({name: getattr(module, name) for name in (*CLIENTS, REQUEST)})
        _originals["lenient"] = client.lenient_request(_originals[REQUEST])
    wanted = {REQUEST: _originals["lenient"]}
    if provider == settings.LOCAL:
        wanted.update(SandboxClient=client.SandboxClient, AsyncSandboxClient=client.AsyncSandboxClient)
    else:
        wanted.update({name: _originals[name] for name in CLIENTS})
    _rebind(wanted)
    _applied = provider


def _ours(value: Any) -> bool:
    return str(getattr(value, "__module__", "") or "").startswith(f"{OURS}.")


def _rebind(wanted: dict[str, Any]) -> None:
    """Every loaded module's binding of these names to one of their versions (prime_sandboxes' or ours) now binds
    the wanted one; this folder's own modules keep theirs."""
    for module in list(sys.modules.values()):
        mapping = getattr(module, "__dict__", None)
        if not isinstance(mapping, dict) or str(getattr(module, "__name__", "")).startswith(OURS):
            continue
        for name, value in wanted.items():
            current = mapping.get(name)
            if current is not None and current is not value and (current is _originals.get(name) or _ours(current)
                                                                  or current is _originals["lenient"]):
                mapping[name] = value


def _finder() -> _Finder:
    for finder in sys.meta_path:
        if isinstance(finder, _Finder):
            return finder
    finder = _Finder()
    sys.meta_path.insert(0, finder)
    return finder


class _Finder(importlib.abc.MetaPathFinder):
    """Finds prime_sandboxes as the other finders do, with a loader that applies the provider after it runs."""

    provider = settings.LOCAL

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None,
                  ) -> ModuleSpec | None:
        if fullname != MODULE:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _Loader(spec.loader, self)
                return spec
        return None


class _Loader(importlib.abc.Loader):
    def __init__(self, loader: Any, finder: _Finder) -> None:
        self.loader, self.finder = loader, finder

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        create = getattr(self.loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        with _lock:
            try:
                _apply(module, self.finder.provider)
            except Exception as exc:  # noqa: BLE001 - an SDK of another shape: Prime's own clients, said once
                print(f"prime-lab sandbox: prime_sandboxes {getattr(module, '__version__', '')} could not be made "
                      f"local ({type(exc).__name__}: {exc}); its own clients stay", file=sys.stderr, flush=True)

    def __getattr__(self, name: str) -> Any:  # resources, get_source, ...: the real loader's
        return getattr(self.loader, name)
