"""Both engines speak one protocol: the same requests through the real `openai` client, against the built-in
server and the real vLLM (its CPU build here), must give the same response shape (RL fields included), logprobs
equal to a float32 transformers forward pass, working stop strings, adapters that load and swap in place, and
400s for malformed requests with the server still healthy afterwards.

The vLLM cases are marked slow (its server takes a minute or two to start); CI runs them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from prime_lab.runs.processes import RunningServer
from tests.plugins.servers import ReferenceForward

LOGPROB_TOLERANCE = 1e-4
MESSAGES = [{"role": "user", "content": "Name three colours and explain why the sky is blue."}]
RL_FIELDS = {"return_token_ids": True}

ENGINES = [
    pytest.param("builtin_server", id="builtin"),
    pytest.param("vllm_server", id="vllm", marks=pytest.mark.slow),
]

REQUIRED_CHAT_PATHS = {
    "id", "object", "created", "model", "usage.prompt_tokens", "usage.completion_tokens", "usage.total_tokens",
    "prompt_token_ids", "choices[].index", "choices[].finish_reason", "choices[].token_ids",
    "choices[].message.role", "choices[].message.content", "choices[].logprobs.content[].token",
    "choices[].logprobs.content[].logprob", "choices[].logprobs.content[].bytes",
    "choices[].logprobs.content[].top_logprobs[].token", "choices[].logprobs.content[].top_logprobs[].logprob",
}  # fmt: skip


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> RunningServer:
    server: RunningServer = request.getfixturevalue(request.param)
    return server


def client_for(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=300)


def rl_chat(server: RunningServer, model: str | None = None, **fields: Any) -> dict[str, Any]:
    """A chat completion with vLLM's RL fields (logprobs, prompt and completion token ids)."""
    request: dict[str, Any] = {"messages": MESSAGES, "max_tokens": 8, "temperature": 1.0, "logprobs": True}
    request.update(fields)
    request["extra_body"] = {**RL_FIELDS, **request.get("extra_body", {})}
    return client_for(server).chat.completions.create(model=model or server.model_name, **request).model_dump()


# Dicts keyed by data (token texts), not by field names.
DATA_KEYED = {"choices[].logprobs.top_logprobs[]"}


def key_paths(value: Any, prefix: str = "") -> set[str]:
    """Dotted paths of every key in a JSON value (list items merged as `[]`)."""
    paths: set[str] = set()
    if isinstance(value, dict) and prefix not in DATA_KEYED:
        for key, item in value.items():
            path = f"{prefix}.{key}" if prefix else key
            paths |= {path} | key_paths(item, path)
    elif isinstance(value, list):
        for item in value:
            paths |= key_paths(item, prefix + "[]")
    return paths


def assert_logprobs_match_forward_pass(
    body: dict[str, Any], reference: ReferenceForward, adapter: Path | None = None, *, temperature: float = 1.0,
    top_p: float = 1.0,
) -> list[list[float]]:
    reported_all = []
    for choice in body["choices"]:
        reported = [entry["logprob"] for entry in choice["logprobs"]["content"]]
        expected = reference.logprobs(body["prompt_token_ids"], choice["token_ids"], adapter,
                                      temperature=temperature, top_p=top_p)
        assert reported == pytest.approx(expected, abs=LOGPROB_TOLERANCE)
        reported_all.append(reported)
    return reported_all


def test_chat_with_n_returns_rl_fields_and_exact_logprobs(
    engine: RunningServer, reference_forward: ReferenceForward
) -> None:
    body = rl_chat(engine, n=3, top_logprobs=2, seed=17)
    assert REQUIRED_CHAT_PATHS <= key_paths(body)
    assert body["object"] == "chat.completion" and body["model"] == engine.model_name
    template = reference_forward.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert body["prompt_token_ids"] == reference_forward.tokenizer.encode(template, add_special_tokens=False)
    assert len(body["choices"]) == 3
    for choice in body["choices"]:
        assert choice["finish_reason"] in {"stop", "length"}
        assert 1 <= len(choice["token_ids"]) <= 8
        assert len(choice["logprobs"]["content"]) == len(choice["token_ids"])
        assert all(len(entry["top_logprobs"]) == 2 for entry in choice["logprobs"]["content"])
        assert all(isinstance(b, int) for entry in choice["logprobs"]["content"] for b in entry["bytes"])
    assert body["usage"]["prompt_tokens"] == len(body["prompt_token_ids"])
    assert body["usage"]["completion_tokens"] == sum(len(c["token_ids"]) for c in body["choices"])
    assert_logprobs_match_forward_pass(body, reference_forward)


