"""The problems collector: where keys are (KeyLocator), what a misspelt key probably meant, syntax errors."""

from __future__ import annotations

import tomllib

import pytest
from pydantic import BaseModel, ConfigDict, Field

from prime_lab.problems.validation import (
    KeyLocator,
    Problem,
    nearest_name,
    suggest_key,
    toml_syntax_problem,
    validate_toml,
)

DOC = '''# a comment with [brackets] and key = "value"
model = "m"   # trailing comment
prompt = """
[[env]]
id = "inside a string"
"""
literal = \'\'\'
also = "not a key"
\'\'\'
ratios = [
  1,      # ] not a close
  "]",
  [2, 3],
]

[[env]]
id = "a"
args = { x = 1, nested = { y = "p, q = r" }, list = [1, 2] }

[[env]]
"quoted key" = 1
\'literal key\' = 2
a.b.c = 3

[env.args]
k = "v"

[sampling]
stop = ["a",
        "b"]
max_tokens = 5

[[eval.env]]
id = "e"
'''


@pytest.fixture(scope="module")
def locator() -> KeyLocator:
    tomllib.loads(DOC)  # the fixture document is valid TOML
    return KeyLocator(DOC)


def line(needle: str, nth: int = 1) -> int:
    hits = [i for i, text in enumerate(DOC.splitlines(), 1) if text.startswith(needle)]
    return hits[nth - 1]


@pytest.mark.parametrize(("path", "needle", "nth"), [
    (("model",), "model =", 1),
    (("prompt",), "prompt =", 1),
    (("ratios",), "ratios =", 1),
    (("ratios", 0), "  1,", 1),
    (("ratios", 1), '  "]",', 1),
    (("ratios", 2, 1), "  [2, 3]", 1),
    (("env", 0), "[[env]]", 2),
    (("env", 0, "id"), 'id = "a"', 1),
    (("env", 0, "args", "x"), "args =", 1),
    (("env", 0, "args", "nested", "y"), "args =", 1),
    (("env", 0, "args", "list", 1), "args =", 1),
    (("env", 1), "[[env]]", 3),
    (("env", 1, "quoted key"), '"quoted key"', 1),
    (("env", 1, "literal key"), "'literal key'", 1),
    (("env", 1, "a", "b", "c"), "a.b.c", 1),
    (("env", 1, "a"), "a.b.c", 1),
    (("env", 1, "args"), "[env.args]", 1),
    (("env", 1, "args", "k"), 'k = "v"', 1),
    (("sampling", "stop", 1), '        "b"]', 1),
    (("sampling", "max_tokens"), "max_tokens", 1),
    (("eval", "env", 0, "id"), 'id = "e"', 1),
])
def test_locator_finds_each_key(locator: KeyLocator, path: tuple, needle: str, nth: int) -> None:
    assert locator.lines[path] == line(needle, nth)


def test_locator_ignores_what_is_inside_strings_and_comments(locator: KeyLocator) -> None:
    # `[[env]]` and `id` inside the multi-line string would make a third env; `also` inside the literal string
    assert ("env", 2) not in locator.lines and ("also",) not in locator.lines
    assert ("env", 0, "args", "q") not in locator.lines  # `q = r` is inside a string in an inline table
    assert ("brackets",) not in locator.lines


def test_missing_key_points_at_its_table(locator: KeyLocator) -> None:
    assert locator.line_of(("sampling", "temperature")) == line("[sampling]")
    assert locator.line_of(("env", 1, "id")) == line("[[env]]", 3)
    assert locator.line_of(("nowhere",)) is None


def test_locator_on_broken_text_records_what_was_left_open() -> None:
    locator = KeyLocator('a = 1\nb = [1,\n  2,\nc = "x\nd = """never\nclosed\n')
    assert ("array", 2) in locator.unclosed and ("string", 4) in locator.unclosed
    assert ("string", 5) in locator.unclosed
    assert locator.lines[("c",)] == 4  # a new `key =` line ends the unclosed array


def test_locator_records_repeated_keys_and_headers() -> None:
    locator = KeyLocator("[a]\nx = 1\n[b]\n[a]\nx = 2\n")
    assert locator.repeated == {4: (("a",), 1), 5: (("a", "x"), 2)}


