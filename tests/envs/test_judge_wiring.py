"""A run's LLM judge (envs/judges.py, inference/judge.py): environments in the three shapes published ones take
(judge arguments, a client built from OPENAI_BASE_URL, a simulated user through that client) are wired to a local
judge server on the tiny model without being edited, and scored through it; `prime eval run --judge MODEL` starts
the judge with the evaluation and says what it wired where."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import textwrap
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI

from prime_lab.envs import EnvironmentLoadError, SamplingArgs, load_environment
from prime_lab.envs.judges import (
    KEY_VARIABLE,
    LOCAL_KEY,
    JudgeConfig,
    JudgeEndpoint,
    JudgeSamplingConfig,
    endpoint_from_environ,
    how_wired,
    wire,
)
from prime_lab.inference.builtin.launcher import BuiltinServer
from prime_lab.inference.judge import JudgePlan
from tests.plugins.servers import TINY_SERVED_NAME
from tests.support import cli

JUDGE = JudgeEndpoint("http://127.0.0.1:5/v1", "judge-model", LOCAL_KEY)

# Judged through a client its arguments point (agentic_misalignment's shape); its reward is the judge's verdict.
BY_ARGUMENTS = '''
    import os

    from openai import AsyncOpenAI

    from prime_lab.envs import Rubric, SingleTurnEnv


    def load_environment(judge_model: str = "gpt-4.1-mini", judge_base_url: str = "https://api.openai.com/v1",
                         judge_api_key_var: str = "MY_JUDGE_KEY"):
        judge = AsyncOpenAI(base_url=judge_base_url, api_key=os.environ[judge_api_key_var])

        async def judged(completion, answer, state) -> float:
            reply = await judge.chat.completions.create(model=judge_model, messages=[
                {"role": "user", "content": f"Is this a good answer? {completion[-1]['content']} Say yes or no."}])
            state["judge_tokens"] = reply.usage.completion_tokens
            return 1.0 if reply.choices[0].message.content is not None else 0.0

        rows = [{"question": f"Say {w}.", "answer": w} for w in ("one", "two")]
        return SingleTurnEnv(dataset=rows, rubric=Rubric([judged]))
'''

# Judged by a client built from OPENAI_BASE_URL / OPENAI_API_KEY at load (verifiers' JudgeRubric default, as
# llm_writer_negative_style); only the judge's model is an argument.
BY_VARIABLES = '''
    from openai import AsyncOpenAI

    from prime_lab.envs import Rubric, SingleTurnEnv


    def load_environment(judge_model: str = "gpt-5"):
        judge = AsyncOpenAI()

        async def judged(completion, answer, state) -> float:
            reply = await judge.chat.completions.create(model=judge_model, messages=[
                {"role": "user", "content": f"Rate: {completion[-1]['content']}"}])
            state["judge_tokens"] = reply.usage.completion_tokens
            return 1.0 if reply.choices[0].message.content is not None else 0.0

        return SingleTurnEnv(dataset=[{"question": "Say hi.", "answer": "hi"}], rubric=Rubric([judged]))
'''

# A simulated user: the other side of the conversation is a model behind the same client.
SIMULATED_USER = '''
    from openai import AsyncOpenAI

    from prime_lab.envs import MultiTurnEnv, Rubric


    class Conversation(MultiTurnEnv):
        def __init__(self, user, user_model, **kw):
            super().__init__(max_turns=2, **kw)
            self.user, self.user_model = user, user_model

        async def env_response(self, messages, state):
            reply = await self.user.chat.completions.create(model=self.user_model, messages=[
                {"role": "user", "content": "Answer as the user: " + messages[-1]["content"]}], max_tokens=4)
            state["user_turns"] = state.get("user_turns", 0) + 1
            return [{"role": "user", "content": reply.choices[0].message.content or "ok"}], state


    def load_environment(user_model: str = "gpt-4.1-mini", judge_model: str = "gpt-4.1-mini"):
        def talked(state) -> float:
            return float(state.get("user_turns", 0))

        return Conversation(AsyncOpenAI(), judge_model, dataset=[{"question": "Hello.", "answer": ""}],
                            rubric=Rubric([talked]))
'''


def test_wiring_fills_what_the_user_left_and_sends_the_rest_to_the_environment() -> None:
    signature = {"judge_base_url": "https://api.pinference.ai/api/v1", "judge_model": "gpt-4.1-mini",
                 "judge_api_key_var": "PRIME_API_KEY", "split": "test"}
    wired = wire(signature, {"split": "train"}, JUDGE)
    assert wired.args == {"split": "train", "judge_base_url": JUDGE.base_url, "judge_model": "judge-model",
                          "judge_api_key_var": KEY_VARIABLE}
    assert wired.environ == {KEY_VARIABLE: LOCAL_KEY} and "OPENAI_BASE_URL" not in wired.environ
    assert wired.filled == ("judge_base_url", "judge_model", "judge_api_key_var")
    # the user's explicit arguments win, each on its own
    mine = wire(signature, {"judge_model": "my-judge", "judge_base_url": "http://mine/v1"}, JUDGE)
    assert mine.args["judge_model"] == "my-judge" and mine.args["judge_base_url"] == "http://mine/v1"
    assert mine.filled == ("judge_api_key_var",)
    # the key itself as an argument gets the judge's key; a model-only signature gets OPENAI_* in its environment
    assert wire({"judge_url": None, "judge_api_key": None}, {}, JUDGE).args == {"judge_url": JUDGE.base_url,
                                                                               "judge_api_key": LOCAL_KEY}
    model_only = wire({"judge_model": "gpt-5"}, {}, JUDGE)
    assert model_only.args == {"judge_model": "judge-model"}
    assert model_only.environ == {"OPENAI_BASE_URL": JUDGE.base_url, "OPENAI_API_KEY": LOCAL_KEY}
    assert "judge_model (arguments) and OPENAI_API_KEY, OPENAI_BASE_URL (its environment)" in \
        model_only.describe("e", JUDGE)
    # an environment without judge arguments: only its environment
    assert wire([], {"x": 1}, JUDGE).args == {"x": 1}
    assert endpoint_from_environ(JUDGE.environ()) == JUDGE and endpoint_from_environ({}) is None
    # how `prime env list` says each is wired
    assert how_wired(signature) == "judge_base_url, judge_model, judge_api_key_var"
    assert how_wired({"judge_model": "gpt-5"}) == "judge_model + OPENAI_BASE_URL" and how_wired({"x": 1}) == ""


@pytest.fixture(scope="module")
def judge(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[JudgePlan]:
    """A local judge on the tiny model, started as a run starts one, answering at most 6 tokens by default."""
    plan = JudgePlan(JudgeConfig(model=str(tiny_model_dir), backend="builtin",
                                 sampling=JudgeSamplingConfig(max_tokens=6, temperature=0.0)))
    plan.start(tmp_path_factory.mktemp("judge") / "judge.log", timeout=120)
    yield plan
    plan.stop()


# Refuses to load without a judge key (agentic_misalignment's shape).
NEEDS_JUDGE = '''
    from prime_lab.envs import Rubric, SingleTurnEnv


    def load_environment(judge_model: str = "gemma", judge_base_url: str = "https://api.pinference.ai/api/v1",
                         judge_api_key: str | None = None):
        if not judge_base_url or not judge_api_key:
            raise ValueError("needs_judge requires an LLM judge. Provide judge_base_url and judge_api_key")
        return SingleTurnEnv(dataset=[{"question": "q", "answer": judge_api_key}], rubric=Rubric([]))
'''


@pytest.fixture
def judged_envs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    sources = {"judged_by_arguments": BY_ARGUMENTS, "judged_by_variables": BY_VARIABLES,
               "simulated_user": SIMULATED_USER, "needs_judge": NEEDS_JUDGE}
    for name, source in sources.items():
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    for variable in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "MY_JUDGE_KEY", KEY_VARIABLE):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in sources:  # before and after: tests/envs/test_judges.py imports other modules of these names
        sys.modules.pop(name, None)
    yield tmp_path
    for name in sources:
        sys.modules.pop(name, None)


def requests_answered(root_url: str) -> int:
    text = urllib.request.urlopen(f"{root_url}/metrics", timeout=10).read().decode()
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
               if line.startswith("prime_lab_requests_total{"))


def one_rollout(env: Any, server: BuiltinServer) -> Any:
    async def go() -> Any:
        client = AsyncOpenAI(base_url=server.base_url, api_key="EMPTY")
        rows = env.get_dataset(1)
        [rollout] = await env.run_rollouts(client, TINY_SERVED_NAME, rows, SamplingArgs(max_tokens=4))
        return rollout
    return asyncio.run(go())


def test_each_shape_is_wired_in_process_and_scored_by_the_local_judge(
        judge: JudgePlan, judged_envs: Path, builtin_server: BuiltinServer) -> None:
    assert judge.server is not None
    root = judge.server.root_url
    with judge.applied():
        by_arguments = load_environment("judged-by-arguments")
        by_variables = load_environment("judged-by-variables")
        simulated = load_environment("simulated-user")
        mine = load_environment("judged-by-arguments", judge_model="not-served")  # the user's argument wins
    # the judge's variables were this process's only while loading; the sampler's client never sees them
    assert "OPENAI_BASE_URL" not in os.environ and "OPENAI_API_KEY" not in os.environ
    assert by_arguments.judge_wiring is not None and "judge_base_url, judge_model, judge_api_key_var (arguments)" \
        in by_arguments.judge_wiring
    assert by_variables.judge_wiring is not None and "OPENAI_BASE_URL" in by_variables.judge_wiring
    before = requests_answered(root)
    for env in (by_arguments, by_variables):
        rollout = one_rollout(env, builtin_server)
        assert rollout.error is None and rollout.reward == 1.0, rollout.error
        assert 1 <= rollout.state["judge_tokens"] <= 6  # the judge's default max_tokens ([judge.sampling])
    talk = one_rollout(simulated, builtin_server)
    assert talk.error is None and talk.reward == 1.0, talk.error  # one user turn, from the judge
    assert requests_answered(root) - before == 3
    wrong = one_rollout(mine, builtin_server)
    assert wrong.reward == 0.0 and wrong.error is not None and "not-served" in wrong.error


def test_prime_eval_run_with_judge_starts_it_wires_the_environment_and_logs_it(
        judged_envs: Path, builtin_server: BuiltinServer, tiny_model_dir: Path, lab_home: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(judged_envs), os.environ.get("PYTHONPATH", "")])}
    proc = cli.prime("eval", "run", "judged-by-arguments", "-b", builtin_server.base_url, "-m", TINY_SERVED_NAME,
                     "-n", "2", "-r", "1", "-t", "4", "--judge", str(tiny_model_dir), "-o", str(lab_home / "out"),
                     env=env, timeout=180)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout + proc.stderr
    assert f"judge {tiny_model_dir} at http://127.0.0.1:" in out
    assert "environment 'judged-by-arguments': judge" in out and "(arguments)" in out
    # what the judge did, said as it stops: one request per rollout
    assert "judge: 2 requests, " in out and ", 0 errors, 0 timed out; latency p50 " in out, out
    [run_dir] = [p for p in (lab_home / "runs").iterdir() if p.name.startswith("eval-")]
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "completed" and "judge" in status["processes"]
    assert (run_dir / "logs" / "judge.log").stat().st_size > 0
    results = [json.loads(line) for line in (lab_home / "out" / "results.jsonl").read_text().splitlines()]
    assert len(results) == 2 and all(r["reward"] == 1.0 for r in results), results


def test_env_list_and_doctor_say_which_environments_take_a_judge_and_how_it_is_wired(
        judged_envs: Path, tmp_path: Path) -> None:
    from prime_lab.workbench.cli.lab import validate_config
    from prime_lab.workspace.doctor import check_workspace
    from prime_lab.workspace.layout import setup_workspace

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(judged_envs), os.environ.get("PYTHONPATH", "")])}
    proc = cli.prime("env", "list", "--output", "json", env=env)
    assert proc.returncode == 0, proc.stderr
    listed = {row["id"]: row for row in json.loads(proc.stdout)}
    assert listed["primeintellect/reverse-text"]["judge"] is None  # takes no judge
    # no column where nothing installed takes a judge (test_classic_releases.py shows it where one does)
    assert "JUDGE WIRED BY" not in cli.prime("env", "list", env={**env, "COLUMNS": "240"}).stdout
    workspace = tmp_path / "ws"
    setup_workspace(workspace)
    configs = workspace / "configs" / "eval"
    (configs / "hosted.toml").write_text('model = "smollm2-135m"\n\n[env]\nid = "judged-by-arguments"\n')
    (configs / "local.toml").write_text('model = "smollm2-135m"\n\n[env]\nid = "judged-by-variables"\n\n'
                                        '[judge]\nmodel = "smollm2-135m"\n')
    (configs / "mine.toml").write_text('model = "smollm2-135m"\n\n[env]\nid = "judged-by-arguments"\n'
                                       'args = {judge_base_url = "http://10.0.0.2:8000/v1"}\n')
    found = {f.file: f for f in check_workspace(workspace, validate_config) if f.check == "environment judge"}
    hosted = found["configs/eval/hosted.toml"]
    assert hosted.status == "warn" and hosted.line == 4 and hosted.message == (
        "environment 'judged-by-arguments' takes an LLM judge (judge_base_url, judge_model, judge_api_key_var): "
        "without a [judge] table it calls https://api.openai.com/v1 with the key in MY_JUDGE_KEY; add [judge] "
        'model = "MODEL" to judge with a local model')
    local = found["configs/eval/local.toml"]
    assert local.status == "ok" and local.message == ("environment 'judged-by-variables' takes an LLM judge "
                                                      "(judge_model + OPENAI_BASE_URL): wired to [judge] smollm2-135m")
    assert found["configs/eval/mine.toml"].message.endswith("its args point it at http://10.0.0.2:8000/v1")


def test_prime_gepa_run_with_judge_scores_every_candidate_through_it(
        judged_envs: Path, builtin_server: BuiltinServer, tiny_model_dir: Path, lab_home: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(judged_envs), os.environ.get("PYTHONPATH", "")])}
    proc = cli.prime("gepa", "run", "judged-by-arguments", "-b", builtin_server.base_url, "-m", TINY_SERVED_NAME,
                     "-B", "4", "-n", "1", "-N", "1", "--minibatch-size", "1", "--perfect-score", "1", "-t", "4",
                     "--judge", str(tiny_model_dir), env=env, timeout=180)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout + proc.stderr
    assert "(seed 1.0000)" in proc.stdout  # the seed prompt's rollouts were each scored 1 by the judge
    assert "environment 'judged-by-arguments': judge" in out and "judge: " in out and ", 0 errors" in out, out
    [run_dir] = [p for p in (lab_home / "runs").iterdir() if p.name.startswith("gepa-")]
    assert json.loads((run_dir / "resolved.json").read_text())["judge"] == {"model": str(tiny_model_dir)}
    assert (run_dir / "logs" / "judge.log").is_file()


def test_a_judge_model_that_cannot_be_had_stops_every_command_before_a_run_in_one_line(
        lab_home: Path, tmp_path: Path) -> None:
    """The judge's model is obtained as the run's own is (built, found, or downloaded) before a run is registered;
    with the Hub unreachable that is one line naming `[judge] model`."""
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "0"}
    config = tmp_path / "rl.toml"
    config.write_text('model = "smollm2-135m"\nmax_steps = 1\nbatch_size = 2\nrollouts_per_example = 2\n\n'
                      '[sampling]\nmax_tokens = 4\n\n[[env]]\nid = "reverse-text"\n\n[judge]\nmodel = "nobody/judge"\n')
    for args in (("eval", "run", "reverse-text", "-b", "http://127.0.0.1:9/v1", "-m", "m", "--judge", "nobody/judge"),
                 ("gepa", "run", "reverse-text", "-b", "http://127.0.0.1:9/v1", "-m", "m", "--judge", "nobody/judge"),
                 ("rl", "run", f"@{config}")):
        proc = cli.prime(*args, env=env)
        assert proc.returncode == 1, (args, proc.stderr)
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("Error: [judge] model: ") and "'nobody/judge'" in lines[0], \
            (args, proc.stderr)
    assert not (lab_home / "runs").exists() or not list((lab_home / "runs").iterdir())


def test_an_environment_that_refuses_to_load_without_its_judge_says_how_to_judge_locally(
        judged_envs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(EnvironmentLoadError) as refused:
        load_environment("needs-judge")
    assert str(refused.value).endswith("requires an LLM judge. Provide judge_base_url and judge_api_key; to judge with "
                                       "a local model: add --judge MODEL (in a config file, a [judge] table with "
                                       "model = MODEL)")
    for key, value in JUDGE.environ().items():
        monkeypatch.setenv(key, value)
    assert load_environment("needs-judge").get_dataset(1)[0]["answer"] == LOCAL_KEY  # wired: it loads
