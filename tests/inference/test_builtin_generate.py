"""`POST /inference/v1/generate` on the built-in server (tokens in, tokens out, as vLLM serves it and as verifiers'
renderer client calls it), through real HTTP (one server per session: `builtin_server`), checked against the
server's own chat route."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from renderers import DefaultRendererConfig, create_renderer
from renderers.client import generate as renderers_generate
from transformers import AutoTokenizer

from prime_lab.inference.builtin.launcher import BuiltinServer
from tests.inference.test_builtin_server import MESSAGES, chat, counters, post, send_and_wait, wait_for
from tests.plugins.servers import TINY_SERVED_NAME

ROUTE = "/inference/v1/generate"


@pytest.fixture(scope="module")
def tokenizer(builtin_server: BuiltinServer) -> Any:
    return AutoTokenizer.from_pretrained(builtin_server.model_path)


@pytest.fixture(scope="module")
def prompt_ids(tokenizer: Any) -> list[int]:
    """MESSAGES rendered on the client side, as verifiers v1's renderer does with the chat template."""
    text = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    return list(tokenizer.encode(text, add_special_tokens=False))


def generate(server: BuiltinServer, token_ids: list[int], model: str | None = None, **fields: Any) -> dict[str, Any]:
    sampling = {"max_tokens": 8, "temperature": 0, "logprobs": 1, "skip_special_tokens": False, **fields}
    body = {"model": model or server.model_name, "token_ids": token_ids, "sampling_params": sampling}
    response = post(server, ROUTE, body)
    assert response.status_code == 200, response.text
    return dict(response.json())


def same_as_chat(generated: dict[str, Any], chatted: dict[str, Any]) -> None:
    """The generate answer has the chat answer's tokens, logprobs and finish reason, in vLLM's generate shape."""
    ours, theirs = generated["choices"][0], chatted["choices"][0]
    assert ours["token_ids"] == theirs["token_ids"] and ours["token_ids"]
    assert ours["finish_reason"] == theirs["finish_reason"]
    content = ours["logprobs"]["content"]
    assert [entry["token"] for entry in content] == [f"token_id:{t}" for t in ours["token_ids"]]
    assert [entry["token_id"] for entry in content] == ours["token_ids"]
    assert [e["logprob"] for e in content] == pytest.approx(
        [e["logprob"] for e in theirs["logprobs"]["content"]], abs=1e-5
    )


def test_generate_answers_as_the_chat_route_does_for_the_same_prompt(
    builtin_server: BuiltinServer, prompt_ids: list[int]
) -> None:
    chatted = chat(builtin_server, temperature=0, max_tokens=8, logprobs=True, extra_body={"return_token_ids": True})
    assert chatted["prompt_token_ids"] == prompt_ids
    body = {"model": TINY_SERVED_NAME, "token_ids": prompt_ids, "return_token_ids": True, "cache_salt": "x",
            "sampling_params": {"max_tokens": 8, "temperature": 0, "logprobs": 1, "skip_special_tokens": False,
                                "detokenize": False, "spaces_between_special_tokens": False}}  # fmt: skip
    response = post(builtin_server, ROUTE, body)
    assert response.status_code == 200, response.text
    generated = response.json()
    same_as_chat(generated, chatted)
    assert generated["model"] == TINY_SERVED_NAME and generated["request_id"].startswith("generate-tokens-")
    assert generated["prompt_token_ids"] == prompt_ids  # only when asked for (return_token_ids), as vLLM
    completion = len(generated["choices"][0]["token_ids"])
    assert generated["usage"]["prompt_tokens"] == len(prompt_ids)
    assert generated["usage"]["completion_tokens"] == completion
    assert generate(builtin_server, prompt_ids)["prompt_token_ids"] is None
    assert generate(builtin_server, prompt_ids, logprobs=None)["choices"][0]["logprobs"] is None


def test_the_renderer_client_that_verifiers_trains_with_reads_the_answer(
    builtin_server: BuiltinServer, tokenizer: Any, prompt_ids: list[int]
) -> None:
    """`renderers.client.generate` (verifiers' dependency) renders the chat, posts it to the route and checks each
    logprob entry's `token_id:<id>` against the ids; what it reads is what the chat route answers."""
    chatted = chat(builtin_server, temperature=0, max_tokens=5, logprobs=True, extra_body={"return_token_ids": True})
    client = openai.AsyncOpenAI(base_url=builtin_server.base_url, api_key="unused", max_retries=0, timeout=120)
    answer = asyncio.run(
        renderers_generate(
            client=client,
            renderer=create_renderer(tokenizer, DefaultRendererConfig()),
            messages=MESSAGES,
            model=builtin_server.model_name,
            sampling_params={"max_tokens": 5, "temperature": 0},
        )
    )
    assert answer["prompt_ids"] == prompt_ids
    assert answer["completion_ids"] == chatted["choices"][0]["token_ids"]
    expected = [e["logprob"] for e in chatted["choices"][0]["logprobs"]["content"]]
    assert answer["completion_logprobs"] == pytest.approx(expected, abs=1e-5)
    assert answer["finish_reason"] == chatted["choices"][0]["finish_reason"]


