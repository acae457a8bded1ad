"""Config problems: parse TOML, validate against a pydantic schema, and report every problem with its line.

One collector serves the CLI (`prime rl validate`), the launchers and the workbench editor. A problem names the
file, the line in the TOML, the dotted key, a message and, for a misspelt key, the nearest valid name.
Validation never raises for bad input: it returns problems (see `validate_toml`).
"""

from __future__ import annotations

import difflib
import re
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ValidationError

Severity = Literal["error", "note"]
KeyPath = tuple[str | int, ...]


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


def dotted(path: KeyPath) -> str:
    """('env', 0, 'id') -> 'env[0].id'."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + part
    return out


# ----------------------------------------------------------------------------------------------------------
# Where each key sits in the TOML text. tomllib gives no positions, so a small scanner walks the lines, tracking
# the current table header ([a.b], [[a.b]] with per-array counters) and `key = value` assignments, skipping the
# insides of multi-line strings and arrays. Keys inside inline tables map to the line of the inline table.

_BARE = r"[A-Za-z0-9_-]+"
_KEY_PART = rf'(?:{_BARE}|"(?:[^"\\]|\\.)*"|\'[^\']*\')'
_DOTTED_KEY = rf"{_KEY_PART}(?:\s*\.\s*{_KEY_PART})*"
_HEADER_RE = re.compile(rf"^\s*(\[\[|\[)\s*({_DOTTED_KEY})\s*(\]\]|\])")
_ASSIGN_RE = re.compile(rf"^\s*({_DOTTED_KEY})\s*=")
_INLINE_KEY_RE = re.compile(rf"(?:^|[{{,])\s*({_DOTTED_KEY})\s*=")


def _split_key(text: str) -> list[str]:
    parts = re.findall(_KEY_PART, text)
    return [p[1:-1] if p[:1] in "\"'" else p for p in parts]


class KeyLocator:
    """Maps key paths of a TOML document to 1-based line numbers."""

    def __init__(self, text: str) -> None:
        self.lines: dict[KeyPath, int] = {}
        self._scan(text)

    def _scan(self, text: str) -> None:
        array_counts: dict[tuple[str, ...], int] = {}
        table: KeyPath = ()
        in_multiline: str | None = None  # the closing delimiter we wait for: ''' or \"\"\" or ]
        depth = 0
        for lineno, raw in enumerate(text.splitlines(), start=1):
            line = raw
            if in_multiline in ('"""', "'''"):
                if in_multiline in line:
                    in_multiline = None
                continue
            if in_multiline == "]":
                depth += _bracket_delta(line)
                if depth <= 0:
                    in_multiline, depth = None, 0
                continue
            stripped = line.strip()
            if not stripped or stripped.startswith("#"):
                continue
            header = _HEADER_RE.match(line)
            if header and not _ASSIGN_RE.match(line):
                names = tuple(_split_key(header.group(2)))
                if header.group(1) == "[[":
                    index = array_counts.get(names, 0)
                    array_counts[names] = index + 1
                    # Arrays nested under an array-of-tables element resolve against the parent's last element.
                    table = self._resolve_prefix(names, array_counts) + (index,)
                else:
                    table = self._resolve_prefix(names, array_counts)
                self.lines.setdefault(table, lineno)
                continue
            assign = _ASSIGN_RE.match(line)
            if not assign:
                continue
            key = tuple(_split_key(assign.group(1)))
            path = table + key
            self.lines.setdefault(path, lineno)
            value = line[assign.end():]
            for delim in ('"""', "'''"):
                if value.count(delim) == 1:
                    in_multiline = delim
            if value.lstrip().startswith("{"):
                for inner in _INLINE_KEY_RE.finditer(value):
                    self.lines.setdefault(path + tuple(_split_key(inner.group(1))), lineno)
            if value.lstrip().startswith("["):
                d = _bracket_delta(value)
                if d > 0:
                    in_multiline, depth = "]", d

    @staticmethod
    def _resolve_prefix(names: tuple[str, ...], array_counts: dict[tuple[str, ...], int]) -> KeyPath:
        out: list[str | int] = []
        for i, name in enumerate(names):
            out.append(name)
            count = array_counts.get(names[: i + 1])
            if count and i < len(names) - 1:
                out.append(count - 1)
        return tuple(out)

    def line_of(self, path: KeyPath) -> int | None:
        """The line of the deepest known prefix of `path` (a missing key points at its table)."""
        for end in range(len(path), 0, -1):
            line = self.lines.get(tuple(path[:end]))
            if line is not None:
                return line
        return None


def _bracket_delta(text: str) -> int:
    # Strip strings and comments before counting brackets.
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'[^\']*\'', "", text)
    text = text.split("#", 1)[0]
    return text.count("[") - text.count("]")


# ----------------------------------------------------------------------------------------------------------

_TOML_POS_RE = re.compile(r"\(at line (\d+), column (\d+)\)")
_TOML_EOF_RE = re.compile(r"\(at end of document\)")


