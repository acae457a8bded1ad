"""The one base of every config schema (RL, SFT, GEPA, evaluation), so a mistake is reported the same way in each."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ConfigSection(BaseModel):
    """A table of a TOML config: closed (an unknown key is a problem, with a did-you-mean) and strictly typed."""

    # strict: TOML has real types, so "16" for an int, 1.5 for an int or true for a number is a mistake to report,
    # not something to coerce (ints are still accepted where a float is expected). A field that must take another
    # type (a path given as a string) says so itself, e.g. `Field(strict=False)` or a `mode="before"` validator.
    # validate_default: a default that breaks a field's own constraint is a bug found when the class is used.
    model_config = ConfigDict(extra="forbid", populate_by_name=True, validate_default=True, strict=True)
