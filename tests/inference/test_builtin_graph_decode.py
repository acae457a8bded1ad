"""The built-in engine's fixed-shape decode (inference/builtin/graph_decode.py): the step a GPU replays as a CUDA graph.

On the CPU nothing is captured, but everything the graph replays runs: static buffers, rows padded to a bucket and
moved into the holes finished rows leave, the write column a device tensor, the mask over the whole capacity, the
buffers grown or shifted left when full. It must give the eager decode's greedy tokens and logprobs (float32) while
rows join and leave; models it cannot serve decode eagerly. "auto" settings on a (faked) GPU build a bfloat16
model and a capturing decoder; on the CPU float32 and the eager decode.
"""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from prime_lab.inference.builtin.launcher import builtin_argv, start_builtin_server
from prime_lab.inference.builtin.server import BuiltinServerSettings, runtime_plan
from tests.plugins.servers import ReferenceForward

REPO = Path(__file__).resolve().parents[2]
TOLERANCE = 1e-5  # the same float32 model, the same rows: only the summation order over padded columns differs


def run_engine(model_dir: Path, requests: list[tuple[list[int], int, int]], *, graph_decode: bool,
               max_batch_rows: int = 5) -> tuple[list[Any], Any]:
    """Greedy choices (with logprobs, top 2) of `requests` (prompt, n, max_tokens), all queued before the engine
    starts; and the engine."""
    import torch
    from transformers import AutoTokenizer

    from prime_lab.inference.builtin.adapters import ServedModel
    from prime_lab.inference.builtin.engine import GenerationEngine
    from prime_lab.inference.builtin.prompts import PromptCodec
    from prime_lab.inference.builtin.sampling import SamplingParams
    from prime_lab.inference.builtin.sequences import GenerationRequest
    from prime_lab.inference.builtin.server import load_model

    module = load_model(model_dir, torch.float32).eval()
    model = ServedModel(name="tiny", module=module, root=str(model_dir))
    engine = GenerationEngine(PromptCodec(AutoTokenizer.from_pretrained(model_dir)), frozenset(),
                              module.config.get_text_config().vocab_size, torch.device("cpu"),
                              max_batch_rows=max_batch_rows, graph_decode=graph_decode)
    futures = [
        engine.submit(GenerationRequest(prompt, n, SamplingParams(max_tokens=tokens, temperature=0.0, logprobs=True,
                                                                  top_logprobs=2, min_tokens=2), model))
        for prompt, n, tokens in requests
    ]
    engine.start()
    try:
        return [f.result(timeout=120) for f in futures], engine
    finally:
        engine.stop()


def mixed_requests(count: int, seed: int = 0) -> list[tuple[list[int], int, int]]:
    """Prompts of 3 to 3 + 4 (count - 1) tokens, n of 1 or 2, 4 to 3 count + 1 tokens: rows leave at different
    steps, and with 5 rows at most the later requests join a running batch."""
    rng = random.Random(seed)
    return [([rng.randrange(1000) for _ in range(3 + 4 * i)], 1 + i % 2, 4 + 3 * i) for i in range(count)]


def assert_same_choices(eager: list[Any], fixed: list[Any]) -> None:
    for eager_choices, fixed_choices in zip(eager, fixed, strict=True):
        for a, b in zip(eager_choices, fixed_choices, strict=True):
            assert b.token_ids == a.token_ids
            assert b.logprobs == pytest.approx(a.logprobs, abs=TOLERANCE)
            assert [[t for t, _ in top] for top in b.top_logprobs] == [[t for t, _ in top] for top in a.top_logprobs]


