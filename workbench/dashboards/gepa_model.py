"""A GEPA run as its dashboard sees it: budget, candidates with their validation scores and parents, the Pareto
frontier, the last iterations' verdicts, and the best validation score over metric calls."""

from __future__ import annotations

import difflib
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from prime_lab.workbench.dashboards.event_folds import EventFold, RawEvent, is_number
from prime_lab.workbench.dashboards.series import DownsampledSeries

MAX_ITERATIONS = 200


@dataclass
class CandidateInfo:
    idx: int
    parents: list[int]
    origin: str
    texts: dict[str, str]
    val_scores: list[float]
    score: float
    iteration: int
    metric_calls: int

    @property
    def text(self) -> str:
        """All components, one after another (a single system prompt is the common case)."""
        if len(self.texts) == 1:
            return next(iter(self.texts.values()))
        return "\n\n".join(f"[{name}]\n{text}" for name, text in sorted(self.texts.items()))


@dataclass
class Frontier:
    best_idx: int = 0
    best_score: float = 0.0
    frequencies: dict[int, int] = field(default_factory=dict)  # candidate -> validation instances it is best on
    instance_best: list[float] = field(default_factory=list)
    instance_fronts: list[list[int]] = field(default_factory=list)


class GepaRunModel(EventFold):
    def __init__(self) -> None:
        super().__init__()
        self.used = 0
        self.max_calls: int | None = None
        self.candidates: dict[int, CandidateInfo] = {}
        self.frontier = Frontier()
        self.frontier_updates = 0
        self.iterations: deque[dict[str, Any]] = deque(maxlen=MAX_ITERATIONS)
        self.iteration = 0
        self.best_over_calls = DownsampledSeries(512)

    def fold(self, kind: str, step: Any, data: dict[str, Any], raw: RawEvent) -> None:
        if kind == "gepa.budget":
            self.used = int(data.get("used", self.used))
            if is_number(data.get("max")):
                self.max_calls = int(data["max"])
        elif kind == "gepa.candidate" and isinstance(data.get("idx"), int):
            scores = [float(s) for s in data.get("val_scores") or [] if is_number(s)]
            texts = data.get("texts") if isinstance(data.get("texts"), dict) else {}
            self.candidates[data["idx"]] = CandidateInfo(
                idx=data["idx"], parents=[int(p) for p in data.get("parents") or []], origin=str(data.get("origin")),
                texts={str(k): str(v) for k, v in (texts or {}).items()}, val_scores=scores,
                score=float(data.get("score") or 0.0), iteration=int(data.get("iteration") or 0),
                metric_calls=int(data.get("metric_calls") or 0))
        elif kind == "gepa.frontier":
            self.frontier = Frontier(
                best_idx=int(data.get("best_idx") or 0), best_score=float(data.get("best_score") or 0.0),
                frequencies={int(k): int(v) for k, v in (data.get("frequencies") or {}).items()},
                instance_best=[float(s) for s in data.get("instance_best") or []],
                instance_fronts=[[int(c) for c in f] for f in data.get("instance_fronts") or []])
            self.frontier_updates += 1
            self.best_over_calls.append(float(self.used), self.frontier.best_score)
        elif kind == "gepa.iteration":
            self.iterations.append(data)
            self.iteration = max(self.iteration, int(data.get("iteration") or 0))

    # Views ------------------------------------------------------------------------------------------------
    def on_front(self) -> set[int]:
        """Candidates that are best on at least one validation instance (the highlighted frontier)."""
        return {idx for idx, n in self.frontier.frequencies.items() if n > 0}

    def diff(self, idx: int, against: int) -> list[str]:
        """Unified diff of candidate `idx`'s prompt against candidate `against`'s."""
        a, b = self.candidates.get(against), self.candidates.get(idx)
        if a is None or b is None:
            return []
        return list(difflib.unified_diff(a.text.splitlines(), b.text.splitlines(), f"candidate {against}",
                                         f"candidate {idx}", lineterm="", n=2))
