"""Sampler throughput: the built-in server against vLLM, on smollm2-135m, base model and through a LoRA adapter.

    .venv/bin/python bench/sampler.py [--engines builtin,vllm] [--rounds 3] [--tokens 64] [--json out.json]

Starts each engine in turn and times it until `/health` answers (the first request's time is shown too), loads a
rank-8 LoRA adapter with random non-zero weights into each through vLLM's `/v1/load_lora_adapter`, then for 1, 4
and 16 concurrent chat requests of `--tokens` completion tokens each (`ignore_eos`, temperature 1, a different
prompt per request) measures aggregate completion tokens/s: tokens from `usage` over the wall time of the whole
batch, one untimed batch per engine and level first, then `--rounds` timed batches, base model and then through
the adapter. Both servers stay up and the engines take turns batch by batch (only one generates at any moment),
so other work on a shared machine slows both alike; the 1-minute load average is printed with the figures.
Both serve float32 (what RL needs for its importance ratios).

Prints a table and the two ratios the goals need: built-in@16 via adapter / vLLM@16 via adapter (goal >= 1.5)
and built-in@16 / built-in@1 (goal >= 5).

    .venv/bin/python bench/sampler.py --decode [--tiny] [--rounds 2] [--json out.json]

`--decode` times the built-in engine's decode loop in this process, no server: a Qwen3-0.6B-shaped model with random
weights (`--tiny`: a 2-layer one, what the CPU can run) and the shipped tiny tokenizer, on CUDA in bfloat16 when
there is a GPU (float32 on the CPU), decodes an RL batch: 8 prompts x n = 8 choices x `--tokens` (default 128)
tokens at temperature 1, EOS ignored. It runs the eager decode and the captured one (CUDA graphs; on the CPU the
same fixed-shape decode, uncaptured) on the same model, one after the other: for each, a first batch (timed on its
own: it pays for cuBLAS set-up and the captures) and `--rounds` timed batches. A third row replaces the model by
a new one (new key, same weights) before every batch, as an RL run's in-place adapter reload does, so every batch
pays for its captures. Prints ms per decode step (the engine thread's time per step: forward, sampling,
bookkeeping), tokens/s over the whole batch (prefill included), the captures and their time, and the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
import openai  # noqa: E402

from prime_lab.inference.builtin.launcher import BuiltinServer, start_builtin_server  # noqa: E402
from prime_lab.inference.builtin.server import BuiltinServerSettings  # noqa: E402
from prime_lab.inference.control import AdapterLoadError  # noqa: E402
from prime_lab.inference.vllm import (  # noqa: E402
    VLLMNotInstalledError,
    VLLMServer,
    VLLMSettings,
    start_vllm,
)
from prime_lab.models import ModelNotFoundError, resolve_model  # noqa: E402
from prime_lab.models.random_lora import build_random_lora_adapter  # noqa: E402
from prime_lab.runs.processes import RunningServer, ServerStartError  # noqa: E402

MODEL = "smollm2-135m"
# Qwen3-0.6B's shape (as bench/trainer_throughput.py builds it), and a tiny one for the CPU.
QWEN3_06B: dict[str, Any] = {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
                             "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
                             "max_position_embeddings": 40960, "tie_word_embeddings": True}
TINY_QWEN3: dict[str, Any] = {"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 2,
                              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 4096,
                              "max_position_embeddings": 4096, "tie_word_embeddings": True}
DECODE_PROMPTS = 8
DECODE_CHOICES = 8
ADAPTER = "bench-lora"
CONCURRENCY = (1, 4, 16)
TOPICS = ("a lighthouse", "a lost key", "the first snow", "a robot chef", "a tiny dragon", "an old map",
          "a night train", "a quiet library", "a broken clock", "a garden on Mars", "a paper boat",
          "a singing whale", "a secret door", "a windy hill", "a jazz cat", "a glass forest")


@dataclass
class EngineResult:
    engine: str
    seconds_to_ready: float
    first_request_s: float = 0.0
    tokens_per_s: dict[str, dict[int, float]] = field(default_factory=dict)  # model kind -> concurrency -> tok/s


@dataclass
class Engine:
    """A started server under test, what it serves, and its running totals."""

    server: RunningServer
    result: EngineResult
    totals: dict[tuple[str, int], tuple[int, float]] = field(default_factory=dict)  # (kind, level) -> tokens, s

    def model(self, kind: str) -> str:
        return self.server.model_name if kind == "base" else ADAPTER


async def one_batch(client: openai.AsyncOpenAI, model: str, concurrency: int, tokens: int) -> tuple[int, float]:
    """Send `concurrency` requests at once; return (completion tokens, wall seconds)."""

    async def one(i: int) -> int:
        response = await client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": f"Write a short story about {TOPICS[i % len(TOPICS)]}."}],
            max_tokens=tokens,
            temperature=1.0,
            extra_body={"ignore_eos": True},
        )
        return response.usage.completion_tokens if response.usage else 0

    start = time.perf_counter()
    counts = await asyncio.gather(*(one(i) for i in range(concurrency)))
    return sum(counts), time.perf_counter() - start


async def measure_in_turns(engines: list[Engine], rounds: int, tokens: int) -> None:
    """For each model kind and level: an untimed batch per engine, then `rounds` timed batches, engines in turn."""
    clients = [openai.AsyncOpenAI(base_url=e.server.base_url, api_key="unused", timeout=600, max_retries=0)
               for e in engines]
    for kind in ("base", "adapter"):
        for level in CONCURRENCY:
            for engine, client in zip(engines, clients, strict=True):
                await one_batch(client, engine.model(kind), level, tokens)
            for _ in range(rounds):
                for engine, client in zip(engines, clients, strict=True):
                    count, seconds = await one_batch(client, engine.model(kind), level, tokens)
                    done, spent = engine.totals.get((kind, level), (0, 0.0))
                    engine.totals[(kind, level)] = (done + count, spent + seconds)
            for engine in engines:
                count, seconds = engine.totals[(kind, level)]
                engine.result.tokens_per_s.setdefault(kind, {})[level] = count / seconds
                print(f"  {engine.result.engine} {kind} x{level}: {count / seconds:.1f} tokens/s", file=sys.stderr)
    for client in clients:
        await client.close()


def warm_up(base_url: str, model: str) -> float:
    start = time.perf_counter()
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    httpx.post(f"{base_url}/chat/completions", json=body, timeout=600).raise_for_status()
    return time.perf_counter() - start


def start_engine(name: str, model: Path, adapter: Path, log_dir: Path) -> Engine:
    """Start one engine alone (nothing else generating), time it to ready and its first request, load the adapter."""
    start = time.perf_counter()
    server: BuiltinServer | VLLMServer
    if name == "builtin":
        settings = BuiltinServerSettings(model=model, served_model_name=MODEL)
        server = start_builtin_server(settings, log_path=log_dir / "builtin.log", timeout=300)
    else:
        settings_vllm = VLLMSettings(model=model, served_model_name=MODEL, max_lora_rank=8, max_model_len=2048)
        server = start_vllm(settings_vllm, log_path=log_dir / "vllm.log", timeout=600, on_gpu=False)
    result = EngineResult(name, time.perf_counter() - start)
    print(f"{name} ready in {result.seconds_to_ready:.1f} s", file=sys.stderr)
    try:
        result.first_request_s = warm_up(server.base_url, server.model_name)
        server.adapters.load(ADAPTER, adapter)
        warm_up(server.base_url, ADAPTER)
    except BaseException:
        server.stop()
        raise
    return Engine(server, result)


def run_bench(names: list[str], model: Path, adapter: Path, log_dir: Path, rounds: int, tokens: int
              ) -> tuple[list[EngineResult], tuple[float, float]]:
    engines: list[Engine] = []
    try:
        for name in names:
            engines.append(start_engine(name, model, adapter, log_dir))
        before = os.getloadavg()[0]
        asyncio.run(measure_in_turns(engines, rounds, tokens))
        return [e.result for e in engines], (before, os.getloadavg()[0])
    finally:
        for engine in engines:
            engine.server.stop()


def print_table(results: list[EngineResult], load_average: tuple[float, float]) -> None:
    header = f"{'engine':<8} {'model':<8} {'ready s':>8} {'1st req s':>9} " + " ".join(
        f"{f'x{c} tok/s':>10}" for c in CONCURRENCY)
    print(header)
    print("-" * len(header))
    for result in results:
        for kind, rates in result.tokens_per_s.items():
            print(f"{result.engine:<8} {kind:<8} {result.seconds_to_ready:>8.1f} {result.first_request_s:>9.1f} "
                  + " ".join(f"{rates[c]:>10.1f}" for c in CONCURRENCY))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"1-min load average while measuring: {load_average[0]:.1f} -> {load_average[1]:.1f} on {cores} cores "
          "(the engine generating keeps them busy: about 2 is this benchmark alone)")
    by_engine = {r.engine: r.tokens_per_s for r in results}
    if "builtin" in by_engine and "vllm" in by_engine:
        ratio = by_engine["builtin"]["adapter"][16] / by_engine["vllm"]["adapter"][16]
        print(f"built-in@16 via adapter / vLLM@16 via adapter: {ratio:.3f}  (goal >= 1.5: "
              f"{'met' if ratio >= 1.5 else 'NOT met'})")
    if "builtin" in by_engine:
        for kind in ("base", "adapter"):
            ratio = by_engine["builtin"][kind][16] / by_engine["builtin"][kind][1]
            print(f"built-in@16 / built-in@1 ({kind}): {ratio:.3f}  (goal >= 5: {'met' if ratio >= 5 else 'NOT met'})")


@dataclass
class DecodeResult:
    mode: str
    first_batch_s: float
    ms_per_step: float
    tokens_per_s: float
    captures: int = 0
    capture_s: float = 0.0


def decode_model(tiny: bool, device: str) -> tuple[Any, Any]:
    """A Qwen3-shaped model with random weights on `device` (bfloat16 on CUDA, float32 on the CPU), through the
    built-in server's attention, and the shipped tiny tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    from prime_lab.inference.builtin.attention import GROUPED_DECODE_SDPA
    from prime_lab.models.tiny import build_tiny_tokenizer

    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        module = AutoModelForCausalLM.from_config(Qwen3Config(**(TINY_QWEN3 if tiny else QWEN3_06B)),
                                                  attn_implementation=GROUPED_DECODE_SDPA, dtype=dtype)
    module.eval().requires_grad_(False)
    return module, build_tiny_tokenizer()


