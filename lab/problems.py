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
# Where each key sits in the TOML text. tomllib gives no positions, so a small tolerant scanner walks the text
# character by character: table headers ([a.b], [[a.b]] with per-array counters), `key = value` assignments
# (dotted keys too), and inside values: strings of all four kinds, arrays (each element gets its index) and inline
# tables (each key gets its own path, nested ones too). It never fails: on text tomllib rejects it skips to the next
# line and records where a string, array or inline table was opened and never closed.

_BARE_KEY_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_KEY_PART_RE = r"""(?:[A-Za-z0-9_-]+|"[^"\n]*"|'[^'\n]*')"""
_KEY_START_RE = re.compile(rf"[ \t]*{_KEY_PART_RE}(?:[ \t]*\.[ \t]*{_KEY_PART_RE})*[ \t]*=")


class _Scanner:
    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0
        self.line = 1
        self.lines: dict[KeyPath, int] = {}
        self.unclosed: list[tuple[str, int]] = []  # (what, line it was opened on)
        self.repeated: dict[int, tuple[KeyPath, int]] = {}  # line -> (path set again there, line first set)
        self.array_counts: dict[tuple[str, ...], int] = {}

    # -- low-level reading ---------------------------------------------------------------------------------
    def _at(self, token: str) -> bool:
        return self.s.startswith(token, self.i)

    def _char(self) -> str:
        return self.s[self.i] if self.i < len(self.s) else ""

    def _advance(self, n: int = 1) -> None:
        self.line += self.s.count("\n", self.i, self.i + n)
        self.i = min(self.i + n, len(self.s))

    def _skip_blank(self, newlines: bool = False) -> None:
        while self.i < len(self.s):
            char = self.s[self.i]
            if char in " \t\r" or (newlines and char == "\n"):
                self._advance()
            elif char == "#":
                end = self.s.find("\n", self.i)
                self.i = len(self.s) if end < 0 else end
            else:
                return

    def _skip_line(self) -> None:
        end = self.s.find("\n", self.i)
        self._advance(len(self.s) - self.i if end < 0 else end + 1 - self.i)

    def _record(self, path: KeyPath, line: int, final: bool = False) -> None:
        first = self.lines.setdefault(path, line)
        if final and first != line:
            self.repeated.setdefault(line, (path, first))

    # -- grammar -------------------------------------------------------------------------------------------
    def _key(self) -> list[str] | None:
        """A dotted key (`a."b c".d`), or None when there is none here."""
        parts: list[str] = []
        while True:
            self._skip_blank()
            char = self._char()
            if char in ('"', "'"):
                end = self.s.find(char, self.i + 1)
                newline = self.s.find("\n", self.i + 1)
                if end < 0 or (0 <= newline < end):
                    return None
                parts.append(self.s[self.i + 1:end])
                self._advance(end + 1 - self.i)
            else:
                start = self.i
                while self.i < len(self.s) and self.s[self.i] in _BARE_KEY_CHARS:
                    self.i += 1
                if self.i == start:
                    return None
                parts.append(self.s[start:self.i])
            self._skip_blank()
            if not self._at("."):
                return parts
            self._advance()

    def run(self) -> None:
        table: KeyPath = ()
        while True:
            self._skip_blank(newlines=True)
            if self.i >= len(self.s):
                return
            line = self.line
            if self._at("["):
                double = self._at("[[")
                self._advance(2 if double else 1)
                names = self._key()
                if names is not None:
                    table = self._resolve(tuple(names))
                    if double:
                        index = self.array_counts.get(tuple(names), 0)
                        self.array_counts[tuple(names)] = index + 1
                        table += (index,)
                    self._record(table, line, final=not double)
                self._skip_line()
                continue
            names = self._key()
            self._skip_blank()
            if names is None or not self._at("="):
                self._skip_line()
                continue
            self._advance()
            path = table + tuple(names)
            for end in range(len(table) + 1, len(path) + 1):
                self._record(path[:end], line, final=end == len(path))
            self._value(path)
            if self.i > 0 and self.s[self.i - 1] != "\n":
                self._skip_line()

    def _resolve(self, names: tuple[str, ...]) -> KeyPath:
        """A header's path: names under an array of tables resolve against its last element."""
        out: list[str | int] = []
        for i, name in enumerate(names):
            out.append(name)
            count = self.array_counts.get(names[: i + 1])
            if count and i < len(names) - 1:
                out.append(count - 1)
        return tuple(out)

    def _value(self, path: KeyPath) -> None:
        self._skip_blank()
        line = self.line
        for quote in ('"""', "'''"):
            if self._at(quote):
                self._string(quote, line, multiline=True)
                return
        char = self._char()
        if char in ('"', "'"):
            self._string(char, line, multiline=False)
        elif char == "[":
            self._array(path, line)
        elif char == "{":
            self._inline_table(path, line)
        else:
            while self.i < len(self.s) and self.s[self.i] not in ",]}#\n \t\r":
                self.i += 1

    def _string(self, quote: str, line: int, multiline: bool) -> None:
        self._advance(len(quote))
        while self.i < len(self.s):
            char = self.s[self.i]
            if char == "\\" and quote[0] == '"':
                self._advance(2)
            elif self._at(quote):
                # A multi-line string may end in up to two extra quotes (""""" closes after two quotes).
                self._advance(len(quote))
                while multiline and self._at(quote[0]):
                    self._advance()
                return
            elif char == "\n" and not multiline:
                self.unclosed.append(("string", line))
                return
            else:
                self._advance()
        self.unclosed.append(("string", line))

    def _array(self, path: KeyPath, line: int) -> None:
        self._advance()
        index = 0
        while True:
            before = self.line
            self._skip_blank(newlines=True)
            if self.i >= len(self.s):
                self.unclosed.append(("array", line))
                return
            line_start = self.s.rfind("\n", 0, self.i) + 1
            if self.line != before and _KEY_START_RE.match(self.s, line_start) and not self._at("{"):
                # A new `key = ...` line: the array was never closed. Leave that line for the caller to read.
                self.unclosed.append(("array", line))
                self.i = line_start
                return
            if self._at("]"):
                self._advance()
                return
            if self._at(","):
                self._advance()
                continue
            start = self.i
            self._record(path + (index,), self.line)
            self._value(path + (index,))
            index += 1
            if self.i == start:
                self._advance()

    def _inline_table(self, path: KeyPath, line: int) -> None:
        self._advance()
        while True:
            self._skip_blank()
            if self.i >= len(self.s) or self._at("\n"):
                self.unclosed.append(("inline table", line))
                return
            if self._at("}"):
                self._advance()
                return
            if self._at(","):
                self._advance()
                continue
            names = self._key()
            self._skip_blank()
            if names is None or not self._at("="):
                self.unclosed.append(("inline table", line))
                return
            self._advance()
            key_path = path + tuple(names)
            for end in range(len(path) + 1, len(key_path) + 1):
                self._record(key_path[:end], self.line)
            self._value(key_path)


