"""GPU placement on one machine (trainer/placement.py): the sampler servers take the first GPUs, the trainer the next;
settings that do not fit fail the run before anything starts, with a message naming the fields."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from prime_lab.runs.registry import RunRegistry
from prime_lab.trainer import launcher
from prime_lab.trainer.config import validate_rl_config
from prime_lab.trainer.placement import PlacementError, plan_gpus

EIGHT = [str(i) for i in range(8)]


def test_samplers_take_the_first_gpus_and_the_trainer_the_next() -> None:
    plan = plan_gpus(EIGHT, backend="vllm", tensor_parallel_size=2, data_parallel_size=1, num_servers=2,
                     nproc_per_node=2)
    assert plan.sampler_gpus == [[0, 1], [2, 3]] and plan.trainer_gpus == [4, 5] and plan.data_parallel_size == 1
    assert plan.cuda_env(plan.sampler_gpus[1]) == {"CUDA_VISIBLE_DEVICES": "2,3"}
    assert plan.cuda_env(plan.trainer_gpus) == {"CUDA_VISIBLE_DEVICES": "4,5"}


def test_data_parallel_size_fills_what_num_gpus_leaves_after_the_trainer() -> None:
    plan = plan_gpus(EIGHT, backend="vllm", num_gpus=8, tensor_parallel_size=2, nproc_per_node=2)
    assert plan.data_parallel_size == 3 and plan.sampler_gpus == [[0, 1, 2, 3, 4, 5]] and plan.trainer_gpus == [6, 7]
    two_servers = plan_gpus(EIGHT, backend="vllm", num_gpus=6, num_servers=2, nproc_per_node=2)
    assert two_servers.data_parallel_size == 2 and two_servers.sampler_gpus == [[0, 1], [2, 3]]
    assert plan_gpus(EIGHT, backend="vllm").data_parallel_size == 1  # num_gpus unset: one engine per server


def test_visible_device_names_pass_through() -> None:
    plan = plan_gpus(["3", "GPU-5b2f", "7"], backend="builtin", num_servers=2)
    assert [plan.cuda_env(g) for g in plan.sampler_gpus] == [{"CUDA_VISIBLE_DEVICES": "3"},
                                                             {"CUDA_VISIBLE_DEVICES": "GPU-5b2f"}]
    assert plan.cuda_env(plan.trainer_gpus) == {"CUDA_VISIBLE_DEVICES": "7"}


def test_an_external_sampler_or_a_cpu_trainer_takes_no_gpu() -> None:
    assert plan_gpus(EIGHT, backend="external", nproc_per_node=4).trainer_gpus == [0, 1, 2, 3]
    plan = plan_gpus(EIGHT[:1], backend="vllm", trainer_on_gpu=False)
    assert plan.sampler_gpus == [[0]] and plan.trainer_gpus == [] and plan.cuda_env([]) == {}


def test_a_cpu_only_machine_gets_no_gpus_and_no_checks() -> None:
    plan = plan_gpus([], backend="vllm", num_gpus=8, tensor_parallel_size=4, num_servers=3, nproc_per_node=8)
    assert plan.sampler_gpus == [[], [], []] and plan.trainer_gpus == [] and plan.data_parallel_size == 1
    assert plan_gpus(EIGHT, backend="vllm", num_gpus=0, data_parallel_size=2).sampler_gpus == [[]]


@pytest.mark.parametrize(("devices", "settings", "says"), [
    (EIGHT[:2], {"backend": "vllm", "tensor_parallel_size": 2},
     ["tensor_parallel_size (2) x data_parallel_size (1) x num_servers (1) = 2", "nproc_per_node (1)", "3 in all",
      "this machine shows 2"]),
    (EIGHT, {"backend": "vllm", "num_gpus": 4, "data_parallel_size": 2, "num_servers": 2},
     ["data_parallel_size (2) x num_servers (2) = 4", "5 in all", "num_gpus is 4", "raise num_gpus"]),
    (EIGHT[:2], {"backend": "builtin", "num_servers": 2}, ["one GPU per server", "num_servers (2)", "3 in all"]),
    (EIGHT[:2], {"backend": "vllm", "num_gpus": 4}, ["num_gpus is 4", "shows 2 GPU(s)"]),
    (EIGHT, {"backend": "builtin", "tensor_parallel_size": 2}, ["need vLLM", 'backend = "vllm"', "num_servers"]),
])
def test_gpus_that_do_not_suffice_say_which_settings(devices: list[str], settings: dict[str, object],
                                                     says: list[str]) -> None:
    with pytest.raises(PlacementError) as caught:
        plan_gpus(devices, **settings)  # type: ignore[arg-type]
    for part in says:
        assert part in str(caught.value)


def test_a_placement_that_does_not_fit_fails_the_launch(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = (f'model = "{tiny_model_dir}"\nmax_steps = 1\nbatch_size = 4\nrollouts_per_example = 2\n'
            '[sampling]\nmax_tokens = 4\n[[env]]\nid = "reverse-text"\n[inference]\nnum_servers = 3\n')
    result = validate_rl_config(text)
    assert result.config is not None
    run = RunRegistry().create("rl", config_text=text, resolved=result.config.model_dump(mode="json"))
    run.update_status(model_path=str(tiny_model_dir))
    monkeypatch.setattr(launcher, "visible_gpus", lambda: ["0", "1"])  # this machine, as one with two GPUs
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        supervisor = launcher.Supervisor(run)
        with pytest.raises(launcher.LaunchFailed, match=r"num_servers \(3\)"):
            supervisor.plan_placement("builtin")
        assert supervisor.plan_placement("external").trainer_gpus == [0]
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def test_one_gpu_is_shared_by_one_sampler_and_one_trainer_process() -> None:
    """The default on a one-GPU machine: both on it, as before placement existed (no CUDA_VISIBLE_DEVICES split);
    asking for more than fits still fails."""
    shared = plan_gpus(["0"], backend="builtin")
    assert shared.sampler_gpus == [[]] and shared.trainer_gpus == [] and shared.cuda_env([]) == {}
    with pytest.raises(PlacementError, match="nproc_per_node"):
        plan_gpus(["0"], backend="builtin", nproc_per_node=2)
    with pytest.raises(PlacementError):
        plan_gpus(["0"], backend="builtin", num_gpus=1)
