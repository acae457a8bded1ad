"""Snapshot tests: when a screenshot differs from the stored one, the failure shows the differing screen rows as
text (the HTML report that pytest-textual-snapshot writes stays on the machine that ran the tests, and CI keeps only
the output)."""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from typing import Any

import pytest

from tests.support.installed_envs import site  # noqa: F401 - a fixture of the tests here (installed environments)

TEXT = re.compile(r'<text class="[^"]*" x="([\d.]+)" y="([\d.]+)"[^>]*>(.*?)</text>')


def screen_rows(svg: str) -> list[str]:
    """The text of a Textual SVG screenshot, a string per screen row."""
    rows: dict[float, list[tuple[float, str]]] = {}
    for x, y, text in TEXT.findall(svg):
        rows.setdefault(float(y), []).append((float(x), html.unescape(text).replace("\xa0", " ")))
    return ["".join(text for _, text in sorted(cells)) for _, cells in sorted(rows.items())]


def rows_diff(expected: list[str], actual: list[str]) -> list[str]:
    lines = []
    for i in range(max(len(expected), len(actual))):
        want = expected[i] if i < len(expected) else "<no row>"
        got = actual[i] if i < len(actual) else "<no row>"
        if want != got:
            lines += [f"row {i:2} expected: {want}", f"row {i:2} actual:   {got}"]
    return lines or ["(same text: the difference is in colours or styles)"]


@pytest.fixture
def snap_compare(snap_compare: Callable[..., bool], request: pytest.FixtureRequest) -> Callable[..., bool]:
    """The plugin's snap_compare, printing the rows that differ when the screenshot does not match."""

    def compare(*args: Any, **kwargs: Any) -> bool:
        import textual._doc as doc

        taken: list[str] = []
        take = doc.take_svg_screenshot

        def keep(*a: Any, **k: Any) -> str:
            taken.append(take(*a, **k))
            return taken[-1]

        doc.take_svg_screenshot = keep  # the plugin imports it from textual._doc at each call
        try:
            matched = snap_compare(*args, **kwargs)
        finally:
            doc.take_svg_screenshot = take
        stored = request.node.path.parent / "__snapshots__" / request.node.path.stem / f"{request.node.name}.svg"
        if not matched and taken and stored.exists():
            print("\n".join(["screen rows that differ from the stored snapshot:",
                             *rows_diff(screen_rows(stored.read_text()), screen_rows(taken[-1]))]))
        return matched

    return compare
