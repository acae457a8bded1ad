"""What we send vLLM besides its command line: the body of `/v1/load_lora_adapter` for an adapter on MoE experts
(`is_3d_lora_weight`), and the orchestrator's warning when an answer was cut by the sampler's context rather than by
`max_tokens` (vLLM clamps `max_tokens` to the room after the prompt without a word)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import openai
import pytest

from prime_lab.envs import Rollout, SamplingArgs, SingleTurnEnv
from prime_lab.envs.environment import Turn
from prime_lab.inference.builtin.launcher import BuiltinServer
from prime_lab.inference.control import RuntimeAdapters, adapter_targets_parameters, load_adapter_payload
from prime_lab.inference.vllm import VLLMServer
from prime_lab.models.random_lora import build_random_lora_adapter
from prime_lab.models.tiny import build_tiny_model, tiny_moe_shape
from prime_lab.trainer.orchestrator import context_cut

EXPERTS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Adapters as peft writes them for a tiny Qwen3-MoE: one on the fused experts too, one on attention only."""
    root = tmp_path_factory.mktemp("moe-adapters")
    model = build_tiny_model(root / "tiny-qwen3-moe", shape=tiny_moe_shape("qwen3-moe"))
    return {
        "experts": build_random_lora_adapter(model, root / "experts", rank=4, target_modules=("q_proj",),
                                             target_parameters=EXPERTS),
        "dense": build_random_lora_adapter(model, root / "dense", rank=4, target_modules=("q_proj", "v_proj")),
    }


def test_an_adapter_on_the_experts_is_loaded_as_3d(adapters: dict[str, Path]) -> None:
    assert adapter_targets_parameters(adapters["experts"]) and not adapter_targets_parameters(adapters["dense"])
    body = load_adapter_payload("policy", adapters["experts"])
    assert body == {"lora_name": "policy", "lora_path": str(adapters["experts"]), "load_inplace": True,
                    "is_3d_lora_weight": True}
    assert "is_3d_lora_weight" not in load_adapter_payload("policy", adapters["dense"])  # as before: vLLM's default


class Recorder(BaseHTTPRequestHandler):
    """Answers 200 to every POST and keeps (route, JSON body)."""

    received: list[tuple[str, dict[str, Any]]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        length = int(self.headers.get("Content-Length") or 0)
        self.received.append((self.path, json.loads(self.rfile.read(length))))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's name)
        pass


@pytest.fixture
def recorder() -> Iterator[tuple[str, list[tuple[str, dict[str, Any]]]]]:
    received: list[tuple[str, dict[str, Any]]] = []
    handler = type("OwnRecorder", (Recorder,), {"received": received})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", received
    server.shutdown()
    server.server_close()


def test_every_load_of_an_expert_adapter_says_so_even_from_a_fresh_copy(
    adapters: dict[str, Path], recorder: tuple[str, list[tuple[str, dict[str, Any]]]]
) -> None:
    url, received = recorder
    runtime = RuntimeAdapters(url)
    try:
        runtime.load("policy", adapters["experts"])
        runtime.load("policy", adapters["experts"])  # the same folder again: loaded from a fresh copy
        runtime.load("dense", adapters["dense"])
    finally:
        runtime.discard_copies()
    routes = {route for route, _ in received}
    assert routes == {"/v1/load_lora_adapter"}
    first, second, dense = (body for _, body in received)
    assert first["is_3d_lora_weight"] is True and first["lora_path"] == str(adapters["experts"].resolve())
    assert second["is_3d_lora_weight"] is True and second["lora_path"] != first["lora_path"]
    assert "is_3d_lora_weight" not in dense


def turn(prompt: int, completion: int, finish: str) -> Turn:
    return Turn(prompt_token_ids=list(range(prompt)), completion_token_ids=list(range(completion)),
                finish_reason=finish)


def rollout(*turns: Turn, error: str | None = None) -> Rollout:
    return Rollout(example_id=0, task="t", prompt=[], turns=list(turns), error=error)


def test_a_completion_cut_by_the_context_is_told_with_its_numbers_and_the_fix() -> None:
    cut = context_cut(rollout(turn(1748, 300, "length")), max_tokens=512)
    assert cut is not None
    for words in ("300 tokens", "max_tokens = 512", "1748 tokens", "2048 tokens",
                  "raise [inference].max_model_len or lower [sampling].max_tokens"):
        assert words in cut
    # a later turn of a multi-turn rollout counts too; without max_tokens, "length" can only be the context
    assert context_cut(rollout(turn(10, 5, "stop"), turn(40, 8, "length")), max_tokens=16) is not None
    assert context_cut(rollout(turn(100, 50, "length")), max_tokens=None) is not None


def test_a_completion_cut_by_max_tokens_or_stopped_is_not_a_context_cut() -> None:
    assert context_cut(rollout(turn(100, 512, "length")), max_tokens=512) is None
    assert context_cut(rollout(turn(100, 20, "stop")), max_tokens=512) is None
    assert context_cut(rollout(Turn(finish_reason="length")), max_tokens=512) is None  # no token ids: no count
    assert context_cut(rollout(error="APIConnectionError: Connection error."), max_tokens=512) is None


def one_rollout(base_url: str, model: str, sampling: SamplingArgs) -> Rollout:
    env = SingleTurnEnv(dataset=[{"question": "Reverse the text: hello world", "answer": ""}])
    row = env.get_dataset()[0]

    async def run() -> Rollout:
        client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", timeout=600)
        try:
            return await env.rollout(client, model, row, sampling)
        finally:
            await client.close()

    return asyncio.run(run())


@pytest.mark.slow
def test_the_builtin_server_refuses_what_its_context_cannot_hold(builtin_server: BuiltinServer) -> None:
    result = one_rollout(builtin_server.base_url, builtin_server.model_name, SamplingArgs(max_tokens=2048))
    cut = context_cut(result, max_tokens=2048)
    assert result.error and cut is not None and "maximum context length" in cut and "[inference].max_model_len" in cut


@pytest.mark.slow
def test_vllm_cuts_a_completion_to_its_context_without_a_word_and_we_tell(vllm_server: VLLMServer) -> None:
    # the session's vLLM serves max_model_len 2048: max_tokens 2048 is accepted and clamped to 2048 - prompt
    sampling = SamplingArgs(max_tokens=2048, temperature=1.0, rl_fields=True, extra_body={"ignore_eos": True})
    result = one_rollout(vllm_server.base_url, vllm_server.model_name, sampling)
    assert result.error is None
    answer = result.turns[0]
    assert answer.finish_reason == "length" and answer.completion_token_ids and answer.prompt_token_ids
    assert len(answer.prompt_token_ids) + len(answer.completion_token_ids) == 2048  # vLLM's silent clamp
    cut = context_cut(result, max_tokens=2048)
    assert cut is not None and f"cut at {len(answer.completion_token_ids)} tokens" in cut and "2048 tokens" in cut
