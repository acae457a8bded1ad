"""The built-in server, through real HTTP and the real `openai` client (one server per session: `builtin_server`).

Behaviour that only the built-in engine has (batching, merged adapters, its own errors) is tested here; what both
engines must do alike is in test_conformance.py.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import openai
import pytest

from prime_lab.inference.builtin.launcher import BuiltinServer, start_builtin_server
from prime_lab.inference.builtin.server import BuiltinServerSettings
from prime_lab.runs.processes import ServerProcess, ServerStartError, free_port
from prime_lab.runs.registry import pid_alive
from tests.plugins.servers import ReferenceForward

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
LOGPROB_TOLERANCE = 1e-4


def client_for(server: BuiltinServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)


def chat(server: BuiltinServer, **fields: Any) -> dict[str, Any]:
    fields.setdefault("model", server.model_name)
    fields.setdefault("messages", MESSAGES)
    fields.setdefault("max_tokens", 8)
    return client_for(server).chat.completions.create(**fields).model_dump()


def post(server: BuiltinServer, route: str, payload: Any) -> httpx.Response:
    content = payload if isinstance(payload, bytes) else None
    return httpx.post(
        server.root_url + route,
        content=content,
        json=None if content is not None else payload,
        headers={"content-type": "application/json"},
        timeout=120,
    )


def test_health_and_models_list_the_base_model(builtin_server: BuiltinServer) -> None:
    assert httpx.get(builtin_server.root_url + "/health").status_code == 200
    ids = [m.id for m in client_for(builtin_server).models.list().data]
    assert ids[0] == builtin_server.model_name


def test_n_choices_share_the_prompt_and_report_rl_fields(
    builtin_server: BuiltinServer, reference_forward: ReferenceForward
) -> None:
    body = chat(builtin_server, n=3, max_tokens=6, logprobs=True, seed=5, extra_body={"return_token_ids": True})
    expected_prompt = reference_forward.tokenizer.apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=False
    )
    assert body["prompt_token_ids"] == reference_forward.tokenizer.encode(expected_prompt, add_special_tokens=False)
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert len({tuple(c["token_ids"]) for c in body["choices"]}) > 1, "three samples at temperature 1 all equal"
    completion_tokens = sum(len(c["token_ids"]) for c in body["choices"])
    usage = body["usage"]
    assert usage["prompt_tokens"] == len(body["prompt_token_ids"])
    assert usage["completion_tokens"] == completion_tokens
    assert usage["total_tokens"] == len(body["prompt_token_ids"]) + completion_tokens
    for choice in body["choices"]:
        assert len(choice["logprobs"]["content"]) == len(choice["token_ids"])
        expected = reference_forward.logprobs(body["prompt_token_ids"], choice["token_ids"])
        reported = [entry["logprob"] for entry in choice["logprobs"]["content"]]
        assert reported == pytest.approx(expected, abs=LOGPROB_TOLERANCE)


def test_greedy_follows_the_argmax_and_the_same_seed_repeats(
    builtin_server: BuiltinServer, reference_forward: ReferenceForward
) -> None:
    greedy = chat(builtin_server, temperature=0, max_tokens=6, logprobs=True, top_logprobs=3,
                  extra_body={"return_token_ids": True})  # fmt: skip
    for entry in greedy["choices"][0]["logprobs"]["content"]:
        assert entry["logprob"] == pytest.approx(entry["top_logprobs"][0]["logprob"], abs=1e-6)
        assert len(entry["top_logprobs"]) == 3
    first = chat(builtin_server, seed=1234, max_tokens=10, extra_body={"return_token_ids": True})
    again = chat(builtin_server, seed=1234, max_tokens=10, extra_body={"return_token_ids": True})
    other = chat(builtin_server, seed=4321, max_tokens=10, extra_body={"return_token_ids": True})
    assert first["choices"][0]["token_ids"] == again["choices"][0]["token_ids"]
    assert first["choices"][0]["token_ids"] != other["choices"][0]["token_ids"]


def test_concurrent_requests_are_batched_without_changing_results(
    builtin_server: BuiltinServer, reference_forward: ReferenceForward
) -> None:
    prompts = [[{"role": "user", "content": "Count to ten. " * k}] for k in range(1, 9)]

    def one(index: int) -> dict[str, Any]:
        return chat(builtin_server, messages=prompts[index], seed=index, max_tokens=5 + index, logprobs=True,
                    extra_body={"return_token_ids": True})  # fmt: skip

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        together = list(pool.map(one, range(8)))
    alone = [one(i) for i in (0, 7)]
    assert together[0]["choices"][0]["token_ids"] == alone[0]["choices"][0]["token_ids"]
    assert together[7]["choices"][0]["token_ids"] == alone[1]["choices"][0]["token_ids"]
    for index, body in enumerate(together):
        choice = body["choices"][0]
        assert len(choice["token_ids"]) == 5 + index or choice["finish_reason"] == "stop"
        expected = reference_forward.logprobs(body["prompt_token_ids"], choice["token_ids"])
        assert [e["logprob"] for e in choice["logprobs"]["content"]] == pytest.approx(expected, abs=LOGPROB_TOLERANCE)


def test_text_completions_with_token_prompts_and_logprobs(
    builtin_server: BuiltinServer, reference_forward: ReferenceForward
) -> None:
    prompt_ids = reference_forward.tokenizer.encode("The capital of France is")
    completion = client_for(builtin_server).completions.create(
        model=builtin_server.model_name, prompt=prompt_ids, max_tokens=5, logprobs=2, n=2, seed=3,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    ).model_dump()  # fmt: skip
    assert len(completion["choices"]) == 2
    for choice in completion["choices"]:
        assert choice["prompt_token_ids"] == prompt_ids
        assert len(choice["token_ids"]) == 5 and choice["finish_reason"] == "length"
        expected = reference_forward.logprobs(prompt_ids, choice["token_ids"])
        assert choice["logprobs"]["token_logprobs"] == pytest.approx(expected, abs=LOGPROB_TOLERANCE)
        assert choice["text"] == reference_forward.tokenizer.decode(choice["token_ids"], skip_special_tokens=True)


def test_streamed_answers_are_the_whole_answers_in_chunks(builtin_server: BuiltinServer) -> None:
    """`stream=true` (inference/builtin/streaming.py) through the `openai` client's own stream reader: at
    temperature 0 the same text, token ids, logprobs and finish reason as the JSON answer, for each of n choices;
    the usage chunk where asked; counted in /metrics as answered."""
    client = client_for(builtin_server)
    fields: dict[str, Any] = {"model": builtin_server.model_name, "messages": MESSAGES, "max_tokens": 6,
                              "temperature": 0, "n": 2, "logprobs": True, "extra_body": {"return_token_ids": True}}
    whole = client.chat.completions.create(**fields).model_dump()
    answered = f'prime_lab_requests_total{{route="chat",model="{builtin_server.model_name}"}}'
    before = counters(builtin_server).get(answered, 0)
    chunks = [c.model_dump() for c in client.chat.completions.create(
        **fields, stream=True, stream_options={"include_usage": True})]  # fmt: skip
    assert counters(builtin_server)[answered] == before + 1
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and len({c["id"] for c in chunks}) == 1
    assert chunks[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]
    for choice in whole["choices"]:
        mine = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["index"] == choice["index"]]
        assert "".join(m["delta"]["content"] or "" for m in mine) == choice["message"]["content"]
        assert mine[0]["delta"]["role"] == "assistant" and mine[0]["token_ids"] == choice["token_ids"]
        assert [m["finish_reason"] for m in mine] == [None, choice["finish_reason"]]
        assert mine[0]["logprobs"]["content"] == choice["logprobs"]["content"]

    text: dict[str, Any] = {"model": builtin_server.model_name, "prompt": "The capital of France is", "max_tokens": 5,
            "temperature": 0, "logprobs": 1}
    whole_text = client.completions.create(**text).model_dump()
    streamed = [c.model_dump() for c in client.completions.create(**text, stream=True)]
    assert "".join(c["choices"][0]["text"] for c in streamed) == whole_text["choices"][0]["text"]
    assert streamed[-1]["choices"][0]["finish_reason"] == whole_text["choices"][0]["finish_reason"]
    assert streamed[0]["choices"][0]["logprobs"] == whole_text["choices"][0]["logprobs"]
    raw = post(builtin_server, "/v1/completions", {**text, "stream": True, "logprobs": None})
    assert raw.headers["content-type"].startswith("text/event-stream") and raw.text.endswith("data: [DONE]\n\n")


def test_chat_template_kwargs_reach_the_template(builtin_server: BuiltinServer) -> None:
    thinking = chat(builtin_server, max_tokens=1, extra_body={"return_token_ids": True})
    template_kwargs = {"chat_template_kwargs": {"enable_thinking": False}}
    no_thinking = chat(builtin_server, max_tokens=1, extra_body={"return_token_ids": True, **template_kwargs})
    assert len(no_thinking["prompt_token_ids"]) > len(thinking["prompt_token_ids"])
    assert no_thinking["prompt_token_ids"][: len(thinking["prompt_token_ids"])] == thinking["prompt_token_ids"]


def test_min_tokens_and_ignore_eos_hold_back_the_stop(builtin_server: BuiltinServer) -> None:
    body = chat(builtin_server, max_tokens=12, seed=0, extra_body={"ignore_eos": True, "return_token_ids": True})
    assert len(body["choices"][0]["token_ids"]) == 12 and body["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(
    ("payload", "status", "param"),
    [
        (b"{not json", 400, None),
        ({"messages": MESSAGES, "n": 0}, 400, "n"),
        ({"messages": MESSAGES, "temperature": -0.5}, 400, "temperature"),
        ({"messages": MESSAGES, "top_p": 0}, 400, "top_p"),
        ({"messages": MESSAGES, "top_logprobs": 50, "logprobs": True}, 400, "top_logprobs"),
        ({"messages": []}, 400, "messages"),
        ({"messages": MESSAGES, "stream": True, "n": 0}, 400, "n"),  # refused before a stream starts
        ({"messages": MESSAGES, "max_tokens": 10_000}, 400, "max_tokens"),
        ({"messages": [{"role": "user", "content": "word " * 3000}]}, 400, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, "messages[0]"),
        ({"messages": MESSAGES, "model": "no-such-model"}, 404, "model"),
    ],
)
def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(
    builtin_server: BuiltinServer, payload: Any, status: int, param: str | None
) -> None:
    response = post(builtin_server, "/v1/chat/completions", payload)
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status and error["message"]
    assert error["param"] == param
    assert chat(builtin_server, max_tokens=2)["choices"][0]["message"]["content"] is not None


def test_adapters_merge_load_replace_and_unload(
    builtin_server: BuiltinServer, tiny_lora_adapters: tuple[Path, Path], reference_forward: ReferenceForward
) -> None:
    first, second = tiny_lora_adapters
    load = {"lora_name": "builtin-a", "lora_path": str(first)}
    assert post(builtin_server, "/v1/load_lora_adapter", load).status_code == 200
    assert post(builtin_server, "/v1/load_lora_adapter", load).status_code == 400
    assert "builtin-a" in [m.id for m in client_for(builtin_server).models.list().data]

    def sampled(model: str) -> dict[str, Any]:
        return chat(builtin_server, model=model, max_tokens=6, logprobs=True, seed=7,
                    extra_body={"return_token_ids": True})  # fmt: skip

    def check(body: dict[str, Any], adapter: Path | None) -> list[float]:
        choice = body["choices"][0]
        reported = [e["logprob"] for e in choice["logprobs"]["content"]]
        assert reported == pytest.approx(
            reference_forward.logprobs(body["prompt_token_ids"], choice["token_ids"], adapter), abs=LOGPROB_TOLERANCE
        )
        return reported

    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # base and adapter requests at the same time
        base_body, adapter_body = pool.map(sampled, [builtin_server.model_name, "builtin-a"])
    check(base_body, None)
    check(adapter_body, first)

    replace = {"lora_name": "builtin-a", "lora_path": str(second), "load_inplace": True}
    assert post(builtin_server, "/v1/load_lora_adapter", replace).status_code == 200
    check(sampled("builtin-a"), second)
    check(sampled(builtin_server.model_name), None)  # the base weights are untouched by merging

    assert post(builtin_server, "/v1/unload_lora_adapter", {"lora_name": "builtin-a"}).status_code == 200
    assert post(builtin_server, "/v1/unload_lora_adapter", {"lora_name": "builtin-a"}).status_code == 404
    with pytest.raises(openai.NotFoundError):
        sampled("builtin-a")
    missing = {"lora_name": "builtin-missing", "lora_path": "/no/such/adapter"}
    assert post(builtin_server, "/v1/load_lora_adapter", missing).status_code == 404


def counters(server: BuiltinServer) -> dict[str, int]:
    """The server's `/metrics` counters, by series ('name{labels}')."""
    response = httpx.get(server.root_url + "/metrics", timeout=10)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    lines = [line.rsplit(" ", 1) for line in response.text.splitlines() if not line.startswith("#")]
    return {name: int(value) for name, value in lines if name.split("{")[0].endswith("_total")}


