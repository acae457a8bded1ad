"""The real vLLM server on the tiny model, through the real `openai` client: chat, n > 1, the RL fields, and LoRA
adapters loaded, replaced in place and unloaded at runtime (one server for the session: `vllm_server`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import openai
import pytest

from prime_lab.inference.control import AdapterLoadError
from prime_lab.inference.vllm import VLLMServer
from prime_lab.models.random_lora import build_random_lora_adapter
from tests.plugins.servers import ReferenceForward, TrainedAdapter
from tests.plugins.vllm import RUN_ADAPTER_NAME

pytestmark = pytest.mark.slow  # the session's vLLM server takes about a minute to start on 2 cores

PROMPT = [{"role": "user", "content": "Reverse the text: hello world"}]
# Longer than a KV-cache block, so a repeated request hits the prefix cache (the trap needs a cache hit).
LONG_PROMPT = [{"role": "user", "content": "Reverse the text: hello world " * 60}]


def client(server: VLLMServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="unused", timeout=120)


def greedy_logprobs(server: VLLMServer, model: str, messages: list[dict[str, str]] = PROMPT) -> list[float]:
    response = client(server).chat.completions.create(
        model=model, messages=messages,  # type: ignore[arg-type]
        max_tokens=6, temperature=0, logprobs=True, extra_body={"ignore_eos": True},
    )
    logprobs = response.choices[0].logprobs
    assert logprobs is not None and logprobs.content, "logprobs were requested"
    return [entry.logprob for entry in logprobs.content]


@pytest.fixture(scope="module")
def adapters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return {f"seed{seed}": build_random_lora_adapter(tiny_model_dir, root / f"seed{seed}", seed=seed, b_std=0.1)
            for seed in (1, 2)}


def test_chat_with_n_samples_returns_the_rl_fields(vllm_server: VLLMServer) -> None:
    from transformers import AutoTokenizer

    response = client(vllm_server).chat.completions.create(
        model=vllm_server.model_name, messages=PROMPT, n=3, max_tokens=8, temperature=1.0, logprobs=True,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    body = response.model_dump()
    tokenizer = AutoTokenizer.from_pretrained(vllm_server.model_path)
    expected_prompt = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=True,
                                                    return_dict=False)
    assert body["prompt_token_ids"] == list(expected_prompt)
    assert [choice["index"] for choice in body["choices"]] == [0, 1, 2]
    for choice in body["choices"]:
        assert len(choice["token_ids"]) == 8 == len(choice["logprobs"]["content"])
        assert all(entry["logprob"] <= 0.0 for entry in choice["logprobs"]["content"])
        # vLLM's incremental detokenizer holds back a last token that ends inside a UTF-8 character (a byte-level
        # token of a multi-byte character), where a whole decode shows U+FFFD: the text is the decode less that tail.
        decoded = tokenizer.decode(choice["token_ids"])
        assert choice["message"]["content"] in (decoded, decoded.rstrip("\ufffd"))
    assert body["usage"]["completion_tokens"] == 24
    assert len({tuple(c["token_ids"]) for c in body["choices"]}) > 1, "3 samples at temperature 1 all equal"


def test_models_route_and_health(vllm_server: VLLMServer) -> None:
    assert httpx.get(f"{vllm_server.root_url}/health", timeout=10).status_code == 200
    ids = [model.id for model in client(vllm_server).models.list()]
    assert vllm_server.model_name in ids


def test_adapter_swapped_in_place_changes_logprobs(vllm_server: VLLMServer, adapters: dict[str, Path]) -> None:
    base = greedy_logprobs(vllm_server, vllm_server.model_name)
    vllm_server.adapters.load("policy", adapters["seed1"])
    first = greedy_logprobs(vllm_server, "policy")
    vllm_server.adapters.load("policy", adapters["seed2"])  # same name: replaced in place
    second = greedy_logprobs(vllm_server, "policy")
    assert max(abs(a - b) for a, b in zip(base, first, strict=True)) > 1e-3
    assert max(abs(a - b) for a, b in zip(first, second, strict=True)) > 1e-3
    listed = {model.id for model in client(vllm_server).models.list()}
    assert "policy" in listed
    vllm_server.adapters.unload("policy")
    with pytest.raises(openai.NotFoundError):
        greedy_logprobs(vllm_server, "policy")
    assert greedy_logprobs(vllm_server, vllm_server.model_name) == pytest.approx(base, abs=1e-5)


def test_adapter_rewritten_at_the_same_path_is_served_fresh(
    vllm_server: VLLMServer, adapters: dict[str, Path], tmp_path: Path
) -> None:
    """The prefix-cache trap: new files at an old path must not be served from stale cached state.

    (Measured: reloading in place from the same path, this prompt's logprobs matched neither adapter.)"""
    vllm_server.adapters.load("fresh-check", adapters["seed2"])
    expected = greedy_logprobs(vllm_server, "fresh-check", LONG_PROMPT)
    vllm_server.adapters.unload("fresh-check")

    step_dir = tmp_path / "adapter"  # a trainer that rewrites one folder every step
    shutil.copytree(adapters["seed1"], step_dir)
    vllm_server.adapters.load("trainee", step_dir)
    greedy_logprobs(vllm_server, "trainee", LONG_PROMPT)  # fills the prefix cache under (trainee, step_dir)
    shutil.rmtree(step_dir)
    shutil.copytree(adapters["seed2"], step_dir)
    used = vllm_server.adapters.load("trainee", step_dir)
    assert used != step_dir.resolve()
    assert greedy_logprobs(vllm_server, "trainee", LONG_PROMPT) == pytest.approx(expected, abs=1e-4)
    vllm_server.adapters.unload("trainee")


def test_loading_a_missing_adapter_is_a_clear_error(vllm_server: VLLMServer, tmp_path: Path) -> None:
    with pytest.raises(AdapterLoadError, match="could not load adapter 'ghost'.*HTTP 4"):
        vllm_server.adapters.load("ghost", tmp_path / "no-such-adapter")
    assert httpx.get(f"{vllm_server.root_url}/health", timeout=10).status_code == 200


def test_lora_modules_at_start_up_serve_a_run_adapter(vllm_server: VLLMServer, trained_adapter: TrainedAdapter,
                                                      reference_forward: ReferenceForward) -> None:
    """vLLM's own `--lora-modules NAME=PATH` accepts an adapter as a run writes it, and serves its logprobs."""
    served = {m.id for m in client(vllm_server).models.list().data}
    assert RUN_ADAPTER_NAME in served
    body = client(vllm_server).chat.completions.create(
        model=RUN_ADAPTER_NAME, messages=PROMPT, max_tokens=6, temperature=1.0, logprobs=True, seed=3,  # type: ignore[arg-type]
        extra_body={"return_token_ids": True},
    ).model_dump()
    choice = body["choices"][0]
    expected = reference_forward.logprobs(body["prompt_token_ids"], choice["token_ids"], trained_adapter.path)
    assert [e["logprob"] for e in choice["logprobs"]["content"]] == pytest.approx(expected, abs=1e-4)