def test_crlf_and_empty_documents() -> None:
    assert KeyLocator("a = 1\r\n[t]\r\nb = 2\r\n").lines[("t", "b")] == 3
    assert KeyLocator("").lines == {}


@pytest.mark.parametrize(("text", "line", "words"), [
    ('a = 1\nb = "open\nc = 2\n', 2, "not closed on its line"),
    ("a = 1\nb = 2\na = 3\n", 3, "`a` is set twice (first on line 1)"),
    ("[t]\nx = 1\n[t]\n", 3, "table [t] is declared twice (first on line 1)"),
    ("a = 1\n[t\nb = 2\n", 2, "table header is not closed"),
    ("a = 1\nb 2\n", 2, "expected `=`"),
    ("a = [\n  1,\n  2,\nb = 3\n", 1, "array is never closed"),
    ("a = [\n  1\nb = 3\n", 1, "array is never closed"),
    ('a = 1\nb = """\ntext\n', 2, "string is never closed"),
    ("a = yes\n", 1, "put strings in quotes"),
])
def test_syntax_errors_point_at_the_line_to_fix(text: str, line: int, words: str) -> None:
    with pytest.raises(tomllib.TOMLDecodeError) as caught:
        tomllib.loads(text)
    problem = toml_syntax_problem(caught.value, text, "f.toml")
    assert (problem.line, problem.key) == (line, "")
    assert problem.message.startswith("invalid TOML: ") and words in problem.message


@pytest.mark.parametrize(("key", "candidates", "expected"), [
    ("max_stpes", ["max_steps", "max_tokens", "batch_size"], "max_steps"),
    ("rollout_per_example", ["rollouts_per_example", "batch_size"], "rollouts_per_example"),
    ("Max_Steps", ["max_steps"], "max_steps"),
    ("max-steps", ["max_steps"], "max_steps"),
    ("temprature", ["temperature", "top_p"], "temperature"),
    ("zzz", ["max_steps", "model"], None),
    ("anything", [], None),
])
def test_nearest_name(key: str, candidates: list[str], expected: str | None) -> None:
    assert nearest_name(key, candidates) == expected


class Inner(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    max_tokens: int = Field(ge=1)
    temperature: float = 1.0


class Outer(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    max_steps: int
    sampling: Inner
    items: list[Inner] = []


def test_suggest_prefers_the_section_a_key_belongs_to() -> None:
    assert suggest_key(Outer, ("temperature",)) == ("sampling.temperature", "it belongs in [sampling]")
    # `max_steps` under [sampling] is misplaced, not a typo of max_tokens
    assert suggest_key(Outer, ("sampling", "max_steps"))[0] == "max_steps"
    assert suggest_key(Outer, ("sampling", "max_tokns")) == ("max_tokens", None)
    assert suggest_key(Outer, ("items", 3, "temprature")) == ("temperature", None)
    assert suggest_key(Outer, ("unrelated",)) == (None, None)


def test_validate_toml_collects_every_problem_with_lines() -> None:
    text = 'max_stpes = 3\n\n[sampling]\nmax_tokens = "5"\n\n[[items]]\nmax_tokens = 0\ntemprature = 1\n'
    result = validate_toml(text, Outer, file="x.toml")
    got = {(p.line, p.key, p.suggestion) for p in result.problems}
    assert got == {(1, "max_stpes", "max_steps"), (None, "max_steps", None), (4, "sampling.max_tokens", None),
                   (7, "items[0].max_tokens", None), (8, "items[0].temprature", "temperature")}
    assert result.config is None and not result.ok
    assert "write 5 without quotes" in next(p.message for p in result.problems if p.line == 4)


def test_a_failing_check_becomes_a_problem_not_a_traceback() -> None:
    def broken(ctx: object) -> None:
        raise KeyError("oops")

    result = validate_toml("max_steps = 1\n[sampling]\nmax_tokens = 1\n", Outer, checks=[broken])
    assert [p.message for p in result.errors] == ["internal error in check broken: KeyError: 'oops' (please report it)"]


def test_problem_format() -> None:
    assert Problem("a.b", "unknown key", 3, "f.toml", suggestion="a.c").format() == \
        "f.toml:3: a.b: unknown key (did you mean `a.c`?)"
    assert Problem("k", "hosted only", 2, "f.toml", severity="note").format() == "f.toml:2: note: k: hosted only"
    assert Problem("", "no such file", file="f.toml").format() == "f.toml: no such file"
