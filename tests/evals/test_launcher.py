"""evals/launcher.py: a job from flags or a config file, the run it registers, and the evaluation's states."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from prime_lab.envs import Rollout, load_environment
from prime_lab.evals.evaluation import EvalResult
from prime_lab.evals.launcher import (
    EvalConfigError,
    EvalJob,
    EvalLaunchError,
    OnProgress,
    create_run,
    evaluate,
    every_rollout_failed,
    read_config,
    system_prompt,
    trained_policy,
)
from prime_lab.evals.readiness import RewardStats, assess
from prime_lab.runs.processes import free_port
from tests.envs.scripted import scripted_endpoint


def test_sampling_args_keep_the_known_keys_send_the_rest_and_take_the_flags_over_them() -> None:
    job = EvalJob("reverse-text", sampling={"max_tokens": 64, "top_p": 0.9, "min_p": 0.1}, max_tokens=16)
    args = job.sampling_args()
    assert (args.max_tokens, args.top_p, args.extra_body) == (16, 0.9, {"min_p": 0.1})
    job.temperature = 0.0
    assert job.sampling_args().temperature == 0.0


def test_a_config_files_prompt_is_read_beside_it_and_a_run_id_is_kept(tmp_path: Path) -> None:
    config = tmp_path / "configs" / "eval.toml"
    config.parent.mkdir()
    (config.parent / "prompt.txt").write_text("Reverse it.")
    config.write_text('num_examples = 2\nsystem_prompt_file = "prompt.txt"\n\n[env]\nid = "reverse-text"\n')
    job = read_config(config)
    assert (job.env_id, job.num_examples, job.rollouts_per_example) == ("reverse-text", 2, 3)
    assert job.system_prompt_file == str(config.parent / "prompt.txt")
    prompt = system_prompt(job)
    assert prompt is not None and prompt.text == "Reverse it."
    config.write_text('system_prompt_file = "abc123"\n\n[env]\nid = "reverse-text"\n')
    assert read_config(config).system_prompt_file == "abc123"


def test_an_invalid_config_carries_its_problems(tmp_path: Path) -> None:
    config = tmp_path / "eval.toml"
    config.write_text('num_examples = "2"\n\n[env]\nid = "reverse-text"\n')
    with pytest.raises(EvalConfigError, match=f"invalid eval config {config}") as caught:
        read_config(config)
    assert [(p.line, p.key) for p in caught.value.problems] == [(1, "num_examples")]


def test_an_adapter_is_refused_with_an_endpoint() -> None:
    assert trained_policy(EvalJob("reverse-text")) is None
    with pytest.raises(EvalLaunchError, match="leave out -b"):
        trained_policy(EvalJob("reverse-text", adapter="run-1", base_url="http://127.0.0.1:9/v1"))


def test_the_run_records_the_settings_as_given_and_where_results_go() -> None:
    job = EvalJob("reverse-text", env_args={"max_words": 2}, max_concurrent=4)
    run, out = create_run(job)
    assert out == Path("outputs") / "evals" / "reverse-text--smollm2-135m" / run.id
    assert json.loads(run.resolved_path.read_text()) == {
        "env": "reverse-text", "model": None, "num_examples": 5, "rollouts": 3, "env_args": {"max_words": 2},
        "sampling": {}, "base_url": None, "adapter": None, "system_prompt_file": None}
    status = run.status()
    assert (status["kind"], status["model"], status["output_dir"]) == ("eval", "smollm2-135m", str(out.resolve()))


def test_an_evaluation_reports_each_rollout_once_running_and_completes(tmp_path: Path) -> None:
    environment = load_environment("reverse-text")
    seen: list[tuple[int, int]] = []
    entered_in: list[str] = []
    announced: list[str] = []

    @contextmanager
    def progress() -> Iterator[OnProgress]:
        entered_in.append(run.state)

        def on_progress(done: int, total: int, rollout: Any) -> None:
            seen.append((done, total))

        yield on_progress

    with scripted_endpoint(["dlrow", "olleh"]) as ep:
        job = EvalJob("reverse-text", model="scripted", num_examples=2, rollouts_per_example=1, base_url=ep.base_url,
                      max_concurrent=1)
        run, out = create_run(job, output_dir=tmp_path / "out")
        result = evaluate(run, out, job, environment, progress=progress(), announce=announced.append)
    assert announced == [f"Evaluation {run.id}: reverse-text on scripted -> {out}"]
    assert entered_in == ["running"] and seen == [(1, 2), (2, 2)]
    assert len(result.rollouts) == 2 and (out / "results.jsonl").is_file() and run.state == "completed"


def test_every_rollout_failing_fails_the_run_naming_the_endpoint(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    job = EvalJob("reverse-text", model="m", num_examples=1, rollouts_per_example=1, base_url=url)
    run, out = create_run(job, output_dir=tmp_path / "out")
    with pytest.raises(EvalLaunchError, match=f"every rollout failed at the model endpoint {url}; .* \\(is it up"):
        evaluate(run, out, job, load_environment("reverse-text"), announce=lambda _: None)
    status = run.status()
    assert status["state"] == "failed" and status["reason"].startswith("every rollout failed at the model endpoint")


def test_rollouts_failed_on_several_sides_name_each_and_what_to_do_for_each(tmp_path: Path) -> None:
    """One failed at the endpoint, one in the environment, one in its scorer: the line counts each side and says
    what to do for each (the endpoint's question once); the verdict counts them the same."""
    def failed(source: str, error: str) -> Rollout:
        return Rollout(example_id=0, task="t", prompt=[], error=error, error_source=source,
                       stop_condition="completed" if source == "scorer" else "error")

    rollouts = [failed("model", "APIConnectionError: Connection error."), failed("environment", "RuntimeError: x"),
                failed("scorer", "reward function judged raised ValueError: y")]
    rows = [r.result_row() for r in rollouts]
    stats = RewardStats.from_rows(rows)
    result = EvalResult(rollouts, {"env_id": "e"}, stats, assess(rows, {}), tmp_path)
    assert result.failed == stats.errors == 3
    assert every_rollout_failed(result, "eval-1", "http://h/v1", "m") == (
        "every rollout failed (1 at the model endpoint, 1 in the environment, 1 in the scorer); the first error: "
        "APIConnectionError: Connection error. (is the endpoint http://h/v1 up and serving model 'm'?; each "
        "rollout's error: prime eval samples eval-1)")
