"""A local judge that keeps up (issue 45's goals): the run's judge server against `prime serve` of the same model.

    .venv/bin/python bench/judge.py [--model tiny|smollm2-135m|FOLDER] [--requests 16] [--concurrency 16]
                                    [--max-new-tokens 256] [--max-model-len 512] [--rounds 2] [--cpu-split run|none]
                                    [--sampler-requests 8] [--sampler-tokens 128] [--json out.json]

Starts three servers of `--model` (default `tiny`: the tiny random test model, built here; `smollm2-135m` for a real
one): the judge as a run starts it (`inference.launch.start_sampler`, the built-in engine, with `[judge.sampling]`'s
`max_tokens` as its generation default, `--override-generation-config '{"max_new_tokens": N}'`), `prime serve MODEL`
as a user starts it (the CLI, its defaults), and a sampler (the built-in engine as a run starts it). Every one has
the context `--max-model-len` (0: the model's own). On a CPU-only machine the sampler and the judge get the CPU
threads an RL run gives them (half the cores to the sampler, half of that to the judge; `--cpu-split none`: the
defaults), `prime serve` its default (all cores).

1. Judge throughput: `--requests` judge-like chat requests (a rubric question about a short answer, no `max_tokens`,
   as most judge environments send them) at `--concurrency` at a time to the judge, then the same requests to
   `prime serve`, `--rounds` times taking turns (one untimed request each first). Prints each side's requests/s,
   p50 and p95 latency (client side), tokens per answer and tokens/s, and the ratios; goal: judge / prime serve
   >= 1.0x in requests/s. The judge's own `/metrics` over its timed rounds (`inference.judge_metrics.JudgeMeter`)
   is printed beside it.
2. The sampler alongside its judge: `--sampler-requests` chat requests of `--sampler-tokens` tokens each (EOS
   ignored, an RL batch) on the sampler, alone and while the judge takes `--concurrency` requests at a time without
   pause (on a CPU both share its cores), `--rounds` times taking turns. Prints the sampler's tokens/s each way and
   the ratio; goal: with / alone >= 0.8.

`prime serve` stops before part 2. Exits 0 with the figures whether or not they meet the goals; 1 with one line
when a server does not start.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import openai  # noqa: E402

from prime_lab.inference.judge_metrics import JudgeMeter  # noqa: E402
from prime_lab.inference.launch import SamplerOptions, start_sampler  # noqa: E402
from prime_lab.models import ModelNotFoundError, resolve_model  # noqa: E402
from prime_lab.runs.hardware import cuda_available, usable_cores  # noqa: E402
from prime_lab.runs.processes import RunningServer, ServerProcess, ServerStartError, free_port  # noqa: E402

ANSWERS = ("4", "four", "5", "2 + 2 = 4", "22", "It is 4.", "3", "Four, since 2 and 2 make 4.")
QUESTIONS = ("What is 2 + 2?", "How many legs does a cat have?", "What is the square root of 16?",
             "How many sides does a square have?")  # fmt: skip
# Whether SamplerOptions takes generation defaults (`[judge]`'s max_tokens as the server's max_new_tokens). Before it
# did, the bench put max_tokens in the judge's requests instead: the same answer length, set by the client.
SERVER_DEFAULTS = "generation_config" in {f.name for f in dataclasses.fields(SamplerOptions)}


def rubric(i: int) -> list[dict[str, str]]:
    """A judge's request: a rubric question about a short answer (different for each request)."""
    question, answer = QUESTIONS[i % len(QUESTIONS)], ANSWERS[i % len(ANSWERS)]
    return [{"role": "system", "content": "You are a strict grader. Reply with a score from 1 to 10, then one "
                                          "sentence saying why."},
            {"role": "user", "content": f"Question: {question}\nAnswer: {answer}\nIs the answer correct and "
                                        f"complete? Grade it."}]  # fmt: skip


