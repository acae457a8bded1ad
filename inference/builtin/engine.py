"""The generation engine: a request queue feeding one batched decode loop on its own thread.

Requests from the HTTP handlers go into a queue. The engine thread admits waiting requests for the model of the
running batch (prefilling their prompts together, once per prompt: the `n` choices of a request share it), joins
them to the batch, and decodes one token for every row per forward pass. Finished rows leave after each step and
their requests are answered. A request whose future is cancelled (its HTTP client went away: app.py) is dropped: its
rows leave the batch before the next forward pass, their KV cache with them, and a waiting one is never prefilled.
A batch serves one model (the base or one adapter); requests for another model wait until the running batch drains,
and are then served in arrival order. Models resolve through `resolve` before every step: an adapter replaced in
place is the same model to the engine, so the running batch moves to the new weights and requests for it join the
batch instead of waiting. `between_steps(fn)` runs `fn` on the engine thread between two forward passes (new full
weights copied into the model: the running batch continues on them).

A request that asks for `prompt_logprobs` is prefilled on its own, `prompt_chunk_size` positions at a time into its
KV cache: each chunk's logits give the raw logprobs of the prompt tokens they predict (never a [prompt, vocabulary]
tensor), the last position's the first sampled token, and the request then joins the running batch like any other.

With `graph_decode` the running batch decodes through fixed-shape buffers, its step replayed as a CUDA graph on a GPU
(graph_decode.py); prefill stays eager. A model that decode cannot serve (sliding windows, MoE) decodes eagerly.

Importing this module imports torch; `server.py` does so when a server is built.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import torch

from prime_lab.inference.builtin.adapters import ServedModel
from prime_lab.inference.builtin.decode_batch import DecodeBatch
from prime_lab.inference.builtin.errors import EngineStoppedError
from prime_lab.inference.builtin.graph_decode import GraphDecodeBatch, StaticDecoder, unsupported_reason
from prime_lab.inference.builtin.kv_cache import BatchKVCache
from prime_lab.inference.builtin.prompts import PromptCodec
from prime_lab.inference.builtin.sampling import SampledTokens, position_logprobs, sample
from prime_lab.inference.builtin.sequences import (
    Choice,
    GenerationRequest,
    PendingRequest,
    PromptLogprobs,
    Sequence,
)

log = logging.getLogger(__name__)

_STOP = object()


class _Call:
    """Work for the engine thread between two forward passes, and the future of its result."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.future: Future[Any] = Future()

    def run(self) -> None:
        try:
            self.future.set_result(self.fn())
        except Exception as error:
            self.future.set_exception(error)


