"""`prime`'s tables into a file or a pipe keep their natural width (rich alone squeezes them into 80 columns)."""

from __future__ import annotations

import pytest

from prime_lab.workbench.cli import render

LONG = ("gepa-h3nwja", "running", "gepa", "smollm2-135m-instruct-with-a-long-name", "my-environment-name",
        "2026-11-27 14:03", "a note that is long enough to need more than eighty columns beside the others")


def test_a_table_into_a_pipe_keeps_every_value_whole_on_one_line(capsys: pytest.CaptureFixture[str],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    render.print_table(["ID", "STATE", "KIND", "MODEL", "ENVIRONMENT", "STARTED", "NOTE"], [LONG])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2, lines  # the header and the row, neither wrapped
    assert all(value in lines[1] for value in LONG) and "…" not in lines[1]


def test_columns_set_by_the_user_still_win(capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "60")
    render.print_table(["ID", "MODEL", "NOTE"], [(LONG[0], LONG[3], LONG[6])])
    assert max(len(line) for line in capsys.readouterr().out.splitlines()) <= 60
