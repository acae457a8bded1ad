"""Training-health alerts: the signs the RL guide tells a user to watch for, raised from the event stream.

The guide (reference 004, "During Training" and "Model Collapse") says: `reward/mean` should increase steadily,
`reward/std` should stay stable and not collapse to 0, `policy/entropy` should decrease but not collapse,
`policy/kl` should stay within bounds; look out for sudden reward drops, loss divergence and degenerate outputs
(repetition, incoherence; all outputs becoming identical). `AlertMonitor` checks exactly these on every event it
is fed and returns the alerts that start now, and one sign of the run's environments: an environment whose rollouts
keep failing (`env/<name>/errored` above 5% for 3 steps in a row, prime-rl's guide's rule), whose share of the
batch is then held by drawing it again (trainer/orchestrator.py) until a hard limit fails the run.

The guide's other signs to watch during a run (prime-rl's docs/training.md) warn only when they last: the mismatch KL
rising (`policy/kl`, "the early-warning sign for off-policy collapse"), spikes of `optim/grad_norm` over its running
median ("spikes precede divergence"), and one side of the run waiting on the other: the trainer for its batches
(`time/wait_for_batch` against its `time/step`: orchestrator-bound) or the orchestrator for the policy
(`time/wait_for_weights` against its `rollout/generation_time`: trainer-bound). Each message names the setting that
usually helps. monitors/health.py reads the same state into the run's health line.

The monitor knows the run's loss (`loss`: the launcher's from the run's config, the TUI's from its resolved.json): a
loss that learns from a teacher (`TEACHER_LOSSES`: `opd`, whose teacher term trains whatever the rewards, and hard
distillation's `sft`) does not need rewards that vary, so flat rewards raise no `reward_std_collapse` there.

An alert fires once per *episode*: when its condition becomes true. While the condition holds it stays quiet; once
the condition has cleared (with some hysteresis) it is re-armed and a new episode may fire again. The RL launcher
feeds the monitor every event it follows and writes what it returns as `alert` events; the TUI runs its own monitor
over logs that carry no alert events (older runs), so both see the same alerts.

Pure logic: no textual, no torch, no numpy.
"""

from __future__ import annotations

import json
import math
import statistics
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from prime_lab.runs.events import Event
from prime_lab.runs.registry import Run

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
SANDBOX_NOTICE = "sandbox"  # what a run's sandboxes said once (sandbox/stats.py notices: the launcher writes these)
KL_RISING = "kl_rising"  # the mismatch KL keeps growing
GRAD_NORM_SPIKES = "grad_norm_spikes"  # optim/grad_norm spikes again and again
ORCHESTRATOR_BOUND = "orchestrator_bound"  # the trainer keeps waiting for its batches
TRAINER_BOUND = "trainer_bound"  # the orchestrator keeps waiting for the policy
HEALTH_ALERT_NAMES = (KL_RISING, GRAD_NORM_SPIKES, ORCHESTRATOR_BOUND, TRAINER_BOUND)
# each side's wait, what it was busy with meanwhile (the same process's metrics of a step), and who waits on whom
BOUND_METRICS = {ORCHESTRATOR_BOUND: ("time/wait_for_batch", "time/step"),
                 TRAINER_BOUND: ("time/wait_for_weights", "rollout/generation_time")}
# losses that learn from a teacher whatever the rewards: a reward std of 0 there is no sign that nothing is learned
TEACHER_LOSSES = ("sft", "opd")
_ERRORED_PREFIX, _ERRORED_SUFFIX = "env/", "/errored"
MAX_LAYOUTS = 64  # sets of metric keys whose errored keys are remembered


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
    kl_trend_window: int = 10  # policy/kl values whose newer half is compared with the older half
    kl_trend_ratio: float = 2.0  # rising: the newer half's median at least this many times the older half's ...
    kl_trend_min: float = 1e-3  # ... and above this ...
    kl_trend_steps: int = 3  # ... on this many steps in a row
    kl_trend_rearm: float = 1.25  # re-armed once the newer half is at most this many times the older (or <= min)
    grad_window: int = 20  # optim/grad_norm values forming its running median; spikes are counted over as many
    grad_warmup: int = 5  # values in the median before a spike can count
    grad_spike_ratio: float = 5.0  # a spike: above this many times the running median
    grad_spikes: int = 3  # fire at this many spikes among the last grad_window values; re-armed at none
    bound_share: float = 0.5  # a process waiting on the other for more than this share of its step ...
    bound_steps: int = 10  # ... for this many of its steps in a row: orchestrator- or trainer-bound
    bound_rearm: float = 0.3  # re-armed at or below this share


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


class GradSpike(NamedTuple):
    """A spike of optim/grad_norm: which value it was (counted from 1), the value, the running median it beat."""

    position: int
    value: float
    median: float
    step: int | None


def trend_halves(values: Sequence[float]) -> tuple[float, float]:
    """The medians of the older and of the newer half of `values` (at least 2; an odd middle one is left out):
    one step far off the rest moves neither."""
    items = list(values)
    half = len(items) // 2
    return statistics.median(items[:half]), statistics.median(items[len(items) - half:])


