"""Which line each key of a TOML document is on, and what a TOML syntax error means for the line to fix.

`KeyLocator` maps key paths to lines; `explain_syntax_error` turns tomllib's message into the line to fix and what to
write there. Nothing here knows about schemas or problems: see
`problems.validation` (the collector) and `problems.messages` (messages from pydantic's errors).
"""

from __future__ import annotations

import re
import tomllib

KeyPath = tuple[str | int, ...]


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
# TOML syntax errors: the line to fix and what to write there.

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


def explain_syntax_error(exc: tomllib.TOMLDecodeError, text: str) -> tuple[int, str]:
    """(the line to fix, a message that says how to fix it) for a TOML syntax error in `text`."""
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
    return line, message