def decode_prompts(tokenizer: Any) -> list[list[int]]:
    """`DECODE_PROMPTS` chat prompts of different lengths, as reverse-text's are."""
    prompts = []
    for i in range(DECODE_PROMPTS):
        text = " ".join(TOPICS[(i + j) % len(TOPICS)] for j in range(2 + i % 4))
        encoded = tokenizer.apply_chat_template([{"role": "user", "content": f"Reverse the text: {text}"}],
                                                add_generation_prompt=True, tokenize=True)
        prompts.append(list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded))
    return prompts


def time_decode(mode: str, module: Any, tokenizer: Any, device: str, rounds: int, tokens: int) -> DecodeResult:
    """One engine (`mode`: eager, graphs, graphs-new-model): a first batch, then `rounds` timed ones."""
    import torch

    from prime_lab.inference.builtin.adapters import ServedModel
    from prime_lab.inference.builtin.engine import GenerationEngine
    from prime_lab.inference.builtin.prompts import PromptCodec
    from prime_lab.inference.builtin.sampling import SamplingParams
    from prime_lab.inference.builtin.sequences import GenerationRequest

    engine = GenerationEngine(PromptCodec(tokenizer), frozenset(), int(module.config.vocab_size),
                              torch.device(device), max_batch_rows=DECODE_PROMPTS * DECODE_CHOICES,
                              graph_decode=mode != "eager").start()
    prompts = decode_prompts(tokenizer)
    params = SamplingParams(max_tokens=tokens, temperature=1.0, logprobs=True)
    model = ServedModel(name="bench", module=module, root="")

    def one_batch() -> float:
        nonlocal model
        if mode == "graphs-new-model":  # an in-place adapter reload: the engine sees a new model
            model = ServedModel(name="bench", module=module, root="")
        start = time.perf_counter()
        futures = [engine.submit(GenerationRequest(p, DECODE_CHOICES, params, model)) for p in prompts]
        done = [f.result(timeout=600) for f in futures]
        assert all(len(c.token_ids) == tokens for choices in done for c in choices), "every row decodes all"
        seconds = time.perf_counter() - start
        engine.between_steps(lambda: None).result(timeout=60)  # the last step's time is counted
        return seconds

    try:
        first = one_batch()
        steps, seconds = engine.decode_steps, engine.decode_seconds
        wall = sum(one_batch() for _ in range(rounds))
        steps, seconds = engine.decode_steps - steps, engine.decode_seconds - seconds
    finally:
        engine.stop()
    decoder = engine.decoder
    result = DecodeResult(mode, first, 1000 * seconds / steps, rounds * len(prompts) * DECODE_CHOICES * tokens / wall)
    if decoder is not None:
        result.captures, result.capture_s = decoder.captures, decoder.capture_seconds
    print(f"  {mode}: first batch {first:.2f} s, {result.ms_per_step:.2f} ms/step", file=sys.stderr)
    return result


