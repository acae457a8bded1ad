"""A training run's own evaluations, before and after training, read from its event log: the one reading that
`prime rl run --foreground`, `get`, `progress` and the workbench share.

An RL run with an `[eval]` section evaluates the base model before step 1 (`eval_base_model`: an `eval` event at
step 0) and the policy every `interval` steps and after the last one (an `eval` event at that step). An event's
`eval/<env>/reward` is the mean reward of that environment's evaluation rollouts: its examples x rollouts per
example, a rollout that failed counted as 0. How many did is beside it (`Failures`): `eval/<env>/rollouts`,
`eval/<env>/failed` (an error other than the time limit) and `eval/<env>/timed_out`, and every reader prints them
beside the mean ("0.207 (3 of 16 timed out, counted 0)"); an event from before they were recorded has none.

An SFT run validates instead: its `val/loss` metrics are the mean loss per trained token of the validation examples,
at step 0 with `eval_on_start`, every `interval` steps and after the last one.

Per measure, `base` is step 0's value and `final` the newest after it (the last step's once the run completed). A
restart drops what came after the checkpoint it resumed from, as every reader does (`events.final_timeline`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prime_lab.runs.events import RESTART, Event, final_timeline

if TYPE_CHECKING:
    from prime_lab.runs.registry import Run

EVAL_REWARD = re.compile(r"eval/(.+)/reward")
VAL_LOSS = "val/loss"


@dataclass(frozen=True)
class Failures:
    """How many of an evaluation's rollouts of one environment failed, each counted as reward 0 in its mean:
    `failed` for an error other than the time limit, `timed_out` for running past it (the two never overlap)."""

    rollouts: int
    failed: int = 0
    timed_out: int = 0

    def metrics(self, env: str | None = None) -> dict[str, float]:
        """`eval/<env>/rollouts`, `failed` and `timed_out` (the totals over every environment without `env`)."""
        prefix = f"eval/{env}/" if env is not None else "eval/"
        return {f"{prefix}rollouts": float(self.rollouts), f"{prefix}failed": float(self.failed),
                f"{prefix}timed_out": float(self.timed_out)}

    @classmethod
    def of(cls, metrics: Mapping[str, Any], env: str) -> Failures | None:
        """An `eval` event's counts for `env` (None: the event recorded none)."""
        counts = [_number(metrics.get(f"eval/{env}/{key}")) for key in ("rollouts", "failed", "timed_out")]
        if any(count is None for count in counts):
            return None
        rollouts, failed, timed_out = (int(count or 0) for count in counts)
        return cls(rollouts, failed, timed_out)

    def __add__(self, other: Failures) -> Failures:
        return Failures(self.rollouts + other.rollouts, self.failed + other.failed, self.timed_out + other.timed_out)

    def note(self) -> str:
        """`3 of 16 timed out, counted 0`, `2 of 16 failed, 1 timed out, counted 0`; "" when none failed."""
        parts = [f"{self.failed} failed"] if self.failed else []
        parts += [f"{self.timed_out} timed out"] if self.timed_out else []
        if not parts:
            return ""
        parts[0] = parts[0].replace(" ", f" of {self.rollouts} ", 1)
        return ", ".join(parts) + ", counted 0"


def with_failures(value: str, failures: Failures | None) -> str:
    """A mean reward as printed, with what failed beside it: `0.207 (3 of 16 timed out, counted 0)`."""
    note = failures.note() if failures is not None else ""
    return f"{value} ({note})" if note else value


def eval_rewards(metrics: Any) -> list[tuple[str, float, Failures | None]]:
    """An `eval` event's `metrics`: each environment's mean reward and its failures, in the order logged."""
    if not isinstance(metrics, Mapping):
        return []
    return [(match.group(1), number, Failures.of(metrics, match.group(1))) for key, value in metrics.items()
            if (match := EVAL_REWARD.fullmatch(str(key))) and (number := _number(value)) is not None]


