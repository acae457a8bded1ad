"""How a run's facts read to a person: durations at each unit's boundary, texts cut to one line."""

from __future__ import annotations

import pytest

from prime_lab.runs.display import duration, one_line


@pytest.mark.parametrize(("seconds", "shown"), [
    (None, "-"),
    (0, "0s"),
    (59.4, "59s"),
    (59.6, "1m 00s"),  # rounded, not cut: 59.6 s is a minute
    (60, "1m 00s"),
    (220, "3m 40s"),
    (3599, "59m 59s"),
    (3600, "1h 00m"),
    (2 * 3600 + 5 * 60 + 59, "2h 05m"),  # past the hour, seconds are dropped
    (86399, "23h 59m"),
    (86400, "1d 0h"),
    (27 * 3600, "1d 3h"),
    (-5, "0s"),  # a clock set back
])
def test_a_duration_reads_in_the_units_it_needs(seconds: float | None, shown: str) -> None:
    assert duration(seconds) == shown


def test_one_line_joins_the_lines_and_squeezes_the_whitespace() -> None:
    assert one_line("  What is\n\n2 +\t2?  ", 80) == "What is 2 + 2?"


def test_one_line_cuts_a_longer_text_to_the_width_with_an_ellipsis() -> None:
    assert one_line("abcdef", 6) == "abcdef"
    assert one_line("abcdefg", 6) == "abcde…"
    assert len(one_line("word " * 100, 80)) == 80


def test_one_line_reads_anything_as_its_text() -> None:
    assert one_line({"role": "user"}, 40) == "{'role': 'user'}"


def test_size_in_binary_units_up_to_gib() -> None:
    from prime_lab.runs.display import size

    assert [size(n) for n in (None, 0, 1023, 1024, 1536, 100 * 2**20 + 2**19, 2**30, 3 * 2**40)] == [
        "-", "0 B", "1023 B", "1.0 KiB", "1.5 KiB", "100.5 MiB", "1.0 GiB", "3072.0 GiB"]
