"""An RL run with a `[judge]` (envs/judges.py, inference/judge.py, trainer/launcher.py `Supervisor.start_judge`):
the launcher starts a local judge server on the tiny model, the orchestrator's environment (written here, taking
judge arguments as agentic_misalignment does) is wired to it unedited and scored by it; a judge killed mid-run fails
the run in one line that names it, with nothing of the run left running."""

from __future__ import annotations

import os
import re
import signal
import textwrap
import time
from pathlib import Path

import pytest

from tests.envs.test_judge_wiring import requests_answered
from tests.support.rl_runs import fixture_envs, logs, metrics, rewards, start, wait_final, wait_step

pytestmark = pytest.mark.slow
__all__ = ["fixture_envs"]  # autouse: the run's processes find the test environments (PYTHONPATH)

# Its reward is the judge's verdict: 1.0 when the judge answered within [judge.sampling] max_tokens (its request sets
# none), else 0.0; a judge that is not reached fails the rollout.
RL_JUDGED = '''
    import os

    from openai import AsyncOpenAI

    from prime_lab.envs import Rubric, SingleTurnEnv


    def load_environment(judge_model: str = "gpt-4.1-mini", judge_base_url: str = "https://api.openai.com/v1",
                         judge_api_key_var: str = "MY_JUDGE_KEY"):
        judge = AsyncOpenAI(base_url=judge_base_url, api_key=os.environ[judge_api_key_var], max_retries=0)

        async def verdict(completion, answer, state) -> float:
            reply = await judge.chat.completions.create(model=judge_model, messages=[
                {"role": "user", "content": f"Is this a good answer? {completion[-1]['content']} Say yes or no."}])
            return 1.0 if 1 <= reply.usage.completion_tokens <= 4 else 0.0

        rows = [{"question": f"Say {w}.", "answer": w} for w in ("one", "two", "three", "four")]
        return SingleTurnEnv(dataset=rows, rubric=Rubric([verdict]))
'''


def test_rl_run_scored_by_its_judge_fails_in_one_line_when_the_judge_dies(
        tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    envs = tmp_path / "envs"
    envs.mkdir()
    (envs / "rl_judged.py").write_text(textwrap.dedent(RL_JUDGED))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(envs), os.environ["PYTHONPATH"]]))
    for variable in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "MY_JUDGE_KEY"):
        monkeypatch.delenv(variable, raising=False)
    config = tmp_path / "rl.toml"
    config.write_text(f"""
model = "{tiny_model_dir}"
max_steps = 200
batch_size = 4
rollouts_per_example = 2

[sampling]
max_tokens = 4

[[env]]
id = "rl-judged"

[inference]
backend = "builtin"

[lora]
r = 4
alpha = 8

[judge]
model = "{tiny_model_dir}"
backend = "builtin"

[judge.sampling]
max_tokens = 4
""")
    run = start(config)
    wait_step(run, 1, timeout=180)
    status = run.read_status()
    assert "judge" in status["processes"], status
    assert run.log_path("judge").is_file()
    orchestrator_log = run.log_path("orchestrator").read_text()
    assert f"environment 'rl-judged': judge {tiny_model_dir} at http://127.0.0.1:" in orchestrator_log
    assert "through judge_base_url, judge_model, judge_api_key_var (arguments)" in orchestrator_log
    # step 1's rewards are the judge's verdicts: every rollout scored by it, each answer within its 4 tokens
    assert rewards(run)[0] == 1.0, metrics(run, "orchestrator")
    root = re.search(r"judge \S+ at (http://127\.0\.0\.1:\d+)/v1", orchestrator_log)
    assert root is not None and requests_answered(root[1]) >= 4  # batch_size rollouts, one judge request each
    # the step's judge/* metrics, from the judge's own /metrics (inference/judge_metrics.py)
    step1 = metrics(run, "orchestrator")[1]
    assert step1["judge/requests"] >= 4 and step1["judge/errors"] == 0, step1
    # each answered request generated at least one token (its at most 4 the reward checked); tokens the next step's
    # judge requests generated while this step was scraped count too (in flight, not yet answered), so no upper bound
    assert step1["judge/generation_tokens"] >= step1["judge/requests"], step1
    assert 0 < step1["judge/latency_p50_s"] <= step1["judge/latency_p95_s"], step1

    # on the System tab as the judge, not as "other" (the supervisor samples its processes every few seconds)
    deadline, roles = time.monotonic() + 30, set()
    while "judge" not in roles and time.monotonic() < deadline:
        roles = {p.get("role") for e in run.event_log().events() if e.kind == "system"
                 for p in e.data.get("processes", [])}
        time.sleep(0.5)
    assert "judge" in roles, roles

    judge_pid = status["processes"]["judge"]["pid"]
    os.kill(judge_pid, signal.SIGKILL)
    t0 = time.monotonic()
    final = wait_final(run, timeout=60)
    assert time.monotonic() - t0 < 30, final
    assert final["state"] == "failed", final
    reason = final["reason"]
    assert "the inference server (the judge) exited with code -9" in reason.splitlines()[0], reason + logs(run)
    assert not run.live_processes(), run.live_processes()  # each pid of the run (with its start time): gone
