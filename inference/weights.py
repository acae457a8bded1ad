"""Full model weights for a running sampler: the folder a trainer publishes and the call that loads it.

A full fine-tuning trainer publishes each policy version as a model folder of Hugging Face-named safetensors
(`save_pretrained`: `model.safetensors` or shards, beside `config.json`). A running server takes it in place through
vLLM's developer routes (`VLLM_SERVER_DEV_MODE=1`): `POST /collective_rpc` calling `UPDATE_METHOD` with the folder,
then `POST /reset_prefix_cache`. In vLLM the method is our worker extension's (`vllm_worker.py`); the built-in server
answers the same two routes, so one client (`inference.control.RuntimeWeights`) drives both engines.

Nothing here imports torch at module import: the vLLM worker extension imports this module in the server process.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

UPDATE_METHOD = "update_weights_from_path"  # the /collective_rpc method both engines answer


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a model folder, in name order; FileNotFoundError when there are none."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder} holds no *.safetensors weights")
    return files


def read_weights(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor of the folder's safetensors, read on the CPU one file at a time."""
    from safetensors import safe_open

    for path in weight_files(folder):
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            for name in handle.keys():  # noqa: SIM118  (a safe_open handle is not a dict)
                yield name, handle.get_tensor(name)
