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
    """Installed and built-in environments, each with its API (classic, or v1: a verifiers 0.4 taskset) and its
    arguments and defaults.

    An installed environment takes precedence over a built-in of the same name: the built-in's row says so."""
    from rich.table import Column

    from prime_lab.envs.envs_hub import hub_id_of
    from prime_lab.envs.judges import how_wired
    from prime_lab.envs.loader import environments
    from prime_lab.envs.v1 import api_of

    infos = environments()
    hub = {i.id: hub_id_of(i.distribution, i.version) if i.distribution else "" for i in infos}
    if output is OutputFormat.json:
        print_json([{"id": i.id, "source": i.source, "module": i.module, "distribution": i.distribution or None,
                     "version": i.version or None, "hub_id": hub[i.id] or None, "shadowed_by": i.shadowed_by or None,
                     "api": api_of(i.release), "verifiers": i.release or None, "interpreter": i.interpreter or None,
                     "description": i.doc,
                     "args": [{"name": a.name, "default": a.default, "required": a.required,
                               "annotation": a.annotation} for a in i.args],
                     "judge": how_wired(i.args) or None}
                    for i in infos])
        return
    wired = [how_wired(info.args) for info in infos]
    judged = any(wired)  # the column only where an environment here takes an LLM judge
    rows = [(info.id, info.where() + (f" (Hub: {hub[info.id]})" if hub[info.id] else ""), api_of(info.release),
             runs_on(info.release, info.interpreter, verbose),
             info.doc.split(": ", 1)[-1] if verbose else short_description(info.doc.split(": ", 1)[-1]),
             ", ".join(a.name if a.required else f"{a.name}={a.default!r}" for a in info.args
                       if a.name != "system_prompt"), *([how] if judged else []))
            for info, how in zip(infos, wired, strict=True)]
    print_table((Column("ID", no_wrap=True), "SOURCE", "API", Column("RUNS ON", ratio=1),
                 Column("DESCRIPTION", ratio=1), Column("ARGS", ratio=1),
                 *([Column("JUDGE WIRED BY", ratio=1)] if judged else [])), rows,
                styles=["dim" if info.shadowed_by else None for info in infos])


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
    v1: bool = typer.Option(False, "--v1", help="Write a verifiers v1 taskset (verifiers 0.4's API: a vf.Taskset "
                                                "with weighted @vf.reward methods), run at verifiers 0.4."),
    force: bool = typer.Option(False, "-f", "--force", help="Overwrite the package's files if they exist."),
) -> None:
    """Write a new environment package: pyproject, a module with load_environment() (with --v1: a package exporting
    a vf.Taskset), a README and a test."""
    from prime_lab.envs.loader import builtin_environments
    from prime_lab.envs.scaffold import ScaffoldError, write_package

    try:
        package = write_package(name, path, verifiers=verifiers, v1=v1, force=force)
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
    target: str = typer.Argument(..., metavar="ID|PATH",
                                 help="An Environments Hub id (owner/name or owner/name@version), a package folder "
                                      "(installed editable), or a wheel or sdist file."),
    verifiers: str | None = typer.Option(None, "--verifiers", metavar="VERSION",
                                         help="Run it at this verifiers release, in that release's own virtual "
                                              "environment (default: what the package declares and imports)."),
    isolate: bool = typer.Option(False, "--isolate",
                                 help="Its own virtual environment even when the release beside prime-lab would do."),
) -> None:
    """pip-install an environment package; its id works right after.

    An Environments Hub id (owner/name[@version]) is fetched from the Hub (PRIME_API_BASE_URL; PRIME_API_KEY, or
    `prime secret`, for a private one) and its wheel installed as a file is. An environment that needs a verifiers
    release other than the one beside prime-lab (what its metadata declares, narrowed by what it imports; or
    --verifiers) goes into that release's own virtual environment, created once per release with pip, and runs
    there as a server of the run. Beside prime-lab, what is installed stays as it is: a package that needs another
    version of anything installed there (verifiers, tokenizers under transformers), or that would bring a console
    script of prime-lab's (`prime`), goes into a release environment of its own instead, or is refused. An install
    whose pip or environments fail, or that breaks another environment of its release, is taken back whole."""
    from prime_lab.envs.envs_hub import HubError, parse_id
    from prime_lab.envs.install import InstallError
    from prime_lab.envs.releases import ReleaseError

    path = Path(target).expanduser()
    # owner/name is a Hub id unless it is a path here (or under a folder here: a folder's name mistyped)
    hub_id = None if path.exists() or path.parent.is_dir() and path.parent != Path(".") else parse_id(target)
    try:
        if hub_id is not None:
            install_from_hub(target, verifiers, isolate)
        else:
            install_path(path.resolve(), verifiers, isolate)
    except (InstallError, ReleaseError, HubError) as exc:
        fail(str(exc))