def test_max_tokens_and_stop_token_ids_end_the_generation(builtin_server: BuiltinServer, prompt_ids: list[int]) -> None:
    sampled: dict[str, Any] = {"max_tokens": 6, "ignore_eos": True, "temperature": 1.0, "seed": 11}  # greedy repeats
    long = generate(builtin_server, prompt_ids, **sampled)["choices"][0]
    assert len(long["token_ids"]) == 6 and long["finish_reason"] == "length" and long["stop_reason"] is None
    at = next(i for i, t in enumerate(long["token_ids"]) if i > 0 and t not in long["token_ids"][:i])
    stop_id = long["token_ids"][at]
    stopped = generate(builtin_server, prompt_ids, **sampled, stop_token_ids=[stop_id])
    choice = stopped["choices"][0]
    assert choice["token_ids"] == long["token_ids"][: at + 1]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop_id
    assert len(choice["logprobs"]["content"]) == at + 1


@pytest.mark.parametrize(
    ("payload", "status", "param"),
    [
        (b"{not json", 400, None),
        ({"sampling_params": {"max_tokens": 2}}, 400, "token_ids"),
        ({"token_ids": [], "sampling_params": {}}, 400, "token_ids"),
        ({"token_ids": [1, -3], "sampling_params": {}}, 400, "token_ids.1"),
        ({"token_ids": [1, 10_000_000], "sampling_params": {}}, 400, "token_ids"),
        ({"token_ids": [1, 2]}, 400, "sampling_params"),
        ({"token_ids": [1, 2], "sampling_params": {"logprobs": 50}}, 400, "sampling_params.logprobs"),
        ({"token_ids": [1, 2], "sampling_params": {"max_tokens": 10_000}}, 400, "max_tokens"),
        ({"token_ids": [1, 2], "sampling_params": {}, "stream": True}, 400, "stream=true"),
        ({"token_ids": [1, 2], "sampling_params": {}, "model": "no-such-model"}, 404, "model"),
    ],
)
def test_bad_requests_get_openai_errors(
    builtin_server: BuiltinServer, payload: Any, status: int, param: str | None
) -> None:
    if isinstance(payload, dict):
        payload = {"model": builtin_server.model_name, **payload}
    before = counters(builtin_server)
    response = post(builtin_server, ROUTE, payload)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status and error["message"]
    assert error["param"] == param
    failed = f'prime_lab_requests_failed_total{{route="generate",status="{status}"}}'
    assert counters(builtin_server)[failed] - before.get(failed, 0) == 1


def test_an_adapter_served_as_the_model_generates_as_on_the_chat_route(
    builtin_server: BuiltinServer, tiny_lora_adapters: tuple[Path, Path], prompt_ids: list[int]
) -> None:
    load = {"lora_name": "generate-lora", "lora_path": str(tiny_lora_adapters[0])}
    assert post(builtin_server, "/v1/load_lora_adapter", load).status_code == 200
    try:
        chatted = chat(builtin_server, model="generate-lora", temperature=0, max_tokens=6, logprobs=True,
                       extra_body={"return_token_ids": True})  # fmt: skip
        generated = generate(builtin_server, prompt_ids, model="generate-lora", max_tokens=6)
        same_as_chat(generated, chatted)
        assert generated["model"] == "generate-lora"
        base = generate(builtin_server, prompt_ids, max_tokens=6)["choices"][0]["logprobs"]["content"]
        assert [e["logprob"] for e in base] != [e["logprob"] for e in generated["choices"][0]["logprobs"]["content"]]
    finally:
        assert post(builtin_server, "/v1/unload_lora_adapter", {"lora_name": "generate-lora"}).status_code == 200


def test_generate_requests_are_counted_and_cancelled_when_the_client_goes(
    builtin_server: BuiltinServer, prompt_ids: list[int]
) -> None:
    model = builtin_server.model_name
    tokens = f'prime_lab_generation_tokens_total{{model="{model}"}}'
    cancelled = f'prime_lab_requests_cancelled_total{{route="generate",model="{model}"}}'
    answered = f'prime_lab_requests_total{{route="generate",model="{model}"}}'

    def grown(series: str, since: dict[str, int]) -> Any:
        return lambda: now if (now := counters(builtin_server)).get(series, 0) > since.get(series, 0) else None

    before = counters(builtin_server)
    long = {"max_tokens": 1800, "ignore_eos": True, "temperature": 1.0}
    client = send_and_wait(builtin_server, ROUTE, {"model": model, "token_ids": prompt_ids, "sampling_params": long})
    wait_for("generated token", grown(tokens, before))
    client.close()
    wait_for("cancelled request in /metrics", grown(cancelled, before))
    generate(builtin_server, prompt_ids, max_tokens=4, ignore_eos=True)
    settled = counters(builtin_server)
    generate(builtin_server, prompt_ids, max_tokens=4, ignore_eos=True)
    after = counters(builtin_server)
    assert after[tokens] - settled[tokens] == 4, "the cancelled request is still decoding"
    assert after[cancelled] - before.get(cancelled, 0) == 1
    assert after[answered] - before.get(answered, 0) == 2
    prompts = f'prime_lab_prompt_tokens_total{{model="{model}"}}'
    assert after[prompts] - settled[prompts] == len(prompt_ids)
    assert httpx.get(builtin_server.root_url + "/health").status_code == 200
