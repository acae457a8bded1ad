"""The GEPA search loop (Agrawal et al. 2025), a pure algorithm over an `Adapter`.

Per iteration: pick a parent from the per-instance Pareto fronts (dominated candidates removed, sampled in
proportion to the instances each is best on), score it on an epoch-shuffled training minibatch, ask for a better
text for one component (round robin), score the child on the same minibatch, accept only on strict improvement,
then score the child on the whole validation set. After an accepted child, an optional merge of two front
candidates that improved different components since a common ancestor (which pair, over which ancestor, with
which texts: `merge`; the engine scores it and records it).

Independent proposals run in parallel, a round at a time: the round's parents, components and minibatches are
drawn in order on the calling thread from the state as it stood when the round began, the proposals then run
concurrently (each on its own thread; the adapter's calls are I/O), and their outcomes are settled in proposal order
(a child accepted by proposal 1 gets a smaller index than one accepted by proposal 2, whatever finished first).
So a seed gives the same search whenever the models answer the same, and one proposal per round is the sequential
algorithm. The first round runs beside the seed's validation (the seed is its only possible parent).

The metric-call budget is hard: a round reserves, before anything is spent, the parent and child minibatches of
every proposal and a validation pass for each, or, when they do not all fit, a pool of as many passes as fit (at
least one) that goes after the round to the accepted children that improved most on their minibatches; so the
total never exceeds the cap however the proposals interleave. The state is saved after every round; `run()` on a
saved state continues exactly where it stopped (the RNG included), spending nothing twice.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal, NotRequired, TypedDict, cast

from prime_lab.gepa.adapter import Adapter, Candidate, EvaluationBatch
from prime_lab.gepa.budget import BudgetClosed, MetricBudget, Reservation, minibatch_sizes
from prime_lab.gepa.merge import (
    EPS,
    MergePlan,
    best_parent_scores,
    choose_merge,
    merge_minibatch,
    worse_than_parents,
)
from prime_lab.gepa.pareto import front_frequencies, instance_fronts, select_parent
from prime_lab.gepa.state import GepaState

Emit = Callable[[str, dict[str, Any], int], None]  # (event kind, data, step)

Verdict = Literal[
    "accepted",         # the child improved on its minibatch and was validated: it is candidate `child_idx`
    "rejected",         # the child did not beat its parent on the minibatch (a merge: fell short of its better parent)
    "unchanged",        # the reflection proposed the parent's own texts
    "duplicate",        # the child's texts are an existing candidate's (or another child's of the same round)
    "skipped_perfect",  # the parent scored `perfect_score` on every row of the minibatch: nothing to reflect on
    "not_validated",    # the child improved on its minibatch, but no calls were left to validate it
    "failed",           # a proposal left without one (not emitted today: a proposal's error ends the run first)
]
IterationType = Literal["reflection", "merge"]


class IterationRecord(TypedDict):
    """The data of one `gepa.iteration` event: one reflective mutation or one merge, its keys in this order.

    A record is built when its iteration is drawn (the keys not marked NotRequired, and `component` and
    `round_size` for a reflection, `ancestor` and `parent_scores` for a merge), gains its scores as they come, and is
    completed when emitted: every emitted record has `verdict`, `accepted`, `metric_calls` (spent so far), `seconds`,
    `best_idx` and `best_score` (the best candidate and its average validation score after the iteration). Every
    proposed child's texts are in it, whatever its verdict, so a rejected prompt can be read as well as an accepted
    one. The run's log, its status, the progress bar, the dashboard and the run's proposals.jsonl read these records.
    """

    iteration: int
    type: IterationType
    parent: int | list[int]  # the parent of a reflection; the two parents of a merge
    component: NotRequired[str]  # reflection: the component rewritten
    ancestor: NotRequired[int]  # merge: the common ancestor the changes are taken against
    minibatch: list[int]  # reflection: training rows; merge: validation rows
    child_idx: int | None  # the new candidate's index when accepted, else None
    round_size: NotRequired[int]  # reflection: proposals in its round
    parent_scores: NotRequired[list[float]]  # on the minibatch (a merge: the better parent's score on each row)
    texts: NotRequired[Candidate]  # the child's full texts, whenever one was proposed (all but skipped_perfect)
    child_scores: NotRequired[list[float]]  # on the minibatch, when the child was scored
    verdict: NotRequired[Verdict]
    accepted: NotRequired[bool]  # the child became a candidate (verdict "accepted": it beat its parent, validated)
    metric_calls: NotRequired[int]
    seconds: NotRequired[float]
    best_idx: NotRequired[int]
    best_score: NotRequired[float]


@dataclass
class EngineConfig:
    max_metric_calls: int = 500
    minibatch_size: int = 3
    perfect_score: float | None = None
    seed: int = 0
    use_merge: bool = False
    max_merge_invocations: int = 5
    num_parallel_proposals: int = 8  # reflective mutations run at once in a round (1: the sequential algorithm)
    max_iterations: int | None = None  # stop after this many iterations (tests, smoke runs)


@dataclass
class Proposal:
    """One reflective mutation of a round: drawn on the calling thread, run on its own, settled in order."""

    iteration: int
    parent: int
    component: str
    minibatch: list[int]
    reservation: Reservation
    validate_now: bool  # the reservation holds a validation pass for an accepted child
    parent_texts: Candidate
    record: IterationRecord
    verdict: Verdict | None = None
    child: Candidate | None = None
    val_scores: list[float] | None = None
    gain: float = 0.0  # the child's mean improvement over its parent on the minibatch
    seconds: float = 0.0


class GepaEngine:
    def __init__(self, adapter: Adapter, trainset: Sequence[Any], valset: Sequence[Any], seed_candidate: Candidate,
                 config: EngineConfig, *, state_path: Path | None = None, emit: Emit | None = None) -> None:
        if not trainset or not valset:
            raise ValueError("GEPA needs at least one training and one validation example")
        if config.max_metric_calls < 1:
            raise ValueError("the metric-call budget must be at least 1")
        if config.num_parallel_proposals < 1:
            raise ValueError("num_parallel_proposals must be at least 1")
        self.adapter = adapter
        self.trainset = list(trainset)
        self.valset = list(valset)
        self.seed_candidate = dict(seed_candidate)
        self.components = sorted(self.seed_candidate)
        self.config = config
        self.state_path = state_path
        self._emit = emit
        self._lock = threading.RLock()  # budget events and every emit, from any proposal's thread
        self.rng = random.Random(config.seed)
        self.state = GepaState()
        if state_path is not None and state_path.exists():
            self.state = GepaState.load(state_path)
            if self.state.rng_state is not None:
                self.state.restore_rng(self.rng)
        self.budget = MetricBudget(config.max_metric_calls, used=self.state.metric_calls)
        self._checkpoint: dict[str, Any] = self.state.to_json()

    # ------------------------------------------------------------------------------------------------------
    def run(self) -> GepaState:
        """Search until the budget (or `max_iterations`) runs out. On an exception (Ctrl-C, SIGTERM) the last
        finished round is saved, with the calls spent since counted, and the exception goes on."""
        try:
            if not self.state.candidates:
                self._seed_round()
            while not self.state.finished:
                if self.config.max_iterations is not None and self.state.iteration >= self.config.max_iterations:
                    self._finish("max_iterations")
                    break
                if not self._iterate():
                    self._finish("budget")
        except BaseException:
            with self._lock:  # after any spend in progress has been counted and announced
                self.budget.close()  # proposals still running stop at their next evaluation
            self.save_interrupted()
            raise
        return self.state

    def save_interrupted(self) -> None:
        """Save the last finished round's state, counting every metric call spent since (never re-spent)."""
        if self.state_path is None:
            return
        snapshot = GepaState.from_json(dict(self._checkpoint))
        snapshot.metric_calls = self.budget.used
        snapshot.stop_reason = "interrupted"
        snapshot.save(self.state_path)

    # ------------------------------------------------------------------------------------------------------
    def _seed_round(self) -> None:
        """Score the seed on the validation set. With parallel proposals the first round runs at the same time:
        the seed is the only candidate, so it is every first-round parent whatever its scores, and the round is
        drawn exactly as it would be after the seed's scores came in. Once those are in they are saved as the
        state to resume from, so an interruption later in the round does not score the seed again."""
        state = self.state
        state.num_val = min(len(self.valset), self.budget.available)
        seed_reservation = self.budget.reserve(state.num_val)
        sizes = self._round_sizes() if self.config.num_parallel_proposals > 1 else []
        if not sizes:
            scores = self._evaluate(self._val_rows(), self.seed_candidate, seed_reservation).scores
            self._add_seed(state, scores)
            self._emit_candidate(0)
            self._end_iteration()
            return
        state.save_rng(self.rng)
        before_round = state.to_json()
        proposals, pool = self._plan(sizes)
        seed_scores: list[float] = []

        def score_seed() -> None:
            seed_scores.extend(self._evaluate(self._val_rows(), self.seed_candidate, seed_reservation).scores)
            with self._lock:
                checkpoint = GepaState.from_json(before_round)
                self._add_seed(checkpoint, seed_scores)
                checkpoint.metric_calls = self.budget.used
                self._checkpoint = checkpoint.to_json()
                if self.state_path is not None:
                    checkpoint.save(self.state_path)
                self._emit_candidate(0, checkpoint)
                self._emit_frontier(checkpoint)

        self._run_concurrently([score_seed, *(partial(self._propose, p) for p in proposals)])
        self._add_seed(state, seed_scores)
        self._settle(proposals, pool)
        self._end_iteration()

    def _add_seed(self, state: GepaState, scores: list[float]) -> None:
        state.add_candidate(self.seed_candidate, [], "seed", scores)
        state.found_at_calls[0] = state.num_val

    def _iterate(self) -> bool:
        """One round (a merge, or up to `num_parallel_proposals` reflections); False when the budget cannot pay
        for another."""
        state = self.state
        nv = state.num_val
        if state.merges_due > 0 and self.budget.available >= nv:
            plan = choose_merge(state, self.components, self.rng)
            state.merges_due -= 1
            if plan is not None:
                state.iteration += 1
                reservation = self.budget.reserve(nv)
                self._merge(plan, reservation)
                reservation.release()
                self._end_iteration()
                return True
        sizes = self._round_sizes()
        if not sizes:
            return False
        proposals, pool = self._plan(sizes)
        self._run_concurrently([partial(self._propose, p) for p in proposals])
        self._settle(proposals, pool)
        self._end_iteration()
        return True

    def _round_sizes(self) -> list[int]:
        """The minibatch size of each proposal of the next round: full minibatches while the budget still holds
        both evaluations of each plus one validation pass, then a smaller one with what is left (as the
        sequential algorithm shrinks its last minibatch)."""
        limit = self.config.num_parallel_proposals
        if self.config.max_iterations is not None:
            limit = min(limit, self.config.max_iterations - self.state.iteration)
        return minibatch_sizes(self.budget.available - self.state.num_val, self.config.minibatch_size,
                               len(self.trainset), limit)

    def _plan(self, sizes: list[int]) -> tuple[list[Proposal], Reservation]:
        """Draw the round's parents and minibatches in order and reserve their calls: both minibatch evaluations
        of every proposal, and a validation pass for each when the budget holds them all (an accepted child is
        then validated at once). Otherwise as many validation passes as it holds, at least one, go to a pool
        that, after the round, validates the accepted children that improved most on their minibatches."""
        state = self.state
        nv = state.num_val
        validated = min(len(sizes), (self.budget.available - 2 * sum(sizes)) // nv)
        each = validated == len(sizes)
        pool = self.budget.reserve(0 if each else validated * nv)
        proposals = []
        # before the seed is scored (the first round runs beside it) the seed is the only parent; drawing it
        # from placeholder scores keeps the random stream of a run that scored it first
        val_scores = state.val_scores if state.candidates else [[0.0] * nv]
        for j, k in enumerate(sizes):
            iteration = state.iteration + j + 1
            parent = select_parent(val_scores, self.rng)
            ids = self._next_minibatch(k)
            reservation = self.budget.reserve(2 * k + (nv if each else 0))
            component = self.components[(iteration - 1) % len(self.components)]
            texts = state.candidates[parent] if state.candidates else self.seed_candidate
            proposals.append(Proposal(iteration, parent, component, ids, reservation, each, dict(texts),
                                      record={"iteration": iteration, "type": "reflection", "parent": parent,
                                              "component": component, "minibatch": ids, "child_idx": None,
                                              "round_size": len(sizes)}))
        return proposals, pool

    def _propose(self, p: Proposal) -> None:
        """A reflective mutation; reads the state (frozen during the round), writes only to `p`."""
        started = time.perf_counter()
        try:
            parent = p.parent_texts
            rows = [self.trainset[i] for i in p.minibatch]
            parent_eval = self._evaluate(rows, parent, p.reservation, capture_traces=True)
            p.record["parent_scores"] = parent_eval.scores
            perfect = self.config.perfect_score
            if perfect is not None and all(s >= perfect - EPS for s in parent_eval.scores):
                p.verdict = "skipped_perfect"
                return
            dataset = self.adapter.make_reflective_dataset(parent, parent_eval, [p.component])
            proposed = self.adapter.propose_new_texts(parent, dataset, [p.component])
            child = {**parent, **{c: t for c, t in proposed.items() if c in parent}}
            p.record["texts"] = child
            if child == parent:
                p.verdict = "unchanged"
                return
            if child in self.state.candidates:
                p.verdict = "duplicate"
                return
            child_scores = self._evaluate(rows, child, p.reservation).scores
            p.record["child_scores"] = child_scores
            if sum(child_scores) <= sum(parent_eval.scores) + EPS:
                p.verdict = "rejected"
                return
            p.verdict, p.child = "accepted", child
            p.gain = (sum(child_scores) - sum(parent_eval.scores)) / len(rows)
            if p.validate_now:
                p.val_scores = self._evaluate(self._val_rows(), child, p.reservation).scores
        finally:
            p.seconds += time.perf_counter() - started

    def _validate(self, p: Proposal) -> None:
        started = time.perf_counter()
        assert p.child is not None
        p.val_scores = self._evaluate(self._val_rows(), p.child, p.reservation).scores
        p.seconds += time.perf_counter() - started

    def _settle(self, proposals: list[Proposal], pool: Reservation) -> None:
        """Validate the accepted children that had no validation reserved, the largest minibatch improvement
        first, while calls are left; then add the validated children to the state in proposal order."""
        state = self.state
        for p in proposals:
            p.reservation.release()
        pool.release()
        waiting = [p for p in proposals if p.verdict == "accepted" and p.val_scores is None]
        late: list[Proposal] = []
        for p in sorted(waiting, key=lambda p: (-p.gain, p.iteration)):
            if any(p.child == q.child for q in late):
                p.verdict = "duplicate"
            elif self.budget.available >= state.num_val:
                p.reservation = self.budget.reserve(state.num_val)
                late.append(p)
            else:
                p.verdict = "not_validated"  # improved on its minibatch, but no calls left to validate it
        self._run_concurrently([partial(self._validate, p) for p in late])
        for p in late:
            p.reservation.release()
        for p in proposals:
            state.iteration = p.iteration
            if p.verdict == "accepted" and p.child is not None and p.val_scores is not None:
                if p.child in state.candidates:  # an earlier proposal of this round found the same text
                    p.verdict = "duplicate"
                else:
                    idx = state.add_candidate(p.child, [p.parent], "reflection", p.val_scores)
                    p.record["child_idx"] = idx
                    if (self.config.use_merge
                            and state.merges_done + state.merges_due < self.config.max_merge_invocations):
                        state.merges_due += 1
                    self._emit_candidate(idx)
            self._record(p.record, p.verdict or "failed", p.seconds)

    def _run_concurrently(self, jobs: list[Callable[[], None]]) -> None:
        """Every job at once, one thread each; the first error (in job order) is raised after all have ended.
        An error stops the others at their next evaluation."""
        if len(jobs) <= 1:
            for job in jobs:
                job()
            return
        errors: list[BaseException | None] = [None] * len(jobs)

        def guarded(n: int) -> None:
            try:
                jobs[n]()
            except BaseException as exc:  # noqa: BLE001 - handed to the calling thread below
                errors[n] = exc
                self.budget.close()

        threads = [threading.Thread(target=guarded, args=(n,), name=f"gepa-job-{n}", daemon=True)
                   for n in range(len(jobs))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        raised = [e for e in errors if e is not None]
        if raised:
            raise next((e for e in raised if not isinstance(e, BudgetClosed)), raised[0])

    # Merge --------------------------------------------------------------------------------------------------
    def _merge(self, plan: MergePlan, reservation: Reservation) -> None:
        """Score the merge on a validation minibatch; unless worse than its better parent there, on the rest of
        the validation set too (`reservation` holds one validation pass)."""
        started = time.perf_counter()
        state = self.state
        n = state.num_val
        ids = merge_minibatch(n, self.config.minibatch_size, self.rng)
        record: IterationRecord = {"iteration": state.iteration, "type": "merge",
                                   "parent": [plan.first, plan.second], "ancestor": plan.ancestor, "minibatch": ids,
                                   "child_idx": None, "parent_scores": best_parent_scores(state, plan, ids),
                                   "texts": dict(plan.texts)}
        state.merges_done += 1
        sub = self._evaluate([self.valset[x] for x in ids], plan.texts, reservation).scores
        record["child_scores"] = sub
        if worse_than_parents(state, plan, ids, sub):
            return self._record(record, "rejected", time.perf_counter() - started)
        rest = [x for x in range(n) if x not in ids]
        rest_scores = self._evaluate([self.valset[x] for x in rest], plan.texts, reservation).scores if rest else []
        full = dict(zip(ids, sub, strict=True)) | dict(zip(rest, rest_scores, strict=True))
        idx = state.add_candidate(plan.texts, [plan.first, plan.second], "merge", [full[x] for x in range(n)])
        record["child_idx"] = idx
        self._emit_candidate(idx)
        self._record(record, "accepted", time.perf_counter() - started)

    # Helpers ------------------------------------------------------------------------------------------------
    def _val_rows(self) -> list[Any]:
        return self.valset[: self.state.num_val]

    def _evaluate(self, rows: list[Any], candidate: Candidate, reservation: Reservation,
                  capture_traces: bool = False) -> EvaluationBatch:
        """Spend len(rows) calls from `reservation` (counted before the adapter is asked, so an interrupted
        evaluation is never paid twice), then evaluate."""
        with self._lock:
            reservation.spend(len(rows))
            self.state.metric_calls = self.budget.used
            self._emit_budget(len(rows))
        result = self.adapter.evaluate(rows, candidate, capture_traces)
        if len(result.scores) != len(rows):
            raise ValueError(f"the adapter returned {len(result.scores)} scores for {len(rows)} rows")
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

    def _record(self, record: IterationRecord, verdict: Verdict, seconds: float) -> None:
        record["verdict"] = verdict
        record["accepted"] = verdict == "accepted"
        record["metric_calls"] = self.budget.used
        record["seconds"] = seconds
        record["best_idx"] = self.state.best_idx
        record["best_score"] = self.state.average(self.state.best_idx)
        self.state.add_proposal(cast(dict[str, Any], record))
        self.emit("gepa.iteration", cast(dict[str, Any], record))

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
            with self._lock:
                self._emit(kind, data, self.state.iteration)

    def _emit_budget(self, spent: int) -> None:
        self.emit("gepa.budget", {"used": self.budget.used, "max": self.budget.max_calls,
                                  "remaining": self.budget.remaining, "spent": spent})

    def _emit_candidate(self, idx: int, state: GepaState | None = None) -> None:
        s = state or self.state
        self.emit("gepa.candidate", {"idx": idx, "parents": s.parents[idx], "origin": s.origins[idx],
                                     "texts": s.candidates[idx], "val_scores": s.val_scores[idx],
                                     "score": s.average(idx), "iteration": s.found_at_iteration[idx],
                                     "metric_calls": s.found_at_calls[idx]})

    def _emit_frontier(self, state: GepaState | None = None) -> None:
        s = state or self.state
        fronts = instance_fronts(s.val_scores)
        self.emit("gepa.frontier", {
            "num_candidates": len(s.candidates), "best_idx": s.best_idx, "best_score": s.average(s.best_idx),
            "frequencies": {str(k): v for k, v in sorted(front_frequencies(s.val_scores).items())},
            "instance_best": [max(scores[i] for scores in s.val_scores) for i in range(s.num_val)],
            "instance_fronts": [sorted(f) for f in fronts]})
