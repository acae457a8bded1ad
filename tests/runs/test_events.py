"""The event bus: global seq, whole lines under concurrent writers, tailing readers that tolerate bad lines."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from prime_lab.runs.events import BadLine, Event, EventLog, EventWriter

WRITER_SCRIPT = """
import sys
from prime_lab.runs.events import EventWriter
path, writer_id, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with EventWriter(path, "trainer") as w:
    for i in range(count):
        w.emit("metrics", {"writer": writer_id, "i": i, "pad": "x" * (i % 97)}, step=i)
"""


def test_seq_is_global_and_replay_returns_everything(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    a, b = EventWriter(path, "trainer"), EventWriter(path, "orchestrator")
    seqs = [a.emit("log", {"message": "one"}), b.emit("log", {"message": "two"}), a.metrics({"loss": 1.5}, step=3)]
    assert seqs == [1, 2, 3]
    events = EventLog(path).events()
    assert [(e.seq, e.source, e.kind) for e in events] == [(1, "trainer", "log"), (2, "orchestrator", "log"),
                                                           (3, "trainer", "metrics")]
    assert events[2].step == 3 and events[2].data == {"loss": 1.5}


def test_partial_last_line_waits_for_its_end(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    EventWriter(path, "trainer").emit("log", {"message": "whole"})
    full = json.dumps({"seq": 2, "time": 0, "source": "trainer", "kind": "log", "step": None, "data": {}})
    with open(path, "a") as fh:
        fh.write(full[:20])
    log = EventLog(path)
    items, offset = log.read(0)
    assert [i.seq for i in items if isinstance(i, Event)] == [1]
    with open(path, "a") as fh:
        fh.write(full[20:] + "\n")
    more, _ = log.read(offset)
    assert [i.seq for i in more if isinstance(i, Event)] == [2]


def test_corrupt_line_is_skipped_with_notice_and_next_writer_recovers(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    writer = EventWriter(path, "trainer")
    writer.emit("log", {"message": "before"})
    with open(path, "a") as fh:
        fh.write('{"seq": 2, "time": 1, "sou')  # a writer killed mid-line
    EventWriter(path, "orchestrator").emit("log", {"message": "after"})
    bad: list[BadLine] = []
    events = list(EventLog(path).tail(0, on_bad_line=bad.append))
    assert [e.data["message"] for e in events] == ["before", "after"]
    assert events[1].seq == 2  # the torn line never became an event
    assert len(bad) == 1 and bad[0].text.startswith('{"seq": 2')


def test_follow_sees_events_written_after_it_started(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    seen: list[int] = []
    done = threading.Event()

    def reader() -> None:
        for event in EventLog(path).tail(0, follow=True, poll=0.01, stop=done.is_set):
            seen.append(event.data["i"])

    thread = threading.Thread(target=reader)
    thread.start()
    with EventWriter(path, "trainer") as writer:
        for i in range(50):
            writer.emit("metrics", {"i": i})
            if i % 10 == 0:
                time.sleep(0.02)
    done.set()
    thread.join(timeout=10)
    assert seen == list(range(50))


def test_four_writer_processes_and_a_following_reader(tmp_path: Path) -> None:
    """4 processes x 20,000 events while a reader follows: every event once, per-writer order, no torn line."""
    path = tmp_path / "events.jsonl"
    count, writers = 20_000, 4
    got: list[Event] = []
    bad: list[BadLine] = []
    finished = threading.Event()

    def reader() -> None:
        got.extend(EventLog(path).tail(0, follow=True, poll=0.005, stop=finished.is_set, on_bad_line=bad.append))

    thread = threading.Thread(target=reader)
    thread.start()
    procs = [subprocess.Popen([sys.executable, "-c", WRITER_SCRIPT, str(path), str(w), str(count)])
             for w in range(writers)]
    assert all(p.wait(timeout=300) == 0 for p in procs)
    finished.set()
    thread.join(timeout=60)
    assert not bad
    assert len(got) == writers * count
    assert [e.seq for e in got] == list(range(1, writers * count + 1))
    for w in range(writers):
        assert [e.data["i"] for e in got if e.data["writer"] == w] == list(range(count))


def test_final_timeline_keeps_each_steps_latest_attempt() -> None:
    from prime_lab.runs.events import RESTART, final_timeline

    def metrics(seq: int, step: int, attempt: int) -> Event:
        return Event(seq, 0.0, "trainer", "metrics", step, {"loss": float(attempt * 100 + step)}, attempt)

    events = [metrics(i, i, 1) for i in range(1, 9)]
    events.append(Event(9, 0.0, "launcher", "log", None, {"message": "attempt 1 log"}, 1))
    events.append(Event(10, 0.0, "launcher", RESTART, 6, {"from_step": 6}, 2))
    events += [metrics(10 + i, 6 + i, 2) for i in range(1, 5)]
    final = final_timeline(events)
    steps = [(e.step, e.attempt) for e in final if e.kind == "metrics"]
    assert steps == [(1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (6, 1), (7, 2), (8, 2), (9, 2), (10, 2)]
    assert [e.data["message"] for e in final if e.kind == "log"] == ["attempt 1 log"]


def test_events_carry_their_attempt(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    with EventWriter(path, "trainer", attempt=3) as writer:
        writer.metrics({"loss": 1.0}, step=4)
    [event] = EventLog(path).events()
    assert event.attempt == 3 and event.step == 4


def test_read_in_chunks_gives_each_event_once_and_lines_that_are_no_event_as_bad_lines(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    with EventWriter(path, "trainer") as writer:
        for step in range(1, 201):
            writer.metrics({"loss": 1 / step, "kl": float("nan") if step == 7 else 0.0}, step=step)
    with open(path, "a") as fh:  # valid JSON, but not events Event.from_json takes
        fh.write('{"seq": 201, "time": "later", "kind": "log"}\n{"seq": 202, "kind": 3}\n')
    log, offset, events, bad, reads = EventLog(path), 0, [], [], 0
    while True:
        reads += 1
        items, after = log.read(offset, max_bytes=1000)
        events += [i for i in items if isinstance(i, Event)]
        bad += [i for i in items if isinstance(i, BadLine)]
        if after == offset:
            break
        offset = after
    assert [e.step for e in events] == list(range(1, 201)) and offset == path.stat().st_size
    assert reads > path.stat().st_size // 2000  # the limit held (a read finishes the line it cuts)
    assert events[6].data["kl"] != events[6].data["kl"]  # NaN, as Python's json wrote it
    assert [b.text[:12] for b in bad] == ['{"seq": 201,', '{"seq": 202,']
    assert log.read(0)[0][:200] == events  # one read without a limit: the same events
