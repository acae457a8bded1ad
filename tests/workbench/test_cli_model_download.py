"""Commands that start a model download a Hugging Face id that is not on the machine, from the Hub at HF_ENDPOINT
(a loopback one the test starts), before anything else starts; without a Hub, or for a gated model, one line and no
run registered. A downloaded model trains 2 RL steps with the Hub gone."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from prime_lab.runs.processes import ServerProcess
from prime_lab.runs.registry import RunRegistry
from tests.support.cli import PRIME, prime
from tests.support.hf_hub import HubRepo, LoopbackHub, files_of, loopback_hub

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def hub(tiny_model_dir: Path) -> Iterator[LoopbackHub]:
    repos = [HubRepo("acme/tiny-chat", files_of(tiny_model_dir), revisions=("main", "v1")),
             HubRepo("acme/gated-chat", files_of(tiny_model_dir), token="hf_letmein")]
    with loopback_hub(repos) as server:
        yield server


def hub_env(tmp_path: Path, endpoint: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_TOKEN")}
    return {**env, "HF_ENDPOINT": endpoint, "HF_HUB_CACHE": str(tmp_path / "hf-cache")}


def test_prime_serve_downloads_a_hub_id_then_serves_it(hub: LoopbackHub, tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "serve.log"
    serve = ServerProcess([PRIME, "serve", "acme/tiny-chat", "--port", str(port)], port=port, log_path=log,
                          env=hub_env(tmp_path, hub.url), name="prime serve")
    with serve.start():
        serve.wait_ready(timeout=120)
        models = openai.OpenAI(base_url=serve.base_url, api_key="unused").models.list()
        assert [m.id for m in models.data] == ["acme/tiny-chat"]
    text = log.read_text()
    commit = hub.repos["model", "acme/tiny-chat"].sha
    assert f"downloading acme/tiny-chat at {commit[:12]} from {hub.url}: 6 files" in text, text
    assert (tmp_path / "hf-cache" / "models--acme--tiny-chat" / "snapshots" / commit / "model.safetensors").is_file()
    listed = prime("rl", "models", "-o", "json", env=hub_env(tmp_path, hub.url))
    cached = [row for row in json.loads(listed.stdout) if row["source"] == "Hugging Face cache"]
    assert [(row["name"], row["status"]) for row in cached] == [("acme/tiny-chat", "present")]
    assert cached[0]["parameters"] > 0 and cached[0]["path"].endswith(commit)


def test_rl_run_without_a_hub_is_one_line_at_once(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{sock.getsockname()[1]}"  # closed when the block ends: a refused port
    config = tmp_path / "run.toml"
    text = (REPO / "configs" / "rl" / "reverse-text.toml").read_text()
    config.write_text(text.replace('model = "smollm2-135m"', 'model = "acme/tiny-chat@v1"'))
    started = time.monotonic()
    proc = prime("rl", "run", f"@{config}", env=hub_env(tmp_path, endpoint), cwd=tmp_path)
    assert time.monotonic() - started < 20  # the CLI's start and the environment's load included
    assert proc.returncode == 1 and proc.stdout == "", proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"Error: model 'acme/tiny-chat@v1' is not on this machine and the Hugging Face Hub "
                                  f"at {endpoint} cannot be reached (")
    assert "run `hf download acme/tiny-chat --revision v1` where the Hub is reachable" in proc.stderr
    assert RunRegistry().runs() == []


@pytest.mark.parametrize("group", ["eval", "gepa"])
def test_a_gated_model_names_the_page_and_the_token(hub: LoopbackHub, tmp_path: Path, group: str) -> None:
    proc = prime(group, "run", "reverse-text", "-m", "acme/gated-chat", env=hub_env(tmp_path, hub.url), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"Error: model 'acme/gated-chat' is gated on the Hugging Face Hub: accept its terms at {hub.url}/acme/gated-"
        "chat while logged in, then give a token of that account in HF_TOKEN (export HF_TOKEN=hf_..., or `prime "
        "secret create -n HF_TOKEN`)")
    assert RunRegistry().runs() == []


def test_a_downloaded_model_trains_two_rl_steps_with_the_hub_gone(hub: LoopbackHub, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.support.rl_runs import FIXTURE_ENVS, start, wait_final, write_config

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(FIXTURE_ENVS), os.environ.get("PYTHONPATH")])))
    for name, value in hub_env(tmp_path, hub.url).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    config = write_config(tmp_path / "run.toml", Path("acme/tiny-chat@v1"), steps=2)
    run = start(config)
    hub.server.shutdown()  # downloaded before the run was registered: its processes need no Hub
    commit = hub.repos["model", "acme/tiny-chat"].sha
    status = wait_final(run)
    assert status["state"] == "completed" and status["step"] == 2, status
    assert status["model_path"].endswith(f"models--acme--tiny-chat/snapshots/{commit}")
    assert json.loads(run.resolved_path.read_text())["model"] == f"acme/tiny-chat@{commit}"  # the branch, pinned


def test_the_workbench_waits_for_a_download_and_shows_its_lines(tmp_path: Path) -> None:
    """The workbench's launch waits while the command prints (a download's line every few seconds), past its
    timeout, and hands each line on; a command that then exits is reported as such."""
    import subprocess
    import sys

    from prime_lab.workbench.launch import Launched, LaunchError, wait_for_run

    log = tmp_path / "launch.log"
    script = ("import sys, time\nfor i in range(4):\n    print(f'downloading acme/big: {i} GiB', flush=True)\n"
              "    time.sleep(0.4)\nsys.exit(3)")
    with log.open("ab") as out:
        process = subprocess.Popen([sys.executable, "-c", script], stdout=out, stderr=subprocess.STDOUT)
    lines: list[str] = []
    with pytest.raises(LaunchError, match="exited \\(3\\) before creating a run"):
        wait_for_run(Launched(process.pid, log, ["rl", "run"], process), RunRegistry(), timeout=1.0,
                     on_line=lines.append)
    assert lines == [f"downloading acme/big: {i} GiB" for i in range(4)]
