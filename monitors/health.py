"""A training run's health in one line: the signs prime-rl's guide tells a person to watch during a run, each `ok` or
`warn`, read from the run's metrics.

- rollouts: the share of rollouts that errored or came back empty (`env/<name>/errored` + `env/<name>/empty`, the
  worst environment's; timed-out ones count as errored).
- who waits on whom: the trainer waiting for its batches (`time/wait_for_batch`, against its `time/step`) is
  orchestrator-bound, the orchestrator waiting for the policy (`time/wait_for_weights`, against its
  `rollout/generation_time`) trainer-bound; each as the median of its recent steps.
- the mismatch KL's trend (`policy/kl`: the newer half of its recent values against the older half).
- spikes of `optim/grad_norm` over its running median.

An item warns while its alert's episode goes on (monitors/alerts.py: `env_errored`, `orchestrator_bound`,
`trainer_bound`, `kl_rising` or `kl_exploding` of policy/kl, `grad_norm_spikes`), so the health line, the alerts and
the launcher's alert events agree, all from the thresholds of `AlertThresholds`; each warning says what usually
helps. `HealthTracker` folds metrics events as they come (the run page, `prime rl list` over a log's tail).

A restart rewinds nothing here: the windows are a few steps long and the steps run again refill them.

Pure: no textual, no I/O.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prime_lab.monitors.alerts import (
    BOUND_METRICS,
    ENV_ERRORED,
    GRAD_NORM_SPIKES,
    KL_EXPLODING,
    KL_RISING,
    ORCHESTRATOR_BOUND,
    TRAINER_BOUND,
    AlertMonitor,
    AlertThresholds,
    trend_halves,
)
from prime_lab.runs.events import Event

OK, WARN = "ok", "warn"
BALANCED_SHARE = 0.1  # neither side waits more than this share of its step: "balanced" rather than a side named
TREND_MIN_VALUES = 4  # policy/kl values before its trend is named
WATCHED = ("policy/kl", "optim/grad_norm", *(key for pair in BOUND_METRICS.values() for key in pair))

HINTS = {
    "rollouts": "look at the orchestrator's warnings and the environment server's log (logs/env-<name>.log); "
                "rollouts that time out need a longer [[env]] timeout",
    ORCHESTRATOR_BOUND: "sampling is the bottleneck: more sampler servers ([inference] num_servers), shorter "
                        "generations ([sampling] max_tokens), or raise max_async_level if it is 0 or 1",
    TRAINER_BOUND: "training is the bottleneck: more trainer processes ([trainer] nproc_per_node), larger "
                   "micro-batches ([trainer] micro_batch_tokens) or a smaller batch_size",
    "mismatch_kl": "lower max_async_level (rollouts from a less stale policy) or the learning rate",
    "grad_norm": "lower the learning rate, or [trainer] max_grad_norm to clip each update harder",
}


@dataclass(frozen=True)
class HealthItem:
    """One sign: its name (rollouts, bound, mismatch_kl, grad_norm), ok or warn, what the line says, the few words
    `prime rl list` shows, and when it warns, what usually helps."""

    name: str
    level: str
    text: str
    short: str
    hint: str = ""

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "level": self.level, "text": self.text, "hint": self.hint}


@dataclass(frozen=True)
class Health:
    """A run's health at its latest step: the items it has metrics for (none: nothing to say yet)."""

    items: tuple[HealthItem, ...] = ()
    step: int | None = None

    @property
    def level(self) -> str:
        return WARN if any(item.level == WARN for item in self.items) else OK

    @property
    def warnings(self) -> list[HealthItem]:
        return [item for item in self.items if item.level == WARN]

    @property
    def text(self) -> str:
        """`ok · trainer-bound (wait_for_batch 0.1 s vs policy 3.2 s) · errored 0% · mismatch KL flat · grad norm
        steady` ('' with no items)."""
        return " · ".join([self.level, *(item.text for item in self.items)]) if self.items else ""

    def short(self) -> str:
        """For a column of runs: `ok`, or `warn: ` and the warning items' few words; `-` with no items."""
        if not self.items:
            return "-"
        warnings = self.warnings
        return "warn: " + ", ".join(item.short for item in warnings) if warnings else OK

    def to_json(self) -> dict[str, Any]:
        return {"level": self.level, "text": self.text, "step": self.step,
                "items": [item.to_json() for item in self.items]}


def seconds(value: float) -> str:
    return f"{value:.2g} s" if value < 10 else f"{value:.0f} s"


def percent(share: float) -> str:
    return "0%" if share <= 0 else f"{share:.0%}" if share >= 0.01 else "<1%"


