"""A decode step of fixed shapes, replayed as a CUDA graph: one launch per step instead of thousands.

A decode step of a small model at batch 64 is launch-bound: a 28-layer transformers forward issues thousands of
small kernels, and their Python and launches take ~75 ms on an H100 where the GPU needs a few. Captured once as a
CUDA graph and replayed, the step costs what the GPU takes. A graph replays fixed shapes at fixed addresses, so the
running batch decodes from static buffers (`StaticDecoder`, kept across batches):

- rows: the batch is padded up to a bucket (1, 2, 4, ... up to `max_batch_rows`); padding rows decode garbage that
  nobody reads. Finished rows leave by moving the last rows into their holes (only those rows are copied).
- keys and values: per layer one `[rows, kv_heads, capacity, head_dim]` buffer, zero-filled (a masked column must
  hold finite numbers: softmax gives it weight 0, and 0 x NaN would still be NaN). Rows are left-padded as in the
  eager cache: every row writes the same column, `write_index` (a device tensor the graph reads, not a Python int).
  Capacity is a power of two; when it is full, columns that are padding for every row are dropped on the left,
  else the buffers double (the graphs are then captured again).
- mask `[rows, capacity]` over the whole capacity; the step itself marks the column it writes, advances the
  positions and the write index, so between steps the host only copies in the sampled tokens.

A graph is captured for (model, bucket) on the bucket's second step (its first runs uncaptured and warms up what a
capture needs); while a larger bucket's graph exists, a smaller bucket is captured only once it has been needed for
`CAPTURE_SMALLER_AFTER` steps (a padded replay costs about the same as a small one on a weight-bound decode, and a
capture about two eager steps). A model replaced in place (an adapter's new version) is a new module at new
addresses: its graphs are captured anew. Full weights copied into the model in place keep the graphs valid.
A capture holds the server's `device_lock` (adapters.ModelRegistry merges a new adapter under it): CUDA work from
another thread while a graph records can invalidate the capture, and a random draw there (a LoRA layer's
initialisation) trips the default generator's capture mode. A step that finds the lock taken runs uncaptured.

On the CPU nothing is captured: the same fixed-shape step runs as is (what the tests compare against the eager
decode). Models this cannot serve decode eagerly (`unsupported_reason`): sliding-window attention (the mask here is
the full one), attention other than SDPA (the mask is boolean), and Mixture-of-Experts layers (their routing reads
the chosen experts back to the host, which a capture forbids).

Importing this module imports torch and transformers; the engine imports it when the server starts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Any

import torch
from transformers.cache_utils import Cache

from prime_lab.inference.builtin.adapters import ServedModel
from prime_lab.inference.builtin.decode_batch import DecodeBatch, banned_stop_tokens, live_rows
from prime_lab.inference.builtin.kv_cache import pad_left
from prime_lab.inference.builtin.sampling import RowSampling
from prime_lab.inference.builtin.sequences import Sequence

log = logging.getLogger(__name__)

MIN_CAPACITY = 256  # key/value columns of a fresh buffer (a power of two)
CAPTURE_SMALLER_AFTER = 16  # steps a smaller bucket must be needed before it gets its own graph
SDPA_ATTENTIONS = ("sdpa", "prime_grouped_decode_sdpa")


def unsupported_reason(config: Any) -> str | None:
    """Why a model with this config must decode eagerly, or None when the fixed-shape decode serves it."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if any(getattr(text, name, None) for name in ("num_experts", "num_local_experts", "n_routed_experts")):
        return "its Mixture-of-Experts routing syncs with the host"
    layer_types = getattr(text, "layer_types", None)
    if layer_types is not None:
        if any(kind != "full_attention" for kind in layer_types):
            return "it has layers that are not full attention (sliding window, linear)"
    elif getattr(text, "sliding_window", None) and getattr(text, "use_sliding_window", True):
        return "it uses sliding-window attention"
    attention = getattr(text, "_attn_implementation", None) or getattr(config, "_attn_implementation", None)
    if attention not in SDPA_ATTENTIONS:
        return f"its attention is {attention!r}, not SDPA"
    return None