@dataclass(frozen=True)
class Evaluation:
    """One measure of a run before and after training: an `[eval]` environment's mean reward (RL), or the mean
    validation loss (SFT). `examples` None: every example of the evaluation set; `rollouts_per_example` None for
    a loss."""

    metric: str  # `eval/<env>/reward` or `val/loss`
    env: str | None
    base: float | None
    base_step: int | None
    final: float | None
    final_step: int | None
    examples: int | None
    rollouts_per_example: int | None
    base_failures: Failures | None = None  # the base's and the final's rollouts that failed, where recorded
    final_failures: Failures | None = None

    @property
    def change(self) -> float | None:
        return round(self.final - self.base, 12) if self.base is not None and self.final is not None else None

    @property
    def is_reward(self) -> bool:
        return self.env is not None

    def over(self) -> str:
        """What the mean is over, in words: `20 examples x 2 rollouts`, `all eval examples x 1 rollout`."""
        if not self.is_reward:
            return f"{self.examples} validation examples" if self.examples else "the validation examples"
        examples = f"{self.examples} example{'s' * (self.examples != 1)}" if self.examples else "all eval examples"
        rollouts = self.rollouts_per_example or 1
        return f"{examples} x {rollouts} rollout{'s' * (rollouts != 1)}"

    def to_json(self) -> dict[str, Any]:
        return {"metric": self.metric, "env": self.env, "base": self.base, "base_step": self.base_step,
                "final": self.final, "final_step": self.final_step, "change": self.change,
                "examples": self.examples, "rollouts_per_example": self.rollouts_per_example,
                "base_failures": _json(self.base_failures), "final_failures": _json(self.final_failures)}


def _json(failures: Failures | None) -> dict[str, int] | None:
    return None if failures is None else {"rollouts": failures.rollouts, "failed": failures.failed,
                                          "timed_out": failures.timed_out}


def mean_of(evaluations: list[Evaluation]) -> str:
    """A label for what the means of `evaluations` are of, when they share it: `mean reward over 20 examples x 2
    rollouts`; `mean reward` alone when the environments' sizes differ (each row then says its own)."""
    if evaluations and not any(e.is_reward for e in evaluations):
        return f"mean loss per trained token over {evaluations[0].over()}"
    sizes = {e.over() for e in evaluations if e.is_reward}
    return f"mean reward over {sizes.pop()}" if len(sizes) == 1 else "mean reward"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