def run_loss(run: Run) -> str:
    """The loss a run trains with, from its resolved config (resolved.json): "rl" where it names none (an SFT run,
    a config from before distillation) or cannot be read."""
    try:
        resolved = json.loads(run.resolved_path.read_text())
    except (OSError, ValueError):
        return "rl"
    loss = resolved.get("loss") if isinstance(resolved, dict) else None
    return loss if isinstance(loss, str) else "rl"


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

    def __init__(self, thresholds: AlertThresholds | None = None, *, loss: str = "rl") -> None:
        t = self.t = thresholds or AlertThresholds()
        self.loss = loss  # the run's `loss` (trainer/config.py)
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
        self._errored_keys: dict[tuple[str, ...], list[tuple[str, str]]] = {}  # by the keys of a metrics dict
        self.env_errored_steps: dict[str, int] = {}  # environment -> its steps in a row above env_errored
        self.env_errored_latest: dict[str, float] = {}  # environment -> its latest errored share
        self.kl_recent: deque[float] = deque(maxlen=max(2, t.kl_trend_window))  # finite policy/kl, for its trend
        self._kl_rising_steps = 0
        self.grad_norms: deque[float] = deque(maxlen=t.grad_window)  # finite optim/grad_norm values, spikes left out
        self.grad_seen = 0  # optim/grad_norm values seen
        self.grad_spikes: deque[GradSpike] = deque()  # the spikes among the last grad_window values, oldest first
        # per side: (wait, its share of the step) of its recent steps; its steps in a row above bound_share
        self.waits: dict[str, deque[tuple[float, float]]] = {
            name: deque(maxlen=max(1, t.bound_steps)) for name in BOUND_METRICS}
        self._bound_steps = dict.fromkeys(BOUND_METRICS, 0)
        self._checks: tuple[tuple[str, Callable[[str, float, int | None], Alert | None]], ...] = (
            ("policy/entropy", self._entropy), ("reward/std", self._reward_std), ("policy/kl", self._kl_check),
            ("policy/ref_kl", self._kl_check), ("reward/mean", self._reward), ("loss", self._loss),
            ("optim/grad_norm", self._grad), ("policy/kl", self._kl_trend))
        if loss in TEACHER_LOSSES:  # the teacher's term trains on flat rewards too
            self._checks = tuple(check for check in self._checks if check[0] != "reward/std")

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
        for name, (wait_key, busy_key) in BOUND_METRICS.items():
            if wait_key in metrics and busy_key in metrics:
                wait, busy = _number(metrics[wait_key]), _number(metrics[busy_key])
                if wait is not None and busy is not None:
                    alert = self._bound(name, wait, busy, step)
                    if alert is not None:
                        alerts.append(alert)
        for key, env in self.errored_keys(metrics):
            value = _number(metrics[key])
            if value is not None:
                value += _number(metrics.get(f"{_ERRORED_PREFIX}{env}/empty")) or 0.0  # errored or empty
                alert = self._env_errored(env, value, step)
                if alert is not None:
                    alerts.append(alert)
        return alerts

    def errored_keys(self, metrics: Mapping[str, Any]) -> list[tuple[str, str]]:
        """The `env/<name>/errored` keys of `metrics` with their environments. A run logs the same keys step after
        step: they are found once per set of keys, not by looking at every key of every step."""
        layout = tuple(metrics)
        found = self._errored_keys.get(layout)
        if found is None:
            if len(self._errored_keys) >= MAX_LAYOUTS:
                self._errored_keys.clear()
            found = self._errored_keys[layout] = [
                (key, key[len(_ERRORED_PREFIX):-len(_ERRORED_SUFFIX)]) for key in layout
                if key.startswith(_ERRORED_PREFIX) and key.endswith(_ERRORED_SUFFIX)]
        return found

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
    def ongoing(self, name: str) -> bool:
        """Whether an episode of the alert `name` is going on (of any environment or KL, for those)."""
        return any(key == name or key.startswith(name + ":") for key in self.active)

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
        self.env_errored_latest[env] = value
        steps = self.env_errored_steps[env] = self.env_errored_steps.get(env, 0) + 1 if above else 0
        if not self._starts(f"{ENV_ERRORED}:{env}", steps >= t.env_errored_steps, value <= t.env_errored_rearm):
            return None
        return _alert(
            ENV_ERRORED, f"Environment {env} is failing{_at(step)}: {value:.0%} of its rollouts errored or came back "
            f"empty (above {t.env_errored:.0%} for {steps} steps in a row). Its failed groups are dropped and drawn "
            "again from it; the run stops if half of its rollouts keep failing. Look at the orchestrator's warnings "
            "and its server's log (logs/env-*.log in the run's folder for an isolated environment); rollouts that "
            f"time out (env/{env}/timed_out) need a longer [[env]] timeout; empty ones (env/{env}/empty, no word from "
            "the model) often mean a prompt or chat template the model does not follow.")

    def _grad(self, key: str, value: float, step: int | None) -> Alert | None:
        """A value that is not finite is the loss diverging; a finite one may be a spike: above `grad_spike_ratio`
        times the median of the last `grad_window` values that were none. Spikes are counted over the last
        `grad_window` values, and `grad_spikes` of them fire."""
        t = self.t
        index = self.grad_seen = self.grad_seen + 1
        spikes = self.grad_spikes
        while spikes and spikes[0].position <= index - t.grad_window:
            spikes.popleft()
        if not math.isfinite(value):
            if not self._starts(LOSS_DIVERGING, True, False):
                return None
            return _alert(
                LOSS_DIVERGING, f"Loss diverging{_at(step)}: optim/grad_norm is {value}. The update is not finite; "
                "lower the learning rate and resume from the last good checkpoint.", "ERROR")
        history = self.grad_norms
        median = statistics.median(history) if len(history) >= max(1, t.grad_warmup) else 0.0
        if median > 0 and value > t.grad_spike_ratio * median:
            spikes.append(GradSpike(index, value, median, step))
        else:
            history.append(value)
        count = len(spikes)
        if not self._starts(GRAD_NORM_SPIKES, count >= t.grad_spikes, count == 0):
            return None
        spike = spikes[-1]
        return _alert(
            GRAD_NORM_SPIKES, f"Gradient norm spiking{_at(step)}: optim/grad_norm {_fmt(spike.value)} is "
            f"{spike.value / spike.median:.0f}x its running median {_fmt(spike.median)}, {count} spikes in the last "
            f"{t.grad_window} steps. Spikes come before divergence: lower the learning rate, or [trainer] "
            "max_grad_norm to clip each update harder; if the loss follows, resume from a checkpoint before them.")

    def _kl_trend(self, key: str, value: float, step: int | None) -> Alert | None:
        """The mismatch KL rising: over the last `kl_trend_window` values, the newer half's median at least
        `kl_trend_ratio` times the older half's (and above `kl_trend_min`), on `kl_trend_steps` steps in a row."""
        if not math.isfinite(value):
            return None  # (kl_exploding's)
        t, recent = self.t, self.kl_recent
        recent.append(value)
        if len(recent) < max(2, t.kl_trend_window):
            return None
        older, newer = trend_halves(recent)
        rising = newer > t.kl_trend_min and newer >= t.kl_trend_ratio * older
        steps = self._kl_rising_steps = self._kl_rising_steps + 1 if rising else 0
        if not self._starts(KL_RISING, steps >= t.kl_trend_steps,
                            newer <= t.kl_trend_min or newer <= t.kl_trend_rearm * older):
            return None
        half = len(recent) // 2
        return _alert(
            KL_RISING, f"Mismatch KL rising{_at(step)}: policy/kl's median is {_fmt(newer)} over the last {half} "
            f"steps, up from {_fmt(older)} over the {half} before (rising for {steps} steps). The sampler's policy "
            "and the trainer's drift apart, the early sign of off-policy collapse: lower max_async_level (rollouts "
            "from a less stale policy) or the learning rate.")

    def _bound(self, name: str, wait: float, busy: float, step: int | None) -> Alert | None:
        """One side of the run waiting on the other for more than `bound_share` of its step (its wait over its wait
        plus what it was busy with), `bound_steps` of its steps in a row."""
        if not (math.isfinite(wait) and math.isfinite(busy)) or wait < 0 or busy < 0:
            return None
        t = self.t
        share = wait / (wait + busy) if wait + busy > 0 else 0.0
        self.waits[name].append((wait, share))
        steps = self._bound_steps[name] = self._bound_steps[name] + 1 if share > t.bound_share else 0
        if not self._starts(name, steps >= t.bound_steps, share <= t.bound_rearm):
            return None
        limit = f"({steps} steps in a row above {t.bound_share:.0%})"
        if name == ORCHESTRATOR_BOUND:
            return _alert(
                name, f"Orchestrator-bound{_at(step)}: the trainer waited {_fmt(wait)} s for its batch, {share:.0%} "
                f"of its step {limit}. Sampling is the bottleneck: more sampler servers ([inference] num_servers) "
                "or GPUs for them, shorter generations ([sampling] max_tokens), a shorter [[env]] timeout for slow "
                "environments; with max_async_level 0 or 1, raising it overlaps sampling with training. On a CPU "
                "alone the sampler and the trainer share the cores, so one waits while the other works: expected "
                "there, not a fault.")
        return _alert(
            name, f"Trainer-bound{_at(step)}: the orchestrator waited {_fmt(wait)} s for the policy, {share:.0%} of "
            f"its step {limit}. Training is the bottleneck: more trainer processes ([trainer] nproc_per_node), "
            "larger micro-batches ([trainer] micro_batch_tokens) or a smaller batch_size; a higher max_async_level "
            "lets sampling run further ahead, with staler rollouts.")
