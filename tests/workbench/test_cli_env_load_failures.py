"""An environment that cannot load ends `prime rl run` (and `prime eval run`, `prime gepa run`) before a run is
registered: its one-line error printed once, exit 1, no traceback, nothing new in the command's list."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from tests.support.cli import prime

REPO = Path(__file__).resolve().parents[2]
CONFIG = (REPO / "configs" / "rl" / "reverse-text.toml").read_text()
DEFAULT_ENV = 'id = "primeintellect/reverse-text"\nargs = { max_words = 3 }        # 1-3 words per phrase (the ' \
              "environment's default range)"

MODULES = {
    "hubprobe_raising_env": '''
        def load_environment(split: str = "train"):
            raise ValueError(f"no split {split!r} in this environment")
        ''',
    "hubprobe_hub_env": '''
        def load_environment(dataset_name: str = "nobody-prime-lab/not-on-this-machine"):
            import datasets

            return datasets.load_dataset(dataset_name, split="train")
        ''',
    "hubprobe_key_env": '''
        from prime_lab.envs import SingleTurnEnv, Rubric, ensure_keys


        def load_environment():
            ensure_keys(["HUBPROBE_KEY"])
            return SingleTurnEnv(dataset=[{"question": "q", "answer": "a"}], rubric=Rubric([lambda **_: 1.0]))
        ''',
}


KEY_ENV = 'id = "hubprobe-key-env"'


@pytest.fixture
def cli_env(tmp_path: Path) -> dict[str, str]:
    """This test's environment with the test environments installed (on PYTHONPATH), no offline choice made."""
    site = tmp_path / "site"
    site.mkdir()
    for name, text in MODULES.items():
        (site / f"{name}.py").write_text(textwrap.dedent(text).lstrip("\n"))
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE",
                                                            "TRANSFORMERS_OFFLINE", "HUBPROBE_KEY")}
    return {**env, "PYTHONPATH": str(site)}


def config(tmp_path: Path, env_section: str, *, model: str | None = None, top: str = "") -> Path:
    text = CONFIG.replace(DEFAULT_ENV, env_section)
    assert text != CONFIG or env_section == DEFAULT_ENV
    if model is not None:
        text = text.replace('model = "smollm2-135m"', f'model = "{model}"')
    path = tmp_path / "run.toml"
    path.write_text(top + text)
    return path


def no_runs(group: str, env: dict[str, str]) -> bool:
    listed = prime(group, "list", "-o", "json", env=env)
    return listed.returncode == 0 and json.loads(listed.stdout) == []


@pytest.mark.parametrize(("env_section", "words"), [
    ('id = "primeintellect/no-such-env"', "no environment 'primeintellect/no-such-env': no installed package"),
    ('id = "primeintellect/reverse-text"\nargs = { bogus = 1 }',
     "environment 'primeintellect/reverse-text' does not take argument(s) bogus; its arguments are:"),
    ('id = "hubprobe-raising-env"\nargs = { split = "tset" }',
     "environment 'hubprobe-raising-env': load_environment(split='tset') raised ValueError: no split 'tset' in this "
     "environment"),
    ('id = "hubprobe-hub-env"',
     "environment 'hubprobe-hub-env': dataset 'nobody-prime-lab/not-on-this-machine' is not on this machine and the "
     "Hub is offline (the Hugging Face Hub at https://huggingface.co did not answer, so environments load offline; "
     "HF_HUB_OFFLINE=0 downloads)"),
], ids=["unknown-id", "bad-args", "load-raises", "hub-offline"])
def test_rl_run_fails_before_the_run_is_registered(tmp_path: Path, cli_env: dict[str, str], env_section: str,
                                                   words: str) -> None:
    path = config(tmp_path, env_section)
    proc = prime("rl", "run", f"@{path}", env=cli_env, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert out.count(words) == 1 and proc.stderr.startswith("Error: "), out
    assert proc.stdout == "" and "Traceback" not in out  # no run id: nothing was started
    assert no_runs("rl", cli_env)


def test_an_eval_environment_is_checked_too(tmp_path: Path, cli_env: dict[str, str]) -> None:
    path = config(tmp_path, DEFAULT_ENV)
    path.write_text(path.read_text() + '\n[eval]\ninterval = 10\n\n[[eval.env]]\nid = "primeintellect/no-such-env"\n')
    proc = prime("rl", "run", f"@{path}", env=cli_env, cwd=tmp_path)
    assert proc.returncode == 1 and proc.stderr.count("no environment 'primeintellect/no-such-env'") == 1, proc.stderr
    assert no_runs("rl", cli_env)


def test_a_key_the_environment_needs_is_named(tmp_path: Path, cli_env: dict[str, str]) -> None:
    missing = prime("rl", "run", f"@{config(tmp_path, KEY_ENV)}", env=cli_env, cwd=tmp_path)
    assert missing.returncode == 1, missing.stderr
    assert missing.stderr.count("environment 'hubprobe-key-env' needs HUBPROBE_KEY, not set") == 1
    assert no_runs("rl", cli_env)


def test_the_check_sees_what_the_run_s_processes_will(tmp_path: Path, cli_env: dict[str, str]) -> None:
    """The key given with -e or in the config's env_file: the check passes and the command goes on (here to a model
    that is not on this machine, which ends it before a run too)."""
    path = config(tmp_path, KEY_ENV, model="/nowhere/no-model")
    given = prime("rl", "run", f"@{path}", "-e", "HUBPROBE_KEY=secret-value", env=cli_env, cwd=tmp_path)
    assert given.returncode == 1 and "HUBPROBE_KEY" not in given.stderr, given.stderr
    assert given.stderr.count("model '/nowhere/no-model' is not a preset") == 1
    (tmp_path / "keys.env").write_text("HUBPROBE_KEY=secret-value\n")
    path = config(tmp_path, KEY_ENV, model="/nowhere/no-model", top='env_file = ["keys.env"]\n')
    from_file = prime("rl", "run", f"@{path}", env=cli_env, cwd=tmp_path)
    assert from_file.returncode == 1 and "HUBPROBE_KEY" not in from_file.stderr, from_file.stderr
    assert "model '/nowhere/no-model' is not a preset" in from_file.stderr


@pytest.mark.parametrize("group", ["eval", "gepa"])
def test_eval_and_gepa_fail_before_the_run_is_registered(tmp_path: Path, cli_env: dict[str, str],
                                                         group: str) -> None:
    proc = prime(group, "run", "hubprobe-raising-env", "-a", '{"split": "tset"}', env=cli_env, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert out.count("environment 'hubprobe-raising-env': load_environment(split='tset') raised ValueError") == 1
    assert no_runs(group, cli_env)
