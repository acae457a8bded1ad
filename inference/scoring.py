"""Prefill scoring: a model's logprob of each token of a sequence given the tokens before it, from any server that
answers vLLM's `prompt_logprobs` (vLLM, or the built-in server). On-policy distillation has the teacher score the
student's tokens this way.

The sequence goes to `/v1/completions` as token ids with `max_tokens=1` (vLLM generates at least one token) and
`prompt_logprobs: 0` (the prompt tokens only, no top-k). The prompt logprobs are those of the model's raw
distribution in both servers (no temperature, whatever the request's). vLLM puts them on each choice of a text
completion and at the top level of a chat completion; both places are read here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import openai


async def prompt_logprobs(client: openai.AsyncOpenAI, model: str, token_ids: list[int]) -> list[float]:
    """The logprob of each of `token_ids[1:]` given the tokens before it under `model` on `client`'s server
    (len(token_ids) - 1 values; none for a sequence of fewer than two tokens). A ValueError when the server does
    not answer prompt logprobs, or answers them for another sequence."""
    if len(token_ids) < 2:
        return []
    response = await client.completions.create(
        model=model,
        prompt=token_ids,
        max_tokens=1,
        temperature=1.0,
        extra_body={"prompt_logprobs": 0},
    )
    entries = _prompt_logprobs_of(response.model_dump())
    if entries is None:
        raise ValueError(
            f"the teacher at {client.base_url} does not return prompt_logprobs: it must be vLLM or prime-lab's "
            "built-in server"
        )
    if len(entries) != len(token_ids):
        raise ValueError(
            f"the teacher at {client.base_url} returned prompt logprobs for {len(entries)} tokens; the sequence has "
            f"{len(token_ids)}"
        )
    return [_logprob_of(entry, token_id, position, str(client.base_url))
            for position, (token_id, entry) in enumerate(zip(token_ids[1:], entries[1:], strict=True), start=1)]


def _prompt_logprobs_of(body: dict[str, Any]) -> list[Any] | None:
    """The `prompt_logprobs` list of a response body: on its first choice (vLLM's text completions) or at the top
    level (its chat completions, and some versions' text completions)."""
    choices = body.get("choices") or []
    for holder in (choices[0] if choices and isinstance(choices[0], dict) else {}, body):
        entries = holder.get("prompt_logprobs")
        if isinstance(entries, list):
            return entries
    return None


def _logprob_of(entry: Any, token_id: int, position: int, url: str) -> float:
    """The logprob of `token_id` in one position's entry: a dict by token id (a string in JSON, an int if a client
    parsed it so) of `{"logprob", ...}`, or of bare floats."""
    found = entry.get(str(token_id), entry.get(token_id)) if isinstance(entry, dict) else None
    if isinstance(found, dict):
        found = found.get("logprob")
    if not isinstance(found, int | float):
        raise ValueError(f"the teacher at {url} returned no logprob for token {token_id} at prompt position {position}")
    return float(found)
