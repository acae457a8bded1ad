"""The verifiers adapter: environments written against the real verifiers package (the release installed in the
.venv) behind our protocol, with scripted models answering in-process. End to end: tests/e2e/test_verifiers_envs.py.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from prime_lab.envs import EnvironmentLoadError, Rollout, SamplingArgs, load_environment, replace_system_prompt
from prime_lab.envs import verifiers_adapter as adapter
from prime_lab.envs.verifiers_adapter import INPUT_KEY, VerifiersEnvironment, kept_signal_handlers
from tests.envs.verifiers_standins import env_folders, mock_client, tool_calling_model

RL = SamplingArgs(max_tokens=8, rl_fields=True)
INSTALLED = adapter.installed_release()


@pytest.fixture(autouse=True)
def verifiers_envs(monkeypatch: pytest.MonkeyPatch) -> None:
    for folder in env_folders():
        monkeypatch.syspath_prepend(str(folder))


def load(env_id: str, **args: Any) -> VerifiersEnvironment:
    with kept_signal_handlers():  # verifiers would replace pytest's handlers
        env = load_environment(env_id, **args)
    assert isinstance(env, VerifiersEnvironment)
    return env


def answer_model(content: str) -> Any:
    return lambda request: {"role": "assistant", "content": content}


def run(env: VerifiersEnvironment, rows: list[dict[str, Any]], model: Any, sampling: SamplingArgs = RL,
        requests: list[dict[str, Any]] | None = None, per_example: int = 1) -> list[Rollout]:
    async def go() -> list[Rollout]:
        client = mock_client(model, requests)
        try:
            return await env.run_rollouts(client, "stand-in", rows, sampling, rollouts_per_example=per_example)
        finally:
            await client.close()

    return asyncio.run(go())


def test_single_turn_xml_parser_and_weighted_rubric() -> None:
    env = load("vf-reverse-text")
    rows = env.get_eval_dataset()
    assert len(rows) == 6 and len(env.get_dataset()) == 18  # its own train/eval split
    row = rows[0]
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]  # verifiers put its system prompt in the row
    assert env.system_prompt == row["prompt"][0]["content"]
    requests: list[dict[str, Any]] = []
    [rollout] = run(env, [row], answer_model(f"<reversed_text>{row['answer']}</reversed_text>"), requests=requests)
    assert rollout.error is None and rollout.stop_condition != "error"
    assert rollout.metrics["lcs_reward_func"] == 1.0 and rollout.metrics["format_reward_func"] == 1.0
    assert rollout.reward == pytest.approx(1.0 + 0.2 * 1.0)  # weights 1.0 and 0.2
    assert requests[0]["messages"] == row["prompt"]
    assert requests[0]["logprobs"] is True and requests[0]["return_token_ids"] is True
    [turn] = rollout.turns
    text = rollout.completion[-1]["content"]
    assert turn.completion_token_ids == [ord(c) % 256 for c in text] and turn.completion_logprobs == [-0.5] * len(text)
    assert turn.prompt_token_ids and turn.finish_reason == "stop" and turn.prompt_messages == 2
    assert rollout.token_usage["completion_tokens"] == len(text)
    # the samples browser shows what the environment's own parser reads
    assert env.parser.parse_answer(rollout.completion) == row["answer"]
    assert [f.__name__ for f in env.rubric.funcs][:2] == ["lcs_reward_func", "format_reward_func"]


def test_question_rows_get_the_system_prompt_and_few_shot() -> None:
    import verifiers as vf
    from datasets import Dataset

    few_shot = [{"role": "user", "content": "1+1"}, {"role": "assistant", "content": "2"}]
    with kept_signal_handlers():
        vf_env = vf.SingleTurnEnv(dataset=Dataset.from_list([{"question": "2+2", "answer": "4", "info": '{"k": 1}'}]),
                                  system_prompt="Add.", few_shot=few_shot)
    env = adapter.wrap(vf_env, env_id="sums")
    [row] = env.get_dataset()
    assert row["prompt"] == [{"role": "system", "content": "Add."}, *few_shot, {"role": "user", "content": "2+2"}]
    assert row["info"] == {"k": 1} and row["answer"] == "4" and row["task"] == "sums"
    assert env.few_shot == few_shot and env.system_prompt == "Add."
    assert adapter.to_input(row)["info"] == '{"k": 1}'  # verifiers gets its own row back, and parses it itself


def test_without_rl_fields_no_token_ids_are_asked_for() -> None:
    env = load("vf-reverse-text")
    requests: list[dict[str, Any]] = []
    [rollout] = run(env, env.get_eval_dataset(1), answer_model("x"), SamplingArgs(max_tokens=8), requests)
    assert "logprobs" not in requests[0] and "return_token_ids" not in requests[0]
    assert rollout.turns[0].completion_token_ids is None and rollout.turns[0].completion_logprobs is None


def test_multi_turn_env_response_stop_condition_and_dataset_folder() -> None:
    env = load("vf-alphabet-sort", similarity_power=1)
    assert len(env.get_dataset()) == 16 and len(env.get_eval_dataset()) == 6  # the folder's train and test files
    row = next(r for r in env.get_eval_dataset() if r["info"]["num_turns"] == 3)
    assert row[INPUT_KEY]["example_id"] == row["example_id"] and "prompt" not in row[INPUT_KEY]
    [rollout] = run(env, [row], answer_model("<alphabetical_sorted>\nAda Lovelace\n</alphabetical_sorted>"))
    assert rollout.error is None
    assert [m["role"] for m in rollout.completion] == ["assistant", "user", "assistant", "user", "assistant"]
    assert rollout.stop_condition == "all_turns_answered"  # the environment's own @vf.stop
    assert len(rollout.turns) == 3 and [t.prompt_messages for t in rollout.turns] == [1, 3, 5]
    assert all(t.completion_token_ids for t in rollout.turns)
    assert 0 < rollout.metrics["sorted_names_reward"] < 1 and rollout.metrics["num_turns"] == 3


def test_game_state_feedback_and_reward_weights() -> None:
    env = load("vf-mastermind", max_turns=3)
    row = env.get_eval_dataset(1)[0]
    secret = row["answer"]
    wrong = "".join(str((int(d) + 1) % 6) for d in secret)
    guesses = iter([wrong, secret])
    [rollout] = run(env, [row], lambda request: {"role": "assistant", "content": f"<guess>{next(guesses)}</guess>"})
    assert rollout.error is None and rollout.stop_condition == "has_final_env_response"
    feedback = rollout.completion[1]
    assert feedback["role"] == "user" and feedback["content"].startswith(f"{wrong}: B=0 W=")  # env_response
    assert feedback["content"].endswith("2 guesses left.")
    assert rollout.completion[-1]["content"] == "Correct! You found the code."
    assert rollout.metrics["solved_reward"] == 1.0 and rollout.metrics["partial_credit"] == 1.0
    assert rollout.reward == pytest.approx(1.0 + 0.5 * 1.0 + 0.1 * rollout.metrics["format_reward_func"])


def test_tool_env_sends_tools_natively_and_runs_the_calls() -> None:
    env = load("vf-tool-test")
    rows = env.get_eval_dataset(3)
    requests: list[dict[str, Any]] = []
    rollouts = run(env, rows, tool_calling_model, requests=requests)
    assert {t["function"]["name"] for t in requests[0]["tools"]} == {"tool_a", "tool_b", "tool_c", "tool_d"}
    for row, rollout in zip(rows, rollouts, strict=True):
        assert rollout.error is None
        assert [m["role"] for m in rollout.completion] == ["assistant", "tool", "assistant"]
        [call] = rollout.completion[0]["tool_calls"]  # in OpenAI's shape, as our own ToolEnv writes it
        assert call["type"] == "function" and call["function"]["name"] == row["info"]["tool_names"][0]
        assert rollout.completion[1]["tool_call_id"] == call["id"]
        assert rollout.reward == pytest.approx(1 / len(row["info"]["tool_names"]))
        assert rollout.metrics["total_tool_calls"] == 1.0 and len(rollout.turns) == 2


def test_a_group_is_one_verifiers_group_in_order() -> None:
    env = load("vf-reverse-text")
    rows = env.get_eval_dataset(3)
    rollouts = run(env, rows, answer_model("abc"), per_example=2)
    assert [r.example_id for r in rollouts] == [r["example_id"] for r in rows for _ in range(2)]
    assert all(r.task == "vf-reverse-text" for r in rollouts)


def test_gepa_candidates_reach_the_model_as_the_system_prompt() -> None:
    env = load("vf-mastermind")
    row = replace_system_prompt(env.get_dataset(1)[0], "Guess 0000 first.")
    requests: list[dict[str, Any]] = []
    run(env, [row], answer_model("<guess>0000</guess>"), requests=requests)
    assert requests[0]["messages"][0] == {"role": "system", "content": "Guess 0000 first."}


def test_with_system_prompt_rebuilds_when_load_environment_takes_it_else_rewrites_rows() -> None:
    env = load("vf-reverse-text")
    first = env.env
    env.with_system_prompt("Write it backwards.")
    assert env.env is not first and env.env.system_prompt == "Write it backwards."  # built again
    assert env.system_prompt == "Write it backwards."
    assert all(r["prompt"][0]["content"] == "Write it backwards." for r in env.get_dataset())

    env = load("vf-mastermind")  # its load_environment takes no system_prompt
    first = env.env
    env.with_system_prompt("Be quick.")
    assert env.env is first
    assert all(r["prompt"][0] == {"role": "system", "content": "Be quick."} for r in env.get_eval_dataset())


def test_an_environment_for_another_release_fails_naming_both_releases() -> None:
    env = load("vf-old-api")
    assert len(env.get_eval_dataset()) == 4  # no eval split: the training set, as verifiers does
    rollouts = run(env, env.get_eval_dataset(2), answer_model("2"))
    for rollout in rollouts:
        assert rollout.stop_condition == "error" and rollout.error is not None
        assert f"verifiers {INSTALLED} is installed" in rollout.error
        assert "declares verifiers>=0.1.3,<0.1.6" in rollout.error
        assert "Traceback" not in rollout.error and "is_completed" in rollout.error


def test_an_unsupported_installed_release_is_refused_at_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(adapter, "installed_release", lambda: "0.1.5")
    with pytest.raises(EnvironmentLoadError) as caught:
        load("vf-reverse-text")
    message = str(caught.value)
    assert "verifiers 0.1.5 is installed (prime-lab supports verifiers>=0.1.12,<0.4)" in message
    assert "declares verifiers>=0.1.12" in message and "prime-lab[verifiers]" in message


def test_a_hub_dataset_out_of_reach_fails_at_load_naming_the_argument() -> None:
    with pytest.raises(EnvironmentLoadError) as caught:
        load("vf-alphabet-sort", dataset_name="someone/not-here")
    message = str(caught.value)
    assert "dataset 'someone/not-here' is not on this machine" in message and "dataset_name=" in message


@pytest.mark.parametrize(("version", "ok"), [("0.1.11", False), ("0.1.12", True), ("0.1.14", True),
                                             ("0.3.1", True), ("0.3.1.post2", True), ("0.4.0", False),
                                             ("0.1.12.dev3", True), ("0.10.0", False)])
def test_supported_releases(version: str, ok: bool) -> None:
    assert adapter.is_supported(version) is ok


def test_trajectory_conversion_across_releases() -> None:
    """RolloutOutputs as 0.1.12 (timing in ms) and 0.3.x (timing spans in seconds) write them."""
    row = {"example_id": "env/3", "task": "env", "prompt": [{"role": "user", "content": "q"}], "answer": "a",
           "info": {"k": 1}}
    step = {"prompt": [{"role": "user", "content": "q"}], "completion": [{"role": "assistant", "content": "r"}],
            "response": {"message": {"finish_reason": "length"}},
            "tokens": {"prompt_ids": [1, 2], "completion_ids": [3], "completion_logprobs": [-0.25]}}
    common = {"prompt": row["prompt"], "completion": step["completion"], "reward": 0.5, "is_truncated": True,
              "stop_condition": "max_turns_reached", "metrics": {"f": 0.5, "num_turns": 1}, "trajectory": [step],
              "token_usage": {"input_tokens": 2.0, "output_tokens": 1.0}}
    old = adapter.to_rollout({**common, "timing": {"generation_ms": 40.0, "scoring_ms": 2.0, "total_ms": 42.0}},
                             row, 50.0)
    new = adapter.to_rollout({**common, "timing": {"generation": {"start": 1.0, "end": 1.04, "duration": 0.04},
                                                   "model": {"spans": [{"duration": 0.03}], "duration": 0.03}}},
                             row, 50.0)
    for rollout in (old, new):
        assert rollout.example_id == "env/3" and rollout.task == "env" and rollout.info == {"k": 1}
        assert rollout.reward == 0.5 and rollout.metrics == {"f": 0.5, "num_turns": 1.0}
        assert rollout.is_truncated and rollout.stop_condition == "max_turns_reached" and rollout.error is None
        [turn] = rollout.turns
        assert (turn.prompt_token_ids, turn.completion_token_ids, turn.completion_logprobs) == ([1, 2], [3], [-0.25])
        assert turn.finish_reason == "length"
        assert rollout.token_usage == {"prompt_tokens": 2, "completion_tokens": 1}
        assert "trajectory" not in rollout.state and rollout.state["stop_condition"] == "max_turns_reached"
    assert old.timing["total_ms"] == 42.0 and old.turns[0].generation_ms == 40.0
    assert new.timing["total_ms"] == 50.0 and new.turns[0].generation_ms == pytest.approx(30.0)
    failed = adapter.to_rollout({**common, "timing": {}, "error": {"error": "ModelError"},
                                 "error_chain": "ModelError('endpoint down')"}, row, 5.0)
    assert failed.stop_condition == "error" and failed.error == "ModelError('endpoint down')"
    assert failed.error_source == "model"  # the model's side: `prime eval run` asks about the endpoint
    tool = adapter.to_rollout({**common, "timing": {}, "error": {"error": "ToolCallError", "message": "no such tool",
                                                                  "error_chain_str": "ToolCallError"}}, row, 5.0)
    assert tool.error_source == "environment" and old.error_source is None


def test_request_args_merge_the_environments_defaults_with_ours() -> None:
    env_defaults = {"n": 1, "temperature": 0.3, "extra_body": {"top_k": 5}}
    args = adapter.request_args(env_defaults, SamplingArgs(max_tokens=7, temperature=0.9, rl_fields=True))
    assert args == {"n": 1, "temperature": 0.9, "top_p": 1.0, "max_tokens": 7, "logprobs": True,
                    "extra_body": {"top_k": 5, "return_token_ids": True}}


@pytest.mark.parametrize("loads", [
    pytest.param(load, id="inside-kept_signal_handlers"),
    pytest.param(load_environment, id="loader"),
])
def test_loading_keeps_the_callers_signal_handlers_and_works_off_the_main_thread(loads: Any) -> None:
    """verifiers environments install SIGINT/SIGTERM handlers when built (and fail off the main thread). A run's
    SIGTERM handler (graceful stop) must survive loading one, and the samples browser, which loads environments in
    a worker thread for their parser, must be able to load one."""
    def mine(signum: int, frame: Any) -> None:
        pass

    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGTERM, mine)
    try:
        loads("vf-reverse-text")
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    failures: list[BaseException] = []

    def build() -> None:
        try:
            loads("vf-mastermind")
        except BaseException as exc:  # reported to the main thread
            failures.append(exc)

    worker = threading.Thread(target=build)
    worker.start()
    worker.join(60)
    assert failures == []


def test_importing_the_protocol_and_adapter_does_not_import_verifiers() -> None:
    code = ("import sys, prime_lab.envs, prime_lab.envs.verifiers_adapter\n"
            "print(sorted(m for m in ('verifiers', 'datasets', 'openai') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "verifiers" not in out.stdout and "datasets" not in out.stdout


@pytest.fixture
def not_an_environment(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    (tmp_path / "returns_a_dict.py").write_text("def load_environment():\n    return {'dataset': []}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "returns-a-dict"


def test_anything_else_is_still_refused(not_an_environment: str) -> None:
    with pytest.raises(EnvironmentLoadError, match="returned dict, not an Environment"):
        load_environment(not_an_environment)
