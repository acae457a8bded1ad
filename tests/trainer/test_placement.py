"""GPU placement on one machine (trainer/placement.py): the sampler servers take the first GPUs, the trainer the next;
settings that do not fit fail the run before anything starts, with a message naming the fields."""

from __future__ import annotations

import json
import math
import signal
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from prime_lab.runs.events import Event, EventLog
from prime_lab.runs.registry import Run, RunRegistry
from prime_lab.trainer import launcher
from prime_lab.trainer.config import validate_rl_config
from prime_lab.trainer.placement import (
    ENGINE_OVERHEAD_BYTES,
    PlacementError,
    child_devices,
    idle_gpus_note,
    model_size,
    plan_gpus,
    sampler_waits_for_trainer,
    split_card,
)

EIGHT = [str(i) for i in range(8)]
GIB = 2**30
H100 = 85_029_158_912  # an H100 80GB as torch reports it: 79.2 GiB
L40S = 48_000_000_000  # a 48 GB card: 44.7 GiB


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
    """Without the models' sizes the engines on a card split its 0.9 evenly, less the trainer's half."""
    one, two = ["inference"], ["inference", "teacher"]
    assert [split_card(roles, {}, with_trainer=t) for roles, t in ((one, False), (two, False), (one, True),
                                                                   (two, True))] == \
        [{"inference": 0.9}, {"inference": 0.45, "teacher": 0.45}, {"inference": 0.4},
         {"inference": 0.2, "teacher": 0.2}]
    shared = plan_gpus(["0"], backend="vllm")
    assert child_devices(shared)["inference"].gpu_memory_utilization == 0.4
    assert child_devices(shared, memory_override=0.7)["inference"].gpu_memory_utilization == 0.7
    cpu = plan_gpus([], backend="vllm", sides=["teacher"])  # no GPU: vLLM's CPU build sizes its cache in GiB
    assert child_devices(cpu)["teacher"].gpu_memory_utilization is None
    alone = plan_gpus(EIGHT[:2], backend="vllm")
    assert child_devices(alone)["inference"].gpu_memory_utilization == 0.9
    beside = child_devices(plan_gpus(EIGHT[:2], backend="vllm", sides=["teacher"]))
    assert beside["teacher"].gpu_memory_utilization == 0.45


def test_the_teacher_has_a_share_of_its_own() -> None:
    """`[teacher] gpu_memory_utilization` sets the teacher's share and `[inference]`'s the sampler's; one left unset
    gets what the other leaves of the card (0.4 beside the trainer); a set share that leaves nothing is refused."""
    shared = plan_gpus(["0"], backend="vllm", sides=["teacher"])

    def shares(memory_override: float | None = None, teacher_memory: float | None = None) -> tuple[float | None, ...]:
        plan = child_devices(shared, memory_override=memory_override, side_memory={"teacher": teacher_memory})
        return plan["inference"].gpu_memory_utilization, plan["teacher"].gpu_memory_utilization

    assert shares() == (0.2, 0.2)
    assert shares(teacher_memory=0.3) == (0.1, 0.3)
    assert shares(memory_override=0.15) == (0.15, 0.25)
    assert shares(memory_override=0.1, teacher_memory=0.35) == (0.1, 0.35)
    with pytest.raises(PlacementError, match=r"\[inference\] gpu_memory_utilization = 0.4 leaves nothing of GPU 0 for "
                       r"the teacher .*set \[teacher\] gpu_memory_utilization too"):
        shares(memory_override=0.4)


