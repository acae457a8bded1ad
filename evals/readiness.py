"""Is this environment ready for RL on this model? One verdict per evaluation, from its results files.

The verdict is one of three states:
- `ready`: an evaluation of the base model with the environment's own system prompt, every check passed;
- `not ready`: the same, with at least one check a problem;
- `not a baseline`: the evaluated policy is not the base model as the environment prompts it (a trained run's
  adapter, weights or model, or a system prompt other than the environment's own); the verdict says what it is
  instead and how to evaluate the baseline. Its checks are still listed: they describe a start from that policy.

Each check is a pass or a problem, one sentence each (the reference guide's pre-training check: mean reward above 0
and below 0.8, rewards that vary within an example; and no failed rollouts, few completions cut at max_tokens).
Where no rollout got any reward, the verdict adds what to try: partial credit in the reward, a format hint in the
system prompt (the parser's own, where it has one), more tokens (with how many completions max_tokens cut).

`assess(rows, metadata)` judges what `evals.evaluation.run_evaluation` writes (results.jsonl rows, metadata.json);
`read_readiness(folder)` reads an evaluation's output folder and judges it.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from prime_lab.envs.environment import TIMED_OUT

READY_BELOW = 0.8  # a mean reward at or above this leaves little to learn
ZERO_VARIANCE_LIMIT = 0.5  # a share of examples with one reward on every rollout at or above this is a problem
TRUNCATED_LIMIT = 0.25  # a share of completions cut at max_tokens at or above this is a problem

State = Literal["ready", "not ready", "not a baseline"]
HEADLINES: dict[str, str] = {"ready": "ready for RL", "not ready": "not ready for RL",
                             "not a baseline": "not a baseline"}


class ReadinessError(ValueError):
    """An output folder without the results a verdict needs (no results.jsonl or metadata.json yet)."""


@dataclass(frozen=True)
class RewardStats:
    """The rewards of an evaluation's rollouts, per example and in all."""

    avg_reward: float
    mean_example_std: float  # the mean over examples of the std of their rollouts' rewards
    zero_variance_share: float  # the share of examples whose rollouts all got one reward
    examples: int
    rollouts: int
    best_reward: float | None  # None without rollouts
    errors: int  # rollouts that failed (their reward counts as 0): the one count of failures everywhere
    truncated: int | None  # completions cut at max_tokens (None: the rows do not say)
    error_sources: dict[str, int] = field(default_factory=dict)  # the failed ones by the side that failed (SIDES)

    @classmethod
    def from_rows(cls, rows: Sequence[dict[str, Any]]) -> RewardStats:
        """The statistics of results.jsonl's rows (rows without a numeric reward left out)."""
        by_example: dict[str, list[float]] = defaultdict(list)
        scored = [r for r in rows if _reward(r) is not None]
        for row in scored:
            by_example[f"{row.get('task')}/{row.get('example_id')}"].append(_reward(row) or 0.0)
        rewards = [_reward(r) or 0.0 for r in scored]
        stds = [_std(v) for v in by_example.values()]
        known = [r["is_truncated"] for r in scored if isinstance(r.get("is_truncated"), bool)]
        return cls(avg_reward=sum(rewards) / len(rewards) if rewards else 0.0,
                   mean_example_std=sum(stds) / len(stds) if stds else 0.0,
                   zero_variance_share=sum(s < 1e-9 for s in stds) / len(stds) if stds else 0.0,
                   examples=len(by_example), rollouts=len(scored), best_reward=max(rewards) if rewards else None,
                   errors=sum(bool(r.get("error")) for r in scored),
                   truncated=sum(known) if known or not scored else None,
                   error_sources=dict(Counter(side for r in scored if (side := error_side(r)) is not None)))

    def failed_where(self) -> str:
        """Where the failed rollouts failed: "2 in the scorer: a reward function raised" (one side), "1 at the model
        endpoint, 1 in the environment" (several), "" where the rows do not say."""
        sides = sorted(self.error_sources.items(), key=lambda item: list(SIDES).index(item[0]))
        if len(sides) == 1 and sides[0][1] == self.errors:
            side, count = sides[0]
            return f"{count} {SIDES[side]}" + (f": {WHY[side]}" if WHY[side] else "")
        return ", ".join(f"{count} {SIDES[side]}" for side, count in sides)


