"""What the engine tracks per request and per generated sequence, and when a sequence is finished.

Pure Python (no torch): a `Sequence` takes one sampled token at a time and decides whether it is done, by a stop
token (EOS or `stop_token_ids`), a stop string, or `max_tokens`. A request that asks for `prompt_logprobs` gets
them once, from its prefill (`PromptLogprobs`), and every one of its choices carries them.
"""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from prime_lab.inference.builtin.sampling import SamplingParams

if TYPE_CHECKING:
    import torch

    from prime_lab.inference.builtin.adapters import ServedModel
    from prime_lab.inference.builtin.prompts import PromptCodec

FinishReason = Literal["stop", "length"]


@dataclass
class GenerationRequest:
    """One prompt to complete `n` times with one model."""

    prompt_ids: list[int]
    n: int
    params: SamplingParams
    model: ServedModel
    prompt_logprobs: int | None = None  # top-k of each prompt position to report (0: the prompt token only)


@dataclass
class PromptLogprobs:
    """The model's raw distribution (temperature 1, no top-k or top-p) at each prompt position after the first:
    entry i is about prompt token i + 1 given the tokens before it."""

    logprobs: list[float]  # the prompt token's logprob
    ranks: list[int]  # its rank in the vocabulary (1: the most likely; ties count against it, as in vLLM)
    top: list[list[tuple[int, float]]]  # the k most likely (token id, logprob), most likely first

    def extend(self, logprobs: list[float], ranks: list[int], top: list[list[tuple[int, float]]]) -> None:
        self.logprobs += logprobs
        self.ranks += ranks
        self.top += top


@dataclass
class Choice:
    """One finished completion."""

    token_ids: list[int]
    text: str
    finish_reason: FinishReason
    stop_reason: str | int | None
    logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None
    prompt_logprobs: PromptLogprobs | None = None


@dataclass
class PendingRequest:
    """A request inside the engine: waiting, or with sequences in the running batch."""

    request: GenerationRequest
    future: Future[list[Choice]]
    generator: torch.Generator | None = None
    choices: list[Choice | None] = field(default_factory=list)
    arrived: float = field(default_factory=time.monotonic)
    prompt_logprobs: PromptLogprobs | None = None  # set by the prefill when the request asks for them

    def __post_init__(self) -> None:
        self.choices = [None] * self.request.n

    @property
    def abandoned(self) -> bool:
        """True once the request has its answer, or its future was cancelled (its HTTP client went away)."""
        return self.future.done()

    def finish_choice(self, index: int, choice: Choice) -> None:
        self.choices[index] = choice
        if all(c is not None for c in self.choices):
            with contextlib.suppress(InvalidStateError):  # cancelled meanwhile, from the server's event loop
                self.future.set_result([c for c in self.choices if c is not None])

    def fail(self, error: BaseException) -> None:
        """End the request with `error`, unless it has ended already (answered, failed or cancelled)."""
        with contextlib.suppress(InvalidStateError):
            self.future.set_exception(error)


class Sequence:
    """One choice of one request, token by token."""

    def __init__(self, pending: PendingRequest, index: int, codec: PromptCodec):
        self.pending = pending
        self.index = index
        self.params = pending.request.params
        self.codec = codec
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.top_logprobs: list[list[tuple[int, float]]] = []
        self.stop_token_ids = self.params.stop_token_ids | self.params.eos_token_ids
        self.finished = False
        self._text = ""
        self._stop_reason: str | int | None = None
        self._finish_reason: FinishReason = "length"

    @property
    def wants_banned_stops(self) -> bool:
        """True while `min_tokens` forbids the stop tokens."""
        return len(self.token_ids) < self.params.min_tokens

    def append(self, token_id: int, logprob: float, top: list[tuple[int, float]] | None) -> None:
        self.token_ids.append(token_id)
        if self.params.logprobs:
            self.logprobs.append(max(logprob, -9999.0))
            self.top_logprobs.append(top[: self.params.top_logprobs] if top else [])
        if token_id in self.stop_token_ids and len(self.token_ids) > self.params.min_tokens:
            self._finish("stop", None if token_id in self.params.eos_token_ids else token_id)
        elif self.params.stop and self._found_stop_string():
            self._finish("stop", self._stop_reason)
        elif len(self.token_ids) >= self.params.max_tokens:
            self._finish("length", None)

    def _found_stop_string(self) -> bool:
        text = self.codec.decode(self.token_ids, self.params.skip_special_tokens)
        window_start = max(0, len(self._text) - max(len(s) for s in self.params.stop))
        self._text = text
        found = [(text.find(s, window_start), s) for s in self.params.stop]
        found = [(at, s) for at, s in found if at >= 0]
        if not found:
            return False
        at, stop = min(found)
        self._text = text[: at + len(stop)] if self.params.include_stop_str_in_output else text[:at]
        self._stop_reason = stop
        return True

    def _finish(self, reason: FinishReason, stop_reason: str | int | None) -> None:
        self.finished = True
        self._finish_reason = reason
        self._stop_reason = stop_reason
        if not isinstance(stop_reason, str):
            self._text = self.codec.decode(self.token_ids, self.params.skip_special_tokens)
        self.pending.finish_choice(self.index, self.choice())

    def choice(self) -> Choice:
        return Choice(
            token_ids=list(self.token_ids),
            text=self._text,
            finish_reason=self._finish_reason,
            stop_reason=self._stop_reason,
            logprobs=list(self.logprobs) if self.params.logprobs else None,
            top_logprobs=list(self.top_logprobs) if self.params.logprobs else None,
            prompt_logprobs=self.pending.prompt_logprobs,
        )