class GenerationEngine:
    """Batched generation for one base model and its adapters; thread-safe `submit`."""

    def __init__(
        self,
        codec: PromptCodec,
        eos_token_ids: frozenset[int],
        vocab_size: int,
        device: torch.device,
        *,
        max_batch_rows: int = 64,
        max_prefill_tokens: int = 8192,
        prompt_chunk_size: int = 1024,
        gather_window_s: float = 0.02,
        resolve: Callable[[ServedModel], ServedModel] | None = None,
        graph_decode: bool = False,
        device_lock: threading.Lock | None = None,
    ) -> None:
        self.codec = codec
        self.eos_token_ids = eos_token_ids
        self.vocab_size = vocab_size
        self.device = device
        self.max_batch_rows = max_batch_rows
        self.max_prefill_tokens = max_prefill_tokens
        self.prompt_chunk_size = prompt_chunk_size
        self.gather_window_s = gather_window_s
        self.resolve: Callable[[ServedModel], ServedModel] = resolve or (lambda model: model)
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._waiting: deque[PendingRequest] = deque()
        self._batch: DecodeBatch | GraphDecodeBatch | None = None
        self.decoder = StaticDecoder(device, max_batch_rows, device_lock) if graph_decode else None
        self._eager_models: set[str] = set()  # names logged as decoding eagerly
        self.decode_steps = 0
        self.generation_tokens: Counter[str] = Counter()  # model name -> tokens sampled for it (prefill included)
        self.decode_seconds = 0.0  # the engine thread's time in decode steps (forward, sampling, bookkeeping)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="generation-engine", daemon=True)

    def start(self) -> GenerationEngine:
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._inbox.put(_STOP)
        self._thread.join(timeout)

    def submit(self, request: GenerationRequest) -> Future[list[Choice]]:
        """Queue a request; the future resolves to its `n` choices (or to the error that ended it)."""
        future: Future[list[Choice]] = Future()
        if self._stopped.is_set():
            future.set_exception(EngineStoppedError("the server is shutting down"))
            return future
        generator = None
        if request.params.seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(request.params.seed)
        self._inbox.put(PendingRequest(request, future, generator))
        return future

    def between_steps(self, fn: Callable[[], Any]) -> Future[Any]:
        """Run `fn` on the engine thread before its next forward pass (no forward pass runs meanwhile); the future
        resolves to its result."""
        call = _Call(fn)
        if self._stopped.is_set():
            call.future.set_exception(EngineStoppedError("the server is shutting down"))
        else:
            self._inbox.put(call)
        return call.future

    # --- the engine thread ---------------------------------------------------------------------------------

    def _run(self) -> None:
        with torch.inference_mode():
            while self._collect(block=self._batch is None and not self._waiting):
                try:
                    if self._batch is not None:
                        self._batch.model = self.resolve(self._batch.model)
                        if not self._batch.drop_finished():  # rows whose client went away since the last step
                            self._batch = None
                    self._admit()
                    if self._batch is not None:
                        start = time.perf_counter()
                        self._decode_step(self._batch)
                        self.decode_seconds += time.perf_counter() - start
                        self.decode_steps += 1
                except Exception as error:  # a failed forward pass must not take the server down
                    log.exception("generation failed")
                    self._fail_batch(error)
        self._stopped.set()
        self._fail_all(EngineStoppedError("the server is shutting down"))

    def _collect(self, block: bool) -> bool:
        """Move what arrived into the waiting line; False once asked to stop.

        When idle, wait for the first request, then a moment (`gather_window_s`) for the ones sent with it, so
        that concurrent requests start in one prefill instead of one by one.
        """
        item = self._inbox.get() if block else self._next_nowait()
        deadline = time.monotonic() + self.gather_window_s if block else 0.0
        while item is not None:
            if item is _STOP:
                return False
            if isinstance(item, _Call):
                item.run()
            else:
                self._waiting.append(item)
            item = self._next_nowait()
            if item is None and time.monotonic() < deadline:
                item = self._next_until(deadline)
        return True

    def _next_until(self, deadline: float) -> Any:
        try:
            return self._inbox.get(timeout=max(deadline - time.monotonic(), 0.0))
        except queue.Empty:
            return None

    def _next_nowait(self) -> Any:
        try:
            return self._inbox.get_nowait()
        except queue.Empty:
            return None

    def _admit(self) -> None:
        """Prefill waiting requests for the running batch's model (or the oldest one's) and join them."""
        while self._waiting and self._waiting[0].abandoned:
            self._waiting.popleft()
        if not self._waiting:
            return
        batch = self._batch
        model = batch.model if batch is not None else self.resolve(self._waiting[0].request.model)
        if batch is not None and any(self.resolve(p.request.model).key != model.key for p in self._waiting):
            return  # another model is waiting: let this batch drain, then switch
        room = self.max_batch_rows - (len(batch) if batch is not None else 0)
        admitted: list[PendingRequest] = []
        for pending in list(self._waiting):
            if self.resolve(pending.request.model).key != model.key:
                continue
            if pending.request.n > room and (admitted or batch is not None):
                break
            self._waiting.remove(pending)
            if not pending.abandoned:
                admitted.append(pending)
                room -= pending.request.n
        scored = [[p] for p in admitted if p.request.prompt_logprobs is not None]
        plain = [p for p in admitted if p.request.prompt_logprobs is None]
        for chunk in scored + self._prefill_chunks(plain):
            try:
                joined = self._prefill(model, chunk)
            except Exception as error:
                log.exception("prefill failed")
                for pending in chunk:
                    pending.fail(error)
                continue
            if joined is None:
                continue
            try:
                if self._batch is None:
                    self._batch = self._running_batch(joined)
                else:
                    self._batch.join(joined)
            except Exception as error:  # out of memory for the grown batch: its rows and the new ones fail
                log.exception("joining the running batch failed")
                for pending in chunk:
                    pending.fail(error)
                self._fail_batch(error)

    def _running_batch(self, batch: DecodeBatch) -> DecodeBatch | GraphDecodeBatch:
        """`batch` as the running batch: on the static decoder when there is one and the model allows it."""
        if self.decoder is None:
            return batch
        reason = unsupported_reason(batch.model.module.config)
        if reason is not None:
            if batch.model.name not in self._eager_models:
                log.info("%s decodes eagerly: %s", batch.model.name, reason)
                self._eager_models.add(batch.model.name)
            return batch
        return GraphDecodeBatch(self.decoder, batch)

    def _prefill_chunks(self, pendings: list[PendingRequest]) -> list[list[PendingRequest]]:
        chunks: list[list[PendingRequest]] = []
        current: list[PendingRequest] = []
        longest = 0
        for pending in pendings:
            length = max(longest, len(pending.request.prompt_ids))
            if current and length * (len(current) + 1) > self.max_prefill_tokens:
                chunks.append(current)
                current, length = [], len(pending.request.prompt_ids)
            current.append(pending)
            longest = length
        if current:
            chunks.append(current)
        return chunks

    def _prefill(self, model: ServedModel, pendings: list[PendingRequest]) -> DecodeBatch | None:
        """The prompts through the model; the first token of every choice is sampled here."""
        if len(pendings) == 1 and pendings[0].request.prompt_logprobs is not None:
            cache, attention_mask, last_logits = self._scored_prompt_forward(model, pendings[0])
        else:
            cache, attention_mask, last_logits = self._prompt_forward(model, pendings)
        counts = torch.tensor([p.request.n for p in pendings], device=self.device)
        rows = torch.repeat_interleave(torch.arange(len(pendings), device=self.device), counts)
        cache.select_rows(rows)
        sequences = [Sequence(pending, index, self.codec) for pending in pendings for index in range(pending.request.n)]
        batch = DecodeBatch(
            model=model,
            sequences=sequences,
            cache=cache,
            attention_mask=attention_mask[rows],
            next_positions=attention_mask[rows].sum(dim=1),
            last_tokens=torch.zeros(len(sequences), dtype=torch.long, device=self.device),
            sampling=DecodeBatch.row_sampling(sequences, self.device),
        )
        logits = last_logits.float()[rows]
        self._take_tokens(batch, sample(logits, batch.sampling, batch.banned_tokens(self.vocab_size)))
        return batch if batch.drop_finished() else None

    def _prompt_forward(
        self, model: ServedModel, pendings: list[PendingRequest]
    ) -> tuple[BatchKVCache, torch.Tensor, torch.Tensor]:
        """One forward pass over the prompts (left-padded): their KV cache, attention mask and last logits."""
        prompts = [p.request.prompt_ids for p in pendings]
        length = max(len(p) for p in prompts)
        input_ids = torch.zeros((len(prompts), length), dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), length), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, length - len(prompt) :] = torch.tensor(prompt)
            attention_mask[row, length - len(prompt) :] = 1
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        positions = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
        cache = BatchKVCache()
        output = model.module(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return cache, attention_mask, output.logits[:, -1]

    def _scored_prompt_forward(
        self, model: ServedModel, pending: PendingRequest
    ) -> tuple[BatchKVCache, torch.Tensor, torch.Tensor]:
        """One prompt through the model `prompt_chunk_size` positions at a time into one KV cache; each chunk's
        logits give the raw logprobs of the prompt tokens they predict (`pending.prompt_logprobs`). Returns what
        `_prompt_forward` returns."""
        prompt = pending.request.prompt_ids
        top_k = pending.request.prompt_logprobs or 0
        targets = torch.tensor(prompt[1:], dtype=torch.long, device=self.device)
        cache = BatchKVCache()
        scores = PromptLogprobs([], [], [])
        last_logits = None
        for start in range(0, len(prompt), self.prompt_chunk_size):
            end = min(start + self.prompt_chunk_size, len(prompt))
            output = model.module(
                input_ids=torch.tensor([prompt[start:end]], dtype=torch.long, device=self.device),
                attention_mask=torch.ones((1, end), dtype=torch.long, device=self.device),
                position_ids=torch.arange(start, end, device=self.device).unsqueeze(0),
                past_key_values=cache,
                use_cache=True,
            )
            logits = output.logits[0]
            chunk_targets = targets[start:end]  # position i predicts prompt token i + 1: the last one predicts none
            scores.extend(*position_logprobs(logits[: len(chunk_targets)], chunk_targets, top_k))
            last_logits = logits[-1:].clone()  # not a view that would keep the chunk's logits
            del output, logits
        assert last_logits is not None, "the prompt is not empty"
        pending.prompt_logprobs = scores
        return cache, torch.ones((1, len(prompt)), dtype=torch.long, device=self.device), last_logits

    def _decode_step(self, batch: DecodeBatch | GraphDecodeBatch) -> None:
        if isinstance(batch, GraphDecodeBatch):
            logits = batch.step()
        else:
            ones = batch.attention_mask.new_ones((len(batch), 1))
            attention_mask = torch.cat([batch.attention_mask, ones], dim=1)
            output = batch.model.module(
                input_ids=batch.last_tokens.unsqueeze(1),
                attention_mask=attention_mask,
                position_ids=batch.next_positions.unsqueeze(1),
                past_key_values=batch.cache,
                use_cache=True,
            )
            batch.attention_mask = attention_mask
            batch.next_positions = batch.next_positions + 1
            logits = output.logits[:, -1].float()
        self._take_tokens(batch, sample(logits, batch.sampling, batch.banned_tokens(self.vocab_size)))
        if not batch.drop_finished():
            self._batch = None

    def _take_tokens(self, batch: DecodeBatch | GraphDecodeBatch, sampled: SampledTokens) -> None:
        batch.last_tokens = sampled.tokens
        self.generation_tokens[batch.model.name] += len(batch)
        tokens = sampled.tokens.tolist()
        logprobs = sampled.logprobs.tolist()
        tops: list[list[tuple[int, float]]] | None = None
        if sampled.top_ids is not None and sampled.top_logprobs is not None:
            tops = [
                list(zip(ids, values, strict=True))
                for ids, values in zip(sampled.top_ids.tolist(), sampled.top_logprobs.tolist(), strict=True)
            ]
        for row, sequence in enumerate(batch.sequences):
            sequence.append(tokens[row], logprobs[row], tops[row] if tops is not None else None)

    def _fail_batch(self, error: BaseException) -> None:
        if self._batch is not None:
            for sequence in self._batch.sequences:
                sequence.pending.fail(error)
        self._batch = None

    def _fail_all(self, error: BaseException) -> None:
        self._fail_batch(error)
        while True:
            item = self._next_nowait()
            if item is None:
                break
            if isinstance(item, _Call):
                item.future.set_exception(error)
            elif item is not _STOP:
                self._waiting.append(item)
        for pending in self._waiting:
            pending.fail(error)
        self._waiting.clear()
