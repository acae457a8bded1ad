"""GPU placement on one machine (trainer/placement.py): the sampler servers take the first GPUs, the trainer the next;
settings that do not fit fail the run before anything starts, with a message naming the fields."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from prime_lab.runs.events import Event, EventLog
from prime_lab.runs.registry import RunRegistry
from prime_lab.trainer import launcher
from prime_lab.trainer.config import validate_rl_config
from prime_lab.trainer.placement import PlacementError, engine_memory_fraction, plan_gpus

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
    """On a one-GPU machine (or with num_gpus = 1) the sampler and the trainer share GPU 0; asking for more
    processes than fit still fails."""
    for shared in (plan_gpus(["0"], backend="builtin"), plan_gpus(["0"], backend="vllm", num_gpus=1),
                   plan_gpus(EIGHT, backend="vllm", num_gpus=1)):
        assert shared.shared and shared.sampler_gpus == [[0]] and shared.trainer_gpus == [0]
        assert shared.cuda_env(shared.sampler_gpus[0]) == shared.cuda_env(shared.trainer_gpus) == \
            {"CUDA_VISIBLE_DEVICES": "0"}
    assert not plan_gpus(EIGHT[:2], backend="vllm").shared
    with pytest.raises(PlacementError, match="nproc_per_node"):
        plan_gpus(["0"], backend="builtin", nproc_per_node=2)
    with pytest.raises(PlacementError, match="tensor_parallel_size"):
        plan_gpus(["0"], backend="vllm", tensor_parallel_size=2)


def test_vllm_engines_split_a_card_they_share() -> None:
    assert [engine_memory_fraction(n, with_trainer=t) for n, t in ((1, False), (2, False), (1, True), (2, True))] \
        == [0.9, 0.45, 0.4, 0.2]
    shared = plan_gpus(["0"], backend="vllm")
    assert shared.engine_memory_fraction([0], 1) == 0.4 and shared.engine_memory_fraction([0], 1, 0.7) == 0.7
    assert shared.engine_memory_fraction([], 1) is None  # no GPU: vLLM's CPU build sizes its cache in GiB
    alone = plan_gpus(EIGHT[:2], backend="vllm")
    assert alone.engine_memory_fraction([0], 1) == 0.9 and alone.engine_memory_fraction([0], 2) == 0.45


TEACHER = 'loss = "opd"\n[teacher]\nmodel = "smollm2-135m"\nbackend = "vllm"\n'

# visible GPUs, backend, config lines -> the launcher's log line, and each child's CUDA_VISIBLE_DEVICES and vLLM share
LAUNCHES = [
    (1, "builtin", "", "GPUs: sampler and trainer share GPU 0", {"inference": ("0", 0.4), "trainer": ("0", None)}),
    (1, "vllm", "", "GPUs: sampler and trainer share GPU 0; vLLM's gpu_memory_utilization: sampler 0.4",
     {"inference": ("0", 0.4), "trainer": ("0", None)}),
    (1, "vllm", "num_gpus = 1\n" + TEACHER,
     "GPUs: sampler, teacher and trainer share GPU 0; vLLM's gpu_memory_utilization: sampler 0.2, teacher 0.2",
     {"inference": ("0", 0.2), "teacher": ("0", 0.2), "trainer": ("0", None)}),
    (1, "vllm", "[inference]\ngpu_memory_utilization = 0.55\n",
     "GPUs: sampler and trainer share GPU 0; vLLM's gpu_memory_utilization: sampler 0.55",
     {"inference": ("0", 0.55), "trainer": ("0", None)}),
    (2, "builtin", TEACHER.replace("vllm", "builtin"), "GPUs: sampler and teacher share GPU 0; trainer on GPU 1",
     {"inference": ("0", 0.45), "teacher": ("0", 0.45), "trainer": ("1", None)}),
    (2, "vllm", "", "GPUs: sampler on GPU 0; trainer on GPU 1; vLLM's gpu_memory_utilization: sampler 0.9",
     {"inference": ("0", 0.9), "trainer": ("1", None)}),
    (4, "vllm", "num_gpus = 4\n", "GPUs: sampler on GPUs 0,1,2; trainer on GPU 3",
     {"inference": ("0,1,2", 0.9), "trainer": ("3", None)}),
    (4, "builtin", "[inference]\nnum_servers = 3\n",
     "GPUs: sampler 1 on GPU 0; sampler 2 on GPU 1; sampler 3 on GPU 2; trainer on GPU 3",
     {"inference": ("0", 0.9), "inference-2": ("1", 0.9), "inference-3": ("2", 0.9), "trainer": ("3", None)}),
    (8, "vllm", "num_gpus = 8\n" + TEACHER + "[inference]\ntensor_parallel_size = 2\n[trainer]\nnproc_per_node = 2\n",
     "GPUs: sampler and teacher share GPUs 0,1,2,3,4,5; trainer on GPUs 6,7",
     {"inference": ("0,1,2,3,4,5", 0.45), "teacher": ("0,1,2,3,4,5", 0.45), "trainer": ("6,7", None)}),
]


@pytest.fixture()
def supervisor_for(tiny_model_dir: Path,
                   monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., launcher.Supervisor]]:
    """A launcher's Supervisor for a run of `extra` config lines, on a machine faked to show `gpus` GPUs."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)

    def make(gpus: int, extra: str = "") -> launcher.Supervisor:
        text = (f'model = "{tiny_model_dir}"\nmax_steps = 1\nbatch_size = 4\nrollouts_per_example = 2\n{extra}'
                '[sampling]\nmax_tokens = 4\n[[env]]\nid = "reverse-text"\n')
        result = validate_rl_config(text)
        assert result.config is not None, result.problems
        run = RunRegistry().create("rl", config_text=text, resolved=result.config.model_dump(mode="json"))
        run.update_status(model_path=str(tiny_model_dir))
        monkeypatch.setattr(launcher, "visible_gpus", lambda: [str(i) for i in range(gpus)])
        return launcher.Supervisor(run)

    yield make
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


