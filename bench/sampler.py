"""Sampler throughput: the built-in server against vLLM, on smollm2-135m, base model and through a LoRA adapter.

    .venv/bin/python bench/sampler.py [--engines builtin,vllm] [--rounds 2] [--tokens 64] [--json out.json]

For each engine, one after the other (so they never share the cores): start the server and time it until
`/health` answers; send one warm-up request to the base model and one through the adapter; then for 1, 4 and 16
concurrent chat requests of `--tokens` completion tokens each (`ignore_eos`, temperature 1, a different prompt per
request), measure aggregate completion tokens/s (tokens from `usage`, wall time of the whole batch, one untimed
batch and then `--rounds` timed batches each), first on the base model and then through a rank-8 LoRA adapter
with random non-zero weights, loaded at runtime with vLLM's `/v1/load_lora_adapter`. Prints a table and the two
ratios the goals need: built-in@16 via adapter / vLLM@16 via adapter (goal >= 1.5) and built-in@16 /
built-in@1 (goal >= 5).
Both servers serve float32 (what RL needs for its importance ratios). Other work on the machine skews the figures:
the 1-minute load average while measuring is printed with them.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
import openai  # noqa: E402

from lab.inference.process import ServerProcess, ServerStartError, free_port  # noqa: E402
from lab.inference.vllm import (  # noqa: E402
    AdapterLoadError,
    RuntimeAdapters,
    VLLMNotInstalledError,
    VLLMSettings,
    start_vllm,
)
from lab.models import ModelNotFoundError, resolve_model  # noqa: E402
from lab.models.random_lora import build_random_lora_adapter  # noqa: E402

MODEL = "smollm2-135m"
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
    load_average: tuple[float, float] = (0.0, 0.0)  # 1-minute load average before and after measuring
    tokens_per_s: dict[str, dict[int, float]] = field(default_factory=dict)  # model kind -> concurrency -> tok/s


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


async def measure(base_url: str, model: str, rounds: int, tokens: int) -> dict[int, float]:
    """Tokens/s per concurrency level; one untimed batch first at each level (engines warm up per batch shape)."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", timeout=600, max_retries=0)
    rates: dict[int, float] = {}
    for concurrency in CONCURRENCY:
        await one_batch(client, model, concurrency, tokens)
        total_tokens, total_seconds = 0, 0.0
        for _ in range(rounds):
            count, seconds = await one_batch(client, model, concurrency, tokens)
            total_tokens, total_seconds = total_tokens + count, total_seconds + seconds
        rates[concurrency] = total_tokens / total_seconds
        print(f"  {model} x{concurrency}: {rates[concurrency]:.1f} tokens/s", file=sys.stderr)
    await client.close()
    return rates


def warm_up(base_url: str, model: str) -> float:
    start = time.perf_counter()
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    httpx.post(f"{base_url}/chat/completions", json=body, timeout=600).raise_for_status()
    return time.perf_counter() - start


def bench_server(engine: str, base_url: str, root_url: str, model_name: str, ready_s: float, adapter: Path,
                 rounds: int, tokens: int) -> EngineResult:
    result = EngineResult(engine, ready_s)
    result.first_request_s = warm_up(base_url, model_name)
    RuntimeAdapters(root_url).load(ADAPTER, adapter)
    warm_up(base_url, ADAPTER)
    before = os.getloadavg()[0]
    result.tokens_per_s["base"] = asyncio.run(measure(base_url, model_name, rounds, tokens))
    result.tokens_per_s["adapter"] = asyncio.run(measure(base_url, ADAPTER, rounds, tokens))
    result.load_average = (before, os.getloadavg()[0])
    return result