def test_metrics_count_answered_requests_and_policy_loads(
    builtin_server: BuiltinServer, tiny_lora_adapters: tuple[Path, Path]
) -> None:
    base = f'prime_lab_requests_total{{route="chat",model="{builtin_server.model_name}"}}'
    before = counters(builtin_server)
    chat(builtin_server)
    chat(builtin_server)
    load = {"lora_name": "builtin-metrics", "lora_path": str(tiny_lora_adapters[0])}
    assert post(builtin_server, "/v1/load_lora_adapter", load).status_code == 200
    chat(builtin_server, model="builtin-metrics")
    assert post(builtin_server, "/v1/unload_lora_adapter", {"lora_name": "builtin-metrics"}).status_code == 200
    after = counters(builtin_server)
    assert after[base] - before.get(base, 0) == 2
    assert after['prime_lab_requests_total{route="chat",model="builtin-metrics"}'] == 1
    assert after['prime_lab_policy_loads_total{kind="adapter",name="builtin-metrics"}'] == 1
    assert "loaded LoRA adapter 'builtin-metrics' from" in builtin_server.log_path.read_text()


def send_and_wait(server: BuiltinServer, route: str, payload: dict[str, Any]) -> socket.socket:
    """A client that sends a request and reads nothing: closing the socket is its disconnect (as an HTTP client's
    timeout closes its connection)."""
    url = urlsplit(server.root_url)
    assert url.hostname is not None and url.port is not None
    body = json.dumps(payload).encode()
    head = (f"POST {route} HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")  # fmt: skip
    client = socket.create_connection((url.hostname, url.port), timeout=10)
    client.sendall(head.encode() + body)
    return client