def launcher_log(supervisor: launcher.Supervisor) -> list[str]:
    items, _ = EventLog(supervisor.run.events_path).read()
    return [str(e.data["message"]) for e in items if isinstance(e, Event) and e.kind == "log"]


@pytest.mark.parametrize(("gpus", "backend", "extra", "line", "children"), LAUNCHES)
def test_the_launcher_places_logs_and_sets_each_childs_devices(
        supervisor_for: Callable[..., launcher.Supervisor], gpus: int, backend: str, extra: str, line: str,
        children: dict[str, tuple[str, float | None]]) -> None:
    supervisor = supervisor_for(gpus, extra)
    supervisor.placement = supervisor.plan_placement(backend)
    assert any(logged.startswith(line) for logged in launcher_log(supervisor))
    got = {role: (d.env["CUDA_VISIBLE_DEVICES"], d.gpu_memory_utilization) for role, d in supervisor.devices.items()}
    assert got == children
    assert supervisor.devices["trainer"].env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


def test_children_start_with_their_planned_devices(supervisor_for: Callable[..., launcher.Supervisor],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """What the trainer and a vLLM sampler are started with on one shared GPU: the trainer's environment, the
    sampler's environment and its gpu_memory_utilization (the sampler's start is stopped right there)."""
    from prime_lab.inference import backend as backends
    from prime_lab.inference import launch
    from prime_lab.runs.processes import ServerStartError

    supervisor = supervisor_for(1)
    supervisor.placement = supervisor.plan_placement("vllm")
    started: dict[str, Any] = {}
    monkeypatch.setattr(launcher.Supervisor, "start_child",
                        lambda self, role, argv, env=None: started.update({role: env}))
    supervisor.start_trainer(0, [])
    assert started["trainer"] == {"CUDA_VISIBLE_DEVICES": "0", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}

    def refuse(backend: str, model: Path, log: Path, **kwargs: Any) -> Any:
        started["inference"] = (kwargs["env"], kwargs["options"])
        raise ServerStartError("not started in this test")

    monkeypatch.setattr(launch, "start_sampler", refuse)
    with pytest.raises(launcher.LaunchFailed, match="not started in this test"):
        supervisor.start_sampler(backends.BackendChoice("vllm", "asked for"))
    env, options = started["inference"]
    assert env == {"CUDA_VISIBLE_DEVICES": "0"} and options.gpu_memory_utilization == 0.4


def test_a_users_allocator_setting_is_left_alone(supervisor_for: Callable[..., launcher.Supervisor],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    supervisor = supervisor_for(2)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")
    supervisor.plan_placement("builtin")
    assert supervisor.devices["trainer"].env == {"CUDA_VISIBLE_DEVICES": "1"}