# The side a rollout failed on, in words: where (`failed_where`), and what that means where it is the only one.
SIDES = {"model": "at the model endpoint", "environment": "in the environment", "scorer": "in the scorer",
         "timeout": "past the time limit"}
WHY = {"model": "", "environment": "its own code or server raised", "scorer": "a reward function raised",
       "timeout": ""}


def error_side(row: dict[str, Any]) -> str | None:
    """The side a results.jsonl row failed on (a key of SIDES; None: it did not fail, or does not say): past the
    time limit, else its `error_source`; a row written before that field that failed but did not stop with an error
    was failed by its scorer (its rollout had finished)."""
    error = row.get("error")
    if not error:
        return None
    if str(error).startswith(TIMED_OUT):
        return "timeout"
    source = row.get("error_source")
    if source in SIDES:
        return str(source)
    return "scorer" if "error_source" not in row and row.get("stop_condition") != "error" else None


@dataclass(frozen=True)
class Check:
    """One reason of a verdict: a pass or a problem, never both."""

    passed: bool
    text: str

    @property
    def label(self) -> str:
        return "pass" if self.passed else "problem"


@dataclass
class Readiness:
    """One evaluation's verdict for RL: its state, what was evaluated, each check, and what to try."""

    state: State
    subject: str  # what was evaluated, e.g. "the base model smollm2-135m with the environment's system prompt"
    checks: list[Check]
    to_try: list[str] = field(default_factory=list)  # where no rollout got any reward
    instead: str | None = None  # for `not a baseline`: how to evaluate the baseline

    @property
    def headline(self) -> str:
        return HEADLINES[self.state]

    @property
    def passes(self) -> list[str]:
        return [c.text for c in self.checks if c.passed]

    @property
    def problems(self) -> list[str]:
        return [c.text for c in self.checks if not c.passed]

    def lines(self) -> list[str]:
        """The verdict as a person reads it: the state and what was evaluated, then a check per line (`pass` or
        `problem`), then the things to try."""
        lines = [f"verdict: {self.headline} ({self.subject})"]
        if self.instead:
            lines.append(f"  {self.instead}")
        lines += [f"  {c.label:<8} {c.text}" for c in self.checks]
        if self.to_try:
            lines.append("to try, as no rollout got any reward:")
            for item in self.to_try:
                first, *rest = item.splitlines()
                lines += [f"  - {first}", *(f"      {line}" for line in rest)]
        return lines

    def to_dict(self) -> dict[str, Any]:
        """The verdict for machines (`-o json`, metadata.json's `readiness`)."""
        return {"state": self.state, "headline": self.headline, "subject": self.subject, "instead": self.instead,
                "checks": [asdict(c) | {"label": c.label} for c in self.checks], "passes": self.passes,
                "problems": self.problems, "to_try": self.to_try}


def assess(rows: Sequence[dict[str, Any]], metadata: dict[str, Any]) -> Readiness:
    """The verdict on an evaluation: its results.jsonl rows and its metadata.json (as `run_evaluation` writes
    them: `model`, `base_model`, `env_id`, `rollouts_per_example`, `sampling_args`, `policy`, `system_prompt`,
    `env_system_prompt`, `format_hint`)."""
    stats = RewardStats.from_rows(rows)
    subject, instead = _subject(metadata)
    checks = _checks(stats, int(metadata.get("rollouts_per_example") or 1), _max_tokens(metadata))
    to_try = _to_try(stats, rows, metadata) if stats.best_reward is not None and stats.best_reward <= 0 else []
    state: State = "not a baseline" if instead else ("ready" if all(c.passed for c in checks) else "not ready")
    return Readiness(state, subject, checks, to_try, instead)


