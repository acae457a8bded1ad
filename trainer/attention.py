"""How a packed row attends, and the model inputs that say so.

A packed row (trainer/packing.py) holds clusters of samples: each cluster's shared prefix once, then each sample's
remainder. A position may see an earlier position of its own cluster that is in the prefix or in its own remainder:

    visible(q, kv) = kv <= q  and  block[kv] == block[q]  and  (part[kv] == 0 or part[kv] == part[q])

A row holding one sequence needs no mask: plain causal attention. The ways to run a row (`choose_attention` picks
one for `[trainer] attention` and the device):
- **sdpa** (the CPU; a GPU without FlexAttention): a dense [1, 1, T, T] boolean mask (`PackedRow.attention_mask`),
  an additive float mask for eager attention, and no mask for a row of one sequence. A mask keeps SDPA off its
  flash kernels on a GPU, and on a CPU SDPA's flash kernel takes the mask but then computes every block of the T^2
  scores where a causal row skips half: the attention of a row costs T^2 however little of it is visible. So CPU
  rows are small (1,024 tokens): on SmolLM2 (2 cores), 32 samples of 64 + 64-320 tokens trained in 80-89 s a step in
  rows of 4,096 tokens, 52-55 s in rows of 2,048 and 42 s in rows of 1,024 (512 and 256: no faster), and since
  activations grow with the row, 4 samples of 2,048 tokens peak at 7.1 GiB in rows of 2,048 against 12.2 GiB in rows
  of 4,096.
- **flex** (CUDA, when asked for): FlexAttention for every row, with a BlockMask of the same rule, built once per
  row from its block structure (`block_mask`: no [T, T] tensor) and shared by every layer and by the KL reference
  pass (transformers hands a BlockMask to `flex_attention` as it is). Its cost grows with the visible blocks only,
  so rows fill up to a token budget of 12-16k tokens. Row lengths are rounded up (to 128 tokens, and to 1024 past
  1024) with padding positions that see only each other and predict nothing, so the compiled kernels see few
  distinct shapes.
- **mixed** (CUDA, the default): a row with several samples through FlexAttention as above; a row of one sequence
  through SDPA with no mask at all (`is_causal`, so SDPA takes its flash kernel: on an H100, one 16k sequence a row
  trained at 30.0k tokens/s this way against 24.3k through compiled FlexAttention, shared/notes/one-gpu.md). The
  model's attention implementation is switched per row (`use_row_attention`; transformers reads it at every
  forward, and compiled layers compile once for each).
FlexAttention has no backward pass on a CPU (torch 2.13), so the CPU keeps sdpa.

The row budget when `[trainer] micro_batch_tokens` is not set: 1,024 tokens on a CPU; on a GPU from the memory free
when the first batch arrives (trainer/model.py's `plan_memory`; `row_budget` here).

torch is imported inside the functions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from prime_lab.trainer.packing import PackedRow

if TYPE_CHECKING:
    import torch

FLEX = "flex_attention"
CPU_ROW_TOKENS = 1024
GPU_ROW_TOKENS = 16384
SMALL_GPU_ROW_TOKENS = 8192  # below 40 GiB of free device memory
LARGE_GPU_BYTES = 40 * 2**30
FLEX_BLOCK = 128  # FlexAttention's default sparse block (torch's _DEFAULT_SPARSE_BLOCK_SIZE)
TILE_CHUNK_ELEMENTS = 1 << 24  # bounds the per-position x key-tile overlaps `block_mask` holds at once (int32)


def row_budget(free_bytes: int | None) -> int:
    """The token budget of a packed row when `[trainer] micro_batch_tokens` is not set: `CPU_ROW_TOKENS` without a
    GPU (None), else 16,384 with 40 GiB or more free for the trainer, 8,192 with less."""
    if free_bytes is None:
        return CPU_ROW_TOKENS
    return GPU_ROW_TOKENS if free_bytes >= LARGE_GPU_BYTES else SMALL_GPU_ROW_TOKENS


def free_device_bytes(device: str) -> int | None:
    """What this process may still allocate on `device`: the GPU's free memory (what other processes, a sampler
    sharing the card among them, left) plus what its own allocator holds unused; None on a CPU."""
    if not device.startswith("cuda"):
        return None
    import torch

    free, _total = torch.cuda.mem_get_info(torch.device(device))
    return int(free) + int(torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))


def default_row_tokens(device: str) -> int:
    """The token budget of a packed row when `[trainer] micro_batch_tokens` is not set and no memory plan was made
    (the trainer plans at its first batch): `row_budget` of the memory free now."""
    return row_budget(free_device_bytes(device))


def flex_unavailable(device: str, model: Any) -> str | None:
    """Why FlexAttention cannot run this model's training on `device` (None: it can)."""
    if not device.startswith("cuda"):
        return "FlexAttention has no backward pass on a CPU"
    try:
        from torch.nn.attention.flex_attention import BlockMask  # noqa: F401
    except ImportError:
        return "this torch has no FlexAttention"
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not getattr(base, "_supports_flex_attn", False):
        return f"transformers' {type(base).__name__} does not support it"
    return None


