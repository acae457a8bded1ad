"""Tools the model can see (envs/tool_prompt.py): a chat template that drops `tools` is found by rendering, an
evaluation, an RL run and a GEPA search on such a model say so once (naming the environment, the model and the
setting), and with `tools_in_system_prompt` the schemas reach the server in the system prompt, in the format its
tool-call parser reads.

The templates are real: SmolLM2-135M-Instruct's (its tokenizer only) and the tiny model's drop tools; Qwen2.5's
tool rendering on the tiny model's tokens shows them. The environment is verifiers' own `ToolEnv`
(tests/fixtures/verifiers_envs/vf_tool_test), run in this process against the built-in server on the tiny model.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from prime_lab.envs import SamplingArgs, load_environment
from prime_lab.envs.tool_prompt import (
    CALL_FORMAT,
    ToolPrompts,
    environment_tools,
    plan_tools,
    template_shows_tools,
    tools_block,
)
from prime_lab.envs.verifiers_adapter import VerifiersEnvironment, kept_signal_handlers
from prime_lab.evals.evaluation import EvalSpec, run_evaluation
from prime_lab.evals.launcher import EvalJob
from prime_lab.gepa.config import validate_gepa_config
from prime_lab.gepa.env_adapter import Endpoint
from prime_lab.gepa.runner import GepaSettings, run_gepa
from prime_lab.inference.builtin.tool_calls import parse_hermes_tool_calls
from prime_lab.runs.registry import Run, RunRegistry
from prime_lab.trainer.config import validate_rl_config
from prime_lab.trainer.orchestrator import Orchestrator
from prime_lab.trainer.runtime import load_config
from tests.envs.scripted import ScriptedEndpoint, scripted_endpoint
from tests.envs.verifiers_standins import env_folders
from tests.inference.test_builtin_tools import QWEN_TOOLS_TEMPLATE

VF_TOOLS = {"tool_a", "tool_b", "tool_c", "tool_d"}


@pytest.fixture
def verifiers_envs(monkeypatch: pytest.MonkeyPatch) -> None:
    for folder in env_folders():
        monkeypatch.syspath_prepend(str(folder))


def tokenizer(folder: Path, template: str | None = None) -> Any:
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(folder)
    if template is not None:
        loaded.chat_template = template
    return loaded


def warnings_about_tools(run: Run) -> list[str]:
    return [e.data["message"] for e in run.event_log().events()
            if e.kind == "log" and e.data.get("level") == "WARNING" and "tool" in e.data.get("message", "")]


def test_smollm2s_template_drops_tools_and_qwens_renders_them(smollm2_dir: Path, tiny_model_dir: Path) -> None:
    assert not template_shows_tools(tokenizer(smollm2_dir))
    assert not template_shows_tools(tokenizer(tiny_model_dir))
    assert template_shows_tools(tokenizer(tiny_model_dir, QWEN_TOOLS_TEMPLATE))


def test_the_block_holds_the_schemas_and_the_builtin_parser_reads_a_call_in_its_format() -> None:
    schema = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                               "parameters": {"type": "object",
                                                              "properties": {"city": {"type": "string"}}}}}
    block = tools_block([schema])
    assert f"<tools>\n{json.dumps(schema)}\n</tools>" in block and block.endswith(CALL_FORMAT)
    # the model answers as the block asks: the format line with a name and arguments filled in
    answer = "Let me look.\n" + CALL_FORMAT.replace("<function-name>", '"get_weather"').replace(
        "<args-json-object>", '{"city": "Oslo"}')
    [call] = parse_hermes_tool_calls(answer).tool_calls
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}


def test_an_environment_whose_system_prompt_names_its_tools_needs_nothing() -> None:
    env = load_environment("math-python")  # prime-lab's ToolEnv writes its tools into its system prompt
    rows = env.get_eval_dataset(1)
    tools = environment_tools(env)
    assert [t["function"]["name"] for t in tools] == ["python", "calculate"]
    assert plan_tools("math-python", tools, rows[0], model="m", shows_tools=False, enabled=False).action == "none"
    said: list[str] = []
    prompts = ToolPrompts("m", lambda: pytest.fail("no tokenizer is needed"), enabled=True,
                          log=lambda message, _: said.append(message))
    assert prompts.rows("math-python", env, rows) == rows and said == []
    replaced = [{**rows[0], "prompt": [{"role": "system", "content": "Answer."}, *rows[0]["prompt"][1:]]}]
    assert plan_tools("math-python", tools, replaced[0], model="m", shows_tools=False,
                      enabled=False).action == "warn"


def test_an_isolated_environment_reports_its_tools_as_verifiers_defines_them(verifiers_envs: None) -> None:
    from prime_lab.envs import driver

    with kept_signal_handlers():
        env = load_environment("vf-tool-test")
    assert isinstance(env, VerifiersEnvironment)
    described = json.loads(json.dumps(driver.tools_of(env.env)))  # as `driver.py describe` sends it
    isolated = SimpleNamespace(description={"tools": described})  # what IsolatedEnvironment keeps of it
    for found in (environment_tools(env), environment_tools(isolated)):
        assert {t["function"]["name"] for t in found} == VF_TOOLS
        assert all(t["type"] == "function" and t["function"]["parameters"]["type"] == "object" for t in found)


def test_the_eval_setting_is_ours_and_never_sent_to_the_endpoint() -> None:
    job = EvalJob("vf-tool-test", sampling={"tools_in_system_prompt": True, "top_k": 5})
    assert job.tools_in_system_prompt and job.sampling_args().extra_body == {"top_k": 5}
    assert not EvalJob("vf-tool-test").tools_in_system_prompt


def evaluate_tool_env(server: Any, model_dir: Path, out: Path, *, enabled: bool) -> tuple[Run, list[Any]]:
    with kept_signal_handlers():
        env = load_environment("vf-tool-test")
    run = RunRegistry().create("eval", config_text="{}", resolved={})
    said: list[str] = []
    spec = EvalSpec(env_id="vf-tool-test", model=server.model_name, base_url=server.base_url, num_examples=2,
                    rollouts_per_example=2, sampling=SamplingArgs(max_tokens=2, rl_fields=True),
                    model_source=str(model_dir), tools_in_system_prompt=enabled)
    result = run_evaluation(spec, out, run=run, env=env, announce=said.append)
    assert len(said) == 1 and str(model_dir) in said[0]
    return run, result.rollouts


def test_an_eval_on_a_template_that_drops_tools_warns_once(verifiers_envs: None, builtin_server: Any,
                                                           tiny_model_dir: Path, tmp_path: Path) -> None:
    run, rollouts = evaluate_tool_env(builtin_server, tiny_model_dir, tmp_path, enabled=False)
    [warning] = warnings_about_tools(run)
    assert "vf-tool-test" in warning and str(tiny_model_dir) in warning
    assert "tools_in_system_prompt = true" in warning and "never shown" in warning
    assert len(rollouts) == 4 and all("<tools>" not in r.prompt[0]["content"] for r in rollouts)


def test_with_the_setting_the_server_gets_the_schemas_in_the_system_prompt(
        verifiers_envs: None, builtin_server: Any, tiny_model_dir: Path, tmp_path: Path) -> None:
    run, rollouts = evaluate_tool_env(builtin_server, tiny_model_dir, tmp_path, enabled=True)
    assert warnings_about_tools(run) == []
    said = [e.data["message"] for e in run.event_log().events() if e.kind == "log" and "tool" in e.data["message"]]
    assert len(said) == 1 and "tools_in_system_prompt = true" in said[0]
    decode = tokenizer(tiny_model_dir).decode
    for rollout in rollouts:
        assert rollout.error is None
        seen = decode(rollout.turns[0].prompt_token_ids)  # what the server rendered and the model read
        system = seen.split("<|im_end|>")[0]
        assert "<tools>" in system and "<tool_call>" in system
        schemas = [json.loads(line) for line in system.split("<tools>\n")[1].split("\n</tools>")[0].splitlines()]
        assert {s["function"]["name"] for s in schemas} == VF_TOOLS
        assert system.startswith("<|im_start|>system\nYou are a helpful assistant. Use the tools")


def rl_run(setting: str) -> Run:
    text = f"""model = "tiny"
