"""What the dashboards fold a log into, without the app: bounded series fed a chunk at a time, and the chunked
reader of events.jsonl."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from prime_lab.runs.events import BadLine
from prime_lab.workbench.dashboards.files import read_events
from prime_lab.workbench.dashboards.rl_model import RLRunModel
from prime_lab.workbench.dashboards.series import DownsampledSeries


@pytest.mark.parametrize("capacity", [4, 16, 1024])
def test_a_chunk_of_points_makes_the_series_its_points_one_by_one_make(capacity: int) -> None:
    rng = random.Random(capacity)
    xs = [float(x) for x in range(5000)]
    ys = [rng.random() for _ in xs]
    ys[17] = math.nan  # not drawable: left out either way
    ys[3001] = math.inf
    one_by_one, chunked = DownsampledSeries(capacity), DownsampledSeries(capacity)
    for x, y in zip(xs, ys, strict=True):
        one_by_one.append(x, y)
    start = 0
    while start < len(xs):
        end = start + rng.choice([1, 2, 3, 50, 700])
        chunked.extend(xs[start:end], ys[start:end])
        start = end
    assert chunked.count == one_by_one.count == len(xs) - 2
    assert chunked.bucket == one_by_one.bucket and len(chunked) == len(one_by_one) <= capacity + 1
    assert chunked.last == one_by_one.last
    for mine, theirs in zip(chunked.points(), one_by_one.points(), strict=True):
        assert mine == pytest.approx(theirs, rel=1e-12)


def event(seq: int, kind: str, step: int | None, data: dict[str, object]) -> str:
    return json.dumps({"seq": seq, "time": 1.0, "source": "orchestrator", "kind": kind, "step": step, "data": data})


def test_a_long_log_read_in_chunks_gives_every_event_once_and_says_when_it_reached_the_end(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    lines = [event(seq, "metrics", seq, {"reward/mean": seq / 1000}) for seq in range(1, 1001)]
    path.write_text("\n".join(lines) + "\n" + lines[0][:20])  # and a line still being written
    seen, offset, reads = [], 0, 0
    while True:
        reads += 1
        items, after = read_events(path, offset, max_bytes=4096)
        seen += items
        if after - offset < 4096:  # a short read: the end
            break
        offset = after
    assert [item["seq"] for item in seen if isinstance(item, dict)] == list(range(1, 1001))
    assert reads > 10 and after == path.stat().st_size - 20  # the partial line is left for later


def test_corrupt_lines_in_a_chunk_are_reported_and_the_rest_kept(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    good = [event(seq, "log", 1, {"message": f"line {seq}"}) for seq in range(1, 5)]
    lines = [good[0], "", good[1], '{"seq": 9, "kind": "lo', f"{good[2]},{good[3]}", '{"seq": "x", "kind": "log"}']
    path.write_text("\n".join(lines) + "\n")
    items, offset = read_events(path, 0)
    assert offset == path.stat().st_size
    assert [item["seq"] for item in items if isinstance(item, dict)] == [1, 2]
    bad = [item for item in items if isinstance(item, BadLine)]
    assert len(bad) == 3  # the cut line, two events on one line, a line that is no event (the blank one: skipped)
    assert bad[0].text.startswith('{"seq": 9') and bad[0].offset == len(good[0]) + 1 + 1 + len(good[1]) + 1
    path.write_text(f"{good[0]}\n{good[1]},{good[2]}\n")  # valid JSON once the lines are joined into one array
    items, _ = read_events(path, 0)
    assert isinstance(items[0], dict) and isinstance(items[1], BadLine) and len(items) == 2


def test_metrics_that_are_not_finite_are_read_as_python_writes_them(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text(event(1, "metrics", 1, {"loss": 0.5}) + "\n" + event(2, "metrics", 2, {"loss": math.nan}) + "\n"
                    + event(3, "metrics", 3, {"loss": math.inf, "policy/kl": 1e400}) + "\n")
    assert "NaN" in path.read_text() and "Infinity" in path.read_text()
    items, _ = read_events(path, 0)
    assert [item["seq"] for item in items if isinstance(item, dict)] == [1, 2, 3]
    assert math.isnan(items[1]["data"]["loss"]) and items[2]["data"]["policy/kl"] == math.inf  # type: ignore[index]


def test_a_log_folded_in_chunks_gives_the_model_it_gives_in_one_go(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    lines = []
    for step in range(1, 3001):
        lines.append(event(2 * step - 1, "metrics", step, {"reward/mean": step / 3000, "loss": 1 / step}))
        lines.append(event(2 * step, "sample", step, {"example_id": str(step), "completion": f"answer {step}"}))
    path.write_text("\n".join(lines) + "\n")
    whole, chunked = RLRunModel(capacity=64), RLRunModel(capacity=64)
    whole.feed(read_events(path, 0, max_bytes=1 << 30)[0])
    offset = 0
    while True:
        items, offset = read_events(path, offset, max_bytes=2000)
        if not items:
            break
        chunked.feed(items)
    assert chunked.latest_step == whole.latest_step == 3000
    assert chunked.latest() == whole.latest()
    for key in ("reward/mean", "loss"):
        for mine, theirs in zip(chunked.series[key].points(), whole.series[key].points(), strict=True):
            assert mine == pytest.approx(theirs, rel=1e-12)
        assert chunked.series[key].count == 3000 and len(chunked.series[key]) <= 64 + 1


def restarted_log() -> list[dict]:
    """Steps 1-8 (attempt 1), a restart from the checkpoint of step 6, steps 7-10 (attempt 2, other values)."""
    def step(seq: int, k: int, attempt: int) -> list[dict]:
        return [{"seq": seq, "time": 0.0, "source": "trainer", "kind": "metrics", "step": k,
                 "data": {"loss": attempt * 100.0 + k}, "attempt": attempt},
                {"seq": seq, "time": 0.0, "source": "orchestrator", "kind": "sample", "step": k,
                 "data": {"completion": f"a{attempt}s{k}", "example_id": k}, "attempt": attempt}]
    out = [e for k in range(1, 9) for e in step(k, k, 1)]
    out.append({"seq": 9, "time": 0.0, "source": "launcher", "kind": "restart", "step": 6,
                "data": {"from_step": 6}, "attempt": 2})
    return out + [e for k in range(7, 11) for e in step(10 + k, k, 2)]


@pytest.mark.parametrize("chunk", [1, 5, 100])
def test_a_restart_shows_each_step_once_with_its_latest_attempt(chunk: int) -> None:
    events = restarted_log()
    model = RLRunModel()
    for start in range(0, len(events), chunk):
        model.feed(events[start:start + chunk])
    xs, ys = model.series["loss"].points()
    assert xs == [float(k) for k in range(1, 11)]
    assert ys == [100.0 + k for k in range(1, 7)] + [200.0 + k for k in range(7, 11)]
    assert [s["completion"] for s in model.samples if s["step"] in (6, 7)] == ["a1s6", "a2s7"]
    assert model.latest_step == 10 and model.latest()["loss"] == 210.0


def test_rewinding_a_downsampled_series_keeps_the_points_before_the_restart() -> None:
    series = DownsampledSeries(4)
    series.extend([float(x) for x in range(1, 21)], [float(x) for x in range(1, 21)])
    series.rewind(12.0)
    xs, _ = series.points()
    assert xs and max(xs) <= 12.0 and series.last is not None and series.last[0] <= 12.0
    series.extend([13.0, 14.0], [0.0, 0.0])
    assert series.points()[0][-1] > 12.0