@dataclass
class Side:
    """One server taking the judge's requests: per timed request its seconds and completion tokens."""

    name: str
    server: RunningServer | ServerProcess
    model: str
    max_tokens: int | None = None  # in each request (None: the server's default)
    seconds: list[float] = dataclasses.field(default_factory=list)
    tokens: list[int] = dataclasses.field(default_factory=list)
    wall: float = 0.0
    client: openai.AsyncOpenAI | None = None  # open while an event loop runs (`opened`)

    @contextlib.asynccontextmanager
    async def opened(self) -> AsyncIterator[Side]:
        """The side with its client (one, as an environment's judge client is shared by its rollouts)."""
        async with openai.AsyncOpenAI(base_url=self.server.base_url, api_key="local", max_retries=0,
                                      timeout=3600) as self.client:
            yield self
        self.client = None

    async def judge(self, i: int) -> tuple[float, int]:
        """One judge request: (seconds, completion tokens)."""
        assert self.client is not None
        extra: dict[str, Any] = {} if self.max_tokens is None else {"max_tokens": self.max_tokens}
        start = time.perf_counter()
        answer = await self.client.chat.completions.create(model=self.model, messages=rubric(i), **extra)  # type: ignore[arg-type]
        assert answer.usage is not None
        return time.perf_counter() - start, answer.usage.completion_tokens

    async def batch(self, requests: int, concurrency: int) -> None:
        """`requests` requests, `concurrency` at a time; timed."""
        gate = asyncio.Semaphore(concurrency)

        async def one(i: int) -> tuple[float, int]:
            async with gate:
                return await self.judge(i)

        start = time.perf_counter()
        done = await asyncio.gather(*(one(i) for i in range(requests)))
        self.wall += time.perf_counter() - start
        self.seconds += [s for s, _ in done]
        self.tokens += [t for _, t in done]

    def per_second(self) -> float:
        return len(self.seconds) / self.wall if self.wall else 0.0

    def quantile(self, q: float) -> float:
        return statistics.quantiles(self.seconds, n=100, method="inclusive")[round(q * 100) - 1]

    def row(self) -> str:
        return (f"{self.name:<34} {self.per_second():>7.2f} {self.quantile(0.5):>7.2f} {self.quantile(0.95):>7.2f} "
                f"{statistics.mean(self.tokens):>8.1f} {sum(self.tokens) / self.wall:>8.1f}")


async def judge_pressure(side: Side, concurrency: int, stop: asyncio.Event) -> int:
    """Keep `concurrency` judge requests in flight until `stop`; the requests answered (those in flight when it stops
    are abandoned, as a client's timeout leaves them)."""
    answered = 0

    async def worker(w: int) -> None:
        nonlocal answered
        i = w
        while True:
            await side.judge(i)
            answered += 1
            i += concurrency

    workers = [asyncio.create_task(worker(w)) for w in range(concurrency)]
    await stop.wait()
    for task in workers:
        task.cancel()
    await asyncio.gather(*workers, return_exceptions=True)
    return answered


async def sampler_batch(server: RunningServer, requests: int, tokens: int) -> tuple[int, float]:
    """An RL-like batch on the sampler: (completion tokens, seconds)."""
    async def one(client: openai.AsyncOpenAI, i: int) -> int:
        answer = await client.chat.completions.create(
            model=server.model_name, messages=[{"role": "user", "content": f"Write a story about {ANSWERS[i % 8]}."}],
            max_tokens=tokens, temperature=1.0, extra_body={"ignore_eos": True})  # fmt: skip
        assert answer.usage is not None
        return answer.usage.completion_tokens

    async with openai.AsyncOpenAI(base_url=server.base_url, api_key="local", max_retries=0, timeout=3600) as client:
        start = time.perf_counter()
        done = await asyncio.gather(*(one(client, i) for i in range(requests)))
        return sum(done), time.perf_counter() - start


async def judge_decoding(meter: JudgeMeter) -> None:
    """Return once the judge's engine has generated tokens since the call (its load is on)."""
    before = await asyncio.to_thread(meter.scrape)
    start = before.counts["generation_tokens"] if before else 0.0
    while (now := await asyncio.to_thread(meter.scrape)) is None or now.counts["generation_tokens"] <= start:
        await asyncio.sleep(0.02)