def run_decode_bench(tiny: bool, rounds: int, tokens: int) -> tuple[list[DecodeResult], dict[str, Any]]:
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    module, tokenizer = decode_model(tiny, device)
    info = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "dtype": str(module.dtype),
            "model": "tiny Qwen3" if tiny else "Qwen3-0.6B-shaped", "torch": torch.__version__,
            "batch": f"{DECODE_PROMPTS} prompts x n={DECODE_CHOICES} x {tokens} tokens"}
    print(f"decode bench on {info['device']} ({info['dtype']}, {info['model']}, {info['batch']})", file=sys.stderr)
    modes = ("eager", "graphs", "graphs-new-model")
    return [time_decode(mode, module, tokenizer, device, rounds, tokens) for mode in modes], info


def print_decode_table(results: list[DecodeResult], info: dict[str, Any]) -> None:
    print(f"{info['model']} on {info['device']}, {info['dtype']}, torch {info['torch']}: {info['batch']}")
    header = f"{'decode':<17} {'1st batch s':>11} {'ms/step':>8} {'tok/s':>9} {'captures':>8} {'capture s':>9}"
    print(header)
    print("-" * len(header))
    for r in results:
        print(f"{r.mode:<17} {r.first_batch_s:>11.2f} {r.ms_per_step:>8.2f} {r.tokens_per_s:>9.0f} "
              f"{r.captures:>8d} {r.capture_s:>9.2f}")
    by_mode = {r.mode: r for r in results}
    ratio = by_mode["eager"].ms_per_step / by_mode["graphs"].ms_per_step
    print(f"eager / graphs, ms per decode step: {ratio:.2f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", default="builtin,vllm", help="comma-separated: builtin, vllm")
    parser.add_argument("--rounds", type=int, default=3, help="timed batches per engine and concurrency level")
    parser.add_argument("--tokens", type=int, default=64, help="completion tokens per request")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--decode", action="store_true", help="time the engine's decode loop in-process (no server)")
    parser.add_argument("--tiny", action="store_true", help="with --decode: a 2-layer model (the CPU's size)")
    args = parser.parse_args()
    if args.tiny and not args.decode:
        parser.error("--tiny goes with --decode")
    if args.decode:
        tokens = args.tokens if "--tokens" in sys.argv[1:] else 128
        decoded, info = run_decode_bench(args.tiny, args.rounds, tokens)
        print_decode_table(decoded, info)
        if args.json:
            args.json.write_text(json.dumps({"decode": [asdict(r) for r in decoded], **info}, indent=2))
        return 0
    engines = [name.strip() for name in args.engines.split(",") if name.strip()]
    unknown = [name for name in engines if name not in ("builtin", "vllm")]
    if unknown:
        parser.error(f"unknown engine(s) {', '.join(unknown)}: use builtin, vllm")
    log_dir = Path(tempfile.gettempdir()) / "prime-lab-bench-logs"
    try:
        model = resolve_model(MODEL)
        with tempfile.TemporaryDirectory(prefix="prime-lab-bench-") as scratch:
            adapter = build_random_lora_adapter(model, Path(scratch) / "lora-r8", rank=8, seed=0)
            results, load_average = run_bench(engines, model, adapter, log_dir, args.rounds, args.tokens)
    except (ModelNotFoundError, VLLMNotInstalledError, ServerStartError, AdapterLoadError) as exc:
        print(f"bench/sampler.py: {exc}", file=sys.stderr)
        return 1
    except (httpx.HTTPError, openai.APIError) as exc:
        print(f"bench/sampler.py: a request failed: {exc} (server logs: {log_dir})", file=sys.stderr)
        return 1
    print_table(results, load_average)
    if args.json:
        args.json.write_text(json.dumps({"results": [asdict(r) for r in results], "load_average": load_average},
                                        indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
