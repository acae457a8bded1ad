"""Secrets for environments: `env_file` entries, `ensure_keys`, and keeping values out of what we write."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

_LOADED: dict[str, str] = {}


class MissingKeyError(Exception):
    """An environment needs an API key (or other secret) that is not set."""


def load_env_files(paths: Iterable[str | Path], base: Path | None = None) -> dict[str, str]:
    """Read KEY=VALUE lines (comments, blank lines and `export ` allowed) into os.environ; returns what was set.

    Values already in the environment win, as with most dotenv loaders.
    """
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
            os.environ.setdefault(key, value)
    _LOADED.update(loaded)
    return loaded


def ensure_keys(keys: Iterable[str]) -> None:
    missing = [k for k in keys if not os.environ.get(k)]
    if missing:
        raise MissingKeyError(f"missing environment variable(s): {', '.join(missing)}. Set them in your shell or in "
                              "a file listed in the config's env_file (KEY=VALUE lines)")


def secret_values() -> list[str]:
    """Values that must never be written out: loaded from env files, or named like keys and tokens."""
    values = set(_LOADED.values())
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