def choose_attention(requested: str, device: str, *models: Any) -> tuple[str, str | None]:
    """"mixed", "flex" or "sdpa" (the module docstring) for `[trainer] attention`: auto is mixed on CUDA where
    FlexAttention can run, else sdpa. When flex was asked for or is the default on CUDA but cannot run, also why
    (for the trainer's log, once). With flex or mixed, switches each model's attention to FlexAttention (mixed
    switches a row of one sequence to SDPA as it runs it: `use_row_attention`)."""
    if requested == "sdpa":
        return "sdpa", None
    why = next((w for w in (flex_unavailable(device, m) for m in models) if w), None)
    if why is not None:
        quiet = requested == "auto" and not device.startswith("cuda")  # the CPU's path by design
        return "sdpa", None if quiet else f"FlexAttention is not used ({why}): packed rows attend through SDPA " \
            "with a dense mask"
    for model in models:
        (model.get_base_model() if hasattr(model, "get_base_model") else model).set_attn_implementation(FLEX)
    return ("mixed" if requested == "auto" else "flex"), None


def describe_attention(attention: str) -> str:
    """How rows attend, for the trainer's log."""
    return {"flex": "FlexAttention",
            "mixed": "FlexAttention (packed rows) and SDPA without a mask (rows of one sequence)"}.get(
        attention, "SDPA with a dense mask")


def row_attention(row: PackedRow, attention: str) -> str:
    """How this row runs: "flex" or "sdpa" (under mixed, a row of one sequence runs SDPA, a packed row flex)."""
    if attention == "mixed":
        return "flex" if row.needs_mask() else "sdpa"
    return "flex" if attention == "flex" else "sdpa"


def use_row_attention(row: PackedRow, attention: str, *models: Any) -> None:
    """Under mixed attention, set each model's attention implementation to the one `row` runs (transformers reads
    `config._attn_implementation` at every forward); nothing otherwise."""
    if attention != "mixed":
        return
    implementation = FLEX if row_attention(row, attention) == "flex" else "sdpa"
    for model in models:
        config = (model.get_base_model() if hasattr(model, "get_base_model") else model).config
        if config._attn_implementation != implementation:
            config._attn_implementation = implementation


def packs_prefixes(model: Any, attention: str) -> bool:
    """Whether rows may hold several samples: the attention takes a mask (flex, mixed, sdpa, eager)."""
    return attention in ("flex", "mixed") or attention_implementation(model) in ("sdpa", "eager")


def attention_implementation(model: Any) -> str:
    return str(getattr(model.config, "_attn_implementation", None) or "eager")


