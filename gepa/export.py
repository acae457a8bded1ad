"""GEPA -> RL: an RL config whose environment starts from a GEPA run's best prompt (`prime gepa export RUN --rl`).

Where the environment's `load_environment` takes a `system_prompt` argument, the prompt goes through `[[env]]
args` (the same file runs on Hosted Training); where it does not, through `[[env]] system_prompt`, prime-lab's
local field that replaces each row's system message exactly as GEPA tried the prompt (validation says so in a note).
The rest is a small RL run on the same model, environment and sampling, with `[eval]` evaluating the base model
before step 1 and the trained policy at the end, so the run itself answers "did it get better". When no candidate
beat the seed, the "best prompt" is the seed's own: the config says so, and `seed_warning` is the warning to show.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomlkit

from prime_lab.runs.registry import Run

SYSTEM_PROMPT_ARG = "system_prompt"


class ExportError(ValueError):
    """The run cannot be exported; the message says why."""


@dataclass
class GepaResult:
    run_id: str
    env_id: str
    env_args: dict[str, Any]
    model: str
    sampling: dict[str, Any]
    best_prompt: str
    best_score: float | None
    seed_score: float | None
    num_val: int
    best_idx: int | None = None  # None: a run whose metadata does not say

    @property
    def best_is_seed(self) -> bool:
        """No candidate beat the seed prompt on the validation set (the earliest candidate wins a tie)."""
        return self.best_idx == 0

    @classmethod
    def of(cls, run: Run) -> GepaResult:
        if run.read_status().get("kind") != "gepa":
            raise ExportError(f"{run.id} is not a GEPA run")
        best = run.gepa_dir / "best_prompt.txt"
        if not best.is_file():
            raise ExportError(f"GEPA run {run.id} has no best_prompt.txt yet (it is written once the seed prompt is "
                              "scored)")
        try:
            settings = json.loads(run.resolved_path.read_text())["settings"]
        except (OSError, ValueError, KeyError) as exc:
            raise ExportError(f"GEPA run {run.id}: its resolved.json cannot be read ({exc})") from None
        meta = _json(run.gepa_dir / "metadata.json")
        candidates = [json.loads(line) for line in _text(run.gepa_dir / "candidates.jsonl").splitlines() if line]
        best_idx = meta.get("best_idx")
        return cls(run.id, settings["env_id"], dict(settings.get("env_args") or {}), settings["model"],
                   dict(settings.get("sampling") or {}), best.read_text(encoding="utf-8"), meta.get("best_score"),
                   candidates[0].get("score") if candidates else None,
                   int(meta.get("num_val_used") or settings.get("num_val") or 0),
                   best_idx if isinstance(best_idx, int) else None)


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8") if path.is_file() else ""


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(_text(path) or "{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def seed_warning(result: GepaResult) -> str | None:
    """A warning when the run's best prompt is the seed's own (no candidate beat it); None otherwise."""
    if not result.best_is_seed:
        return None
    score = f" ({result.seed_score:.3f} on {result.num_val} validation examples)" if result.seed_score is not None \
        else ""
    return (f"warning: no candidate of GEPA run {result.run_id} beat the seed prompt{score}: the exported config "
            "starts RL from the environment's own prompt. A GEPA run with a larger -B tries more candidates "
            f"(its proposals: prime gepa logs {result.run_id}).")


def takes_system_prompt(env_id: str) -> bool:
    """Whether the environment's `load_environment` has a `system_prompt` argument."""
    from prime_lab.envs import describe

    return any(arg.name == SYSTEM_PROMPT_ARG for arg in describe(env_id).args)


def prompt_route(env_id: str, through_args: bool) -> str:
    """Where the exported config puts the prompt, in words (the CLI and the workbench say it)."""
    if through_args:
        return f"{env_id} takes system_prompt: the best prompt is in [[env]].args (runs on Hosted Training too)"
    return (f"{env_id} takes no system_prompt argument: [[env]] system_prompt replaces each row's system message, "
            "as GEPA did (prime-lab only)")


def rl_config(result: GepaResult, *, through_args: bool, max_steps: int = 30) -> str:
    """The RL config's text (tomlkit, with comments saying where the prompt came from)."""
    doc = tomlkit.document()
    if result.best_is_seed:
        seed = f" (validation reward {result.seed_score:.3f} on {result.num_val} examples)" \
            if result.seed_score is not None else ""
        doc.add(tomlkit.comment(f"RL from GEPA run {result.run_id}: no candidate beat the seed prompt{seed}, so "
                                f"{result.env_id} starts from its own prompt."))
    else:
        scores = ""
        if result.best_score is not None and result.seed_score is not None:
            scores = (f" (validation reward {result.best_score:.3f}, seed prompt {result.seed_score:.3f}, on "
                      f"{result.num_val} examples)")
        doc.add(tomlkit.comment(f"RL from GEPA run {result.run_id}: {result.env_id} starts from its best prompt"
                                f"{scores}."))
    doc.add(tomlkit.comment(f"prime rl run @this.toml; then prime eval compare the seed prompt, `--system-prompt-file "
                            f"{result.run_id}` and `--adapter <rl run>`"))
    doc.add(tomlkit.nl())
    doc["model"] = result.model
    doc["max_steps"] = max_steps
    doc["batch_size"] = 16
    doc["rollouts_per_example"] = 4
    doc["learning_rate"] = 3e-4
    doc["max_async_level"] = 1
    sampling = tomlkit.table()
    sampling["max_tokens"] = int(result.sampling.get("max_tokens") or 64)
    sampling["temperature"] = float(result.sampling.get("temperature", 1.0))
    doc["sampling"] = sampling
    env = tomlkit.table()
    env["id"] = result.env_id
    prompt = tomlkit.string(result.best_prompt, multiline="\n" in result.best_prompt)
    if not through_args:
        env["system_prompt"] = prompt
        env["system_prompt"].comment("prime-lab only: replaces each row's system message, as GEPA tried it")
    if result.env_args or through_args:
        args = tomlkit.table()
        args.update(result.env_args)
        if through_args:
            args[SYSTEM_PROMPT_ARG] = prompt
        env["args"] = args
    envs = tomlkit.aot()
    envs.append(env)
    doc["env"] = envs
    evaluation = tomlkit.table()
    evaluation["interval"] = 0
    evaluation["num_examples"] = 20
    evaluation["eval_base_model"] = True
    evaluation.comment("the base model before step 1, the trained policy at the end")
    doc["eval"] = evaluation
    checkpoints = tomlkit.table()
    checkpoints["interval"] = 10
    doc["checkpoints"] = checkpoints
    return tomlkit.dumps(doc)
