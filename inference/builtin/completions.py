"""Between HTTP and the engine: request bodies -> `GenerationRequest`s, choices -> OpenAI/vLLM response bodies.

Prompt logprobs come back where vLLM (0.32, `entrypoints/openai/{completion,chat_completion}/serving.py`) puts them:
on each choice of a text completion (`choices[i].prompt_logprobs`) and at the top level of a chat completion. Either
is a list with one entry per prompt token: None for the first, then `{token id: {"logprob", "rank",
"decoded_token"}}` holding the prompt token and the top k (the token id a string in JSON; -inf reported as -9999.0).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prime_lab.inference.builtin.adapters import ModelRegistry, ServedModel
from prime_lab.inference.builtin.errors import APIError
from prime_lab.inference.builtin.prompts import PromptCodec
from prime_lab.inference.builtin.sampling import SamplingParams
from prime_lab.inference.builtin.schemas import (
    MAX_TOP_LOGPROBS,
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
    SamplingFields,
)
from prime_lab.inference.builtin.sequences import Choice, GenerationRequest, PromptLogprobs
from prime_lab.inference.builtin.tool_calls import ParsedToolCalls, parse_hermes_tool_calls, parses_tool_calls

if TYPE_CHECKING:
    from prime_lab.inference.builtin.engine import GenerationEngine


@dataclass(frozen=True)
class SamplingDefaults:
    """What a request gets when it leaves a field out (vLLM takes these from generation_config.json)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int | None = None  # None: what the context leaves (vLLM: generation_config's max_new_tokens)