def padded_length(length: int) -> int:
    """A flex row's length: rounded up to 128 tokens (FlexAttention's block), and to 1024 past 1024."""
    step = 1024 if length > 1024 else 128
    return -(-length // step) * step


def visibility(block: torch.Tensor, part: torch.Tensor) -> Callable[..., torch.Tensor]:
    """The packing mask as FlexAttention's mask_mod (query index q, key index kv)."""

    def mask_mod(_b: torch.Tensor, _h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return (kv <= q) & (block[q] == block[kv]) & ((part[kv] == 0) | (part[kv] == part[q]))

    return mask_mod


def row_structure(row: PackedRow, length: int, device: str | torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The row's block and part ids as tensors of `length` (>= len(row)): padding positions form one block of
    their own (they see each other, causally, and nothing sees them)."""
    import torch

    pad = length - len(row)
    block = torch.tensor(row.block + [(row.block[-1] + 1 if row.block else 0)] * pad, device=device)
    part = torch.tensor(row.part + [0] * pad, device=device)
    return block, part


def visible_spans(block: torch.Tensor, part: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What each position q sees, as two spans of positions: [lo, hi), its cluster's prefix (empty for a position of
    a prefix or of padding), and [start, q], its own segment so far. Packing lays out each cluster as its prefix
    (part 0) then each remainder (a part of its own) contiguously, so `visibility` is exactly these spans."""
    import torch

    n = block.numel()
    index = torch.arange(n, device=block.device)
    new_segment = torch.ones(n, dtype=torch.bool, device=block.device)
    new_block = new_segment.clone()
    new_segment[1:] = (block[1:] != block[:-1]) | (part[1:] != part[:-1])
    new_block[1:] = block[1:] != block[:-1]
    start = torch.cummax(torch.where(new_segment, index, 0), 0).values
    block_start = torch.cummax(torch.where(new_block, index, 0), 0).values
    starts = index[new_segment]  # each segment's first position, in order
    segment_end = torch.cat([starts[1:], starts.new_tensor([n])])  # where each segment ends
    end = segment_end[torch.searchsorted(starts, index, right=True) - 1]  # the end of each position's segment
    remainder = part != 0
    lo = torch.where(remainder, block_start, 0)
    hi = torch.where(remainder, end[block_start], 0)  # the block's first segment is its prefix
    return lo, hi, start


def tile_counts(block: torch.Tensor, part: torch.Tensor, tile: int = FLEX_BLOCK) -> torch.Tensor:
    """[ceil(T / tile)] x [ceil(T / tile)]: how many (q, kv) pairs of each tile of the packing mask are visible,
    from `visible_spans`, holding at most `TILE_CHUNK_ELEMENTS` overlaps at a time (never the [T, T] mask)."""
    import torch

    lo, hi, start = (span.to(torch.int32) for span in visible_spans(block, part))
    n = block.numel()
    tiles = -(-n // tile)
    kv_lo = torch.arange(tiles, dtype=torch.int32, device=block.device) * tile
    kv_hi = kv_lo + tile
    counts = torch.zeros(tiles, tiles, dtype=torch.int64, device=block.device)
    rows = max(tile, TILE_CHUNK_ELEMENTS // tiles // tile * tile)  # whole query tiles per chunk
    for q0 in range(0, n, rows):
        q = torch.arange(q0, min(n, q0 + rows), device=block.device)
        prefix = (torch.minimum(hi[q, None], kv_hi) - torch.maximum(lo[q, None], kv_lo)).clamp_(min=0)
        own = (torch.minimum(q[:, None].to(torch.int32) + 1, kv_hi) - torch.maximum(start[q, None], kv_lo))
        counts.index_add_(0, q // tile, (prefix + own.clamp_(min=0)).to(torch.int64))
    return counts


def block_mask(row: PackedRow, length: int, device: str | torch.device, tile: int = FLEX_BLOCK) -> Any:
    """The row's BlockMask over `length` positions (padding included), built from its tiles' visible counts
    (`tile_counts`): a tile none of whose pairs is visible is skipped, one all of whose pairs are is full (no
    mask_mod), the rest partial, as torch's `create_block_mask` classifies them, but without its dense [T, T]
    mask (16k tokens: 256 M booleans, and more in its intermediates)."""
    import torch
    from torch.nn.attention.flex_attention import BlockMask

    block, part = row_structure(row, length, device)
    counts = tile_counts(block, part, tile)
    full = counts == tile * tile
    partial = (counts > 0) & ~full

    def ordered(dense: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # as torch's _dense_to_ordered
        dense = dense.to(torch.int32)[None, None]
        return dense.sum(-1, dtype=torch.int32), \
            torch.argsort(dense, dim=-1, descending=True, stable=True).to(torch.int32)

    partial_num, partial_indices = ordered(partial)
    full_num, full_indices = ordered(full)
    return BlockMask.from_kv_blocks(partial_num, partial_indices, full_num, full_indices, BLOCK_SIZE=tile,
                                    mask_mod=visibility(block, part), seq_lengths=(length, length))


def row_inputs(model: Any, row: PackedRow, device: str, attention: str = "sdpa") -> dict[str, Any]:
    """The model's inputs for a packed row (built once, for the policy pass and the reference pass alike): its
    tokens, position ids, the positions whose logits are kept (the trained tokens' sources, in order), and its
    attention mask in the form the row's attention takes (`row_attention`): a BlockMask for flex (the row padded to
    `padded_length`); None (plain causal) for a single sample, booleans for SDPA, an additive float mask for
    eager."""
    import torch

    input_ids, position_ids = row.input_ids, row.position_ids
    mask: Any = None
    if row_attention(row, attention) == "flex":
        length = padded_length(len(row))
        pad = length - len(row)
        input_ids, position_ids = input_ids + [0] * pad, position_ids + list(range(pad))
        mask = block_mask(row, length, device)
    elif row.needs_mask():
        mask = row.attention_mask(device)
        if attention_implementation(model) != "sdpa":
            dtype = next(model.parameters()).dtype
            mask = torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill(~mask, torch.finfo(dtype).min)
    return {"input_ids": torch.tensor([input_ids], dtype=torch.long, device=device),
            "position_ids": torch.tensor([position_ids], dtype=torch.long, device=device),
            "logits_to_keep": torch.tensor(row.sources, dtype=torch.long, device=device),
            "attention_mask": mask}