class HealthTracker:
    """Folds a run's metrics (`observe_metrics`, or `feed` events) into its `Health` (`health()`), through an
    `AlertMonitor` whose alerts it drops: what it keeps is their state. The monitor is its own, or `monitor`, one its
    owner already feeds every metric (the RL page's model): then only the step is taken here, not the metrics
    folded a second time."""

    def __init__(self, thresholds: AlertThresholds | None = None, monitor: AlertMonitor | None = None) -> None:
        self.monitor = monitor if monitor is not None else AlertMonitor(thresholds)
        self.feeds_monitor = monitor is None
        self.step: int | None = None

    @property
    def t(self) -> AlertThresholds:
        return self.monitor.t

    def observe_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """One metrics dict: only the keys health reads go to the monitor (a run may log 60 metrics a step and the
        run page folds every one of its steps)."""
        if self.feeds_monitor:
            watched = {key: metrics[key] for key in WATCHED if key in metrics}
            for key, env in self.monitor.errored_keys(metrics):
                watched[key] = metrics[key]
                empty = f"env/{env}/empty"
                if empty in metrics:
                    watched[empty] = metrics[empty]
            if watched:
                self.monitor.observe_metrics(watched, step)
        if step is not None and (self.step is None or step > self.step):
            self.step = step

    def feed(self, items: Iterable[object]) -> None:
        """Fold the metrics events among `items`: Events or the raw JSON objects of a log (others are skipped)."""
        for item in items:
            kind: object
            step: object
            data: object
            if isinstance(item, Event):
                kind, step, data = item.kind, item.step, item.data
            elif isinstance(item, dict):
                kind, step, data = item.get("kind"), item.get("step"), item.get("data")
            else:
                continue
            if kind == "metrics" and isinstance(data, dict):
                self.observe_metrics(data, step if isinstance(step, int) else None)

    # Items --------------------------------------------------------------------------------------------------
    def health(self) -> Health:
        items = [item for item in (self._bound(), self._rollouts(), self._mismatch_kl(), self._grad_norm())
                 if item is not None]
        return Health(tuple(items), self.step)

    def _rollouts(self) -> HealthItem | None:
        latest = self.monitor.env_errored_latest
        if not latest:
            return None
        failing = sorted(env for env in latest if f"{ENV_ERRORED}:{env}" in self.monitor.active)
        env = failing[0] if failing else max(latest, key=lambda name: latest[name])
        share = latest[env]
        if failing:
            steps = self.monitor.env_errored_steps.get(env, 0)
            above = f", {steps} steps above {percent(self.t.env_errored)}" if steps else ""
            return HealthItem("rollouts", WARN, f"errored/empty {percent(share)} ({env}{above})",
                              f"errored/empty {percent(share)} ({env})", HINTS["rollouts"])
        where = f" ({env})" if len(latest) > 1 and share > 0 else ""
        return HealthItem("rollouts", OK, f"errored/empty {percent(share)}{where}", f"errored/empty {percent(share)}")

    def _bound(self) -> HealthItem | None:
        waits = self.monitor.waits
        batch, policy = waits[ORCHESTRATOR_BOUND], waits[TRAINER_BOUND]
        if not batch and not policy:
            return None
        shares = {name: statistics.median(share for _, share in waits[name]) for name in waits if waits[name]}
        parts = [f"{label} {seconds(statistics.median(wait for wait, _ in waits[name]))}"
                 for name, label in ((ORCHESTRATOR_BOUND, "wait_for_batch"), (TRAINER_BOUND, "policy"))
                 if waits[name]]
        detail = f" ({' vs '.join(parts)})"
        ongoing = [name for name in (ORCHESTRATOR_BOUND, TRAINER_BOUND) if name in self.monitor.active]
        if ongoing:
            name = ongoing[0]
            label = name.replace("_", "-")
            return HealthItem("bound", WARN, label + detail, label, HINTS[name])
        side = max(shares, key=lambda name: shares[name])
        label = side.replace("_", "-") if shares[side] >= BALANCED_SHARE else "balanced"
        return HealthItem("bound", OK, label + detail, label)

    def _mismatch_kl(self) -> HealthItem | None:
        values = list(self.monitor.kl_recent)
        if not values:
            return None
        t, active = self.t, self.monitor.active
        if f"{KL_EXPLODING}:policy/kl" in active:
            return HealthItem("mismatch_kl", WARN, f"mismatch KL exploding ({values[-1]:.3g})", "KL exploding",
                              HINTS["mismatch_kl"])
        if len(values) < TREND_MIN_VALUES:
            return HealthItem("mismatch_kl", OK, f"mismatch KL {values[-1]:.2g}", "KL")
        older, newer = trend_halves(values)
        moved = f" ({older:.2g} -> {newer:.2g})"
        if KL_RISING in active:
            return HealthItem("mismatch_kl", WARN, "mismatch KL rising" + moved, "KL rising", HINTS["mismatch_kl"])
        if newer > t.kl_trend_min and newer >= t.kl_trend_ratio * older:
            return HealthItem("mismatch_kl", OK, "mismatch KL rising" + moved, "KL rising")
        if older > t.kl_trend_min and older >= t.kl_trend_ratio * newer:
            return HealthItem("mismatch_kl", OK, "mismatch KL falling" + moved, "KL falling")
        return HealthItem("mismatch_kl", OK, "mismatch KL flat", "KL flat")

    def _grad_norm(self) -> HealthItem | None:
        monitor = self.monitor
        if not monitor.grad_seen:
            return None
        spikes = [s for s in monitor.grad_spikes if s.position > monitor.grad_seen - self.t.grad_window]
        if not spikes:
            return HealthItem("grad_norm", OK, "grad norm steady", "grad norm steady")
        worst = max(spikes, key=lambda s: s.value / s.median)
        text = f"grad norm {len(spikes)} spike{'s' if len(spikes) > 1 else ''} in {self.t.grad_window} steps " \
               f"(up to {worst.value / worst.median:.0f}x median)"
        if GRAD_NORM_SPIKES in monitor.active:
            return HealthItem("grad_norm", WARN, text, "grad norm spikes", HINTS["grad_norm"])
        return HealthItem("grad_norm", OK, text, "grad norm spike")


def health_of(events: Iterable[object], thresholds: AlertThresholds | None = None) -> Health:
    """The health at the end of `events` (Events or raw JSON objects)."""
    tracker = HealthTracker(thresholds)
    tracker.feed(events)
    return tracker.health()