def read_readiness(folder: Path) -> Readiness:
    """The verdict on the evaluation in `folder` (its results.jsonl and metadata.json); ReadinessError where they
    are not there yet."""
    try:
        metadata = json.loads((folder / "metadata.json").read_text())
    except FileNotFoundError:
        raise ReadinessError(f"no metadata.json in {folder}: the evaluation has not finished") from None
    except (OSError, ValueError) as exc:
        raise ReadinessError(f"cannot read {folder / 'metadata.json'}: {exc}") from None
    try:
        lines = (folder / "results.jsonl").read_text().splitlines()
    except OSError as exc:
        raise ReadinessError(f"cannot read {folder / 'results.jsonl'}: {exc}") from None
    rows = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a line cut short by a crash
        if isinstance(row, dict):
            rows.append(row)
    if not isinstance(metadata, dict):
        raise ReadinessError(f"{folder / 'metadata.json'} is not an object")
    return assess(rows, metadata)


# what was evaluated ------------------------------------------------------------------------------------------------
def _subject(metadata: dict[str, Any]) -> tuple[str, str | None]:
    """What the evaluation evaluated, and (for one that is not a baseline) how to evaluate the baseline."""
    given = str(metadata.get("base_model") or metadata.get("model") or "?")
    model = _model_name(given)
    policy = metadata.get("policy") if isinstance(metadata.get("policy"), dict) else None
    prompt = metadata.get("system_prompt") if isinstance(metadata.get("system_prompt"), dict) else None
    own = metadata.get("env_system_prompt")
    own_prompt = prompt is not None and isinstance(own, str) and str(prompt.get("text", "")).strip() == own.strip()
    if policy is None and (prompt is None or own_prompt):
        said = " (given as a file)" if own_prompt else ""
        return f"the base model {model} with the environment's system prompt{said}", None
    if policy is not None:
        kind = str(policy.get("run_kind") or "").upper() or "training"
        subject = (f"{policy.get('run_id')}'s {policy.get('source') or policy.get('kind') or 'policy'}, trained by "
                   f"{kind} on {model}")
    else:
        subject = model
    if prompt is not None and not own_prompt:
        where = (f"the best prompt of GEPA run {prompt['gepa_run']}" if prompt.get("gepa_run") else
                 f"the system prompt in {prompt.get('source')}")
        subject += f"{',' if policy is not None else ''} with {where} instead of the environment's"
    subject = "an evaluation of " + subject
    env_id = str(metadata.get("env_id") or "ENV")
    instead = (f"for the verdict on RL, evaluate the base model with the environment's own prompt: `prime eval run "
               f"{env_id} -m {given}` (with the same -a, -n and -r); the checks below are of this policy")
    return subject, instead


def _model_name(model: str) -> str:
    return Path(model).name if Path(model).is_absolute() else model


