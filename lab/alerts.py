"""Training-health alerts: the signs the RL guide tells a user to watch for, raised from the event stream.

The guide (reference 004, "During Training" and "Model Collapse") says: `reward/mean` should increase steadily,
`reward/std` should stay stable and not collapse to 0, `policy/entropy` should decrease but not collapse,
`policy/kl` should stay within bounds; look out for sudden reward drops, loss divergence and degenerate outputs
(repetition, incoherence; all outputs becoming identical). `AlertMonitor` checks exactly these on every event it
is fed and returns the alerts that start now.

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

from lab.events import Event

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


class AlertMonitor:
    """Feed it events (`observe`) or metric dicts and completions directly; it returns the alerts that start."""

    def __init__(self, thresholds: AlertThresholds | None = None) -> None:
        self.t = thresholds or AlertThresholds()
        self.active: set[str] = set()  # alert keys whose episode is going on
        self._entropy_baseline: list[float] = []
        self._std_zero_steps = 0
        self._kl: dict[str, deque[float]] = {}
        self._rewards: deque[float] = deque(maxlen=self.t.reward_history + self.t.reward_window)
        self._losses: deque[float] = deque(maxlen=self.t.loss_window)
        self._samples: deque[tuple[str, str, bool]] = deque(maxlen=self.t.repetition_window)  # example, text, bad
        self._checks: tuple[tuple[str, Callable[[str, float, str], list[Alert]]], ...] = (
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
        at = f" at step {step}" if step is not None else ""
        for key, check in self._checks:
            if key in metrics:
                value = _number(metrics[key])
                if value is not None:
                    alerts.extend(check(key, value, at))
        return alerts

    def observe_sample(self, text: str, example_id: str = "", step: int | None = None) -> list[Alert]:
        """One sampled completion's text."""
        at = f" at step {step}" if step is not None else ""
        bad = is_degenerate(text)
        self._samples.append((example_id, text.strip(), bad))
        alerts: list[Alert] = []
        degenerate = sum(1 for _, _, b in self._samples if b)
        needed = max(2, math.ceil(self.t.repetition_fraction * len(self._samples)))
        alerts += self._episode(
            DEGENERATE_OUTPUTS, degenerate >= needed, degenerate == 0,
            lambda: f"Degenerate outputs{at}: {degenerate} of the last {len(self._samples)} samples repeat themselves "
            "(loops of the same words). Look at the samples; if it spreads, restart from an earlier checkpoint "
            "with a lower learning rate or a higher temperature.")
        by_text: dict[str, set[str]] = {}
        for example, completion, _ in self._samples:
            if completion:
                by_text.setdefault(completion, set()).add(example)
        same = max((len(examples) for examples in by_text.values()), default=0)
        alerts += self._episode(
            IDENTICAL_OUTPUTS, same >= self.t.identical_count, same <= 1,
            lambda: f"Identical outputs{at}: {same} different prompts got the same completion. This is the "
            f"model collapse "
            "the guide describes: restart from an earlier checkpoint, lower the learning rate, raise the KL "
            "penalty or the sampling temperature.", level="ERROR")
        return alerts

    def observe_all(self, events: Iterable[Event]) -> list[Alert]:
        return [alert for event in events for alert in self.observe(event)]

    # Checks -------------------------------------------------------------------------------------------------
    def _episode(self, key: str, firing: bool, cleared: bool, message: Callable[[], str], *,
                 level: str = "WARNING", name: str | None = None) -> list[Alert]:
        """Fire when `firing` starts an episode; end the episode when `cleared`. The message is only formatted
        when it fires (this runs for every metric of every step of a replayed log)."""
        if key in self.active:
            if cleared:
                self.active.discard(key)
            return []
        if firing:
            self.active.add(key)
            return [{"name": name or key, "message": message(), "level": level}]
        return []

    def _entropy(self, key: str, value: float, at: str) -> list[Alert]:
        if len(self._entropy_baseline) < self.t.entropy_warmup:
            self._entropy_baseline.append(value)
        baseline = max(self._entropy_baseline)
        low = max(self.t.entropy_floor, self.t.entropy_collapse_ratio * baseline)
        firing = len(self._entropy_baseline) >= self.t.entropy_warmup and value < low
        cleared = value > max(self.t.entropy_floor * 2, self.t.entropy_rearm_ratio * baseline)
        return self._episode(
            ENTROPY_COLLAPSE, firing, cleared,
            lambda: f"Entropy collapsing{at}: policy/entropy {_fmt(value)} is down from {_fmt(baseline)} at the start. "
            "Outputs are becoming deterministic and exploration stops; lower the learning rate, raise the "
            "temperature, or restart from an earlier checkpoint.")

    def _reward_std(self, key: str, value: float, at: str) -> list[Alert]:
        self._std_zero_steps = self._std_zero_steps + 1 if value <= self.t.std_zero else 0
        return self._episode(
            REWARD_STD_COLLAPSE, self._std_zero_steps >= self.t.std_patience, value >= self.t.std_rearm,
            lambda: f"Reward std collapsed to 0{at} ({self._std_zero_steps} steps in a row): every rollout of a "
            f"group gets "
            "the same reward, so advantages are 0 and nothing is learned. The task is too easy or too hard for the "
            "model, or the policy collapsed; enable difficulty filtering or raise rollouts_per_example.")

    def _kl_check(self, key: str, value: float, at: str) -> list[Alert]:
        history = self._kl.setdefault(key, deque(maxlen=self.t.kl_window))
        # The median matters only above kl_min (below it neither the ratio fires nor does it block re-arming).
        median = statistics.median(history) if len(history) >= 3 and value > self.t.kl_min else None
        if not math.isfinite(value):
            firing, why = True, "is not finite"
        elif value > self.t.kl_limit:
            firing, why = True, f"is above {_fmt(self.t.kl_limit)}"
        elif median is not None and value > self.t.kl_min and value > self.t.kl_ratio * max(median, 1e-12):
            firing, why = True, f"is {value / max(median, 1e-12):.0f}x its recent median {_fmt(median)}"
        else:
            firing, why = False, ""
        cleared = math.isfinite(value) and value <= self.t.kl_limit / 2 and \
            (median is None or value <= self.t.kl_ratio / 2 * max(median, self.t.kl_min))
        if math.isfinite(value) and not firing:
            history.append(value)
        what = "mismatch KL between trainer and sampler" if key == "policy/kl" else "KL to the reference model"
        return self._episode(
            f"{KL_EXPLODING}:{key}", firing, cleared,
            lambda: f"KL exploding{at}: {key} ({what}) = {_fmt(value)} {why}. The policy is moving too fast; lower the "
            "learning rate, raise the KL penalty, or lower max_async_level.", name=KL_EXPLODING)

    def _reward(self, key: str, value: float, at: str) -> list[Alert]:
        self._rewards.append(value)
        w = self.t.reward_window
        values = list(self._rewards)
        if len(values) < 2 * w:
            return []
        current = sum(values[-w:]) / w
        peak = max(sum(values[i:i + w]) / w for i in range(len(values) - 2 * w + 1))
        drop = peak - current
        firing = drop >= self.t.reward_drop_min and drop >= self.t.reward_drop_fraction * abs(peak)
        cleared = drop < self.t.reward_drop_min / 2 or drop < self.t.reward_drop_fraction / 2 * abs(peak)
        return self._episode(
            REWARD_DROP, firing, cleared,
            lambda: f"Reward dropped sharply{at}: reward/mean averages {_fmt(current)} over the last {w} steps, "
            f"down from "
            f"{_fmt(peak)}. Check the samples for degenerate outputs; consider restarting from the checkpoint "
            "before the drop with a lower learning rate.")

    def _loss(self, key: str, value: float, at: str) -> list[Alert]:
        # The median matters only for a loss above loss_min / 2 (below it the loss neither fires nor blocks).
        median = statistics.median(abs(v) for v in self._losses) \
            if len(self._losses) >= 3 and not abs(value) <= self.t.loss_min / 2 else None
        if not math.isfinite(value):
            firing, level, why = True, "ERROR", "is not finite"
        elif median is not None and abs(value) > self.t.loss_min and abs(value) > self.t.loss_ratio * median:
            firing, level, why = True, "WARNING", f"is {abs(value) / max(median, 1e-12):.0f}x its recent median " \
                                                  f"{_fmt(median)}"
        else:
            firing, level, why = False, "WARNING", ""
        cleared = math.isfinite(value) and (median is None or abs(value) <= self.t.loss_ratio / 2 * max(
            median, self.t.loss_min / self.t.loss_ratio))
        if math.isfinite(value) and not firing:
            self._losses.append(value)
        return self._episode(
            LOSS_DIVERGING, firing, cleared,
            lambda: f"Loss diverging{at}: loss = {_fmt(value)} {why}. Lower the learning rate, enable gradient "
            f"clipping, "
            "and resume from the last good checkpoint.", level=level)

    def _grad(self, key: str, value: float, at: str) -> list[Alert]:
        if math.isfinite(value):
            return []
        return self._episode(
            LOSS_DIVERGING, True, False,
            lambda: f"Loss diverging{at}: optim/grad_norm is {value}. The update is not finite; lower the "
            f"learning rate "
            "and resume from the last good checkpoint.", level="ERROR")
