"""The TOML form of `prime gepa run @config.toml`: `[env]` (or one `[[env]]`), `[gepa]`, `[sampling]`, `[sandbox]`.

Validated through problems.validation, so every problem carries its file, line, dotted key and a did-you-mean.
These are GEPA's only defaults: `prime gepa run ENV` (its flags over them) and `GepaSettings` take theirs from here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import AliasChoices, Field, field_validator

from prime_lab.envs.judges import JudgeConfig
from prime_lab.envs.tool_prompt import KEY as TOOLS_KEY
from prime_lab.models.presets import DEFAULT_MODEL
from prime_lab.problems.schema import ConfigSection
from prime_lab.problems.validation import CheckContext, Validation, validate_file, validate_toml
from prime_lab.sandbox.config import SandboxConfig


class GepaEnvSection(ConfigSection):
    id: str = Field(description="Environment id: `owner/name` or a built-in name.")
    args: dict[str, Any] = Field(default_factory=dict, description="Arguments passed to load_environment().")


class GepaSearchSection(ConfigSection):
    max_calls: int = Field(default=500, ge=1, validation_alias=AliasChoices("max_calls", "max_metric_calls"),
                           description="Metric-call budget (one rollout each), a hard cap; the seed's validation "
                                       "counts.")
    num_train: int = Field(default=100, ge=1, description="Training examples (minibatches come from these).")
    num_val: int = Field(default=50, ge=1, description="Validation examples (the Pareto fronts are over these).")
    num_test: int = Field(default=0, ge=0, description="Held-out examples to score the seed and the best prompt on.")
    minibatch_size: int = Field(default=3, ge=1, description="Examples per reflection.")
    perfect_score: float | None = Field(default=None, description="Skip a minibatch when every score reaches it.")
    state_columns: list[str] = Field(default_factory=list, description="Rollout state fields shown to the "
                                                                       "reflection model.")
    seed: int = Field(default=0, description="Seeds the data split, minibatches and parent selection.")
    max_concurrent: int = Field(default=32, ge=1, description="Rollouts in flight at once.")
    num_parallel_proposals: int = Field(default=8, ge=1, description="Reflective proposals run at once, a round "
                                                                     "at a time (1: one after another).")
    reflection_temperature: float | None = Field(default=None, ge=0, description="Sampling temperature of the "
                                                 "reflection model (default: the endpoint's); 0 makes a seeded "
                                                 "search repeatable with a deterministic server.")
    use_merge: bool = Field(default=False, description="Try merging candidates that improved different parts.")
    max_merge_invocations: int = Field(default=5, ge=0)


class GepaConfig(ConfigSection):
    env: GepaEnvSection
    model: str = Field(default=DEFAULT_MODEL, description="Task model: a local preset/path or a served name.")
    reflection_model: str | None = Field(default=None, description="Proposes new prompts (default: the model).")
    base_url: str | None = Field(default=None, description="OpenAI-compatible endpoint of the task model "
                                                           "(default: start the built-in server locally).")
    reflection_base_url: str | None = Field(default=None, description="Endpoint of the reflection model "
                                                                      "(default: the task model's).")
    api_key_var: str = Field(default="OPENAI_API_KEY", description="Environment variable holding the API key.")
    gepa: GepaSearchSection = Field(default_factory=GepaSearchSection)
    sampling: dict[str, Any] = Field(default_factory=dict, description="Sampling args of the task model; "
                                     "`tools_in_system_prompt = true` (ours, never sent) writes an environment's tool "
                                     "schemas after the system prompt where the model's chat template drops `tools`.")
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig, description="Where the environment's sandboxes run "
                                   "(sandbox/config.py).")
    judge: JudgeConfig | None = Field(default=None, description="The environment's LLM judge, started here (as "
                                      "--judge MODEL; envs/judges.py).")

    @field_validator("env", mode="before")
    @classmethod
    def _one_env(cls, value: Any) -> Any:
        """`[[env]]` with one entry is the same as `[env]`."""
        if isinstance(value, list) and len(value) == 1:
            return value[0]
        return value


def _one_environment(ctx: CheckContext) -> None:
    envs = ctx.get(("env",))
    if isinstance(envs, list) and len(envs) != 1:
        ctx.problem(("env",), f"GEPA optimizes the system prompt of one environment; {len(envs)} are given")


def _tools_setting(ctx: CheckContext) -> None:
    value = ctx.get(("sampling", TOOLS_KEY))
    if value is not None and not isinstance(value, bool):
        ctx.problem(("sampling", TOOLS_KEY), f"{TOOLS_KEY} is true or false, not {value!r}")


GEPA_CHECKS = (_one_environment, _tools_setting)


def validate_gepa_config(text: str, file: str | None = None) -> Validation[GepaConfig]:
    return validate_toml(text, GepaConfig, file=file, checks=GEPA_CHECKS)


def validate_gepa_file(path: Path) -> Validation[GepaConfig]:
    return validate_file(path, GepaConfig, checks=GEPA_CHECKS)