def install_path(path: Path, verifiers: str | None, isolate: bool, hub_id: str = "",
                 also: tuple[str, ...] = ()) -> None:
    """Install a folder, wheel or sdist beside prime-lab, or at its release (`prime env install`'s path); `hub_id`:
    the id the ready line names; `also`: requirements pip installs with it (a Hub release's url_dependencies)."""
    from prime_lab.envs.install import HeldBack, choose_release, own_release_for

    choice = choose_release(path, verifiers, isolate)
    if choice.release is None:
        try:
            install_beside(path, choice.reason, hub_id, also)
            return
        except HeldBack as held:
            choice = own_release_for(path, verifiers, held)
            err(f"not beside prime-lab: {held.words()}; into verifiers {choice.release}'s own environment "
                f"instead ({choice.reason})")
            install_at_release(path, choice, said=True, hub_id=hub_id, also=also)
            return
    install_at_release(path, choice, hub_id=hub_id, also=also)


def install_from_hub(text: str, verifiers: str | None = None, isolate: bool = False) -> None:
    """`prime env install owner/name[@version]`: the Hub's wheel fetched (envs/envs_hub.py), installed as a file
    is, and recorded as the Hub's. HubError, InstallError or ReleaseError in one line."""
    from packaging.utils import parse_wheel_filename

    from prime_lab.envs import envs_hub

    hub_id = envs_hub.parse_id(text)
    if hub_id is None:
        raise envs_hub.HubError(f"{text!r} is not an Environments Hub id (owner/name or owner/name@version)")
    key = envs_hub.api_key()
    found = envs_hub.release(hub_id, key)
    err(f"{hub_id.id} {found.version or hub_id.version} ({found.visibility.lower()}) from {envs_hub.base_url()}")
    also = envs_hub.url_requirements(found)  # checked before anything is fetched
    wheel = envs_hub.fetch(found, key, say=err)
    if also:
        err(f"with its url dependencies: {', '.join(also)}")
    with envs_hub.extra_index(found):  # what it needs from its owner's index too
        install_path(wheel, verifiers, isolate, hub_id=hub_id.id, also=also)
    name, version, _, _ = parse_wheel_filename(wheel.name)
    envs_hub.remember(name, found, str(version))


INSTALL_OPTION = typer.Option(False, "--install", help="First install from the Environments Hub each owner/name "
                                                      "environment the command names that is not installed here.")
JUDGE_OPTION = typer.Option(None, "--judge", metavar="MODEL", help="Start a local server on MODEL as the environment's "
                            "LLM judge and point the environment at it (as a [judge] table).")


def install_missing(env_ids: list[str]) -> None:
    """`--install`: each Environments Hub id among `env_ids` that no installed or built-in environment answers,
    installed from the Hub first (what it says on stderr: stdout stays the command's); the first that cannot be
    ends the command in one line. Other ids are left to the command's own check."""
    import importlib
    import sys
    from contextlib import redirect_stdout

    from prime_lab.envs import EnvironmentLoadError
    from prime_lab.envs.envs_hub import HubError, parse_id
    from prime_lab.envs.install import InstallError
    from prime_lab.envs.loader import resolve
    from prime_lab.envs.releases import ReleaseError

    for env_id in dict.fromkeys(env_ids):
        try:
            resolve(env_id)
            continue
        except EnvironmentLoadError:
            if parse_id(env_id) is None:
                continue
        err(f"{env_id} is not installed: installing it from the Environments Hub (--install)")
        try:
            with redirect_stdout(sys.stderr):
                install_from_hub(env_id)
        except (InstallError, ReleaseError, HubError) as exc:
            fail(str(exc))
        importlib.invalidate_caches()