def row_buckets(max_rows: int) -> list[int]:
    """Batch sizes a graph is captured for: powers of two below `max_rows`, and `max_rows`."""
    buckets = [1]
    while buckets[-1] * 2 < max_rows:
        buckets.append(buckets[-1] * 2)
    if buckets[-1] != max_rows:
        buckets.append(max_rows)
    return buckets


def _capacity_for(columns: int) -> int:
    capacity = MIN_CAPACITY
    while capacity < columns:
        capacity *= 2
    return capacity


class StaticKVCache(Cache):
    """What the model sees of the static buffers during a step: `update` writes a layer's new keys and values at
    `write_index` and hands back the whole capacity of the step's rows (the mask hides what is not written yet)."""

    def __init__(self, decoder: StaticDecoder) -> None:
        super().__init__(layers=[])
        self.decoder = decoder

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rows = key_states.shape[0]
        keys = self.decoder.keys[layer_idx][:rows]
        values = self.decoder.values[layer_idx][:rows]
        keys.index_copy_(2, self.decoder.write_index, key_states)
        values.index_copy_(2, self.decoder.write_index, value_states)
        return keys, values

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.decoder.length


class _Graph:
    def __init__(self, graph: Any, logits: torch.Tensor) -> None:
        self.graph = graph
        self.logits = logits


