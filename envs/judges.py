"""LLM judges of environments: which `load_environment` arguments point an environment's judge at a server, and the
one line for a judge that has no key.

Most published environments that score with an LLM judge take its address, model and key as arguments
(`judge_base_url`, `judge_model`, `judge_api_key_var` and a few variants); the others build `AsyncOpenAI()` and read
`OPENAI_BASE_URL` / `OPENAI_API_KEY`. `judge_arguments` reads a signature (names and defaults, as `env_args`,
driver.py's `check` or `load_arguments` give them) into the arguments it takes. When the OpenAI SDK finds no key
while an environment loads, `lines_failure_message` turns the error's lines (`hub.error_lines`, driver.py's
`error_chain`) into one line: which variable holds the judge's key, the `prime secret` command that stores it, and
how to point the judge at a local server instead.

A run, evaluation or GEPA run with a judge (`[judge]`, `--judge MODEL`: `JudgeConfig`) starts it (inference/judge.py)
and says where it is in its own process environment (`JUDGE_VARIABLES`, as `[sandbox]` is handed on), which the
environment servers it starts inherit. Each environment loaded then is wired to it (`wire`): the judge arguments its
`load_environment` takes and the user left unset point at the judge; one that takes no base-URL argument gets
`OPENAI_BASE_URL` / `OPENAI_API_KEY` in its own process environment (its server's; for one loaded in this process, while
it loads: the sampler's client never sees them)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field

from prime_lab.envs.arguments import EnvArg
from prime_lab.envs.secrets import NAME_PATTERN, secret_command
from prime_lab.problems.schema import ConfigSection
from prime_lab.runs.paths import environ_set

BASE_URL_NAMES = ("judge_base_url", "judge_url", "judge_api_base")
MODEL_NAMES = ("judge_model", "judge_model_name")
KEY_VARIABLE_NAMES = ("judge_api_key_var",)  # the argument names the environment variable holding the key
KEY_NAMES = ("judge_api_key",)  # the argument is the key itself
DEFAULT_KEY_VARIABLE = "OPENAI_API_KEY"  # where the OpenAI SDK looks when given no key

# The OpenAI SDK's words for a client built without a key (before 2.x, then since).
_NO_KEY = ("The api_key client option must be set", "Missing credentials")

# Where a process with a judge says where it is (read by `endpoint_from_environ`, inherited by environment servers).
URL_VARIABLE = "PRIME_LAB_JUDGE_BASE_URL"
MODEL_VARIABLE = "PRIME_LAB_JUDGE_MODEL"
KEY_VARIABLE = "PRIME_LAB_JUDGE_API_KEY"  # also what a wired `judge_api_key_var` names
JUDGE_VARIABLES = (URL_VARIABLE, MODEL_VARIABLE, KEY_VARIABLE)
LOCAL_KEY = "local"  # a local judge checks no key, but the OpenAI client wants one
DEFAULT_MAX_TOKENS = 256
LOCAL_JUDGE = "judge with a local model: add --judge MODEL (in a config file, a [judge] table with model = MODEL)"


class JudgeSamplingConfig(ConfigSection):
    max_tokens: int = Field(default=DEFAULT_MAX_TOKENS, ge=1, description="A local judge's answer length when the "
                            "environment's request sets none (many set none: the model's context would be the limit).")
    temperature: float | None = Field(default=None, ge=0.0, description="A local judge's temperature when the "
                                      "environment's request sets none (default: the model's own).")


class JudgeClientConfig(ConfigSection):
    base_url: str | None = Field(default=None, description="An OpenAI-compatible endpoint serving the judge model "
                                 "(then nothing is started here).")
    api_key_var: str = Field(default="OPENAI_API_KEY", description="The environment variable (or `prime secret`) "
                             "holding that endpoint's key.")


class JudgeConfig(ConfigSection):
    model: str = Field(description="Judge model: a preset, a Hugging Face id or a local path (a local server serves "
                       "it), or the model name at [judge.client].base_url.")
    backend: Literal["auto", "builtin", "vllm"] = Field(
        default="auto", description="Engine of the local judge server (like [inference].backend).")
    sampling: JudgeSamplingConfig = Field(default_factory=JudgeSamplingConfig)
    client: JudgeClientConfig = Field(default_factory=JudgeClientConfig)
    gpu_memory_utilization: float | None = Field(
        default=None, gt=0.0, le=1.0, description="Fraction of a GPU's memory the local judge's vLLM engine may take.")


@dataclass(frozen=True)
class JudgeEndpoint:
    """A running judge: where environments send their judge requests."""

    base_url: str  # ends in /v1
    model: str
    api_key: str = LOCAL_KEY

    def environ(self) -> dict[str, str]:
        return {URL_VARIABLE: self.base_url, MODEL_VARIABLE: self.model, KEY_VARIABLE: self.api_key}


def endpoint_from_environ(environ: Mapping[str, str] | None = None) -> JudgeEndpoint | None:
    """The judge this process was given (`JudgeEndpoint.environ`), or None."""
    environ = os.environ if environ is None else environ
    url, model = environ.get(URL_VARIABLE), environ.get(MODEL_VARIABLE)
    if not url or not model:
        return None
    return JudgeEndpoint(url, model, environ.get(KEY_VARIABLE) or LOCAL_KEY)


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
    local = "or " + LOCAL_JUDGE
    if variable != DEFAULT_KEY_VARIABLE and judge is not None and judge.key is not None:
        named = f"{variable} (named by {judge.key.name})"
    else:
        named = variable
    return f"environment '{env_id}': its LLM judge needs an API key in {named}, not set: {store}; {local}"


@dataclass(frozen=True)
class Wiring:
    """How one environment is pointed at the run's judge: its `load_environment` arguments (the user's, then those
    filled in) and the variables its process gets."""

    args: dict[str, Any]
    environ: dict[str, str] = field(default_factory=dict)
    filled: tuple[str, ...] = ()  # the arguments filled in

    def describe(self, env_id: str, judge: JudgeEndpoint) -> str:
        """One line for the run's log: what was wired where."""
        parts = [f"{', '.join(self.filled)} (arguments)"] if self.filled else []
        variables = sorted(k for k in self.environ if k.startswith("OPENAI_"))  # not our key a filled argument names
        if variables:
            parts.append(f"{', '.join(variables)} (its environment)")
        how = " and ".join(parts) or "nothing: its arguments already name a judge"
        return f"environment '{env_id}': judge {judge.model} at {judge.base_url} through {how}"