def test_a_local_teacher_is_planned_on_the_one_gpu_it_runs_on() -> None:
    """The teacher is started with one engine on one GPU: its CUDA_VISIBLE_DEVICES names that GPU alone and its share
    is of that card. A GPU the plan leaves idle is its own; else it goes beside the process on the fewest GPUs, a
    sampler server before the trainer, and lowers that one's share alone (vLLM takes one gpu_memory_utilization for
    all of a server's GPUs, so beside a sampler on two it would lower the share on both)."""
    def devices(gpus: int, **settings: Any) -> dict[str, tuple[list[int], float | None]]:
        plan = child_devices(plan_gpus(EIGHT[:gpus], sides=["teacher"], **settings))
        assert plan["teacher"].env == {"CUDA_VISIBLE_DEVICES": ",".join(map(str, plan["teacher"].gpus))}
        return {role: (child.gpus, child.gpu_memory_utilization) for role, child in plan.items()}

    # a sampler on two GPUs (data_parallel_size fills num_gpus) and the trainer on one: the teacher beside the trainer
    assert devices(3, backend="vllm", num_gpus=3) == \
        {"inference": ([0, 1], 0.9), "teacher": ([2], 0.4), "trainer": ([2], None)}
    # two servers on a GPU each: beside the first, the second keeps its 0.9
    assert devices(3, backend="builtin", num_servers=2) == \
        {"inference": ([0], 0.45), "teacher": ([0], 0.45), "inference-2": ([1], 0.9), "trainer": ([2], None)}
    # a GPU left idle: the teacher's own, and no longer idle
    plan = plan_gpus(EIGHT[:3], backend="vllm", sides=["teacher"])
    assert plan.side_gpus == {"teacher": [2]} and plan.idle() == []
    assert devices(3, backend="vllm") == {"inference": ([0], 0.9), "teacher": ([2], 0.9), "trainer": ([1], None)}
    # nowhere else (the trainer on the CPU): beside sampler 0 on its first GPU, whose one share is lowered
    assert devices(2, backend="vllm", data_parallel_size=2, trainer_on_gpu=False) == \
        {"inference": ([0, 1], 0.45), "teacher": ([0], 0.45), "trainer": ([], None)}
    # one GPU: the three share it
    assert devices(1, backend="vllm") == {"inference": ([0], 0.2), "teacher": ([0], 0.2), "trainer": ([0], None)}
    assert plan_gpus([], backend="vllm", sides=["teacher"]).side_gpus == {"teacher": []}  # a CPU: no GPU
    assert plan_gpus(EIGHT, backend="vllm").side_gpus == {}  # no local teacher


def test_side_engines_take_idle_gpus_one_each_else_they_share() -> None:
    """A teacher and a judge: an idle GPU each where there are two (4 GPUs), both on the one idle GPU where there is
    one (3 GPUs: they split it), else beside the sampler (2 GPUs; 1 GPU: beside the sampler and the trainer)."""
    def sides(gpus: int) -> dict[str, list[int]]:
        return plan_gpus(EIGHT[:gpus], backend="vllm", sides=["teacher", "judge"]).side_gpus

    assert [sides(g) for g in (4, 3, 2, 1)] == [{"teacher": [2], "judge": [3]}, {"teacher": [2], "judge": [2]},
                                               {"teacher": [0], "judge": [0]}, {"teacher": [0], "judge": [0]}]
    three = child_devices(plan_gpus(EIGHT[:3], backend="vllm", sides=["teacher", "judge"]))
    assert {r: (c.gpus, c.gpu_memory_utilization) for r, c in three.items()} == \
        {"inference": ([0], 0.9), "teacher": ([2], 0.45), "judge": ([2], 0.45), "trainer": ([1], None)}
    one = child_devices(plan_gpus(["0"], backend="vllm", sides=["judge"]), side_memory={"judge": 0.3})
    assert (one["inference"].gpu_memory_utilization, one["judge"].gpu_memory_utilization) == (0.1, 0.3)
    assert plan_gpus(EIGHT[:4], backend="vllm", sides=["judge"]).idle() == [3]


# Model sizes: a Qwen3 folder whose safetensors file holds its header alone (the placement reads nothing else) ----
QWEN3_8B = {"hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "intermediate_size": 12288, "vocab_size": 151936, "tie_word_embeddings": False,
            "max_position_embeddings": 40960}
QWEN3_0_6B = {**QWEN3_8B, "hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16,
              "intermediate_size": 3072, "tie_word_embeddings": True}