def wait_for(what: str, check: Callable[[], dict[str, int] | None], timeout: float = 10.0) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found is not None:
            return found
        time.sleep(0.01)
    raise AssertionError(f"no {what} within {timeout} s")


@pytest.mark.parametrize(
    ("route", "fields", "rows"),
    [("chat", {"messages": MESSAGES, "n": 3}, 3),
     ("completion", {"prompt": ["The capital of France is", "Once upon a time"], "n": 2}, 4)],
)  # fmt: skip
def test_a_request_whose_client_disconnects_stops_decoding_and_counts_as_cancelled(
    builtin_server: BuiltinServer, route: str, fields: dict[str, Any], rows: int
) -> None:
    """Starlette runs a handler to its end after its client has gone: without the server's own watch for the
    disconnect, the request below would decode all its rows to max_tokens and count as answered."""
    model = builtin_server.model_name
    path = "/v1/chat/completions" if route == "chat" else "/v1/completions"
    tokens = f'prime_lab_generation_tokens_total{{model="{model}"}}'
    cancelled = f'prime_lab_requests_cancelled_total{{route="{route}",model="{model}"}}'
    answered = f'prime_lab_requests_total{{route="{route}",model="{model}"}}'
    max_tokens = 1800  # about 3 s on two CPU cores: the disconnect comes after a few tokens

    def grown(series: str, since: dict[str, int]) -> Callable[[], dict[str, int] | None]:
        return lambda: now if (now := counters(builtin_server)).get(series, 0) > since.get(series, 0) else None

    before = counters(builtin_server)
    client = send_and_wait(builtin_server, path, {"model": model, "max_tokens": max_tokens, "ignore_eos": True,
                                                  **fields})  # fmt: skip
    wait_for("generated token", grown(tokens, before))
    client.close()
    wait_for("cancelled request in /metrics", grown(cancelled, before))
    short = {"model": model, "max_tokens": 4, "ignore_eos": True, **fields}
    assert post(builtin_server, path, short).status_code == 200  # served: the cancelled rows are gone by its end
    settled = counters(builtin_server)
    assert post(builtin_server, path, short).status_code == 200
    after = counters(builtin_server)
    assert after[tokens] - settled[tokens] == rows * 4, "a cancelled row is still decoding"
    assert settled[tokens] - before.get(tokens, 0) - rows * 4 < rows * max_tokens / 4
    assert after[cancelled] - before.get(cancelled, 0) == 1
    assert after[answered] - before.get(answered, 0) == 2