def _ready(env_id: str, hub_id: str) -> None:
    err(f"ready: prime eval run {hub_id or env_id}")


def install_beside(target: Path, reason: str, hub_id: str = "", also: tuple[str, ...] = ()) -> None:
    """`prime env install` beside prime-lab (install.install_beside: taken back when an environment does not
    import); prints each id it provides."""
    from prime_lab.envs import install

    done = install.install_beside(target, say=err, also=also)
    how = done.plan
    err(f"installed {how.project or how.target} ({'editable' if how.editable else 'from a file'}"
        + (f", constraints {how.constraints}" if how.constraints else "") + ")")
    err(f"beside prime-lab: {reason}")
    for env in done.environments:
        typer.echo(f"{env['id']}\t{env['module']}")
        _ready(str(env["id"]), hub_id)


def install_at_release(target: Path, choice: ReleaseChoice, said: bool = False, hub_id: str = "",
                       also: tuple[str, ...] = ()) -> None:
    """`prime env install` into the environment of `choice`'s release (`said`: its reason is printed already)."""
    from prime_lab.envs.install import install_isolated

    for ruled in choice.ruled_out_words():
        err(f"ruled out by what it imports: verifiers {ruled}")
    if not said:
        err(f"verifiers {choice.release}: {choice.reason}")
    records = install_isolated(target, choice, say=err, also=also)
    for record in records:
        err(f"installed {record.distribution} {record.version} into verifiers {record.release}'s own "
            f"environment ({record.python})")
        typer.echo(f"{record.name}\t{record.module}")
        _ready(record.name, hub_id)


@env_app.command("info")
def info(
    env_id: str = typer.Argument(..., metavar="OWNER/NAME", help="An Environments Hub id."),
    output: OutputFormat = OUTPUT_OPTION,
) -> None:
    """An Environments Hub environment: its latest version, visibility, description, versions and install line."""
    from prime_lab.envs import envs_hub

    hub_id = envs_hub.parse_id(env_id)
    if hub_id is None:
        fail(f"{env_id!r} is not an Environments Hub id (owner/name)")
    try:
        key = envs_hub.api_key()
        found = envs_hub.release(hub_id, key)
        listed = envs_hub.versions(hub_id, key)
    except envs_hub.HubUnreachable as exc:  # what is true here, and the command for where there is a network
        fail(f"{envs_hub.installed_words(hub_id)}; the Environments Hub ({exc.where}) cannot be reached "
             f"({exc.reason}): run `prime env info {hub_id.id}` where there is a network")
    except envs_hub.HubError as exc:
        fail(str(exc))
    line = envs_hub.HubId(hub_id.owner, hub_id.name).install_line()
    if output is OutputFormat.json:
        print_json({"id": hub_id.id, "version": found.version or None, "visibility": found.visibility,
                    "description": found.description, "install": line, "versions": listed})
        return
    typer.echo(f"{hub_id.id} {found.version} ({found.visibility.lower()})")
    if found.description:
        typer.echo(found.description)
    print_table(("VERSION", "CREATED", "SHA256"),
                [(str(v.get("version") or v.get("semantic_version") or ""), str(v.get("created_at") or ""),
                  str(v.get("sha256") or "")[:12]) for v in listed])
    typer.echo(f"install: {line}" + (f"  (a version: {line}@VERSION)" if listed else ""))


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
    from prime_lab.envs.envs_hub import forget
    from prime_lab.envs.install import InstallError
    from prime_lab.envs.install import uninstall as pip_uninstall
    from prime_lab.envs.releases import ReleaseError

    try:
        removal = pip_uninstall(env_id, release_env)
    except (InstallError, ReleaseError) as exc:
        fail(str(exc))
    forget(removal.distribution)
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
