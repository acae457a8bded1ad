"""How a packed row attends, and the model inputs that say so.

A packed row (trainer/packing.py) holds clusters of samples: each cluster's shared prefix once, then each sample's
remainder. A position may see an earlier position of its own cluster that is in the prefix or in its own remainder:

    visible(q, kv) = kv <= q  and  block[kv] == block[q]  and  (part[kv] == 0 or part[kv] == part[q])

Two ways to give the model that mask:
- **sdpa** (the CPU; a GPU without FlexAttention): a dense [1, 1, T, T] boolean mask (`PackedRow.attention_mask`),
  an additive float mask for eager attention. It keeps SDPA off its flash kernels on a GPU, and on a CPU SDPA's
  flash kernel takes the mask but then computes every block of the T^2 scores where a causal row skips half: the
  attention of a row costs T^2 however little of it is visible. So CPU rows are small (1,024 tokens): on SmolLM2
  (2 cores), 32 samples of 64 + 64-320 tokens trained in 80-89 s a step in rows of 4,096 tokens, 52-55 s in rows of
  2,048 and 42 s in rows of 1,024 (512 and 256: no faster), and since activations grow with the row, 4 samples of
  2,048 tokens peak at 7.1 GiB in rows of 2,048 against 12.2 GiB in rows of 4,096.
- **flex** (CUDA): FlexAttention with a BlockMask built from the same rule as a `mask_mod`, once per row, and
  shared by every layer and by the KL reference pass (transformers hands a BlockMask to `flex_attention` as it is).
  Its cost grows with the visible blocks only, so rows fill up to a token budget of 12-16k tokens. Row lengths are
  rounded up (to 128 tokens, and to 1024 past 1024) with padding positions that see only each other and predict
  nothing, so the compiled kernels see few distinct shapes. FlexAttention has no backward pass on a CPU (torch
  2.13), so the CPU keeps sdpa.

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
SMALL_GPU_ROW_TOKENS = 8192  # below 40 GiB of device memory


def default_row_tokens(device: str) -> int:
    """The token budget of a packed row when `[trainer] micro_batch_tokens` is not set."""
    if not device.startswith("cuda"):
        return CPU_ROW_TOKENS
    import torch

    total = torch.cuda.get_device_properties(torch.device(device)).total_memory
    return GPU_ROW_TOKENS if total >= 40 * 2**30 else SMALL_GPU_ROW_TOKENS


def flex_unavailable(device: str, model: Any) -> str | None:
    """Why FlexAttention cannot run this model's training on `device` (None: it can)."""
    if not device.startswith("cuda"):
        return "FlexAttention has no backward pass on a CPU"
    try:
        from torch.nn.attention.flex_attention import create_block_mask  # noqa: F401
    except ImportError:
        return "this torch has no FlexAttention"
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not getattr(base, "_supports_flex_attn", False):
        return f"transformers' {type(base).__name__} does not support it"
    return None


def choose_attention(requested: str, device: str, *models: Any) -> tuple[str, str | None]:
    """"flex" or "sdpa" for `[trainer] attention`, and, when flex was asked for or is the default on CUDA but
    cannot run, why (for the trainer's log, once). With flex, switches each model's attention to it."""
    if requested == "sdpa":
        return "sdpa", None
    why = next((w for w in (flex_unavailable(device, m) for m in models) if w), None)
    if why is not None:
        quiet = requested == "auto" and not device.startswith("cuda")  # the CPU's path by design
        return "sdpa", None if quiet else f"FlexAttention is not used ({why}): packed rows attend through SDPA " \
            "with a dense mask"
    for model in models:
        (model.get_base_model() if hasattr(model, "get_base_model") else model).set_attn_implementation(FLEX)
    return "flex", None


def packs_prefixes(model: Any, attention: str) -> bool:
    """Whether rows may hold several samples: the attention takes a mask (flex, sdpa, eager)."""
    return attention == "flex" or attention_implementation(model) in ("sdpa", "eager")


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


def block_mask(row: PackedRow, length: int, device: str | torch.device) -> Any:
    """The row's BlockMask over `length` positions (padding included)."""
    from torch.nn.attention.flex_attention import create_block_mask

    block, part = row_structure(row, length, device)
    return create_block_mask(visibility(block, part), B=None, H=None, Q_LEN=length, KV_LEN=length,
                             device=str(device))


def row_inputs(model: Any, row: PackedRow, device: str, attention: str = "sdpa") -> dict[str, Any]:
    """The model's inputs for a packed row (built once, for the policy pass and the reference pass alike): its
    tokens, position ids, the positions whose logits are kept (the trained tokens' sources, in order), and its
    attention mask in the form the model's attention takes: a BlockMask for flex (the row padded to
    `padded_length`); None (plain causal) for a single sample, booleans for SDPA, an additive float mask for
    eager."""
    import torch

    input_ids, position_ids = row.input_ids, row.position_ids
    mask: Any = None
    if attention == "flex":
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