def test_requests_running_on_an_adapter_move_to_its_in_place_replacement(
    builtin_server: BuiltinServer, tiny_lora_adapters: tuple[Path, Path]
) -> None:
    """As vLLM's in-place load does: a long request keeps its place in the batch and continues on the new weights,
    and a request for the replaced adapter joins that batch at once. (Were the running batch still on the old
    weights, the new request would wait for it to finish: one batch serves one set of weights.)"""
    first, second = tiny_lora_adapters
    name = "builtin-inplace"
    assert post(builtin_server, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(first)}).status_code \
        == 200
    finished: dict[str, float] = {}

    def timed(label: str, max_tokens: int) -> dict[str, Any]:
        body = chat(builtin_server, model=name, max_tokens=max_tokens, temperature=1.0, seed=3,
                    extra_body={"ignore_eos": True})  # fmt: skip
        finished[label] = time.monotonic()
        return body

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        long = pool.submit(timed, "long", 1800)
        time.sleep(0.5)  # the long request is decoding
        replace = {"lora_name": name, "lora_path": str(second), "load_inplace": True}
        assert post(builtin_server, "/v1/load_lora_adapter", replace).status_code == 200
        short = pool.submit(timed, "short", 4)
        assert short.result()["choices"][0]["finish_reason"] == "length"
        assert not long.done(), "the long request ended before the check: make it longer"
        body = long.result()
    assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 1800
    assert finished["short"] < finished["long"]
    assert post(builtin_server, "/v1/unload_lora_adapter", {"lora_name": name}).status_code == 200


