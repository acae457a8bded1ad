"""Secrets on this machine, as Prime keeps them on its platform: global ones, and one environment's.

They live in one file, `$PRIME_LAB_HOME/secrets/secrets.json`, mode 0600 in a 0700 folder, written atomically with
its mode set before the content lands; a store that others can read is refused (the message gives the chmod).

A secret's value leaves the store two ways: as an environment variable of the processes that run environments
(`secret_environment` for a child's environment, `apply_secrets` for this process), and as a token prime-lab sends
itself (`variable_or_secret`: the Hubs'). Never in a run folder, an
event, W&B or a log line; `envs.secrets.redact` knows the injected names (`SECRET_NAMES_VARIABLE`), so what it
cleans (evaluation results) shows `***` where a value was. Precedence, the later winning: global secrets, then the
environment's own, then whatever is set elsewhere (the shell, an env_file, `-e`), which a secret never replaces.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
from collections.abc import Collection, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prime_lab.envs.installed import module_name
from prime_lab.envs.secrets import NAME_PATTERN, SECRET_NAMES_VARIABLE, secret_command
from prime_lab.runs.atomic import write_text_atomic
from prime_lab.runs.paths import lab_home

NAME_RULE = "an upper-case letter, then upper-case letters, digits and underscores (^[A-Z][A-Z0-9_]*$)"
GLOBAL = "global"
FILE_MODE, FOLDER_MODE = 0o600, 0o700


class SecretError(Exception):
    """A secret that cannot be stored, found or read; the message says what to do."""


@dataclass(frozen=True)
class Secret:
    name: str
    scope: str  # "global", or the environment id it belongs to
    created_at: str
    updated_at: str
    value: str = field(repr=False)

    def to_json(self) -> dict[str, str]:
        """What may be shown: everything but the value."""
        return {"name": self.name, "scope": self.scope, "created_at": self.created_at, "updated_at": self.updated_at}


def store_path() -> Path:
    return lab_home() / "secrets" / "secrets.json"


def check_name(name: str) -> str:
    if not NAME_PATTERN.match(name):
        raise SecretError(f"invalid secret name {name!r}: a name is {NAME_RULE}, e.g. OPENAI_API_KEY")
    return name


def env_key(env_id: str) -> str:
    """The environment an id names, whichever spelling (`owner/my-env`, `my-env`, `my_env`): its module's name."""
    return module_name(env_id.strip())


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class SecretStore:
    """The store's file; each call reads it afresh (other `prime` commands may have changed it)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or store_path()

    def secrets(self, env_id: str | None = None) -> list[Secret]:
        """The global secrets (env_id None), or one environment's own; sorted by name."""
        return self._scoped(self._read(), env_id)

    def secret(self, name: str, env_id: str | None = None) -> Secret:
        """One secret of a scope; SecretError, naming the command that creates it, when there is none."""
        found = next((s for s in self.secrets(env_id) if s.name == name), None)
        if found is None:
            raise self._missing(name, env_id)
        return found

    def all_secrets(self) -> list[Secret]:
        """The global secrets, then each environment's (environments sorted by id)."""
        data = self._read()
        out = self._scoped(data, None)
        for entry in sorted(data["environments"].values(), key=lambda e: str(e["id"])):
            out += self._scoped(data, str(entry["id"]))
        return out

    def create(self, name: str, value: str, env_id: str | None = None) -> Secret:
        check_name(name)
        _check_value(value)
        with self._changing() as data:
            table = self._table(data, env_id, create=True)
            if name in table:
                raise SecretError(f"{_scope_words(env_id)} secret {name} already exists; change it with "
                                  f"`{secret_command('update', name, env_id)}`")
            now = _now()
            table[name] = {"value": value, "created_at": now, "updated_at": now}
        return self._secret(name, table[name], env_id)

    def update(self, name: str, value: str, env_id: str | None = None) -> Secret:
        _check_value(value)
        with self._changing() as data:
            table = self._table(data, env_id, create=False)
            if name not in table:
                raise self._missing(name, env_id)
            table[name] = {**table[name], "value": value, "updated_at": _now()}
        return self._secret(name, table[name], env_id)

    def delete(self, name: str, env_id: str | None = None) -> None:
        with self._changing() as data:
            table = self._table(data, env_id, create=False)
            if name not in table:
                raise self._missing(name, env_id)
            del table[name]
            if env_id is not None and not table:
                del data["environments"][env_key(env_id)]

    def values_for(self, env_ids: Iterable[str]) -> dict[str, str]:
        """The variables the processes running `env_ids` get: the global secrets, then each environment's own
        (an environment's secret replaces a global one of the same name; between environments the later wins)."""
        data = self._read()
        out = {s.name: s.value for s in self._scoped(data, None)}
        for env_id in env_ids:
            out.update({s.name: s.value for s in self._scoped(data, env_id)})
        return out

    # --- the file

    def _read(self) -> dict[str, Any]:
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return {"global": {}, "environments": {}}
        except OSError as exc:
            raise SecretError(f"the secrets store {self.path} cannot be read: {exc.strerror or exc}") from None
        with os.fdopen(fd) as fh:
            mode = stat.S_IMODE(os.fstat(fd).st_mode)
            if mode & 0o077:
                raise SecretError(f"the secrets store {self.path} can be read by others (mode {mode:04o}); "
                                  f"make it yours alone: chmod 600 {self.path}")
            text = fh.read()
        try:
            data = json.loads(text)
            if not isinstance(data.get("global"), dict) or not isinstance(data.get("environments"), dict):
                raise ValueError("expected the keys 'global' and 'environments'")
        except (ValueError, AttributeError) as exc:
            raise SecretError(f"the secrets store {self.path} is not a store prime-lab wrote: {exc}") from None
        return data

    @contextmanager
    def _changing(self) -> Iterator[dict[str, Any]]:
        """The store's data to change, written back atomically when the block ends; one change at a time."""
        folder = self.path.parent
        folder.mkdir(mode=FOLDER_MODE, parents=True, exist_ok=True)
        os.chmod(folder, FOLDER_MODE)
        with os.fdopen(os.open(folder / ".lock", os.O_RDWR | os.O_CREAT, FILE_MODE)) as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            data = self._read()
            yield data
            write_text_atomic(self.path, json.dumps(data, indent=2, sort_keys=True) + "\n", durable=True,
                              mode=FILE_MODE)

    # --- tables

    @staticmethod
    def _table(data: dict[str, Any], env_id: str | None, *, create: bool) -> dict[str, Any]:
        if env_id is None:
            table: dict[str, Any] = data["global"]
            return table
        key = env_key(env_id)
        if key not in data["environments"]:
            if not create:
                return {}
            data["environments"][key] = {"id": env_id, "secrets": {}}
        secrets: dict[str, Any] = data["environments"][key]["secrets"]
        return secrets

    def _scoped(self, data: dict[str, Any], env_id: str | None) -> list[Secret]:
        if env_id is None:
            return [self._secret(n, v, None) for n, v in sorted(data["global"].items())]
        entry = data["environments"].get(env_key(env_id))
        if entry is None:
            return []
        return [self._secret(n, v, str(entry["id"])) for n, v in sorted(entry["secrets"].items())]

    @staticmethod
    def _secret(name: str, entry: dict[str, Any], env_id: str | None) -> Secret:
        return Secret(name, GLOBAL if env_id is None else env_id, str(entry.get("created_at", "")),
                      str(entry.get("updated_at", "")), str(entry["value"]))

    @staticmethod
    def _missing(name: str, env_id: str | None) -> SecretError:
        listing = "prime secret list" if env_id is None else f"prime env secret list {env_id}"
        return SecretError(f"no {_scope_words(env_id)} secret {name} (`{listing}` shows them); create it with "
                           f"`{secret_command('create', name, env_id)}`")


