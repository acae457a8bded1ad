"""vLLM's `prompt_logprobs` on the built-in server, and `scoring.prompt_logprobs`, the client that prefill-scores a
token sequence on any server that answers them (on-policy distillation: the teacher scores the student's tokens).

The built-in server's prompt logprobs must equal transformers' own log-softmax of the tiny model's logits at each
prompt position (float32, 1e-4), through the base model and a LoRA adapter, on both routes, with the top k ranked;
its engine must score a prompt a chunk at a time and still decode from it. Against the real vLLM (slow): the same
response shape, and the same scores through the client (1e-3).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from prime_lab.inference.builtin.launcher import BuiltinServer
from prime_lab.inference.scoring import prompt_logprobs
from prime_lab.runs.processes import RunningServer
from tests.plugins.servers import ReferenceForward

LOGPROB_TOLERANCE = 1e-4
ENGINES_TOLERANCE = 1e-3
TOP_K = 5
MESSAGES = [{"role": "user", "content": "Score every token of this prompt, please."}]


def token_sequence(length: int, seed: int, vocab: int = 1000) -> list[int]:
    import random

    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(length)]


def complete(server: RunningServer, **fields: Any) -> dict[str, Any]:
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=300)
    fields.setdefault("model", server.model_name)
    fields.setdefault("max_tokens", 1)
    return client.completions.create(**fields).model_dump()


def chat(server: RunningServer, **fields: Any) -> dict[str, Any]:
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=300)
    fields.setdefault("model", server.model_name)
    fields.setdefault("messages", MESSAGES)
    fields.setdefault("max_tokens", 1)
    return client.chat.completions.create(**fields).model_dump()


def score(server: RunningServer, token_ids: list[int], model: str | None = None) -> list[float]:
    async def run() -> list[float]:
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0,
                                      timeout=300) as client:
            return await prompt_logprobs(client, model or server.model_name, token_ids)

    return asyncio.run(run())


def reference_log_softmax(reference: ReferenceForward, token_ids: list[int]) -> Any:
    """[len - 1, vocab]: transformers' float32 log-softmax of the tiny model's logits at each position but the
    last."""
    import torch

    with torch.no_grad():
        logits = reference.base(input_ids=torch.tensor([token_ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, dim=-1)


def check_against_reference(entries: list[Any], token_ids: list[int], expected: Any, top_k: int,
                            decode: Any) -> list[float]:
    """The prompt logprobs `entries` (vLLM's shape, as JSON gave them) of `token_ids` against `expected`
    [len - 1, vocab]: the prompt token's logprob and rank, and the top k in rank order. Returns the prompt tokens'
    logprobs."""
    assert len(entries) == len(token_ids)
    assert entries[0] is None
    reported = []
    for position, (token_id, entry) in enumerate(zip(token_ids[1:], entries[1:], strict=True)):
        row = expected[position]
        assert all(isinstance(key, str) for key in entry), "token ids are JSON object keys"
        actual = entry[str(token_id)]
        assert set(actual) == {"logprob", "rank", "decoded_token"}
        assert actual["logprob"] == pytest.approx(float(row[token_id]), abs=LOGPROB_TOLERANCE)
        assert actual["decoded_token"] == decode(token_id)
        more_likely = int((row > row[token_id] + LOGPROB_TOLERANCE).sum())
        at_most_as_likely = int((row >= row[token_id] - LOGPROB_TOLERANCE).sum())
        assert more_likely + 1 <= actual["rank"] <= at_most_as_likely
        top = sorted((e["rank"], int(t), e["logprob"]) for t, e in entry.items() if e["rank"] <= top_k)
        assert [rank for rank, _, _ in top] == list(range(1, top_k + 1)), entry
        assert len(entry) in (top_k, top_k + 1)
        expected_top = row.topk(top_k).values.tolist()
        assert [logprob for _, _, logprob in top] == pytest.approx(expected_top, abs=LOGPROB_TOLERANCE)
        for _, top_id, logprob in top:
            assert logprob == pytest.approx(float(row[top_id]), abs=LOGPROB_TOLERANCE)
        reported.append(actual["logprob"])
    return reported


def test_text_completion_scores_a_token_prompt_with_the_models_own_distribution(
    builtin_server: BuiltinServer, reference_forward: ReferenceForward
) -> None:
    ids = token_sequence(40, seed=1)
    body = complete(builtin_server, prompt=ids, n=2, temperature=1.0, extra_body={"prompt_logprobs": TOP_K})
    assert body.get("prompt_logprobs") is None, "text completions carry them on each choice, as vLLM does"
    first, second = body["choices"]
    assert first["prompt_logprobs"] == second["prompt_logprobs"]
    assert first["finish_reason"] in ("length", "stop") and first["logprobs"] is None
    expected = reference_log_softmax(reference_forward, ids)
    check_against_reference(first["prompt_logprobs"], ids, expected, TOP_K, reference_forward.tokenizer.decode)


def test_a_text_prompt_and_a_chat_are_scored_as_their_token_ids(
    builtin_server: BuiltinServer, reference_forward: ReferenceForward
) -> None:
    text = complete(builtin_server, prompt="The sky is blue because", max_tokens=3,
                    extra_body={"prompt_logprobs": 2, "return_token_ids": True})["choices"][0]
    ids = text["prompt_token_ids"]
    check_against_reference(text["prompt_logprobs"], ids, reference_log_softmax(reference_forward, ids), 2,
                            reference_forward.tokenizer.decode)

    body = chat(builtin_server, max_tokens=2, temperature=0.7, top_p=0.5,
                extra_body={"prompt_logprobs": 0, "return_token_ids": True})
    assert "prompt_logprobs" not in body["choices"][0], "chat carries them at the top level, as vLLM does"
    ids = body["prompt_token_ids"]
    expected = reference_log_softmax(reference_forward, ids)  # raw: the request's temperature and top_p do not apply
    reported = check_against_reference(body["prompt_logprobs"], ids, expected, 0, reference_forward.tokenizer.decode)
    assert all(len(entry) == 1 for entry in body["prompt_logprobs"][1:]), "k = 0: the prompt token alone"
    assert reported == pytest.approx(reference_forward.logprobs(ids[:1], ids[1:]), abs=LOGPROB_TOLERANCE)


def test_the_scoring_client_returns_one_logprob_per_token_after_the_first(
    builtin_server: BuiltinServer, reference_forward: ReferenceForward
) -> None:
    ids = token_sequence(33, seed=2)
    scores = score(builtin_server, ids)
    assert len(scores) == len(ids) - 1
    assert scores == pytest.approx(reference_forward.logprobs(ids[:1], ids[1:]), abs=LOGPROB_TOLERANCE)
    entries = complete(builtin_server, prompt=ids, extra_body={"prompt_logprobs": 0})["choices"][0]["prompt_logprobs"]
    assert scores == [entry[str(token)]["logprob"] for token, entry in zip(ids[1:], entries[1:], strict=True)]
    assert score(builtin_server, ids[:1]) == []


def test_the_requested_adapter_scores_and_scoring_runs_beside_generation(
    builtin_server: BuiltinServer, tiny_lora_adapters: tuple[Path, Path], reference_forward: ReferenceForward
) -> None:
    adapter = tiny_lora_adapters[0]
    builtin_server.adapters.load("scoring-a", adapter)
    try:
        ids = token_sequence(24, seed=3)
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            adapted = pool.submit(score, builtin_server, ids, "scoring-a")
            base = pool.submit(score, builtin_server, ids)
            sampled = pool.submit(chat, builtin_server, max_tokens=8, logprobs=True,
                                  extra_body={"return_token_ids": True, "ignore_eos": True})
            adapted_scores, base_scores, sampled_body = adapted.result(), base.result(), sampled.result()
    finally:
        builtin_server.adapters.unload("scoring-a")
    assert adapted_scores == pytest.approx(reference_forward.logprobs(ids[:1], ids[1:], adapter),
                                           abs=LOGPROB_TOLERANCE)
    assert base_scores == pytest.approx(reference_forward.logprobs(ids[:1], ids[1:]), abs=LOGPROB_TOLERANCE)
    assert max(abs(a - b) for a, b in zip(adapted_scores, base_scores, strict=True)) > 1e-3, "the adapter changes them"
    choice = sampled_body["choices"][0]
    assert len(choice["token_ids"]) == 8
    assert sampled_body["prompt_logprobs"] is None, "not asked for"
    assert [e["logprob"] for e in choice["logprobs"]["content"]] == pytest.approx(
        reference_forward.logprobs(sampled_body["prompt_token_ids"], choice["token_ids"]), abs=LOGPROB_TOLERANCE)


@pytest.mark.parametrize(("value", "message"), [
    (TOP_K * 5, "Requested prompt logprobs of 25, which is greater than max allowed: 20"),
    (-1, "which is greater than max allowed: 20"),
    (-2, "prompt_logprobs"),
])  # fmt: skip
def test_prompt_logprobs_beyond_vllms_limit_are_refused(builtin_server: BuiltinServer, value: int,
                                                        message: str) -> None:
    request = {"model": builtin_server.model_name, "prompt": [1, 2, 3], "max_tokens": 1, "prompt_logprobs": value}
    response = httpx.post(builtin_server.base_url + "/completions", json=request, timeout=60)
    assert response.status_code == 400
    assert message in response.json()["error"]["message"]


def test_the_engine_scores_a_prompt_a_chunk_at_a_time_and_decodes_from_it(
    tiny_model_dir: Path, reference_forward: ReferenceForward
) -> None:
    """Chunks of 3 positions, a scored and a plain request admitted together: the scores, and the tokens both then
    generate, equal a single forward pass."""
    import torch

    from prime_lab.inference.builtin.adapters import ServedModel
    from prime_lab.inference.builtin.engine import GenerationEngine
    from prime_lab.inference.builtin.prompts import PromptCodec
    from prime_lab.inference.builtin.sampling import SamplingParams
    from prime_lab.inference.builtin.sequences import GenerationRequest
    from prime_lab.inference.builtin.server import load_model

    module = load_model(tiny_model_dir, torch.float32).eval()
    model = ServedModel(name="tiny", module=module, root=str(tiny_model_dir))
    engine = GenerationEngine(PromptCodec(reference_forward.tokenizer), frozenset(), module.config.vocab_size,
                              torch.device("cpu"), prompt_chunk_size=3)
    params = SamplingParams(max_tokens=5, logprobs=True)
    ids, other = token_sequence(14, seed=4), token_sequence(9, seed=5)
    scored = engine.submit(GenerationRequest(ids, 2, params, model, prompt_logprobs=3))
    plain = engine.submit(GenerationRequest(other, 1, params, model))
    engine.start()
    try:
        scored_choices, plain_choices = scored.result(timeout=120), plain.result(timeout=120)
    finally:
        engine.stop()
    scores = scored_choices[0].prompt_logprobs
    assert scores is not None and scored_choices[1].prompt_logprobs is scores
    assert plain_choices[0].prompt_logprobs is None
    expected = reference_log_softmax(reference_forward, ids)
    assert scores.logprobs == pytest.approx(reference_forward.logprobs(ids[:1], ids[1:]), abs=LOGPROB_TOLERANCE)
    assert [[t for t, _ in top] for top in scores.top] == expected.topk(3).indices.tolist()
    assert len(scores.ranks) == len(ids) - 1
    for prompt, choice in [(ids, scored_choices[0]), (ids, scored_choices[1]), (other, plain_choices[0])]:
        assert len(choice.token_ids) == 5
        assert choice.logprobs == pytest.approx(reference_forward.logprobs(prompt, choice.token_ids),
                                                abs=LOGPROB_TOLERANCE)


@pytest.mark.slow
def test_vllm_answers_the_same_shape_and_the_scoring_client_agrees(
    vllm_server: RunningServer, builtin_server: BuiltinServer
) -> None:
    """vLLM's CPU build: where each route puts `prompt_logprobs` and what an entry holds is what the built-in server
    answers, and the client's scores of one sequence agree between them."""
    ids = token_sequence(30, seed=6)

    def shape(body: dict[str, Any]) -> dict[str, Any]:
        def entry_shape(entries: Any) -> Any:  # per position: None, or the field names of its values
            if entries is None:
                return None
            return [None if e is None else sorted({tuple(sorted(v)) for v in e.values()}) for e in entries]

        return {"top": entry_shape(body.get("prompt_logprobs")),
                "choice": [entry_shape(c.get("prompt_logprobs")) for c in body["choices"]]}

    for server in (vllm_server, builtin_server):
        assert server.model_name == builtin_server.model_name
    text = [shape(complete(s, prompt=ids, extra_body={"prompt_logprobs": 2})) for s in (vllm_server, builtin_server)]
    assert text[0] == text[1]
    assert text[0]["top"] is None and text[0]["choice"][0][0] is None
    chats = [shape(chat(s, extra_body={"prompt_logprobs": 1})) for s in (vllm_server, builtin_server)]
    assert chats[0] == chats[1]
    assert chats[0]["choice"] == [None] and chats[0]["top"][0] is None

    vllm_scores, builtin_scores = score(vllm_server, ids), score(builtin_server, ids)
    assert len(vllm_scores) == len(ids) - 1
    assert vllm_scores == pytest.approx(builtin_scores, abs=ENGINES_TOLERANCE)
