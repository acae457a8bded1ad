"""How a run's facts read to a person: a duration as long as it needs to be, a size in bytes, a text cut to one line.

One spelling for the CLI's tables and the dashboards' headers alike (`prime train progress` and the RL dashboard show
the same elapsed time the same way)."""

from __future__ import annotations


def duration(seconds: float | None) -> str:
    """`45s`, `3m 40s`, `2h 05m`, `1d 3h`: as long as a person needs, no longer (`-` when unknown; a negative time,
    a clock set back, reads `0s`)."""
    if seconds is None:
        return "-"
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h {minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h"


def size(num_bytes: float | None) -> str:
    """`512 B`, `1.5 KiB`, `102.4 MiB`, `4.0 GiB` (GiB the largest unit; `-` when unknown)."""
    if num_bytes is None:
        return "-"
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def one_line(text: object, width: int) -> str:
    """`text` on one line (every run of whitespace, newlines included, one space), cut to `width` characters with `…`
    as the last when it is longer."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"