def test_fixed_shape_decode_matches_eager_while_rows_join_and_leave(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """9 rows through 5 at most, from 8 key/value columns up (so the buffers grow and shift while decoding)."""
    from prime_lab.inference.builtin import graph_decode

    monkeypatch.setattr(graph_decode, "MIN_CAPACITY", 8)
    joins: list[int] = []  # rows of the running batch at each join
    join = graph_decode.GraphDecodeBatch.join

    def counted_join(self: graph_decode.GraphDecodeBatch, other: Any) -> None:
        joins.append(len(self))
        join(self, other)

    monkeypatch.setattr(graph_decode.GraphDecodeBatch, "join", counted_join)
    requests = mixed_requests(6)
    eager, eager_engine = run_engine(tiny_model_dir, requests, graph_decode=False)
    fixed, engine = run_engine(tiny_model_dir, requests, graph_decode=True)
    assert_same_choices(eager, fixed)
    assert [len(c.token_ids) for choices in fixed for c in choices] == [n for _, k, n in requests for _ in range(k)]
    assert any(rows > 0 for rows in joins), "no request joined a running batch"
    assert engine.decoder.uncaptured_steps == engine.decode_steps == eager_engine.decode_steps > 0
    assert engine.decoder.capacity > 8 and engine.decoder.rows == 5


def test_a_full_buffer_drops_shared_left_padding_before_it_grows(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from prime_lab.inference.builtin import graph_decode

    def write_column(decoder: graph_decode.StaticDecoder, value: float) -> None:  # what a step writes
        decoder.keys[0][:3, :, decoder.length] = value
        decoder.mask[:3, decoder.length] = True
        decoder.length += 1
        decoder.write_index.add_(1)

    monkeypatch.setattr(graph_decode, "MIN_CAPACITY", 4)
    decoder = graph_decode.StaticDecoder(torch.device("cpu"), max_rows=4)
    keys = [torch.arange(3 * 3, dtype=torch.float32).reshape(3, 1, 3, 1) + 1]
    mask = torch.tensor([[0, 1, 1], [0, 0, 1], [0, 1, 1]])  # column 0 is padding for every row
    decoder.load(keys, [-k for k in keys], mask, torch.tensor([2, 1, 2]), torch.tensor([7, 8, 9]))
    assert (decoder.rows, decoder.capacity, decoder.length) == (4, 4, 3)
    write_column(decoder, 100.0)
    decoder.make_room()
    assert (decoder.capacity, decoder.length, int(decoder.write_index)) == (4, 3, 3)
    kept_keys, kept_values, kept_mask, positions, tokens = decoder.state()
    assert kept_keys[0][:, 0, :, 0].tolist() == [[2, 3, 100], [5, 6, 100], [8, 9, 100]]
    assert torch.equal(kept_values[0][:, :, :2], -keys[0][:, :, 1:])
    assert kept_mask.tolist() == [[True, True, True], [False, True, True], [True, True, True]]
    assert positions.tolist() == [2, 1, 2] and tokens.tolist() == [7, 8, 9]
    write_column(decoder, 200.0)
    decoder.make_room()  # no column is padding for every row now: the buffers double, the batch kept
    assert (decoder.capacity, decoder.length, int(decoder.write_index)) == (8, 4, 4)
    assert decoder.state()[0][0][:, 0, :, 0].tolist() == [[2, 3, 100, 200], [5, 6, 100, 200], [8, 9, 100, 200]]
    assert decoder.state()[2].tolist() == [[True] * 4, [False, True, True, True], [True] * 4]


def test_finished_rows_are_replaced_by_the_last_rows() -> None:
    """Leaving rows 0 and 2 of 5: rows 3 and 4 move into their holes, row 1 stays; the sequences follow."""
    import torch

    from prime_lab.inference.builtin import graph_decode

    decoder = graph_decode.StaticDecoder(torch.device("cpu"), max_rows=8)
    keys = [torch.arange(5, dtype=torch.float32).reshape(5, 1, 1, 1).expand(5, 1, 2, 1).clone()]
    decoder.load(keys, keys, torch.ones(5, 2), torch.arange(5), torch.arange(10, 15))
    decoder.move_rows([3, 4], [0, 2], 3)
    assert decoder.state()[0][0][:, 0, 0, 0].tolist() == [3.0, 1.0, 4.0]
    assert decoder.state()[4].tolist() == [13, 11, 14]


def test_models_the_fixed_shape_decode_cannot_serve_decode_eagerly(tmp_path: Path) -> None:
    from transformers import AutoConfig, Qwen3Config

    from prime_lab.inference.builtin.graph_decode import unsupported_reason
    from prime_lab.models.tiny import build_tiny_model, tiny_moe_shape

    tiny_moe_model_dir = build_tiny_model(tmp_path / "tiny-qwen3-moe", shape=tiny_moe_shape("qwen3-moe"))

    assert "Mixture-of-Experts" in str(unsupported_reason(AutoConfig.from_pretrained(tiny_moe_model_dir)))
    sliding = Qwen3Config(use_sliding_window=True, sliding_window=16, max_window_layers=0, num_hidden_layers=2)
    sliding._attn_implementation = "sdpa"
    assert "not full attention" in str(unsupported_reason(sliding))
    eager = Qwen3Config(num_hidden_layers=2)
    eager._attn_implementation = "eager"
    assert "not SDPA" in str(unsupported_reason(eager))
    requests = mixed_requests(3, seed=1)
    eager_choices, _ = run_engine(tiny_moe_model_dir, requests, graph_decode=False)
    choices, engine = run_engine(tiny_moe_model_dir, requests, graph_decode=True)
    assert_same_choices(eager_choices, choices)
    assert engine.decode_steps > 0 and engine.decoder.uncaptured_steps == 0 and engine.decoder.replays == 0


def test_auto_settings_build_bfloat16_and_cuda_graphs_on_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from prime_lab.inference.builtin.__main__ import parse_args
    from prime_lab.inference.builtin.engine import GenerationEngine

    model = Path("some-model")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    plan = runtime_plan(BuiltinServerSettings(model=model))
    assert (plan.device, plan.dtype, plan.graph_decode) == ("cuda", "bfloat16", True)
    engine = GenerationEngine(None, frozenset(), 10, torch.device(plan.device),  # type: ignore[arg-type]
                              graph_decode=plan.graph_decode)
    assert engine.decoder is not None and engine.decoder.capture, "a GPU engine captures its decode step"
    assert engine.decoder.buckets == [1, 2, 4, 8, 16, 32, 64]
    off = runtime_plan(BuiltinServerSettings(model=model, cuda_graphs="off", dtype="float32"))
    assert (off.dtype, off.graph_decode) == ("float32", False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cpu = runtime_plan(BuiltinServerSettings(model=model))
    assert (cpu.device, cpu.dtype, cpu.graph_decode) == ("cpu", "float32", False)
    assert GenerationEngine(None, frozenset(), 10, torch.device("cpu")).decoder is None  # type: ignore[arg-type]
    on_cpu = GenerationEngine(None, frozenset(), 10, torch.device("cpu"), graph_decode=True)  # type: ignore[arg-type]
    assert on_cpu.decoder is not None and not on_cpu.decoder.capture
    with pytest.raises(ValueError, match="cuda_graphs 'yes' is not one of auto, on, off"):
        runtime_plan(BuiltinServerSettings(model=model, cuda_graphs="yes"))
    args = parse_args(["--model", "m"])
    assert (args.dtype, args.cuda_graphs) == ("auto", "auto")
    argv = builtin_argv(BuiltinServerSettings(model=model, cuda_graphs="off"), port=1234)
    assert argv[argv.index("--cuda-graphs") + 1] == "off" and argv[argv.index("--dtype") + 1] == "auto"
    assert parse_args(argv[argv.index("--model"):]).cuda_graphs == "off"


def test_a_server_with_cuda_graphs_on_serves_the_models_logprobs(
    tiny_model_dir: Path, reference_forward: ReferenceForward, tmp_path: Path
) -> None:
    """Through the CLI flag and the real server on the CPU: n choices sampled through the fixed-shape decode carry
    the float32 model's logprobs."""
    import openai

    settings = BuiltinServerSettings(model=tiny_model_dir, served_model_name="tiny-fixed", max_model_len=2048,
                                     cuda_graphs="on")
    server = start_builtin_server(settings, log_path=tmp_path / "server.log", timeout=120)
    try:
        client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)
        body = client.completions.create(model="tiny-fixed", prompt=[5, 6, 7, 8], n=4, max_tokens=12, logprobs=1,
                                         seed=3, extra_body={"return_token_ids": True}).model_dump()
    finally:
        server.stop()
    assert "fixed-shape decode" in (tmp_path / "server.log").read_text()
    for choice in body["choices"]:
        assert len(choice["token_ids"]) == 12 or choice["finish_reason"] == "stop"
        expected = reference_forward.logprobs([5, 6, 7, 8], choice["token_ids"])
        assert choice["logprobs"]["token_logprobs"] == pytest.approx(expected, abs=1e-4)


@pytest.mark.slow
def test_the_decode_bench_runs_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "decode.json"
    result = subprocess.run([sys.executable, str(REPO / "bench" / "sampler.py"), "--decode", "--tiny", "--tokens", "6",
                             "--rounds", "1", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "eager / graphs, ms per decode step" in result.stdout
    import json

    rows = {r["mode"]: r for r in json.loads(out.read_text())["decode"]}
    assert set(rows) == {"eager", "graphs", "graphs-new-model"}
    assert all(r["ms_per_step"] > 0 and r["tokens_per_s"] > 0 for r in rows.values())


def test_an_adapter_merges_under_the_device_lock_and_draws_nothing(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A capture records whatever touches the device, from any thread: an adapter merges while holding the lock a
    capture takes, and its LoRA layers take the adapter's tensors without a random initialisation (a draw from the
    default generator, which a capture holds in capture mode)."""
    import torch

    from prime_lab.inference.builtin.adapters import ModelRegistry, ServedModel
    from prime_lab.inference.builtin.server import load_model
    from prime_lab.models.random_lora import build_random_lora_adapter

    adapter = build_random_lora_adapter(tiny_model_dir, tmp_path / "adapter", seed=1)
    base = ServedModel(name="base", module=load_model(tiny_model_dir, torch.float32).eval(), root=str(tiny_model_dir))
    held: list[bool] = []
    registry = ModelRegistry(base, prepare=lambda module: held.append(registry.device_lock.locked()) or module)
    state = torch.get_rng_state()
    registry.load_adapter("policy", str(adapter))
    assert held == [True] and not registry.device_lock.locked()
    assert torch.equal(torch.get_rng_state(), state)  # no random initialisation of the LoRA layers


def test_a_capture_waits_for_an_adapter_merge() -> None:
    """While the device lock is held (an adapter merging), a step that would capture runs uncaptured instead, and
    capturing stays on for a later step."""
    import threading

    import torch

    from prime_lab.inference.builtin.graph_decode import StaticDecoder

    lock = threading.Lock()
    decoder = StaticDecoder(torch.device("cpu"), 8, lock)
    decoder.capture = True  # as on a GPU; the capture itself never starts here
    with lock:
        assert decoder._capture(object(), 8) is None
    assert decoder.capture and decoder.captures == 0


def test_unseeded_draws_leave_the_default_generator_alone() -> None:
    """Sampling draws from the server's own generator: a graph capture holds torch's default generator in capture
    mode (and leaves it there if it fails half-way), which would fail every later draw from it."""
    import torch

    from prime_lab.inference.builtin.sampling import RowSampling, SamplingParams, sample

    rows = RowSampling.build([SamplingParams(max_tokens=1)] * 4, [None] * 4, torch.device("cpu"))
    logits = torch.randn(4, 32)
    state = torch.get_rng_state()
    sampled = sample(logits, rows)
    assert torch.equal(torch.get_rng_state(), state)
    assert sampled.tokens.shape == (4,) and bool((sampled.tokens < 32).all())
