"""`prime eval run` against a scripted endpoint (the files, the registry run, the report, the failure paths).

The real model servers are exercised in tests/e2e/test_eval_builtin.py.
"""

from __future__ import annotations

import json
import os
import subprocess
from functools import partial
from pathlib import Path
from typing import Any

from prime_lab.runs.registry import RunRegistry
from tests.envs.scripted import scripted_endpoint
from tests.support import cli
from tests.support.rl_runs import FIXTURE_ENVS

prime = partial(cli.prime, timeout=120)


def test_eval_writes_results_metadata_events_and_a_report(tmp_path: Path, lab_home: Path) -> None:
    from prime_lab.envs import load_environment

    rows = load_environment("gsm8k", difficulty="easy").get_eval_dataset(3)
    right = [f"<answer>{r['answer']}</answer>" for r in rows]
    # One rollout at a time (-c 1): each example gets one right and one wrong reply, so rewards vary within it.
    replies: list[str | dict[str, Any] | None] = [x for r in right for x in (r, "<answer>-1</answer>")]
    with scripted_endpoint(replies) as ep:
        proc = prime("eval", "run", "gsm8k", "-b", ep.base_url, "-m", "scripted", "-n", "3", "-r", "2", "-c", "1",
                     "-a", '{"difficulty": "easy"}', "-S", '{"top_p": 0.9}', "-t", "32", "-T", "0.5",
                     cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    request = ep.requests[0]
    assert request["model"] == "scripted" and request["max_tokens"] == 32 and request["temperature"] == 0.5
    assert request["top_p"] == 0.9
    [run] = RunRegistry().runs()
    status = run.status()
    assert status["kind"] == "eval" and status["state"] == "completed" and status["step"] == 6
    assert status["max_steps"] == 6
    out = Path(status["output_dir"])
    assert out == (tmp_path / "outputs" / "evals" / "gsm8k--scripted" / run.id).resolve()
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(results) == 6
    for key in ("example_id", "prompt", "completion", "answer", "task", "reward", "metrics", "timing",
                "is_truncated", "stop_condition", "error", "token_usage"):
        assert key in results[0]
    metadata = json.loads((out / "metadata.json").read_text())
    for key in ("env_id", "env_args", "model", "base_url", "num_examples", "rollouts_per_example", "sampling_args",
                "date", "time_ms", "avg_reward", "avg_metrics"):
        assert key in metadata
    assert metadata["env_args"] == {"difficulty": "easy"} and metadata["avg_reward"] == 0.5
    assert metadata["difficulty"]["zero_variance_share"] == 0.0
    assert "ready for RL" in proc.stdout and "avg reward 0.500" in proc.stdout
    listed = json.loads(prime("rl", "list", "-o", "json", cwd=tmp_path).stdout)
    assert [(r["id"], r["kind"]) for r in listed] == [(run.id, "eval")]
    assert "eval" in prime("rl", "list", cwd=tmp_path).stdout
    assert json.loads(prime("rl", "list", "-k", "rl", "-o", "json", cwd=tmp_path).stdout) == []
    kinds = [e.kind for e in run.event_log().events()]
    assert kinds.count("eval") == 6 and "sample" in kinds


def test_eval_toml_form(tmp_path: Path, lab_home: Path) -> None:
    config = tmp_path / "eval.toml"
    with scripted_endpoint(["<reversed_text>x</reversed_text>"] * 4) as ep:
        config.write_text(f'model = "m"\nnum_examples = 2\nrollouts_per_example = 2\nbase_url = "{ep.base_url}"\n'
                          '[env]\nid = "primeintellect/reverse-text"\nargs = {max_words = 2}\n')
        proc = prime("eval", "run", f"@{config}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert len(ep.requests) == 4
    config.write_text('model = "m"\nnum_exmaples = 2\n[env]\nid = "reverse-text"\n')
    bad = prime("eval", "run", f"@{config}", cwd=tmp_path)
    assert bad.returncode == 1 and f"{config}:2: num_exmaples: unknown key (did you mean `num_examples`?)" in bad.stderr


def test_refused_endpoint_fails_fast_blaming_the_endpoint(tmp_path: Path, lab_home: Path) -> None:
    from prime_lab.runs.processes import free_port

    url = f"http://127.0.0.1:{free_port()}/v1"
    proc = prime("eval", "run", "reverse-text", "-b", url, "-m", "m", "-n", "2", cwd=tmp_path)
    assert proc.returncode == 1
    [error] = _errors(proc.stderr)
    assert error.startswith(f"Error: every rollout failed at the model endpoint {url}; the first error: "
                            "APIConnectionError: Connection error.")
    assert error.endswith("(is it up and serving model 'm'?)")
    [run] = RunRegistry().runs()
    status = run.status()
    assert status["state"] == "failed" and status["reason"].startswith("every rollout failed at the model endpoint")


def _faulty(tmp_path: Path, server: Any, fault: str, *flags: str, **args: Any) -> subprocess.CompletedProcess[str]:
    """`prime eval run` of tests/fixtures/envs/faulty_env.py with `fault`, against the tiny model's server."""
    env = {**os.environ, "PYTHONPATH": str(FIXTURE_ENVS)}
    return prime("eval", "run", "me/faulty-env", "-a", json.dumps({"fault": fault, **args}), "-b", server.base_url,
                 "-m", server.model_name, "-t", "4", *flags, cwd=tmp_path, env=env)


def _errors(stderr: str) -> list[str]:
    """What a command said on stderr besides its announcement of the evaluation."""
    return [line for line in stderr.splitlines() if line.strip() and not line.startswith("Evaluation ")]


def test_an_environment_that_is_down_fails_the_evaluation_in_one_line(tmp_path: Path, lab_home: Path,
                                                                     builtin_server: Any) -> None:
    """EnvironmentDown (an isolated environment's server died past its restarts, its log ending in a traceback):
    one line naming the environment, its log and the log's last line; exit 1; the run failed with that line."""
    proc = _faulty(tmp_path, builtin_server, "down", "-n", "2", "-r", "2")
    assert proc.returncode == 1
    [error] = _errors(proc.stderr)
    assert error == ("Error: environment 'faulty-env' (verifiers 0.1.9, in its own interpreter) is down: its server "
                     "died 4 times (3 restarts tried, the most allowed); the last time it exited with code 1. Last "
                     "lines of its log (/tmp/faulty-env/env_server.log) end with: RuntimeError: the server's disk is "
                     "full")
    [run] = RunRegistry().runs()
    status = run.status()
    assert status["state"] == "failed" and status["reason"] == error.removeprefix("Error: ")


def test_a_scorer_that_raises_is_counted_once_and_blamed(tmp_path: Path, lab_home: Path,
                                                         builtin_server: Any) -> None:
    """A reward function that raises on one example of two: the summary's errors and the verdict's failed rollouts
    are one count, the verdict says the scorer failed; raising on every example fails the run, blaming the scorer
    and not the endpoint (which answered)."""
    some = _faulty(tmp_path, builtin_server, "scorer", "-n", "2", "-r", "2", fails=[0])
    assert some.returncode == 0, some.stderr
    assert "; errors 2\n" in some.stdout
    assert "problem  2 of 4 rollouts failed (2 in the scorer: a reward function raised), their reward counted as 0" \
        in some.stdout
    every = _faulty(tmp_path, builtin_server, "scorer", "-n", "1", "-r", "2")
    assert every.returncode == 1
    [error] = _errors(every.stderr)
    run = next(r for r in RunRegistry().runs() if r.status()["state"] == "failed")
    assert error == ("Error: every rollout failed in the scorer: a reward function of me/faulty-env raised; the "
                     "first error: reward function judged raised ValueError: the judge is gone (fix it; each "
                     f"rollout's error: prime eval samples {run.id})")
    assert "endpoint" not in every.stderr


def test_an_environment_that_raises_is_blamed_not_the_endpoint(tmp_path: Path, lab_home: Path,
                                                               builtin_server: Any) -> None:
    proc = _faulty(tmp_path, builtin_server, "env", "-n", "1", "-r", "2")
    assert proc.returncode == 1
    [error] = _errors(proc.stderr)
    [run] = RunRegistry().runs()
    assert error == ("Error: every rollout failed in the environment me/faulty-env (its own code or server raised); "
                     "the first error: RuntimeError: the tool crashed (each rollout's error: prime eval samples "
                     f"{run.id})")
    assert "endpoint" not in proc.stderr


def test_a_rollout_that_raises_is_a_failed_rollout_blamed_on_the_environment(tmp_path: Path, lab_home: Path,
                                                                             builtin_server: Any) -> None:
    """An environment whose own `rollout` raises an ordinary exception on one example of two: the evaluation
    completes, those rollouts failed, blamed on the environment, no traceback; raising on every example fails the
    run in one line, blaming the environment."""
    some = _faulty(tmp_path, builtin_server, "rollout", "-n", "2", "-r", "2", fails=[0])
    assert some.returncode == 0, some.stderr
    assert "Traceback" not in some.stderr + some.stdout
    assert "; errors 2\n" in some.stdout
    assert "2 of 4 rollouts failed (2 in the environment: its own code or server raised)" in some.stdout
    [run] = RunRegistry().runs()
    assert run.status()["state"] == "completed"
    results = Path(run.status()["output_dir"]) / "results.jsonl"
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    failed = sorted((r["example_id"], r["error"].splitlines()[0], r["error_source"]) for r in rows if r["error"])
    assert failed == [(0, "RuntimeError: the simulator crashed", "environment")] * 2
    assert all(r["reward"] == 0.5 for r in rows if not r["error"])
    every = _faulty(tmp_path, builtin_server, "rollout", "-n", "1", "-r", "2")
    assert every.returncode == 1
    [error] = _errors(every.stderr)
    run = next(r for r in RunRegistry().runs() if r.status()["state"] == "failed")
    assert error == ("Error: every rollout failed in the environment me/faulty-env (its own code or server raised); "
                     "the first error: RuntimeError: the simulator crashed (each rollout's error: prime eval "
                     f"samples {run.id})")


def test_an_unexpected_exception_fails_the_run_in_one_line(tmp_path: Path, lab_home: Path,
                                                           builtin_server: Any) -> None:
    """An exception no part of the evaluation expects (here the environment's rows cannot be read): one line with
    its type and message and where its traceback is, exit 1, the run failed with that reason (not left running)."""
    proc = _faulty(tmp_path, builtin_server, "rows", "-n", "1")
    assert proc.returncode == 1
    [run] = RunRegistry().runs()
    log = run.log_path("eval")
    [error] = _errors(proc.stderr)
    assert error == f"Error: {run.id} failed: RuntimeError: the dataset is gone (its traceback: {log})"
    status = run.status()
    assert (status["state"], status["reason"]) == ("failed", "RuntimeError: the dataset is gone")
    assert "Traceback (most recent call last)" in log.read_text() and "a second line" in log.read_text()


def test_bad_arguments_are_clear(tmp_path: Path) -> None:
    bad_json = prime("eval", "run", "reverse-text", "-a", "{max_turns: 3}", cwd=tmp_path)
    assert bad_json.returncode == 1 and "-a/--env-args must be a JSON object" in bad_json.stderr
    unknown_model = prime("eval", "run", "reverse-text", "-m", "no-such-model-anywhere", cwd=tmp_path)
    assert unknown_model.returncode == 1 and "no-such-model-anywhere" in unknown_model.stderr


def test_env_file_secrets_reach_the_environment_and_never_the_outputs(tmp_path: Path, lab_home: Path) -> None:
    """A user environment that needs a key: missing -> clear error; given by --env-file -> works, value redacted."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "keyed_env.py").write_text(
        "from prime_lab.envs import Rubric, SingleTurnEnv, ensure_keys\n"
        "import os\n"
        "def load_environment():\n"
        "    ensure_keys(['KEYED_ENV_API_KEY'])\n"
        "    key = os.environ['KEYED_ENV_API_KEY']\n"
        "    return SingleTurnEnv(dataset=[{'question': 'token ' + key, 'answer': key}],\n"
        "                         rubric=Rubric([lambda completion, answer: 1.0]))\n")
    (tmp_path / "secrets.env").write_text("KEYED_ENV_API_KEY=sk-keyed-0123456789\n")
    env = {**os.environ, "PYTHONPATH": str(pkg)}
    env.pop("KEYED_ENV_API_KEY", None)
    missing = prime("eval", "run", "me/keyed-env", "-b", "http://127.0.0.1:9/v1", "-m", "m", cwd=tmp_path, env=env,
                    timeout=60)
    assert missing.returncode == 1 and "KEYED_ENV_API_KEY" in missing.stderr
    with scripted_endpoint(["sure"] * 4) as ep:
        proc = prime("eval", "run", "me/keyed-env", "-b", ep.base_url, "-m", "m", "-n", "1", "-r", "2",
                     "--env-file", "secrets.env", cwd=tmp_path, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert ep.requests[0]["messages"][-1]["content"] == "token sk-keyed-0123456789"  # the environment had it
    [run] = RunRegistry().runs()
    out = Path(run.status()["output_dir"])
    for path in (out / "results.jsonl", out / "metadata.json", run.events_path):
        assert "sk-keyed-0123456789" not in path.read_text(), path
    assert "token ***" in (out / "results.jsonl").read_text()


def test_env_list_shows_builtins_with_args(tmp_path: Path) -> None:
    proc = prime("env", "list", "-o", "json", cwd=tmp_path)
    envs = {e["id"]: e for e in json.loads(proc.stdout)}
    assert "primeintellect/wordle" in envs
    args = {a["name"]: a["default"] for a in envs["primeintellect/alphabet-sort"]["args"]}
    assert args["min_turns"] == 1 and args["max_turns"] == 3
