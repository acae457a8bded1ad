"""The RL config: one validated tree, the same TOML that Hosted Training accepts, plus local sections.

Sources: the Hosted Training config reference (top-level fields, [sampling], [[env]], [wandb], [eval], [val],
[buffer], [checkpoints], [adapters], [infrastructure], [tailscale]) and prime-rl's self-hosted fields ([lora],
[sampling] temperature/top_p/stop, [[env]] weight, gradient_accumulation_steps, warmup_steps, [difficulty_filter],
[kl_penalty], `model_name`, `num_gpus`, `tensor_parallel_size`, the single [env] table). Local sections:
[inference] (which sampler engine), [trainer] (micro-batching, sequence length, device, loss knobs) and [sandbox]
(where environments' sandboxes run: sandbox/config.py, shared with the evaluation and GEPA configs).

`validate_rl_config(text)` returns every problem at once (see `problems.validation`); nothing here raises on bad input.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, Field, field_validator, model_validator

from prime_lab.envs.judges import JudgeConfig
from prime_lab.problems.schema import ConfigSection
from prime_lab.problems.validation import CheckContext, Validation, validate_file, validate_toml
from prime_lab.sandbox.config import SandboxConfig

ENV_ID_RE = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9._-]*/)?[A-Za-z0-9][A-Za-z0-9._-]*$")
TAILSCALE_HOSTNAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,29}$")

Fraction = Annotated[float, Field(ge=0.0, le=1.0)]


def _num_examples(value: int) -> int:
    if value == -1 or value >= 1:
        return value
    raise ValueError("must be -1 (all examples) or at least 1")


def _env_id(value: str) -> str:
    if not ENV_ID_RE.match(value):
        raise ValueError(f"'{value}' is not an environment id: use `owner/name` or a bare local name "
                         "(letters, digits, '.', '_', '-')")
    return value


def _one_table_as_list(value: Any) -> Any:
    """`[env]` (one table) is the same as a single `[[env]]` entry."""
    return [value] if isinstance(value, dict) else value


class EnvConfig(ConfigSection):
    id: str = Field(description="Environment id: `owner/name` (Environments Hub style) or a bare local name.")
    args: dict[str, Any] = Field(default_factory=dict, description="Arguments passed to load_environment().")
    name: str | None = Field(default=None, description="Display name for this environment in metrics.")
    weight: float | None = Field(default=None, ge=0.0,
                                 description="Sampling weight (prime-rl); alternative to [buffer].env_ratios.")
    system_prompt: str | None = Field(
        default=None, description="Replaces the system message of every prompt, as GEPA tries a candidate (prime-lab "
        "only; an environment with a `system_prompt` argument takes it through args, which Hosted Training runs).")
    timeout: float = Field(
        default=300.0, gt=0.0, description="Per-rollout time limit in seconds (prime-lab only): a rollout past it is "
        "cut and counts as errored (`env/<name>/timed_out`); where the environment sets its own (`timeout_seconds`), "
        "the smaller wins.")

    _id = field_validator("id")(_env_id)


class SamplingConfig(ConfigSection):
    max_tokens: int = Field(ge=1, description="Maximum tokens the model can generate per response turn.")
    temperature: float = Field(default=1.0, ge=0.0, description="Sampling temperature (>= 0).")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus sampling probability mass.")
    stop: list[str] = Field(default_factory=list, description="Stop strings.")
    enable_thinking: bool | None = Field(default=None, description="Thinking mode (chat template kwarg).")
    reasoning_effort: Literal["low", "medium", "high"] | None = Field(
        default=None, description="Reasoning effort for GPT-OSS-style models.")
    seed: int | None = Field(default=None, description="Sampling seed (local).")
    tools_in_system_prompt: bool = Field(
        default=False, description="Write an environment's tool schemas into its system prompt (Hermes <tools> "
        "format, calls read from <tool_call> blocks) where the model's chat template does not render `tools` "
        "(prime-lab only; without it such a run warns once that the model is never shown its tools).")

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_as_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value


class WandbConfig(ConfigSection):
    project: str | None = Field(default=None, description="W&B project name.")
    name: str | None = Field(default=None, description="W&B run name.")
    entity: str | None = Field(default=None, description="W&B team/entity.")


class EvalEnvConfig(ConfigSection):
    id: str = Field(description="Environment id to evaluate: `owner/name` or a bare local name.")
    args: dict[str, Any] = Field(default_factory=dict, description="Arguments passed to load_environment().")
    name: str | None = Field(default=None, description="Display name in eval metrics.")
    num_examples: int | None = Field(default=None, description="Overrides [eval].num_examples (-1 = all).")
    rollouts_per_example: int | None = Field(default=None, ge=1, description="Overrides [eval].rollouts_per_example.")

    _id = field_validator("id")(_env_id)

    @field_validator("num_examples")
    @classmethod
    def _check_num(cls, value: int | None) -> int | None:
        return None if value is None else _num_examples(value)


class EvalConfig(ConfigSection):
    interval: int = Field(default=100, ge=0, description="Evaluate every N steps (0: only at the end).")
    num_examples: int = Field(default=-1, description="Eval examples per environment (-1 = all).")
    rollouts_per_example: int = Field(default=1, ge=1)
    eval_base_model: bool = Field(default=True, description="Also evaluate the base (untrained) model.")
    env: list[EvalEnvConfig] = Field(default_factory=list, description="Per-environment overrides.")

    _num = field_validator("num_examples")(_num_examples)
    _env_list = field_validator("env", mode="before")(_one_table_as_list)


class ValConfig(ConfigSection):
    num_examples: int = Field(default=64, description="Validation examples per check (-1 = all).")
    rollouts_per_example: int = Field(default=1, ge=1)
    interval: int = Field(default=5, ge=0, description="Validate every N steps (0: never).")

    _num = field_validator("num_examples")(_num_examples)


class BufferConfig(ConfigSection):
    online_difficulty_filtering: bool = False
    easy_threshold: Fraction = 0.8
    hard_threshold: Fraction = 0.2
    easy_fraction: Fraction = 0.0
    hard_fraction: Fraction = 0.0
    env_ratios: list[Annotated[float, Field(ge=0.0)]] | None = None
    seed: int = 42


class DifficultyFilterConfig(ConfigSection):
    enabled: bool = False
    min_reward_variance: float = Field(default=0.0, ge=0.0)
    max_reward: float = 1.0
    min_reward: float = 0.0


class KLPenaltyConfig(ConfigSection):
    enabled: bool = False
    target_kl: float | None = Field(default=None, gt=0.0)
    beta: float = Field(default=0.1, ge=0.0)


class LoraConfig(ConfigSection):
    enabled: bool = Field(default=True, description="false = full fine-tuning (every weight; learning rate ~1e-6).")
    r: int = Field(default=16, ge=1, description="LoRA rank.")
    alpha: float = Field(default=16, gt=0, description="LoRA alpha (same setting as top-level lora_alpha).")
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        description="Modules that get adapters (Linear layers; names or their ends after a dot).")
    target_parameters: list[str] = Field(
        default_factory=list,
        description='Parameters that get adapters: the fused 3-D experts of transformers-5 Mixture-of-Experts models, '
        'e.g. ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"] (one adapter per expert); the router '
        "(mlp.gate.weight) only when named. peft gives them no dropout.")

    @model_validator(mode="after")
    def _some_target(self) -> LoraConfig:
        if not self.target_modules and not self.target_parameters:
            raise ValueError("target_modules and target_parameters are both empty: name at least one module or "
                             "parameter to adapt")
        return self


class CheckpointsConfig(ConfigSection):
    interval: int | None = Field(default=None, ge=0, description="Checkpoint every N steps (local default 10).")
    keep_cloud: int = Field(default=5, ge=-1, description="Checkpoints kept (hosted: in cloud storage; locally: in the "
                            "run directory, the newest; -1 = all).")


class AdaptersConfig(ConfigSection):
    """Which published policy versions stay on disk: adapters/step_N, or weights/step_N with full fine-tuning."""

    interval: int = Field(default=0, ge=0, description="Keep an adapter every N steps (0: only the final one).")
    keep_last: int = Field(default=3, ge=-1, description="Adapters kept (-1 = all).")


class InfrastructureConfig(ConfigSection):
    compute_size: Literal["S", "M", "L"] = "M"


class TailscaleConfig(ConfigSection):
    enabled: bool = False
    auth_key: str | None = None
    hostname_prefix: str = "prime-hosted-training"

    @field_validator("auth_key")
    @classmethod
    def _check_key(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("tskey-auth-"):
            raise ValueError("must start with `tskey-auth-` (a pre-authenticated key; OAuth client secrets are "
                             "not supported); prefer the TAILSCALE_AUTH_KEY environment variable")
        return value

    @field_validator("hostname_prefix")
    @classmethod
    def _check_prefix(cls, value: str) -> str:
        if not TAILSCALE_HOSTNAME_RE.match(value):
            raise ValueError("must be 1-30 lowercase letters, digits or hyphens, starting with a letter")
        return value


class InferenceConfig(ConfigSection):
    backend: Literal["auto", "builtin", "vllm", "external"] = Field(
        default="auto", description="Sampler engine: auto, builtin (transformers), vllm, or external (base_url).")
    base_url: str | None = Field(default=None, description="OpenAI-compatible URL when backend = external.")
    api_key_var: str = Field(default="OPENAI_API_KEY", description="Env var holding the external API key.")
    port: int = Field(default=0, ge=0, le=65535, description="Port on 127.0.0.1 (0: pick a free one; several "
                      "servers: port, port + 1, ...).")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto", description="Serving dtype (auto: float32 on CPU, bfloat16 on GPU).")
    max_model_len: int | None = Field(
        default=None, ge=1, description="Longest prompt + completion the server accepts (default: the model's own "
        "context length).")
    tensor_parallel_size: int = Field(default=1, ge=1, description="GPUs per vLLM engine (vLLM's tensor parallelism).")
    data_parallel_size: int | None = Field(
        default=None, ge=1, description="vLLM engines behind one server (vLLM's data parallelism); default: from "
        "num_gpus, else 1.")
    num_servers: int = Field(default=1, ge=1, description="Local sampler servers to start; the orchestrator spreads "
                             "requests over them and loads each new policy into every one.")
    base_urls: list[str] = Field(default_factory=list, description="Several OpenAI-compatible URLs (backend = "
                                 "external): the orchestrator spreads requests over them.")
    gpu_memory_utilization: float | None = Field(
        default=None, gt=0.0, le=1.0, description="Fraction of a GPU's memory each sampler vLLM engine on it may "
        "take (a local teacher's: [teacher] gpu_memory_utilization). Default: 0.9 on a GPU of its own; a share when "
        "it shares the GPU with the trainer or a teacher (trainer/placement.py).")
    kv_cache_gb: float = Field(default=2.0, gt=0.0, description="vLLM CPU KV-cache space (GiB).")
    startup_timeout: float = Field(default=600.0, gt=0.0, description="Seconds to wait for the server.")


class TrainerConfig(ConfigSection):
    micro_batch_size: int | None = Field(
        default=None, ge=1, description="Samples per forward/backward pass at most (a packed row); default: as many "
        "as fit in micro_batch_tokens.")
    micro_batch_tokens: int | None = Field(
        default=None, ge=1, description="Tokens per packed row (a forward/backward pass); rows fill up to it (a "
        "longer sample gets a row of its own). Default: on a GPU, from the memory free when the first batch comes "
        "(16384 with 40 GiB or more, 8192 with less, halved while a row would not fit); 1024 on a CPU (its dense "
        "attention mask costs the square of the row).")
    attention: Literal["auto", "flex", "sdpa"] = Field(
        default="auto", description="How packed rows attend: flex (FlexAttention with a block mask, CUDA only), sdpa "
        "(a dense mask); auto: on CUDA where FlexAttention runs, packed rows through it and a row of one sequence "
        "through SDPA without a mask (its flash kernel), else sdpa.")
    lm_head_chunk_size: int = Field(
        default=1024, ge=0, description="Tokens per chunk of the LM head's logprobs and entropy (float32, logits "
        "recomputed in the backward pass); 0: all at once ([tokens, vocabulary] float32 tensors, much more memory).")
    compile: bool | Literal["auto"] = Field(
        default="auto", description="torch.compile each decoder layer (the first steps take longer while it "
        "compiles: time/compile); auto: on CUDA, off on the CPU.")
    max_seq_len: int | None = Field(
        default=None, ge=1,
        description="Longest prompt + completion trained on (default: the model's context length; Hosted sets it "
                    "per cluster, so configs from there run unchanged).")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    max_grad_norm: float = Field(default=1.0, gt=0.0)
    weight_decay: float = Field(default=0.0, ge=0.0)
    ratio_mask_low: float = Field(default=0.125, gt=0.0, description="Mask tokens whose importance ratio < this.")
    ratio_mask_high: float = Field(default=8.0, gt=0.0, description="Mask tokens whose importance ratio > this.")
    std_normalize_advantages: bool = False
    activation_checkpointing: bool | Literal["auto"] = Field(
        default="auto", description="Recompute each decoder layer's activations in the backward pass instead of "
        "keeping them: much less memory for long sequences, for about a third more compute per step. auto: on a "
        "GPU, on when the first batch's rows would not fit the memory free then (the trainer's log says so); off "
        "on the CPU.")
    distributed: Literal["auto", "ddp", "fsdp"] = Field(
        default="auto", description="With several trainer processes: DDP (LoRA), FSDP2 (full fine-tuning), or auto.")
    nproc_per_node: int = Field(default=1, ge=1, description="Trainer processes on this machine; more than 1 runs the "
                                "trainer under torchrun (gloo on CPU, nccl on GPUs).")
    nnodes: int = Field(default=1, ge=1, description="Machines the trainer spans (env WORLD_SIZE, as in prime-rl).")
    node_rank: int = Field(default=0, ge=0, description="This machine's rank among them (env RANK).")
    master_addr: str = Field(default="127.0.0.1", description="Address of node 0 (env MASTER_ADDR).")
    master_port: int | None = Field(default=None, ge=1, le=65535,
                                    description="Port on node 0 (env MASTER_PORT; default: a free port on one "
                                    "machine, 29500 across several).")

    @field_validator("compile", "activation_checkpointing", mode="before")
    @classmethod
    def _true_false_or_auto(cls, value: Any) -> Any:
        """One problem for a bad value (not one per member of the union)."""
        if isinstance(value, bool) or value == "auto":
            return value
        shown = f'"{value}"' if isinstance(value, str) else repr(value)
        raise ValueError(f'must be true, false or "auto" (got {shown})')


class TeacherSamplingConfig(ConfigSection):
    max_tokens: int | None = Field(default=None, ge=1, description="Teacher's max tokens per turn (loss = \"sft\"; "
                                   "default: [sampling].max_tokens).")
    temperature: float | None = Field(default=None, ge=0.0, description="Teacher's sampling temperature (default: "
                                      "[sampling].temperature).")
    extra_body: dict[str, Any] = Field(default_factory=dict, description="Extra request fields for the teacher.")
    enable_thinking: bool | None = None
    reasoning_effort: Literal["low", "medium", "high"] | None = None


class TeacherClientConfig(ConfigSection):
    base_url: str | None = Field(default=None, description="An OpenAI-compatible endpoint serving the teacher "
                                 "(default: a local sampler the run starts).")
    api_key_var: str = Field(default="OPENAI_API_KEY", description="Env var holding the endpoint's API key.")
    headers_from_env: dict[str, str] = Field(default_factory=dict, description="HTTP headers, each read from the "
                                             "named env var.")
    skip_model_check: bool = Field(default=False, description="Do not ask the endpoint whether it serves the model.")


class TeacherConfig(ConfigSection):
    model: str = Field(description="Teacher model: a preset, a Hugging Face id, a local path or an SFT run id (a local "
                       "sampler serves it), or the model name at [teacher.client].base_url.")
    sampling: TeacherSamplingConfig = Field(default_factory=TeacherSamplingConfig)
    client: TeacherClientConfig = Field(default_factory=TeacherClientConfig)
    backend: Literal["auto", "builtin", "vllm"] = Field(
        default="auto", description="Engine of the local teacher sampler (prime-lab only; like [inference].backend).")
    gpu_memory_utilization: float | None = Field(
        default=None, gt=0.0, le=1.0, description="Fraction of a GPU's memory the local teacher's vLLM engine may "
        "take (prime-lab only). Default: what the sampler's share leaves, split by the models' sizes on a GPU they "
        "share; checked against the card before the run starts (trainer/placement.py).")


class RLConfig(ConfigSection):
    # Core (required)
    model: str = Field(validation_alias=AliasChoices("model", "model_name"),
                       description="Model: a preset (`prime rl models`), a Hugging Face id or a local path.")
    max_steps: int = Field(ge=1, description="Total training steps.")
    batch_size: int = Field(ge=1, description="Rollouts consumed per training step.")
    rollouts_per_example: int = Field(ge=1, description="Rollouts per example (a group, for advantages).")
    checkpoint_id: str | None = Field(default=None, description="Warm-start from a checkpoint.")
    # Training hyperparameters
    learning_rate: float = Field(default=1e-4, gt=0.0)
    lora_alpha: float | None = Field(default=None, gt=0, description="Same setting as [lora].alpha (default 16).")
    oversampling_factor: float = Field(default=2.0, ge=1.0)
    max_async_level: int = Field(default=2, ge=0)
    trajectory_strategy: Literal["interleaved", "branching"] = "interleaved"
    env_file: list[str] = Field(default_factory=list)
    gradient_accumulation_steps: int = Field(default=1, ge=1)
    warmup_steps: int = Field(default=0, ge=0)
    num_gpus: int | None = Field(default=None, ge=0, description="GPUs to use (prime-rl); default: all visible.")
    tensor_parallel_size: int | None = Field(default=None, ge=1,
                                             description="Same setting as [inference].tensor_parallel_size.")
    loss: Literal["rl", "sft", "opd"] = Field(
        default="rl", description='"rl": the policy gradient on the reward; "sft": a teacher generates the rollouts '
        'and the model learns them by cross-entropy; "opd": on-policy distillation, the teacher scores the model\'s '
        "own tokens (needs [teacher]).")
    # Sections
    teacher: TeacherConfig | None = None
    judge: JudgeConfig | None = Field(default=None, description="The environments' LLM judge: a local server this "
                                      "run starts (prime-lab only; envs/judges.py), or [judge.client]'s endpoint.")
    sampling: SamplingConfig
    env: list[EnvConfig] = Field(min_length=1)
    wandb: WandbConfig | None = None
    eval: EvalConfig | None = None
    val: ValConfig | None = None
    buffer: BufferConfig = Field(default_factory=BufferConfig)
    difficulty_filter: DifficultyFilterConfig = Field(default_factory=DifficultyFilterConfig)
    kl_penalty: KLPenaltyConfig = Field(default_factory=KLPenaltyConfig)
    lora: LoraConfig = Field(default_factory=LoraConfig)
    checkpoints: CheckpointsConfig = Field(default_factory=CheckpointsConfig)
    adapters: AdaptersConfig = Field(default_factory=AdaptersConfig)
    infrastructure: InfrastructureConfig = Field(default_factory=InfrastructureConfig)
    tailscale: TailscaleConfig = Field(default_factory=TailscaleConfig)
    inference: InferenceConfig = Field(default_factory=InferenceConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)

    _env_list = field_validator("env", mode="before")(_one_table_as_list)

    @model_validator(mode="after")
    def _merge_spellings(self) -> RLConfig:
        """Fold the alternative spellings into one place, so the processes read one field each."""
        if self.lora_alpha is not None:
            self.lora.alpha = self.lora_alpha
        if self.tensor_parallel_size is not None:
            self.inference.tensor_parallel_size = self.tensor_parallel_size
        return self

    @property
    def seed(self) -> int:
        """The run's seed (the trainer's initial adapter weights): [buffer].seed."""
        return self.buffer.seed

    @property
    def env_weights(self) -> list[float]:
        """Sampling weight of each environment, from env_ratios, [[env]].weight, or equal."""
        if self.buffer.env_ratios is not None:
            return list(self.buffer.env_ratios)
        if any(e.weight is not None for e in self.env):
            return [e.weight if e.weight is not None else 1.0 for e in self.env]
        return [1.0] * len(self.env)


# ------------------------------------------------------------------------------------------------------------
# Checks across fields. They read the raw TOML data (so they run even when the schema found type errors) and
# skip any value of the wrong type, which the schema reports on its own.

def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _check_group(ctx: CheckContext) -> None:
    batch, group = _int(ctx.get(("batch_size",))), _int(ctx.get(("rollouts_per_example",)))
    if group is not None and group == 1:
        ctx.problem(("rollouts_per_example",), "must be at least 2 for training: advantages compare the "
                    "rollouts of one example with each other")
    if batch is not None and group is not None and group >= 1 and batch >= 1 and batch % group:
        options = sorted({max(group, batch - batch % group), batch + group - batch % group})
        ctx.problem(("batch_size",), f"batch_size ({batch}) must be divisible by rollouts_per_example ({group}); "
                    f"try {' or '.join(map(str, options))}")


def _check_sampling(ctx: CheckContext) -> None:
    if ctx.get(("sampling", "enable_thinking")) is not None and ctx.get(("sampling", "reasoning_effort")) is not None:
        ctx.problem(("sampling", "reasoning_effort"),
                    "enable_thinking and reasoning_effort cannot both be set: keep the one your model supports")
    max_tokens = _int(ctx.get(("sampling", "max_tokens")))
    seq_len = _int(ctx.get(("trainer", "max_seq_len")))  # checked only when set: Hosted configs never set it
    if max_tokens is not None and seq_len is not None and max_tokens >= seq_len:
        ctx.problem(("sampling", "max_tokens"), f"max_tokens ({max_tokens}) must be less than [trainer].max_seq_len "
                    f"({seq_len}), which also holds the prompt")


def _envs(ctx: CheckContext) -> list[Any]:
    envs = ctx.get(("env",))
    if isinstance(envs, dict):
        return [envs]
    return envs if isinstance(envs, list) else []


def _check_env_ratios(ctx: CheckContext) -> None:
    ratios = ctx.get(("buffer", "env_ratios"))
    envs = _envs(ctx)
    if ratios is not None and isinstance(ratios, list):
        numbers = [_num(r) for r in ratios]
        if len(ratios) != len(envs):
            ctx.problem(("buffer", "env_ratios"), f"has {len(ratios)} entries but there are {len(envs)} [[env]] "
                        "sections: give one ratio per environment, in order")
        elif all(n is not None and n >= 0 for n in numbers) and sum(n or 0.0 for n in numbers) <= 0:
            ctx.problem(("buffer", "env_ratios"), "must sum to more than 0")
    weighted = [i for i, e in enumerate(envs) if isinstance(e, dict) and "weight" in e]
    if ratios is not None and weighted:
        ctx.problem(("buffer", "env_ratios"), "env_ratios and [[env]].weight set the same thing: keep one "
                    f"(weight is set on env[{weighted[0]}])")
    elif weighted:
        weights = [_num(e.get("weight", 1.0)) for e in envs if isinstance(e, dict)]
        if all(w is not None and w >= 0 for w in weights) and sum(w or 0.0 for w in weights) <= 0:
            ctx.problem(("env", weighted[0], "weight"), "the [[env]] weights must sum to more than 0")


def _conflict(ctx: CheckContext, a: tuple[str, ...], b: tuple[str, ...], what: str) -> None:
    if ctx.has(a) and ctx.has(b):
        ctx.problem(b, f"{'.'.join(a)} and {'.'.join(b)} both set {what}: keep one")


def _check_spellings(ctx: CheckContext) -> None:
    _conflict(ctx, ("lora_alpha",), ("lora", "alpha"), "the LoRA alpha")
    _conflict(ctx, ("tensor_parallel_size",), ("inference", "tensor_parallel_size"), "tensor parallelism")
    buffer_filter = [k for k in ("online_difficulty_filtering", "easy_threshold", "hard_threshold",
                                 "easy_fraction", "hard_fraction") if ctx.has(("buffer", k))]
    if buffer_filter and ctx.has(("difficulty_filter",)):
        ctx.problem(("difficulty_filter",), f"[buffer] difficulty filtering (buffer.{buffer_filter[0]}) and "
                    "[difficulty_filter] are two spellings of one setting: keep one")


def _check_ranges(ctx: CheckContext) -> None:
    easy = _num(ctx.get(("buffer", "easy_threshold"), 0.8))
    hard = _num(ctx.get(("buffer", "hard_threshold"), 0.2))
    if easy is not None and hard is not None and not easy > hard:
        key = ("buffer", "easy_threshold") if ctx.has(("buffer", "easy_threshold")) else ("buffer", "hard_threshold")
        ctx.problem(key, f"easy_threshold ({easy:g}) must be greater than hard_threshold ({hard:g})")
    low = _num(ctx.get(("difficulty_filter", "min_reward"), 0.0))
    high = _num(ctx.get(("difficulty_filter", "max_reward"), 1.0))
    if low is not None and high is not None and not low < high:
        key = ("difficulty_filter", "min_reward") if ctx.has(("difficulty_filter", "min_reward")) \
            else ("difficulty_filter", "max_reward")
        ctx.problem(key, f"min_reward ({low:g}) must be less than max_reward ({high:g})")
    low_r = _num(ctx.get(("trainer", "ratio_mask_low"), 0.125))
    high_r = _num(ctx.get(("trainer", "ratio_mask_high"), 8.0))
    if low_r is not None and high_r is not None and not low_r < 1.0 < high_r:
        ctx.problem(("trainer", "ratio_mask_low"), "need ratio_mask_low < 1 < ratio_mask_high: a ratio of 1 "
                    "(sampler and trainer agree) must never be masked")
    batch = _int(ctx.get(("batch_size",)))
    accum = _int(ctx.get(("gradient_accumulation_steps",), 1))
    if batch and accum and accum > batch:
        ctx.problem(("gradient_accumulation_steps",), f"gradient_accumulation_steps ({accum}) cannot exceed "
                    f"batch_size ({batch})")


def _check_inference(ctx: CheckContext) -> None:
    backend = ctx.get(("inference", "backend"), "auto")
    base_url = ctx.get(("inference", "base_url"))
    if backend == "external" and base_url is None and not ctx.get(("inference", "base_urls")):
        ctx.problem(("inference", "backend"), 'backend = "external" needs [inference].base_url (an '
                    "OpenAI-compatible URL, e.g. http://127.0.0.1:8000/v1)")
    if base_url is not None and backend in ("builtin", "vllm"):
        ctx.problem(("inference", "base_url"), f'base_url is only used with backend = "external" (backend is '
                    f'"{backend}")')
    if isinstance(base_url, str) and not re.match(r"^https?://", base_url):
        ctx.problem(("inference", "base_url"), "must start with http:// or https://")


FULL_FINETUNING_LR = 1e-6  # the prime-rl guide: "1e-5 for LoRA, 1e-6 for full finetuning"
LORA_SCALE_LR = 1e-4  # at or above this, a rate meant for LoRA adapters


def _check_full_finetuning(ctx: CheckContext) -> None:
    if ctx.get(("lora", "enabled"), True) is not False:
        return
    lr = _num(ctx.get(("learning_rate",), RLConfig.model_fields["learning_rate"].default))
    if lr is not None and lr >= LORA_SCALE_LR:
        advice = (f"full fine-tuning moves every weight of the model: the prime-rl guide suggests a learning_rate "
                  f"of about {FULL_FINETUNING_LR:g}")
        if ctx.has(("learning_rate",)):
            ctx.problem(("learning_rate",), f"{lr:g} is a LoRA rate ([lora] enabled = false); {advice}",
                        severity="note")
        else:
            ctx.problem(("lora", "enabled"), f"the default learning_rate ({lr:g}) is a LoRA rate; {advice}",
                        severity="note")
    if ctx.get(("inference", "backend")) == "external":
        ctx.problem(("lora", "enabled"), "full fine-tuning loads each step's weights into the sampler through "
                    "POST /collective_rpc and /reset_prefix_cache: an external server must be a vLLM started with "
                    "VLLM_SERVER_DEV_MODE=1 and --worker-extension-cls "
                    "prime_lab.inference.vllm_worker.WeightUpdateExtension", severity="note")


def _hosted_notes(ctx: CheckContext) -> None:
    if ctx.has(("tailscale",)):
        ctx.problem(("tailscale",), "Tailscale sidecars are a Hosted Training feature and do nothing here: "
                    "locally, environments run on this machine and reach whatever it can reach", severity="note")
    if ctx.has(("tailscale", "auth_key")):
        ctx.problem(("tailscale", "auth_key"), "a secret in the config file: prefer the TAILSCALE_AUTH_KEY "
                    "environment variable", severity="note")
    if ctx.has(("checkpoints", "keep_cloud")):
        ctx.problem(("checkpoints", "keep_cloud"), "there is no cloud storage locally: keep_cloud is how many "
                    "checkpoints the run directory keeps (the newest; -1 keeps all)", severity="note")
    if ctx.has(("infrastructure", "compute_size")):
        ctx.problem(("infrastructure", "compute_size"), "sizes hosted environment containers; locally, "
                    "environments run in this machine's processes", severity="note")
    if ctx.has(("checkpoint_id",)):
        ctx.problem(("checkpoint_id",), "locally, a checkpoint is a run id or a checkpoints/step_N directory "
                    "on this machine", severity="note")


def _check_distributed(ctx: CheckContext) -> None:
    lora = ctx.get(("lora", "enabled"), True) is not False
    if ctx.get(("trainer", "distributed")) == "fsdp" and lora:
        ctx.problem(("trainer", "distributed"), 'FSDP2 shards full fine-tuning; a LoRA adapter is small enough to '
                    'replicate: use "ddp" (or "auto") with LoRA')
    nnodes, node_rank = _int(ctx.get(("trainer", "nnodes"), 1)), _int(ctx.get(("trainer", "node_rank"), 0))
    if nnodes is not None and node_rank is not None and node_rank >= nnodes:
        ctx.problem(("trainer", "node_rank"), f"node_rank ({node_rank}) must be less than nnodes ({nnodes})")
    servers = _int(ctx.get(("inference", "num_servers"), 1))
    if servers is not None and servers > 1 and ctx.get(("inference", "backend")) == "external":
        ctx.problem(("inference", "num_servers"), 'num_servers starts local samplers; with backend = "external" '
                    "list the servers in [inference].base_urls")
    urls = ctx.get(("inference", "base_urls"))
    if isinstance(urls, list) and urls:
        backend = ctx.get(("inference", "backend"), "auto")
        if backend in ("builtin", "vllm"):
            ctx.problem(("inference", "base_urls"), f'base_urls are only used with backend = "external" (backend is '
                        f'"{backend}")')
        if ctx.has(("inference", "base_url")):
            ctx.problem(("inference", "base_urls"), "base_url and base_urls both name the sampler: keep one")
        for i, url in enumerate(urls):
            if isinstance(url, str) and not re.match(r"^https?://", url):
                ctx.problem(("inference", "base_urls", i), "must start with http:// or https://")


def _check_lora_dropout(ctx: CheckContext) -> None:
    parameters = ctx.get(("lora", "target_parameters"))
    if ctx.get(("lora", "enabled"), True) is not False and isinstance(parameters, list) and parameters \
            and _num(ctx.get(("lora", "dropout"), 0.0)):
        ctx.problem(("lora", "dropout"), "peft's LoRA on parameters (target_parameters) takes no dropout: set "
                    "dropout = 0")


def _check_lora_targets_in_model(ctx: CheckContext) -> None:
    """Targets that match nothing in the run's model, when the file names them and the model is already on this
    machine (built on the meta device: no weights are read, but torch and transformers are imported)."""
    model = ctx.get(("model",))
    named = [key for key in ("target_modules", "target_parameters") if ctx.has(("lora", key))]
    if ctx.get(("lora", "enabled"), True) is False or not isinstance(model, str) or not named:
        return
    targets = {key: ctx.get(("lora", key), LoraConfig.model_fields[key].get_default(call_default_factory=True))
               for key in ("target_modules", "target_parameters")}
    if not all(isinstance(v, list) and all(isinstance(n, str) for n in v) for v in targets.values()):
        return
    from prime_lab.trainer.lora_targets import local_target_problems

    for key, message in local_target_problems(model, targets["target_modules"], targets["target_parameters"]):
        if key in named:
            ctx.problem(("lora", key), message)
        else:
            ctx.problem(("lora",), f"{key} (default): {message}")


def _check_env_system_prompt(ctx: CheckContext) -> None:
    for i, env in enumerate(_envs(ctx)):
        if isinstance(env, dict) and "system_prompt" in env:
            ctx.problem(("env", i, "system_prompt"), "prime-lab only: the prompt replaces each row's system message "
                        "here, as GEPA tried it; Hosted Training does not know this field (an environment with a "
                        "`system_prompt` argument takes the prompt in args instead)", severity="note")


def _check_teacher(ctx: CheckContext) -> None:
    loss = ctx.get(("loss",), "rl")
    if ctx.has(("teacher",)) and loss == "rl":
        ctx.problem(("teacher",), 'a [teacher] with loss = "rl" does nothing: set loss = "sft" (the teacher '
                    'generates the rollouts) or "opd" (it scores the model\'s own), or drop [teacher]')
    if loss in ("sft", "opd") and not ctx.has(("teacher",)):
        ctx.problem(("loss",), f'loss = "{loss}" needs a [teacher] section (model, and [teacher.client] base_url '
                    "for an endpoint)")
    if ctx.get(("teacher", "sampling", "enable_thinking")) is not None \
            and ctx.get(("teacher", "sampling", "reasoning_effort")) is not None:
        ctx.problem(("teacher", "sampling", "reasoning_effort"), "enable_thinking and reasoning_effort cannot both "
                    "be set: keep the one the teacher supports")
    url = ctx.get(("teacher", "client", "base_url"))
    if isinstance(url, str) and not re.match(r"^https?://", url):
        ctx.problem(("teacher", "client", "base_url"), "must start with http:// or https://")
    if loss == "opd" and isinstance(url, str):
        ctx.problem(("teacher", "client", "base_url"), "on-policy distillation scores the model's tokens through "
                    "prompt_logprobs: the endpoint must be vLLM (or prime-lab's built-in server) serving a model with "
                    "the same tokenizer as this run's", severity="note")
    if loss == "opd" and ctx.has(("teacher", "sampling")):
        ctx.problem(("teacher", "sampling"), 'with loss = "opd" the teacher generates nothing (it scores the '
                    "model's tokens): [teacher.sampling] is unused", severity="note")


def _check_opd_sampling(ctx: CheckContext) -> None:
    """On-policy distillation's advantage is the teacher's logprob of each sampled token less the model's. The
    teacher's is raw (prompt_logprobs take no sampling arguments: temperature 1, every token); the model's is taken
    as it samples (`[sampling]` temperature and top_p, in the sampler and the trainer alike). Only at the raw
    distribution are the two the same quantity and their mean a KL."""
    if ctx.get(("loss",)) != "opd":
        return
    raw = "raw ones (temperature 1: prompt_logprobs take no sampling arguments)"
    fix = 'or use loss = "sft" (the teacher generates, at [teacher.sampling] temperature, and its text is learned)'
    temperature = _num(ctx.get(("sampling", "temperature"), 1.0))
    if temperature is not None and temperature != 1.0:
        ctx.problem(("sampling", "temperature"), f'loss = "opd" compares the model\'s logprobs at temperature '
                    f"{temperature:g} with the teacher's {raw}: their difference is no KL. Set temperature = 1.0, "
                    f"{fix}")
    top_p = _num(ctx.get(("sampling", "top_p"), 1.0))
    if top_p is not None and top_p < 1.0:
        ctx.problem(("sampling", "top_p"), f'loss = "opd" compares the model\'s logprobs inside its nucleus (top_p '
                    f"{top_p:g}) with the teacher's {raw} over every token: their difference is no KL. Set top_p = "
                    f"1.0, {fix}")


def _check_teacher_tokenizer(ctx: CheckContext) -> None:
    """On-policy distillation sends the student's token ids to the teacher: both must share a tokenizer. Compared
    when both tokenizers are had without building a model: a model on this machine, or a preset whose tokenizer is
    built alone (the tiny ones); else `prime rl run` builds the models first and validates again."""
    student, teacher = ctx.get(("model",)), ctx.get(("teacher", "model"))
    if ctx.get(("loss",)) != "opd" or not isinstance(student, str) or not isinstance(teacher, str) \
            or ctx.has(("teacher", "client", "base_url")) or student == teacher:
        return
    from prime_lab.models.resolve import local_tokenizer
    from prime_lab.models.store import tokenizer_difference

    tokenizers: dict[str, Any] = {}
    for spec in (student, teacher):
        try:
            tokenizers[spec] = local_tokenizer(spec)
        except (OSError, ValueError, TypeError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            ctx.problem(("teacher", "model") if spec == teacher else ("model",), f"the tokenizer of {spec} does "
                        f"not load ({first}): on-policy distillation compares the teacher's with the model's")
            return
    missing = [spec for spec, tokenizer in tokenizers.items() if tokenizer is None]
    if missing:
        ctx.problem(("teacher", "model"), f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not on "
                    f"this machine yet: `prime rl run` builds or finds {'it' if len(missing) == 1 else 'them'} and "
                    "compares the teacher's tokenizer with the model's before the run starts", severity="note")
        return
    difference = tokenizer_difference(tokenizers[teacher], tokenizers[student])
    if difference:
        ctx.problem(("teacher", "model"), f"the teacher ({teacher}) and the model ({student}) have different "
                    f"tokenizers ({difference}): on-policy distillation scores the model's token ids on the teacher, "
                    'so they must share one; pick a teacher of the same family, or use loss = "sft" (the teacher\'s '
                    "text is tokenized again for the model)")


RL_CHECKS = (_check_group, _check_sampling, _check_env_ratios, _check_spellings, _check_ranges, _check_inference,
             _check_full_finetuning, _hosted_notes, _check_distributed, _check_lora_dropout, _check_teacher,
             _check_opd_sampling, _check_env_system_prompt)
MODEL_CHECKS = (_check_lora_targets_in_model, _check_teacher_tokenizer)


def validate_rl_config(text: str, file: str | None = None, *, check_model: bool = False) -> Validation[RLConfig]:
    """Every problem of the config `text`. With `check_model`, also the `[lora]` targets it names against its model
    when that is on this machine (a few seconds, once, to import transformers): the editor, which validates on
    every change, leaves it off; `validate_rl_file` (`prime rl validate`, `prime rl run`) has it on."""
    return validate_toml(text, RLConfig, file=file, checks=RL_CHECKS + (MODEL_CHECKS if check_model else ()))


def validate_rl_file(path: Path, *, check_model: bool = True) -> Validation[RLConfig]:
    return validate_file(path, RLConfig, checks=RL_CHECKS + (MODEL_CHECKS if check_model else ()))


def template_path() -> Path:
    return Path(__file__).with_name("template.toml")