async def sampler_with_and_without(sampler: RunningServer, judge: Side, meter: JudgeMeter,
                                   args: argparse.Namespace) -> dict[str, Any]:
    await sampler_batch(sampler, args.sampler_requests, 4)  # untimed
    totals = {"alone": [0, 0.0], "with the judge": [0, 0.0]}
    judge_answered = 0
    for _ in range(args.rounds):
        tokens, seconds = await sampler_batch(sampler, args.sampler_requests, args.sampler_tokens)
        totals["alone"][0] += tokens
        totals["alone"][1] += seconds
        stop = asyncio.Event()
        pressure = asyncio.create_task(judge_pressure(judge, args.concurrency, stop))
        await judge_decoding(meter)
        tokens, seconds = await sampler_batch(sampler, args.sampler_requests, args.sampler_tokens)
        stop.set()
        judge_answered += await pressure
        totals["with the judge"][0] += tokens
        totals["with the judge"][1] += seconds
    rates = {mode: tokens / seconds for mode, (tokens, seconds) in totals.items()}
    return {"alone": rates["alone"], "with_judge": rates["with the judge"],
            "ratio": rates["with the judge"] / rates["alone"], "judge_answered": judge_answered,
            "judge_per_s": judge_answered / totals["with the judge"][1]}  # fmt: skip