def wire(signature: Signature, args: Mapping[str, Any], judge: JudgeEndpoint) -> Wiring:
    """Point an environment at `judge`: the judge arguments its `load_environment` takes (`signature`) and `args`
    leave unset are filled in (a user's explicit argument always wins); without a base-URL argument it is taken to
    build its client from `OPENAI_BASE_URL` / `OPENAI_API_KEY`, which go in its environment."""
    found = judge_arguments(signature)
    out, filled = dict(args), []

    def fill(argument: Argument | None, value: str) -> None:
        if argument is not None and argument.name not in args:
            out[argument.name] = value
            filled.append(argument.name)

    environ: dict[str, str] = {}
    if found is not None:
        fill(found.base_url, judge.base_url)
        fill(found.model, judge.model)
        fill(found.key, KEY_VARIABLE if found.key_is_variable else judge.api_key)
        if found.key_is_variable and found.key is not None and found.key.name in filled:
            environ[KEY_VARIABLE] = judge.api_key
    if found is None or found.base_url is None:
        environ.update(OPENAI_BASE_URL=judge.base_url, OPENAI_API_KEY=judge.api_key)
    return Wiring(out, environ, tuple(filled))


@contextmanager
def environ_while_loading(wiring: Wiring | None) -> Iterator[None]:
    """An environment loaded in this process gets its wiring's variables while its `load_environment` runs (where
    verifiers' JudgeRubric and the like build their client); then this process's own are back, so that nothing
    else here (the sampler's client) ever reads them. `PRIME_LAB_JUDGE_API_KEY` stays: ours, and a wired
    `judge_api_key_var` may read it later."""
    with environ_set(wiring.environ if wiring is not None else {}, keep=(KEY_VARIABLE,)):
        yield


def how_wired(signature: Signature) -> str:
    """How a run's judge reaches an environment, in a few words for `prime env list`: through its judge arguments,
    or (without a base-URL argument) through OPENAI_BASE_URL in its environment; '' for one that takes no judge
    arguments (it may still build a client from OPENAI_BASE_URL: then that is how it is wired)."""
    found = judge_arguments(signature)
    if found is None:
        return ""
    names = [a.name for a in (found.base_url, found.model, found.key) if a is not None]
    return ", ".join(names) + ("" if found.base_url is not None else " + OPENAI_BASE_URL")


def config_advice(env_id: str, signature: Signature, args: Mapping[str, Any],
                  judge_model: str | None) -> tuple[str, str] | None:
    """What `prime lab doctor` says of an environment a config names that takes judge arguments, as (status,
    message) (None for one that takes none): "ok", wired to the config's `[judge]` or pointed by the user's own
    arguments; "warn", calling its default endpoint with a key, with how to judge locally instead."""
    found = judge_arguments(signature)
    if found is None:
        return None
    how = how_wired(signature)
    if judge_model is not None:
        return "ok", f"environment '{env_id}' takes an LLM judge ({how}): wired to [judge] {judge_model}"
    url_arg = found.base_url.name if found.base_url is not None else None
    if url_arg is not None and args.get(url_arg):
        return "ok", f"environment '{env_id}' takes an LLM judge: its args point it at {args[url_arg]}"
    where = (found.base_url.default if found.base_url is not None and found.base_url.default
             else "the endpoint OPENAI_BASE_URL names (else api.openai.com)")
    return "warn", (f"environment '{env_id}' takes an LLM judge ({how}): without a [judge] table it calls {where} "
                    f"with the key in {found.key_variable()}; add [judge] model = \"MODEL\" to judge with a local "
                    "model")


def local_judge_hint(message: str, signature: Signature) -> str:
    """`message` (an environment's load failure, no judge configured) with how to judge locally added where the
    environment takes judge arguments and its error is about its judge (as agentic_misalignment's "requires an LLM
    judge. Provide judge_base_url and judge_api_key")."""
    if judge_arguments(signature) is None or "judge" not in message.lower() or LOCAL_JUDGE in message:
        return message
    return f"{message}; to {LOCAL_JUDGE}"
