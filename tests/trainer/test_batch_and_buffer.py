"""Rollouts to training samples (interleaved and branching), batch files, micro-batches, group filtering, example
sampling, and the orchestrator's batch metrics."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from prime_lab.envs import Rollout, Turn
from prime_lab.trainer.batch import MissingTokensError, read_batch, rollout_samples, truncate, write_batch
from prime_lab.trainer.buffer import ExampleSampler, GroupFilter
from prime_lab.trainer.config import BufferConfig, DifficultyFilterConfig
from prime_lab.trainer.orchestrator import Group, batch_metrics


def rollout(turns: list[tuple[list[int], list[int]]], reward: float = 1.0, truncated: bool = False) -> Rollout:
    r = Rollout(example_id=7, task="t", prompt=[{"role": "user", "content": "q"}], reward=reward,
                is_truncated=truncated)
    r.turns = [Turn(prompt_token_ids=p, completion_token_ids=c, completion_logprobs=[-0.5 - i for i in range(len(c))])
               for p, c in turns]
    return r


def test_interleaved_masks_the_environment_tokens_between_turns() -> None:
    # turn 2's prompt = turn 1's prompt + completion + environment reply [20, 21]
    r = rollout([([1, 2], [10, 11]), ([1, 2, 10, 11, 20, 21], [12])])
    [s] = rollout_samples(r, 0.5, "interleaved")
    assert s.input_ids == [1, 2, 10, 11, 20, 21, 12]
    assert s.loss_mask == [0, 0, 1, 1, 0, 0, 1]
    assert s.sampler_logprobs == [0, 0, -0.5, -1.5, 0, 0, -0.5]
    assert s.advantage == 0.5 and s.num_loss_tokens == 3


def test_branching_makes_one_sample_per_turn_and_interleaved_falls_back_to_it() -> None:
    turns = [([1, 2], [10, 11]), ([1, 2, 10, 99, 20], [12])]  # history re-rendered: 99 != 11
    branching = rollout_samples(rollout(turns), -1.0, "branching")
    assert [s.input_ids for s in branching] == [[1, 2, 10, 11], [1, 2, 10, 99, 20, 12]]
    assert [s.loss_mask for s in branching] == [[0, 0, 1, 1], [0, 0, 0, 0, 0, 1]]
    assert all(s.advantage == -1.0 for s in branching)
    fallback = rollout_samples(rollout(turns), -1.0, "interleaved")
    assert [s.input_ids for s in fallback] == [s.input_ids for s in branching]


def test_a_sampler_without_the_rl_fields_is_a_clear_error() -> None:
    r = rollout([([1], [2])])
    r.turns[0].completion_logprobs = None
    with pytest.raises(MissingTokensError, match="return_token_ids"):
        rollout_samples(r, 0.0)


def test_truncate_cuts_the_completion_end() -> None:
    [s] = rollout_samples(rollout([([1, 2, 3], [4, 5, 6])]), 1.0)
    cut = truncate(s, 4)
    assert cut.input_ids == [1, 2, 3, 4] and cut.loss_mask == [0, 0, 0, 1] and cut.is_truncated
    assert truncate(s, None) is s and truncate(s, 6) is s


def test_batch_files_round_trip_and_appear_whole(tmp_path: Path) -> None:
    samples = rollout_samples(rollout([([1, 2], [3])]), 0.25) * 3
    path = write_batch(tmp_path, 4, samples)
    assert path.name == "step_4.jsonl" and not list(tmp_path.glob(".*tmp"))
    back = read_batch(path)
    assert [s.to_json() for s in back] == [s.to_json() for s in samples]


def test_difficulty_filter_spellings() -> None:
    prime_rl = GroupFilter(BufferConfig(), DifficultyFilterConfig(enabled=True, min_reward_variance=0.01))
    assert not prime_rl.judge([1.0, 1.0, 1.0, 1.0]).keep
    assert "min_reward_variance" in prime_rl.judge([0.5, 0.5]).reason
    assert prime_rl.judge([0.0, 1.0]).keep
    hosted = GroupFilter(BufferConfig(online_difficulty_filtering=True, easy_fraction=0.0, hard_fraction=1.0),
                         DifficultyFilterConfig(), random.Random(0))
    easy, hard, normal = hosted.judge([1.0, 0.9]), hosted.judge([0.0, 0.1]), hosted.judge([0.5, 0.4])
    assert (easy.keep, easy.difficulty) == (False, "easy")
    assert (hard.keep, hard.difficulty) == (True, "hard")
    assert normal.keep and normal.difficulty == "normal"
    unfiltered = GroupFilter(BufferConfig(), DifficultyFilterConfig())
    assert unfiltered.judge([1.0, 1.0]).keep  # off by default: zero-advantage groups are kept (no gradient)


def test_example_sampler_follows_weights_and_covers_each_env_per_epoch() -> None:
    rows = {"a": [{"id": i} for i in range(10)], "b": [{"id": i} for i in range(10)]}
    sampler = ExampleSampler(rows, [3.0, 1.0], seed=1)
    picks = [sampler.next() for _ in range(4000)]
    share_a = sum(name == "a" for name, _ in picks) / len(picks)
    assert share_a == pytest.approx(0.75, abs=0.03)
    first_a = [row["id"] for name, row in picks if name == "a"][:10]
    assert sorted(first_a) == list(range(10))  # one pass over a's rows before any repeats
    again = ExampleSampler(rows, [3.0, 1.0], seed=1)
    assert [again.next() for _ in range(50)] == picks[:50]
    with pytest.raises(ValueError, match="no training examples"):
        ExampleSampler({"a": []}, [1.0])


def test_batch_metrics() -> None:
    def group(env: str, rewards: list[float], version: int) -> Group:
        rs = [rollout([([1], [2] * (i + 1))], reward=r, truncated=i == 0) for i, r in enumerate(rewards)]
        return Group(env, rs, version, 1.0, finished_at=10.0 + version)

    m = batch_metrics([group("x", [1.0, 0.0], 3), group("y", [0.5, 0.5], 2)], step=5, fill_seconds=0.001)
    assert m["reward/mean"] == 0.5 and m["reward/x"] == 0.5 and m["reward/y"] == 0.5
    assert m["reward/std"] == pytest.approx(0.3535534, rel=1e-6)
    assert m["rollout/mean_length"] == 1.5 and m["rollout/truncated"] == 0.5
    # 6 tokens over the 2 s from the first group's start (12 - 1 s) to the last one's end (13), however quickly the
    # batch filled
    assert m["perf/tokens_per_s"] == 3.0 and m["rollout/generation_time"] == 0.001 and m["batch/async_level"] == 2.0
    # each reward function's score and each metric, per environment: the mean over its rollouts
    scored = group("x", [1.0, 0.0], 3)
    scored.rollouts[0].metrics, scored.rollouts[1].metrics = {"exact": 1.0, "chars": 4.0}, {"exact": 0.0}
    m = batch_metrics([scored, group("y", [0.5], 2)], step=5, fill_seconds=0.001)
    assert {k: v for k, v in m.items() if k.startswith("metrics/")} == {"metrics/x/exact": 0.5, "metrics/x/chars": 4.0}
