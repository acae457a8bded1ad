"""Evaluations side by side (`prime eval compare`): did it get better, and by how much?

Each evaluation is an output folder of `prime eval run` (results.jsonl + metadata.json) or the run id that wrote it.
Examples are matched by (task, example_id), only those every evaluation has; each example's reward is the mean over
its rollouts. For each evaluation after the first: the difference of mean rewards to the first, with a paired
bootstrap confidence interval (the examples resampled with replacement, the per-example differences averaged, the
percentiles of those means; a seeded RNG, so the same files give the same interval), and the examples whose reward
changed most.

Evaluations of different environments are refused, and so are evaluations whose matched examples differ in what they
ask (the user's side of the prompt; a system prompt may differ, that is what some comparisons are about).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prime_lab.runs.display import one_line
from prime_lab.runs.registry import RunError, RunRegistry

RESAMPLES = 10_000
CONFIDENCE = 0.95
SEED = 0
TOP_CHANGED = 5
EXCERPT = 60  # characters of a prompt shown beside a changed example

ExampleKey = tuple[str, str]  # (task, example_id)


class ComparisonError(ValueError):
    """The evaluations cannot be compared (unknown, unreadable, of different environments or examples)."""


@dataclass(frozen=True)
class Evaluation:
    """One evaluation's per-example rewards and what it evaluated."""

    source: str  # what the user gave: a run id or a folder
    path: Path
    run_id: str | None
    env_id: str
    env_args: dict[str, Any]
    model: str  # the base model
    policy: str | None  # the trained policy evaluated (`<run> adapters/step_N`), None for the model itself
    system_prompt: str | None  # where the replaced system prompt came from, None for the environment's own
    rollouts: int
    errors: int
    rewards: dict[ExampleKey, float]  # the mean over each example's rollouts
    asks: dict[ExampleKey, str]  # each example's prompt without its system message (the examples' identity)
    excerpts: dict[ExampleKey, str]  # each example's last user message, on one line

    @property
    def label(self) -> str:
        """How a person tells evaluations apart: the model, the policy on it, the system prompt."""
        parts = [self.model + (f" + {self.policy}" if self.policy else "")]
        if self.system_prompt:
            parts.append(f"prompt {self.system_prompt}")
        return ", ".join(parts)


@dataclass(frozen=True)
class EvaluationSummary:
    letter: str  # A, B, C ... (the per-example table's columns)
    label: str
    source: str
    run_id: str | None
    path: str
    mean: float  # over the compared examples
    examples: int  # the examples it has
    dropped: int  # of those, the ones some other evaluation lacks
    rollouts: int
    errors: int


@dataclass(frozen=True)
class ExampleChange:
    example: str
    before: float
    after: float
    prompt: str

    @property
    def delta(self) -> float:
        return self.after - self.before


@dataclass(frozen=True)
class Difference:
    """One evaluation against the first: mean(after) - mean(before) over the compared examples, its interval."""

    letter: str
    mean: float
    low: float
    high: float
    changed: list[ExampleChange]  # the largest per-example changes, largest first

    @property
    def significant(self) -> bool:
        """Whether the interval leaves 0 out."""
        return self.low > 0.0 or self.high < 0.0


@dataclass(frozen=True)
class ExampleRow:
    example: str
    rewards: list[float]  # one per evaluation, in order
    prompt: str


@dataclass(frozen=True)
class Comparison:
    env_id: str
    evaluations: list[EvaluationSummary]
    examples: list[ExampleRow]
    differences: list[Difference]  # for evaluations[1:], against evaluations[0]
    resamples: int
    confidence: float
    seed: int
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for difference, raw in zip(self.differences, data["differences"], strict=True):
            raw["significant"] = difference.significant
            for change, row in zip(difference.changed, raw["changed"], strict=True):
                row["delta"] = change.delta
        return data


# Statistics -------------------------------------------------------------------------------------------------------

