"""The documented output files of a GEPA run (`best_prompt.txt`, `pareto_frontier.jsonl`, `metadata.json`) plus
every candidate with its lineage and scores (`candidates.jsonl`) and every proposal, accepted or not, with its texts,
parent, minibatch scores and verdict (`proposals.jsonl`)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from prime_lab.gepa.env_adapter import SYSTEM_PROMPT
from prime_lab.gepa.pareto import instance_fronts
from prime_lab.gepa.state import GepaState
from prime_lab.runs.atomic import write_json_atomic

STATE_FILE = "state.json"


def frontier_rows(state: GepaState) -> list[dict[str, Any]]:
    """One row per validation instance: its best score and the candidates that reach it."""
    rows = []
    for i, front in enumerate(instance_fronts(state.val_scores)):
        best = max(scores[i] for scores in state.val_scores)
        rows.append({"valset_row": i, "best_score": best, "num_best_prompts": len(front),
                     "best_prompts": [{"candidate_idx": c,
                                       "system_prompt": state.candidates[c].get(SYSTEM_PROMPT, ""),
                                       "score": state.val_scores[c][i]} for c in sorted(front)]})
    return rows


def candidate_rows(state: GepaState) -> list[dict[str, Any]]:
    return [{"candidate_idx": i, "parents": state.parents[i], "origin": state.origins[i],
             "score": state.average(i), "val_scores": state.val_scores[i], "iteration": state.found_at_iteration[i],
             "metric_calls": state.found_at_calls[i], "texts": state.candidates[i]}
            for i in range(len(state.candidates))]


def proposal_rows(state: GepaState) -> list[dict[str, Any]]:
    """One row per iteration, in order: the fields of its `gepa.iteration` event less timings and running totals
    (`iteration`, `type`, `parent`, `minibatch`, `parent_scores`, `texts`, `child_scores`, `verdict`, `accepted`,
    `child_idx`, ...)."""
    return [dict(p) for p in state.proposals]


def write_outputs(out_dir: Path, state: GepaState, config: dict[str, Any], *, completed: bool,
                  extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write (or rewrite) the outputs for `state`; returns the metadata. Nothing is written before the seed's
    validation, since there is no candidate to report."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if not state.candidates:
        return {}
    best = state.best_idx
    (out_dir / "best_prompt.txt").write_text(state.candidates[best].get(SYSTEM_PROMPT, ""))
    _write_jsonl(out_dir / "pareto_frontier.jsonl", frontier_rows(state))
    _write_jsonl(out_dir / "candidates.jsonl", candidate_rows(state))
    _write_jsonl(out_dir / "proposals.jsonl", proposal_rows(state))
    metadata = {"num_candidates": len(state.candidates), "best_idx": best, "best_score": state.average(best),
                "seed_score": state.average(0), "beat_seed": best != 0, "num_proposals": state.num_proposed,
                "num_accepted": state.num_accepted,
                "total_metric_calls": state.metric_calls,
                "completed_at": datetime.now().isoformat(timespec="seconds") if completed else None,
                "stop_reason": state.stop_reason, "iterations": state.iteration, "num_val_used": state.num_val,
                "config": config, **(extra or {})}
    write_json_atomic(out_dir / "metadata.json", metadata)
    return metadata


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    tmp.replace(path)