def fake_model(folder: Path, shape: dict[str, Any], dtype: str = "BF16") -> int:
    """A Qwen3-shaped model folder: config.json and a model.safetensors of the tensors' header without their data.
    Returns its parameter count."""
    h, layers, inter, hd = shape["hidden_size"], shape["num_hidden_layers"], shape["intermediate_size"], \
        shape["head_dim"]
    q, kv = shape["num_attention_heads"] * hd, shape["num_key_value_heads"] * hd
    shapes = {"model.embed_tokens.weight": [shape["vocab_size"], h], "model.norm.weight": [h]}
    if not shape["tie_word_embeddings"]:
        shapes["lm_head.weight"] = [shape["vocab_size"], h]
    for i in range(layers):
        layer = {"self_attn.q_proj": [q, h], "self_attn.k_proj": [kv, h], "self_attn.v_proj": [kv, h],
                 "self_attn.o_proj": [h, q], "self_attn.q_norm": [hd], "self_attn.k_norm": [hd],
                 "mlp.gate_proj": [inter, h], "mlp.up_proj": [inter, h], "mlp.down_proj": [h, inter],
                 "input_layernorm": [h], "post_attention_layernorm": [h]}
        shapes.update({f"model.layers.{i}.{name}.weight": dims for name, dims in layer.items()})
    header, offset = {}, 0
    for name, dims in shapes.items():
        size = math.prod(dims) * (4 if dtype == "F32" else 2)
        header[name] = {"dtype": dtype, "shape": dims, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3", **shape}))
    return sum(math.prod(dims) for dims in shapes.values())


def test_a_models_size_is_read_from_its_folder(tmp_path: Path) -> None:
    """Weights from the safetensors headers at the serving dtype (a float32 checkpoint served in bfloat16 takes
    half its file), the KV cache of a token from config.json: Qwen3-8B is 8.19B parameters, 144 KiB a token."""
    params = fake_model(tmp_path / "Qwen3-8B", QWEN3_8B)
    assert params == 8_190_735_360
    size = model_size(tmp_path / "Qwen3-8B")
    assert (size.name, size.weights_bytes, size.kv_bytes_per_token, size.context) == \
        ("Qwen3-8B", 2 * params, 2 * 36 * 8 * 128 * 2, 40960)
    assert model_size(tmp_path / "Qwen3-8B", "float32").weights_bytes == 4 * params
    fake_model(tmp_path / "f32", QWEN3_0_6B, dtype="F32")
    assert model_size(tmp_path / "f32", "auto").weights_bytes == 2 * 596_049_920
    need = size.need(8192, tensor_parallel_size=2)
    assert (need.weights_bytes, need.kv_bytes, need.total) == \
        (params, 147456 * 4096, params + 147456 * 4096 + ENGINE_OVERHEAD_BYTES)
    assert size.need(100_000).tokens == 40960  # at most the model's context
    assert model_size(tmp_path / "nothing-here").weights_bytes == 0


TEACHER = 'loss = "opd"\n[teacher]\nmodel = "smollm2-135m"\nbackend = "vllm"\n'
JUDGE = '[judge]\nmodel = "smollm2-135m"\nbackend = "vllm"\n'

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
    # a local teacher runs on one GPU: one of its own where the plan leaves one idle, else beside the process on the
    # fewest GPUs (a sampler server first), whose share it lowers on that card alone
    (8, "vllm", TEACHER, "GPUs: sampler on GPU 0; teacher on GPU 2; trainer on GPU 1; vLLM's gpu_memory_utilization: "
     "sampler 0.9, teacher 0.9", {"inference": ("0", 0.9), "teacher": ("2", 0.9), "trainer": ("1", None)}),
    (3, "vllm", "num_gpus = 3\n" + TEACHER, "GPUs: sampler on GPUs 0,1; teacher and trainer share GPU 2; vLLM's "
     "gpu_memory_utilization: sampler 0.9, teacher 0.4",
     {"inference": ("0,1", 0.9), "teacher": ("2", 0.4), "trainer": ("2", None)}),
    (8, "vllm", "num_gpus = 8\n" + TEACHER + "[inference]\ntensor_parallel_size = 2\n[trainer]\nnproc_per_node = 2\n",
     "GPUs: sampler on GPUs 0,1,2,3,4,5; teacher on GPU 6, beside the trainer; trainer on GPUs 6,7",
     {"inference": ("0,1,2,3,4,5", 0.9), "teacher": ("6", 0.4), "trainer": ("6,7", None)}),
    # beside an external sampler: the trainer's card, or one of its own
    (1, "external", TEACHER, "GPUs: teacher and trainer share GPU 0; vLLM's gpu_memory_utilization: teacher 0.4",
     {"teacher": ("0", 0.4), "trainer": ("0", None)}),
    (2, "external", TEACHER, "GPUs: teacher on GPU 1; trainer on GPU 0; vLLM's gpu_memory_utilization: teacher 0.9",
     {"teacher": ("1", 0.9), "trainer": ("0", None)}),
    # a local judge is placed as a local teacher is; with both, an idle GPU each where there are enough
    (1, "vllm", JUDGE, "GPUs: sampler, judge and trainer share GPU 0; vLLM's gpu_memory_utilization: sampler 0.2, "
     "judge 0.2", {"inference": ("0", 0.2), "judge": ("0", 0.2), "trainer": ("0", None)}),
    (1, "vllm", JUDGE + "gpu_memory_utilization = 0.3\n", "GPUs: sampler, judge and trainer share GPU 0; vLLM's "
     "gpu_memory_utilization: sampler 0.1, judge 0.3 ([inference] gpu_memory_utilization and [judge] "
     "gpu_memory_utilization set them)", {"inference": ("0", 0.1), "judge": ("0", 0.3), "trainer": ("0", None)}),
    (2, "vllm", JUDGE, "GPUs: sampler and judge share GPU 0; trainer on GPU 1; vLLM's gpu_memory_utilization: "
     "sampler 0.45, judge 0.45", {"inference": ("0", 0.45), "judge": ("0", 0.45), "trainer": ("1", None)}),
    (3, "vllm", JUDGE, "GPUs: sampler on GPU 0; judge on GPU 2; trainer on GPU 1",
     {"inference": ("0", 0.9), "judge": ("2", 0.9), "trainer": ("1", None)}),
    (3, "vllm", TEACHER + JUDGE, "GPUs: sampler on GPU 0; teacher and judge share GPU 2; trainer on GPU 1; vLLM's "
     "gpu_memory_utilization: sampler 0.9, teacher 0.45, judge 0.45",
     {"inference": ("0", 0.9), "teacher": ("2", 0.45), "judge": ("2", 0.45), "trainer": ("1", None)}),
    (4, "vllm", TEACHER + JUDGE, "GPUs: sampler on GPU 0; teacher on GPU 2; judge on GPU 3; trainer on GPU 1",
     {"inference": ("0", 0.9), "teacher": ("2", 0.9), "judge": ("3", 0.9), "trainer": ("1", None)}),
    # a judge at [judge.client]'s endpoint is not started here: nothing placed
    (2, "vllm", '[judge]\nmodel = "gpt-4.1-mini"\n[judge.client]\nbase_url = "http://127.0.0.1:9/v1"\n',
     "GPUs: sampler on GPU 0; trainer on GPU 1; vLLM's gpu_memory_utilization: sampler 0.9",
     {"inference": ("0", 0.9), "trainer": ("1", None)}),
]


