"""`--plain`: plain text for scripts and agents, anywhere on the command line (`prime --plain rl list`, `prime rl
list --plain`), as Prime's CLI takes it on every command.

`main` takes it out of the arguments before Typer parses them (`split_plain`) and turns plain output on
(`render.set_plain`); help pages and usage errors then come without rich's boxes (`plain_help`). The root callback
declares it too, so `prime --help` lists it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import typer

PLAIN_HELP = ("Plain text for scripts and agents: no colours, markup, boxes or progress bars; tables as "
              "tab-separated lines under a header line.")
PLAIN_OPTION = typer.Option(False, "--plain", help=PLAIN_HELP)


def split_plain(argv: list[str]) -> tuple[list[str], bool]:
    """`argv` without its `--plain` options (before a `--`), and whether there was one."""
    cut = argv.index("--") if "--" in argv else len(argv)
    options = [a for a in argv[:cut] if a != "--plain"]
    return options + argv[cut:], len(options) < cut


def _typers(app: typer.Typer) -> Iterator[typer.Typer]:
    yield app
    for group in app.registered_groups:
        if group.typer_instance is not None:
            yield from _typers(group.typer_instance)


@contextlib.contextmanager
def plain_help(app: typer.Typer) -> Iterator[None]:
    """Help pages and usage errors in click's plain text instead of rich's panels, while the block runs."""
    apps = list(_typers(app))
    modes = [a.rich_markup_mode for a in apps]
    for a in apps:
        a.rich_markup_mode = None
    try:
        yield
    finally:
        for a, mode in zip(apps, modes, strict=True):
            a.rich_markup_mode = mode