@pytest.mark.parametrize(("temperature", "top_p"), [(0.7, 1.0), (1.3, 1.0), (0.8, 0.9)])
def test_logprobs_are_those_of_the_distribution_sampled_from(
    engine: RunningServer, reference_forward: ReferenceForward, temperature: float, top_p: float
) -> None:
    """What the trainer recomputes (temperature applied, the top-p nucleus renormalised): the importance ratio of
    an RL run is 1 at step 1 whatever the sampling settings. The raw logits' logprobs differ (checked: the test can
    fail on this model)."""
    body = rl_chat(engine, n=3, seed=23, temperature=temperature, top_p=top_p, max_tokens=12)
    assert_logprobs_match_forward_pass(body, reference_forward, temperature=temperature, top_p=top_p)
    raw = [reference_forward.logprobs(body["prompt_token_ids"], c["token_ids"]) for c in body["choices"]]
    reported = [[e["logprob"] for e in c["logprobs"]["content"]] for c in body["choices"]]
    assert max(abs(a - b) for r, q in zip(raw, reported, strict=True) for a, b in zip(r, q, strict=True)) > 1e-3


def test_text_completion_returns_token_ids_and_exact_logprobs(
    engine: RunningServer, reference_forward: ReferenceForward
) -> None:
    prompt = "The sky is blue because"
    body = client_for(engine).completions.create(
        model=engine.model_name, prompt=prompt, max_tokens=6, logprobs=1, seed=3, temperature=1.0,
        extra_body={**RL_FIELDS, "ignore_eos": True},
    ).model_dump()  # fmt: skip
    choice = body["choices"][0]
    assert choice["prompt_token_ids"] == reference_forward.tokenizer.encode(prompt)
    assert len(choice["token_ids"]) == 6 and choice["finish_reason"] == "length"
    expected = reference_forward.logprobs(choice["prompt_token_ids"], choice["token_ids"])
    assert choice["logprobs"]["token_logprobs"] == pytest.approx(expected, abs=LOGPROB_TOLERANCE)


def test_stop_strings_end_the_completion_before_the_stop(engine: RunningServer) -> None:
    free = rl_chat(engine, max_tokens=24, seed=99, extra_body={"ignore_eos": True})["choices"][0]
    text = free["message"]["content"]
    words = [m for m in re.finditer(r"[A-Za-z0-9]{2,}", text) if m.start() > 0]
    assert words, f"no word to stop at in {text!r}"
    stop = words[0].group()
    stopped = rl_chat(engine, max_tokens=24, seed=99, stop=[stop], extra_body={"ignore_eos": True})["choices"][0]
    assert stopped["message"]["content"] == text[: text.find(stop)]
    assert stopped["finish_reason"] == "stop" and stopped["stop_reason"] == stop
    assert len(stopped["token_ids"]) < len(free["token_ids"])


