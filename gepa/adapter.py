"""The interface the engine searches through: evaluate a candidate, build a reflective dataset, propose texts.

What the engine relies on, in one place (each method's docstring says the rest):

- A candidate maps component names to texts. Every candidate has exactly the seed's components: the engine only
  ever replaces texts, never adds or drops a name. Candidates are compared by value (a proposal equal to its parent
  or to any earlier candidate is not evaluated again).
- One row of a batch is one metric call. The engine counts the calls before it asks the adapter, so a call that
  raises has still been paid for; the budget is never exceeded because the adapter is only ever asked for rows the
  engine has already reserved.
- Scores: higher is better, one per row, in the batch's order. The engine compares sums on a minibatch (a child must
  beat its parent by more than 1e-9) and averages over the validation set (the best candidate, the Pareto fronts).
  Scores of different rows should therefore be on one scale; the engine imposes no range, except that a configured
  `perfect_score` is compared with each score.
- Concurrency: with parallel proposals the methods are called from several threads at once (and `evaluate` of the
  seed beside the first round's proposals), so an adapter must be safe to share between threads. The order in which
  calls finish does not change the search; what they return does.
- Errors: an exception from any method ends the run (the state of the last finished round is saved, with the calls
  spent since counted, and the exception propagates). A row that merely fails (a model error, an unparsable answer)
  should get a low score, with the reason in its trajectory, rather than raise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

Candidate = dict[str, str]  # component name -> text (here at least `system_prompt`)
ReflectiveDataset = dict[str, list[dict[str, Any]]]  # component name -> records the reflection model reads


@dataclass
class EvaluationBatch:
    """Scores of one candidate on a batch (one metric call per row), with traces when asked for.

    `scores[k]` and, when present, `outputs[k]` and `trajectories[k]` belong to the batch's row k. The engine checks
    that there is one score per row (a `ValueError` ends the run otherwise) and keeps the scores of validation rows
    in its state. It never reads `outputs` (the adapter's own results, e.g. rollouts, for the caller) nor
    `trajectories`, which only travel to the same adapter's `make_reflective_dataset`.
    """

    scores: list[float]
    outputs: list[Any] = field(default_factory=list)
    trajectories: list[dict[str, Any]] | None = None


class Adapter(Protocol):
    def evaluate(self, batch: Sequence[Any], candidate: Candidate, capture_traces: bool) -> EvaluationBatch:
        """Score `candidate` on every row of `batch` (len(batch) metric calls), rows evaluated concurrently.

        `batch` holds rows of the training or validation set exactly as they were given to the engine (it never
        looks inside them); neither it nor `candidate`, which may be the engine's own copy, may be modified.
        Returns one score per row, in order. With `capture_traces` (only the parent's minibatch, before a
        reflection) `trajectories` holds one JSON-serializable dict per row for `make_reflective_dataset`: what
        the reflection model should see of that row (its input, the output, the score, the expected answer,
        any error); without it `trajectories` may be None.
        """
        ...

    def make_reflective_dataset(self, candidate: Candidate, evaluation: EvaluationBatch,
                                components: Sequence[str]) -> ReflectiveDataset:
        """The records the reflection model reads to improve each of `components` of `candidate`.

        `evaluation` is this adapter's own `evaluate(minibatch, candidate, capture_traces=True)`, so its
        trajectories are present. `components` names the texts to be rewritten (today one, in round robin over the
        seed's components). Returns a list of records for each of them; a record is a flat dict whose keys are
        short headings ("Inputs", "Generated Outputs", "Reward", ...) and whose values are strings or
        JSON-serializable values, shown to the reflection model in order, one example per record
        (see `reflection.format_examples`). Costs no metric calls.
        """
        ...

    def propose_new_texts(self, candidate: Candidate, dataset: ReflectiveDataset,
                          components: Sequence[str]) -> dict[str, str]:
        """New texts for `components` of `candidate`, from `dataset` (as `make_reflective_dataset` built it).

        Returns component name -> text. The engine takes the texts of `candidate`'s own components only (other
        names are ignored) and keeps the parent's text for a component left out; an answer that changes nothing,
        or that rebuilds an existing candidate, is recorded as "unchanged" or "duplicate" and costs no metric
        calls. So when the reflection model gives nothing usable, return the current text rather than raise.
        Costs no metric calls (the reflection model is not metered).
        """
        ...
