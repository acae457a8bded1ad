"""The README's and docs/'s links stay inside the repository: every relative link names a file or folder of this
checkout that exists (and a `#section` that one of its headings makes), and no text points above the repository
(`../shared/...` is not in a clone)."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parents[1]

FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+[\"'(][^)]*)?\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s.*)?$", re.M)
HTML_LINK = re.compile(r"""<(?:a|img)\b[^>]*\b(?:href|src)\s*=\s*["']([^"']*)["']""", re.I)
HEADING = re.compile(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", re.M)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
ABOVE = re.compile(r"(?<![\w.])\.\./")


def documents() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def prose(text: str) -> str:
    """`text` without fenced code blocks (no links there) and with each code span's text kept, its backticks gone."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return CODE_SPAN.sub(lambda m: m.group(2).replace("[", "(").replace("]", ")"), text)


def links(text: str) -> list[str]:
    body = prose(text)
    return [*INLINE_LINK.findall(body), *REFERENCE.findall(body), *HTML_LINK.findall(body)]


def slug(heading: str) -> str:
    """The anchor GitHub makes of a heading: its text, lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"[^\w\- ]", "", text.replace("`", "").lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out: set[str] = set()
    for heading in HEADING.findall(prose(path.read_text(encoding="utf-8"))):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def broken_links(doc: Path, root: Path = REPO) -> list[str]:
    """What is wrong with each relative link of `doc` (a file under `root`), one line each."""
    problems = []
    for target in links(doc.read_text(encoding="utf-8")):
        if not target or SCHEME.match(target) or target.startswith("//"):
            continue  # a web address
        where, _, fragment = target.partition("#")
        if where.startswith("/"):
            problems.append(f"{target}: an absolute path; link relative to {doc.parent.relative_to(root)}")
            continue
        path = (doc.parent / unquote(where)).resolve() if where else doc
        if not path.is_relative_to(root):
            problems.append(f"{target}: outside the repository (a clone does not have it); copy it under docs/")
        elif not path.exists():
            problems.append(f"{target}: no such file in the repository")
        elif fragment and path.suffix == ".md" and unquote(fragment).lower() not in anchors(path):
            problems.append(f"{target}: {path.relative_to(root)} has no heading that makes #{fragment}")
    return problems


@pytest.mark.parametrize("doc", documents(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_point_to_files_in_the_repository(doc: Path) -> None:
    problems = broken_links(doc)
    assert not problems, f"{doc.relative_to(REPO)}, broken links:\n" + "\n".join(problems)


@pytest.mark.parametrize("doc", documents(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_text_points_above_the_repository(doc: Path) -> None:
    found = [f"line {n}: {line.strip()}" for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1)
             if ABOVE.search(line)]
    where = doc.relative_to(REPO)
    assert not found, f"{where} names paths above the repository (a clone has none):\n" + "\n".join(found)


def test_the_readme_links_the_design_document() -> None:
    assert "docs/design.md" in links((REPO / "README.md").read_text(encoding="utf-8"))


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    """The checks on a document holding each kind of link, broken and sound (so a reader that finds nothing cannot
    pass the tests above)."""
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "pic.png").write_bytes(b"")
    (root / "docs" / "other.md").write_text("# Other\n## Twice\n## Twice\n")
    text = ("# Top\n## A `code` heading\n[ok](#top) [ok2](#a-code-heading) [gone](#nowhere) [web](https://x.org/a)\n"
            "[up](../../shared/DESIGN.md) [missing](none.md) ![img](pic.png) [there](other.md#twice-1)\n"
            "[`span` text](other.md#nope)\n[ref]: other.md\n"
            "```\n[in code](not-a-link.md)\n```\n`[in a span](not-a-link-either.md)`\n")
    doc = root / "docs" / "doc.md"
    doc.write_text(text)
    assert anchors(doc) == {"top", "a-code-heading"}
    assert anchors(root / "docs" / "other.md") == {"other", "twice", "twice-1"}
    assert links(text) == ["#top", "#a-code-heading", "#nowhere", "https://x.org/a", "../../shared/DESIGN.md",
                           "none.md", "pic.png", "other.md#twice-1", "other.md#nope", "other.md"]
    assert [problem.split(":")[0] for problem in broken_links(doc, root)] == [
        "#nowhere", "../../shared/DESIGN.md", "none.md", "other.md#nope"]
    assert ABOVE.search("(`../shared/notes/one-gpu.md`)") and not ABOVE.search("docs/notes/one-gpu.md")
