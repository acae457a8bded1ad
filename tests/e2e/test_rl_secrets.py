"""An RL run's orchestrator runs its environment with the stored secrets in its environment (the environment's own
over the global one), and the values are in no file of the run (its W&B mirror's offline run included), nor
anywhere under PRIME_LAB_HOME but the store."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from prime_lab.envs.secrets import SECRET_NAMES_VARIABLE
from tests.monitors.test_wandb_mirror import offline_files
from tests.support.rl_runs import fixture_envs, logs, prime, rewards, start, wait_final

pytestmark = pytest.mark.slow
__all__ = ["fixture_envs"]  # autouse: the run's processes find the needs-key test environment
KEY = "NEEDS_KEY_TOKEN"


def test_rl_run_environment_gets_its_secret_and_no_file_holds_it(tiny_model_dir: Path, tmp_path: Path,
                                                                  lab_home: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (KEY, SECRET_NAMES_VARIABLE):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")  # the W&B mirror's offline run is among the files searched
    global_value, env_value = "sk-rl-global-0d41c7", "sk-rl-env-93be2f"
    assert prime("secret", "create", "-n", KEY, "-v", global_value).returncode == 0
    assert prime("env", "secret", "create", "needs-key", "-n", KEY, "-v", env_value).returncode == 0
    config = tmp_path / "rl.toml"
    config.write_text(f"""
model = "{tiny_model_dir}"
max_steps = 1
batch_size = 4
rollouts_per_example = 2

[sampling]
max_tokens = 4

[[env]]
id = "needs-key"
args = {{ sha256 = "{hashlib.sha256(env_value.encode()).hexdigest()}" }}

[lora]
r = 4
alpha = 8

[wandb]
project = "prime-lab-tests"
""")
    run = start(config)
    status = wait_final(run)
    assert status["state"] == "completed", logs(run)
    assert rewards(run) == [1.0]  # every rollout was scored where the variable held the environment's value
    assert offline_files(run)  # W&B's own files are there to search
    for value in (global_value, env_value):
        held = sorted({p for p in lab_home.rglob("*") if p.is_file() and value.encode() in p.read_bytes()})
        assert held == [lab_home / "secrets" / "secrets.json"], value
        assert not [p for p in tmp_path.rglob("*") if p.is_file() and value.encode() in p.read_bytes()
                    and not p.is_relative_to(lab_home)]
