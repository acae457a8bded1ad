"""AlertMonitor: each sign the RL guide teaches fires once per episode, with a message that says what to do."""

from __future__ import annotations

import math
import random
import statistics
from typing import Any

import pytest

from prime_lab.monitors.alerts import (
    ALERT_NAMES,
    BOUND_METRICS,
    DEGENERATE_OUTPUTS,
    ENTROPY_COLLAPSE,
    HEALTH_ALERT_NAMES,
    IDENTICAL_OUTPUTS,
    KL_EXPLODING,
    LOSS_DIVERGING,
    ORCHESTRATOR_BOUND,
    REWARD_DROP,
    REWARD_STD_COLLAPSE,
    AlertMonitor,
    AlertThresholds,
    completion_text,
    is_degenerate,
    repetition_score,
)
from prime_lab.runs.events import Event

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


# The monitor keeps its window statistics incrementally (it sees every event of a replayed log). The reference below
# is the same rules written plainly: every statistic recomputed from the whole history of its metric at every value.
# The two must raise the same alerts, at the same events, with the same messages.

CHECK_ORDER = ("policy/entropy", "reward/std", "policy/kl", "policy/ref_kl", "reward/mean", "loss", "optim/grad_norm")


class ReferenceMonitor:
    def __init__(self, t: AlertThresholds) -> None:
        self.t = t
        self.active: set[str] = set()
        self.values: dict[str, list[float]] = {key: [] for key in CHECK_ORDER}  # every number seen, per metric
        self.quiet: dict[str, list[float]] = {"policy/kl": [], "policy/ref_kl": [], "loss": []}  # finite, not firing
        self.samples: list[tuple[str, str, bool]] = []
        self.kl_finite: list[float] = []
        self.grad_quiet: list[float] = []  # finite grad norms that were no spike
        self.grad_spikes: list[tuple[int, float, float]] = []  # (position among the grad norms, value, median)
        self.shares: dict[str, list[tuple[float, float]]] = {name: [] for name in BOUND_METRICS}

    def episode(self, key: str, firing: bool, cleared: bool, message: str, level: str = "WARNING",
                name: str | None = None) -> list[dict[str, Any]]:
        if key in self.active:
            if cleared:
                self.active.remove(key)
            return []
        if firing:
            self.active.add(key)
            return [{"name": name or key, "message": message, "level": level}]
        return []

    def observe(self, event: Event) -> list[dict[str, Any]]:
        at = f" at step {event.step}" if event.step is not None else ""
        if event.kind == "sample":
            text = completion_text(event.data.get("completion"))
            return self.sample(text, str(event.data.get("example_id", "")), at)
        if event.kind != "metrics":
            return []
        alerts = []
        for key in CHECK_ORDER:
            value = event.data.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            self.values[key].append(float(value))
            check = {"policy/entropy": self.entropy, "reward/std": self.reward_std, "policy/kl": self.kl,
                     "policy/ref_kl": self.kl, "reward/mean": self.reward, "loss": self.loss,
                     "optim/grad_norm": self.grad}[key]
            alerts += check(key, float(value), at)
        kl = event.data.get("policy/kl")
        if not isinstance(kl, bool) and isinstance(kl, (int, float)):
            alerts += self.kl_trend(float(kl), at)
        for name, (wait_key, busy_key) in BOUND_METRICS.items():
            wait, busy = event.data.get(wait_key), event.data.get(busy_key)
            if all(not isinstance(v, bool) and isinstance(v, (int, float)) for v in (wait, busy)):
                alerts += self.bound(name, float(wait), float(busy), at)  # type: ignore[arg-type]
        return alerts

    def kl_trend(self, value: float, at: str) -> list[dict[str, Any]]:
        t = self.t
        if not math.isfinite(value):
            return []
        self.kl_finite.append(value)
        w, values = max(2, t.kl_trend_window), self.kl_finite

        def halves(n: int) -> tuple[float, float] | None:  # over the first n values
            if n < w:
                return None
            last = values[n - w:n]
            return statistics.median(last[:w // 2]), statistics.median(last[w - w // 2:])

        def rising(n: int) -> bool:
            pair = halves(n)
            return pair is not None and pair[1] > t.kl_trend_min and pair[1] >= t.kl_trend_ratio * pair[0]

        pair = halves(len(values))
        if pair is None:
            return []
        older, newer = pair
        steps = 0
        while rising(len(values) - steps):
            steps += 1
        return self.episode(
            "kl_rising", steps >= t.kl_trend_steps, newer <= t.kl_trend_min or newer <= t.kl_trend_rearm * older,
            f"Mismatch KL rising{at}: policy/kl's median is {newer:.3g} over the last {w // 2} steps, up from "
            f"{older:.3g} over the {w // 2} before (rising for {steps} steps). The sampler's policy and the trainer's "
            "drift apart, the early sign of off-policy collapse: lower max_async_level (rollouts from a less stale "
            "policy) or the learning rate.")

    def bound(self, name: str, wait: float, busy: float, at: str) -> list[dict[str, Any]]:
        t = self.t
        if not (math.isfinite(wait) and math.isfinite(busy)) or wait < 0 or busy < 0:
            return []
        share = wait / (wait + busy) if wait + busy > 0 else 0.0
        self.shares[name].append((wait, share))
        steps = next((i for i, (_, s) in enumerate(reversed(self.shares[name])) if not s > t.bound_share),
                     len(self.shares[name]))
        limit = f"({steps} steps in a row above {t.bound_share:.0%})"
        if name == ORCHESTRATOR_BOUND:
            message = (f"Orchestrator-bound{at}: the trainer waited {wait:.3g} s for its batch, {share:.0%} of its "
                       f"step {limit}. Sampling is the bottleneck: more sampler servers ([inference] num_servers) or "
                       "GPUs for them, shorter generations ([sampling] max_tokens), a shorter [[env]] timeout for "
                       "slow environments; with max_async_level 0 or 1, raising it overlaps sampling with training. "
                       "On a CPU alone the sampler and the trainer share the cores, so one waits while the other "
                       "works: expected there, not a fault.")
        else:
            message = (f"Trainer-bound{at}: the orchestrator waited {wait:.3g} s for the policy, {share:.0%} of its "
                       f"step {limit}. Training is the bottleneck: more trainer processes ([trainer] nproc_per_node), "
                       "larger micro-batches ([trainer] micro_batch_tokens) or a smaller batch_size; a higher "
                       "max_async_level lets sampling run further ahead, with staler rollouts.")
        return self.episode(name, steps >= t.bound_steps, share <= t.bound_rearm, message)

    def entropy(self, key: str, value: float, at: str) -> list[dict[str, Any]]:
        t, seen = self.t, self.values[key]
        if len(seen) < t.entropy_warmup:
            return []
        baseline = max(seen[:t.entropy_warmup])
        return self.episode(
            "entropy_collapse", value < max(t.entropy_floor, t.entropy_collapse_ratio * baseline),
            value > max(t.entropy_floor * 2, t.entropy_rearm_ratio * baseline),
            f"Entropy collapsing{at}: policy/entropy {value:.3g} is down from {baseline:.3g} at the start. Outputs "
            "are becoming deterministic and exploration stops; lower the learning rate, raise the temperature, or "
            "restart from an earlier checkpoint.")

    def reward_std(self, key: str, value: float, at: str) -> list[dict[str, Any]]:
        seen = self.values[key]
        zeros = next((i for i, v in enumerate(reversed(seen)) if not v <= self.t.std_zero), len(seen))
        return self.episode(
            "reward_std_collapse", zeros >= self.t.std_patience, value >= self.t.std_rearm,
            f"Reward std collapsed to 0{at} ({zeros} steps in a row): every rollout of a group gets the same reward, "
            "so advantages are 0 and nothing is learned. The task is too easy or too hard for the model, or the "
            "policy collapsed; enable difficulty filtering or raise rollouts_per_example.")

    def kl(self, key: str, value: float, at: str) -> list[dict[str, Any]]:
        t = self.t
        recent = self.quiet[key][-t.kl_window:] if t.kl_window else []
        median = statistics.median(recent) if len(recent) >= 3 and value > t.kl_min else None
        firing, why = True, ""
        if not math.isfinite(value):
            why = "is not finite"
        elif value > t.kl_limit:
            why = f"is above {t.kl_limit:.3g}"
        elif median is not None and value > t.kl_min and value > t.kl_ratio * max(median, 1e-12):
            why = f"is {value / max(median, 1e-12):.0f}x its recent median {median:.3g}"
        else:
            firing = False
            self.quiet[key].append(value)
        cleared = math.isfinite(value) and value <= t.kl_limit / 2 and \
            (median is None or value <= t.kl_ratio / 2 * max(median, t.kl_min))
        what = "mismatch KL between trainer and sampler" if key == "policy/kl" else "KL to the reference model"
        return self.episode(
            f"kl_exploding:{key}", firing, cleared,
            f"KL exploding{at}: {key} ({what}) = {value:.3g} {why}. The policy is moving too fast; lower the learning "
            "rate, raise the KL penalty, or lower max_async_level.", name="kl_exploding")

    def reward(self, key: str, value: float, at: str) -> list[dict[str, Any]]:
        t, w = self.t, self.t.reward_window
        kept = self.values[key][-(t.reward_history + w):]
        if len(kept) < 2 * w:
            return []
        current = sum(kept[-w:]) / w
        peak = max(sum(kept[i:i + w]) / w for i in range(len(kept) - 2 * w + 1))
        drop = peak - current
        return self.episode(
            "reward_drop", drop >= t.reward_drop_min and drop >= t.reward_drop_fraction * abs(peak),
            drop < t.reward_drop_min / 2 or drop < t.reward_drop_fraction / 2 * abs(peak),
            f"Reward dropped sharply{at}: reward/mean averages {current:.3g} over the last {w} steps, down from "
            f"{peak:.3g}. Check the samples for degenerate outputs; consider restarting from the checkpoint before "
            "the drop with a lower learning rate.")

    def loss(self, key: str, value: float, at: str) -> list[dict[str, Any]]:
        t = self.t
        recent = [abs(v) for v in self.quiet[key][-t.loss_window:]] if t.loss_window else []
        median = statistics.median(recent) if len(recent) >= 3 and abs(value) > t.loss_min / 2 else None
        firing, level, why = True, "WARNING", ""
        if not math.isfinite(value):
            level, why = "ERROR", "is not finite"
        elif median is not None and abs(value) > t.loss_min and abs(value) > t.loss_ratio * median:
            why = f"is {abs(value) / max(median, 1e-12):.0f}x its recent median {median:.3g}"
        else:
            firing = False
            self.quiet[key].append(value)
        cleared = math.isfinite(value) and \
            (median is None or abs(value) <= t.loss_ratio / 2 * max(median, t.loss_min / t.loss_ratio))
        return self.episode(
            "loss_diverging", firing, cleared,
            f"Loss diverging{at}: loss = {value:.3g} {why}. Lower the learning rate, enable gradient clipping, and "
            "resume from the last good checkpoint.", level)

    def grad(self, key: str, value: float, at: str) -> list[dict[str, Any]]:
        if not math.isfinite(value):
            return self.episode(
                "loss_diverging", True, False,
                f"Loss diverging{at}: optim/grad_norm is {value}. The update is not finite; lower the learning rate "
                "and resume from the last good checkpoint.", "ERROR")
        t, position = self.t, len(self.values[key])
        recent = self.grad_quiet[-t.grad_window:] if t.grad_window else []
        median = statistics.median(recent) if len(recent) >= max(1, t.grad_warmup) else 0.0
        if median > 0 and value > t.grad_spike_ratio * median:
            self.grad_spikes.append((position, value, median))
        else:
            self.grad_quiet.append(value)
        spikes = [s for s in self.grad_spikes if s[0] > position - t.grad_window]
        if not spikes:
            return self.episode("grad_norm_spikes", False, True, "")
        _, spike, at_median = spikes[-1]
        return self.episode(
            "grad_norm_spikes", len(spikes) >= t.grad_spikes, False,
            f"Gradient norm spiking{at}: optim/grad_norm {spike:.3g} is {spike / at_median:.0f}x its running median "
            f"{at_median:.3g}, {len(spikes)} spikes in the last {t.grad_window} steps. Spikes come before divergence: "
            "lower the learning rate, or [trainer] max_grad_norm to clip each update harder; if the loss follows, "
            "resume from a checkpoint before them.")

    def sample(self, text: str, example: str, at: str) -> list[dict[str, Any]]:
        self.samples.append((example, text.strip(), is_degenerate(text)))
        window = self.samples[-self.t.repetition_window:] if self.t.repetition_window else []
        bad = sum(1 for _, _, b in window if b)
        alerts = self.episode(
            "degenerate_outputs", bad >= max(2, math.ceil(self.t.repetition_fraction * len(window))), bad == 0,
            f"Degenerate outputs{at}: {bad} of the last {len(window)} samples repeat themselves (loops of the same "
            "words). Look at the samples; if it spreads, restart from an earlier checkpoint with a lower learning "
            "rate or a higher temperature.")
        same = max((len({e for e, c, _ in window if c == text}) for _, text, _ in window if text), default=0)
        return alerts + self.episode(
            "identical_outputs", same >= self.t.identical_count, same <= 1,
            f"Identical outputs{at}: {same} different prompts got the same completion. This is the model collapse the "
            "guide describes: restart from an earlier checkpoint, lower the learning rate, raise the KL penalty or "
            "the sampling temperature.", "ERROR")


def troubled_run(seed: int, steps: int) -> list[Event]:
    """A run that goes wrong in every way the monitor watches, again and again: reward drops and recoveries, reward
    std stuck at 0, entropy collapsing and coming back, KL and loss spikes, values that are nan, infinite, -0.0,
    ints or not numbers, degenerate and identical samples, a step that is missing. In stretches (the first one
    included) rewards and entropies lie on a grid of 0.05, so that sums and ratios land exactly on thresholds and
    windows tie (0.0 with -0.0 too)."""
    rng = random.Random(seed)
    other = random.Random(-seed)  # the waits and grad norm spikes (drawn apart: the other values stay as they were)
    events: list[Event] = []
    reward, entropy, kl_level, loss_level, grid = 0.3, 1.0, 0.003, 0.1, True

    def odd(value: float) -> Any:
        roll = rng.random()
        if roll < 0.01:
            return rng.choice([math.nan, math.inf, -math.inf, -0.0, None, "n/a", True, 0, 1])
        return value

    for step in range(1, steps + 1):
        at_step = None if rng.random() < 0.02 else step
        if rng.random() < 0.03:
            reward = rng.choice([max(0.0, reward - rng.uniform(0.2, 0.6)), rng.uniform(0.0, 1.0)])
        reward = min(1.0, max(-0.3, reward + rng.gauss(0.004, 0.03)))
        grid = rng.random() < 0.5 if rng.random() < 0.02 else grid
        std = 0.0 if rng.random() < 0.25 else rng.choice([1e-4, 0.01, 0.2, rng.uniform(0.0, 0.4)])
        if rng.random() < 0.04:
            entropy = rng.choice([rng.uniform(0.001, 0.2), rng.uniform(0.3, 1.5)])
        entropy = max(0.0, entropy * rng.uniform(0.9, 1.1)) if step > 3 else 1.0
        if grid:
            reward, entropy = round(reward * 20) / 20, round(entropy * 20) / 20
        if rng.random() < 0.05:
            kl_level = rng.choice([0.003, 0.02, 0.1, 0.4])
        kl = kl_level * rng.uniform(0.5, 1.5) * (rng.choice([10, 30, 300]) if rng.random() < 0.05 else 1)
        if rng.random() < 0.05:
            loss_level = rng.choice([0.05, 0.4, 2.0])
        loss = loss_level * rng.uniform(-1.0, 1.5) * (rng.choice([15, 40]) if rng.random() < 0.04 else 1)
        if other.random() < 0.03:  # which side waits on the other, and how much
            waiting = other.choice(["trainer", "orchestrator", "neither"])
        elif step == 1:
            waiting = "neither"
        waits = {side: other.uniform(0.5, 3.0) if side == waiting else other.choice([0.0, other.uniform(0.0, 0.5)])
                 for side in ("trainer", "orchestrator")}
        spike = other.choice([10.0, 40.0]) if other.random() < 0.04 else 1.0
        orchestrator = {"reward/mean": odd(reward), "reward/std": odd(std), "time/wait_for_weights": odd(waits[
            "orchestrator"]), "rollout/generation_time": other.choice([1.0, 0.0, 0.5])}
        trainer: dict[str, Any] = {"loss": odd(loss), "policy/entropy": odd(entropy), "policy/kl": odd(kl),
                                   "optim/grad_norm": odd(rng.uniform(0.1, 2.0) * spike),
                                   "time/wait_for_batch": odd(waits["trainer"]), "time/step": 1.0}
        if rng.random() < 0.5:
            trainer["policy/ref_kl"] = odd(kl * rng.uniform(2.0, 20.0))
        for metrics in ([{**orchestrator, **trainer}] if rng.random() < 0.2 else [orchestrator, trainer]):
            events.append(Event(seq=len(events) + 1, time=0.0, source="orchestrator", kind="metrics", step=at_step,
                                data=metrics))
        for _ in range(rng.randrange(3)):
            text = rng.choice(["The answer is 7.", "The answer is 7.", "loop " * rng.randrange(30, 80), "", "  ",
                               f"Step {step}: the sum is {rng.randrange(100)}.", "so " * 40])
            events.append(Event(seq=len(events) + 1, time=0.0, source="orchestrator", kind="sample", step=at_step,
                                data={"example_id": str(rng.randrange(6)),
                                      "completion": [{"role": "assistant", "content": text}]}))
    return events


TIGHT = AlertThresholds(entropy_warmup=1, std_patience=1, kl_window=4, reward_window=1, reward_history=4,
                        loss_window=3, repetition_window=3, identical_count=2)


@pytest.mark.parametrize("thresholds", [AlertThresholds(), TIGHT,
                                        AlertThresholds(reward_window=4, reward_history=4, kl_window=1)],
                         ids=["defaults", "tight", "short-history"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_monitor_raises_what_the_rules_recomputed_from_scratch_raise(thresholds: AlertThresholds,
                                                                          seed: int) -> None:
    events = troubled_run(seed, steps=1500)
    monitor, reference = AlertMonitor(thresholds), ReferenceMonitor(thresholds)
    got = [(event.seq, alert) for event in events for alert in monitor.observe(event)]
    expected = [(event.seq, alert) for event in events for alert in reference.observe(event)]
    assert got == expected
    if thresholds == AlertThresholds():  # the run does go wrong in every way, many times over
        counts = {name: sum(1 for _, alert in expected if alert["name"] == name)
                  for name in (*ALERT_NAMES, *HEALTH_ALERT_NAMES)}
        assert all(counts[name] >= (5 if name in ALERT_NAMES else 3) for name in counts), counts


def test_flat_rewards_are_no_collapse_where_the_loss_learns_from_a_teacher() -> None:
    """With loss = "opd" the teacher's term trains whatever the rewards (hard distillation's "sft" takes no
    advantage at all): a reward std of 0 is no sign that nothing is learned."""
    flat = [{"reward/std": 0.0, "reward/mean": 0.0}] * 6
    assert names(feed(AlertMonitor(), flat)) == [REWARD_STD_COLLAPSE]
    assert feed(AlertMonitor(loss="opd"), flat) == feed(AlertMonitor(loss="sft"), flat) == []
    collapsing = [{"policy/entropy": e} for e in (1.0, 1.1, 1.0, 0.05)]  # every other sign still fires
    assert names(feed(AlertMonitor(loss="opd"), collapsing)) == [ENTROPY_COLLAPSE]


def test_the_launcher_and_the_run_page_take_the_loss_from_the_runs_config(tiny_model_dir: Any) -> None:
    """The launcher's monitor has the run's config; the run page reads it from resolved.json (`run_loss`)."""
    import signal

    from prime_lab.monitors.alerts import run_loss
    from prime_lab.runs.registry import RunRegistry
    from prime_lab.trainer import launcher
    from prime_lab.trainer.config import validate_rl_config
    from prime_lab.workbench.screens.dashboard_rl import RLDashboard

    def alerts_of(loss: str) -> list[str]:
        teacher = f'loss = "{loss}"\n[teacher]\nmodel = "{tiny_model_dir}"\n' if loss != "rl" else ""
        text = (f'model = "{tiny_model_dir}"\nmax_steps = 6\nbatch_size = 4\nrollouts_per_example = 2\n{teacher}'
                '[sampling]\nmax_tokens = 4\n[[env]]\nid = "reverse-text"\n')
        result = validate_rl_config(text)
        assert result.config is not None, [p.format() for p in result.problems]
        run = RunRegistry().create("rl", config_text=text, resolved=result.config.model_dump(mode="json"))
        run.update_status(model_path=str(tiny_model_dir))
        assert run_loss(run) == loss
        assert RLDashboard(run).new_model().monitor.loss == ("opd" if loss != "rl" else "rl")
        with run.writer("orchestrator") as writer:
            for step in range(1, 7):  # what the orchestrator logs for a batch whose rewards are all alike
                writer.metrics({"reward/mean": 0.0, "reward/std": 0.0}, step)
        handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            launcher.Supervisor(run).follow_events()
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
        return [e.data["name"] for e in run.event_log().events() if e.kind == "alert"]

    assert alerts_of("rl") == [REWARD_STD_COLLAPSE]
    assert alerts_of("opd") == []
