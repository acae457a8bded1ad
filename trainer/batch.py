"""Rollouts to training samples, and the batch file the orchestrator hands the trainer.

A *sample* is one token sequence the trainer scores: `input_ids` (prompt + completion), and per position a
`loss_mask` (1 where the model produced the token) and the sampler's logprob of that token (0 elsewhere), plus the
rollout's advantage. Multi-turn rollouts become samples by `trajectory_strategy`:

- `interleaved`: one sample per rollout, the whole conversation, with the environment's tokens masked out. It needs
  each turn's prompt to extend the previous turn's prompt + completion token for token; a rollout whose chat
  template re-renders history differently falls back to branching.
- `branching`: one sample per model turn (that turn's prompt and completion), each with the rollout's advantage.

The batch file (`rollouts/step_N.jsonl`) holds one JSON object per sample: the token fields above and what a person
browses (env, example_id, prompt and completion messages, reward, advantage, metrics, is_truncated). It is written
to a temporary name and renamed, so the trainer never reads half a batch.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prime_lab.envs import Rollout
from prime_lab.runs.atomic import write_text_atomic


@dataclass
class Sample:
    input_ids: list[int]
    loss_mask: list[int]
    sampler_logprobs: list[float]
    advantage: float
    # for people (the samples browser) and metrics
    env: str = ""
    example_id: Any = None
    reward: float = 0.0
    policy_version: int = 0
    is_truncated: bool = False
    prompt: list[dict[str, Any]] = field(default_factory=list)
    completion: list[dict[str, Any]] = field(default_factory=list)
    answer: Any = ""
    metrics: dict[str, float] = field(default_factory=dict)
    # on-policy distillation (`loss = "opd"`): the teacher's logprob of each token, aligned like sampler_logprobs
    teacher_logprobs: list[float] | None = None

    @property
    def num_loss_tokens(self) -> int:
        return sum(self.loss_mask)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Sample:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


class MissingTokensError(ValueError):
    """The sampler returned no token ids or logprobs (it does not speak the RL fields)."""


def _turn_tokens(rollout: Rollout) -> list[tuple[list[int], list[int], list[float]]]:
    out = []
    for i, turn in enumerate(rollout.turns):
        if turn.prompt_token_ids is None or turn.completion_token_ids is None or turn.completion_logprobs is None:
            raise MissingTokensError(
                f"turn {i} of a rollout came back without prompt_token_ids, token_ids or logprobs: the sampler must "
                "return vLLM's RL fields (return_token_ids, logprobs); the built-in server and vLLM do")
        if len(turn.completion_logprobs) != len(turn.completion_token_ids):
            raise MissingTokensError(f"turn {i}: {len(turn.completion_token_ids)} token ids but "
                                     f"{len(turn.completion_logprobs)} logprobs")
        out.append((list(turn.prompt_token_ids), list(turn.completion_token_ids),
                    [float(x) for x in turn.completion_logprobs]))
    return out


def rollout_samples(rollout: Rollout, advantage: float, strategy: str = "interleaved", *,
                    policy_version: int = 0, env: str | None = None) -> list[Sample]:
    """The training samples of one scored rollout (none when it has no model turn)."""
    turns = _turn_tokens(rollout)
    if not turns:
        return []
    meta = dict(env=env or rollout.task, example_id=rollout.example_id, reward=rollout.reward,
                policy_version=policy_version, is_truncated=rollout.is_truncated, prompt=rollout.prompt,
                completion=rollout.completion, answer=rollout.answer, metrics=dict(rollout.metrics))
    if strategy == "interleaved":
        ids, mask, lps = list(turns[0][0]), [0] * len(turns[0][0]), [0.0] * len(turns[0][0])
        ok = True
        for k, (prompt, completion, logprobs) in enumerate(turns):
            if k > 0:
                if prompt[: len(ids)] != ids:
                    ok = False
                    break
                env_tokens = prompt[len(ids):]
                ids += env_tokens
                mask += [0] * len(env_tokens)
                lps += [0.0] * len(env_tokens)
            ids += completion
            mask += [1] * len(completion)
            lps += logprobs
        if ok:
            return [Sample(ids, mask, lps, advantage, **meta)]  # type: ignore[arg-type]
    return [Sample(prompt + completion, [0] * len(prompt) + [1] * len(completion),
                   [0.0] * len(prompt) + logprobs, advantage, **meta)  # type: ignore[arg-type]
            for prompt, completion, logprobs in turns]


def truncate(sample: Sample, max_seq_len: int | None) -> Sample:
    """Cut a sample to `max_seq_len` tokens (the end of the completion goes)."""
    if max_seq_len is None or len(sample.input_ids) <= max_seq_len:
        return sample
    n = max_seq_len
    return Sample(**{**sample.__dict__, "input_ids": sample.input_ids[:n], "loss_mask": sample.loss_mask[:n],
                     "sampler_logprobs": sample.sampler_logprobs[:n], "is_truncated": True,
                     "teacher_logprobs": None if sample.teacher_logprobs is None else sample.teacher_logprobs[:n]})


def batch_path(rollouts_dir: Path, step: int) -> Path:
    return rollouts_dir / f"step_{step}.jsonl"


def write_batch(rollouts_dir: Path, step: int, samples: list[Sample]) -> Path:
    """Write step `step`'s samples atomically (temp file + rename)."""
    return write_text_atomic(batch_path(rollouts_dir, step),
                             "".join(json.dumps(sample.to_json(), default=str) + "\n" for sample in samples))


def read_batch(path: Path) -> list[Sample]:
    return [Sample.from_json(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
