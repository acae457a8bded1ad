"""The run follower without the app: a run folder's status and events.jsonl, replayed from zero and then followed,
folded into a dashboard model (no Textual here; a fresh interpreter checks it stays so)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time

from prime_lab.runs.events import BadLine
from prime_lab.runs.registry import Run, RunRegistry
from prime_lab.workbench.dashboards.event_folds import RawEvent
from prime_lab.workbench.dashboards.files import MAX_READ
from prime_lab.workbench.dashboards.follower import RunFollower
from prime_lab.workbench.dashboards.rl_model import RLRunModel


class ModelTarget:
    """What a run page does with the follower's calls, minus the drawing: feeds an RL model."""

    def __init__(self, follower_lock: list[threading.Lock]) -> None:
        self.model = RLRunModel()
        self.seqs: list[int] = []
        self.resets = 0
        self.files_read = 0
        self.lock_held_for_files: list[bool] = []
        self._lock = follower_lock  # filled in once the follower exists

    def reset(self) -> None:
        self.model = RLRunModel()
        self.seqs = []
        self.resets += 1

    def consume(self, items: list[RawEvent | BadLine]) -> None:
        self.model.feed(items)
        self.seqs += [item["seq"] for item in items if not isinstance(item, BadLine)]

    def follow_files(self) -> None:
        self.files_read += 1
        self.lock_held_for_files.append(self._lock[0].locked())


def new_run(run_id: str, steps: int = 3) -> Run:
    run = RunRegistry().create("rl", config_text="", resolved={}, model="m", envs=["e"], max_steps=10, run_id=run_id)
    run.update_status(state="running")
    with run.writer("orchestrator") as writer:
        writer.log("orchestrator started", step=0)
        for step in range(1, steps + 1):
            writer.metrics({"reward/mean": step / 4}, step=step)
    return run


def written_seqs(run: Run) -> list[int]:
    """The seq of every whole event line in the run's log, in order."""
    seqs = []
    for line in run.events_path.read_text().splitlines():
        try:
            seqs.append(json.loads(line)["seq"])
        except ValueError:
            pass
    return seqs


def follower_for(run: Run) -> tuple[RunFollower, ModelTarget]:
    lock: list[threading.Lock] = []
    target = ModelTarget(lock)
    follower = RunFollower(run, target)
    lock.append(follower.lock)
    return follower, target


def test_a_replay_folds_the_whole_log_then_follows_what_is_appended() -> None:
    run = new_run("rl-follow")
    with run.events_path.open("a") as fh:
        fh.write('{"seq": 99, "kind": "metr\n')  # a corrupt line: skipped and counted
    follower, target = follower_for(run)
    caught_up: list[float] = []

    assert follower.step(on_caught_up=lambda: caught_up.append(1)) is True  # a short read: caught up
    assert follower.live and len(caught_up) == 1
    assert target.resets == 1 and target.files_read == 1 and target.lock_held_for_files == [False]
    assert target.model.latest_step == 3
    assert target.seqs == written_seqs(run) and len(target.seqs) == 5  # the launcher's `queued`, a log, 3 metrics
    assert follower.bad_lines == 1
    assert follower.event_offset == run.events_path.stat().st_size
    assert follower.status["state"] == "running"
    assert follower.changed.is_set() and follower.clear_tail
    assert list(follower.tail)[-1] == "step    3 [orchestrator] metrics: reward/mean=0.75"
    assert follower.replay_note() == ""

    with run.writer("trainer") as writer:
        writer.metrics({"reward/mean": 1.0}, step=4)
    follower.changed.clear()
    assert follower.step(on_caught_up=lambda: caught_up.append(1)) is True
    assert target.model.latest_step == 4 and target.seqs == written_seqs(run)
    assert follower.changed.is_set()
    assert len(caught_up) == 1  # went live once: new events fold into the live model
    assert follower.step() is True  # nothing new: still caught up, nothing folded twice
    assert target.seqs == written_seqs(run) and len(target.seqs) == 6


def test_a_log_longer_than_one_read_is_read_on_before_it_goes_live() -> None:
    run = new_run("rl-long", steps=0)
    padding = "x" * 300
    steps = 2 * MAX_READ // 300 + 100
    with run.events_path.open("a") as fh:
        for step in range(1, steps + 1):
            fh.write(json.dumps({"seq": step + 2, "time": 1.0, "source": "trainer", "kind": "metrics", "step": step,
                                 "data": {"reward/mean": 0.5, "note": padding}}) + "\n")
    follower, target = follower_for(run)

    assert follower.step() is False  # a full read: more is waiting
    assert not follower.live
    assert follower.replay_note().startswith("replaying the event log: ")
    assert follower.replay_note() != "replaying the event log: 100%"
    reads = 1
    while not follower.step():
        reads += 1
    assert reads >= 2 and follower.live
    assert target.seqs == written_seqs(run) == list(range(1, steps + 3))  # every event once, in order
    assert target.model.latest_step == steps


def test_replay_starts_over_from_byte_zero() -> None:
    run = new_run("rl-replay")
    follower, target = follower_for(run)
    caught_up: list[float] = []
    follower.step(on_caught_up=lambda: caught_up.append(1))
    follower.clear_tail = False  # the page wrote the tail
    follower.replay()
    assert follower.step(on_caught_up=lambda: caught_up.append(1)) is True
    assert target.resets == 2 and target.seqs == written_seqs(run)  # folded again, once
    assert follower.clear_tail  # the page starts its event log over
    assert len(caught_up) == 2  # and draws at once again


def test_a_deleted_run_is_followed_without_errors() -> None:
    run = new_run("rl-gone")
    follower, target = follower_for(run)
    follower.step()
    shutil.rmtree(run.dir)
    follower._next_status = 0.0  # (the next status read is due)
    assert follower.step() is True
    assert follower.status == {} and target.model.latest_step == 3


def test_the_follower_thread_follows_a_writer_and_stops_when_cancelled() -> None:
    run = new_run("rl-thread")
    follower, target = follower_for(run)
    stop = threading.Event()
    live = threading.Event()
    thread = threading.Thread(target=follower.follow, args=(0.01, stop.is_set, live.set), daemon=True)
    thread.start()
    try:
        assert live.wait(10)
        with run.writer("trainer") as writer:
            for step in range(4, 8):
                writer.metrics({"reward/mean": 0.9}, step=step)
        deadline = time.monotonic() + 10
        while target.model.latest_step != 7 and time.monotonic() < deadline:
            time.sleep(0.01)
        with follower.lock:
            assert target.model.latest_step == 7
    finally:
        stop.set()
        thread.join(5)
    assert not thread.is_alive()


def test_the_follower_imports_without_textual() -> None:
    code = ("import sys, prime_lab.workbench.dashboards.follower\n"
            "print(sorted(m for m in ('textual', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
