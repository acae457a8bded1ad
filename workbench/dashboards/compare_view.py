"""Evaluations side by side as the workbench's compare view shows them, textual-free: `evals.compare`'s Comparison
(the same numbers `prime eval compare` prints) laid out as the rows of the view's tables and the lines under them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from prime_lab.evals.compare import Comparison, Difference, compare_evaluations
from prime_lab.runs.registry import RunRegistry


def signed(value: float) -> str:
    return f"{value:+.3f}"


def verdict(difference: Difference) -> str:
    """What the interval says: better, worse, or no clear difference (0 inside it)."""
    if not difference.significant:
        return "no clear difference"
    return "better" if difference.low > 0 else "worse"


@dataclass(frozen=True)
class ComparisonView:
    comparison: Comparison

    @classmethod
    def of(cls, sources: Sequence[str], registry: RunRegistry | None = None) -> ComparisonView:
        """Compare the evaluations `sources` (run ids or output folders) against the first; raises
        `evals.compare.ComparisonError` with the reason when they do not compare."""
        return cls(compare_evaluations(list(sources), registry=registry))

    @property
    def first(self) -> str:
        return self.comparison.evaluations[0].letter

    def heading(self) -> str:
        c = self.comparison
        return (f"{c.env_id} · {len(c.examples)} examples in common · paired bootstrap {c.confidence:.0%} interval, "
                f"{c.resamples:,} resamples, seed {c.seed}")

    EVALUATION_COLUMNS = ("", "mean", "vs A (95% CI)", "evaluation", "verdict", "run")

    def evaluation_rows(self) -> list[tuple[str, ...]]:
        """Per evaluation: its letter, mean reward, difference to the first with its interval, its label (model,
        policy, system prompt), the verdict and its run id (or folder)."""
        by_letter = {d.letter: d for d in self.comparison.differences}
        rows: list[tuple[str, ...]] = []
        for s in self.comparison.evaluations:
            d = by_letter.get(s.letter)
            interval = f"{signed(d.mean)} [{signed(d.low)}, {signed(d.high)}]" if d else "-"
            rows.append((s.letter, f"{s.mean:.3f}", interval, s.label, verdict(d) if d else "reference",
                         s.run_id or s.path))
        return rows

    def example_columns(self) -> tuple[str, ...]:
        letters = [s.letter for s in self.comparison.evaluations]
        return ("example", *letters, *(f"{d.letter}-{self.first}" for d in self.comparison.differences), "prompt")

    def example_rows(self) -> list[tuple[str, ...]]:
        """Per example: its id, each evaluation's reward, each difference to the first, the prompt's excerpt."""
        return [(row.example, *(f"{r:.3f}" for r in row.rewards),
                 *(signed(r - row.rewards[0]) for r in row.rewards[1:]), row.prompt)
                for row in self.comparison.examples]

    def changed_lines(self) -> list[str]:
        """For each evaluation after the first: its difference and the examples whose reward moved most, each with
        the prompt's excerpt."""
        lines: list[str] = []
        for d in self.comparison.differences:
            lines.append(f"{d.letter} vs {self.first}: {signed(d.mean)} {verdict(d)}; changed most:")
            lines += [f"  example {c.example}: {c.before:.3f} -> {c.after:.3f} ({signed(c.delta)})  {c.prompt}"
                      for c in d.changed] or ["  no example changed"]
        return lines