@pytest.fixture()
def supervisor_for(tiny_model_dir: Path,
                   monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., launcher.Supervisor]]:
    """A launcher's Supervisor for a run of `extra` config lines, on a machine faked to show `gpus` GPUs."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)

    def make(gpus: int, extra: str = "", cards: list[int] | None = None,
             model_path: Path | None = None) -> launcher.Supervisor:
        text = (f'model = "{tiny_model_dir}"\nmax_steps = 1\nbatch_size = 4\nrollouts_per_example = 2\n{extra}'
                '[sampling]\nmax_tokens = 4\n[[env]]\nid = "reverse-text"\n')
        result = validate_rl_config(text)
        assert result.config is not None, result.problems
        run = RunRegistry().create("rl", config_text=text, resolved=result.config.model_dump(mode="json"))
        run.update_status(model_path=str(model_path or tiny_model_dir))
        monkeypatch.setattr(launcher, "visible_gpus", lambda: [str(i) for i in range(gpus)])
        monkeypatch.setattr(launcher, "card_memory", lambda: list(cards or []))  # [] : torch cannot say
        return launcher.Supervisor(run)

    yield make
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


def launcher_log(supervisor: launcher.Supervisor, source: str = "launcher") -> list[str]:
    items, _ = EventLog(supervisor.run.events_path).read()
    return [str(e.data["message"]) for e in items if isinstance(e, Event) and e.kind == "log" and e.source == source]


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


def test_a_local_judge_is_started_on_its_planned_devices(supervisor_for: Callable[..., launcher.Supervisor],
                                                         tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """start_judge gives the judge's server the CUDA_VISIBLE_DEVICES and the share the placement planned for it: the
    GPU the run leaves idle, or its part of the sampler's card ([judge] gpu_memory_utilization where set)."""
    from prime_lab.inference import launch
    from prime_lab.runs.processes import ServerStartError

    started: list[tuple[dict[str, str], float | None]] = []

    def refuse(backend: str, model: Path, log: Path, **kwargs: Any) -> Any:
        started.append((dict(kwargs["env"]), kwargs["options"].gpu_memory_utilization))
        raise ServerStartError("not started in this test")

    monkeypatch.setattr(launch, "start_sampler", refuse)
    judge = f'[judge]\nmodel = "{tiny_model_dir}"\nbackend = "vllm"\n'
    for gpus, extra in ((3, ""), (2, ""), (1, "gpu_memory_utilization = 0.3\n")):
        supervisor = supervisor_for(gpus, judge + extra)
        supervisor.placement = supervisor.plan_placement("vllm")
        with pytest.raises(launcher.LaunchFailed, match="not started in this test"):
            supervisor.start_judge()
    assert started == [({"CUDA_VISIBLE_DEVICES": "2"}, 0.9), ({"CUDA_VISIBLE_DEVICES": "0"}, 0.45),
                       ({"CUDA_VISIBLE_DEVICES": "0"}, 0.3)]


