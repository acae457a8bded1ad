"""The orchestrator's async-level rule (trainer/scheduler.py): which policy versions a batch takes, when a group may
start, and when a finished group waits for the next batch."""

from __future__ import annotations

import pytest

from prime_lab.trainer.config import RLConfig
from prime_lab.trainer.scheduler import BatchSchedule


def schedule(max_async_level: int, *, groups_per_batch: int = 2, group_size: int = 4, max_steps: int = 10,
             rollout_target: int = 1000) -> BatchSchedule:
    return BatchSchedule(group_size=group_size, groups_per_batch=groups_per_batch, rollout_target=rollout_target,
                         max_async_level=max_async_level, max_steps=max_steps)


def may_start(s: BatchSchedule, version: int, filling: int, held: int = 0, in_flight: int = 0, **flags: bool) -> bool:
    return s.may_start_group(version=version, filling=filling, groups_held=held, rollouts_in_flight=in_flight,
                             **flags)


@pytest.mark.parametrize(("max_async_level", "accepted"), [(0, [4, 5]), (1, [3, 4, 5]), (2, [2, 3, 4, 5])])
def test_a_batch_takes_versions_from_step_minus_one_minus_max_async_level(max_async_level: int,
                                                                          accepted: list[int]) -> None:
    s = schedule(max_async_level)
    placed = {v: s.place(v, 5, kept=0, pending_oldest=0) for v in range(6)}
    assert [v for v, p in placed.items() if p == "this_batch"] == accepted
    assert all(placed[v] == "stale" for v in range(accepted[0]))
    assert s.oldest_version(5) == accepted[0]


@pytest.mark.parametrize("max_async_level", [0, 1, 2])
def test_the_last_batch_of_a_version_is_the_last_that_takes_it(max_async_level: int) -> None:
    s = schedule(max_async_level, max_steps=100)
    for version in range(5):
        last = s.last_batch(version)
        assert last == version + 1 + max_async_level
        assert s.oldest_version(last) == version  # still taken there
        assert s.oldest_version(last + 1) > version  # stale one batch later


def test_no_batch_after_max_steps() -> None:
    s = schedule(2, max_steps=4)
    assert [s.last_batch(v) for v in range(5)] == [3, 4, 4, 4, 4]


@pytest.mark.parametrize(("max_async_level", "batches"), [(0, 1), (1, 2), (2, 3)])
def test_groups_start_until_every_batch_the_version_may_go_into_is_covered(max_async_level: int,
                                                                           batches: int) -> None:
    # version 0 while step 1 is being filled: it may go into steps 1 .. 1 + max_async_level
    s = schedule(max_async_level, groups_per_batch=2)
    assert may_start(s, version=0, filling=1, held=2 * batches - 1)
    assert not may_start(s, version=0, filling=1, held=2 * batches)


def test_a_version_too_old_for_the_batch_being_filled_starts_nothing() -> None:
    # version 1 goes into batches up to 2 + max_async_level
    assert not may_start(schedule(0), version=1, filling=3)
    assert not may_start(schedule(1), version=1, filling=4)
    assert may_start(schedule(1), version=1, filling=3)
    assert may_start(schedule(1), version=1, filling=3, held=1)
    assert not may_start(schedule(1), version=1, filling=3, held=2)  # only batch 3 is left: one batch's worth


def test_max_steps_caps_the_groups_started() -> None:
    s = schedule(2, groups_per_batch=2, max_steps=5)
    # without the cap version 4 would cover batches 5 .. 7
    assert may_start(s, version=4, filling=5, held=1)
    assert not may_start(s, version=4, filling=5, held=2)
    assert not may_start(s, version=5, filling=6)


def test_groups_start_only_while_a_rollout_slot_is_free_for_each_rollout() -> None:
    s = schedule(2, group_size=4, rollout_target=12)
    assert may_start(s, version=0, filling=1, in_flight=8)
    assert not may_start(s, version=0, filling=1, in_flight=9)
    assert not may_start(s, version=0, filling=1, in_flight=12)


def test_no_group_starts_before_a_version_is_loaded_while_one_loads_or_when_stopping() -> None:
    s = schedule(2)
    assert may_start(s, version=0, filling=1)
    assert not may_start(s, version=-1, filling=1)
    assert not may_start(s, version=0, filling=1, loading=True)
    assert not may_start(s, version=0, filling=1, stopping=True)


def test_rollout_slots_come_from_oversampling_and_batch_size() -> None:
    config = RLConfig.model_validate({"model": "m", "max_steps": 7, "batch_size": 8, "rollouts_per_example": 4,
                                      "oversampling_factor": 1.5, "max_async_level": 1, "sampling": {"max_tokens": 8},
                                      "env": [{"id": "reverse-text"}]})
    s = BatchSchedule.from_config(config)
    assert (s.group_size, s.groups_per_batch, s.rollout_target, s.max_async_level, s.max_steps) == (4, 2, 12, 1, 7)


def test_a_newer_group_waits_for_the_next_batch_while_the_oldest_still_pending_can_fill_this_one() -> None:
    s = schedule(1, groups_per_batch=4)  # step 3 takes versions 1 and 2
    assert s.place(2, 3, kept=1, pending_oldest=3) == "deferred"
    assert s.place(2, 3, kept=0, pending_oldest=4) == "deferred"
    assert s.place(2, 3, kept=1, pending_oldest=2) == "this_batch"  # the oldest cannot fill it: take this one
    assert s.place(1, 3, kept=1, pending_oldest=3) == "this_batch"  # the oldest themselves are never deferred
    assert s.oldest_can_fill(1, 3) and not s.oldest_can_fill(1, 2)


def test_the_last_step_defers_nothing() -> None:
    s = schedule(1, groups_per_batch=4, max_steps=3)
    assert s.place(2, 3, kept=1, pending_oldest=3) == "this_batch"
    assert s.place(2, 2, kept=1, pending_oldest=3) == "deferred"