class StaticDecoder:
    """The static buffers and captured graphs of the fixed-shape decode; one per engine, reused batch after batch
    (one batch decodes at a time). `rows_used` rows hold the running batch, `length` columns its history."""

    def __init__(self, device: torch.device, max_rows: int, device_lock: threading.Lock | None = None) -> None:
        self.device = device
        self.device_lock = device_lock or threading.Lock()
        self.buckets = row_buckets(max_rows)
        self.capture = device.type == "cuda"
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        # allocated on the device by the first batch's `load` (building a decoder touches no device)
        self.mask = torch.zeros((0, 0), dtype=torch.bool, device="meta")
        self.tokens = torch.zeros((0, 1), dtype=torch.long, device="meta")
        self.positions = torch.zeros((0, 1), dtype=torch.long, device="meta")
        self.write_index = torch.zeros(1, dtype=torch.long, device="meta")
        self.cache = StaticKVCache(self)
        self.rows_used = 0
        self.length = 0
        self._graphs: dict[int, _Graph] = {}
        self._graph_model_key: int | None = None
        self._wanted: Counter[int] = Counter()
        self._pool: Any = None
        self._stream: Any = None
        # what was done, for logs and the benchmark
        self.captures = 0
        self.capture_seconds = 0.0
        self.replays = 0
        self.uncaptured_steps = 0

    @property
    def rows(self) -> int:
        return self.mask.shape[0]

    @property
    def capacity(self) -> int:
        return self.mask.shape[1]

    def bucket_for(self, rows: int) -> int:
        return next(b for b in self.buckets if b >= rows)

    # --- what the batch holds -------------------------------------------------------------------------------

    def load(
        self,
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
        mask: torch.Tensor,
        positions: torch.Tensor,
        tokens: torch.Tensor,
    ) -> None:
        """Take a batch's whole state: per layer keys/values [n, H, L, D], mask [n, L], next positions and last
        tokens [n]. The tensors must not be views of these buffers (they are written over)."""
        n, length = mask.shape
        self._reserve(self.bucket_for(n), length + 1, keys, values, keep=False)
        for buffer, new in zip(self.keys + self.values, keys + values, strict=True):
            buffer[:n, :, :length] = new
            buffer[:n, :, length:] = 0  # no stale non-finite number under the mask (0 x NaN is NaN)
        self.mask[:n, :length] = mask.bool()
        self.mask[:n, length:] = False
        self.positions[:n, 0] = positions
        self.tokens[:n, 0] = tokens
        self.rows_used, self.length = n, length
        self.write_index.fill_(length)

    def state(self) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor]:
        """Views of the running batch's keys, values, mask, next positions and last tokens (as `load` takes them)."""
        n, length = self.rows_used, self.length
        return (
            [k[:n, :, :length] for k in self.keys],
            [v[:n, :, :length] for v in self.values],
            self.mask[:n, :length],
            self.positions[:n, 0],
            self.tokens[:n, 0],
        )

    def move_rows(self, sources: list[int], targets: list[int], rows_used: int) -> None:
        """Copy rows `sources` onto rows `targets` (disjoint) and keep the first `rows_used`."""
        if sources:
            src = torch.tensor(sources, device=self.device)
            dst = torch.tensor(targets, device=self.device)
            for buffer in (*self.keys, *self.values, self.mask, self.positions, self.tokens):
                buffer.index_copy_(0, dst, buffer.index_select(0, src))
        self.rows_used = rows_used

    def make_room(self) -> None:
        """Before a step: a free column to write. Drops columns that are padding for every row, else grows."""
        if self.length < self.capacity:
            return
        used = self.mask[: self.rows_used, : self.length].any(dim=0).nonzero()
        drop = int(used[0]) if len(used) else self.length
        if drop > 0:
            self._shift_left(drop)
        else:
            self._reserve(self.rows, self.length + 1, self.keys, self.values, keep=True)

    def _shift_left(self, drop: int) -> None:
        n, length = self.rows_used, self.length
        for buffer in (*self.keys, *self.values):
            buffer[:n, :, : length - drop] = buffer[:n, :, drop:length].clone()
        self.mask[:n, : length - drop] = self.mask[:n, drop:length].clone()
        self.mask[:n, length - drop :] = False
        self.length = length - drop
        self.write_index.fill_(self.length)

    def _reserve(
        self, rows: int, columns: int, keys: list[torch.Tensor], values: list[torch.Tensor], *, keep: bool
    ) -> None:
        """Buffers for at least `rows` x `columns`, shaped per layer like `keys`/`values` (heads, head size,
        dtype); `keep` copies the running batch over when they are reallocated. New buffers drop the graphs."""
        same_layout = len(self.keys) == len(keys) and all(
            (a.shape[1], a.shape[3], a.dtype) == (b.shape[1], b.shape[3], b.dtype)
            for a, b in zip(self.keys + self.values, keys + values, strict=True)
        )
        if same_layout and rows <= self.rows and columns <= self.capacity:
            return
        rows = max(rows, self.rows) if same_layout else rows
        capacity = _capacity_for(max(columns, self.capacity if same_layout else 0))
        old = (self.keys, self.values, self.mask, self.positions, self.tokens)
        self.keys = [k.new_zeros((rows, k.shape[1], capacity, k.shape[3])) for k in keys]
        self.values = [v.new_zeros((rows, v.shape[1], capacity, v.shape[3])) for v in values]
        self.mask = torch.zeros((rows, capacity), dtype=torch.bool, device=self.device)
        self.positions = torch.zeros((rows, 1), dtype=torch.long, device=self.device)
        self.tokens = torch.zeros((rows, 1), dtype=torch.long, device=self.device)
        if self.write_index.is_meta:
            self.write_index = torch.zeros(1, dtype=torch.long, device=self.device)
        if keep:
            n, length = self.rows_used, self.length
            for buffer, previous in zip(self.keys + self.values, old[0] + old[1], strict=True):
                buffer[:n, :, :length] = previous[:n, :, :length]
            self.mask[:n, :length] = old[2][:n, :length]
            self.positions[:n] = old[3][:n]
            self.tokens[:n] = old[4][:n]
        self._drop_graphs()
        log.info("static decode buffers: %d rows x %d columns, %d layers", rows, capacity, len(self.keys))

    def _drop_graphs(self) -> None:
        self._graphs.clear()
        self._wanted.clear()

    # --- a step -------------------------------------------------------------------------------------------------

    def step(self, model: ServedModel) -> torch.Tensor:
        """One decode step of the running batch through `model`: float32 logits [rows_used, V]."""
        self.make_room()
        if model.key != self._graph_model_key:
            self._drop_graphs()
            self._graph_model_key = model.key
        wanted = self.bucket_for(self.rows_used)
        graph = self._graphs.get(wanted)
        if graph is None and self.capture:
            self._wanted[wanted] += 1
            larger = [b for b in self._graphs if b > wanted]
            if self._wanted[wanted] >= (CAPTURE_SMALLER_AFTER if larger else 2):
                graph = self._capture(model.module, wanted)
            elif larger:
                graph = self._graphs[min(larger)]
        if graph is not None:
            graph.graph.replay()
            self.replays += 1
            logits = graph.logits
        else:
            logits = self._uncaptured(model.module, wanted)
            self.uncaptured_steps += 1
        self.length += 1
        return logits[: self.rows_used]

    def _forward(self, module: Any, rows: int) -> torch.Tensor:
        """The step on the first `rows` rows; everything it changes is in the static buffers (capturable)."""
        self.mask[:rows].index_fill_(1, self.write_index, True)
        output = module(
            input_ids=self.tokens[:rows],
            position_ids=self.positions[:rows],
            attention_mask=self.mask[:rows, None, None, :],  # 4-D: transformers uses it as given
            past_key_values=self.cache,
            use_cache=True,
        )
        logits = output.logits[:, -1].float()
        self.positions[:rows].add_(1)
        limit = getattr(module.config.get_text_config(), "max_position_embeddings", None)
        if limit:  # padding rows count on forever; a learned position table must not be indexed past its end
            self.positions[:rows].clamp_(max=int(limit) - 1)
        self.write_index.add_(1)
        return logits

    def _uncaptured(self, module: Any, rows: int) -> torch.Tensor:
        """The step run as is. Where graphs are captured it runs on the capture stream: a bucket's first step is
        then the warm-up its capture needs (cuBLAS workspaces and the like are set up per stream)."""
        if not self.capture:
            return self._forward(module, rows)
        stream, current = self._capture_stream(), torch.cuda.current_stream(self.device)
        stream.wait_stream(current)
        with torch.cuda.stream(stream):
            logits = self._forward(module, rows)
        current.wait_stream(stream)
        return logits

    def _capture_stream(self) -> Any:
        if self._stream is None:
            self._pool = torch.cuda.graph_pool_handle()  # one memory pool for all graphs: replayed one at a time
            self._stream = torch.cuda.Stream(self.device)
        return self._stream

    def _capture(self, module: Any, rows: int) -> _Graph | None:
        """Record the step for `rows` rows as a CUDA graph (nothing runs: the caller replays it); None when the
        model cannot be captured (logged once; the decode stays uncaptured)."""
        if not self.device_lock.acquire(blocking=False):  # an adapter is being merged: capture at a later step
            return self._graphs.get(min((b for b in self._graphs if b > rows), default=-1))
        try:
            return self._capture_alone(module, rows)
        finally:
            self.device_lock.release()

    def _capture_alone(self, module: Any, rows: int) -> _Graph | None:
        start = time.perf_counter()
        stream, current = self._capture_stream(), torch.cuda.current_stream(self.device)
        graph = torch.cuda.CUDAGraph()
        stream.wait_stream(current)
        try:
            with torch.cuda.stream(stream):
                graph.capture_begin(pool=self._pool, capture_error_mode="thread_local")
                try:
                    logits = self._forward(module, rows)
                finally:
                    graph.capture_end()
        except Exception:
            log.warning("could not capture the decode step as a CUDA graph; decoding uncaptured", exc_info=True)
            self.capture = False
            return None
        finally:
            current.wait_stream(stream)
        captured = _Graph(graph, logits)
        self._graphs[rows] = captured
        seconds = time.perf_counter() - start
        self.captures += 1
        self.capture_seconds += seconds
        log.info("captured the decode step for %d rows in %.2f s", rows, seconds)
        return captured


