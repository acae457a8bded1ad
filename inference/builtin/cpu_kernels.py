"""Faster matrix products for CPU decoding: route `nn.Linear` through oneDNN.

At the small batch sizes of decoding (1-64 rows), PyTorch's default CPU linear (MKL) is slow: for SmolLM2's shapes
oneDNN's `_linear_pointwise` is about 2x faster at 4 rows and for the LM head, with float32 results equal to
~1e-6. The modules stay `nn.Linear` (peft can still wrap them to merge an adapter); only their `forward` changes.
A model on a GPU, or a PyTorch without oneDNN, is left alone; `PRIME_LAB_ONEDNN_LINEAR=0` turns it off.

The LM head keeps PyTorch's default path: there oneDNN would be 2x faster too, but its different summation order
moves the logits enough to double the logprob error against a plain float32 forward pass (measured on
SmolLM2-135M over 1,024 sampled tokens: max 1.7e-5 default, 3.0e-5 with oneDNN layers, 4.7e-5 with the head too,
and once 1.1e-4 through the server), and RL needs those logprobs within 1e-4.

Importing this module imports torch.
"""

from __future__ import annotations

import logging
import os
import types
from typing import Any

import torch

log = logging.getLogger(__name__)


def onednn_linear(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")


def onednn_linear_works(dtype: torch.dtype) -> bool:
    """Whether this PyTorch has oneDNN's linear and it agrees with `F.linear` for `dtype`."""
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return False
    try:
        probe = torch.nn.Linear(64, 32).to(dtype)
        x = torch.randn(3, 2, 64, dtype=dtype)
        with torch.no_grad():
            expected, got = torch.nn.functional.linear(x, probe.weight, probe.bias), onednn_linear(probe, x)
        return bool(torch.allclose(expected.float(), got.float(), atol=1e-2 if dtype != torch.float32 else 1e-5))
    except RuntimeError:
        return False


def use_onednn_linears(model: Any) -> Any:
    """Make every CPU `nn.Linear` in `model` use oneDNN (idempotent); returns `model`."""
    if os.environ.get("PRIME_LAB_ONEDNN_LINEAR", "1") == "0":
        return model
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    linears = [
        m for m in model.modules() if type(m) is torch.nn.Linear and m.weight.device.type == "cpu" and m is not head
    ]
    if not linears or not onednn_linear_works(linears[0].weight.dtype):
        return model
    for linear in linears:
        linear.forward = types.MethodType(onednn_linear, linear)  # type: ignore[method-assign]
    log.info("oneDNN linear for %d layers", len(linears))
    return model
