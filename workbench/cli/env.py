"""`prime env`: the environments this machine can run (installed and built-in), new ones, installing and
uninstalling them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from prime_lab.workbench.cli import secret
from prime_lab.workbench.cli.common import OUTPUT_OPTION, OutputFormat, err, fail, print_json
from prime_lab.workbench.cli.render import print_table

if TYPE_CHECKING:
    from prime_lab.envs.install import ReleaseChoice

env_app = typer.Typer(help="Environments: list, create, install and uninstall them.", no_args_is_help=True)


DESCRIPTION_CHARS = 72  # a failing import's message is long: one line in the table, all of it with -v or -o json


def short_description(text: str, limit: int = DESCRIPTION_CHARS) -> str:
    """The first line of `text`, cut to `limit` characters (an ellipsis says something was left out)."""
    lines = text.strip().splitlines() or [""]
    line = lines[0]
    if len(line) > limit:
        return line[:limit - 1].rstrip() + "…"
    return line + ("…" if len(lines) > 1 else "")


@env_app.command("list")
def list_envs(
    output: OutputFormat = OUTPUT_OPTION,
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Whole descriptions (a failing import's message)."),
) -> None:
    """Installed and built-in environments, each with its load_environment() arguments and defaults.

    An installed environment takes precedence over a built-in of the same name: the built-in's row says so."""
    from rich.table import Column

    from prime_lab.envs.loader import environments

    infos = environments()
    if output is OutputFormat.json:
        print_json([{"id": i.id, "source": i.source, "module": i.module, "distribution": i.distribution or None,
                     "version": i.version or None, "shadowed_by": i.shadowed_by or None,
                     "verifiers": i.release or None, "interpreter": i.interpreter or None, "description": i.doc,
                     "args": [{"name": a.name, "default": a.default, "required": a.required,
                               "annotation": a.annotation} for a in i.args]}
                    for i in infos])
        return
    rows = [(info.id, info.where(), runs_on(info.release, info.interpreter, verbose),
             info.doc.split(": ", 1)[-1] if verbose else short_description(info.doc.split(": ", 1)[-1]),
             ", ".join(a.name if a.required else f"{a.name}={a.default!r}" for a in info.args
                       if a.name != "system_prompt")) for info in infos]
    print_table((Column("ID", no_wrap=True), "SOURCE", Column("RUNS ON", ratio=1), Column("DESCRIPTION", ratio=1),
                 Column("ARGS", ratio=1)), rows, styles=["dim" if info.shadowed_by else None for info in infos])


def runs_on(release: str, interpreter: str, verbose: bool = False) -> str:
    """`verifiers 0.1.12 (own: ~/.prime-lab/verifiers/0.1.12)`, `verifiers 0.3.1`, or `prime-lab`."""
    import sys

    if not release:
        return "prime-lab"
    if not interpreter or interpreter == sys.executable:
        return f"verifiers {release}"
    folder = Path(interpreter).parents[1]
    if not verbose and folder.is_relative_to(Path.home()):
        return f"verifiers {release} (own: ~/{folder.relative_to(Path.home())})"
    own = interpreter if verbose else str(folder)
    return f"verifiers {release} (own: {own})"


@env_app.command("init")
def init(
    name: str = typer.Argument(..., help="The new environment's name (e.g. my-env): its id and package name."),
    path: Path = typer.Option(Path("."), "-p", "--path", help="Folder to create the package in (as PATH/NAME)."),
    verifiers: bool = typer.Option(False, "--verifiers",
                                   help="Write it in verifiers' classic API (import verifiers as vf)."),
    force: bool = typer.Option(False, "-f", "--force", help="Overwrite the package's files if they exist."),
) -> None:
    """Write a new environment package: pyproject, a module with load_environment(), a README and a test."""
    from prime_lab.envs.loader import builtin_environments
    from prime_lab.envs.scaffold import ScaffoldError, write_package

    try:
        package = write_package(name, path, verifiers=verifiers, force=force)
    except ScaffoldError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot write the package: {exc}")
    for written in package.files:
        err(f"wrote {written}")
    if any(info.id.split("/")[-1] == package.name for info in builtin_environments()):
        err(f"note: '{package.name}' is also a built-in; once installed, its ids load this package instead")
    err(f"next: prime env install {package.folder} && prime eval run {package.name}")
    typer.echo(str(package.folder))


