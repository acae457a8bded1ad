"""Config problems: parse TOML, validate against a pydantic schema, and report every problem with its line.

One collector serves the CLI (`prime rl validate`), the launchers and the workbench editor. A problem names the
file, the line in the TOML, the dotted key, a message and, for a misspelt key, the nearest valid name.
Validation never raises for bad input: it returns problems (see `validate_toml`).

Where each key is in the text lives in `problems.toml_lines`, the wording of pydantic's errors in `problems.messages`;
their public names are re-exported here, the one module callers import.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from prime_lab.problems.messages import (
    error_message,
    field_paths,
    nearest_name,
    normalise_loc,
    suggest_key,
    value_at,
)
from prime_lab.problems.toml_lines import KeyLocator, KeyPath, dotted, explain_syntax_error

__all__ = [
    "CheckContext", "ExtraCheck", "KeyLocator", "KeyPath", "Problem", "Severity", "Validation", "dotted",
    "field_paths", "nearest_name", "normalise_loc", "problems_from_validation_error", "suggest_key",
    "toml_syntax_problem", "validate_file", "validate_toml", "value_at",
]

Severity = Literal["error", "note"]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with (or worth knowing about) a config."""

    key: str
    message: str
    line: int | None = None
    file: str | None = None
    severity: Severity = "error"
    suggestion: str | None = None

    def format(self) -> str:
        """`file:line: key: message`, the form editors and terminals turn into links."""
        where = f"{self.file or '<config>'}:{self.line}" if self.line else (self.file or "<config>")
        parts = [where] + (["note"] if self.severity == "note" else []) + ([self.key] if self.key else [])
        text = ": ".join(parts) + ": " + self.message
        if self.suggestion:
            text += f" (did you mean `{self.suggestion}`?)"
        return text

    def to_json(self) -> dict[str, Any]:
        return asdict(self)



def toml_syntax_problem(exc: tomllib.TOMLDecodeError, text: str, file: str | None) -> Problem:
    """A TOML syntax error as a problem on the line to fix, with a message that says how to fix it."""
    line, message = explain_syntax_error(exc, text)
    return Problem(key="", message=f"invalid TOML: {message}", line=line, file=file)


def problems_from_validation_error(
    exc: ValidationError, model: type[BaseModel], locator: KeyLocator, file: str | None, data: Any = None
) -> list[Problem]:
    problems: list[Problem] = []
    for error in exc.errors():
        loc: KeyPath = tuple(error["loc"])
        # pydantic adds the tag of a union member to the loc; keep only keys that exist in the document.
        loc = tuple(p for p in loc if not (isinstance(p, str) and p.startswith("function-")))
        where = normalise_loc(loc, data)
        message, suggestion = error_message(error, model, where, data)
        problems.append(Problem(key=dotted(where), message=message, line=locator.line_of(where), file=file,
                                suggestion=suggestion))
    return problems


M = TypeVar("M", bound=BaseModel)


@dataclass
class Validation(Generic[M]):
    """The result of validating one config: the parsed model (when valid) and every problem found."""

    file: str | None
    config: M | None
    problems: list[Problem] = field(default_factory=list)
    data: dict[str, Any] | None = None

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]

    @property
    def notes(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "note"]

    @property
    def ok(self) -> bool:
        return not self.errors


class CheckContext:
    """Passed to a schema's extra checks: reads raw values safely and records problems with their lines."""

    def __init__(self, data: dict[str, Any], locator: KeyLocator, file: str | None) -> None:
        self.data = data
        self.locator = locator
        self.file = file
        self.problems: list[Problem] = []

    def get(self, path: KeyPath, default: Any = None) -> Any:
        return value_at(self.data, path, default)

    def has(self, path: KeyPath) -> bool:
        sentinel = object()
        return self.get(path, sentinel) is not sentinel

    def problem(self, path: KeyPath, message: str, severity: Severity = "error") -> None:
        path = normalise_loc(path, self.data)
        self.problems.append(Problem(key=dotted(path), message=message, line=self.locator.line_of(path),
                                     file=self.file, severity=severity))


ExtraCheck = Callable[[CheckContext], None]


def validate_toml(
    text: str, model: type[M], *, file: str | None = None, checks: Iterable[ExtraCheck] = ()
) -> Validation[M]:
    """Parse and validate `text`; never raises for bad input.

    `checks` run on the raw data even when the schema fails, so cross-field problems (divisibility, conflicting
    spellings) are reported together with type errors; each check must tolerate values of the wrong type.
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        return Validation(file=file, config=None, problems=[toml_syntax_problem(exc, text, file)])
    locator = KeyLocator(text)
    ctx = CheckContext(data, locator, file)
    for check in checks:
        try:
            check(ctx)
        except Exception as exc:  # a bug in a check must not hide the other problems behind a traceback
            ctx.problems.append(Problem("", f"internal error in check {getattr(check, '__name__', check)}: "
                                        f"{type(exc).__name__}: {exc} (please report it)", file=file))
    config: M | None = None
    problems: list[Problem] = []
    try:
        config = model.model_validate(data)
    except ValidationError as exc:
        problems = problems_from_validation_error(exc, model, locator, file, data)
    seen = {(p.key, p.message) for p in problems}
    problems += [p for p in ctx.problems if (p.key, p.message) not in seen]
    problems.sort(key=lambda p: (p.severity != "error", p.line or 0))
    if any(p.severity == "error" for p in problems):
        config = None
    return Validation(file=file, config=config, problems=problems, data=data)


def validate_file(path: Path, model: type[M], *, checks: Iterable[ExtraCheck] = ()) -> Validation[M]:
    """Like `validate_toml` for a file on disk; an unreadable file is a problem, not an exception."""
    name = str(path)
    try:
        text = path.read_text(encoding="utf-8-sig")  # a byte-order mark (some Windows editors) is not an error
    except FileNotFoundError:
        return Validation(file=name, config=None, problems=[Problem("", "no such file", file=name)])
    except IsADirectoryError:
        return Validation(file=name, config=None, problems=[Problem("", "is a directory, not a TOML file",
                                                                     file=name)])
    except (OSError, UnicodeDecodeError) as exc:
        return Validation(file=name, config=None, problems=[Problem("", f"cannot read: {exc}", file=name)])
    return validate_toml(text, model, file=name, checks=checks)
