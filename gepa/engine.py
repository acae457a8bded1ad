"""The GEPA search loop (Agrawal et al. 2025), a pure algorithm over an `Adapter`.

Per iteration: pick a parent from the per-instance Pareto fronts (dominated candidates removed, sampled in
proportion to the instances each is best on), score it on an epoch-shuffled training minibatch, ask for a better
text for one component (round robin), score the child on the same minibatch, accept only on strict improvement,
then score the child on the whole validation set. After an accepted child, an optional merge of two front
candidates that improved different components since a common ancestor.

The metric-call budget is hard: an iteration sizes its minibatch so that parent, child and a full validation fit
in what is left, and stops when nothing fits. The state is saved after every iteration; `run()` on a saved state
continues exactly where it stopped (the RNG included), spending nothing twice.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gepa.adapter import Adapter, Candidate
from gepa.budget import MetricBudget
from gepa.pareto import front_frequencies, instance_fronts, select_parent
from gepa.state import GepaState

EPS = 1e-9
Emit = Callable[[str, dict[str, Any], int], None]  # (event kind, data, step)


@dataclass
class EngineConfig:
    max_metric_calls: int = 500
    minibatch_size: int = 3
    perfect_score: float | None = None
    seed: int = 0
    use_merge: bool = False
    max_merge_invocations: int = 5
    max_iterations: int | None = None  # stop after this many iterations (tests, smoke runs)


class GepaEngine:
    def __init__(self, adapter: Adapter, trainset: Sequence[Any], valset: Sequence[Any], seed_candidate: Candidate,
                 config: EngineConfig, *, state_path: Path | None = None, emit: Emit | None = None) -> None:
        if not trainset or not valset:
            raise ValueError("GEPA needs at least one training and one validation example")
        if config.max_metric_calls < 1:
            raise ValueError("the metric-call budget must be at least 1")
        self.adapter = adapter
        self.trainset = list(trainset)
        self.valset = list(valset)
        self.seed_candidate = dict(seed_candidate)
        self.components = sorted(self.seed_candidate)
        self.config = config
        self.state_path = state_path
        self._emit = emit
        self.rng = random.Random(config.seed)
        self.state = GepaState()
        self.budget = MetricBudget(config.max_metric_calls)
        if state_path is not None and state_path.exists():
            self.state = GepaState.load(state_path)
            if self.state.rng_state is not None:
                self.state.restore_rng(self.rng)
            self.budget.used = self.state.metric_calls
        self._checkpoint: dict[str, Any] = self.state.to_json()

    # ------------------------------------------------------------------------------------------------------
    def run(self) -> GepaState:
        """Search until the budget (or `max_iterations`) runs out. On an exception (Ctrl-C, SIGTERM) the last
        finished iteration is saved, with the calls spent since counted, and the exception goes on."""
        try:
            if not self.state.candidates:
                self._evaluate_seed()
            while not self.state.finished:
                if self.config.max_iterations is not None and self.state.iteration >= self.config.max_iterations:
                    self._finish("max_iterations")
                    break
                if not self._iterate():
                    self._finish("budget")
        except BaseException:
            self.save_interrupted()
            raise
        return self.state

    def save_interrupted(self) -> None:
        """Save the last finished iteration's state, counting every metric call spent since (never re-spent)."""
        if self.state_path is None:
            return
        snapshot = GepaState.from_json(dict(self._checkpoint))
        snapshot.metric_calls = self.budget.used
        snapshot.stop_reason = "interrupted"
        snapshot.save(self.state_path)

    # ------------------------------------------------------------------------------------------------------
    def _evaluate_seed(self) -> None:
        self.state.num_val = min(len(self.valset), self.budget.remaining)
        scores = self._evaluate(self._val_rows(), self.seed_candidate).scores
        idx = self.state.add_candidate(self.seed_candidate, [], "seed", scores)
        self._emit_candidate(idx)
        self._end_iteration()

    def _iterate(self) -> bool:
        """One iteration; False when the budget cannot pay for another."""
        if self.state.merges_due > 0 and self.budget.remaining >= self.state.num_val:
            pair = self._merge_pair()
            self.state.merges_due -= 1
            if pair is not None:
                self.state.iteration += 1
                self._merge(*pair)
                self._end_iteration()
                return True
        k = min(self.config.minibatch_size, len(self.trainset),
                (self.budget.remaining - self.state.num_val) // 2)
        if k < 1:
            return False
        self.state.iteration += 1
        self._reflect(k)
        self._end_iteration()
        return True

    def _reflect(self, k: int) -> None:
        started = time.perf_counter()
        state = self.state
        parent_idx = select_parent(state.val_scores[: len(state.candidates)], self.rng)
        parent = state.candidates[parent_idx]
        component = self.components[(state.iteration - 1) % len(self.components)]
        ids = self._next_minibatch(k)
        rows = [self.trainset[i] for i in ids]
        record: dict[str, Any] = {"iteration": state.iteration, "type": "reflection", "parent": parent_idx,
                                  "component": component, "minibatch": ids, "child_idx": None}
        parent_eval = self._evaluate(rows, parent, capture_traces=True)
        record["parent_scores"] = parent_eval.scores
        perfect = self.config.perfect_score
        if perfect is not None and all(s >= perfect - EPS for s in parent_eval.scores):
            return self._record(record, "skipped_perfect", started)
        dataset = self.adapter.make_reflective_dataset(parent, parent_eval, [component])
        proposed = self.adapter.propose_new_texts(parent, dataset, [component])
        child = {**parent, **{c: t for c, t in proposed.items() if c in parent}}
        if child == parent:
            return self._record(record, "unchanged", started)
        child_scores = self._evaluate(rows, child).scores
        record["child_scores"] = child_scores
        if sum(child_scores) <= sum(parent_eval.scores) + EPS:
            return self._record(record, "rejected", started)
        val = self._evaluate(self._val_rows(), child).scores
        record["child_idx"] = state.add_candidate(child, [parent_idx], "reflection", val)
        if self.config.use_merge and state.merges_done + state.merges_due < self.config.max_merge_invocations:
            state.merges_due += 1
        self._emit_candidate(record["child_idx"])
        self._record(record, "accepted", started)

    # Merge --------------------------------------------------------------------------------------------------
    def _merge_pair(self) -> tuple[int, int, int, Candidate] | None:
        """Two front candidates with a common ancestor that changed different components, and their merge."""
        state = self.state
        front = sorted(front_frequencies(state.val_scores))
        options: list[tuple[int, int, int, Candidate]] = []
        for a_pos, i in enumerate(front):
            for j in front[a_pos + 1:]:
                anc_i, anc_j = state.ancestors(i), state.ancestors(j)
                if i in anc_j or j in anc_i:
                    continue
                for a in sorted(anc_i & anc_j, reverse=True):
                    merged = self._merged(a, i, j)
                    if merged is not None and merged not in state.candidates:
                        options.append((a, i, j, merged))
                        break
        return self.rng.choice(options) if options else None

    def _merged(self, a: int, i: int, j: int) -> Candidate | None:
        state = self.state
        base, ci, cj = state.candidates[a], state.candidates[i], state.candidates[j]
        merged: Candidate = {}
        for name in self.components:
            if ci[name] == base[name]:
                merged[name] = cj[name]
            elif cj[name] == base[name]:
                merged[name] = ci[name]
            else:
                merged[name] = ci[name] if state.average(i) >= state.average(j) else cj[name]
        return merged if merged not in (ci, cj) else None

    def _merge(self, ancestor: int, i: int, j: int, merged: Candidate) -> None:
        started = time.perf_counter()
        state = self.state
        n = state.num_val
        ids = sorted(self.rng.sample(range(n), min(self.config.minibatch_size, n)))
        record: dict[str, Any] = {"iteration": state.iteration, "type": "merge", "parent": [i, j],
                                  "ancestor": ancestor, "minibatch": ids, "child_idx": None,
                                  "parent_scores": [max(state.val_scores[i][x], state.val_scores[j][x])
                                                    for x in ids]}
        state.merges_done += 1
        sub = self._evaluate([self.valset[x] for x in ids], merged).scores
        record["child_scores"] = sub
        best_parent = max(sum(state.val_scores[i][x] for x in ids), sum(state.val_scores[j][x] for x in ids))
        if sum(sub) < best_parent - EPS:
            return self._record(record, "rejected", started)
        rest = [x for x in range(n) if x not in ids]
        rest_scores = self._evaluate([self.valset[x] for x in rest], merged).scores if rest else []
        full = dict(zip(ids, sub, strict=True)) | dict(zip(rest, rest_scores, strict=True))
        record["child_idx"] = state.add_candidate(merged, [i, j], "merge", [full[x] for x in range(n)])
        self._emit_candidate(record["child_idx"])
        self._record(record, "accepted", started)

    # Helpers ------------------------------------------------------------------------------------------------
    def _val_rows(self) -> list[Any]:
        return self.valset[: self.state.num_val]

    def _evaluate(self, rows: list[Any], candidate: Candidate, capture_traces: bool = False) -> Any:
        self.budget.spend(len(rows))  # raises before going over the cap: the loop sizes every batch to fit
        result = self.adapter.evaluate(rows, candidate, capture_traces)
        if len(result.scores) != len(rows):
            raise ValueError(f"the adapter returned {len(result.scores)} scores for {len(rows)} rows")
        self.state.metric_calls = self.budget.used
        self._emit_budget()
        return result

    def _next_minibatch(self, k: int) -> list[int]:
        state = self.state
        ids: list[int] = []
        while len(ids) < k:
            if state.epoch_pos >= len(state.epoch_order):
                state.epoch_order = list(range(len(self.trainset)))
                self.rng.shuffle(state.epoch_order)
                state.epoch += 1
                state.epoch_pos = 0
            ids.append(state.epoch_order[state.epoch_pos])
            state.epoch_pos += 1
        return ids

    def _record(self, record: dict[str, Any], verdict: str, started: float) -> None:
        record.update(verdict=verdict, metric_calls=self.budget.used, seconds=time.perf_counter() - started,
                      best_idx=self.state.best_idx, best_score=self.state.average(self.state.best_idx))
        self.emit("gepa.iteration", record)

    def _end_iteration(self) -> None:
        self.state.save_rng(self.rng)
        self._emit_frontier()
        self._checkpoint = self.state.to_json()
        if self.state_path is not None:
            self.state.save(self.state_path)

    def _finish(self, reason: str) -> None:
        self.state.finished = True
        self.state.stop_reason = reason
        self._end_iteration()

    def emit(self, kind: str, data: dict[str, Any]) -> None:
        if self._emit is not None:
            self._emit(kind, data, self.state.iteration)

    def _emit_budget(self) -> None:
        self.emit("gepa.budget", {"used": self.budget.used, "max": self.budget.max_calls,
                                  "remaining": self.budget.remaining})

    def _emit_candidate(self, idx: int) -> None:
        s = self.state
        self.emit("gepa.candidate", {"idx": idx, "parents": s.parents[idx], "origin": s.origins[idx],
                                     "texts": s.candidates[idx], "val_scores": s.val_scores[idx],
                                     "score": s.average(idx), "iteration": s.found_at_iteration[idx],
                                     "metric_calls": s.found_at_calls[idx]})

    def _emit_frontier(self) -> None:
        s = self.state
        fronts = instance_fronts(s.val_scores)
        self.emit("gepa.frontier", {
            "num_candidates": len(s.candidates), "best_idx": s.best_idx, "best_score": s.average(s.best_idx),
            "frequencies": {str(k): v for k, v in sorted(front_frequencies(s.val_scores).items())},
            "instance_best": [max(scores[i] for scores in s.val_scores) for i in range(s.num_val)],
            "instance_fronts": [sorted(f) for f in fronts]})
