"""Environments with `datasets` data through `prime eval run`: local files load offline; a Hub dataset out of reach
is one clean line, at once.

The Hub is a local socket (`HF_ENDPOINT`) that accepts connections and never answers, so the tests see that only
the Hub probe (runs/hub_probe.py, one request, about a second) reached it, and a request that did more would hang
instead of failing fast.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from tests.envs.scripted import scripted_endpoint
from tests.support import cli

prime = partial(cli.prime, timeout=120)

HUB_MODULE = '''\
import datasets

from prime_lab.envs import SingleTurnEnv


def load_environment(dataset_name: str = "someone/not-here", dataset_split: str = "train"):
    return SingleTurnEnv(dataset=datasets.load_dataset(dataset_name, split=dataset_split))
'''

LOCAL_MODULE = '''\
import datasets

from prime_lab.envs import Rubric, SingleTurnEnv


def load_environment(data: str, kind: str | None = None):
    """`data`: a folder of data files, or one file loaded as `kind` (json, csv, parquet)."""
    rows = datasets.load_dataset(data, split="train") if kind is None else \\
        datasets.load_dataset(kind, data_files=data, split="train")
    return SingleTurnEnv(dataset=rows, system_prompt="Answer.",
                         rubric=Rubric([lambda completion, answer: float(completion[-1]["content"] == answer)]))
'''


class SilentHub:
    """A TCP listener that counts the connections it gets and never answers them."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.connections = 0
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            self.held.append(conn)


@pytest.fixture
def hub() -> Iterator[SilentHub]:
    silent = SilentHub()
    yield silent
    silent.sock.close()
    for conn in silent.held:
        conn.close()


@pytest.fixture
def site(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    site.mkdir()
    (site / "hub_only.py").write_text(HUB_MODULE)
    (site / "local_rows.py").write_text(LOCAL_MODULE)
    return site


def prime_env(site: Path, hub: SilentHub, tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE",
                                                             "TRANSFORMERS_OFFLINE")}
    return {**env, "PYTHONPATH": str(site), "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf-home"), **extra}


def test_a_hub_dataset_out_of_reach_is_one_line_at_once_and_names_the_fix(site: Path, hub: SilentHub,
                                                                          tmp_path: Path) -> None:
    started = time.monotonic()
    proc = prime("eval", "run", "hub-only", "-b", "http://127.0.0.1:9/v1", "-m", "m", cwd=tmp_path,
                 env=prime_env(site, hub, tmp_path))
    elapsed = time.monotonic() - started
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1, proc.stderr  # one line
    line = proc.stderr.strip()
    assert line.startswith("Error: environment 'hub-only': dataset 'someone/not-here' is not on this machine and "
                           f"the Hub is offline (the Hugging Face Hub at {hub.url} did not answer, so environments "
                           "load offline; HF_HUB_OFFLINE=0 downloads)"), line
    assert "hf download someone/not-here --repo-type dataset --local-dir FOLDER" in line
    assert "pass dataset_name='/path/to/folder' (-a '{\"dataset_name\": \"/path/to/folder\"}')" in line
    assert hub.connections == 1  # the probe's one request, unanswered: offline, nothing more reached for it
    assert elapsed < 60  # datasets' own retries take 20 s and more before failing
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize("layout", ["jsonl-folder", "csv-folder", "parquet-folder", "json-file"])
def test_local_data_files_load_offline(site: Path, hub: SilentHub, tmp_path: Path, layout: str) -> None:
    import datasets

    rows = [{"question": f"q{i}", "answer": f"a{i}"} for i in range(3)]
    folder = tmp_path / "data"
    folder.mkdir()
    table = datasets.Dataset.from_list(rows)
    args: dict[str, str] = {"data": str(folder)}
    if layout == "jsonl-folder":
        (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif layout == "csv-folder":
        table.to_csv(str(folder / "train.csv"), index=False)
    elif layout == "parquet-folder":
        table.to_parquet(str(folder / "train.parquet"))
    else:
        (folder / "rows.json").write_text(json.dumps(rows))
        args = {"data": str(folder / "rows.json"), "kind": "json"}
    with scripted_endpoint(["a0", "a1", "a2"]) as ep:
        proc = prime("eval", "run", "local-rows", "-a", json.dumps(args), "-b", ep.base_url, "-m", "m", "-n", "3",
                     "-r", "1", "-c", "1", cwd=tmp_path, env=prime_env(site, hub, tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert sorted(r["messages"][-1]["content"] for r in ep.requests) == ["q0", "q1", "q2"]
    assert "avg reward 1.000" in proc.stdout
    assert hub.connections == 1  # the probe's, unanswered: the local files loaded offline, nothing else asked


@pytest.mark.slow
def test_with_the_hub_allowed_but_unreachable_the_message_says_so(site: Path, tmp_path: Path) -> None:
    """HF_HUB_OFFLINE=0 is the user's choice: datasets tries (and retries, ~25 s) a Hub that refuses connections."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{closed.getsockname()[1]}"
    closed.close()
    env = {**{k: v for k, v in os.environ.items() if k != "HF_DATASETS_OFFLINE"}, "HF_HUB_OFFLINE": "0",
           "PYTHONPATH": str(site), "HF_ENDPOINT": url, "HF_HOME": str(tmp_path / "hf-home")}
    proc = prime("eval", "run", "hub-only", "-a", '{"dataset_name": "someone/elsewhere"}', "-b",
                 "http://127.0.0.1:9/v1", "-m", "m", cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: environment 'hub-only': dataset 'someone/elsewhere' is not on this machine and "
                           "the Hugging Face Hub cannot be reached;"), proc.stderr
    assert "pass dataset_name='/path/to/folder'" in last
