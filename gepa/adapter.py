"""The interface the engine searches through: evaluate a candidate, build a reflective dataset, propose texts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

Candidate = dict[str, str]  # component name -> text (here at least `system_prompt`)
ReflectiveDataset = dict[str, list[dict[str, Any]]]  # component name -> records the reflection model reads


@dataclass
class EvaluationBatch:
    """Scores of one candidate on a batch (one metric call per row), with traces when asked for."""

    scores: list[float]
    outputs: list[Any] = field(default_factory=list)
    trajectories: list[dict[str, Any]] | None = None


class Adapter(Protocol):
    def evaluate(self, batch: Sequence[Any], candidate: Candidate, capture_traces: bool) -> EvaluationBatch:
        """Score `candidate` on every row of `batch` (len(batch) metric calls), rows evaluated concurrently."""
        ...

    def make_reflective_dataset(self, candidate: Candidate, evaluation: EvaluationBatch,
                                components: Sequence[str]) -> ReflectiveDataset:
        ...

    def propose_new_texts(self, candidate: Candidate, dataset: ReflectiveDataset,
                          components: Sequence[str]) -> dict[str, str]:
        ...