def toml_syntax_problem(exc: tomllib.TOMLDecodeError, text: str, file: str | None) -> Problem:
    message = str(exc)
    match = _TOML_POS_RE.search(message)
    line = int(match.group(1)) if match else (len(text.splitlines()) or 1)
    message = _TOML_EOF_RE.sub("", _TOML_POS_RE.sub("", message)).strip()
    return Problem(key="", message=f"invalid TOML: {message}", line=line, file=file)


def _field_names(model: type[BaseModel]) -> list[str]:
    names: list[str] = []
    for name, info in model.model_fields.items():
        names.append(info.alias or name)
        for alias in _validation_aliases(info):
            names.append(alias)
    return names


def _validation_aliases(info: Any) -> list[str]:
    alias = getattr(info, "validation_alias", None)
    if alias is None:
        return []
    choices = getattr(alias, "choices", None)
    if choices:
        return [c for c in choices if isinstance(c, str)]
    return [alias] if isinstance(alias, str) else []


def _submodel_at(model: type[BaseModel], path: KeyPath) -> type[BaseModel] | None:
    """The pydantic model that owns the keys at `path` (indices into lists are skipped)."""
    current: type[BaseModel] | None = model
    for part in path:
        if current is None:
            return None
        if isinstance(part, int):
            continue
        info = _find_field(current, part)
        if info is None:
            return None
        current = _model_in_annotation(info.annotation)
    return current


def _find_field(model: type[BaseModel], key: str) -> Any:
    for name, info in model.model_fields.items():
        if key == name or key == info.alias or key in _validation_aliases(info):
            return info
    return None


def _model_in_annotation(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_in_annotation(arg)
        if found is not None:
            return found
    return None


def nearest_name(key: str, candidates: Iterable[str]) -> str | None:
    matches = difflib.get_close_matches(key, list(candidates), n=1, cutoff=0.6)
    return matches[0] if matches else None


_MESSAGE_REWRITES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"^Input should be a valid integer, got a number with a fractional part$"),
     "must be a whole number"),
    (re.compile(r"^Input should be a valid (integer|number|string|boolean|list|dictionary)(,.*)?$"),
     "must be a {kind}"),
    (re.compile(r"^Field required$"), "is required"),
    (re.compile(r"^Extra inputs are not permitted$"), "unknown key"),
]
_KIND_WORDS = {"integer": "whole number", "number": "number", "string": "string", "boolean": "boolean (true/false)",
               "list": "list (an array)", "dictionary": "table"}


def _friendly(message: str) -> str:
    for pattern, replacement in _MESSAGE_REWRITES:
        match = pattern.match(message)
        if match:
            if "{kind}" in replacement:
                return replacement.format(kind=_KIND_WORDS.get(match.group(1), match.group(1)))
            return replacement
    message = message.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    message = message.replace("Input should be", "must be")
    return message


def problems_from_validation_error(
    exc: ValidationError, model: type[BaseModel], locator: KeyLocator, file: str | None
) -> list[Problem]:
    problems: list[Problem] = []
    for error in exc.errors():
        loc: KeyPath = tuple(error["loc"])
        # pydantic adds the tag of a union member to the loc; keep only keys that exist in the document.
        loc = tuple(p for p in loc if not (isinstance(p, str) and p.startswith("function-")))
        suggestion = None
        message = _friendly(error["msg"])
        if error["type"] == "extra_forbidden" and loc and isinstance(loc[-1], str):
            owner = _submodel_at(model, loc[:-1])
            if owner is not None:
                suggestion = nearest_name(loc[-1], _field_names(owner))
        elif error["type"] == "missing":
            message = "is required"
        problems.append(Problem(key=dotted(loc), message=message, line=locator.line_of(loc), file=file,
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
        node: Any = self.data
        for part in path:
            if isinstance(part, int):
                if not isinstance(node, list) or part >= len(node):
                    return default
                node = node[part]
            else:
                if not isinstance(node, dict) or part not in node:
                    return default
                node = node[part]
        return node

    def has(self, path: KeyPath) -> bool:
        sentinel = object()
        return self.get(path, sentinel) is not sentinel

    def problem(self, path: KeyPath, message: str, severity: Severity = "error") -> None:
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
        check(ctx)
    config: M | None = None
    problems: list[Problem] = []
    try:
        config = model.model_validate(data)
    except ValidationError as exc:
        problems = problems_from_validation_error(exc, model, locator, file)
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
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Validation(file=name, config=None, problems=[Problem("", "no such file", file=name)])
    except IsADirectoryError:
        return Validation(file=name, config=None, problems=[Problem("", "is a directory, not a TOML file",
                                                                     file=name)])
    except (OSError, UnicodeDecodeError) as exc:
        return Validation(file=name, config=None, problems=[Problem("", f"cannot read: {exc}", file=name)])
    return validate_toml(text, model, file=name, checks=checks)