def test_a_server_that_cannot_start_reports_its_log(tmp_path: Path) -> None:
    not_a_model = tmp_path / "not-a-model"
    not_a_model.mkdir()
    (not_a_model / "config.json").write_text("{}")
    with pytest.raises(ServerStartError) as failure:
        start_builtin_server(BuiltinServerSettings(model=not_a_model), log_path=tmp_path / "server.log", timeout=60)
    assert "exited with code" in str(failure.value)
    assert "Error" in str(failure.value) and "log" in str(failure.value)


def test_server_process_stops_its_process_group(tmp_path: Path) -> None:
    sleeper = ServerProcess([sys.executable, "-c", "import time; time.sleep(600)"], port=free_port(),
                            log_path=tmp_path / "sleep.log")  # fmt: skip
    with sleeper:
        with pytest.raises(ServerStartError, match="did not answer"):
            sleeper.wait_ready(timeout=1)
    assert sleeper.poll() is not None
    assert sleeper.stop() == sleeper.poll()


def test_a_server_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    """A `prime eval run` (or any owner) killed with -9 leaves no server behind: the parent-death signal."""
    owner_code = ("import sys, time; from pathlib import Path; "
                  "from prime_lab.runs.processes import ServerProcess; "
                  "p = ServerProcess([sys.executable, '-c', 'import time; time.sleep(600)'], port=1, "
                  "log_path=Path(sys.argv[1])).start(); print(p.pid, flush=True); time.sleep(600)")
    owner = subprocess.Popen([sys.executable, "-c", owner_code, str(tmp_path / "server.log")], stdout=subprocess.PIPE,
                             text=True)
    assert owner.stdout is not None
    server = int(owner.stdout.readline())
    assert pid_alive(server)
    owner.kill()
    owner.wait()
    deadline = time.monotonic() + 10
    while pid_alive(server):
        assert time.monotonic() < deadline, "the server outlived the process that started it"
        time.sleep(0.05)