class KeyLocator:
    """Maps key paths of a TOML document to 1-based line numbers.

    Paths are as tomllib nests the data: `("env", 1, "args", "split")` for `split` in the inline `args` table of
    the second `[[env]]`; `("buffer", "env_ratios", 2)` for the third element of an array. `unclosed` lists the
    strings, arrays and inline tables that were opened and never closed, with the line each was opened on.
    """

    def __init__(self, text: str) -> None:
        scanner = _Scanner(text)
        scanner.run()
        self.lines: dict[KeyPath, int] = scanner.lines
        self.unclosed: list[tuple[str, int]] = scanner.unclosed
        self.repeated: dict[int, tuple[KeyPath, int]] = scanner.repeated
        self.arrays: set[tuple[str, ...]] = set(scanner.array_counts)  # names of [[arrays of tables]]

    def line_of(self, path: KeyPath) -> int | None:
        """The line of the deepest known prefix of `path` (a missing key points at its table)."""
        for end in range(len(path), 0, -1):
            line = self.lines.get(tuple(path[:end]))
            if line is not None:
                return line
        return None


# ----------------------------------------------------------------------------------------------------------

_TOML_POS_RE = re.compile(r"\(at line (\d+), column (\d+)\)")
_TOML_EOF_RE = re.compile(r"\(at end of document\)")