def run_threads(split: str) -> tuple[dict[str, str], dict[str, str], str]:
    """The environments of the sampler and the judge, and a line saying their CPU threads: on a CPU-only machine an
    RL run gives the sampler side half the cores and its judge half of that (trainer/launcher.py `cpu_split`,
    `start_judge`); `split` "none", a GPU or a set OMP_NUM_THREADS leave every server its default."""
    cores = usable_cores()
    if split == "none" or "OMP_NUM_THREADS" in os.environ or cuda_available() or cores < 2:
        return {}, {}, "every server its default threads"
    sampler = cores - cores // 2
    judge = max(1, sampler // 2)
    return ({"OMP_NUM_THREADS": str(sampler)}, {"OMP_NUM_THREADS": str(judge)},
            f"as an RL run on {cores} cores: the sampler {sampler} thread(s), the judge {judge} (the trainer's "
            f"{cores // 2} idle here), prime serve its default")


def start_prime_serve(model: str, log_dir: Path, max_model_len: int | None) -> ServerProcess:
    """`prime serve MODEL` as a user runs it (the console script beside this interpreter)."""
    port = free_port()
    argv = [str(Path(sys.executable).with_name("prime")), "serve", model, "--port", str(port)]
    if max_model_len:
        argv += ["--max-model-len", str(max_model_len)]
    return ServerProcess(argv, port=port, log_path=log_dir / "prime-serve.log", name="prime serve").start()


def served_model(base_url: str) -> str:
    import httpx

    return str(httpx.get(base_url + "/models", timeout=30).json()["data"][0]["id"])


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    if args.model == "tiny":
        from prime_lab.models import build_tiny_model

        path, spec = (folder := build_tiny_model(work / "tiny-qwen3")), str(folder)
    else:
        path, spec = resolve_model(args.model), args.model
    generation = {"max_new_tokens": args.max_new_tokens}
    options = SamplerOptions(max_model_len=args.max_model_len or None, lora=False,
                             **({"generation_config": generation} if SERVER_DEFAULTS else {}))  # type: ignore[arg-type]
    sampler_env, judge_env, threads = run_threads(args.cpu_split)
    print(f"Starting the judge, prime serve {spec} and a sampler ({path.name}) ...", file=sys.stderr)
    servers: list[RunningServer | ServerProcess] = []
    try:
        judge = start_sampler("builtin", path, work / "judge.log", served_name="judge", options=options, wait=False,
                              env=judge_env)
        servers.append(judge)
        serve = start_prime_serve(spec, work, args.max_model_len)
        servers.append(serve)
        sampler = start_sampler("builtin", path, work / "sampler.log", served_name="sampler",
                                options=SamplerOptions(max_model_len=args.max_model_len or None), wait=False,
                                env=sampler_env)
        servers.append(sampler)
        for process in (judge.process, serve, sampler.process):
            process.wait_ready(timeout=600)
        sides = [Side("judge (start_sampler, builtin)", judge, "judge",
                      None if SERVER_DEFAULTS else args.max_new_tokens),
                 Side(f"prime serve {Path(spec).name}", serve, served_model(serve.base_url))]
        meter = JudgeMeter(judge.root_url)

        async def part_one() -> dict[str, float]:
            async with sides[0].opened(), sides[1].opened():
                for side in sides:
                    await side.judge(0)  # untimed
                meter.step()
                for r in range(args.rounds):
                    for side in sides if r % 2 == 0 else sides[::-1]:
                        await side.batch(args.requests, args.concurrency)
            return meter.step()

        async def part_two() -> dict[str, Any]:
            async with sides[0].opened():
                return await sampler_with_and_without(sampler, sides[0], meter, args)

        judged = asyncio.run(part_one())
        serve.stop()
        sampled = asyncio.run(part_two())
    finally:
        for server in reversed(servers):
            server.stop()
    return {"sides": sides, "judge_metrics": judged, "sampler": sampled, "model": spec, "threads": threads}


def report(result: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    judge, serve = result["sides"]
    how = ("its generation default" if SERVER_DEFAULTS else "max_tokens in each request (no generation default yet)")
    print(f"Judge: {result['model']}, {args.requests} requests x {args.rounds} rounds a side, {args.concurrency} "
          f"concurrent, no max_tokens in the requests; the judge answers up to {args.max_new_tokens} tokens ({how}); "
          f"{result['threads']}")
    print(f"{'side':<34} {'req/s':>7} {'p50 s':>7} {'p95 s':>7} {'tok/ans':>8} {'tok/s':>8}")
    print(judge.row())
    print(serve.row())
    ratio = judge.per_second() / serve.per_second()
    p95 = judge.quantile(0.95) / serve.quantile(0.95)
    print(f"judge / prime serve: {ratio:.2f}x requests/s (goal >= 1.0x: {'met' if ratio >= 1.0 else 'NOT met'}), "
          f"p95 latency {p95:.2f}x")
    metrics = result["judge_metrics"]
    print("judge's own /metrics over its rounds: " + ", ".join(
        f"{key.removeprefix('judge/')} {value:.3g}" for key, value in metrics.items()))
    sampled = result["sampler"]
    print(f"Sampler: {args.sampler_requests} requests x {args.sampler_tokens} tokens, {args.rounds} rounds each way; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"sampler tokens/s: alone {sampled['alone']:.1f}, with the judge at {args.concurrency} concurrent "
          f"{sampled['with_judge']:.1f} (the judge answered {sampled['judge_answered']}, "
          f"{sampled['judge_per_s']:.2f} req/s)")
    print(f"sampler with / without the judge: {sampled['ratio']:.2f}x (goal >= 0.8x: "
          f"{'met' if sampled['ratio'] >= 0.8 else 'NOT met'})")
    both = {"judge": judge, "prime_serve": serve}
    return {"model": result["model"], "requests_per_s": {k: side.per_second() for k, side in both.items()},
            "p95_s": {k: side.quantile(0.95) for k, side in both.items()}, "ratio": ratio,
            "tokens_per_answer": {k: statistics.mean(side.tokens) for k, side in both.items()},
            "judge_metrics": metrics, "sampler": sampled}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="tiny (built here), a preset such as smollm2-135m, a folder")
    parser.add_argument("--requests", type=int, default=16, help="judge requests per round and side")
    parser.add_argument("--concurrency", type=int, default=16, help="judge requests in flight at once")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="the judge's answer length ([judge.sampling] "
                        "max_tokens, its server's max_new_tokens)")
    parser.add_argument("--max-model-len", type=int, default=512, help="context of every server (0: the model's "
                        "own; prime serve answers a request without max_tokens up to it)")
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds of each part")
    parser.add_argument("--sampler-requests", type=int, default=8, help="requests of the sampler's batch")
    parser.add_argument("--sampler-tokens", type=int, default=128, help="tokens of each sampler request")
    parser.add_argument("--cpu-split", choices=("run", "none"), default="run", help="run: the sampler's and the "
                        "judge's CPU threads as an RL run sets them on a CPU; none: each server's default")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    if min(args.requests, args.concurrency, args.rounds, args.sampler_requests, args.sampler_tokens) < 1 \
            or args.requests < 2:
        parser.error("--requests takes 2 or more; --concurrency, --rounds and the sampler's figures 1 or more")
    with tempfile.TemporaryDirectory(prefix="judge-bench-") as tmp:
        try:
            result = run(args, Path(tmp))
        except ModelNotFoundError as exc:
            print(f"bench/judge.py: {exc}", file=sys.stderr)  # the model, then the kinds of name it takes
            return 1
        except ServerStartError as exc:  # its first line names the server and its log
            print(f"bench/judge.py: {str(exc).splitlines()[0]}", file=sys.stderr)
            return 1
        except openai.APIError as exc:  # a server that failed or died mid-run
            print(f"bench/judge.py: a request failed mid-run ({type(exc).__name__}: {exc})", file=sys.stderr)
            return 1
        figures = report(result, args)
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
