"""The environment protocol (verifiers' classic API): datasets, rollouts through an OpenAI client, rubrics.

Importing this package is cheap (no torch, no model code); environments call models only over HTTP.
"""

from prime_lab.lab.envs.environment import (
    Environment,
    MultiTurnEnv,
    Rollout,
    SamplingArgs,
    SingleTurnEnv,
    State,
    Turn,
    replace_system_prompt,
)
from prime_lab.lab.envs.group import EnvGroup
from prime_lab.lab.envs.loader import EnvInfo, EnvironmentLoadError, builtin_environments, describe, load_environment
from prime_lab.lab.envs.parsers import Parser, ThinkParser, XMLParser
from prime_lab.lab.envs.rubric import Rubric, Score
from prime_lab.lab.envs.secrets import MissingKeyError, ensure_keys, load_env_files, redact
from prime_lab.lab.envs.tools import ToolEnv

__all__ = [
    "EnvGroup", "EnvInfo", "Environment", "EnvironmentLoadError", "MissingKeyError", "MultiTurnEnv", "Parser",
    "Rollout", "Rubric", "SamplingArgs", "Score", "SingleTurnEnv", "State", "ThinkParser", "ToolEnv", "Turn",
    "XMLParser", "builtin_environments", "describe", "ensure_keys", "load_env_files", "load_environment", "redact",
    "replace_system_prompt",
]