# tomllib's words -> what to do about it. `{key}` and `{first}` are filled in when the scanner knows them.
_SYNTAX_HINTS: list[tuple[str, str]] = [
    ("Cannot overwrite a value", "`{key}` is set twice{first}: remove one of them"),
    ("Cannot declare", "table [{key}] is declared twice{first}: merge the two sections into one"),
    ("Duplicate inline table key", "a key is set twice in this inline table: remove one of them"),
    ("Expected ']' at the end of a table declaration", "table header is not closed: write it as [name]"),
    ("Expected ']]' at the end of an array declaration", "array-of-tables header is not closed: write it as [[name]]"),
    ("Expected '=' after a key", "expected `=` after the key: write `key = value`"),
    ("Unclosed array", "this array is never closed: add the closing `]`"),
    ("Unclosed inline table", "this inline table is not closed on its line: add the closing `}}` (inline tables "
     "must fit on one line)"),
    ("Unterminated string", "this string is never closed: add the closing quote(s)"),
    ("Illegal character '\\n'", "this string is not closed on its line: add the closing quote, or use \"\"\" for "
     "a multi-line string"),
    ("Invalid value", "invalid value: put strings in quotes (\"...\"), write booleans as true/false"),
    ("Expected newline or end of document after a statement", "unexpected text after the value: one `key = value` "
     "per line (strings need quotes)"),
    ("Invalid statement", "not a `key = value` line or a [table] header"),
]


def toml_syntax_problem(exc: tomllib.TOMLDecodeError, text: str, file: str | None) -> Problem:
    """A TOML syntax error as a problem on the line to fix, with a message that says how to fix it."""
    raw = str(exc)
    match = _TOML_POS_RE.search(raw)
    line = int(match.group(1)) if match else (len(text.splitlines()) or 1)
    detail = _TOML_EOF_RE.sub("", _TOML_POS_RE.sub("", raw)).strip()
    locator = KeyLocator(text)
    # An unclosed array or string is reported where tomllib gave up (often as "Invalid value" on a later line);
    # the line to fix is where it was opened.
    opened = [(what, at) for what, at in locator.unclosed if at <= line]
    if opened:
        what, at = opened[-1]
        if (what == "array" and (at < line or detail.startswith("Unclosed array"))) or (
                what == "string" and detail.startswith("Unterminated string")):
            detail = "Unclosed array" if what == "array" else detail
            line = at
    message = detail
    names = tuple(re.findall(r"'([^']*)'", detail))
    if detail.startswith("Cannot declare") and names in locator.arrays:
        message = f"[{'.'.join(names)}] clashes with the [[{'.'.join(names)}]] sections above: write " \
                  f"[[{'.'.join(names)}]] for each entry"
    else:
        for prefix, hint in _SYNTAX_HINTS:
            if detail.startswith(prefix):
                path, first = locator.repeated.get(line, ((), 0))
                key = dotted(path) or ".".join(names) or "?"
                message = hint.format(key=key, first=f" (first on line {first})" if first else "")
                break
    return Problem(key="", message=f"invalid TOML: {message}", line=line, file=file)


# ----------------------------------------------------------------------------------------------------------
# From pydantic's errors to problems: the key as the user wrote it, its line, and a message that says what to write.

def _field_names(model: type[BaseModel]) -> list[str]:
    names: list[str] = []
    for name, info in model.model_fields.items():
        names.append(info.alias or name)
        for alias in _validation_aliases(info):
            if alias not in names:
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


def _is_list(annotation: Any) -> bool:
    if getattr(annotation, "__origin__", None) is list:
        return True
    return any(_is_list(arg) for arg in getattr(annotation, "__args__", ()) or ())


