"""Request bodies of the OpenAI routes and of vLLM's `/inference/v1/generate`, with vLLM's extra fields spelled as
vLLM spells them.

Unknown fields are accepted and ignored (as vLLM does); known fields are validated, and a field the built-in
server cannot honour is refused with a 400 rather than silently ignored (`unsupported_settings`).

`tools` and `tool_choice` are checked in `tool_calls.parses_tool_calls` ("auto" and "none"; see that module).
`stream=true` on the chat and text routes is answered as an event stream that carries the whole answer
(`streaming.py`), tool calls whole in its first chunk; `/inference/v1/generate` refuses it. `prompt_logprobs`
(vLLM's: the logprob of each prompt token and the top k at its position) is answered on both routes, at most
`MAX_TOP_LOGPROBS` per position as vLLM's default `--max-logprobs` allows.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_TOP_LOGPROBS = 20

NonNegativeInt = Annotated[int, Field(ge=0)]


class SamplingFields(BaseModel):
    """Fields shared by chat and text completions."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    n: int = Field(1, ge=1, le=128)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[NonNegativeInt] | None = None
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0)
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool = False
    stream: bool = False
    stream_options: dict[str, Any] | None = None  # {"include_usage": true}: a last chunk with the usage
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    prompt_logprobs: int | None = Field(None, ge=-1)  # -1: the whole vocabulary (over the limit, as in vLLM)

    @field_validator("stop")
    @classmethod
    def _stop_strings_are_not_empty(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and any(not s for s in value) or value == "":
            raise ValueError("stop strings must not be empty")
        return value

    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def unsupported_settings(self) -> list[str]:
        """Settings that were asked for and that this server does not implement."""
        problems = []
        if self.presence_penalty not in (None, 0.0):
            problems.append("presence_penalty")
        if self.frequency_penalty not in (None, 0.0):
            problems.append("frequency_penalty")
        if self.repetition_penalty not in (None, 1.0):
            problems.append("repetition_penalty")
        if self.logit_bias:
            problems.append("logit_bias")
        return problems


class ChatCompletionRequest(SamplingFields):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    echo: bool = False

    def token_budget(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def unsupported_settings(self) -> list[str]:
        problems = super().unsupported_settings()
        if self.echo:
            problems.append("echo=true")
        return problems


CompletionPrompt = str | list[str] | list[NonNegativeInt] | list[list[NonNegativeInt]]


class CompletionRequest(SamplingFields):
    prompt: CompletionPrompt
    max_tokens: int | None = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    def prompts(self) -> list[str | list[int]]:
        """The prompts as a list: each a text or a list of token ids."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if not prompt:
            return []
        if all(isinstance(p, int) for p in prompt):
            return [list(prompt)]  # type: ignore[arg-type]
        return list(prompt)  # type: ignore[arg-type]

    def unsupported_settings(self) -> list[str]:
        problems = super().unsupported_settings()
        if self.echo:
            problems.append("echo=true")
        if self.suffix:
            problems.append("suffix")
        if self.best_of not in (None, self.n):
            problems.append("best_of")
        return problems


class GenerateSamplingParams(SamplingFields):
    """vLLM's `SamplingParams` as `/inference/v1/generate` takes them: the sampling fields of the other routes,
    `logprobs` a count as on `/v1/completions` (None: none; 0: the sampled token's only; k: the top k beside it)."""

    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)


class GenerateRequest(BaseModel):
    """vLLM's token-in, token-out request (`entrypoints/scale_out/token_in_token_out/protocol.py`
    `GenerateRequest`): a prompt as token ids and its sampling parameters; the prompt's ids come back when
    `return_token_ids` is set. Multimodal inputs and streaming are refused."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    token_ids: list[NonNegativeInt] = Field(min_length=1)
    sampling_params: GenerateSamplingParams
    request_id: str | None = None
    return_token_ids: bool = False
    stream: bool = False
    features: dict[str, Any] | None = None
    content_parts: list[dict[str, Any]] | None = None

    def unsupported_settings(self) -> list[str]:
        problems = self.sampling_params.unsupported_settings()
        if self.stream:
            problems.append("stream=true")
        if self.features or self.content_parts:
            problems.append("multimodal inputs (features, content_parts)")
        return problems


class LoadLoraAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    lora_name: str = ""
    lora_path: str = ""
    load_inplace: bool = False


class UnloadLoraAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    lora_name: str = ""
    lora_int_id: int | None = None


class CollectiveRpcRequest(BaseModel):
    """vLLM's developer route `/collective_rpc`: a worker method by name, with string arguments."""

    model_config = ConfigDict(extra="allow")

    method: str
    args: list[str] = Field(default_factory=list)
    kwargs: dict[str, str] = Field(default_factory=dict)
