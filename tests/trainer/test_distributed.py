"""The trainer past one process: 2 gloo ranks under torchrun compute the update 1 process computes on the same batch.

Each case runs the real `Trainer` (tests/trainer/dist_worker.py) once as one plain process and once as two torchrun
ranks, on the same batches and starting weights, and compares the gradients of the step (after clipping, before
the optimizer: summing instead of averaging over the ranks, or a rank training on its own rows only, shows here;
Adam's first step, about lr * sign(g), would hide it), the trainer's gradient norm and loss, and the published
weights. Rank 0 alone writes: one metrics event per step, one checkpoint event, one version folder per step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from prime_lab.runs.registry import Run
from prime_lab.trainer.batch import Sample
from prime_lab.trainer.config import TrainerConfig
from prime_lab.trainer.distributed import Topology, TopologyError, shard_rows, strategy, topology, torchrun_argv
from prime_lab.trainer.packing import PackedRow
from prime_lab.trainer.runtime import step_dirs
from tests.support.trainer_runs import base_batches, config_text, new_run, trainer_metrics, weights

REPO = Path(__file__).resolve().parents[2]


# Pure logic ----------------------------------------------------------------------------------------------------
def test_the_prime_rl_variables_are_per_node_and_win_over_the_config() -> None:
    config = TrainerConfig(nproc_per_node=4, nnodes=1, node_rank=0, master_addr="10.0.0.1")
    assert topology(config, {}) == Topology(4, 1, 0, "10.0.0.1", None)
    topo = topology(config, {"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "node0", "MASTER_PORT": "29600"})
    assert topo == Topology(4, 2, 1, "node0", 29600) and topo.world_size == 8 and not topo.runs_sampler
    assert topology(TrainerConfig(nnodes=2), {}).master_port == 29500  # several machines need a known port
    with pytest.raises(TopologyError, match="RANK = 2"):
        topology(config, {"WORLD_SIZE": "2", "RANK": "2"})
    with pytest.raises(TopologyError, match="WORLD_SIZE='two'"):
        topology(config, {"WORLD_SIZE": "two"})


def test_torchrun_arguments() -> None:
    one = torchrun_argv(Topology(2), "prime_lab.trainer.train", ["RUN"])
    assert one[:2] == ["torch.distributed.run", "--standalone"] and one[-3:] == ["-m", "prime_lab.trainer.train", "RUN"]
    assert "--nproc-per-node" in one and one[one.index("--nproc-per-node") + 1] == "2"
    many = torchrun_argv(Topology(8, 2, 1, "node0", 29500), "m", [])
    for flag, value in (("--nnodes", "2"), ("--node-rank", "1"), ("--master-addr", "node0"),
                        ("--master-port", "29500"), ("--max-restarts", "0")):
        assert many[many.index(flag) + 1] == value


def test_each_rank_gets_its_rows_and_as_many_passes_as_the_others() -> None:
    rows = [PackedRow(input_ids=[i]) for i in range(5)]
    shares = [shard_rows(rows, rank, 2) for rank in range(2)]
    assert [[r.input_ids[0] for r, w in share if w] for share in shares] == [[0, 2, 4], [1, 3]]
    assert [len(share) for share in shares] == [3, 3] and shares[1][-1][1] == 0.0
    assert shard_rows([], 0, 2) == []
    assert strategy(TrainerConfig(), lora=True) == "ddp" and strategy(TrainerConfig(), lora=False) == "fsdp"
    assert strategy(TrainerConfig(distributed="ddp"), lora=False) == "ddp"


def test_fsdp_with_lora_is_refused_and_nodes_are_checked() -> None:
    from prime_lab.trainer.config import validate_rl_config

    text = config_text(Path("/m")).replace("enabled = false", "enabled = true")
    result = validate_rl_config(text.replace("micro_batch_size = 2", 'micro_batch_size = 2\ndistributed = "fsdp"'))
    assert [p.key for p in result.errors] == ["trainer.distributed"]
    result = validate_rl_config(text.replace("micro_batch_size = 2", "micro_batch_size = 2\nnnodes = 2\nnode_rank = 2"))
    assert [p.key for p in result.errors] == ["trainer.node_rank"]


# Two gloo ranks against one process --------------------------------------------------------------------------------
def run_ranks(run: Run, model: Path, out: Path, nproc: int, *resume: str) -> None:
    argv = ["tests.trainer.dist_worker", str(run.dir), str(model), str(out), *resume]
    if nproc > 1:
        argv = torchrun_argv(Topology(nproc), argv[0], argv[1:])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", *argv], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def trainer_events(run: Run, kind: str) -> list[Any]:
    return [e for e in run.event_log().events() if e.source == "trainer" and e.kind == kind]


def assert_same_update(one: Run, two: Run, out: Path, folder: str, step: int) -> None:
    import torch

    g1, g2 = torch.load(out / "one.pt"), torch.load(out / "two.pt")
    assert g1.keys() == g2.keys() and g1
    nonzero = 0
    for name, grad in g1.items():
        torch.testing.assert_close(g2[name], grad, rtol=1e-4, atol=1e-7, msg=name)
        nonzero += bool(grad.abs().max() > 0)
    assert nonzero > len(g1) // 2  # not a comparison of zeros
    m1, m2 = trainer_metrics(one)[step], trainer_metrics(two)[step]
    for key in ("optim/grad_norm", "loss", "policy/entropy", "train/loss_tokens"):
        assert m2[key] == pytest.approx(m1[key], rel=1e-4, abs=1e-7), key
    w1, w2 = load_folder(one.dir / folder / f"step_{step}"), load_folder(two.dir / folder / f"step_{step}")
    assert w1.keys() == w2.keys()
    for name, tensor in w1.items():
        torch.testing.assert_close(w2[name], tensor, rtol=1e-4, atol=1e-6, msg=name)


def load_folder(folder: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    files = list(folder.glob("*.safetensors"))
    assert len(files) == 1, folder
    return load_file(str(files[0]))


@pytest.fixture(scope="module")
def batches(tiny_model_dir: Path) -> list[list[Sample]]:
    """Two steps of 3 groups of 2 (3 packed rows of 2: uneven over 2 ranks, one of them pads a pass)."""
    return [b + b[:2] for b in base_batches(tiny_model_dir, 2)]


@pytest.mark.slow
def test_two_ddp_ranks_compute_the_lora_update_of_one_process(tiny_model_dir: Path, tmp_path: Path,
                                                              batches: list[list[Sample]]) -> None:
    from prime_lab.models.random_lora import build_random_lora_adapter

    # a warm start whose B is not zero, so every LoRA matrix gets a gradient (a fresh adapter's A gets none)
    adapter = build_random_lora_adapter(tiny_model_dir, tmp_path / "start", rank=16, alpha=16, seed=3, b_std=0.05)
    text = config_text(tiny_model_dir, steps=1, extra=f'checkpoint_id = "{adapter}"').replace(
        "enabled = false", "enabled = true")
    one, two = (new_run(tiny_model_dir, text, batches[:1]) for _ in range(2))
    run_ranks(one, tiny_model_dir, tmp_path / "one.pt", 1)
    run_ranks(two, tiny_model_dir, tmp_path / "two.pt", 2)
    assert_same_update(one, two, tmp_path, "adapters", 1)
    # rank 0 alone wrote: one metrics event, one checkpoint, one adapter per version
    assert len(trainer_events(two, "metrics")) == 1 and len(trainer_events(two, "checkpoint")) == 1
    assert sorted(step_dirs(two.adapters_dir)) == [0, 1] and sorted(step_dirs(two.checkpoints_dir)) == [1]
    assert not list(two.adapters_dir.glob(".*")) and not list(two.checkpoints_dir.glob(".*"))
    ready = [e.data["message"] for e in trainer_events(two, "log") if "trainer ready" in e.data["message"]]
    assert len(ready) == 1 and "x 2 ranks (DDP, gloo)" in ready[0]


@pytest.mark.slow
def test_two_fsdp_ranks_compute_the_full_update_of_one_process_and_resume(tiny_model_dir: Path, tmp_path: Path,
                                                                          batches: list[list[Sample]]) -> None:
    import torch

    one, two = (new_run(tiny_model_dir, config_text(tiny_model_dir, steps=1), batches) for _ in range(2))
    run_ranks(one, tiny_model_dir, tmp_path / "one.pt", 1)
    run_ranks(two, tiny_model_dir, tmp_path / "two.pt", 2)
    assert_same_update(one, two, tmp_path, "weights", 1)
    ready = [e.data["message"] for e in trainer_events(two, "log") if "trainer ready" in e.data["message"]]
    assert "x 2 ranks (FSDP, gloo)" in ready[0]
    n_params = sum(p.numel() for p in weights(one.dir / "weights" / "step_1").values())
    assert f"({n_params:,} trainable" in ready[0]  # counted over the shards, the tied head once
    checkpoint = two.checkpoints_dir / "step_1"
    assert (checkpoint / "dcp" / ".metadata").is_file() and (checkpoint / "model.safetensors").is_file()
    assert torch.load(checkpoint / "trainer_state.pt", weights_only=False)["world_size"] == 2

    # Resume both for step 2 (Adam's moments come back from the distributed checkpoint): still the same update
    for run in (one, two):
        resolved = json.loads(run.resolved_path.read_text())
        run.resolved_path.write_text(json.dumps({**resolved, "max_steps": 2}))
    run_ranks(one, tiny_model_dir, tmp_path / "one.pt", 1, "--resume")
    run_ranks(two, tiny_model_dir, tmp_path / "two.pt", 2, "--resume")
    assert_same_update(one, two, tmp_path, "weights", 2)

    # a distributed checkpoint resumes on as many ranks only: one process says what to set
    argv = ["-m", "tests.trainer.dist_worker", str(two.dir), str(tiny_model_dir), str(tmp_path / "x.pt"), "--resume"]
    done = subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode != 0 and "written by 2 FSDP ranks" in done.stdout + done.stderr
    # nor does one process's optimizer state resume on FSDP ranks
    argv = torchrun_argv(Topology(2), "tests.trainer.dist_worker", [str(one.dir), str(tiny_model_dir),
                                                                     str(tmp_path / "x.pt"), "--resume"])
    done = subprocess.run([sys.executable, "-m", *argv], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    assert done.returncode != 0 and "written by 1 process(es) without FSDP" in done.stdout + done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("lora", [True, False], ids=["ddp-lora", "fsdp-full"])
def test_two_ranks_with_activation_checkpointing_compute_the_update_of_one_process_without(
        tiny_model_dir: Path, tmp_path: Path, batches: list[list[Sample]], lora: bool) -> None:
    """`[trainer] activation_checkpointing` under DDP and FSDP2 (layers recomputed inside the sharded or
    replicated model): the same gradients and weights as one process that keeps its activations."""
    from prime_lab.models.random_lora import build_random_lora_adapter

    text = config_text(tiny_model_dir, steps=1)
    if lora:
        adapter = build_random_lora_adapter(tiny_model_dir, tmp_path / "start", rank=16, alpha=16, seed=3, b_std=0.05)
        text = config_text(tiny_model_dir, steps=1, extra=f'checkpoint_id = "{adapter}"').replace(
            "enabled = false", "enabled = true")
    one = new_run(tiny_model_dir, text, batches[:1])
    two = new_run(tiny_model_dir, text + "activation_checkpointing = true\n", batches[:1])
    run_ranks(one, tiny_model_dir, tmp_path / "one.pt", 1)
    run_ranks(two, tiny_model_dir, tmp_path / "two.pt", 2)
    assert_same_update(one, two, tmp_path, "adapters" if lora else "weights", 1)
    ready = [e.data["message"] for e in trainer_events(two, "log") if "trainer ready" in e.data["message"]]
    assert len(ready) == 1 and ", activation checkpointing (" in ready[0], ready