@dataclass
class CompletionService:
    registry: ModelRegistry
    engine: GenerationEngine
    codec: PromptCodec
    max_model_len: int
    defaults: SamplingDefaults

    async def chat(self, body: ChatCompletionRequest) -> dict[str, Any]:
        refuse_unsupported(body)
        parse_tools = parses_tool_calls(body.tools, body.tool_choice)
        model = self.registry.get(body.model)
        prompt_ids = self.codec.chat_prompt_ids(
            body.messages,
            add_generation_prompt=body.add_generation_prompt,
            continue_final_message=body.continue_final_message,
            template_kwargs=body.chat_template_kwargs,
            tools=body.tools,
        )
        params = self.sampling_params(
            body, len(prompt_ids), body.token_budget(), logprobs=body.logprobs, top_logprobs=body.top_logprobs or 0
        )
        choices = await self._generate(
            GenerationRequest(prompt_ids, body.n, params, model, self.prompt_logprobs_count(body))
        )
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model.name,
            "choices": [self._chat_choice(i, choice, body, parse_tools) for i, choice in enumerate(choices)],
            "service_tier": None,
            "system_fingerprint": None,
            "usage": usage(len(prompt_ids), choices),
            "prompt_logprobs": self._prompt_logprobs(prompt_ids, choices[0].prompt_logprobs),
            "prompt_token_ids": prompt_ids if body.return_token_ids else None,
            "prompt_text": None,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": None,
        }

    async def complete(self, body: CompletionRequest) -> dict[str, Any]:
        refuse_unsupported(body)
        model = self.registry.get(body.model)
        prompts = body.prompts()
        if not prompts:
            raise APIError("prompt must not be empty", param="prompt")
        prompt_ids = [self.codec.text_prompt_ids(p) if isinstance(p, str) else p for p in prompts]
        for ids in prompt_ids:
            self.check_prompt_ids(ids, "prompt")
        logprobs = body.logprobs is not None
        prompt_logprobs = self.prompt_logprobs_count(body)
        requests = [
            GenerationRequest(
                ids,
                body.n,
                self.sampling_params(
                    body, len(ids), body.max_tokens, logprobs=logprobs, top_logprobs=body.logprobs or 0
                ),
                model,
                prompt_logprobs,
            )
            for ids in prompt_ids
        ]
        results = await asyncio.gather(*(self._generate(r) for r in requests))
        choices_out = []
        completion_choices: list[Choice] = []
        for prompt_index, (ids, choices) in enumerate(zip(prompt_ids, results, strict=True)):
            scored = self._prompt_logprobs(ids, choices[0].prompt_logprobs)
            for j, choice in enumerate(choices):
                choices_out.append(self._text_choice(prompt_index * body.n + j, choice, ids, scored, body))
                completion_choices.append(choice)
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": model.name,
            "choices": choices_out,
            "service_tier": None,
            "system_fingerprint": None,
            "usage": usage(sum(len(ids) for ids in prompt_ids), completion_choices),
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": None,
        }

    async def generate(self, body: GenerateRequest) -> dict[str, Any]:
        """vLLM's `/inference/v1/generate` (tokens in, tokens out): the text route's generation from token ids,
        answered in vLLM's `output_mode="tokens"` shape (`GenerateTokensResponse`)."""
        refuse_unsupported(body)
        model = self.registry.get(body.model)
        self.check_prompt_ids(body.token_ids, "token_ids")
        sampling = body.sampling_params
        params = self.sampling_params(
            sampling,
            len(body.token_ids),
            sampling.max_tokens,
            logprobs=sampling.logprobs is not None,
            top_logprobs=sampling.logprobs or 0,
        )
        choices = await self._generate(
            GenerationRequest(body.token_ids, sampling.n, params, model, self.prompt_logprobs_count(sampling))
        )
        return {
            "request_id": f"generate-tokens-{body.request_id or uuid.uuid4().hex}",
            "model": model.name,
            "created": int(time.time()),
            "usage": usage(len(body.token_ids), choices),
            "prompt_logprobs": self._prompt_logprobs(body.token_ids, choices[0].prompt_logprobs),
            "prompt_token_id_logprobs": None,
            "prompt_token_ids": body.token_ids if body.return_token_ids else None,
            "mm_placeholders": None,
            "metrics": None,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "output_mode": "tokens",
            "choices": [self._generate_choice(i, choice) for i, choice in enumerate(choices)],
        }

    def check_prompt_ids(self, ids: list[int], param: str) -> None:
        if not ids:
            raise APIError(f"{param} must not be empty", param=param)
        if max(ids) >= self.codec.vocab_size:
            raise APIError(
                f"token id {max(ids)} is out of the vocabulary (ids 0 to {self.codec.vocab_size - 1})", param=param
            )

    def sampling_params(
        self, body: SamplingFields, prompt_tokens: int, max_tokens: int | None, *, logprobs: bool, top_logprobs: int
    ) -> SamplingParams:
        if prompt_tokens >= self.max_model_len:
            raise APIError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, your request has "
                f"{prompt_tokens} input tokens. Please reduce the length of the input messages.",
                param="messages",
            )
        room = self.max_model_len - prompt_tokens
        if max_tokens is None:
            max_tokens = room if self.defaults.max_tokens is None else min(room, self.defaults.max_tokens)
        elif max_tokens > room:
            raise APIError(
                f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum context "
                f"length is {self.max_model_len} tokens and your request has {prompt_tokens} input tokens "
                f"({max_tokens} > {self.max_model_len} - {prompt_tokens}).",
                param="max_tokens",
            )
        eos_tokens = frozenset() if body.ignore_eos else self.engine.eos_token_ids
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=self.defaults.temperature if body.temperature is None else body.temperature,
            top_p=self.defaults.top_p if body.top_p is None else body.top_p,
            top_k=self.defaults.top_k if body.top_k is None else max(body.top_k, 0),
            seed=body.seed,
            stop=body.stop_strings(),
            stop_token_ids=frozenset(body.stop_token_ids or ()),
            eos_token_ids=eos_tokens,
            min_tokens=min(body.min_tokens, max_tokens),
            logprobs=logprobs,
            top_logprobs=top_logprobs,
            include_stop_str_in_output=body.include_stop_str_in_output,
            skip_special_tokens=body.skip_special_tokens,
        )

    def prompt_logprobs_count(self, body: SamplingFields) -> int | None:
        """How many top logprobs each prompt position reports (None: no prompt logprobs), refused above vLLM's
        default limit (-1 asks for the whole vocabulary)."""
        count = self.engine.vocab_size if body.prompt_logprobs == -1 else body.prompt_logprobs
        if count is not None and count > MAX_TOP_LOGPROBS:
            raise APIError(
                f"Requested prompt logprobs of {count}, which is greater than max allowed: {MAX_TOP_LOGPROBS}",
                param="prompt_logprobs",
            )
        return count

    def _prompt_logprobs(self, prompt_ids: list[int], scores: PromptLogprobs | None) -> list[Any] | None:
        """vLLM's `prompt_logprobs`: None for the first prompt token, then per token a dict by token id of the
        prompt token and the top k (a top-k entry wins for the prompt token when it is among them, as in vLLM)."""
        if scores is None:
            return None
        entries: list[dict[str, dict[str, Any]] | None] = [None]
        for token_id, logprob, rank, top in zip(prompt_ids[1:], scores.logprobs, scores.ranks, scores.top,
                                                strict=True):
            entry = {str(token_id): self._prompt_logprob_entry(token_id, logprob, rank)}
            for top_rank, (top_id, top_logprob) in enumerate(top, start=1):
                entry[str(top_id)] = self._prompt_logprob_entry(top_id, top_logprob, top_rank)
            entries.append(entry)
        return entries

    def _prompt_logprob_entry(self, token_id: int, logprob: float, rank: int) -> dict[str, Any]:
        return {"logprob": max(logprob, -9999.0), "rank": rank, "decoded_token": self.codec.token_text(token_id)}

    async def _generate(self, request: GenerationRequest) -> list[Choice]:
        return await asyncio.wrap_future(self.engine.submit(request))

    def _token_text(self, token_id: int, as_token_ids: bool) -> str:
        return f"token_id:{token_id}" if as_token_ids else self.codec.token_text(token_id)

    def _logprob_entry(self, token_id: int, logprob: float, as_token_ids: bool) -> dict[str, Any]:
        token = self._token_text(token_id, as_token_ids)
        return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8", errors="replace"))}

    def _chat_choice(
        self, index: int, choice: Choice, body: ChatCompletionRequest, parse_tools: bool
    ) -> dict[str, Any]:
        logprobs = None
        if choice.logprobs is not None and choice.top_logprobs is not None:
            as_ids = body.return_tokens_as_token_ids
            logprobs = {
                "content": [
                    {
                        **self._logprob_entry(token_id, logprob, as_ids),
                        "top_logprobs": [self._logprob_entry(t, lp, as_ids) for t, lp in top],
                    }
                    for token_id, logprob, top in zip(
                        choice.token_ids, choice.logprobs, choice.top_logprobs, strict=True
                    )
                ]
            }
        message, finish_reason = chat_message(choice, parse_tools)
        return {
            "index": index,
            "message": message,
            "logprobs": logprobs,
            "finish_reason": finish_reason,
            "stop_reason": choice.stop_reason,
            "token_ids": choice.token_ids if body.return_token_ids else None,
            "routed_experts": None,
        }

    def _generate_choice(self, index: int, choice: Choice) -> dict[str, Any]:
        """A choice of vLLM's `GenerateTokensResponse`. Each logprob entry carries the token as its id (`token_id`,
        vLLM 0.32's field) and as the `token_id:<id>` string of the OpenAI logprob shape that earlier releases of the
        route answered, which the `renderers` client of verifiers 0.3 checks; `top_logprobs` are the k most likely
        tokens, most likely first, with their ranks (vLLM 0.32 puts the sampled token first there)."""
        logprobs = None
        if choice.logprobs is not None and choice.top_logprobs is not None:
            content = []
            for token_id, logprob, top in zip(choice.token_ids, choice.logprobs, choice.top_logprobs, strict=True):
                rank = next((r for r, (t, _) in enumerate(top, start=1) if t == token_id), None)
                content.append({
                    **self._token_logprob(token_id, logprob, rank),
                    "top_logprobs": [self._token_logprob(t, lp, r) for r, (t, lp) in enumerate(top, start=1)],
                })  # fmt: skip
            logprobs = {"content": content}
        return {
            "index": index,
            "finish_reason": choice.finish_reason,
            "stop_reason": choice.stop_reason,
            "token_ids": choice.token_ids,
            "logprobs": logprobs,
            "routed_experts": None,
            "sampling_mask": None,
            "weight_versions": None,
        }

    def _token_logprob(self, token_id: int, logprob: float, rank: int | None) -> dict[str, Any]:
        return {"token_id": token_id, "token": self._token_text(token_id, True), "logprob": logprob, "rank": rank}

    def _text_choice(
        self,
        index: int,
        choice: Choice,
        prompt_ids: list[int],
        prompt_logprobs: list[Any] | None,
        body: CompletionRequest,
    ) -> dict[str, Any]:
        logprobs = None
        if choice.logprobs is not None and choice.top_logprobs is not None:
            as_ids = body.return_tokens_as_token_ids
            tokens = [self._token_text(t, as_ids) for t in choice.token_ids]
            offsets, offset = [], 0
            for token in tokens:
                offsets.append(offset)
                offset += len(token)
            tops = []
            for token_id, logprob, top in zip(choice.token_ids, choice.logprobs, choice.top_logprobs, strict=True):
                entries = {self._token_text(t, as_ids): lp for t, lp in top}
                entries[self._token_text(token_id, as_ids)] = logprob
                tops.append(entries)
            logprobs = {
                "text_offset": offsets,
                "token_logprobs": choice.logprobs,
                "tokens": tokens,
                "top_logprobs": tops,
            }
        return {
            "index": index,
            "text": choice.text,
            "logprobs": logprobs,
            "finish_reason": choice.finish_reason,
            "stop_reason": choice.stop_reason,
            "token_ids": choice.token_ids if body.return_token_ids else None,
            "prompt_logprobs": prompt_logprobs,
            "prompt_token_ids": prompt_ids if body.return_token_ids else None,
            "routed_experts": None,
        }


