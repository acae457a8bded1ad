"""Evaluation: `prime eval run`'s engine, comparisons of evaluations, trained policies to evaluate."""
