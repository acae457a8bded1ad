"""The environment API users import (`from prime_lab.envs import SingleTurnEnv, Rubric`, as verifiers users write
`import verifiers as vf`): verifiers' classic protocol, datasets, rollouts through an OpenAI client, rubrics.

Beside the API: the loader (id -> environment), installed environments and `prime env install`, environments at
their own verifiers release (`releases`, `isolated`, `env_server`, `driver`), the secret store, and the built-in
environments (`builtin/`). Importing this package is cheap (no torch, no model code); environments call models
only over HTTP.
"""

from prime_lab.envs.environment import (
    Environment,
    MultiTurnEnv,
    Rollout,
    SamplingArgs,
    SingleTurnEnv,
    State,
    Turn,
    replace_system_prompt,
)
from prime_lab.envs.group import EnvGroup
from prime_lab.envs.loader import EnvInfo, EnvironmentLoadError, builtin_environments, describe, load_environment
from prime_lab.envs.parsers import Parser, ThinkParser, XMLParser
from prime_lab.envs.rubric import Rubric, Score
from prime_lab.envs.secrets import MissingKeyError, ensure_keys, load_env_files, redact
from prime_lab.envs.tools import ToolEnv

__all__ = [
    "EnvGroup", "EnvInfo", "Environment", "EnvironmentLoadError", "MissingKeyError", "MultiTurnEnv", "Parser",
    "Rollout", "Rubric", "SamplingArgs", "Score", "SingleTurnEnv", "State", "ThinkParser", "ToolEnv", "Turn",
    "XMLParser", "builtin_environments", "describe", "ensure_keys", "load_env_files", "load_environment", "redact",
    "replace_system_prompt",
]
