"""GEPA: our engine vs the reference `gepa` package (PyPI, 0.1.4) on the same environment, models, budget and seed,
through the same local built-in server. Prints wall-clock seconds, final validation score (of each engine's best
candidate, on the same validation rows) and metric calls for both, the speed ratio, and the machine's load average
before and after (the server shares the CPU with whatever else runs). Both reflect at temperature 0 with the same
token limit; ours runs its default number of parallel proposals unless --parallel says otherwise, the reference
its default (one proposal per iteration).

`--simulated-latency S` replaces the built-in server by a stand-in endpoint that answers every request after S
seconds however many are in flight (as a GPU server or a hosted API does at these loads): the task model's reply is
a deterministic function of the system prompt (a reversal it truncates by an amount the prompt decides), the
reflection model's a fenced variant of the prompt. It measures the engines' scheduling alone, apart from how well
one CPU's server batches.

The reference package installs beside prime-lab (our code is `prime_lab.gepa`; PyPI's is `gepa`): it runs in a
subprocess of this interpreter (`pip install gepa==0.1.4` into .venv first if another release is there); its adapter
scores rollouts with the same environment code, concurrently like ours.

    .venv/bin/python bench/gepa_vs_reference.py [--model smollm2-135m] [--budget 60] [--env reverse-text]
                                                [--parallel 8] [--repeat 3] [--simulated-latency 0.5]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
REFERENCE_VERSION = "0.1.4"

REFERENCE_SCRIPT = r'''
import asyncio, json, sys, time
import gepa  # the reference package (PyPI)
from gepa import EvaluationBatch
from openai import AsyncOpenAI, OpenAI
from prime_lab.envs import SamplingArgs, load_environment
from gepa_split import split  # written next to this script

p = json.loads(sys.argv[2])
env = load_environment(p["env_id"])
train, val = split(env, p)
sampling = SamplingArgs(**p["sampling"])

def with_prompt(row, text):
    prompt = [dict(m) for m in row["prompt"]]
    if prompt and prompt[0]["role"] == "system":
        prompt[0]["content"] = text
    else:
        prompt.insert(0, {"role": "system", "content": text})
    return {**row, "prompt": prompt}

class EnvAdapter:
    propose_new_texts = None
    def evaluate(self, batch, candidate, capture_traces=False):
        rows = [with_prompt(r, candidate["system_prompt"]) for r in batch]
        async def go():
            client = AsyncOpenAI(base_url=p["base_url"], api_key="EMPTY")
            try:
                return await env.run_rollouts(client, p["model"], rows, sampling, max_concurrent=p["max_concurrent"])
            finally:
                await client.close()
        rollouts = asyncio.run(go())
        traces = [{"Inputs": r.prompt[-1]["content"], "Reward": r.reward, "Expected answer": r.answer,
                   "Generated Outputs": (r.completion or [{}])[-1].get("content", "")}
                  for r in rollouts] if capture_traces else None
        return EvaluationBatch(outputs=rollouts, scores=[r.reward for r in rollouts], trajectories=traces)
    def make_reflective_dataset(self, candidate, eval_batch, components_to_update):
        return {c: eval_batch.trajectories for c in components_to_update}

sync = OpenAI(base_url=p["base_url"], api_key="EMPTY")
def reflection_lm(prompt):
    r = sync.chat.completions.create(model=p["reflection_model"], messages=[{"role": "user", "content": prompt}],
                                     max_tokens=p["reflection_max_tokens"], temperature=0.0)
    return r.choices[0].message.content or ""

start = time.perf_counter()
result = gepa.optimize(seed_candidate={"system_prompt": env.system_prompt}, trainset=train, valset=val,
                       adapter=EnvAdapter(), reflection_lm=reflection_lm, max_metric_calls=p["budget"],
                       reflection_minibatch_size=p["minibatch_size"], skip_perfect_score=False, seed=p["seed"],
                       raise_on_exception=True)
seconds = time.perf_counter() - start
print("RESULT " + json.dumps({"seconds": seconds, "best_score": result.val_aggregate_scores[result.best_idx],
                              "metric_calls": result.total_metric_calls, "num_candidates": len(result.candidates),
                              "best_prompt": result.best_candidate["system_prompt"]}))
'''

SPLIT_MODULE = r'''
def split(env, p):
    import json
    key = lambda r: json.dumps(r["prompt"], sort_keys=True, default=str)
    train = env.get_dataset(-1, seed=p["seed"])[:p["num_train"]]
    seen = {key(r) for r in train}
    rest = [r for r in env.get_eval_dataset(-1, seed=p["seed"] + 1) if key(r) not in seen]
    return train, rest[:p["num_val"]]
'''


def reference_python() -> Path:
    """This interpreter, once the reference package at REFERENCE_VERSION is installed beside prime-lab."""
    import importlib.metadata

    try:
        version = importlib.metadata.version("gepa")
    except importlib.metadata.PackageNotFoundError:
        version = None
    if version != REFERENCE_VERSION:
        sys.exit(f"bench/gepa_vs_reference.py compares against gepa=={REFERENCE_VERSION} (found {version}): "
                 f"{sys.executable} -m pip install -c constraints.txt gepa=={REFERENCE_VERSION}")
    return Path(sys.executable)


def run_reference(params: dict[str, Any]) -> dict[str, Any]:
    python = reference_python()
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "reference_gepa.py"
        script.write_text(REFERENCE_SCRIPT)
        (Path(tmp) / "gepa_split.py").write_text(SPLIT_MODULE)
        proc = subprocess.run([str(python), str(script), str(REPO), json.dumps(params)], capture_output=True,
                              text=True, cwd=tmp)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"the reference run failed:\n{proc.stderr[-3000:]}")
    return dict(json.loads(lines[-1].removeprefix("RESULT ")))


def run_ours(params: dict[str, Any]) -> dict[str, Any]:
    from prime_lab.envs import load_environment
    from prime_lab.gepa.env_adapter import Endpoint
    from prime_lab.gepa.runner import GepaSettings, run_gepa

    settings = GepaSettings(env_id=params["env_id"], model=params["model"], num_train=params["num_train"],
                            num_val=params["num_val"], max_metric_calls=params["budget"],
                            minibatch_size=params["minibatch_size"], seed=params["seed"],
                            max_concurrent=params["max_concurrent"],
                            reflection_max_tokens=params["reflection_max_tokens"], reflection_temperature=0.0,
                            sampling=params["sampling"], num_parallel_proposals=params["parallel"])
    task = Endpoint(params["base_url"], params["model"])
    reflection = Endpoint(params["base_url"], params["reflection_model"])
    import openai  # noqa: F401 - imported before the clock starts, as the reference script does

    env = load_environment(params["env_id"])  # loaded before the clock too, as for the reference
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        outcome = run_gepa(settings, task, reflection, Path(tmp), env=env)
        seconds = time.perf_counter() - start
    state = outcome.state
    return {"seconds": seconds, "best_score": state.average(state.best_idx), "metric_calls": state.metric_calls,
            "num_candidates": len(state.candidates), "best_prompt": state.candidates[state.best_idx]["system_prompt"]}


class SimulatedModels:
    """An OpenAI-compatible stand-in: every chat completion answered after a fixed latency, concurrently."""

    TASK, REFLECTION = "sim-task", "sim-reflection"

    def __init__(self, latency: float) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        models = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: no new connection per request

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                time.sleep(latency)
                payload = json.dumps(models.reply(body)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 256  # the default 5 makes bursts of connections wait a second for a retry

        self.server = Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    @staticmethod
    def reply(request: dict[str, Any]) -> dict[str, Any]:
        messages = request["messages"]
        if request.get("model") == SimulatedModels.REFLECTION:
            tag = hashlib.sha256(messages[-1]["content"].encode()).hexdigest()[:8]
            content = f"```\nReverse the text character by character; answer in <reversed_text> tags ({tag}).\n```"
        else:
            system = messages[0]["content"] if messages[0]["role"] == "system" else ""
            quality = int(hashlib.sha256(system.encode()).hexdigest(), 16) % 1000 / 1000
            reversed_text = messages[-1]["content"][::-1]
            content = f"<reversed_text>\n{reversed_text[: round(len(reversed_text) * quality)]}\n</reversed_text>"
        return {"id": "sim", "object": "chat.completion", "created": 0, "model": request.get("model"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def warm_up(base_url: str, model: str) -> None:
    """A burst of short and long requests before either engine is timed, so that neither pays for the server's
    first batches of each shape (the first run of a pair was otherwise up to 1.6x slower)."""
    import asyncio

    from openai import AsyncOpenAI

    async def burst() -> None:
        client = AsyncOpenAI(base_url=base_url, api_key="EMPTY")
        short: Any = [{"role": "user", "content": "Reverse: comet desert river"}]
        long: Any = [{"role": "user", "content": "Improve these instructions for an assistant. " * 40}]
        try:
            for n in (1, 4, 16, 32):
                await asyncio.gather(*(client.chat.completions.create(
                    model=model, messages=long if i % 4 == 3 else short, max_tokens=8, temperature=0.0)
                    for i in range(n)))
        finally:
            await client.close()

    asyncio.run(burst())


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    from prime_lab.gepa.runner import GepaSettings

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="local preset or path, served by the built-in server")
    parser.add_argument("--env", default="reverse-text")
    parser.add_argument("--budget", type=int, default=60)
    parser.add_argument("--num-train", type=int, default=20)
    parser.add_argument("--num-val", type=int, default=10)
    parser.add_argument("--minibatch-size", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--reflection-max-tokens", type=int, default=96)
    parser.add_argument("--parallel", type=int, default=GepaSettings.num_parallel_proposals,
                        help="our parallel proposals (default: ours)")
    parser.add_argument("--repeat", type=int, default=1, help="pairs of runs, alternating who goes first")
    parser.add_argument("--simulated-latency", type=float, default=None, metavar="S",
                        help="a stand-in endpoint answering after S seconds instead of the built-in server")
    args = parser.parse_args()

    server: Any
    if args.simulated_latency is not None:
        server = SimulatedModels(args.simulated_latency)
        model, reflection_model = SimulatedModels.TASK, SimulatedModels.REFLECTION
        args.model = f"simulated ({args.simulated_latency:g} s a request)"
    else:
        from prime_lab.inference.launch import start_sampler
        from prime_lab.models import resolve_model

        server = start_sampler("builtin", resolve_model(args.model), Path(tempfile.mkdtemp()) / "server.log",
                               served_name=args.model)
        model = reflection_model = server.model_name
    print(f"env {args.env}  model {args.model}  budget {args.budget}  train {args.num_train}  val {args.num_val}  "
          f"minibatch {args.minibatch_size}  seed {args.seed}  ours: {args.parallel} parallel proposals", flush=True)
    ratios: list[float] = []
    try:
        warm_up(server.base_url, model)
        params: dict[str, Any] = {
            "env_id": args.env, "model": model, "reflection_model": reflection_model, "base_url": server.base_url,
            "budget": args.budget,
            "num_train": args.num_train, "num_val": args.num_val, "minibatch_size": args.minibatch_size,
            "seed": args.seed, "max_concurrent": 32, "reflection_max_tokens": args.reflection_max_tokens,
            "sampling": {"max_tokens": args.max_tokens, "temperature": 0.0}, "parallel": args.parallel}
        for n in range(args.repeat):
            load_before = load()
            if n % 2 == 0:  # alternate who goes first, so a load that drifts favours neither
                ours, reference = run_ours(params), run_reference(params)
            else:
                reference, ours = run_reference(params), run_ours(params)
            print(f"run {n + 1}: load average (1, 5, 15 min) on {os.cpu_count()} CPUs: before {load_before}, "
                  f"after {load()}")
            for name, r in (("ours", ours), (f"gepa {REFERENCE_VERSION}", reference)):
                print(f"{name:>11}: {r['seconds']:7.1f} s  best val score {r['best_score']:.4f}  "
                      f"metric calls {r['metric_calls']}  candidates {r['num_candidates']}")
            ratios.append(reference["seconds"] / ours["seconds"])
            print(f"speed ratio (reference / ours): {ratios[-1]:.2f}x  "
                  f"score: ours {ours['best_score']:.4f} vs {reference['best_score']:.4f}", flush=True)
    finally:
        server.stop()
    if len(ratios) > 1:
        print(f"median speed ratio over {len(ratios)} runs: {statistics.median(ratios):.2f}x "
              f"(each: {', '.join(f'{r:.2f}' for r in ratios)})")

if __name__ == "__main__":
    main()