def run_builtin(model: Path, adapter: Path, log_dir: Path, rounds: int, tokens: int) -> EngineResult:
    port = free_port()
    argv = [sys.executable, "-m", "lab.inference.builtin", "--model", str(model), "--port", str(port),
            "--served-model-name", MODEL]
    server = ServerProcess(argv, port=port, log_path=log_dir / "builtin.log", name="built-in server")
    start = time.perf_counter()
    with server:
        server.wait_ready(timeout=300)
        ready = time.perf_counter() - start
        print(f"built-in server ready in {ready:.1f} s", file=sys.stderr)
        return bench_server("builtin", server.base_url, server.root_url, MODEL, ready, adapter, rounds, tokens)


def run_vllm(model: Path, adapter: Path, log_dir: Path, rounds: int, tokens: int) -> EngineResult:
    settings = VLLMSettings(model=model, served_model_name=MODEL, max_lora_rank=8, max_model_len=2048)
    start = time.perf_counter()
    with start_vllm(settings, log_path=log_dir / "vllm.log", timeout=600, on_gpu=False) as server:
        ready = time.perf_counter() - start
        print(f"vLLM ready in {ready:.1f} s", file=sys.stderr)
        return bench_server("vllm", server.base_url, server.root_url, MODEL, ready, adapter, rounds, tokens)


def print_table(results: list[EngineResult]) -> None:
    header = f"{'engine':<8} {'model':<8} {'ready s':>8} {'1st req s':>9} " + " ".join(
        f"{f'x{c} tok/s':>10}" for c in CONCURRENCY)
    print(header)
    print("-" * len(header))
    for result in results:
        for kind, rates in result.tokens_per_s.items():
            print(f"{result.engine:<8} {kind:<8} {result.seconds_to_ready:>8.1f} {result.first_request_s:>9.1f} "
                  + " ".join(f"{rates[c]:>10.1f}" for c in CONCURRENCY))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    loads = ", ".join(f"{r.engine} {r.load_average[0]:.1f} -> {r.load_average[1]:.1f}" for r in results)
    print(f"1-min load average while measuring ({cores} cores; each server alone loads them fully): {loads}")
    by_engine = {r.engine: r.tokens_per_s for r in results}
    if "builtin" in by_engine and "vllm" in by_engine:
        ratio = by_engine["builtin"]["adapter"][16] / by_engine["vllm"]["adapter"][16]
        print(f"built-in@16 via adapter / vLLM@16 via adapter: {ratio:.2f}  (goal >= 1.5: "
              f"{'met' if ratio >= 1.5 else 'NOT met'})")
    if "builtin" in by_engine:
        for kind in ("base", "adapter"):
            ratio = by_engine["builtin"][kind][16] / by_engine["builtin"][kind][1]
            print(f"built-in@16 / built-in@1 ({kind}): {ratio:.2f}  (goal >= 5: {'met' if ratio >= 5 else 'NOT met'})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", default="builtin,vllm", help="comma-separated: builtin, vllm")
    parser.add_argument("--rounds", type=int, default=2, help="batches per concurrency level")
    parser.add_argument("--tokens", type=int, default=64, help="completion tokens per request")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    runners = {"builtin": run_builtin, "vllm": run_vllm}
    engines = [name.strip() for name in args.engines.split(",") if name.strip()]
    unknown = [name for name in engines if name not in runners]
    if unknown:
        parser.error(f"unknown engine(s) {', '.join(unknown)}: use builtin, vllm")
    log_dir = Path(tempfile.gettempdir()) / "prime-lab-bench-logs"
    try:
        model = resolve_model(MODEL)
        with tempfile.TemporaryDirectory(prefix="prime-lab-bench-") as scratch:
            adapter = build_random_lora_adapter(model, Path(scratch) / "lora-r8", rank=8, seed=0)
            results = [runners[name](model, adapter, log_dir, args.rounds, args.tokens) for name in engines]
    except (ModelNotFoundError, VLLMNotInstalledError, ServerStartError, AdapterLoadError) as exc:
        print(f"bench/sampler.py: {exc}", file=sys.stderr)
        return 1
    except (httpx.HTTPError, openai.APIError) as exc:
        print(f"bench/sampler.py: a request failed: {exc} (server logs: {log_dir})", file=sys.stderr)
        return 1
    print_table(results)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