class GraphDecodeBatch:
    """The running batch on a `StaticDecoder`: what `DecodeBatch` is to the eager decode, with the same
    `join`/`drop_finished`/`banned_tokens` for the engine. Row i of the decoder is `sequences[i]`."""

    def __init__(self, decoder: StaticDecoder, first: DecodeBatch) -> None:
        self.decoder = decoder
        self.model: ServedModel = first.model
        self.sequences: list[Sequence] = list(first.sequences)
        self.sampling: RowSampling = first.sampling
        decoder.load(*_batch_state(first))

    def __len__(self) -> int:
        return len(self.sequences)

    @property
    def last_tokens(self) -> torch.Tensor:
        return self.decoder.tokens[: len(self), 0]

    @last_tokens.setter
    def last_tokens(self, tokens: torch.Tensor) -> None:
        self.decoder.tokens[: len(tokens), 0] = tokens

    def banned_tokens(self, vocab_size: int) -> torch.Tensor | None:
        return banned_stop_tokens(self.sequences, vocab_size, self.decoder.device)

    def step(self) -> torch.Tensor:
        return self.decoder.step(self.model)

    def join(self, other: DecodeBatch) -> None:
        """Append `other`'s rows (same model), left-padding the shorter history."""
        mine, theirs = self.decoder.state(), _batch_state(other)
        length = max(mine[2].shape[1], theirs[2].shape[1])
        merged = (
            [_stack_rows(a, b, length, 2) for a, b in zip(mine[0], theirs[0], strict=True)],
            [_stack_rows(a, b, length, 2) for a, b in zip(mine[1], theirs[1], strict=True)],
            _stack_rows(mine[2].bool(), theirs[2].bool(), length, 1),
            torch.cat([mine[3], theirs[3]]),
            torch.cat([mine[4], theirs[4]]),
        )
        self.decoder.load(*merged)
        self.sequences = self.sequences + other.sequences
        self.sampling = DecodeBatch.row_sampling(self.sequences, self.decoder.device)

    def drop_finished(self) -> bool:
        """Remove finished or abandoned rows (the last kept rows move into the holes); False when none are left."""
        keep = live_rows(self.sequences)
        if len(keep) == len(self.sequences):
            return True
        if not keep:
            self.sequences = []
            self.decoder.rows_used = 0
            return False
        count = len(keep)
        kept = set(keep)
        holes = [i for i in range(count) if i not in kept]
        movers = [i for i in keep if i >= count]
        self.decoder.move_rows(movers, holes, count)
        order = list(range(len(self.sequences)))
        for hole, mover in zip(holes, movers, strict=True):
            order[hole] = mover
        self.sequences = [self.sequences[i] for i in order[:count]]
        self.sampling = DecodeBatch.row_sampling(self.sequences, self.decoder.device)
        return True


def _batch_state(
    batch: DecodeBatch,
) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor]:
    layers = batch.cache.growable_layers
    keys = [layer.keys for layer in layers]
    values = [layer.values for layer in layers]
    assert all(k is not None for k in keys) and all(v is not None for v in values), "a prefilled cache"
    return keys, values, batch.attention_mask, batch.next_positions, batch.last_tokens  # type: ignore[return-value]


def _stack_rows(first: torch.Tensor, second: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    """`first`'s rows above `second`'s, each left-padded with zeros to `length` along `dim`."""
    return torch.cat([pad_left(first, length, dim), pad_left(second, length, dim)])
