"""`prime secret`: global secrets (API keys and the like) that environments read from their environment variables,
stored on this machine (`envs/secret_store.py`); `prime env secret` (env.py) is one environment's, on these verbs.

A value is never printed: lists show names, scopes and times. Without `-v` the value is prompted for, hidden (from
a pipe, its first line is read), which keeps it out of the shell's history.
"""

from __future__ import annotations

import sys
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

import typer

from prime_lab.workbench.cli.common import OUTPUT_OPTION, OutputFormat, err, fail, print_json

if TYPE_CHECKING:
    from prime_lab.envs.secret_store import SecretStore

secret_app = typer.Typer(help="Global secrets: environment variables every environment's processes get.",
                         no_args_is_help=True)

NAME_HELP = "The variable's name: A-Z, then A-Z, 0-9 and _ (e.g. OPENAI_API_KEY)."
VALUE_HELP = "The value (omitted: prompted for, hidden, so it stays out of the shell's history)."
NAME_OPTION = typer.Option(..., "-n", "--name", help=NAME_HELP)
VALUE_OPTION = typer.Option(None, "-v", "--value", help=VALUE_HELP)
YES_OPTION = typer.Option(False, "-y", "--yes", help="Delete without asking.")


def _store() -> SecretStore:
    from prime_lab.envs.secret_store import SecretStore

    return SecretStore()


def read_value(value: str | None, name: str) -> str:
    """`value`, or one typed without echo at a terminal, or the first line of a piped stdin."""
    if value is not None:
        return value
    if not sys.stdin.isatty():
        return sys.stdin.readline().rstrip("\r\n")
    entered: str = typer.prompt(f"Value of {name}", hide_input=True)
    return entered


def list_secrets(env_id: str | None, output: OutputFormat, *, every_scope: bool = False) -> None:
    """The secrets of one scope (every scope with `every_scope`): names, scopes and times, never values."""
    from prime_lab.envs.secret_store import SecretError

    store = _store()
    try:
        secrets = store.all_secrets() if every_scope else store.secrets(env_id)
    except SecretError as exc:
        fail(str(exc))
    if output is OutputFormat.json:
        print_json([s.to_json() for s in secrets])
        return
    if not secrets:
        how = "prime secret create -n NAME" if env_id is None else f"prime env secret create {env_id} -n NAME"
        err(f"no secrets yet; add one with `{how}`")
        return
    from prime_lab.workbench.cli.render import print_table

    print_table(("NAME", "SCOPE", "CREATED", "UPDATED"),
                [(s.name, s.scope, s.created_at, s.updated_at) for s in secrets])


def create_secret(name: str, value: str | None, env_id: str | None) -> None:
    from prime_lab.envs.secret_store import SecretError, check_name

    try:
        check_name(name)
        if env_id is not None:
            _check_environment(env_id)
        secret = _store().create(name, read_value(value, name), env_id)
    except SecretError as exc:
        fail(str(exc))
    err(f"created {_words(secret.scope)} secret {name}: {_who(env_id)} get it as ${name}")


def update_secret(name: str, value: str | None, env_id: str | None) -> None:
    from prime_lab.envs.secret_store import SecretError

    store = _store()
    try:
        store.secret(name, env_id)  # there is one, before asking for a value
        secret = store.update(name, read_value(value, name), env_id)
    except SecretError as exc:
        fail(str(exc))
    err(f"updated {_words(secret.scope)} secret {name}")


def delete_secret(name: str, env_id: str | None, yes: bool) -> None:
    from prime_lab.envs.secret_store import SecretError

    store = _store()
    try:
        store.secret(name, env_id)  # there is one, before asking
        if not yes:
            typer.confirm(f"Delete {_words(env_id or 'global')} secret {name}?", abort=True)
        store.delete(name, env_id)
    except SecretError as exc:
        fail(str(exc))
    err(f"deleted {_words(env_id or 'global')} secret {name}")


def stored_secrets(env_ids: Sequence[str], *, set_elsewhere: Collection[str]) -> dict[str, str]:
    """The environment a run's processes get from the store for `env_ids` (empty when nothing is stored), less
    the names `set_elsewhere` (the shell, an env_file, -e: they win); the names are said on stderr."""
    from prime_lab.envs.secret_store import SecretError, secret_environment
    from prime_lab.envs.secrets import SECRET_NAMES_VARIABLE

    try:
        values = secret_environment(env_ids, set_elsewhere=set_elsewhere)
    except SecretError as exc:
        fail(str(exc))
    _announce([n for n in values if n != SECRET_NAMES_VARIABLE])
    return values


def inject_secrets(env_ids: Sequence[str]) -> None:
    """Set the stored secrets for `env_ids` in this process, for environments run in it (eval, GEPA); variables
    already set (the shell, --env-file) win."""
    from prime_lab.envs.secret_store import SecretError, apply_secrets

    try:
        _announce(apply_secrets(env_ids))
    except SecretError as exc:
        fail(str(exc))


def _announce(names: Sequence[str]) -> None:
    if names:
        err("stored secrets: " + " ".join(f"{name}=****" for name in names))


def _check_environment(env_id: str) -> None:
    """A typo in the environment's id fails here rather than leave a secret nothing reads."""
    from prime_lab.envs.loader import EnvironmentLoadError, resolve

    try:
        resolve(env_id)
    except EnvironmentLoadError as exc:
        fail(str(exc))


def _words(scope: str) -> str:
    return "global" if scope == "global" else f"environment {scope}'s"


def _who(env_id: str | None) -> str:
    return "every environment's processes" if env_id is None else f"{env_id}'s processes"


@secret_app.command("list")
def list_global(
    output: OutputFormat = OUTPUT_OPTION,
    every_scope: bool = typer.Option(False, "-a", "--all", help="Every environment's secrets too."),
) -> None:
    """The global secrets: names, scopes, created and updated times (never values)."""
    list_secrets(None, output, every_scope=every_scope)


@secret_app.command("create")
def create(name: str = NAME_OPTION, value: str | None = VALUE_OPTION) -> None:
    """Store a global secret; every environment's processes get it as an environment variable."""
    create_secret(name, value, None)


@secret_app.command("update")
def update(name: str = typer.Argument(..., help="The secret's name."), value: str | None = VALUE_OPTION) -> None:
    """Change a global secret's value."""
    update_secret(name, value, None)


@secret_app.command("delete")
def delete(name: str = typer.Argument(..., help="The secret's name."), yes: bool = YES_OPTION) -> None:
    """Delete a global secret (asks first unless -y)."""
    delete_secret(name, None, yes)
