"""A run's `sandbox/*` metrics per step (sandbox/stats.py): the lines the core appends to the run's
sandbox_stats.jsonl, folded since the previous step; a torn or partial line never counts twice or breaks a step."""

from __future__ import annotations

import json
from pathlib import Path

from prime_lab.sandbox.stats import METRICS, STATS_FILE, StatsFollower, fold, records


def line(event: str, **fields: object) -> str:
    return json.dumps({"time": 1.0, "event": event, "id": "sbx-0123456789", **fields}) + "\n"


def command(seconds: float, code: int = 0, timed_out: bool = False, oom: bool = False) -> str:
    return line("command", seconds=seconds, exit_code=code, timed_out=timed_out, oom=oom)


def test_the_fold_counts_creations_commands_timeouts_and_ooms() -> None:
    stats = fold(records([line("created"), line("created"), command(0.5), command(2.0, 124, timed_out=True),
                          command(0.3, 137, oom=True), "{torn", "", "[1]", line("deleted")]))
    assert stats.metrics() == {"sandbox/created": 2.0, "sandbox/commands": 3.0, "sandbox/timed_out": 1.0,
                               "sandbox/oom": 1.0, "sandbox/command_seconds": 0.9333333333333332}
    assert fold([]).metrics()["sandbox/command_seconds"] == 0.0  # a step without commands: 0, not a division


def test_the_follower_takes_each_step_what_was_appended_since(tmp_path: Path) -> None:
    stats = tmp_path / STATS_FILE
    follower = StatsFollower(tmp_path)
    assert follower.take() == {}  # no sandbox yet: a run without sandboxes gets no sandbox/* metrics
    stats.write_text(line("created") + command(1.0) + command(3.0)[:20])  # the last line still being written
    first = follower.take()
    assert list(first) == list(METRICS)
    assert (first["sandbox/created"], first["sandbox/commands"], first["sandbox/command_seconds"]) == (1, 1, 1.0)
    with stats.open("a") as fh:
        fh.write(command(3.0)[20:])
    second = follower.take()  # the finished line, once
    assert (second["sandbox/created"], second["sandbox/commands"], second["sandbox/command_seconds"]) == (0, 1, 3.0)
    assert follower.take() == dict.fromkeys(METRICS, 0.0)  # a quiet step after the first sandbox: zeros


def test_a_resumed_run_starts_where_the_file_ends(tmp_path: Path) -> None:
    (tmp_path / STATS_FILE).write_text(line("created") + command(1.0))  # the earlier attempt's
    follower = StatsFollower(tmp_path)
    assert follower.take() == dict.fromkeys(METRICS, 0.0)
