"""LLM judges of environments (envs/judges.py): which `load_environment` arguments point a judge at a server, read
from a signature in each form prime-lab holds one; and the one line for a judge that has no key, in this process,
from an environment's own interpreter (driver.py's answer) and from `prime eval run`."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Any

import pytest

from prime_lab.envs import EnvironmentLoadError, hub, load_environment
from prime_lab.envs.arguments import EnvArg
from prime_lab.envs.judges import Argument, judge_arguments, lines_failure_message
from tests.support import cli

NO_KEY = ("openai.OpenAIError: Missing credentials. Please pass an `api_key`, `workload_identity`, `admin_api_key`, "
          "or set the `OPENAI_API_KEY` or `OPENAI_ADMIN_KEY` environment variable.")
OLD_NO_KEY = ("openai.OpenAIError: The api_key client option must be set either by passing api_key to the client or "
              "by setting the OPENAI_API_KEY environment variable")


def test_judge_arguments_are_read_from_each_form_of_a_signature() -> None:
    rows: list[list[Any]] = [["judge_model", "gpt-4.1-mini", False, "str"], ["judge_base_url", None, False, ""],
            ["judge_api_key_var", "PRIME_API_KEY", False, "str"], ["num_examples", -1, False, "int"]]  # check's
    judge = judge_arguments(rows)
    assert judge is not None
    assert judge.base_url == Argument("judge_base_url", None)
    assert judge.model == Argument("judge_model", "gpt-4.1-mini")
    assert judge.key == Argument("judge_api_key_var", "PRIME_API_KEY") and judge.key_is_variable
    assert judge.key_variable() == "PRIME_API_KEY"
    variants = judge_arguments([EnvArg("judge_url", "http://x/v1", False, ""),
                                EnvArg("judge_model_name", None, True, ""), EnvArg("judge_api_key", None, False, "")])
    assert variants is not None and variants.base_url == Argument("judge_url", "http://x/v1")
    assert variants.model == Argument("judge_model_name", None)  # required: no default
    assert variants.key == Argument("judge_api_key", None) and not variants.key_is_variable
    assert variants.key_variable() == "OPENAI_API_KEY"  # the key itself, else the SDK's variable
    mapping = judge_arguments({"judge_api_base": "https://api.pinference.ai/api/v1", "split": "train"})
    assert mapping is not None and mapping.base_url == Argument("judge_api_base", "https://api.pinference.ai/api/v1")
    assert mapping.model is None and mapping.key is None
    assert judge_arguments([["dataset_name", "x/y", False, ""]]) is None
    assert judge_arguments({}) is None


def test_the_judge_message_names_the_variable_its_arguments_name_and_how_to_judge_locally() -> None:
    args = {"judge_base_url": "https://api.example/v1", "judge_model": "gpt-5", "judge_api_key_var": "JUDGE_KEY"}
    assert lines_failure_message([NO_KEY], "x", {}) is not None
    message = lines_failure_message(["RuntimeError: judge client", OLD_NO_KEY], "me/judged", args) or ""
    assert message.startswith("environment 'me/judged': its LLM judge needs an API key in JUDGE_KEY (named by "
                              "judge_api_key_var), not set")
    assert "`prime secret create -n JUDGE_KEY`" in message
    assert message.endswith("; or judge with a local model: add --judge MODEL (in a config file, a [judge] table "
                            "with model = MODEL)")
    assert "\n" not in message
    assert lines_failure_message(["ValueError: something else"], "me/judged", args) is None


ENV_VARIABLE_JUDGE = '''
    """Judged by a client the environment builds itself (reads OPENAI_BASE_URL / OPENAI_API_KEY)."""
    from openai import AsyncOpenAI


    def load_environment(num_examples: int = 2):
        judge = AsyncOpenAI()
        raise AssertionError(f"unreachable without a key: {judge}")
'''

ARGUMENT_JUDGE = '''
    """Judged by a client its arguments point."""
    import os

    from openai import AsyncOpenAI


    def load_environment(judge_model: str = "gpt-4.1-mini", judge_base_url: str = "https://api.openai.com/v1",
                         judge_api_key_var: str = "MY_JUDGE_KEY"):
        judge = AsyncOpenAI(base_url=judge_base_url, api_key=os.getenv(judge_api_key_var))
        raise AssertionError(f"unreachable without a key: {judge}")
'''


@pytest.fixture
def judged_envs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name, source in (("judged_by_variables", ENV_VARIABLE_JUDGE), ("judged_by_arguments", ARGUMENT_JUDGE)):
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    for variable in ("OPENAI_API_KEY", "OPENAI_ADMIN_KEY", "OPENAI_BASE_URL", "MY_JUDGE_KEY"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_an_environment_whose_judge_has_no_key_fails_to_load_in_one_line(judged_envs: Path) -> None:
    with pytest.raises(EnvironmentLoadError) as by_variables:
        load_environment("judged-by-variables")
    message = str(by_variables.value)
    assert message.startswith("environment 'judged-by-variables': its LLM judge needs an API key in OPENAI_API_KEY, "
                              "not set: store it with `prime secret create -n OPENAI_API_KEY`")
    assert "--judge MODEL" in message
    with pytest.raises(EnvironmentLoadError) as by_arguments:
        load_environment("judged-by-arguments", judge_model="gpt-5")
    message = str(by_arguments.value)
    assert "needs an API key in MY_JUDGE_KEY (named by judge_api_key_var)" in message
    assert "`prime secret create -n MY_JUDGE_KEY`" in message and "[judge] table" in message
    # the same line from an environment's own interpreter: driver.py's answer (its error lines and arguments)
    answer = {"error": OLD_NO_KEY, "errors": [OLD_NO_KEY],
              "arguments": {"judge_model": "gpt-5", "judge_base_url": "https://api.openai.com/v1",
                            "judge_api_key_var": "MY_JUDGE_KEY"}}
    assert hub.driver_failure_message(answer, "judged-by-arguments") == message


def test_prime_eval_run_of_an_environment_whose_judge_has_no_key_is_one_line(judged_envs: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(judged_envs), os.environ.get("PYTHONPATH", "")])}
    proc = cli.prime("eval", "run", "judged-by-variables", "-b", "http://127.0.0.1:9/v1", "-m", "tiny", "-n", "1",
                     env=env)
    assert proc.returncode != 0
    assert "environment 'judged-by-variables': its LLM judge needs an API key in OPENAI_API_KEY" in proc.stderr
    assert len([line for line in proc.stderr.splitlines() if line.strip()]) == 1, proc.stderr
