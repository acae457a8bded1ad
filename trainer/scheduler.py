"""Which groups the orchestrator starts and which batch each finished group goes into: the async-level rule.

A batch for step k takes groups sampled with policy version k - 1 - max_async_level or newer (`oldest_version`);
so a group of version v can go into the batches of steps up to v + 1 + max_async_level, and none after max_steps
(`last_batch`).

A group may start, with the version the sampler serves, when (`may_start_group`):
- a version is loaded, the run is not stopping, and no version is being loaded into the sampler servers (a group
  started then would carry the old version to a server that may already hold the new one);
- a rollout slot is free for each of its rollouts (`rollout_target`, `oversampling_factor * batch_size` rollouts in
  flight, at least one group's worth);
- the groups held (kept for the batch being filled, in flight, finished or deferred) do not already fill every batch
  from the one being filled to the version's `last_batch`: a group past those would be dropped as stale.

A finished group looked at while filling step k's batch is (`place`):
- "stale", dropped, if its version is older than `oldest_version(k)`;
- "deferred" to the next batch if it is newer than that, k is not the last step, and the groups of the oldest allowed
  version still pending (in flight, or finished and not looked at) can fill this batch with those kept: they could go
  into no later batch, this one can;
- otherwise "this_batch": it is judged (failed rollouts, difficulty filter) for this batch.
Deferred groups are looked at first at the start of the next batch, or in this one as soon as the oldest groups
still pending can no longer fill it (`oldest_can_fill` false: some of them failed or were filtered out).

Pure decisions on counts: the orchestrator (trainer/orchestrator.py) keeps the groups, the asyncio tasks and the
sampler, and asks this module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from prime_lab.trainer.config import RLConfig

Placement = Literal["stale", "deferred", "this_batch"]


@dataclass(frozen=True)
class BatchSchedule:
    """The async-level rule for one run's numbers."""

    group_size: int  # rollouts per group (rollouts_per_example)
    groups_per_batch: int  # batch_size // rollouts_per_example
    rollout_target: int  # rollouts kept in flight
    max_async_level: int
    max_steps: int

    @classmethod
    def from_config(cls, config: RLConfig) -> BatchSchedule:
        group_size = config.rollouts_per_example
        return cls(group_size=group_size, groups_per_batch=config.batch_size // group_size,
                   rollout_target=max(group_size, math.ceil(config.oversampling_factor * config.batch_size)),
                   max_async_level=config.max_async_level, max_steps=config.max_steps)

    def oldest_version(self, step: int) -> int:
        """The oldest policy version step `step`'s batch takes."""
        return step - 1 - self.max_async_level

    def last_batch(self, version: int) -> int:
        """The last step whose batch takes groups of policy `version`."""
        return min(version + 1 + self.max_async_level, self.max_steps)

    def may_start_group(self, *, version: int, filling: int, groups_held: int, rollouts_in_flight: int,
                        stopping: bool = False, loading: bool = False) -> bool:
        """Whether a group started now with policy `version` (-1: none loaded yet) will be used, while step
        `filling`'s batch is being filled and `groups_held` groups are kept, in flight, finished or deferred."""
        if stopping or loading or rollouts_in_flight + self.group_size > self.rollout_target:
            return False
        batches = self.last_batch(version) - filling + 1
        if version < 0 or batches < 1:
            return False
        return groups_held < self.groups_per_batch * batches

    def oldest_can_fill(self, kept: int, pending_oldest: int) -> bool:
        """Whether the `pending_oldest` groups of the oldest version a batch takes, still in flight or not looked at,
        can fill it with the `kept` ones."""
        return kept + pending_oldest >= self.groups_per_batch

    def place(self, version: int, step: int, *, kept: int, pending_oldest: int) -> Placement:
        """Where a finished group of policy `version` goes while step `step`'s batch is filled, `kept` groups kept for
        it and `pending_oldest` groups of `oldest_version(step)` still pending."""
        oldest = self.oldest_version(step)
        if version < oldest:
            return "stale"
        if version > oldest and step < self.max_steps and self.oldest_can_fill(kept, pending_oldest):
            return "deferred"
        return "this_batch"