def chat_message(choice: Choice, parse_tools: bool) -> tuple[dict[str, Any], str]:
    """The assistant message of a chat choice and its finish reason. With `parse_tools`, the `<tool_call>` blocks of
    the text become `tool_calls`, and a choice that calls a tool and stopped by itself (not cut by `max_tokens`)
    finishes with "tool_calls"."""
    parsed = parse_hermes_tool_calls(choice.text) if parse_tools else ParsedToolCalls(choice.text)
    finish_reason = "tool_calls" if parsed.tool_calls and choice.finish_reason == "stop" else choice.finish_reason
    message = {
        "role": "assistant",
        "content": parsed.content,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "tool_calls": parsed.tool_calls,
        "reasoning": None,
    }
    return message, finish_reason


def refuse_unsupported(body: SamplingFields | GenerateRequest) -> None:
    unsupported = body.unsupported_settings()
    if unsupported:
        raise APIError(f"the built-in server does not support: {', '.join(unsupported)}", param=unsupported[0])


def usage(prompt_tokens: int, choices: list[Choice]) -> dict[str, Any]:
    completion_tokens = sum(len(c.token_ids) for c in choices)
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


def model_card(model: ServedModel, max_model_len: int) -> dict[str, Any]:
    """One entry of `GET /v1/models`, as vLLM lists it."""
    return {
        "id": model.name,
        "object": "model",
        "created": model.created,
        "owned_by": "prime-lab",
        "root": model.root,
        "parent": model.parent,
        "max_model_len": max_model_len,
        "permission": [],
    }
