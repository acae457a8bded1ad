"""Training-health alerts: the signs the RL guide tells a user to watch for, raised from the event stream.

The guide (reference 004, "During Training" and "Model Collapse") says: `reward/mean` should increase steadily,
`reward/std` should stay stable and not collapse to 0, `policy/entropy` should decrease but not collapse,
`policy/kl` should stay within bounds; look out for sudden reward drops, loss divergence and degenerate outputs
(repetition, incoherence; all outputs becoming identical). `AlertMonitor` checks exactly these on every event it
is fed and returns the alerts that start now, and one sign of the run's environments: an environment whose rollouts
keep failing (`env/<name>/errored` above 5% for 3 steps in a row, prime-rl's guide's rule), whose share of the
batch is then held by drawing it again (trainer/orchestrator.py) until a hard limit fails the run.

An alert fires once per *episode*: when its condition becomes true. While the condition holds it stays quiet; once
the condition has cleared (with some hysteresis) it is re-armed and a new episode may fire again. The RL launcher
feeds the monitor every event it follows and writes what it returns as `alert` events; the TUI runs its own monitor
over logs that carry no alert events (older runs), so both see the same alerts.

Pure logic: no textual, no torch, no numpy.
"""

from __future__ import annotations

import math
import statistics
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prime_lab.runs.events import Event

Alert = dict[str, Any]  # {"name", "message", "level"}

ENTROPY_COLLAPSE = "entropy_collapse"
REWARD_STD_COLLAPSE = "reward_std_collapse"
KL_EXPLODING = "kl_exploding"
REWARD_DROP = "reward_drop"
LOSS_DIVERGING = "loss_diverging"
DEGENERATE_OUTPUTS = "degenerate_outputs"
IDENTICAL_OUTPUTS = "identical_outputs"
ALERT_NAMES = (ENTROPY_COLLAPSE, REWARD_STD_COLLAPSE, KL_EXPLODING, REWARD_DROP, LOSS_DIVERGING,
               DEGENERATE_OUTPUTS, IDENTICAL_OUTPUTS)
ENV_ERRORED = "env_errored"  # an environment's rollouts keep failing (`env/<name>/errored`)
ENV_RESTART = "env_restart"  # an environment's server died and was restarted (the orchestrator writes these)
ENV_ALERT_NAMES = (ENV_ERRORED, ENV_RESTART)
_ERRORED_PREFIX, _ERRORED_SUFFIX = "env/", "/errored"


@dataclass(frozen=True)
class AlertThresholds:
    """When each alert fires (and when it re-arms). Defaults suit rewards in [0, 1] and LoRA GRPO runs."""

    entropy_warmup: int = 3  # steps whose entropy forms the baseline
    entropy_collapse_ratio: float = 0.1  # fire below 10% of the baseline ...
    entropy_floor: float = 0.01  # ... or below this, whatever the baseline
    entropy_rearm_ratio: float = 0.25
    std_zero: float = 1e-3  # reward/std at or below this counts as 0
    std_patience: int = 3  # consecutive steps
    std_rearm: float = 0.02
    kl_limit: float = 1.0  # policy/kl or policy/ref_kl above this
    kl_ratio: float = 10.0  # ... or this many times its recent median (when above kl_min)
    kl_min: float = 0.05
    kl_window: int = 20
    reward_window: int = 3  # steps averaged for the current reward
    reward_history: int = 20  # steps looked back for the peak
    reward_drop_fraction: float = 0.3  # fire when the reward falls this far below the recent peak ...
    reward_drop_min: float = 0.1  # ... and by at least this much
    loss_ratio: float = 10.0  # |loss| this many times its recent median ...
    loss_min: float = 1.0  # ... and above this
    loss_window: int = 20
    repetition_window: int = 8  # recent samples looked at
    repetition_fraction: float = 0.5  # fire when this share of them is degenerate (at least 2)
    identical_count: int = 4  # this many samples of different examples with one completion text
    env_errored: float = 0.05  # an environment's share of errored rollouts above this ...
    env_errored_steps: int = 3  # ... for this many steps in a row (its own steps: each has the metric)
    env_errored_rearm: float = 0.02  # re-armed at or below this


def repetition_score(text: str) -> float:
    """How repetitive a completion is, in [0, 1]: the share of repeated word 3-grams, or, for long texts, how
    well zlib compresses it (a loop of the same phrase compresses to almost nothing). 0 for short texts."""
    words = text.split()
    score = 0.0
    if len(words) >= 24:
        grams = [tuple(words[i:i + 3]) for i in range(len(words) - 2)]
        score = 1.0 - len(set(grams)) / len(grams)
    raw = text.encode("utf-8", "replace")
    if len(raw) >= 200:
        ratio = len(zlib.compress(raw, 6)) / len(raw)
        score = max(score, min(1.0, max(0.0, (0.3 - ratio) / 0.25)))  # ratio 0.3 -> 0, 0.05 -> 1
    return score


