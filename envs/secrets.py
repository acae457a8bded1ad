"""Secrets for environments: `env_file` entries, `ensure_keys`, the message for a missing key, and keeping values
out of what we write. The stored secrets (`prime secret`) are `envs/secret_store.py`."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

_LOADED: dict[str, str] = {}

NAME_PATTERN = re.compile(r"^[A-Z][A-Z0-9_]*$")  # Prime's rule for a secret's name
# The names of the stored secrets set in a process's environment (names only), so `redact` knows their values there.
SECRET_NAMES_VARIABLE = "PRIME_LAB_SECRET_NAMES"


class MissingKeyError(Exception):
    """An environment needs an API key (or other secret) that is not set; `keys` names them."""

    def __init__(self, message: str, keys: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.keys = list(keys)


def read_env_files(paths: Iterable[str | Path], base: Path | None = None) -> dict[str, str]:
    """The KEY=VALUE lines of env files (comments, blank lines and `export ` allowed), the later file winning."""
    loaded: dict[str, str] = {}
    for entry in paths:
        path = Path(entry)
        if base is not None and not path.is_absolute():
            path = base / path
        try:
            lines = path.read_text().splitlines()
        except OSError as exc:
            raise MissingKeyError(f"env_file {path} cannot be read: {exc.strerror or exc}") from None
        for number, line in enumerate(lines, start=1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            line = line.removeprefix("export ").strip()
            if "=" not in line:
                raise MissingKeyError(f"{path}:{number}: expected KEY=VALUE")
            key, value = line.split("=", 1)
            key, value = key.strip(), value.strip().strip("'\"")
            loaded[key] = value
    return loaded


def load_env_files(paths: Iterable[str | Path], base: Path | None = None) -> dict[str, str]:
    """Read env files (`read_env_files`) into os.environ; returns what they hold.

    Values already in the environment win, as with most dotenv loaders.
    """
    loaded = read_env_files(paths, base)
    for key, value in loaded.items():
        os.environ.setdefault(key, value)
    _LOADED.update(loaded)
    return loaded


def ensure_keys(keys: Iterable[str]) -> None:
    """Fail at once, naming them, when any of `keys` is unset or empty (verifiers' `vf.ensure_keys`)."""
    missing = [k for k in keys if not os.environ.get(k)]
    if missing:
        raise MissingKeyError(f"missing environment variable(s): {', '.join(missing)}. Store them with `prime "
                              "secret create -n NAME`, set them in your shell, or in a file listed in the config's "
                              "env_file (KEY=VALUE lines)", missing)


def secret_command(verb: str, name: str, env_id: str | None = None) -> str:
    """The `prime` command that does `verb` (create, update, delete) to a global secret or to `env_id`'s."""
    group, where = ("prime secret", "") if env_id is None else ("prime env secret", f" {env_id}")
    return f"{group} {verb}{where} " + (f"-n {name}" if verb == "create" else name)


def missing_keys(exc: BaseException) -> list[str]:
    """The keys a MissingKeyError (ours or verifiers') in `exc`'s chain names; [] when there is none."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        keys = getattr(current, "keys", None)
        if type(current).__name__ == "MissingKeyError" and isinstance(keys, list) and keys \
                and all(isinstance(k, str) for k in keys):
            return keys
        current = current.__cause__ or current.__context__
    return []


def missing_key_message(exc: BaseException, env_id: str) -> str | None:
    """A one-line message for an environment that asked for keys that are not set, naming them and the commands
    that store them (None when `exc` is something else)."""
    keys = missing_keys(exc)
    if not keys:
        return None
    named = ", ".join(keys)
    storable = [k for k in keys if NAME_PATTERN.match(k)]
    elsewhere = "export it in your shell or put it in an env_file" if len(keys) == 1 else \
        "export them in your shell or put them in an env_file"
    if not storable:
        return f"environment '{env_id}' needs {named}, not set: {elsewhere}"
    stores = " and ".join(f"`{secret_command('create', k)}`" for k in storable)
    first = storable[0]
    return (f"environment '{env_id}' needs {named}, not set: store {'it' if len(storable) == 1 else 'them'} with "
            f"{stores} (for every environment) or `{secret_command('create', first, env_id)}` (for this one"
            f"{'' if len(storable) == 1 else ', one name at a time'}), or {elsewhere}")


def secret_values() -> list[str]:
    """Values that must never be written out: loaded from env files, the stored secrets set in this process's
    environment (`SECRET_NAMES_VARIABLE`), or named like keys and tokens."""
    values = set(_LOADED.values())
    for name in os.environ.get(SECRET_NAMES_VARIABLE, "").split(","):
        if os.environ.get(name):
            values.add(os.environ[name])
    for key, value in os.environ.items():
        if any(word in key.upper() for word in ("KEY", "TOKEN", "SECRET", "PASSWORD")) and len(value) >= 6:
            values.add(value)
    return sorted((v for v in values if len(v) >= 6), key=len, reverse=True)


def redact(obj: Any, secrets: list[str] | None = None) -> Any:
    """A copy of `obj` (str / list / dict) with every secret value replaced by `***`."""
    secrets = secret_values() if secrets is None else secrets
    if not secrets:
        return obj
    if isinstance(obj, str):
        for secret in secrets:
            obj = obj.replace(secret, "***")
        return obj
    if isinstance(obj, list):
        return [redact(v, secrets) for v in obj]
    if isinstance(obj, dict):
        return {k: redact(v, secrets) for k, v in obj.items()}
    return obj