# the checks --------------------------------------------------------------------------------------------------------
def _checks(stats: RewardStats, rollouts_per_example: int, max_tokens: int | None) -> list[Check]:
    if not stats.rollouts:
        return [Check(False, "no rollout was scored: there is nothing to judge")]
    avg, checks = stats.avg_reward, []
    nothing = stats.best_reward is not None and stats.best_reward <= 0  # no rollout got any reward
    if nothing:
        checks.append(Check(False, f"mean reward {avg:.3f}: no rollout got any reward, so RL has nothing to "
                                   "reinforce"))
    elif avg <= 0:
        checks.append(Check(False, f"mean reward {avg:.3f} is not above 0: RL has little to reinforce"))
    elif avg >= READY_BELOW:
        checks.append(Check(False, f"mean reward {avg:.3f} is {READY_BELOW} or more: the task is too easy for this "
                                   "model, little is left to learn (make it harder, or take a smaller model)"))
    else:
        checks.append(Check(True, f"mean reward {avg:.3f} is above 0 and below {READY_BELOW}: there is room to "
                                  "learn"))
    if nothing:
        pass  # no reward anywhere: that rewards do not vary within an example adds nothing to say
    elif rollouts_per_example < 2:
        checks.append(Check(False, "one rollout per example: whether rewards vary within an example is not "
                                   "measured (evaluate with -r 2 or more)"))
    elif stats.zero_variance_share >= ZERO_VARIANCE_LIMIT:
        checks.append(Check(False, f"{stats.zero_variance_share:.0%} of examples got one reward on every rollout: "
                                   "their group advantages are zero, so RL learns nothing from them (raise the "
                                   "temperature, or give partial credit)"))
    else:
        checks.append(Check(True, f"rewards vary within examples (mean per-example std "
                                  f"{stats.mean_example_std:.3f}; {stats.zero_variance_share:.0%} of examples got "
                                  "one reward on every rollout)"))
    if stats.errors:
        where = stats.failed_where()
        checks.append(Check(False, f"{stats.errors} of {stats.rollouts} rollouts failed"
                                   + (f" ({where})" if where else "") + ", their reward counted as 0 (see their "
                                   "errors with `prime eval samples`)"))
    if stats.truncated is not None and stats.truncated / stats.rollouts >= TRUNCATED_LIMIT:
        limit = f" ({max_tokens})" if max_tokens is not None else ""
        checks.append(Check(False, f"{stats.truncated} of {stats.rollouts} completions were cut at max_tokens"
                                   f"{limit}: raise it (-t)"))
    return checks


def _max_tokens(metadata: dict[str, Any]) -> int | None:
    sampling = metadata.get("sampling_args")
    value = sampling.get("max_tokens") if isinstance(sampling, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# what to try where no rollout got any reward -------------------------------------------------------------------
def _to_try(stats: RewardStats, rows: Sequence[dict[str, Any]], metadata: dict[str, Any]) -> list[str]:
    items = ["give partial credit in the reward: score part of the way (the right format, a near answer, a "
             "partial match), so that RL has something to reinforce before any answer is fully right"]
    hint = str(metadata.get("format_hint") or "").strip()
    used = _system_prompt_of(rows)
    if hint:
        tags = re.findall(r"<(\w+)>", hint)
        if tags and used and all(f"<{t}>" in used for t in tags):
            items.append("show the format in the system prompt with a whole worked answer: it already names the "
                         f"parser's tags ({', '.join(f'<{t}>' for t in dict.fromkeys(tags))}), and still no "
                         "completion scored (read them with `prime eval samples`)")
        else:
            items.append(f"add a format hint to the system prompt (try it with --system-prompt-file FILE); the "
                         f"environment's parser expects:\n{hint}")
    else:
        items.append("add a format hint to the system prompt: say exactly how the answer must be written (the "
                     "environment's parser gives no hint of its own; try it with --system-prompt-file FILE)")
    max_tokens = _max_tokens(metadata)
    was = f"it was {max_tokens}" if max_tokens is not None else "what it was is not recorded"
    if stats.truncated is None:
        cut = "how many completions it cut is not recorded"
    else:
        cut = f"{stats.truncated} of {stats.rollouts} completions were cut by it"
    if stats.truncated == 0:
        items.append(f"raise max_tokens if answers need more room ({was}; {cut})")
    else:
        more = f", e.g. -t {max_tokens * 2}" if max_tokens is not None and stats.truncated else ""
        items.append(f"raise max_tokens ({was}; {cut}){more}")
    items.append("or start from a stronger model (-m)")
    return items


def _system_prompt_of(rows: Sequence[dict[str, Any]]) -> str:
    """The system message the first row's prompt opens with ('' without one)."""
    prompt = rows[0].get("prompt") if rows else None
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict) and prompt[0].get("role") == "system":
        return str(prompt[0].get("content") or "")
    return ""


def _reward(row: dict[str, Any]) -> float | None:
    value = row.get("reward")
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return None
    return float(value)


def _std(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
