"""A run's vLLM sampler and its verifiers v1 tasksets: their RL rollouts sample through /inference/v1/generate, which
vLLM serves from 0.32 (trainer/launcher.py `v1_sampling_problem`, which the launcher raises before any process)."""

from __future__ import annotations

from pathlib import Path

from prime_lab.envs import isolated
from prime_lab.trainer.launcher import v1_sampling_problem


def record(name: str, release: str) -> isolated.IsolatedRecord:
    return isolated.IsolatedRecord(name=name, module=name.replace("-", "_"), distribution=name, version="0.1.0",
                                   release=release, python="/nowhere/bin/python", target="/nowhere", reason="test")


def test_an_older_vllm_is_refused_for_v1_tasksets_only(lab_home: Path) -> None:
    isolated.save_record(record("v1-reverse", "0.4.0"))
    isolated.save_record(record("vf-fruit-task", "0.1.12"))
    problem = v1_sampling_problem(["v1-reverse", "vf-fruit-task"], "vllm", "0.31.2")
    assert problem == ("v1-reverse: verifiers v1 taskset(s), whose RL rollouts sample through /inference/v1/generate, "
                       "which vLLM 0.31.2 does not serve (vLLM 0.32 on does); upgrade vLLM or set [inference] "
                       'backend = "builtin"')
    assert v1_sampling_problem(["v1-reverse"], "vllm", "0.32.0") is None  # it serves the route
    assert v1_sampling_problem(["v1-reverse"], "builtin", "0.31.2") is None  # ours always does
    assert v1_sampling_problem(["vf-fruit-task", "not-installed"], "vllm", "0.31.2") is None  # no v1 taskset