class EvaluationFold:
    """A run's events folded, in order, into its evaluations: `add` each event (its kind, step and data), `rewind`
    at a restart, `evaluations()` at any time. `read_evaluations` does it for a whole log."""

    def __init__(self) -> None:
        self.values: dict[str, dict[int, float]] = {}  # metric -> step -> value, metrics in the order first seen
        self.failures: dict[str, dict[int, Failures]] = {}  # metric -> step -> its rollouts that failed, if recorded
        self.sizes: dict[str, tuple[int | None, int | None]] = {}  # env -> (examples, rollouts) an event recorded

    def add(self, kind: str, step: int | None, data: Mapping[str, Any]) -> None:
        if not isinstance(step, int):
            return
        if kind == RESTART:
            self.rewind(step)
        elif kind == "eval" and isinstance(data.get("metrics"), Mapping):
            for env, reward, failures in eval_rewards(data["metrics"]):
                metric = f"eval/{env}/reward"
                self.values.setdefault(metric, {})[step] = reward
                by_step = self.failures.setdefault(metric, {})
                if failures is not None:
                    by_step[step] = failures
                else:
                    by_step.pop(step, None)
            self._sizes(data)
        elif kind == "metrics" and (number := _number(data.get(VAL_LOSS))) is not None:
            self.values.setdefault(VAL_LOSS, {})[step] = number

    def _sizes(self, data: Mapping[str, Any]) -> None:
        """The examples and rollouts per example of each environment, where the event records them
        (`examples` and `rollouts_per_example`, each {env: count})."""
        examples, rollouts = data.get("examples"), data.get("rollouts_per_example")
        examples = examples if isinstance(examples, Mapping) else {}
        rollouts = rollouts if isinstance(rollouts, Mapping) else {}
        for env in {*examples, *rollouts}:
            n, r = examples.get(env), rollouts.get(env)
            self.sizes[str(env)] = (n if isinstance(n, int) else None, r if isinstance(r, int) else None)

    def rewind(self, step: int) -> None:
        """A restart from the checkpoint of `step`: what was measured after it is measured again."""
        for measured in (self.values, self.failures):
            for by_step in measured.values():
                for later in [s for s in by_step if s > step]:
                    del by_step[later]

    def evaluations(self, resolved: Mapping[str, Any] | None = None) -> list[Evaluation]:
        """Per measure, in the order the run first logged them: the base (step 0) and the newest after it. Sizes
        the events did not record come from the run's `resolved` config."""
        out = []
        for metric, by_step in self.values.items():
            if not by_step:
                continue
            later = [s for s in by_step if s > 0]
            final_step = max(later) if later else None
            match = EVAL_REWARD.fullmatch(metric)
            env = match.group(1) if match else None
            if env is not None:
                recorded, configured = self.sizes.get(env, (None, None)), configured_size(resolved, env)
                examples, rollouts = recorded[0] or configured[0], recorded[1] or configured[1]
            else:
                examples, rollouts = validation_examples(resolved), None
            failures = self.failures.get(metric, {})
            out.append(Evaluation(metric, env, by_step.get(0), 0 if 0 in by_step else None,
                                  by_step[final_step] if final_step is not None else None, final_step,
                                  examples, rollouts, failures.get(0),
                                  failures.get(final_step) if final_step is not None else None))
        return out


def configured_size(resolved: Mapping[str, Any] | None, env: str) -> tuple[int | None, int | None]:
    """The examples (None: all) and rollouts per example an RL config's `[eval]` gives the environment named `env`
    (an `[[eval.env]]`'s own numbers, else the section's)."""
    section = resolved.get("eval") if resolved else None
    if not isinstance(section, Mapping):
        return None, None
    examples, rollouts = section.get("num_examples"), section.get("rollouts_per_example")
    for entry in section.get("env") or ():
        if isinstance(entry, Mapping) and env in (entry.get("name"), str(entry.get("id", "")).rsplit("/", 1)[-1]):
            examples = entry["num_examples"] if entry.get("num_examples") is not None else examples
            rollouts = entry.get("rollouts_per_example") or rollouts
            break
    return (examples if isinstance(examples, int) and examples > 0 else None,
            rollouts if isinstance(rollouts, int) else None)


def validation_examples(resolved: Mapping[str, Any] | None) -> int | None:
    """The validation examples an SFT config's `[val]` takes (None: all of them)."""
    section = resolved.get("val") if resolved else None
    n = section.get("num_examples") if isinstance(section, Mapping) else None
    return n if isinstance(n, int) and n > 0 else None


def read_evaluations(events: Iterable[Event], resolved: Mapping[str, Any] | None = None) -> list[Evaluation]:
    """The evaluations in a run's events (its final timeline), sizes from the events or its `resolved` config."""
    fold = EvaluationFold()
    for event in final_timeline(events):
        if event.kind != RESTART:  # final_timeline has rewound already
            fold.add(event.kind, event.step, event.data)
    return fold.evaluations(resolved)


def run_evaluations(run: Run, events: Iterable[Event] | None = None) -> list[Evaluation]:
    """The run's evaluations, from its event log (or `events`, read from it already) and resolved.json."""
    try:
        resolved = json.loads(run.resolved_path.read_text())
    except (OSError, ValueError):
        resolved = None
    return read_evaluations(run.event_log().events() if events is None else events,
                            resolved if isinstance(resolved, dict) else None)