def paired_bootstrap_ci(differences: Sequence[float], *, resamples: int = RESAMPLES, seed: int = SEED,
                        confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The percentile bootstrap interval of the mean of paired `differences` (one per example): `resamples` times,
    draw as many examples as there are with replacement and average their differences; the interval holds the
    central `confidence` of those means."""
    import numpy as np

    values = np.asarray(differences, dtype=float)
    if values.size == 0:
        raise ValueError("no paired differences to resample")
    if resamples < 1 or not 0.0 < confidence < 1.0:
        raise ValueError("resamples must be at least 1 and confidence within (0, 1)")
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    chunk = max(1, 4_000_000 // values.size)  # resamples drawn at once: at most ~32 MB of indices
    for start in range(0, resamples, chunk):
        stop = min(resamples, start + chunk)
        picks = rng.integers(0, values.size, size=(stop - start, values.size))
        means[start:stop] = values[picks].mean(axis=1)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return float(low), float(high)


def largest_changes(keys: Sequence[ExampleKey], before: dict[ExampleKey, float], after: dict[ExampleKey, float],
                    excerpts: dict[ExampleKey, str], names: dict[ExampleKey, str],
                    top: int = TOP_CHANGED) -> list[ExampleChange]:
    """The `top` examples whose reward moved most (absolute), ties in example order; unchanged ones never."""
    moved = [k for k in keys if abs(after[k] - before[k]) > 1e-12]
    moved.sort(key=lambda k: -abs(after[k] - before[k]))
    return [ExampleChange(names[k], before[k], after[k], excerpts.get(k, "")) for k in moved[:top]]


def compare(evaluations: Sequence[Evaluation], *, resamples: int = RESAMPLES, seed: int = SEED,
            confidence: float = CONFIDENCE, top: int = TOP_CHANGED) -> Comparison:
    """The comparison of `evaluations` (two or more) against the first. Raises ComparisonError for evaluations of
    different environments, with no example in common, or whose common examples ask different things."""
    if len(evaluations) < 2:
        raise ComparisonError("compare needs two evaluations or more")
    first = evaluations[0]
    envs = {e.env_id for e in evaluations}
    if len(envs) > 1:
        listed = ", ".join(f"{e.source} ({e.env_id})" for e in evaluations)
        raise ComparisonError(f"these evaluations are of different environments: {listed}; compare evaluations of "
                              "one environment")
    shared = [k for k in _ordered(first.rewards) if all(k in e.rewards for e in evaluations[1:])]
    if not shared:
        raise ComparisonError("these evaluations have no example in common (matched by example_id): evaluate the "
                              "same examples, e.g. the same -n and --seed")
    for other in evaluations[1:]:
        differ = [k for k in shared if first.asks.get(k) != other.asks.get(k)]
        if differ:
            key = differ[0]
            raise ComparisonError(
                f"{len(differ)} of the {len(shared)} examples {first.source} and {other.source} share by example_id "
                f"ask different things (example {key[1]}: {one_line(first.asks.get(key, ''), 80)!r} vs "
                f"{one_line(other.asks.get(key, ''), 80)!r}): they are not the same examples (different "
                "environment args?)")
    names = _names(shared)
    notes: list[str] = []
    if any(e.env_args != first.env_args for e in evaluations[1:]):
        notes.append("the evaluations were run with different environment args: "
                     + "; ".join(f"{e.source}: {json.dumps(e.env_args)}" for e in evaluations))
    summaries = []
    for i, e in enumerate(evaluations):
        mean = sum(e.rewards[k] for k in shared) / len(shared)
        summaries.append(EvaluationSummary(_letter(i), e.label, e.source, e.run_id, str(e.path), mean,
                                           len(e.rewards), len(e.rewards) - len(shared), e.rollouts, e.errors))
    dropped = [s for s in summaries if s.dropped]
    if dropped:
        notes.append(f"compared the {len(shared)} examples every evaluation has; left out: "
                     + ", ".join(f"{s.dropped} of {s.letter}'s {s.examples}" for s in dropped))
    erred = [s for s in summaries if s.errors]
    if erred:
        notes.append("rollouts that failed count as reward 0: " + ", ".join(f"{s.letter} {s.errors} of {s.rollouts}"
                                                                              for s in erred))
    differences = []
    for i, other in enumerate(evaluations[1:], start=1):
        deltas = [other.rewards[k] - first.rewards[k] for k in shared]
        low, high = paired_bootstrap_ci(deltas, resamples=resamples, seed=seed, confidence=confidence)
        differences.append(Difference(_letter(i), sum(deltas) / len(deltas), low, high,
                                      largest_changes(shared, first.rewards, other.rewards, first.excerpts, names,
                                                      top)))
    rows = [ExampleRow(names[k], [e.rewards[k] for e in evaluations], first.excerpts.get(k, "")) for k in shared]
    return Comparison(first.env_id, summaries, rows, differences, resamples, confidence, seed, notes)


def compare_evaluations(sources: Sequence[str | Path], *, registry: RunRegistry | None = None,
                        resamples: int = RESAMPLES, seed: int = SEED, confidence: float = CONFIDENCE,
                        top: int = TOP_CHANGED) -> Comparison:
    """Load each evaluation (a run id or an output folder) and compare them against the first."""
    return compare([load_evaluation(s, registry=registry) for s in sources], resamples=resamples, seed=seed,
                   confidence=confidence, top=top)


# Reading an evaluation --------------------------------------------------------------------------------------------

def evaluation_folder(source: str | Path, registry: RunRegistry | None = None) -> tuple[Path, str | None]:
    """The output folder of `source` (a folder holding results.jsonl, or an evaluation's run id), and the run's
    id when there is one."""
    path = Path(source).expanduser()
    if path.is_dir():
        if not (path / "results.jsonl").is_file():
            raise ComparisonError(f"{source}: no results.jsonl in this folder (an evaluation's output folder has "
                                  "results.jsonl and metadata.json)")
        return path.resolve(), _run_id_of(path)
    if "/" in str(source):
        raise ComparisonError(f"{source}: no such folder")
    try:
        run = (registry or RunRegistry()).get(str(source))
    except RunError as exc:
        raise ComparisonError(f"{source}: neither an evaluation's folder nor a run id ({exc})") from None
    status = run.read_status()
    if status.get("kind") != "eval":
        raise ComparisonError(f"{source}: run {run.id} is a {status.get('kind')} run, not an evaluation "
                              f"(evaluate it with `prime eval run ENV --adapter {run.id}`)"
                              if status.get("kind") in ("rl", "sft") else
                              f"{source}: run {run.id} is a {status.get('kind')} run, not an evaluation")
    if not status.get("output_dir") or not (Path(status["output_dir"]) / "results.jsonl").is_file():
        raise ComparisonError(f"{source}: evaluation {run.id} has no results yet ({status.get('state')})")
    return Path(status["output_dir"]), run.id


def _run_id_of(path: Path) -> str | None:
    try:
        metadata = json.loads((path / "metadata.json").read_text())
    except (OSError, ValueError):
        return None
    run_id = metadata.get("run_id") if isinstance(metadata, dict) else None
    return run_id if isinstance(run_id, str) else None


def load_evaluation(source: str | Path, registry: RunRegistry | None = None) -> Evaluation:
    """One evaluation's per-example mean rewards and its description, from its results.jsonl and metadata.json."""
    path, run_id = evaluation_folder(source, registry)
    try:
        metadata = json.loads((path / "metadata.json").read_text())
    except FileNotFoundError:
        raise ComparisonError(f"{source}: no metadata.json in {path} (the evaluation has not finished)") from None
    except (OSError, ValueError) as exc:
        raise ComparisonError(f"{source}: cannot read {path / 'metadata.json'}: {exc}") from None
    by_example: dict[ExampleKey, list[float]] = defaultdict(list)
    asks: dict[ExampleKey, str] = {}
    excerpts: dict[ExampleKey, str] = {}
    rollouts = errors = 0
    for line in (path / "results.jsonl").read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a line cut short by a crash
        reward = row.get("reward") if isinstance(row, dict) else None
        if not isinstance(reward, int | float) or isinstance(reward, bool) or math.isnan(reward):
            continue
        key = (str(row.get("task") or ""), str(row.get("example_id")))
        by_example[key].append(float(reward))
        rollouts += 1
        errors += bool(row.get("error"))
        if key not in asks:
            asks[key] = json.dumps(_without_system(row.get("prompt")), sort_keys=True)
            excerpts[key] = one_line(_last_user(row.get("prompt")), EXCERPT)
    if not by_example:
        raise ComparisonError(f"{source}: {path / 'results.jsonl'} holds no scored rollout")
    policy = metadata.get("policy") if isinstance(metadata.get("policy"), dict) else None
    prompt = metadata.get("system_prompt") if isinstance(metadata.get("system_prompt"), dict) else None
    return Evaluation(
        source=str(source), path=path, run_id=run_id or metadata.get("run_id"), env_id=str(metadata.get("env_id")),
        env_args=dict(metadata.get("env_args") or {}),
        model=_model_name(str(metadata.get("base_model") or metadata.get("model") or "?")),
        policy=f"{policy['run_id']} {policy['source']}" if policy else None,
        system_prompt=(f"of {prompt['gepa_run']}" if prompt.get("gepa_run") else Path(str(prompt["source"])).name)
        if prompt else None,
        rollouts=rollouts, errors=errors,
        rewards={k: sum(v) / len(v) for k, v in by_example.items()}, asks=asks, excerpts=excerpts)


def _model_name(model: str) -> str:
    """A model folder by its name (the rest of its path says little beside other evaluations)."""
    return Path(model).name if Path(model).is_absolute() else model


def _without_system(prompt: Any) -> Any:
    if isinstance(prompt, list):
        return [m for m in prompt if not (isinstance(m, dict) and m.get("role") == "system")]
    return prompt


def _last_user(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    users = [m for m in prompt or [] if isinstance(m, dict) and m.get("role") == "user"]
    content = users[-1].get("content") if users else ""
    if isinstance(content, list):  # content parts
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")


def _ordered(rewards: dict[ExampleKey, float]) -> list[ExampleKey]:
    """Examples by task, then by id (numerically where the ids are numbers)."""
    def order(key: ExampleKey) -> tuple[str, int, int, str]:
        task, example = key
        return (task, 0, int(example), "") if example.lstrip("-").isdigit() else (task, 1, 0, example)

    return sorted(rewards, key=order)


def _names(keys: Sequence[ExampleKey]) -> dict[ExampleKey, str]:
    """An example's name: its id, prefixed by its task where the evaluation has several tasks."""
    several = len({task for task, _ in keys}) > 1
    return {k: f"{k[0]}/{k[1]}" if several else k[1] for k in keys}


def _letter(index: int) -> str:
    return chr(ord("A") + index) if index < 26 else f"E{index + 1}"
