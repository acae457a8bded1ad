"""Stored secrets reach the processes that run environments, as environment variables, and nothing else: the
issue's "a secret's value appears in no file under PRIME_LAB_HOME or the run folder except the store, and reaches
the environment's process"; the precedence (global < the environment's < env_file < -e, the shell over secrets);
and a key an environment asks for that is not set, named with the command that stores it.

The test environment (tests/fixtures/envs/needs_key.py) scores 1 when the variable it reads has a given SHA-256, so
what the process saw is known without the value passing through anything written down.
"""

from __future__ import annotations

import hashlib
import json
import os
from functools import partial
from pathlib import Path

import pytest

from prime_lab.envs.secrets import SECRET_NAMES_VARIABLE
from prime_lab.runs.registry import RunRegistry
from tests.envs.scripted import scripted_endpoint
from tests.support import cli
from tests.support.rl_runs import fixture_envs  # noqa: F401  (autouse: the test environments are importable)

prime = partial(cli.prime, timeout=180)
KEY = "NEEDS_KEY_TOKEN"


def sha(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def files_holding(value: str, *folders: Path) -> list[Path]:
    return sorted({p for folder in folders for p in folder.rglob("*")
                   if p.is_file() and value.encode() in p.read_bytes()})


@pytest.fixture(autouse=True)
def no_key_in_the_shell(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (KEY, SECRET_NAMES_VARIABLE):
        monkeypatch.delenv(name, raising=False)


def test_a_secret_reaches_the_environment_and_no_file_but_the_store(tiny_model_dir: Path, tmp_path: Path,
                                                                     lab_home: Path) -> None:
    value = "sk-must-not-leak-5b0f3e"
    assert prime("secret", "create", "-n", KEY, input=value + "\n").returncode == 0
    proc = prime("eval", "run", "needs-key", "-m", str(tiny_model_dir), "-n", "2", "-r", "2", "-t", "4",
                 "-a", json.dumps({"sha256": sha(value)}), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "avg reward 1.000" in proc.stdout  # every rollout was scored where the variable had the value
    assert f"{KEY}=****" in proc.stderr and value not in proc.stdout + proc.stderr
    [run] = RunRegistry().runs()
    out = Path(run.status()["output_dir"])
    assert (out / "results.jsonl").exists() and run.log_path("inference").exists() and out.is_relative_to(tmp_path)
    assert files_holding(value, lab_home, tmp_path) == [lab_home / "secrets" / "secrets.json"]


@pytest.mark.parametrize("layers, seen", [
    (("global",), "global"),
    (("global", "env"), "env"),
    (("global", "env", "env_file"), "env_file"),
    (("global", "env", "env_file", "shell"), "shell"),
])
def test_eval_precedence(layers: tuple[str, ...], seen: str, tmp_path: Path, lab_home: Path) -> None:
    values = {layer: f"value-of-{layer}" for layer in layers}
    env = dict(os.environ)
    if "global" in layers:
        assert prime("secret", "create", "-n", KEY, "-v", values["global"]).returncode == 0
    if "env" in layers:
        assert prime("env", "secret", "create", "needs-key", "-n", KEY, "-v", values["env"]).returncode == 0
    flags = []
    if "env_file" in layers:
        (tmp_path / "secrets.env").write_text(f"{KEY}={values['env_file']}\n")
        flags = ["--env-file", "secrets.env"]
    if "shell" in layers:
        env[KEY] = values["shell"]
    with scripted_endpoint(["ok"] * 2) as ep:
        proc = prime("eval", "run", "needs-key", "-b", ep.base_url, "-m", "m", "-n", "1", "-r", "2",
                     "-a", json.dumps({"sha256": sha(values[seen])}), *flags, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "avg reward 1.000" in proc.stdout, f"the environment did not see the {seen} value"
    assert (f"{KEY}=****" in proc.stderr) == (seen in ("global", "env"))  # said only when a stored one is used


def test_gepa_runs_the_environment_with_its_secret(tmp_path: Path, lab_home: Path) -> None:
    value = "sk-gepa-secret-81aa"
    assert prime("env", "secret", "create", "primeintellect/needs-key", "-n", KEY, "-v", value).returncode == 0
    with scripted_endpoint(["ok"] * 20) as ep:
        proc = prime("gepa", "run", "needs-key", "-b", ep.base_url, "-m", "m", "-B", "8", "-n", "2", "-N", "2",
                     "--minibatch-size", "2", "--perfect-score", "1", "-a", json.dumps({"sha256": sha(value)}),
                     cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "(seed 1.0000)" in proc.stdout  # the seed prompt scored 1: every rollout saw the value
    assert files_holding(value, lab_home, tmp_path) == [lab_home / "secrets" / "secrets.json"]


def test_a_missing_key_fails_at_the_start_naming_it_and_the_command(tmp_path: Path, lab_home: Path) -> None:
    for command in (("eval", "run", "needs-key", "-b", "http://127.0.0.1:9/v1", "-m", "m"),
                    ("gepa", "run", "needs-key", "-b", "http://127.0.0.1:9/v1", "-m", "m")):
        proc = prime(*command, cwd=tmp_path)
        assert proc.returncode == 1, proc.stderr
        assert f"environment 'needs-key' needs {KEY}" in proc.stderr
        assert f"`prime secret create -n {KEY}`" in proc.stderr
        assert f"`prime env secret create needs-key -n {KEY}`" in proc.stderr
    assert RunRegistry().runs() == []  # it failed before a run existed


def test_rl_run_environment_precedence(tmp_path: Path, lab_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What `prime rl run` hands the supervisor: global < the environment's < the config's env_file (read by the
    orchestrator: the secret steps aside) < --env-file < -e; the shell over any stored secret; SFT gets none."""
    from prime_lab.envs.secret_store import SecretStore
    from prime_lab.workbench.cli.rl_run import _env_vars

    store = SecretStore()
    for name in ("ONLY_GLOBAL", "ENV_WINS", "CONFIG_FILE_WINS", "FLAG_FILE_WINS", "FLAG_WINS", "SHELL_WINS"):
        store.create(name, "global")
    for name in ("ENV_WINS", "CONFIG_FILE_WINS", "FLAG_FILE_WINS", "FLAG_WINS"):
        store.create(name, "env", "tiny-chars")
    store.create("OTHER_ENV", "not this run's", "needs-key")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SHELL_WINS", "shell")
    (tmp_path / "config.env").write_text("CONFIG_FILE_WINS=config\n")
    (tmp_path / "flag.env").write_text("FLAG_FILE_WINS=flag-file\nFLAG_WINS=flag-file\n")
    resolved = {"env": [{"id": "primeintellect/tiny-chars"}], "env_file": ["config.env"]}
    try:
        out = _env_vars(["FLAG_WINS=flag"], [Path("flag.env")], None, resolved)
    finally:  # --env-file's values also went into this process's environment
        for name in ("FLAG_FILE_WINS", "FLAG_WINS"):
            os.environ.pop(name, None)
    assert out == {"ONLY_GLOBAL": "global", "ENV_WINS": "env", "FLAG_FILE_WINS": "flag-file", "FLAG_WINS": "flag",
                   SECRET_NAMES_VARIABLE: "ENV_WINS,ONLY_GLOBAL"}
    assert _env_vars([], [], None, {"data": {}}) == {}  # an SFT run runs no environment