def test_a_users_allocator_setting_is_left_alone(supervisor_for: Callable[..., launcher.Supervisor],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    supervisor = supervisor_for(2)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")
    supervisor.plan_placement("builtin")
    assert supervisor.devices["trainer"].env == {"CUDA_VISIBLE_DEVICES": "1"}


# An 8B teacher on one card with the trainer and the sampler ----------------------------------------------------------
@pytest.fixture()
def qwen3_folders(tmp_path: Path) -> tuple[Path, Path]:
    """A Qwen3-0.6B-shaped student and a Qwen3-8B-shaped teacher (headers only)."""
    fake_model(tmp_path / "Qwen3-0.6B", QWEN3_0_6B)
    fake_model(tmp_path / "Qwen3-8B", QWEN3_8B)
    return tmp_path / "Qwen3-0.6B", tmp_path / "Qwen3-8B"


def distillation(teacher: Path, teacher_lines: str = "", inference_lines: str = "") -> str:
    return (f'loss = "sft"\n[teacher]\nmodel = "{teacher}"\nbackend = "vllm"\n{teacher_lines}'
            f"[inference]\nmax_model_len = 8192\n{inference_lines}")


def judging(judge: Path, judge_lines: str = "", inference_lines: str = "") -> str:
    """A run whose environments' judge is `judge`, served here by vLLM with answers of 512 tokens at most."""
    return (f'[judge]\nmodel = "{judge}"\nbackend = "vllm"\n{judge_lines}[judge.sampling]\nmax_tokens = 512\n'
            f"[inference]\nmax_model_len = 8192\n{inference_lines}")


def test_an_8b_teacher_fits_one_80gb_card_beside_the_trainer_and_the_sampler(
        supervisor_for: Callable[..., launcher.Supervisor], qwen3_folders: tuple[Path, Path]) -> None:
    """On one H100 (79.2 GiB) with the trainer keeping half, the vLLM engines' 0.4 is split by what each needs: the
    8B teacher's 15.3 GiB of weights, 1.1 GiB of KV cache for one 8,192-token sequence and vLLM's allowance, the
    0.6B sampler's 1.1 + 0.9 GiB and its allowance, then the rest evenly. Each gets at least its need, and the
    shares with the trainer's stay within the card; the launcher logs them in GiB. (An even split gave the teacher
    0.2, 15.8 GiB: less than its weights and allowance.)"""
    student, teacher = qwen3_folders
    supervisor = supervisor_for(1, distillation(teacher), cards=[H100], model_path=student)
    supervisor.placement = supervisor.plan_placement("vllm")
    shares = {role: supervisor.devices[role].gpu_memory_utilization or 0.0 for role in ("inference", "teacher")}
    assert shares == {"inference": 0.1, "teacher": 0.29}
    assert shares["teacher"] * H100 >= 2 * 8_190_735_360 + 147456 * 8192 + ENGINE_OVERHEAD_BYTES > 0.2 * H100
    assert shares["inference"] * H100 >= 2 * 596_049_920 + 114688 * 8192 + ENGINE_OVERHEAD_BYTES
    assert sum(shares.values()) + 0.5 <= 1.0
    assert "memory of GPU 0 (79.2 GiB): sampler (Qwen3-0.6B) 0.1 = 7.9 GiB (needs 4.0); teacher (Qwen3-8B) 0.29 = " \
        "23.0 GiB (needs 18.4); the trainer keeps 0.5 = 39.6 GiB" in launcher_log(supervisor)


def test_an_8b_judge_fits_one_80gb_card_beside_the_trainer_and_the_sampler(
        supervisor_for: Callable[..., launcher.Supervisor], qwen3_folders: tuple[Path, Path]) -> None:
    """A judge on the card of the sampler and the trainer is sized as a teacher is, its sequence a rollout of
    max_model_len tokens (its prompt) and its [judge.sampling] max_tokens answer; the sampler boots after the trainer
    (the judge with it)."""
    student, judge = qwen3_folders
    supervisor = supervisor_for(1, judging(judge), cards=[H100], model_path=student)
    supervisor.placement = supervisor.plan_placement("vllm")
    shares = {role: supervisor.devices[role].gpu_memory_utilization or 0.0 for role in ("inference", "judge")}
    assert shares == {"inference": 0.1, "judge": 0.29}
    assert shares["judge"] * H100 >= 2 * 8_190_735_360 + 147456 * (8192 + 512) + ENGINE_OVERHEAD_BYTES
    assert "memory of GPU 0 (79.2 GiB): sampler (Qwen3-0.6B) 0.1 = 7.9 GiB (needs 4.0); judge (Qwen3-8B) 0.29 = " \
        "23.0 GiB (needs 18.5); the trainer keeps 0.5 = 39.6 GiB" in launcher_log(supervisor)
    assert supervisor.vllm_roles == ["inference", "judge"]
    assert sampler_waits_for_trainer(supervisor.devices, supervisor.vllm_roles)


def test_a_teacher_beside_an_external_sampler_gets_a_gpu_and_a_share_that_fits(
        supervisor_for: Callable[..., launcher.Supervisor], qwen3_folders: tuple[Path, Path]) -> None:
    """With `[inference] backend = "external"` no sampler is started here, but a local teacher is: on one H100 it
    shares the trainer's card with the 0.4 the trainer leaves (its 8B model needs 18.4 GiB of it) and boots after the
    trainer's ready line; with two GPUs the second is its own. (Before, it got no GPU: vLLM saw every card and took
    its default 0.9 of the trainer's.)"""
    student, teacher = qwen3_folders
    supervisor = supervisor_for(1, distillation(teacher), cards=[H100], model_path=student)
    supervisor.placement = supervisor.plan_placement("external")
    devices = supervisor.devices
    assert (devices["teacher"].env, devices["teacher"].gpu_memory_utilization) == ({"CUDA_VISIBLE_DEVICES": "0"}, 0.4)
    assert "memory of GPU 0 (79.2 GiB): teacher (Qwen3-8B) 0.4 = 31.7 GiB (needs 18.4); the trainer keeps 0.5 = " \
        "39.6 GiB" in launcher_log(supervisor)
    assert sampler_waits_for_trainer(devices, supervisor.vllm_roles)
    supervisor = supervisor_for(2, distillation(teacher), cards=[H100, H100], model_path=student)
    supervisor.placement = supervisor.plan_placement("external")
    devices = supervisor.devices
    assert (devices["teacher"].env, devices["teacher"].gpu_memory_utilization) == ({"CUDA_VISIBLE_DEVICES": "1"}, 0.9)
    assert devices["trainer"].gpus == [0] and not sampler_waits_for_trainer(devices, supervisor.vllm_roles)


@pytest.mark.parametrize(("side", "card", "side_lines", "inference_lines", "says"), [
    ("teacher", L40S, "", "", [
        "the teacher (Qwen3-8B) does not fit GPU 0 (44.7 GiB): it needs 18.4 GiB (weights 15.3 GiB + the KV cache of "
        "one 8,192-token sequence 1.1 GiB + ~2.0 GiB for vLLM itself), but its share is 0.2 of the card, 8.9 GiB "
        "(beside it: sampler 0.2 (8.9 GiB), the trainer 0.5 (22.4 GiB)). All that is left of the card beside them is "
        "13.4 GiB", "[teacher.client] base_url"]),
    ("teacher", H100, "gpu_memory_utilization = 0.15\n", "", [
        "its share is 0.15 of the card, 11.9 GiB", "Set [teacher] gpu_memory_utilization to at least 0.24"]),
    ("teacher", H100, "gpu_memory_utilization = 0.35\n", "gpu_memory_utilization = 0.2\n", [
        "the shares of GPU 0 add up past the card: sampler 0.2 (15.8 GiB), teacher 0.35 (27.7 GiB), the trainer 0.5 "
        "(39.6 GiB) = 1.05 of it (83.1 GiB of 79.2 GiB)", "Lower [inference] gpu_memory_utilization or [teacher] "
        "gpu_memory_utilization"]),
    ("judge", L40S, "", "", [
        "the judge (Qwen3-8B) does not fit GPU 0 (44.7 GiB): it needs 18.5 GiB (weights 15.3 GiB + the KV cache of one "
        "8,704-token sequence 1.2 GiB + ~2.0 GiB for vLLM itself), but its share is 0.2 of the card", "lower "
        "[judge.sampling] max_tokens or [inference] max_model_len", "serve the judge elsewhere ([judge.client] "
        "base_url)"]),
    ("judge", H100, "gpu_memory_utilization = 0.15\n", "", [
        "its share is 0.15 of the card, 11.9 GiB", "Set [judge] gpu_memory_utilization to at least 0.24"]),
    ("judge", H100, "gpu_memory_utilization = 0.35\n", "gpu_memory_utilization = 0.2\n", [
        "sampler 0.2 (15.8 GiB), judge 0.35 (27.7 GiB), the trainer 0.5 (39.6 GiB) = 1.05 of it",
        "Lower [inference] gpu_memory_utilization or [judge] gpu_memory_utilization"]),
])
def test_a_side_engine_that_cannot_fit_is_refused_before_the_run_starts_with_the_numbers(
        supervisor_for: Callable[..., launcher.Supervisor], qwen3_folders: tuple[Path, Path], side: str, card: int,
        side_lines: str, inference_lines: str, says: list[str]) -> None:
    """Refused by the plan, before any process starts, with the GiB of each part and of the card: an 8B teacher (or
    judge) beside the trainer and the sampler on a 48 GB card, a share of its own too small on an 80 GB one, and
    shares that with the trainer's add up past the card."""
    student, model = qwen3_folders
    config = (distillation if side == "teacher" else judging)(model, side_lines, inference_lines)
    supervisor = supervisor_for(1, config, cards=[card], model_path=student)
    with pytest.raises(launcher.LaunchFailed) as caught:
        supervisor.plan_placement("vllm")
    for part in says:
        assert part in str(caught.value)


# Boot order on a shared card -------------------------------------------------------------------------------------
def test_the_sampler_waits_for_the_trainer_only_where_a_vllm_engine_shares_its_gpu() -> None:
    def waits(devices: list[str], backend: str, teacher: str | None = None, side: str = "teacher") -> bool:
        plan = child_devices(plan_gpus(devices, backend=backend, sides=[side] if teacher else []))
        roles = [r for r in plan if r.startswith("inference") and backend == "vllm" and plan[r].gpus]
        roles += [side] if teacher == "vllm" and plan[side].gpus else []
        return sampler_waits_for_trainer(plan, roles)

    assert waits(["0"], "vllm") and waits(["0"], "builtin", teacher="vllm")
    assert waits(["0"], "builtin", teacher="vllm", side="judge")  # a judge's vLLM waits as a teacher's does
    assert not waits(["0"], "builtin")  # the built-in server does not size itself from the free memory
    assert not waits(["0", "1"], "vllm", teacher="vllm")  # sampler and teacher on 0, trainer on 1
    assert not waits([], "vllm")  # a CPU: side by side, as before


STAND_IN_TRAINER = """
import sys, time
from pathlib import Path
from prime_lab.runs.registry import Run
run = Run(Path(sys.argv[1]))
while time.sleep(0.02) is None:  # until the launcher says it waits, or the sampler has started
    if "the sampler starts once the trainer" in run.events_path.read_text() or (run.dir / "sampler-started").exists():
        break
if sys.argv[2] == "dies":
    run.writer("trainer").log("the stand-in trainer could not load its model", "ERROR")
    sys.exit(3)
run.writer("trainer").log("trainer ready on cuda: a stand-in")
time.sleep(60)
"""


@pytest.mark.parametrize(("gpus", "trainer", "waited"), [(1, "ready", True), (0, "ready", False), (1, "dies", None)])
def test_the_launcher_starts_the_sampler_once_the_trainer_is_ready_on_a_shared_gpu(
        supervisor_for: Callable[..., launcher.Supervisor], monkeypatch: pytest.MonkeyPatch, gpus: int,
        trainer: str, waited: bool | None) -> None:
    """The launcher itself (its reaper, the run's state) with a stand-in trainer process and a vLLM sampler whose
    start is recorded and stopped there: on one shared GPU the sampler starts after the trainer's ready line; on a
    CPU at once, as before; a trainer that dies first fails the run with its error."""
    from prime_lab.inference import launch
    from prime_lab.inference.backend import BackendChoice
    from prime_lab.runs.processes import ServerStartError

    supervisor = supervisor_for(gpus)
    run = supervisor.run
    monkeypatch.setattr(launcher.Supervisor, "choose_backend", lambda self: BackendChoice("vllm", "asked for"))

    def start_stand_in(self: launcher.Supervisor, role: str, argv: list[str],
                       env: dict[str, str] | None = None) -> None:
        assert role == "trainer"
        self.children[role] = subprocess.Popen([sys.executable, "-c", STAND_IN_TRAINER, str(run.dir), trainer])
        run.register_process(role, self.children[role].pid)

    monkeypatch.setattr(launcher.Supervisor, "start_child", start_stand_in)
    started: list[bool] = []

    def record(backend: str, model: Path, log: Path, **kwargs: Any) -> Any:
        started.append(any(m.startswith(launcher.TRAINER_READY) for m in launcher_log(supervisor, "trainer")))
        (run.dir / "sampler-started").touch()
        raise ServerStartError("not started in this test")

    monkeypatch.setattr(launch, "start_sampler", record)
    assert supervisor.supervise() == 1
    reason = str(Run(run.dir).read_status()["reason"])
    if waited is None:
        assert started == [] and reason == "the stand-in trainer could not load its model"
    else:
        assert started == [waited] and "not started in this test" in reason
        assert any("the sampler starts once the trainer" in m for m in launcher_log(supervisor)) is waited


# GPUs a run leaves idle ------------------------------------------------------------------------------------------
def test_gpus_a_run_leaves_idle_are_named_with_the_settings_that_use_them() -> None:
    vllm = plan_gpus(EIGHT, backend="vllm")
    assert idle_gpus_note(vllm, backend="vllm") == (
        "6 of 8 GPUs idle (GPUs 2,3,4,5,6,7): this run uses GPUs 0,1; num_gpus = 8 (vLLM's data_parallel_size then "
        "fills what the trainer leaves), or [trainer] nproc_per_node would use them")
    assert "[inference] num_servers" in str(idle_gpus_note(plan_gpus(EIGHT, backend="builtin"), backend="builtin"))
    assert "[trainer] nproc_per_node" in str(idle_gpus_note(plan_gpus(EIGHT, backend="external"), backend="external"))
    assert idle_gpus_note(plan_gpus(EIGHT, backend="vllm", num_gpus=8), backend="vllm", num_gpus=8) is None
    assert idle_gpus_note(plan_gpus(EIGHT, backend="vllm", num_gpus=2), backend="vllm", num_gpus=2) is None
    assert idle_gpus_note(plan_gpus(["0"], backend="vllm"), backend="vllm") is None


def test_the_launcher_says_once_which_gpus_are_idle(supervisor_for: Callable[..., launcher.Supervisor]) -> None:
    supervisor = supervisor_for(8)
    supervisor.plan_placement("vllm")
    idle = [m for m in launcher_log(supervisor) if "GPUs idle" in m]
    assert idle == [idle_gpus_note(plan_gpus(EIGHT, backend="vllm"), backend="vllm")]
    assert not [m for m in launcher_log(supervisor_for(8, "num_gpus = 8\n")) if "idle" in m]
