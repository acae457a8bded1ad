"""The environment picker: the installed environments (verifiers' convention or our entry point, found as `prime
env list` finds them), then the built-in ones, each with where it comes from and its arguments and defaults."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from textual.message import Message
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from prime_lab.envs import EnvInfo
from prime_lab.envs.loader import environments


@lru_cache(maxsize=1)
def known_environments() -> tuple[EnvInfo, ...]:
    """Read once per app: an installed environment is described from its source, never imported."""
    return tuple(environments())


def describe_args(info: EnvInfo) -> str:
    if not info.args:
        return "no arguments"
    return ", ".join(a.name if a.required else f"{a.name}={a.default!r}" for a in info.args)


class EnvPicker(OptionList):
    """One option per environment: its id, first doc line and arguments."""

    @dataclass
    class Picked(Message):
        env: EnvInfo

    def __init__(self, id: str | None = None) -> None:
        self.envs = known_environments()
        options = [Option(f"{e.id}  ({e.where()})\n  {e.doc[:70]}\n  args: {describe_args(e)}", id=e.id,
                          disabled=bool(e.shadowed_by)) for e in self.envs]
        super().__init__(*options, id=id, markup=False)

    def highlighted_env(self) -> EnvInfo | None:
        index = self.highlighted
        return self.envs[index] if index is not None and index < len(self.envs) else None

    def select_id(self, env_id: str) -> None:
        """Highlight `env_id` (`owner/name` or `name`): the exact id, else the one its name loads."""
        name = env_id.split("/")[-1]
        for matches in (lambda e: e.id == env_id, lambda e: e.id.split("/")[-1] == name):
            for index, env in enumerate(self.envs):
                if matches(env) and not env.shadowed_by:
                    self.highlighted = index
                    return

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.post_message(self.Picked(self.envs[event.option_index]))
