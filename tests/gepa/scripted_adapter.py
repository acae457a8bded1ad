"""A deterministic adapter for engine tests: a candidate's score on a row depends only on its text and the row,
and the 'reflection' appends a marker derived from what it was shown. Counts every metric call it serves; safe to
call from the threads of parallel proposals, and with `jitter` it sleeps a random while per call so that those
threads finish in a different order each run."""

from __future__ import annotations

import hashlib
import random
import threading
import time
from collections.abc import Sequence
from typing import Any

from prime_lab.gepa.adapter import Candidate, EvaluationBatch, ReflectiveDataset


def score_of(text: str, row: int) -> float:
    """Deterministic pseudo-score in [0, 1]; longer prompts tend to score higher (so the search makes progress)."""
    digest = hashlib.sha256(f"{text}|{row}".encode()).digest()
    return min(1.0, digest[0] / 255 * 0.6 + 0.05 * text.count("+"))


class ScriptedAdapter:
    def __init__(self, fail_after_calls: int | None = None, jitter: float = 0.0) -> None:
        self.calls = 0
        self.evaluations: list[int] = []
        self.fail_after_calls = fail_after_calls
        self.jitter = jitter
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0

    def evaluate(self, batch: Sequence[Any], candidate: Candidate, capture_traces: bool) -> EvaluationBatch:
        with self.lock:
            if self.fail_after_calls is not None and self.calls + len(batch) > self.fail_after_calls:
                raise KeyboardInterrupt
            self.calls += len(batch)
            self.evaluations.append(len(batch))
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        if self.jitter:
            time.sleep(random.random() * self.jitter)
        with self.lock:
            self.in_flight -= 1
        scores = [score_of(candidate["system_prompt"], int(row)) for row in batch]
        traces = [{"row": row, "score": s} for row, s in zip(batch, scores, strict=True)] if capture_traces else None
        return EvaluationBatch(scores=scores, outputs=list(batch), trajectories=traces)

    def make_reflective_dataset(self, candidate: Candidate, evaluation: EvaluationBatch,
                                components: Sequence[str]) -> ReflectiveDataset:
        return {c: list(evaluation.trajectories or []) for c in components}

    def propose_new_texts(self, candidate: Candidate, dataset: ReflectiveDataset,
                          components: Sequence[str]) -> dict[str, str]:
        if self.jitter:
            time.sleep(random.random() * self.jitter)
        return {c: candidate[c] + "+" + str(sum(int(r["row"]) for r in dataset[c])) for c in components}