max_steps = 2
batch_size = 4
rollouts_per_example = 2

[sampling]
max_tokens = 2
{setting}

[[env]]
id = "vf-tool-test"

[eval]
interval = 1
num_examples = 1
"""
    result = validate_rl_config(text)
    assert result.ok and result.config is not None, [p.format() for p in result.problems]
    return RunRegistry().create("rl", config_text=text, resolved=result.config.model_dump(mode="json"))


def test_an_rl_run_warns_once_and_with_the_setting_samples_rows_that_show_the_tools(
        verifiers_envs: None, builtin_server: Any, tiny_model_dir: Path) -> None:
    run = rl_run("")
    orchestrator = Orchestrator(run, load_config(run), builtin_server.base_url, builtin_server.model_name,
                                model_path=tiny_model_dir)
    asyncio.run(orchestrator.evaluate(0, orchestrator.eval_sets()))  # the run's [eval] asks for the rows again
    [warning] = warnings_about_tools(run)
    assert "environment vf-tool-test has 4 tools" in warning and "[sampling] tools_in_system_prompt = true" in warning
    assert "tiny's chat template" in warning

    run = rl_run("tools_in_system_prompt = true")
    orchestrator = Orchestrator(run, load_config(run), builtin_server.base_url, builtin_server.model_name,
                                model_path=tiny_model_dir)
    assert warnings_about_tools(run) == []
    _, row, _ = orchestrator.sampler.draw()
    assert "<tools>" in row["prompt"][0]["content"] and all(name in row["prompt"][0]["content"] for name in VF_TOOLS)


def test_the_setting_validates_as_a_boolean() -> None:
    base = 'model = "tiny"\nmax_steps = 1\nbatch_size = 2\nrollouts_per_example = 2\n[[env]]\nid = "gsm8k"\n'
    good = validate_rl_config(base + "[sampling]\nmax_tokens = 8\ntools_in_system_prompt = true\n")
    assert good.ok and good.config is not None and good.config.sampling.tools_in_system_prompt is True
    bad = validate_rl_config(base + '[sampling]\nmax_tokens = 8\ntools_in_system_prompt = "yes please"\n')
    [problem] = [p for p in bad.errors if p.key == "sampling.tools_in_system_prompt"]
    assert problem.line == 9


def gepa_on_the_tool_env(model_dir: Path, out: Path, sampling: dict[str, Any],
                         notice: str | None = None) -> tuple[Run, list[str], ScriptedEndpoint]:
    """The seed round of a GEPA search on vf-tool-test with `model_dir` as the task model (its chat template is
    checked); its requests go to a scripted endpoint that records them (answers without tool calls end a rollout).
    `notice`: said first by a sandbox of the run, as the environment's process says it (sandbox/client.say_once)."""
    with kept_signal_handlers():
        env = load_environment("vf-tool-test")
    run = RunRegistry().create("gepa", config_text="{}", resolved={})
    if notice is not None:
        from prime_lab.sandbox.client import say_once

        say_once(notice, str(run.dir))
    settings = GepaSettings(env_id="vf-tool-test", model=str(model_dir), num_train=1, num_val=2, max_metric_calls=10,
                            sampling=sampling)
    said: list[str] = []
    with scripted_endpoint([]) as task:
        run_gepa(settings, Endpoint(task.base_url, "tiny"), Endpoint(task.base_url, "tiny"), out, run=run, env=env,
                 max_iterations=0, announce=said.append)
    assert len(task.requests) == 2  # the seed on the two validation rows
    return run, said, task


