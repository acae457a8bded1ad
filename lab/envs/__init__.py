"""The environment protocol (verifiers' classic API): datasets, rollouts through an OpenAI client, rubrics.

Importing this package is cheap (no torch, no model code); environments call models only over HTTP.
"""

from lab.envs.environment import (
    Environment,
    MultiTurnEnv,
    Rollout,
    SamplingArgs,
    SingleTurnEnv,
    State,
    Turn,
)
from lab.envs.group import EnvGroup
from lab.envs.loader import EnvInfo, EnvironmentLoadError, builtin_environments, describe, load_environment
from lab.envs.parsers import Parser, ThinkParser, XMLParser
from lab.envs.rubric import Rubric, Score
from lab.envs.secrets import MissingKeyError, ensure_keys, load_env_files, redact
from lab.envs.tools import ToolEnv

__all__ = [
    "EnvGroup", "EnvInfo", "Environment", "EnvironmentLoadError", "MissingKeyError", "MultiTurnEnv", "Parser",
    "Rollout", "Rubric", "SamplingArgs", "Score", "SingleTurnEnv", "State", "ThinkParser", "ToolEnv", "Turn",
    "XMLParser", "builtin_environments", "describe", "ensure_keys", "load_env_files", "load_environment", "redact",
]