def _check_value(value: str) -> None:
    if not value:
        raise SecretError("a secret's value cannot be empty")
    if "\n" in value or "\r" in value or "\0" in value:
        raise SecretError("a secret's value is one line (no newline or NUL characters)")


def _scope_words(env_id: str | None) -> str:
    return "global" if env_id is None else f"environment {env_id}'s"


def secret_environment(env_ids: Iterable[str], *, set_elsewhere: Collection[str] = (),
                       store: SecretStore | None = None) -> dict[str, str]:
    """The stored secrets a child process running `env_ids` gets, less the names set elsewhere (the shell, an
    env_file, -e), which win; with them, `SECRET_NAMES_VARIABLE` naming them for redaction. Empty when none."""
    values = {k: v for k, v in (store or SecretStore()).values_for(env_ids).items() if k not in set_elsewhere}
    if not values:
        return {}
    return {**values, SECRET_NAMES_VARIABLE: _names(values)}


def variable_or_secret(name: str) -> str | None:
    """`name` from this process's environment, else the global secret of that name, else None (an unreadable store
    counts as none): a token prime-lab sends itself, the Hugging Face Hub's or the Environments Hub's."""
    if os.environ.get(name):
        return os.environ[name]
    try:
        return SecretStore().values_for([]).get(name) or None
    except (SecretError, OSError, ValueError):
        return None


def apply_secrets(env_ids: Iterable[str], *, store: SecretStore | None = None) -> list[str]:
    """Set the stored secrets for `env_ids` in this process's environment (for environments run in-process, as
    `prime eval run` and `prime gepa run` do), leaving any variable already set alone; returns the names set."""
    values = secret_environment(env_ids, set_elsewhere={k for k, v in os.environ.items() if v}, store=store)
    names = [k for k in values if k != SECRET_NAMES_VARIABLE]
    for name in names:
        os.environ[name] = values[name]
    if names:
        os.environ[SECRET_NAMES_VARIABLE] = _names(names)
    return names


def _names(names: Iterable[str]) -> str:
    known = [n for n in os.environ.get(SECRET_NAMES_VARIABLE, "").split(",") if n]
    return ",".join(sorted({*known, *names}))
