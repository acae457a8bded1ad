"""A Hugging Face model id that is not on the machine is downloaded from the Hub (a loopback one the test starts),
once, safetensors and the config and tokenizer files only; afterwards it resolves offline. A gated model, a missing
one, a dropped connection and no network each end in one line (or, for the drop, a finished download); Ctrl-C keeps
the file cut mid-way, and the next command resumes it."""

from __future__ import annotations

import hashlib
import io
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from prime_lab.models import ModelNotFoundError, resolve_model
from prime_lab.models.resolve import local_model_folder, obtain_model
from tests.support.cli import PRIME
from tests.support.hf_hub import HubRepo, LoopbackHub, files_of, loopback_hub

MIB = 1024 * 1024
BIG_WEIGHTS = bytes(range(256)) * (24 * MIB // 256)


@pytest.fixture
def hub(tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LoopbackHub]:
    files = {**files_of(tiny_model_dir), "pytorch_model.bin": b"old weights", "README.md": b"# tiny",
             "onnx/model.onnx": b"onnx"}
    repos = [HubRepo("acme/tiny-chat", files, revisions=("main", "v1")),
             HubRepo("acme/gated-chat", files_of(tiny_model_dir), token="hf_letmein"),
             HubRepo("acme/dropped-chat", {**files_of(tiny_model_dir), "model.safetensors": BIG_WEIGHTS},
                     drop_after={"model.safetensors": 12 * MIB}),
             HubRepo("acme/stalled-chat", {**files_of(tiny_model_dir), "model.safetensors": BIG_WEIGHTS},
                     stall_after={"model.safetensors": 12 * MIB})]
    for name in ("HF_HUB_OFFLINE", "HF_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    with loopback_hub(repos) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


def test_a_hub_id_downloads_once_and_then_resolves_offline(hub: LoopbackHub, tiny_model_dir: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    assert local_model_folder("acme/tiny-chat") is None
    out = io.StringIO()
    folder = obtain_model("acme/tiny-chat", out=out)
    repo = hub.repos["model", "acme/tiny-chat"]
    assert folder == Path(str(Path.cwd() / folder)) and folder.name == repo.sha
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        name for name in files_of(tiny_model_dir))  # no .bin, README or onnx/
    assert (folder / "model.safetensors").read_bytes() == (tiny_model_dir / "model.safetensors").read_bytes()
    lines = out.getvalue().splitlines()  # not a terminal: plain lines, the first naming what comes
    assert lines[0].startswith(f"downloading acme/tiny-chat at {repo.sha[:12]} from {hub.url}: ")
    assert lines[-1].startswith("downloaded acme/tiny-chat: ")
    asked = len(hub.requests)
    assert obtain_model("acme/tiny-chat") == folder and len(hub.requests) == asked  # once per process
    pinned = obtain_model("acme/tiny-chat@v1")  # a revision: the same commit, through refs/v1
    assert pinned == folder and len(hub.requests) > asked
    hub.server.shutdown()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_model("acme/tiny-chat") == folder == resolve_model(f"acme/tiny-chat@{repo.sha}")
    assert local_model_folder("acme/tiny-chat@v1") == folder

    from transformers import AutoConfig, AutoTokenizer

    assert AutoConfig.from_pretrained(folder).model_type == "qwen3"
    assert AutoTokenizer.from_pretrained(folder).encode("hi")


def test_a_gated_model_names_the_page_and_the_token_variable(hub: LoopbackHub) -> None:
    with pytest.raises(ModelNotFoundError) as raised:
        obtain_model("acme/gated-chat", out=io.StringIO())
    line = str(raised.value)
    assert line == (f"model 'acme/gated-chat' is gated on the Hugging Face Hub: accept its terms at {hub.url}/"
                    "acme/gated-chat while logged in, then give a token of that account in HF_TOKEN (export "
                    "HF_TOKEN=hf_..., or `prime secret create -n HF_TOKEN`)")
    assert local_model_folder("acme/gated-chat") is None  # nothing half-made is taken for the model
    folder = obtain_model("acme/gated-chat", token="hf_letmein", out=io.StringIO())
    assert (folder / "model.safetensors").is_file()


def test_a_missing_model_says_so_with_names_from_the_cache(hub: LoopbackHub) -> None:
    obtain_model("acme/tiny-chat", out=io.StringIO())
    with pytest.raises(ModelNotFoundError) as raised:
        obtain_model("acme/tiny-caht", out=io.StringIO())
    assert str(raised.value) == (f"model 'acme/tiny-caht' is not on the Hugging Face Hub ({hub.url}); did you mean "
                                 "'acme/tiny-chat' (in your Hugging Face cache)?; a private one needs HF_TOKEN "
                                 "(export HF_TOKEN=hf_..., or `prime secret create -n HF_TOKEN`)")
    with pytest.raises(ModelNotFoundError, match="has no revision 'v9'"):
        obtain_model("acme/tiny-chat@v9", out=io.StringIO())


def test_a_dropped_connection_resumes_where_it_stopped(hub: LoopbackHub) -> None:
    folder = obtain_model("acme/dropped-chat", out=io.StringIO())  # the first GET of the weights is cut at 12 MiB
    assert (folder / "model.safetensors").read_bytes() == BIG_WEIGHTS
    gets = hub.file_gets("model.safetensors")
    assert [g.range for g in gets] == [None, f"bytes={12 * MIB}-"], gets  # from the last byte it got


def test_ctrl_c_keeps_the_file_cut_midway_and_the_same_command_resumes_it(hub: LoopbackHub, tmp_path: Path) -> None:
    # a real `prime serve` downloading the weights, which the Hub stops sending after 12 MiB; Ctrl-C when they are on
    # disk
    partial = (tmp_path / "hf-cache" / "models--acme--stalled-chat" / "blobs" /
               f"{hashlib.sha256(BIG_WEIGHTS).hexdigest()}.incomplete")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    serve = subprocess.Popen([PRIME, "serve", "acme/stalled-chat", "--port", port], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (partial.exists() and partial.stat().st_size >= 12 * MIB):
            assert serve.poll() is None and time.monotonic() < deadline, serve.communicate()
            time.sleep(0.05)
        interrupted = time.monotonic()
        serve.send_signal(signal.SIGINT)
        out, err = serve.communicate(timeout=30)
    finally:
        serve.kill()
    assert time.monotonic() - interrupted < 5  # at once, not when the stalled transfer gives up
    assert serve.returncode == 130 and out == "" and "Traceback" not in err, err
    assert err.splitlines()[-1] == ("Error: the download of acme/stalled-chat was interrupted; run the same command "
                                    "again to go on from where it stopped (what was downloaded is kept)"), err
    assert partial.stat().st_size == 12 * MIB
    folder = obtain_model("acme/stalled-chat", out=io.StringIO())  # the next command
    assert (folder / "model.safetensors").read_bytes() == BIG_WEIGHTS and not partial.exists()
    assert [g.range for g in hub.file_gets("model.safetensors") if "stalled" in g.path] == [None, f"bytes={12 * MIB}-"]


def test_no_network_is_one_line_within_seconds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)  # accepts and never answers
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setenv("HF_ENDPOINT", url)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
        started = time.monotonic()
        with pytest.raises(ModelNotFoundError) as raised:
            obtain_model("acme/not-here@v2")
        assert time.monotonic() - started < 3
    line = str(raised.value)
    assert "\n" not in line and line.startswith(f"model 'acme/not-here@v2' is not on this machine and the Hugging "
                                                f"Face Hub at {url} cannot be reached (")
    assert "`hf download acme/not-here --revision v2`" in line
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError, match="and HF_HUB_OFFLINE is set: run `hf download acme/not-here`"):
        obtain_model("acme/not-here")
