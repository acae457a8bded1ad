"""The GEPA environment adapter puts each candidate system prompt in front of the environment's rows (through real
HTTP: the scripted endpoint records what the task model was sent)."""

from __future__ import annotations

from prime_lab.envs import Rubric, SamplingArgs, SingleTurnEnv
from prime_lab.gepa.env_adapter import SYSTEM_PROMPT, Endpoint, EnvironmentAdapter
from tests.envs.scripted import scripted_endpoint


def test_the_candidate_is_the_one_system_message_of_prompt_rows_and_question_rows() -> None:
    user = {"role": "user", "content": "reverse abc"}
    rows = [{"prompt": [user], "answer": "cba"}, {"question": "reverse xy", "answer": "yx"}]
    env = SingleTurnEnv(dataset=rows, system_prompt="Seed prompt.",
                        rubric=Rubric([lambda completion, answer: float(completion[-1]["content"] == answer)]))
    batch = env.get_dataset()
    assert [r["prompt"][0]["content"] for r in batch] == ["Seed prompt.", "Seed prompt."]
    with scripted_endpoint(["cba", "cba"]) as ep:
        endpoint = Endpoint(ep.base_url, "m", timeout=30)
        adapter = EnvironmentAdapter(env, endpoint, endpoint, SamplingArgs(max_tokens=8), max_concurrent=1)
        try:
            result = adapter.evaluate(batch, {SYSTEM_PROMPT: "Candidate prompt."}, capture_traces=True)
        finally:
            adapter.close()
    sent = sorted((r["messages"] for r in ep.requests), key=lambda m: m[-1]["content"])
    assert sent == [[{"role": "system", "content": "Candidate prompt."}, user],
                    [{"role": "system", "content": "Candidate prompt."}, {"role": "user", "content": "reverse xy"}]]
    assert sorted(result.scores) == [0.0, 1.0]
    assert result.trajectories is not None and "Candidate prompt." not in str(result.trajectories)
