"""Full fine-tuning's weight path on the real vLLM (CPU build here): a server started with LoRA off, our worker
extension and the developer routes (`VLLMSettings.taking_full_weights`) takes a trainer's whole-model folder in
place (`RuntimeWeights`: `/collective_rpc` -> `WeightUpdateExtension.update_weights_from_path`, then
`/reset_prefix_cache`, and a `cache_salt` per version for requests sent while others run), checked against float32
forward passes of those weights.

Its own server, for this module only: new weights would disturb the session's `vllm_server`.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from prime_lab.inference.control import RuntimeWeights, WeightLoadError
from prime_lab.inference.vllm import (
    VLLMNotInstalledError,
    VLLMServer,
    VLLMSettings,
    start_vllm,
    vllm_installed,
)
from tests.inference.full_weights import (
    LOGPROB_TOLERANCE,
    max_logprob_error,
    sampled,
    weight_versions,
)
from tests.plugins.servers import ReferenceForward

NAME = "tiny-full"
__all__ = ["weight_versions"]  # the module fixture: new weights for the tiny model


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    if not vllm_installed():
        pytest.skip(str(VLLMNotInstalledError()))
    settings = VLLMSettings(model=tiny_model_dir, served_model_name=NAME, max_model_len=4096,
                            cpu_kv_cache_gib=1).taking_full_weights()
    started = start_vllm(settings, log_path=tmp_path_factory.mktemp("vllm") / "vllm-full.log", timeout=300)
    try:
        sampled(started.base_url, NAME, max_tokens=1)  # the slow first request (warm-up)
    except BaseException:
        started.stop()
        raise
    yield started
    started.stop()


def test_a_full_weights_server_runs_without_lora_with_the_extension_and_the_developer_routes(
    tiny_model_dir: Path,
) -> None:
    from prime_lab.inference.vllm import vllm_argv, vllm_env
    from prime_lab.inference.vllm_worker import WeightUpdateExtension
    from prime_lab.inference.weights import UPDATE_METHOD

    settings = VLLMSettings(model=tiny_model_dir).taking_full_weights()
    argv, env = vllm_argv(settings, 8123, on_gpu=False), vllm_env(settings, on_gpu=False)
    assert "--enable-lora" not in argv and env["VLLM_SERVER_DEV_MODE"] == "1"
    assert argv[argv.index("--worker-extension-cls") + 1] == "prime_lab.inference.vllm_worker.WeightUpdateExtension"
    assert callable(getattr(WeightUpdateExtension, UPDATE_METHOD))  # the method RuntimeWeights calls by name
    lora = VLLMSettings(model=tiny_model_dir)
    assert "--worker-extension-cls" not in vllm_argv(lora, 8123, on_gpu=False)
    assert "VLLM_SERVER_DEV_MODE" not in vllm_env(lora, on_gpu=False)


@pytest.mark.slow  # a vLLM server takes about a minute to start on 2 cores
def test_new_weights_are_served_in_place(
    server: VLLMServer, weight_versions: list[Path], tiny_model_dir: Path
) -> None:
    """Each load moves vLLM to exactly the new weights: the tied LM head's prepacked copy rebuilt (without it the
    logits come from the old matrix) and the prefix cache dropped (the same long prompt is sent before and after
    every load, so a cached prompt from the old weights would show)."""
    base = ReferenceForward(tiny_model_dir)
    assert max_logprob_error(sampled(server.base_url, NAME), base) < LOGPROB_TOLERANCE
    weights = RuntimeWeights(server.root_url)
    for folder in [*weight_versions, tiny_model_dir]:
        result = weights.load(folder)
        assert result and result[0]["repacked_embeddings"] >= 1, result
        body = sampled(server.base_url, NAME)
        assert max_logprob_error(body, ReferenceForward(folder)) < LOGPROB_TOLERANCE
        if folder != tiny_model_dir:
            assert max_logprob_error(body, base) > 0.05  # the weights really changed


@pytest.mark.slow  # a vLLM server takes about a minute to start on 2 cores
def test_requests_in_flight_finish_and_salted_later_ones_use_the_new_weights(
    server: VLLMServer, weight_versions: list[Path], tiny_model_dir: Path
) -> None:
    """Loading while seeded requests decode (as an RL run's do): they run to their end on the new weights (no
    preemption: vLLM's CPU build crashes its engine when it preempts a seeded request), and a request sent after
    the load with a new `cache_salt`, as the orchestrator sends them, is served with exactly the new weights though
    the requests in flight kept the same prompt's old cache blocks."""
    def long_request(seed: int) -> tuple[dict[str, Any], float]:
        return sampled(server.base_url, NAME, max_tokens=3500, seed=seed, salt="before"), time.monotonic()

    try:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            running = [pool.submit(long_request, seed) for seed in range(4)]
            time.sleep(1.0)  # decoding
            ended = [r.exception() or "finished" for r in running if r.done()]
            assert not ended, f"the requests ended before the update (make them longer if they finished): {ended}"
            load_started = time.monotonic()
            RuntimeWeights(server.root_url).load(weight_versions[1])
            after = sampled(server.base_url, NAME, salt="after")
            results = [r.result() for r in running]
        # in flight when the update began (when load() returns is later: on a busy machine some had ended by then)
        assert all(finished > load_started for _, finished in results)
        for body, _ in results:
            assert [c["finish_reason"] for c in body["choices"]] == ["length", "length"]
            assert all(len(c["token_ids"]) == 3500 == len(c["logprobs"]["content"]) for c in body["choices"])
        assert max_logprob_error(after, ReferenceForward(weight_versions[1])) < LOGPROB_TOLERANCE
    finally:
        RuntimeWeights(server.root_url).load(tiny_model_dir)


@pytest.mark.slow  # a vLLM server takes about a minute to start on 2 cores
def test_a_folder_without_weights_is_refused_and_the_server_keeps_serving(
    server: VLLMServer, tiny_model_dir: Path, tmp_path: Path
) -> None:
    with pytest.raises(WeightLoadError):
        RuntimeWeights(server.root_url).load(tmp_path)
    assert httpx.get(server.root_url + "/health", timeout=10).status_code == 200
    assert max_logprob_error(sampled(server.base_url, NAME), ReferenceForward(tiny_model_dir)) < LOGPROB_TOLERANCE


def test_a_server_without_the_routes_is_named_with_the_fix(tmp_path: Path) -> None:
    """A sampler that cannot take full weights (vLLM started for LoRA, an external server) fails the load with what
    to start instead, not a bare 404. The stand-in answers every POST as such a vLLM does."""
    import http.server
    import threading

    class NoDevRoutes(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.send_response(404)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"detail": "Not Found"}')

        def log_message(self, *args: object) -> None:
            pass

    stand_in = http.server.HTTPServer(("127.0.0.1", 0), NoDevRoutes)
    threading.Thread(target=stand_in.serve_forever, daemon=True).start()
    try:
        with pytest.raises(WeightLoadError, match="taking_full_weights"):
            RuntimeWeights(f"http://127.0.0.1:{stand_in.server_port}").load(tmp_path)
    finally:
        stand_in.shutdown()
