"""The search state: every candidate with its lineage and validation scores, every proposal (accepted or not)
with its texts and minibatch scores, the budget spent, the RNG and the minibatch epoch. Saved whole (atomic rename)
after every round of proposals; a run resumes from it without re-spending."""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prime_lab.gepa.adapter import Candidate
from prime_lab.runs.atomic import write_json_atomic

STATE_VERSION = 1  # a state saved before `proposals` were kept loads with none
_NOT_KEPT = frozenset({"seconds", "metric_calls", "best_idx", "best_score"})


@dataclass
class GepaState:
    candidates: list[Candidate] = field(default_factory=list)
    parents: list[list[int]] = field(default_factory=list)
    origins: list[str] = field(default_factory=list)  # seed | reflection | merge
    val_scores: list[list[float]] = field(default_factory=list)
    found_at_calls: list[int] = field(default_factory=list)
    found_at_iteration: list[int] = field(default_factory=list)
    proposals: list[dict[str, Any]] = field(default_factory=list)  # one per iteration: `add_proposal`
    iteration: int = 0
    metric_calls: int = 0
    num_val: int = 0  # validation rows in use (fewer than given only when the budget is smaller)
    rng_state: Any = None
    epoch: int = 0
    epoch_order: list[int] = field(default_factory=list)
    epoch_pos: int = 0
    merges_due: int = 0
    merges_done: int = 0
    finished: bool = False
    stop_reason: str | None = None
    version: int = STATE_VERSION

    # Scores -----------------------------------------------------------------------------------------------
    def average(self, idx: int) -> float:
        scores = self.val_scores[idx]
        return sum(scores) / len(scores) if scores else 0.0

    @property
    def best_idx(self) -> int:
        """Highest average validation score; the earliest candidate wins a tie."""
        return max(range(len(self.candidates)), key=lambda i: (self.average(i), -i))

    def add_candidate(self, candidate: Candidate, parents: list[int], origin: str, val_scores: list[float]) -> int:
        self.candidates.append(dict(candidate))
        self.parents.append(list(parents))
        self.origins.append(origin)
        self.val_scores.append([float(s) for s in val_scores])
        self.found_at_calls.append(self.metric_calls)
        self.found_at_iteration.append(self.iteration)
        return len(self.candidates) - 1

    def add_proposal(self, record: dict[str, Any]) -> None:
        """Keep an iteration's record (engine.IterationRecord): what was proposed, from which parent, its minibatch
        scores and verdict. Timings and the running totals are left out, so the same search gives the same state."""
        self.proposals.append({k: v for k, v in record.items() if k not in _NOT_KEPT})

    @property
    def num_proposed(self) -> int:
        """Iterations that proposed a text (all but those skipped on a perfect minibatch)."""
        return sum("texts" in p for p in self.proposals)

    @property
    def num_accepted(self) -> int:
        """Proposals that beat their parent on the minibatch and were validated: candidates now."""
        return sum(bool(p.get("accepted")) for p in self.proposals)

    def ancestors(self, idx: int) -> set[int]:
        seen: set[int] = set()
        stack = list(self.parents[idx])
        while stack:
            p = stack.pop()
            if p not in seen:
                seen.add(p)
                stack.extend(self.parents[p])
        return seen

    # RNG ----------------------------------------------------------------------------------------------------
    def save_rng(self, rng: random.Random) -> None:
        version, internal, gauss = rng.getstate()
        self.rng_state = [version, list(internal), gauss]

    def restore_rng(self, rng: random.Random) -> None:
        version, internal, gauss = self.rng_state
        rng.setstate((version, tuple(internal), gauss))

    # Files --------------------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GepaState:
        if data.get("version") != STATE_VERSION:
            raise ValueError(f"unsupported GEPA state version {data.get('version')!r}")
        return cls(**data)

    def save(self, path: Path) -> None:
        write_json_atomic(path, self.to_json(), indent=1, durable=True)

    @classmethod
    def load(cls, path: Path) -> GepaState:
        return cls.from_json(json.loads(path.read_text()))