def test_prime_serve_runs_the_builtin_server_in_the_foreground(tiny_model_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    prime = [sys.executable, "-c", "from prime_lab.workbench.cli.app import main; main()"]
    serve = ServerProcess([*prime, "serve", str(tiny_model_dir), "--port", str(port)], port=port,
                          log_path=tmp_path / "serve.log", name="prime serve")  # fmt: skip
    with serve.start():
        serve.wait_ready(timeout=120)
        models = openai.OpenAI(base_url=serve.base_url, api_key="unused").models.list()
        assert [m.id for m in models.data] == [tiny_model_dir.name]
    assert f"http://127.0.0.1:{port}/v1" in (tmp_path / "serve.log").read_text()


def test_prime_serve_explains_a_missing_model_without_a_traceback(tmp_path: Path) -> None:
    import subprocess

    prime = [sys.executable, "-c", "from prime_lab.workbench.cli.app import main; main()"]
    result = subprocess.run([*prime, "serve", "no-such-model-anywhere", "--port", str(free_port())],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.startswith("Error: model 'no-such-model-anywhere' is not a preset")
    assert "Traceback" not in result.stderr


LONG_CLIENTS = 8  # as a judge's rollouts: several long generations at once


def long_chats(server: BuiltinServer, max_tokens: int) -> list[socket.socket]:
    """`LONG_CLIENTS` clients each waiting on a long generation (ignore_eos: each decodes to max_tokens)."""
    payload = {"model": server.model_name, "messages": MESSAGES, "max_tokens": max_tokens, "ignore_eos": True}
    return [send_and_wait(server, "/v1/chat/completions", payload) for _ in range(LONG_CLIENTS)]


def decoding(server: BuiltinServer, since: dict[str, int]) -> dict[str, int]:
    """Wait until the server has generated tokens since `since` (the long requests are in the batch)."""
    tokens = f'prime_lab_generation_tokens_total{{model="{server.model_name}"}}'
    return wait_for("generated token", lambda: grown_by(server, tokens, since, 1))


def grown_by(server: BuiltinServer, series: str, since: dict[str, int], n: int) -> dict[str, int] | None:
    """The server's counters once `series` has grown by `n` since `since`, else None."""
    now = counters(server)
    return now if now.get(series, 0) - since.get(series, 0) >= n else None


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_the_server_stops_within_5_s_of_a_signal_with_long_generations_in_flight(
    tiny_model_dir: Path, tmp_path: Path, sig: signal.Signals
) -> None:
    """uvicorn's graceful shutdown waits for every open request to be answered: without a bound on it, the server
    would decode all the clients' tokens before it stopped (minutes on two cores)."""
    settings = BuiltinServerSettings(model=tiny_model_dir, served_model_name="tiny-stop", max_model_len=4096)
    server = start_builtin_server(settings, log_path=tmp_path / "server.log", timeout=120)
    try:
        clients = long_chats(server, 4000)  # tens of seconds of decoding on two cores
        decoding(server, {})
        assert server.process.pid is not None
        os.kill(server.process.pid, sig)
        start = time.monotonic()
        while (code := server.process.poll()) is None:
            assert time.monotonic() - start < 5, f"the server did not stop within 5 s of {sig.name}"
            time.sleep(0.02)
        answers = [client.recv(4096) for client in clients]
        for client in clients:
            client.close()
    finally:
        server.stop()
    assert all(answer.startswith(b"HTTP/1.1 503") and b"shutting down" in answer for answer in answers), answers[0]
    log_text = server.log_path.read_text()
    assert code == 0, f"exit code {code} after {sig.name}; log:\n{log_text}"
    assert "Traceback" not in log_text


def test_many_abandoned_long_requests_are_dropped_and_a_new_request_is_answered_at_once(
    builtin_server: BuiltinServer,
) -> None:
    cancelled = f'prime_lab_requests_cancelled_total{{route="chat",model="{builtin_server.model_name}"}}'
    before = counters(builtin_server)
    clients = long_chats(builtin_server, 1800)
    decoding(builtin_server, before)
    for client in clients:
        client.close()
    wait_for(f"{LONG_CLIENTS} cancelled requests", lambda: grown_by(builtin_server, cancelled, before, LONG_CLIENTS))
    start = time.monotonic()
    answer = httpx.post(builtin_server.base_url + "/chat/completions", timeout=5,
                        json={"model": builtin_server.model_name, "messages": MESSAGES, "max_tokens": 8})  # fmt: skip
    assert answer.status_code == 200 and time.monotonic() - start < 3, "the abandoned requests are still decoding"