def test_an_adapter_loaded_and_replaced_in_place_changes_the_logprobs(
    engine: Any, tiny_lora_adapters: tuple[Path, Path], reference_forward: ReferenceForward
) -> None:
    first, second = tiny_lora_adapters
    name = "conformance-lora"
    engine.adapters.load(name, first)
    try:
        assert name in [m.id for m in client_for(engine).models.list().data]
        prompt = {"max_tokens": 6, "temperature": 0.0}
        base = rl_chat(engine, **prompt)
        with_first = rl_chat(engine, model=name, **prompt)
        assert_logprobs_match_forward_pass(with_first, reference_forward, first)
        engine.adapters.load(name, second)  # vLLM's load_inplace=True
        with_second = rl_chat(engine, model=name, **prompt)
        assert_logprobs_match_forward_pass(with_second, reference_forward, second)
        first_logprob = [b["choices"][0]["logprobs"]["content"][0]["logprob"] for b in (base, with_first, with_second)]
        assert len({round(lp, 3) for lp in first_logprob}) == 3, first_logprob
    finally:
        engine.adapters.unload(name)
    with pytest.raises(openai.NotFoundError):
        rl_chat(engine, model=name)


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(b'{"messages": [', id="malformed-json"),
        pytest.param({"messages": MESSAGES, "n": 0}, id="n-0"),
        pytest.param({"messages": MESSAGES, "temperature": -1}, id="negative-temperature"),
        pytest.param({"messages": MESSAGES, "top_p": 0}, id="top-p-0"),
        pytest.param({"messages": MESSAGES, "max_tokens": 100_000}, id="max-tokens-past-context"),
        pytest.param({"messages": [{"role": "user", "content": "word " * 5000}]}, id="prompt-past-context"),
    ],
)
def test_malformed_requests_get_400_and_the_server_stays_healthy(engine: RunningServer, payload: Any) -> None:
    if isinstance(payload, dict):
        payload = {"model": engine.model_name, **payload}
    response = httpx.post(
        engine.base_url + "/chat/completions",
        content=payload if isinstance(payload, bytes) else None,
        json=payload if isinstance(payload, dict) else None,
        headers={"content-type": "application/json"},
        timeout=120,
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert {"message", "type", "param", "code"} <= set(error) and error["code"] == 400 and error["message"]
    assert httpx.get(engine.root_url + "/health", timeout=30).status_code == 200
    assert rl_chat(engine, max_tokens=2)["choices"][0]["token_ids"]


def test_unknown_models_are_not_found(engine: RunningServer) -> None:
    with pytest.raises(openai.NotFoundError):
        rl_chat(engine, model="no-such-model")


@pytest.mark.slow
def test_both_engines_answer_with_the_same_shape(builtin_server: RunningServer, vllm_server: RunningServer) -> None:
    def both(call: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        return call(builtin_server), call(vllm_server)

    chats = both(lambda s: rl_chat(s, n=2, top_logprobs=3, seed=1))
    assert key_paths(chats[0]) == key_paths(chats[1])
    assert chats[0]["prompt_token_ids"] == chats[1]["prompt_token_ids"]

    def text(server: RunningServer) -> dict[str, Any]:
        return (
            client_for(server)
            .completions.create(
                model=server.model_name, prompt="The sky", max_tokens=3, logprobs=2, extra_body=RL_FIELDS
            )
            .model_dump()
        )

    texts = both(text)
    assert key_paths(texts[0]) == key_paths(texts[1])
    assert texts[0]["choices"][0]["prompt_token_ids"] == texts[1]["choices"][0]["prompt_token_ids"]
    models = both(lambda s: httpx.get(s.base_url + "/models", timeout=30).json())
    assert {"id", "object", "created", "owned_by", "root", "parent", "max_model_len"} <= key_paths(models[0]["data"][0])
    assert key_paths(models[0]) <= key_paths(models[1])


def test_generate_route_answers_as_the_chat_route_for_the_same_prompt(engine: RunningServer) -> None:
    """`POST /inference/v1/generate` (tokens in, tokens out: what verifiers 0.4's train client samples a v1 taskset's
    RL rollouts through; vLLM serves it under `--enable-scale-out`, which our vLLM command line carries from 0.32):
    at temperature 0, the chat route's token ids, logprobs (as `token_id:<id>`) and finish reason."""
    chatted = rl_chat(engine, temperature=0.0)
    body = {"model": engine.model_name, "token_ids": chatted["prompt_token_ids"],
            "sampling_params": {"max_tokens": 8, "temperature": 0.0, "logprobs": 1, "skip_special_tokens": False}}
    response = httpx.post(engine.root_url + "/inference/v1/generate", json=body, timeout=300)
    assert response.status_code == 200, response.text
    ours, theirs = response.json()["choices"][0], chatted["choices"][0]
    assert ours["token_ids"] == theirs["token_ids"] and ours["finish_reason"] == theirs["finish_reason"]
    content = ours["logprobs"]["content"]
    # each entry names its token: `token_id` (vLLM 0.32), and `token` as `token_id:<id>` (ours; renderers' shape)
    assert [entry["token_id"] for entry in content] == ours["token_ids"]
    if "token" in content[0]:
        assert [entry["token"] for entry in content] == [f"token_id:{t}" for t in ours["token_ids"]]
    assert [entry["logprob"] for entry in content] == pytest.approx(
        [entry["logprob"] for entry in theirs["logprobs"]["content"]], abs=LOGPROB_TOLERANCE)
    # what verifiers 0.4's train client reads it with (renderers), as driver_v1.py gives it to it: either shape
    import renderers.client as renderers_client

    from prime_lab.envs.driver_v1 import token_id_logprobs

    token_id_logprobs()
    assert renderers_client._parse_completion_logprobs(ours, ours["token_ids"]) == pytest.approx(
        [entry["logprob"] for entry in content])
    wrong = {**ours, "logprobs": {"content": [{**e, "token_id": e["token_id"] + 1} for e in content]}}
    if "token" not in content[0]:
        with pytest.raises(renderers_client.MalformedGenerateResponseError):  # an entry naming another token
            renderers_client._parse_completion_logprobs(wrong, ours["token_ids"])