def is_degenerate(text: str) -> bool:
    return repetition_score(text) >= 0.6


def completion_text(completion: Any) -> str:
    """The assistant text of a completion given as chat messages (or a string)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        return "\n".join(str(m.get("content") or "") for m in completion
                         if isinstance(m, dict) and m.get("role", "assistant") == "assistant")
    return ""


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _fmt(value: float) -> str:
    return f"{value:.3g}"


_KL_WHAT = {"policy/kl": "mismatch KL between trainer and sampler", "policy/ref_kl": "KL to the reference model"}
_KL_EPISODE = {key: f"{KL_EXPLODING}:{key}" for key in _KL_WHAT}  # each KL has its own episodes


def _at(step: int | None) -> str:
    return f" at step {step}" if step is not None else ""


def _alert(name: str, message: str, level: str = "WARNING") -> Alert:
    return {"name": name, "message": message, "level": level}


class AlertMonitor:
    """Feed it events (`observe`) or metric dicts and completions directly; it returns the alerts that start.

    It is fed every event of a run (a replayed log: 100,000 of them), so each check keeps its window statistics
    as they change instead of recomputing them from the history on every value, and messages are only formatted
    when an alert fires."""

    def __init__(self, thresholds: AlertThresholds | None = None) -> None:
        t = self.t = thresholds or AlertThresholds()
        self.active: set[str] = set()  # alert keys whose episode is going on
        self._entropy_baseline: list[float] = []
        self._entropy_bounds: tuple[float, float, float] | None = None  # baseline, fire below, re-arm above
        self._std_zero_steps = 0
        self._kl: dict[str, deque[float]] = {key: deque(maxlen=t.kl_window) for key in ("policy/kl", "policy/ref_kl")}
        # reward/mean, with w = reward_window: the last w values (the current window), the means of the last w + 1
        # windows (the oldest ended just before the current one began), and the means of the earlier windows that
        # ended in the last `reward_history` steps: the candidates for the peak. All oldest first.
        self._rewards = 0  # values seen
        self._reward_window: deque[float] = deque(maxlen=t.reward_window)
        self._reward_means: deque[float] = deque(maxlen=t.reward_window + 1)
        self._reward_peaks: deque[float] = deque(maxlen=max(0, t.reward_history - t.reward_window + 1))
        self._loss_sizes: deque[float] = deque(maxlen=t.loss_window)  # |loss| of the recent finite, quiet steps
        self._samples: deque[tuple[str, str, bool]] = deque(maxlen=t.repetition_window)  # example, text, bad
        self._degenerate = 0  # bad ones among `_samples`
        self._examples_by_text: dict[str, dict[str, int]] = {}  # non-empty text -> example -> samples of `_samples`
        self._env_errored_steps: dict[str, int] = {}  # environment -> its steps in a row above env_errored
        self._checks: tuple[tuple[str, Callable[[str, float, int | None], Alert | None]], ...] = (
            ("policy/entropy", self._entropy), ("reward/std", self._reward_std), ("policy/kl", self._kl_check),
            ("policy/ref_kl", self._kl_check), ("reward/mean", self._reward), ("loss", self._loss),
            ("optim/grad_norm", self._grad))

    # Entry points -------------------------------------------------------------------------------------------
    def observe(self, event: Event) -> list[Alert]:
        """The alerts that start with this event (none for kinds it does not watch)."""
        if event.kind == "metrics":
            return self.observe_metrics(event.data, event.step)
        if event.kind == "sample":
            data = event.data
            return self.observe_sample(completion_text(data.get("completion")), str(data.get("example_id", "")),
                                       event.step)
        return []

    def observe_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> list[Alert]:
        """One metrics dict (one source's metrics of one step; the orchestrator's and the trainer's of the same
        step may come separately, each key is checked on its own)."""
        alerts: list[Alert] = []
        for key, check in self._checks:
            if key in metrics:
                value = metrics[key]
                if value.__class__ is not float:  # (the common case skips the call)
                    value = _number(value)
                    if value is None:
                        continue
                alert = check(key, value, step)
                if alert is not None:
                    alerts.append(alert)
        for key in metrics:
            if key.startswith(_ERRORED_PREFIX) and key.endswith(_ERRORED_SUFFIX):
                value = _number(metrics[key])
                if value is not None:
                    alert = self._env_errored(key[len(_ERRORED_PREFIX):-len(_ERRORED_SUFFIX)], value, step)
                    if alert is not None:
                        alerts.append(alert)
        return alerts

    def observe_sample(self, text: str, example_id: str = "", step: int | None = None) -> list[Alert]:
        """One sampled completion's text."""
        samples = self._samples
        sample = (example_id, text.strip(), is_degenerate(text))
        # The one the append pushes out (the new one itself when the window holds none).
        evicted = (samples[0] if samples else sample) if len(samples) == samples.maxlen else None
        samples.append(sample)
        self._count_sample(sample, 1)
        if evicted is not None:
            self._count_sample(evicted, -1)
        alerts: list[Alert] = []
        degenerate = self._degenerate
        needed = max(2, math.ceil(self.t.repetition_fraction * len(samples)))
        if self._starts(DEGENERATE_OUTPUTS, degenerate >= needed, degenerate == 0):
            alerts.append(_alert(
                DEGENERATE_OUTPUTS, f"Degenerate outputs{_at(step)}: {degenerate} of the last {len(samples)} samples "
                "repeat themselves (loops of the same words). Look at the samples; if it spreads, restart from an "
                "earlier checkpoint with a lower learning rate or a higher temperature."))
        same = max(map(len, self._examples_by_text.values()), default=0)
        if self._starts(IDENTICAL_OUTPUTS, same >= self.t.identical_count, same <= 1):
            alerts.append(_alert(
                IDENTICAL_OUTPUTS, f"Identical outputs{_at(step)}: {same} different prompts got the same completion. "
                "This is the model collapse the guide describes: restart from an earlier checkpoint, lower the "
                "learning rate, raise the KL penalty or the sampling temperature.", "ERROR"))
        return alerts

    def _count_sample(self, sample: tuple[str, str, bool], change: int) -> None:
        """Count a sample into (1) or out of (-1) the degenerate count and the examples of each text."""
        example, text, bad = sample
        if bad:
            self._degenerate += change
        if text:
            examples = self._examples_by_text.setdefault(text, {})
            left = examples.get(example, 0) + change
            if left:
                examples[example] = left
            else:
                del examples[example]
                if not examples:
                    del self._examples_by_text[text]

    def observe_all(self, events: Iterable[Event]) -> list[Alert]:
        return [alert for event in events for alert in self.observe(event)]

    # Checks -------------------------------------------------------------------------------------------------
    def _starts(self, key: str, firing: bool, cleared: bool) -> bool:
        """Whether an episode of `key` starts now: `firing` starts one unless one is going on, `cleared` ends it.
        (The caller formats the message only when one starts: this runs for every metric of every event.)"""
        if key in self.active:
            if cleared:
                self.active.discard(key)
            return False
        if firing:
            self.active.add(key)
            return True
        return False

    def _entropy(self, key: str, value: float, step: int | None) -> Alert | None:
        t = self.t
        if self._entropy_bounds is None:  # the first steps form the baseline (nothing fires while they do)
            self._entropy_baseline.append(value)
            if len(self._entropy_baseline) < t.entropy_warmup:
                return None
            top = max(self._entropy_baseline)
            self._entropy_bounds = (top, max(t.entropy_floor, t.entropy_collapse_ratio * top),
                                    max(t.entropy_floor * 2, t.entropy_rearm_ratio * top))
        baseline, low, rearm = self._entropy_bounds
        if not self._starts(ENTROPY_COLLAPSE, value < low, value > rearm):
            return None
        return _alert(
            ENTROPY_COLLAPSE, f"Entropy collapsing{_at(step)}: policy/entropy {_fmt(value)} is down from "
            f"{_fmt(baseline)} at the start. Outputs are becoming deterministic and exploration stops; lower the "
            "learning rate, raise the temperature, or restart from an earlier checkpoint.")

    def _reward_std(self, key: str, value: float, step: int | None) -> Alert | None:
        zeros = self._std_zero_steps = self._std_zero_steps + 1 if value <= self.t.std_zero else 0
        if not self._starts(REWARD_STD_COLLAPSE, zeros >= self.t.std_patience, value >= self.t.std_rearm):
            return None
        return _alert(
            REWARD_STD_COLLAPSE, f"Reward std collapsed to 0{_at(step)} ({zeros} steps in a row): every rollout of a "
            "group gets the same reward, so advantages are 0 and nothing is learned. The task is too easy or too "
            "hard for the model, or the policy collapsed; enable difficulty filtering or raise rollouts_per_example.")

    def _kl_check(self, key: str, value: float, step: int | None) -> Alert | None:
        t, history = self.t, self._kl[key]
        # The median matters only above kl_min (below it neither the ratio fires nor does it block re-arming).
        median = statistics.median(history) if len(history) >= 3 and value > t.kl_min else None
        if not math.isfinite(value):
            firing, why = True, "is not finite"
        elif value > t.kl_limit:
            firing, why = True, f"is above {_fmt(t.kl_limit)}"
        elif median is not None and value > t.kl_min and value > t.kl_ratio * max(median, 1e-12):
            firing, why = True, f"is {value / max(median, 1e-12):.0f}x its recent median {_fmt(median)}"
        else:
            firing, why = False, ""
            history.append(value)  # (finite: not finite fires)
        cleared = math.isfinite(value) and value <= t.kl_limit / 2 and \
            (median is None or value <= t.kl_ratio / 2 * max(median, t.kl_min))
        if not self._starts(_KL_EPISODE[key], firing, cleared):
            return None
        return _alert(
            KL_EXPLODING, f"KL exploding{_at(step)}: {key} ({_KL_WHAT[key]}) = {_fmt(value)} {why}. The policy is "
            "moving too fast; lower the learning rate, raise the KL penalty, or lower max_async_level.")

    def _reward(self, key: str, value: float, step: int | None) -> Alert | None:
        """Fire when the mean of the last `reward_window` values falls well below the best mean of a window before
        it (one that ended in the last `reward_history` steps). Each window's mean is taken once, when its last
        value comes, as `sum` of its values over w: the same float a recomputation gives, so a drop that lands on a
        threshold fires as it always did."""
        w = self.t.reward_window
        self._rewards += 1
        self._reward_window.append(value)
        if self._rewards < w:
            return None
        current = sum(self._reward_window) / w
        means = self._reward_means
        means.append(current)
        if len(means) == means.maxlen:  # the window that ended just before the current one began is a candidate
            self._reward_peaks.append(means[0])
        if self._rewards < 2 * w or not self._reward_peaks:
            return None
        peak = max(self._reward_peaks)  # the first of equals, as before
        drop = peak - current
        firing = drop >= self.t.reward_drop_min and drop >= self.t.reward_drop_fraction * abs(peak)
        cleared = drop < self.t.reward_drop_min / 2 or drop < self.t.reward_drop_fraction / 2 * abs(peak)
        if not self._starts(REWARD_DROP, firing, cleared):
            return None
        return _alert(
            REWARD_DROP, f"Reward dropped sharply{_at(step)}: reward/mean averages {_fmt(current)} over the last {w} "
            f"steps, down from {_fmt(peak)}. Check the samples for degenerate outputs; consider restarting from the "
            "checkpoint before the drop with a lower learning rate.")

    def _loss(self, key: str, value: float, step: int | None) -> Alert | None:
        t, size = self.t, abs(value)
        # The median matters only for a loss above loss_min / 2 (below it the loss neither fires nor blocks).
        median = statistics.median(self._loss_sizes) \
            if len(self._loss_sizes) >= 3 and not size <= t.loss_min / 2 else None
        if not math.isfinite(value):
            firing, level, why = True, "ERROR", "is not finite"
        elif median is not None and size > t.loss_min and size > t.loss_ratio * median:
            firing, level, why = True, "WARNING", f"is {size / max(median, 1e-12):.0f}x its recent median " \
                                                  f"{_fmt(median)}"
        else:
            firing, level, why = False, "WARNING", ""
            self._loss_sizes.append(size)  # (finite: not finite fires)
        cleared = math.isfinite(value) and \
            (median is None or size <= t.loss_ratio / 2 * max(median, t.loss_min / t.loss_ratio))
        if not self._starts(LOSS_DIVERGING, firing, cleared):
            return None
        return _alert(
            LOSS_DIVERGING, f"Loss diverging{_at(step)}: loss = {_fmt(value)} {why}. Lower the learning rate, enable "
            "gradient clipping, and resume from the last good checkpoint.", level)

    def _env_errored(self, env: str, value: float, step: int | None) -> Alert | None:
        """An environment whose rollouts errored above `env_errored` in each of its last `env_errored_steps` steps;
        each environment has its own episodes."""
        t = self.t
        above = value > t.env_errored  # (nan: not above, and not cleared either)
        steps = self._env_errored_steps[env] = self._env_errored_steps.get(env, 0) + 1 if above else 0
        if not self._starts(f"{ENV_ERRORED}:{env}", steps >= t.env_errored_steps, value <= t.env_errored_rearm):
            return None
        return _alert(
            ENV_ERRORED, f"Environment {env} is failing{_at(step)}: {value:.0%} of its rollouts errored (above "
            f"{t.env_errored:.0%} for {steps} steps in a row). Its failed groups are dropped and drawn again from it; "
            "the run stops if half of its rollouts keep failing. Look at the orchestrator's warnings and its server's "
            "log (logs/env-*.log in the run's folder for an isolated environment); rollouts that time out "
            f"(env/{env}/timed_out) need a longer [[env]] timeout.")

    def _grad(self, key: str, value: float, step: int | None) -> Alert | None:
        if math.isfinite(value) or not self._starts(LOSS_DIVERGING, True, False):
            return None
        return _alert(
            LOSS_DIVERGING, f"Loss diverging{_at(step)}: optim/grad_norm is {value}. The update is not finite; lower "
            "the learning rate and resume from the last good checkpoint.", "ERROR")
