"""An environment whose data is a Hugging Face Hub dataset, as a user meets it: `prime eval run` of it downloads the
dataset from the Hub when the Hub answers (a loopback Hub here, `HF_ENDPOINT`), and with the Hub gone fails in one
line within seconds, naming the dataset, the offline Hub and the command that gets it. The same dataset in an
environment at its own verifiers release (its own interpreter) downloads there too: that interpreter gets the
probe's decision, not a forced offline Hub."""

from __future__ import annotations

import io
import json
import os
import textwrap
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from prime_lab.envs import isolated, loader
from prime_lab.runs.registry import RunRegistry
from tests.envs.test_env_load_failures import own_interpreter
from tests.support import cli
from tests.support.hf_hub import HubRepo, loopback_hub

prime = partial(cli.prime, timeout=120)

DATASET = "someone/tiny-dataset"
ENV_MODULE = '''
    from prime_lab.envs import Rubric, SingleTurnEnv


    def load_environment(dataset_name: str = "someone/tiny-dataset"):
        import datasets

        rows = datasets.load_dataset(dataset_name, split="train")
        return SingleTurnEnv(dataset=rows, rubric=Rubric([lambda **_: 1.0]))
    '''
VF_MODULE = '''
    import verifiers as vf
    from datasets import load_dataset


    def load_environment(dataset_name: str = "someone/tiny-dataset"):
        return vf.SingleTurnEnv(dataset=load_dataset(dataset_name, split="train"))
    '''
QUESTIONS = ["Which colour is the loopback sky?", "How many legs has a loopback cat?"]


def dataset_repo() -> HubRepo:
    """The dataset as the Hub holds one: a README whose card names the split's parquet files, and the files."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = io.BytesIO()
    pq.write_table(pa.table({"question": QUESTIONS, "answer": ["blue", "four"]}), parquet)
    card = ("---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: data/train-*.parquet\n"
            "---\n# tiny-dataset\n")
    return HubRepo(DATASET, {"README.md": card.encode(), "data/train-00000-of-00001.parquet": parquet.getvalue()},
                   kind="dataset")


@pytest.fixture
def user_env(tmp_path: Path) -> dict[str, str]:
    """A user's environment: the environment module installed (on PYTHONPATH), an empty Hugging Face cache of their
    own, no offline choice made."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "hubds_env.py").write_text(textwrap.dedent(ENV_MODULE).lstrip("\n"))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("HF_") and k not in ("TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")}
    return {**env, "PYTHONPATH": str(site), "HF_HOME": str(tmp_path / "hf")}


def evaluate(server: Any, env: dict[str, str], cwd: Path) -> Any:
    return prime("eval", "run", "hubds-env", "-b", server.base_url, "-m", server.model_name, "-n", "2", "-r", "1",
                 "-t", "4", env=env, cwd=cwd)


def prompts(run_id: str) -> list[str]:
    [run] = [r for r in RunRegistry().runs() if r.id == run_id]
    results = Path(run.status()["output_dir"]) / "results.jsonl"
    return [json.loads(line)["prompt"][-1]["content"] for line in results.read_text().splitlines()]


def test_a_hub_dataset_loads_online_and_offline_is_one_line(tmp_path: Path, lab_home: Path, builtin_server: Any,
                                                           user_env: dict[str, str]) -> None:
    with loopback_hub([dataset_repo()]) as hub:
        online = evaluate(builtin_server, {**user_env, "HF_ENDPOINT": hub.url}, tmp_path)
        assert online.returncode == 0, online.stderr
        assert hub.file_gets("data/train-00000-of-00001.parquet"), [r.path for r in hub.requests]
    [run] = RunRegistry().runs()
    assert sorted(prompts(run.id)) == sorted(QUESTIONS)

    # The Hub gone (its port refused), on a machine without the dataset: one line, at once.
    started = time.monotonic()
    fresh = evaluate(builtin_server, {**user_env, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "empty-hf")},
                     tmp_path)
    seconds = time.monotonic() - started
    assert fresh.returncode == 1 and fresh.stdout == "", fresh.stderr
    assert fresh.stderr.strip().splitlines() == [
        f"Error: environment 'hubds-env': dataset '{DATASET}' is not on this machine and the Hub is offline (the "
        f"Hugging Face Hub at {hub.url} did not answer, so environments load offline; HF_HUB_OFFLINE=0 downloads); "
        f"download it where the Hub is reachable (hf download {DATASET} --repo-type dataset --local-dir FOLDER), "
        "copy the folder here, and pass dataset_name='/path/to/folder' (-a '{\"dataset_name\": "
        "\"/path/to/folder\"}')"]
    assert seconds < 15, seconds  # datasets alone retries an unreachable Hub for about 25 s
    assert len(RunRegistry().runs()) == 1  # the failed load registered nothing


@pytest.mark.slow  # the environment's interpreter imports verifiers (about 6 s)
def test_an_isolated_environment_downloads_a_hub_dataset_in_its_own_interpreter(
        tmp_path: Path, lab_home: Path, user_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "modules"
    folder.mkdir()
    (folder / "hubds_vf_env.py").write_text(textwrap.dedent(VF_MODULE).lstrip("\n"))
    isolated.save_record(isolated.IsolatedRecord(
        name="hubds-vf-env", module="hubds_vf_env", distribution="hubds-vf-env", version="0.1.0", release="0.3.1",
        python=str(own_interpreter(tmp_path, folder)), target=str(folder), reason="a test",
        args=(("dataset_name", DATASET, False, "str"),)))
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", user_env["HF_HOME"])
    with loopback_hub([dataset_repo()]) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        env = loader.load_environment("hubds-vf-env")
        assert hub.file_gets("data/train-00000-of-00001.parquet"), [r.path for r in hub.requests]
    assert isinstance(env, isolated.IsolatedEnvironment)
    assert sorted(row["prompt"][-1]["content"] for row in env.get_eval_dataset()) == sorted(QUESTIONS)