def test_a_gepa_search_on_a_template_that_drops_tools_warns_once_and_honours_the_setting(
        verifiers_envs: None, tiny_model_dir: Path, tmp_path: Path) -> None:
    run, said, task = gepa_on_the_tool_env(tiny_model_dir, tmp_path / "off", {"max_tokens": 2})
    [warning] = warnings_about_tools(run)
    assert said == [f"WARNING: {warning}"] and "environment vf-tool-test has 4 tools" in warning
    assert str(tiny_model_dir) in warning and "prime gepa run: -S '{\"tools_in_system_prompt\": true}'" in warning
    assert all("<tools>" not in r["messages"][0]["content"] and r["tools"] for r in task.requests)

    notice = "a command in sandbox sb-1 (probe) could not reach the network: [sandbox] network = true opens it"
    run, said, task = gepa_on_the_tool_env(tiny_model_dir, tmp_path / "on",
                                           {"max_tokens": 2, "tools_in_system_prompt": True}, notice)
    # what the run's sandboxes said reaches the user once, and the run's log
    assert said.count(f"WARNING: {notice}") == 1 and notice in run.log_path("gepa").read_text()
    said.remove(f"WARNING: {notice}")
    assert warnings_about_tools(run) == [] and len(said) == 1 and said[0].startswith("INFO: ")
    for request in task.requests:
        system = request["messages"][0]["content"]
        assert system.startswith("You are a helpful assistant. Use the tools")  # the seed candidate, then the block
        schemas = [json.loads(line) for line in system.split("<tools>\n")[1].split("\n</tools>")[0].splitlines()]
        assert {s["function"]["name"] for s in schemas} == VF_TOOLS
        assert "tools_in_system_prompt" not in json.dumps(request)  # ours: never sent
    bad = validate_gepa_config('[env]\nid = "vf-tool-test"\n[sampling]\ntools_in_system_prompt = "yes"\n')
    [problem] = [p for p in bad.errors if p.key == "sampling.tools_in_system_prompt"]
    assert problem.line == 4
