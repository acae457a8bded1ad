"""LLM judges of environments: which `load_environment` arguments point an environment's judge at a server, and the
one line for a judge that has no key.

Most published environments that score with an LLM judge take its address, model and key as arguments
(`judge_base_url`, `judge_model`, `judge_api_key_var` and a few variants); the others build `AsyncOpenAI()` and read
`OPENAI_BASE_URL` / `OPENAI_API_KEY`. `judge_arguments` reads a signature (names and defaults, as `env_args`,
driver.py's `check` or `load_arguments` give them) into the arguments it takes. When the OpenAI SDK finds no key
while an environment loads, `lines_failure_message` turns the error's lines (`hub.error_lines`, driver.py's
`error_chain`) into one line: which variable holds the judge's key, the `prime secret` command that stores it, and
how to point the judge at a local server instead."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prime_lab.envs.arguments import EnvArg
from prime_lab.envs.secrets import NAME_PATTERN, secret_command

BASE_URL_NAMES = ("judge_base_url", "judge_url", "judge_api_base")
MODEL_NAMES = ("judge_model", "judge_model_name")
KEY_VARIABLE_NAMES = ("judge_api_key_var",)  # the argument names the environment variable holding the key
KEY_NAMES = ("judge_api_key",)  # the argument is the key itself
DEFAULT_KEY_VARIABLE = "OPENAI_API_KEY"  # where the OpenAI SDK looks when given no key

# The OpenAI SDK's words for a client built without a key (before 2.x, then since).
_NO_KEY = ("The api_key client option must be set", "Missing credentials")


@dataclass(frozen=True)
class Argument:
    name: str
    default: Any  # None when it has none (or its default is None)


@dataclass(frozen=True)
class JudgeArguments:
    """The judge arguments an environment's `load_environment` takes (None: it takes none of that kind)."""

    base_url: Argument | None = None
    model: Argument | None = None
    key: Argument | None = None
    key_is_variable: bool = False  # `key` names an environment variable (judge_api_key_var), not the key itself

    def key_variable(self) -> str:
        """The environment variable the judge's key is read from: the one `judge_api_key_var` names by default,
        else the OpenAI SDK's."""
        if self.key_is_variable and self.key is not None and isinstance(self.key.default, str) \
                and self.key.default:
            return self.key.default
        return DEFAULT_KEY_VARIABLE


Signature = Mapping[str, Any] | Iterable[EnvArg | Sequence[Any]]


def _defaults(signature: Signature) -> dict[str, Any]:
    """{name: default} of a signature: a mapping (`load_arguments`), `EnvArg`s, or driver.py's `check` rows
    ([name, default, required, annotation])."""
    if isinstance(signature, Mapping):
        return dict(signature)
    out: dict[str, Any] = {}
    for row in signature:
        if isinstance(row, EnvArg):
            out[row.name] = None if row.required else row.default
        elif row and isinstance(row[0], str):
            required = len(row) > 2 and bool(row[2])
            out[row[0]] = None if required or len(row) < 2 else row[1]
    return out


def judge_arguments(signature: Signature) -> JudgeArguments | None:
    """The judge arguments `load_environment` takes, with their defaults; None when it takes none."""
    defaults = _defaults(signature)

    def first(names: Sequence[str]) -> Argument | None:
        name = next((n for n in names if n in defaults), None)
        return None if name is None else Argument(name, defaults[name])

    base_url, model = first(BASE_URL_NAMES), first(MODEL_NAMES)
    key_variable = first(KEY_VARIABLE_NAMES)
    key = key_variable or first(KEY_NAMES)
    if base_url is None and model is None and key is None:
        return None
    return JudgeArguments(base_url, model, key, key_variable is not None)


def no_key(lines: Sequence[str]) -> bool:
    """Whether an error's lines (outermost first) hold the OpenAI SDK's refusal to build a client with no key."""
    return any(words in line for line in lines for words in _NO_KEY)


def lines_failure_message(lines: Sequence[str], env_id: str, arguments: Signature) -> str | None:
    """One line for an environment whose LLM judge has no key (None when the error is something else).

    `arguments` are its `load_environment` arguments with their values for this load (defaults included)."""
    if not no_key(lines):
        return None
    judge = judge_arguments(arguments)
    variable = judge.key_variable() if judge is not None else DEFAULT_KEY_VARIABLE
    store = f"store it with `{secret_command('create', variable)}`, or export it" \
        if NAME_PATTERN.match(variable) else "export it"
    url, model = "http://127.0.0.1:PORT/v1", "MODEL"
    local = f"or judge with a local model (`prime serve {model}`, {variable} set to any value) "
    if judge is not None and judge.base_url is not None:
        pointed = {judge.base_url.name: url}
        if judge.model is not None:
            pointed[judge.model.name] = model
        local += f"by passing -a '{json.dumps(pointed)}'"
    else:
        local += f"with OPENAI_BASE_URL={url}"
    if variable != DEFAULT_KEY_VARIABLE and judge is not None and judge.key is not None:
        named = f"{variable} (named by {judge.key.name})"
    else:
        named = variable
    return f"environment '{env_id}': its LLM judge needs an API key in {named}, not set: {store}; {local}"

