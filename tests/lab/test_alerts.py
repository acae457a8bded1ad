"""AlertMonitor: each sign the RL guide teaches fires once per episode, with a message that says what to do."""

from __future__ import annotations

import math
from typing import Any

from lab.alerts import (
    DEGENERATE_OUTPUTS,
    ENTROPY_COLLAPSE,
    IDENTICAL_OUTPUTS,
    KL_EXPLODING,
    LOSS_DIVERGING,
    REWARD_DROP,
    REWARD_STD_COLLAPSE,
    AlertMonitor,
    repetition_score,
)
from lab.events import Event

HEALTHY = {"reward/mean": 0.4, "reward/std": 0.3, "policy/entropy": 1.2, "policy/kl": 0.002, "loss": 0.05,
           "optim/grad_norm": 0.8}


def feed(monitor: AlertMonitor, steps: list[dict[str, Any]], start: int = 1) -> list[tuple[int, dict[str, Any]]]:
    fired = []
    for i, metrics in enumerate(steps, start=start):
        for alert in monitor.observe(Event(seq=i, time=0.0, source="orchestrator", kind="metrics", step=i,
                                           data=metrics)):
            fired.append((i, alert))
    return fired


def names(fired: list[tuple[int, dict[str, Any]]]) -> list[str]:
    return [alert["name"] for _, alert in fired]


def test_a_healthy_run_raises_nothing() -> None:
    steps = [{**HEALTHY, "reward/mean": 0.3 + 0.01 * i, "policy/entropy": 1.2 - 0.01 * i} for i in range(50)]
    assert feed(AlertMonitor(), steps) == []


def test_entropy_collapse_fires_once_per_episode_and_rearms() -> None:
    entropies = [1.0, 1.1, 1.0, 0.6, 0.08, 0.05, 0.04, 0.03, 0.5, 0.6, 0.05, 0.04]
    fired = feed(AlertMonitor(), [{"policy/entropy": e} for e in entropies])
    assert [(step, alert["name"]) for step, alert in fired] == [(5, ENTROPY_COLLAPSE), (11, ENTROPY_COLLAPSE)]
    alert = fired[0][1]
    assert alert["level"] == "WARNING"
    assert "step 5" in alert["message"] and "0.08" in alert["message"] and "1.1" in alert["message"]


def test_reward_std_collapsing_to_zero_needs_consecutive_steps() -> None:
    stds = [0.3, 0.0, 0.0, 0.2, 0.0, 0.0, 0.0, 0.0, 0.0]
    fired = feed(AlertMonitor(), [{"reward/std": s} for s in stds])
    assert [(step, alert["name"]) for step, alert in fired] == [(7, REWARD_STD_COLLAPSE)]
    assert "advantages are 0" in fired[0][1]["message"]


def test_kl_exploding_by_limit_and_by_ratio_to_its_median() -> None:
    kls = [0.001, 0.002, 0.001, 0.002, 0.08, 0.09, 0.001, 0.001, 2.5]
    fired = feed(AlertMonitor(), [{"policy/kl": k} for k in kls])
    assert [(step, alert["name"]) for step, alert in fired] == [(5, KL_EXPLODING), (9, KL_EXPLODING)]
    assert "policy/kl" in fired[0][1]["message"] and "median" in fired[0][1]["message"]
    assert "above 1" in fired[1][1]["message"]


def test_ref_kl_is_watched_separately_from_mismatch_kl() -> None:
    fired = feed(AlertMonitor(), [{"policy/kl": 3.0, "policy/ref_kl": 4.0}])
    assert names(fired) == [KL_EXPLODING, KL_EXPLODING]
    assert "reference model" in fired[1][1]["message"]


def test_reward_dropping_sharply() -> None:
    rewards = [0.2, 0.3, 0.4, 0.5, 0.6, 0.65, 0.7, 0.7, 0.3, 0.2, 0.2, 0.2, 0.2]
    fired = feed(AlertMonitor(), [{"reward/mean": r} for r in rewards])
    assert [(step, alert["name"]) for step, alert in fired] == [(10, REWARD_DROP)]
    assert "down from 0.65" in fired[0][1]["message"]


def test_slow_noisy_reward_does_not_count_as_a_drop() -> None:
    rewards = [0.5 + (0.05 if i % 2 else -0.05) for i in range(40)]
    assert feed(AlertMonitor(), [{"reward/mean": r} for r in rewards]) == []


def test_loss_diverging_nan_is_an_error_and_a_blow_up_a_warning() -> None:
    fired = feed(AlertMonitor(), [{"loss": v} for v in (0.1, 0.12, 0.09, 0.11, math.nan, math.nan, 0.1)])
    assert [(step, alert["name"], alert["level"]) for step, alert in fired] == [(5, LOSS_DIVERGING, "ERROR")]
    fired = feed(AlertMonitor(), [{"loss": v} for v in (0.2, -0.3, 0.25, 0.2, 40.0, 55.0)])
    assert [(step, alert["level"]) for step, alert in fired] == [(5, "WARNING")]
    assert "40" in fired[0][1]["message"]
    assert names(feed(AlertMonitor(), [{"optim/grad_norm": math.inf}])) == [LOSS_DIVERGING]


def sample(step: int, text: str, example: str) -> Event:
    return Event(seq=step, time=0.0, source="orchestrator", kind="sample", step=step,
                 data={"example_id": example, "prompt": [{"role": "user", "content": "q"}],
                       "completion": [{"role": "assistant", "content": text}], "reward": 0.0})


def test_repetition_score_tells_loops_from_prose() -> None:
    prose = ("The answer follows from adding the two numbers: first we take twelve and add thirty, which gives "
             "forty-two, and then we check the units digit against the question before writing it down.")
    assert repetition_score(prose) < 0.2
    assert repetition_score("the cat sat on the mat " * 20) > 0.8
    assert repetition_score("ha" * 300) > 0.8
    assert repetition_score("42") == 0.0


def test_degenerate_outputs_in_samples() -> None:
    monitor = AlertMonitor()
    fired = []
    texts = ["The answer is 12 because 5 + 7 = 12.", "I think it is blue, since the sky scatters light.",
             "so so so so so so so so so so so so so so so so so so so so so so so so so so so so so so",
             "and then " * 13,
             "loop loop loop " * 20]
    for i, text in enumerate(texts, start=1):
        fired += [(i, a) for a in monitor.observe(sample(i, text, f"ex{i}"))]
    assert [(step, alert["name"]) for step, alert in fired] == [(4, DEGENERATE_OUTPUTS)]
    assert "repeat themselves" in fired[0][1]["message"]


def test_identical_outputs_across_prompts_is_collapse() -> None:
    monitor = AlertMonitor()
    fired = [a for i in range(6) for a in monitor.observe(sample(i, "The answer is 7.", f"ex{i}"))]
    assert [a["name"] for a in fired] == [IDENTICAL_OUTPUTS]
    assert fired[0]["level"] == "ERROR"
    # The same prompt answered the same way by its group is not collapse.
    monitor = AlertMonitor()
    assert [a for i in range(6) for a in monitor.observe(sample(i, "The answer is 7.", "ex1"))] == []


def test_other_kinds_and_non_numbers_are_ignored() -> None:
    monitor = AlertMonitor()
    assert monitor.observe(Event(seq=1, time=0.0, source="launcher", kind="status", data={"state": "running"})) == []
    assert feed(monitor, [{"reward/std": "n/a", "policy/entropy": None, "loss": True}]) == []
