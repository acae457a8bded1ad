"""A vLLM worker extension that loads a trainer's full weights into the running model, in place.

vLLM mixes it into its worker when started with `--worker-extension-cls
prime_lab.inference.vllm_worker.WeightUpdateExtension`; with `VLLM_SERVER_DEV_MODE=1`, `POST /collective_rpc
{"method": "update_weights_from_path", "args": [FOLDER]}` runs the method in every worker, between engine steps:
requests in flight continue on the new weights from their next token (as prime-rl's pause(keep) -> update ->
resume), so their logprobs stay those of the weights that sampled each token. The caller then resets the prefix
cache (`POST /reset_prefix_cache`): cached prompt state was computed with the old weights.

Measured on the CPU build (shared/notes/vllm-on-cpu.md): `model_runner.reload_weights` alone leaves the CPU-prepacked
GEMM of a `VocabParallelEmbedding` as it was, so a *tied* LM head (SmolLM2, Qwen3-0.6B, the tiny test models) keeps
computing logits with the old matrix; the method rebuilds that pack after the reload. Loading straight into the
live model (`model.load_weights`) fails on CPU, where linear weights live in oneDNN handles.

This module is imported by the vLLM server process: it imports torch and vLLM only inside the method.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prime_lab.inference.weights import read_weights, weight_files

EXTENSION_CLASS = f"{__name__}.WeightUpdateExtension"


class WeightUpdateExtension:
    """Methods vLLM's worker gains (it provides `model_runner`)."""

    model_runner: Any

    def update_weights_from_path(self, path: str) -> dict[str, Any]:  # weights.UPDATE_METHOD
        """Reload every weight from the model folder `path` (HF names, checkpoint format); returns what it did."""
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
        from vllm.model_executor.layers.vocab_parallel_embedding import (
            UnquantizedEmbeddingMethod,
            VocabParallelEmbedding,
        )
        from vllm.platforms import current_platform

        t0 = time.perf_counter()
        folder = Path(path)
        files = weight_files(folder)
        self.model_runner.reload_weights(weights_iterator=read_weights(folder), is_checkpoint_format=True)
        repacked = 0
        if current_platform.is_cpu():
            for module in self.model_runner.get_model().modules():
                if isinstance(module, VocabParallelEmbedding) \
                        and isinstance(module.quant_method, UnquantizedEmbeddingMethod):
                    dispatch_cpu_unquantized_gemm(module, remove_weight=False)
                    repacked += 1
        return {"files": len(files), "repacked_embeddings": repacked, "seconds": time.perf_counter() - t0}

