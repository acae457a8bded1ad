"""Expectations written in a TOML file's header comments, shared by the reference-example and corpus tests.

    # expect: ok                                          no errors at all
    # expect: 7 sampling.temperature: greater than or     an error on line 7 at this dotted key whose message
    #                                                     contains the text after the colon (`-` for no line,
    #                                                     `(toml)` for a syntax error, which has no key)
    # suggest: max_tokens                                 that error's did-you-mean suggestion
    # expect-note: checkpoints.keep_cloud                 a note (severity "note") at this key
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from prime_lab.problems.validation import Problem, Validation

_EXPECT_RE = re.compile(r"^# expect: (\d+|-) (\S+): (.+)$")


@dataclass
class Expected:
    line: int | None
    key: str
    text: str
    suggestion: str | None = None

    def matches(self, problem: Problem) -> bool:
        return (problem.severity == "error" and problem.line == self.line and problem.key == self.key
                and self.text in problem.message
                and (self.suggestion is None or problem.suggestion == self.suggestion))

    def __str__(self) -> str:
        hint = f" (suggest {self.suggestion})" if self.suggestion else ""
        return f"{self.line or '-'} {self.key or '(toml)'}: {self.text}{hint}"


@dataclass
class Expectations:
    ok: bool = False
    errors: list[Expected] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def check(self, result: Validation) -> None:  # type: ignore[type-arg]
        shown = "\n".join(p.format() for p in result.problems) or "(no problems)"
        if self.ok:
            assert not result.errors, f"expected no errors, got:\n{shown}"
            assert result.config is not None
        for expected in self.errors:
            assert any(expected.matches(p) for p in result.problems), f"expected {expected}, got:\n{shown}"
        if self.errors:
            assert result.config is None
        for key in self.notes:
            assert any(p.severity == "note" and p.key == key for p in result.problems), \
                f"expected a note at {key}, got:\n{shown}"


def read_expectations(path: Path) -> Expectations:
    out = Expectations()
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        if line.strip() == "# expect: ok":
            out.ok = True
        elif line.startswith("# expect-note: "):
            out.notes.append(line.removeprefix("# expect-note: ").strip())
        elif line.startswith("# suggest: "):
            out.errors[-1].suggestion = line.removeprefix("# suggest: ").strip()
        elif match := _EXPECT_RE.match(line):
            where, key, text = match.groups()
            out.errors.append(Expected(None if where == "-" else int(where), "" if key == "(toml)" else key,
                                       text.strip()))
    assert out.ok or out.errors, f"{path.name}: no `# expect:` line in the header"
    return out