def field_paths(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every key path the schema accepts (sections and their fields; list items share their list's path)."""
    out: list[tuple[str, ...]] = []
    for name, info in model.model_fields.items():
        path = prefix + (info.alias or name,)
        out.append(path)
        sub = _model_in_annotation(info.annotation)
        if sub is not None:
            out += field_paths(sub, path)
    return out


def _normal(name: str) -> str:
    return name.lower().replace("-", "_")


def nearest_name(key: str, candidates: Iterable[str]) -> str | None:
    """The candidate `key` most likely misspells (case and `-`/`_` do not count), or None."""
    by_normal = {_normal(c): c for c in candidates}
    matches = difflib.get_close_matches(_normal(key), list(by_normal), n=1, cutoff=0.6)
    return by_normal[matches[0]] if matches else None


def suggest_key(model: type[BaseModel], loc: KeyPath) -> tuple[str | None, str | None]:
    """For an unknown key at `loc`: (the name to use instead, a hint when it belongs in another section).

    A key that is exactly a field of another section (`temperature` at the top level) is most likely misplaced,
    which beats a near-miss here (`max_steps` under [sampling] is not a typo of `max_tokens`).
    """
    key = loc[-1]
    if not isinstance(key, str):
        return None, None
    here = tuple(p for p in loc[:-1] if isinstance(p, str))
    elsewhere = [p for p in field_paths(model) if p[:-1] != here and _normal(p[-1]) == _normal(key)]
    if elsewhere:
        path = elsewhere[0]
        if len(path) == 1:
            return path[0], "it is a top-level setting: put it above the first [section]"
        return ".".join(path), f"it belongs in [{'.'.join(path[:-1])}]"
    owner = _submodel_at(model, loc[:-1])
    return (nearest_name(key, _field_names(owner)) if owner is not None else None), None


def _render(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"' if len(value) <= 40 else f'"{value[:37]}..."'
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a table"
    return type(value).__name__


def _number_text(value: Any) -> str | None:
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return None
        return value.strip()
    return None


def _type_message(kind: str, value: Any) -> str:
    got = f"got {_render(value)}"
    if kind == "int":
        if _number_text(value) is not None:
            return f"must be a whole number, not a string: write {_number_text(value)} without quotes"
        if isinstance(value, float) and value.is_integer():
            return f"must be a whole number: write {int(value)}, not {value!r}"
        return f"must be a whole number ({got})"
    if kind == "float":
        if _number_text(value) is not None:
            return f"must be a number, not a string: write {_number_text(value)} without quotes"
        return f"must be a number ({got})"
    if kind == "bool":
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return f"must be true or false without quotes: write {value.lower()}"
        return f"must be true or false ({got})"
    if kind == "str":
        if isinstance(value, int | float) and not isinstance(value, bool):
            return f'must be a string: write "{value}" in quotes'
        return f'must be a string in quotes ({got})'
    if kind == "list":
        return f"must be a list, e.g. [...] ({got})"
    return f"must be a table: a [section] or an inline {{ key = value }} ({got})"


_TYPE_ERRORS = {
    "int_type": "int", "int_parsing": "int", "int_from_float": "int",
    "float_type": "float", "float_parsing": "float",
    "bool_type": "bool", "bool_parsing": "bool",
    "string_type": "str",
    "list_type": "list", "tuple_type": "list",
    "dict_type": "table", "model_type": "table", "model_attributes_type": "table",
}
_PLACEHOLDERS = {int: "<whole number>", float: "<number>", str: '"..."', bool: "true", list: "[...]"}


def _missing_message(model: type[BaseModel], loc: KeyPath) -> str:
    owner = _submodel_at(model, loc[:-1])
    info = _find_field(owner, str(loc[-1])) if owner is not None and isinstance(loc[-1], str) else None
    section = ".".join(p for p in loc[:-1] if isinstance(p, str))
    where = (f"to the [[{section}]] section" if loc[:-1] and isinstance(loc[-2], int) else f"to [{section}]") \
        if section else "at the top of the file, above the first [section]"
    if info is None:
        return "is required"
    name = str(loc[-1])
    full = ".".join(p for p in loc if isinstance(p, str))
    if _model_in_annotation(info.annotation) is not None:
        if _is_list(info.annotation):
            return f"is required: add at least one [[{full}]] section"
        return f"is required: add a [{full}] section"
    annotation = info.annotation
    placeholder = next((text for kind, text in _PLACEHOLDERS.items()
                        if annotation is kind or kind in (getattr(annotation, "__args__", ()) or ())), "...")
    hint = f" ({info.description.rstrip('.')})" if info.description else ""
    return f"is required: add `{name} = {placeholder}` {where}{hint}"


def value_at(data: Any, path: KeyPath, default: Any = None) -> Any:
    """The raw value at `path`, or `default` where the data has no such key (or a value of another shape)."""
    node = data
    for part in path:
        if isinstance(part, int):
            if not isinstance(node, list) or not 0 <= part < len(node):
                return default
            node = node[part]
        else:
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
    return node


def normalise_loc(loc: KeyPath, data: Any) -> KeyPath:
    """Drop list indices the user never wrote: a single `[env]` table is validated as a one-element list."""
    out: list[str | int] = []
    node = data
    for part in loc:
        if isinstance(part, int):
            if isinstance(node, dict):
                continue
            node = node[part] if isinstance(node, list) and 0 <= part < len(node) else None
        else:
            node = node.get(part) if isinstance(node, dict) else None
        out.append(part)
    return tuple(out)


def _message(error: Any, model: type[BaseModel], loc: KeyPath, data: Any) -> tuple[str, str | None]:
    """(message, suggestion) for one pydantic error."""
    kind = error["type"]
    value = error.get("input")
    if kind == "missing":
        return _missing_message(model, loc), None
    if kind == "extra_forbidden":
        owner = _submodel_at(model, loc[:-1])
        info = _find_field(owner, str(loc[-1])) if owner is not None else None
        if info is not None and owner is not None:
            # Another spelling of a field that is also set (AliasChoices keeps the first and rejects the rest).
            node = value_at(data, loc[:-1])
            names = [n for n in _field_names(owner) if _find_field(owner, n) is info and n != loc[-1]]
            other = next((n for n in names if isinstance(node, dict) and n in node), names[0] if names else "?")
            return f"`{other}` and `{loc[-1]}` are two spellings of one setting: keep one", None
        suggestion, hint = suggest_key(model, loc)
        return ("unknown key" + (f": {hint}" if hint else "")), suggestion
    if kind in _TYPE_ERRORS:
        return _type_message(_TYPE_ERRORS[kind], value), None
    if kind == "literal_error":
        expected = error.get("ctx", {}).get("expected", "")
        choices = re.findall(r"'([^']*)'", expected)
        suggestion = nearest_name(value, choices) if isinstance(value, str) else None
        return f"must be one of {expected} (got {_render(value)})", suggestion
    if kind == "too_short":
        minimum = error.get("ctx", {}).get("min_length", 1)
        owner = _submodel_at(model, loc[:-1])
        info = _find_field(owner, str(loc[-1])) if owner is not None else None
        if info is not None and _model_in_annotation(info.annotation) is not None:
            return f"must have at least {minimum}: add a [[{'.'.join(map(str, loc))}]] section", None
        return f"must have at least {minimum} entr{'y' if minimum == 1 else 'ies'}", None
    message = str(error["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
    message = message.replace("Input should be", "must be")
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal", "multiple_of") or (
            kind == "value_error" and str(value) not in message):
        message += f" (got {_render(value)})"
    return message, None


def problems_from_validation_error(
    exc: ValidationError, model: type[BaseModel], locator: KeyLocator, file: str | None, data: Any = None
) -> list[Problem]:
    problems: list[Problem] = []
    for error in exc.errors():
        loc: KeyPath = tuple(error["loc"])
        # pydantic adds the tag of a union member to the loc; keep only keys that exist in the document.
        loc = tuple(p for p in loc if not (isinstance(p, str) and p.startswith("function-")))
        where = normalise_loc(loc, data)
        message, suggestion = _message(error, model, where, data)
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
