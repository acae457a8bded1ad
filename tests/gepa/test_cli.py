"""`prime gepa run` input errors (exit 1, no traceback), the configs in configs/gepa/, and a foreign `gepa`."""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from prime_lab.envs import load_environment
from prime_lab.gepa.config import validate_gepa_file
from tests.support import cli
from tests.support.rl_runs import FIXTURE_ENVS

prime = partial(cli.prime, timeout=120)
CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs" / "gepa").glob("*.toml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_every_gepa_config_validates_and_loads_its_environment(path: Path) -> None:
    result = validate_gepa_file(path)
    assert not result.problems, [p.format() for p in result.problems]
    assert result.config is not None and result.config.model == "smollm2-135m"
    assert load_environment(result.config.env.id, **result.config.env.args) is not None


def test_config_problems_carry_lines_and_suggestions(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[env]\nid = "reverse-text"\n[gepa]\nmax_cals = 3\nnum_val = 0\nnum_parallel_proposals = 0\n')
    proc = prime("gepa", "run", f"@{bad}", cwd=tmp_path)
    assert proc.returncode == 1
    assert f"{bad}:4: gepa.max_cals: unknown key (did you mean `max_calls`?)" in proc.stderr
    assert f"{bad}:5: gepa.num_val" in proc.stderr
    assert f"{bad}:6: gepa.num_parallel_proposals" in proc.stderr
    proc = prime("gepa", "run", "reverse-text", "-P", "0", cwd=tmp_path)
    assert proc.returncode == 2 and "--num-parallel-proposals" in proc.stderr


def test_unknown_environment_and_bad_json_fail_cleanly(tmp_path: Path) -> None:
    proc = prime("gepa", "run", "no-such-env", cwd=tmp_path)
    assert proc.returncode == 1 and "no environment 'no-such-env'" in proc.stderr
    proc = prime("gepa", "run", "reverse-text", "-a", "{not json", cwd=tmp_path)
    assert proc.returncode == 1 and "-a/--env-args must be a JSON object" in proc.stderr
    proc = prime("gepa", "run", "--resume", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 1 and "not a GEPA run directory" in proc.stderr


def test_a_foreign_gepa_package_on_the_path_changes_nothing(tmp_path: Path) -> None:
    """A `gepa` of the user's (or PyPI's) first on the path: prime-lab's is `prime_lab.gepa`, so the run goes on to
    its own checks (here: an unknown environment, named with the fix) instead of importing the other one."""
    (tmp_path / "gepa").mkdir()
    (tmp_path / "gepa" / "__init__.py").write_text("raise ImportError('the foreign gepa was imported')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    proc = prime("gepa", "run", "no-such-env", "-b", "http://127.0.0.1:9/v1", cwd=tmp_path, env=env)
    assert proc.returncode == 1, proc.stderr
    assert "foreign gepa" not in proc.stderr and "no environment 'no-such-env'" in proc.stderr


def test_an_environment_that_is_down_fails_the_run_in_one_line(tmp_path: Path, lab_home: Path,
                                                              builtin_server: Any) -> None:
    """EnvironmentDown in the seed's first evaluation (tests/fixtures/envs/faulty_env.py): one line naming the
    environment, its log and the log's last line, exit 1, the run failed with that line."""
    from prime_lab.runs.registry import RunRegistry

    env = {**os.environ, "PYTHONPATH": str(FIXTURE_ENVS)}
    proc = prime("gepa", "run", "me/faulty-env", "-a", '{"fault": "down", "num_examples": 4}', "-b",
                 builtin_server.base_url, "-m", builtin_server.model_name, "-B", "8", "-n", "2", "-N", "2", "-t", "4",
                 cwd=tmp_path, env=env)
    assert proc.returncode == 1
    [error] = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith("GEPA ")]
    assert error.startswith("Error: environment 'faulty-env' (verifiers 0.1.9, in its own interpreter) is down: ")
    assert error.endswith("Last lines of its log (/tmp/faulty-env/env_server.log) end with: RuntimeError: the "
                          "server's disk is full")
    [run] = RunRegistry().runs()
    status = run.status()
    assert status["state"] == "failed" and status["reason"] == error.removeprefix("Error: ")


def test_an_unexpected_exception_fails_the_run_in_one_line(tmp_path: Path, lab_home: Path) -> None:
    """An exception no part of the search expects (here the environment's rows cannot be read): one line with its
    type and message and where its traceback is, exit 1, the run failed with that reason (not left running)."""
    from prime_lab.runs.registry import RunRegistry

    env = {**os.environ, "PYTHONPATH": str(FIXTURE_ENVS)}
    proc = prime("gepa", "run", "me/faulty-env", "-a", '{"fault": "rows"}', "-b", "http://127.0.0.1:9/v1",
                 "-m", "m", cwd=tmp_path, env=env)
    assert proc.returncode == 1
    [run] = RunRegistry().runs()
    log = run.log_path("gepa")
    [error] = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith("GEPA ")]
    assert error == f"Error: {run.id} failed: RuntimeError: the dataset is gone (its traceback: {log})"
    status = run.status()
    assert (status["state"], status["reason"]) == ("failed", "RuntimeError: the dataset is gone")
    assert "Traceback (most recent call last)" in log.read_text() and "a second line" in log.read_text()
