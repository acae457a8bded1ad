"""Full fine-tuning computing in bfloat16 keeps float32 master weights (trainer/model.py `Precision`): AdamW's update
of a bfloat16 weight rounds to nothing at a learning rate of 1e-6. On CUDA that is the default (`[trainer] dtype =
"auto"`); `dtype = "bfloat16"` on the CPU takes the same path (float32 weights, the forward autocast to bfloat16), so
these tests drive the CUDA decision with a real model here. The CPU's default stays float32 throughout."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from prime_lab.trainer.batch import Sample
from prime_lab.trainer.runtime import step_dirs
from tests.support.trainer_runs import base_batches, config_text, new_run, random_batch, train, weights

LR = 1e-6


@pytest.mark.parametrize(("dtype", "device", "trainable", "expected"), [
    ("auto", "cuda", True, ("float32", "bfloat16", True)),  # full fine-tuning on a GPU: float32 masters
    ("auto", "cuda:1", False, ("bfloat16", "bfloat16", False)),  # the frozen KL reference stays bfloat16
    ("auto", "cpu", True, ("float32", "float32", False)),  # the CPU as before: float32, no autocast
    ("auto", "cpu", False, ("float32", "float32", False)),
    ("float32", "cuda", True, ("float32", "float32", False)),
    ("bfloat16", "cpu", True, ("float32", "bfloat16", True)),
])
def test_precision_by_device_and_setting(dtype: str, device: str, trainable: bool,
                                         expected: tuple[str, str, bool]) -> None:
    from prime_lab.trainer.model import pick_precision

    precision = pick_precision(dtype, device, trainable=trainable)
    got = (str(precision.params).removeprefix("torch."), str(precision.compute).removeprefix("torch."),
           precision.autocast)
    assert got == expected


def test_fsdp_gathers_master_weights_in_bfloat16_and_reduces_in_float32() -> None:
    from prime_lab.trainer.model import mixed_precision, pick_precision

    policy = mixed_precision(pick_precision("auto", "cuda", trainable=True))
    assert policy is not None and policy.param_dtype == torch.bfloat16 and policy.reduce_dtype == torch.float32
    assert mixed_precision(pick_precision("auto", "cuda", trainable=False)) is None  # the reference: as it is
    assert mixed_precision(pick_precision("auto", "cpu", trainable=True)) is None
    assert mixed_precision(None) is None  # LoRA


def adamw_step(weight: torch.Tensor, *, autocast: bool) -> torch.Tensor:
    """One AdamW step at LR of a Linear holding `weight`, its forward under CPU autocast to bfloat16 or not."""
    import contextlib

    layer = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    layer.weight.data = weight.clone()
    optimizer = torch.optim.AdamW(layer.parameters(), lr=LR, weight_decay=0.0)
    x = torch.randn(8, weight.shape[1], generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext():
        y = layer(x.to(weight.dtype))
    assert y.dtype == torch.bfloat16  # computed in bfloat16 either way
    y.float().pow(2).mean().backward()
    optimizer.step()
    return layer.weight.detach()


def test_a_1e_minus_6_step_moves_float32_masters_and_not_bfloat16_weights() -> None:
    start = torch.randn(16, 32, generator=torch.Generator().manual_seed(0)) * 0.05 + 0.5  # weights ~0.5
    masters = adamw_step(start, autocast=True)
    assert masters.dtype == torch.float32 and (masters != start).float().mean() > 0.99
    plain = adamw_step(start.to(torch.bfloat16), autocast=False)
    assert plain.equal(start.to(torch.bfloat16))  # the failure of pure bfloat16: every update rounds away


def test_full_policy_in_bfloat16_keeps_float32_masters_and_a_1e_minus_6_step_moves_them(
        tiny_model_dir: Path) -> None:
    """The product's path: load_full_policy computing in bfloat16 (as on CUDA), one batch through
    accumulate_batch_gradients (chunked LM head, autocast forward), one AdamW step at 1e-6: every weight moves."""
    from prime_lab.trainer.model import accumulate_batch_gradients, load_full_policy

    model = load_full_policy(tiny_model_dir, dtype="bfloat16")
    seen: list[torch.dtype] = []
    hook = model.model.layers[0].mlp.down_proj.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    samples = random_batch(model.config.vocab_size)
    result = accumulate_batch_gradients(model, samples, device="cpu", micro_batch_size=2, loss="sft")
    hook.remove()
    assert seen and set(seen) == {torch.bfloat16}  # the forward computed in bfloat16
    assert math.isfinite(result.loss) and result.loss > 0
    optimizer.step()
    moved = [n for n, p in model.named_parameters() if not p.detach().equal(start[n])]
    assert moved == list(start)
    assert {p.dtype for p in model.parameters()} == {torch.float32}  # masters, and their gradients
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters())


@pytest.fixture(scope="module")
def batches(tiny_model_dir: Path) -> list[list[Sample]]:
    return base_batches(tiny_model_dir, 2)


def test_trainer_publishes_bfloat16_and_checkpoints_the_float32_masters(tiny_model_dir: Path,
                                                                        batches: list[list[Sample]]) -> None:
    """A full fine-tuning run computing in bfloat16 at 1e-6: the published versions (what the sampler loads) are in
    bfloat16, as the base model on CUDA, and have moved; the checkpoint holds the float32 master weights."""
    text = config_text(tiny_model_dir, steps=2).replace("learning_rate = 1e-3", f"learning_rate = {LR}")
    run = new_run(tiny_model_dir, text.replace("[trainer]\n", '[trainer]\ndtype = "bfloat16"\n'), batches)
    trainer = train(run, tiny_model_dir)
    masters = dict(trainer.model.named_parameters())
    assert {p.dtype for p in masters.values()} == {torch.float32}
    published = step_dirs(run.dir / "weights")[2]
    assert json.loads((published / "config.json").read_text())["dtype"] == "bfloat16"
    sampled = weights(published)
    assert {t.dtype for t in sampled.values()} == {torch.bfloat16}
    assert "lm_head.weight" not in sampled  # the tied head saved once, as before
    for name, tensor in sampled.items():
        assert tensor.equal(masters[name].detach().to(torch.bfloat16)), name
    checkpoint = weights(run.checkpoints_dir / "step_2")
    base = weights(tiny_model_dir)
    for name, tensor in checkpoint.items():
        assert tensor.dtype == torch.float32 and tensor.equal(masters[name].detach()), name
    moved = [n for n, t in checkpoint.items() if not t.equal(base[n].float())]
    assert moved == list(checkpoint)


def test_fsdp_shards_float32_masters_computes_in_bfloat16_and_publishes_bfloat16(tiny_model_dir: Path,
                                                                                 tmp_path: Path) -> None:
    """FSDP2 (a gloo group of one process) under `shard_model`: the forward sees bfloat16 weights without autocast,
    the shards and their gradients stay float32, a 1e-6 step moves every shard, and the gathered weights are
    published in bfloat16."""
    import socket

    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from prime_lab.trainer.model import load_full_policy, precision_of, shard_model, token_logprobs
    from prime_lab.trainer.versions import save_weights

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        model = load_full_policy(tiny_model_dir, dtype="bfloat16")
        shard_model(model)
        precision = precision_of(model)
        assert precision is not None and not precision.autocast  # FSDP casts the gathered weights instead
        seen: list[torch.dtype] = []
        model.model.layers[0].mlp.down_proj.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
        ids = torch.randint(0, model.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0))
        logprobs, _ = token_logprobs(model, ids, torch.ones_like(ids))
        logprobs.sum().backward()
        assert seen == [torch.bfloat16]
        shards = {n: p.to_local() for n, p in model.named_parameters()}
        assert {t.dtype for t in shards.values()} == {torch.float32}
        assert all(p.grad is not None and p.grad.to_local().dtype == torch.float32 for p in model.parameters())
        start = {n: t.detach().clone() for n, t in shards.items()}
        torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0).step()
        assert [n for n, p in model.named_parameters() if not p.to_local().equal(start[n])] == list(start)
        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        save_weights(model, tmp_path, state)
        assert {t.dtype for t in weights(tmp_path).values()} == {torch.bfloat16}
    finally:
        dist.destroy_process_group()
