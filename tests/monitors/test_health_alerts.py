"""The alerts behind the health line: the mismatch KL rising, grad-norm spikes, orchestrator-bound and trainer-bound;
each only when it lasts, once per episode, naming the setting that usually helps."""

from __future__ import annotations

from typing import Any

from prime_lab.monitors.alerts import (
    ALERT_NAMES,
    GRAD_NORM_SPIKES,
    HEALTH_ALERT_NAMES,
    KL_RISING,
    ORCHESTRATOR_BOUND,
    TRAINER_BOUND,
    AlertMonitor,
    AlertThresholds,
)


def fired(steps: list[dict[str, Any]], thresholds: AlertThresholds | None = None) -> list[tuple[int, dict[str, Any]]]:
    monitor = AlertMonitor(thresholds)
    return [(step, alert) for step, metrics in enumerate(steps, start=1)
            for alert in monitor.observe_metrics(metrics, step)]


def test_the_health_alerts_are_their_own_names() -> None:
    assert set(HEALTH_ALERT_NAMES).isdisjoint(ALERT_NAMES) and len(set(HEALTH_ALERT_NAMES)) == 4


def test_a_mismatch_kl_that_keeps_rising_fires_once_and_a_single_jump_does_not() -> None:
    flat = [0.002] * 10
    rising = [0.002 * 1.2 ** i for i in range(1, 16)]  # 0.0024 .. 0.031: a sustained, growing mean
    got = fired([{"policy/kl": kl} for kl in flat + rising])
    # the last 5 values' median is at least twice the 5 before's from step 16 (0.0041 against 0.002); 3 in a row: 18
    assert [(step, alert["name"]) for step, alert in got] == [(18, KL_RISING)]
    message = got[0][1]["message"]
    assert message.startswith("Mismatch KL rising at step 18: policy/kl's median is 0.00597 over the last 5 steps, "
                              "up from 0.0024 over the 5 before (rising for 3 steps)")
    assert "max_async_level" in message and "learning rate" in message
    # one step far above the rest moves the newer half's mean for a few steps only: not 3 in a row above 2x
    assert fired([{"policy/kl": kl} for kl in flat + [0.02] + flat]) == []
    # growing but tiny (below kl_trend_min): no warning
    assert fired([{"policy/kl": 1e-8 * 1.5 ** i} for i in range(25)]) == []  # up to 0.00017


def test_kl_rising_rearms_once_the_trend_flattens() -> None:
    up = [0.002 * 1.2 ** i for i in range(1, 16)]
    steps = [0.002] * 10 + up + [up[-1]] * 12 + [up[-1] * 1.2 ** i for i in range(1, 16)]
    # quiet through the plateau (steps 26-37: re-armed), fires again 8 steps into the second rise
    assert [step for step, alert in fired([{"policy/kl": kl} for kl in steps])] == [18, 45]


def test_repeated_grad_norm_spikes_fire_and_one_spike_does_not() -> None:
    norms = [0.5] * 10 + [6.0] + [0.5] * 5 + [7.0] + [0.5] * 3 + [9.0] + [0.5] * 5
    got = fired([{"optim/grad_norm": g} for g in norms])
    assert [(step, alert["name"]) for step, alert in got] == [(21, GRAD_NORM_SPIKES)]
    message = got[0][1]["message"]
    assert "optim/grad_norm 9 is 18x its running median 0.5, 3 spikes in the last 20 steps" in message
    assert "max_grad_norm" in message and "learning rate" in message
    assert fired([{"optim/grad_norm": g} for g in [0.5] * 10 + [6.0] + [0.5] * 30]) == []
    # spikes 21 values apart are never 3 in a window of 20
    spaced = ([0.5] * 20 + [9.0]) * 4
    assert fired([{"optim/grad_norm": g} for g in spaced]) == []


def test_a_slowly_growing_grad_norm_is_no_spike() -> None:
    assert fired([{"optim/grad_norm": 0.5 * 1.1 ** i} for i in range(60)]) == []


def test_orchestrator_bound_when_the_trainer_keeps_waiting_for_its_batches() -> None:
    def trainer(wait: float) -> dict[str, float]:
        return {"time/wait_for_batch": wait, "time/step": 1.0, "loss": 0.1}

    # waits of 3 s against 1 s of training: 75% of the trainer's step, 10 steps in a row (a short dip resets it)
    steps = [trainer(3.0)] * 6 + [trainer(0.2)] + [trainer(3.0)] * 10
    got = fired(steps)
    assert [(step, alert["name"]) for step, alert in got] == [(17, ORCHESTRATOR_BOUND)]
    message = got[0][1]["message"]
    assert message.startswith("Orchestrator-bound at step 17: the trainer waited 3 s for its batch, 75% of its step "
                              "(10 steps in a row above 50%)")
    assert "[inference] num_servers" in message and "max_tokens" in message
    # without the trainer's step time, nothing is said
    assert fired([{"time/wait_for_batch": 3.0}] * 20) == []


def test_trainer_bound_when_the_orchestrator_keeps_waiting_for_the_policy() -> None:
    orchestrator = {"time/wait_for_weights": 4.0, "rollout/generation_time": 1.0, "reward/mean": 0.3}
    got = fired([orchestrator] * 12)
    assert [(step, alert["name"]) for step, alert in got] == [(10, TRAINER_BOUND)]
    message = got[0][1]["message"]
    assert "the orchestrator waited 4 s for the policy, 80% of its step" in message
    assert "nproc_per_node" in message and "max_async_level" in message
    # it re-arms at or below 30% and fires again after 10 more such steps
    calm = {"time/wait_for_weights": 0.1, "rollout/generation_time": 1.0}
    again = fired([orchestrator] * 12 + [calm] + [orchestrator] * 10)
    assert [step for step, _ in again] == [10, 23]


def test_the_bound_thresholds_are_settings() -> None:
    quick = AlertThresholds(bound_steps=2, bound_share=0.2)
    steps = [{"time/wait_for_weights": 0.3, "rollout/generation_time": 1.0}] * 2
    assert [alert["name"] for _, alert in fired(steps, quick)] == [TRAINER_BOUND]
    assert fired(steps) == []