@env_app.command("install")
def install(
    target: Path = typer.Argument(..., help="A package folder (installed editable), or a wheel or sdist file."),
    verifiers: str | None = typer.Option(None, "--verifiers", metavar="VERSION",
                                         help="Run it at this verifiers release, in that release's own virtual "
                                              "environment (default: what the package declares and imports)."),
    isolate: bool = typer.Option(False, "--isolate",
                                 help="Its own virtual environment even when the release beside prime-lab would do."),
) -> None:
    """pip-install an environment package; its id works right after.

    An environment that needs a verifiers release other than the one beside prime-lab (what its metadata declares,
    narrowed by what it imports; or --verifiers) goes into that release's own virtual environment, created once per
    release with pip, and runs there as a server of the run. Beside prime-lab, what is installed stays as it is:
    a package that needs another version of anything installed there (verifiers, tokenizers under transformers),
    or that would bring a console script of prime-lab's (`prime`), goes into a release environment of its own
    instead, or is refused. An install whose pip or environments fail, or that breaks another environment of its
    release, is taken back whole."""
    from prime_lab.envs.install import HeldBack, InstallError, choose_release, own_release_for
    from prime_lab.envs.releases import ReleaseError

    path = target.expanduser().resolve()
    try:
        choice = choose_release(path, verifiers, isolate)
        if choice.release is None:
            try:
                install_beside(target, choice.reason)
                return
            except HeldBack as held:
                choice = own_release_for(path, verifiers, held)
                err(f"not beside prime-lab: {held.words()}; into verifiers {choice.release}'s own environment "
                    f"instead ({choice.reason})")
                install_at_release(path, choice, said=True)
                return
        install_at_release(path, choice)
    except (InstallError, ReleaseError) as exc:
        fail(str(exc))


def install_beside(target: Path, reason: str) -> None:
    """`prime env install` beside prime-lab (install.install_beside: taken back when an environment does not
    import); prints each id it provides."""
    from prime_lab.envs import install

    done = install.install_beside(target, say=err)
    how = done.plan
    err(f"installed {how.project or how.target} ({'editable' if how.editable else 'from a file'}"
        + (f", constraints {how.constraints}" if how.constraints else "") + ")")
    err(f"beside prime-lab: {reason}")
    for env in done.environments:
        typer.echo(f"{env['id']}\t{env['module']}")
        err(f"ready: prime eval run {env['id']}")


def install_at_release(target: Path, choice: ReleaseChoice, said: bool = False) -> None:
    """`prime env install` into the environment of `choice`'s release (`said`: its reason is printed already)."""
    from prime_lab.envs.install import install_isolated

    for ruled in choice.ruled_out_words():
        err(f"ruled out by what it imports: verifiers {ruled}")
    if not said:
        err(f"verifiers {choice.release}: {choice.reason}")
    records = install_isolated(target, choice, say=err)
    for record in records:
        err(f"installed {record.distribution} {record.version} into verifiers {record.release}'s own "
            f"environment ({record.python})")
        typer.echo(f"{record.name}\t{record.module}")
        err(f"ready: prime eval run {record.name}")


@env_app.command("uninstall")
def uninstall(
    env_id: str = typer.Argument(..., metavar="ID", help="The environment's id, as `prime env list` shows it."),
    release_env: bool = typer.Option(False, "--release-env",
                                     help="Also delete its verifiers release's own virtual environment, when no "
                                          "other installed environment uses it."),
) -> None:
    """pip-uninstall the package that provides an environment (beside prime-lab or in its release's own virtual
    environment), and every environment it provides; prints their ids. What its install added goes too, unless
    another installed package needs it, and what it changed is put back."""
    from prime_lab.envs.install import InstallError
    from prime_lab.envs.install import uninstall as pip_uninstall
    from prime_lab.envs.releases import ReleaseError

    try:
        removal = pip_uninstall(env_id, release_env)
    except (InstallError, ReleaseError) as exc:
        fail(str(exc))
    err(f"uninstalled {removal.distribution} {removal.version} ({removal.where}): "
        f"{', '.join(removal.ids) or 'no environment'} no longer installed")
    if removal.also:
        err(removal.also)
    if removal.release_env:
        err(removal.release_env)
    for name in removal.ids:
        typer.echo(name)


# `prime env secret`: one environment's secrets, over the global ones (`prime secret`, cli/secret.py).
env_secret_app = typer.Typer(help="One environment's secrets: variables its processes get (over global ones).",
                             no_args_is_help=True)
env_app.add_typer(env_secret_app, name="secret")
ENV_ID_ARGUMENT = typer.Argument(..., metavar="ENV", help="The environment's id, as `prime env list` shows it.")
NAME_ARGUMENT = typer.Argument(..., metavar="NAME", help="The secret's name.")


@env_secret_app.command("list")
def secret_list(env_id: str = ENV_ID_ARGUMENT, output: OutputFormat = OUTPUT_OPTION) -> None:
    """ENV's own secrets: names, created and updated times, never values (global ones: `prime secret list`)."""
    secret.list_secrets(env_id, output)


@env_secret_app.command("create")
def secret_create(env_id: str = ENV_ID_ARGUMENT, name: str = secret.NAME_OPTION,
                  value: str | None = secret.VALUE_OPTION) -> None:
    """Store a secret for ENV alone; its processes get it as an environment variable, over a global one."""
    secret.create_secret(name, value, env_id)


@env_secret_app.command("update")
def secret_update(env_id: str = ENV_ID_ARGUMENT, name: str = NAME_ARGUMENT,
                  value: str | None = secret.VALUE_OPTION) -> None:
    """Change one of ENV's secrets."""
    secret.update_secret(name, value, env_id)


@env_secret_app.command("delete")
def secret_delete(env_id: str = ENV_ID_ARGUMENT, name: str = NAME_ARGUMENT, yes: bool = secret.YES_OPTION) -> None:
    """Delete one of ENV's secrets (asks first unless -y)."""
    secret.delete_secret(name, env_id, yes)
