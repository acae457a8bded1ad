"""bench/gpu_check.py: its `--cpu` plan end to end as the GPU machine runs it (an interpreter without prime_lab
installed, wheels from a folder), and the pieces a CPU never reaches driven with faked devices: the probe of a
card, the one-card environment, the GPU plan's configs and model; and the checks themselves, shown to fail."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from prime_lab.runs.events import Event
from prime_lab.runs.registry import RunRegistry

BENCH = Path(__file__).resolve().parents[2] / "bench" / "gpu_check.py"
REPO = BENCH.parents[1]


@pytest.fixture(scope="module")
def gpu_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def make_wheel(folder: Path, name: str = "gpu_check_marker", version: str = "0.1") -> Path:
    """A pure-Python wheel of one module, written by hand (no network, no build backend)."""
    folder.mkdir(parents=True, exist_ok=True)
    info = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": "MARK = 1\n",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}

    def digest(text: str) -> str:
        return base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()

    record = "".join(f"{path},sha256={digest(text)},{len(text.encode())}\n" for path, text in files.items())
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for member, text in {**files, f"{info}/RECORD": record + f"{info}/RECORD,,\n"}.items():
            wheel.writestr(member, text)
    return path


def python_without_prime_lab(venv: Path) -> Path:
    """A virtual environment that sees this interpreter's packages through a .pth line but not prime_lab: the
    editable install is a .pth file of that folder, which is not processed when the folder is merely on sys.path."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    ours = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (Path(site) / "outer.pth").write_text("".join(f"{p}\n" for p in ours))
    found = subprocess.run([str(python), "-c", "import importlib.util as u; print(u.find_spec('prime_lab'))"],
                           capture_output=True, text=True, check=True, cwd=venv)
    assert found.stdout.strip() == "None", found.stdout
    return python


@pytest.mark.slow
@pytest.mark.timeout(900)  # ~4 min on 2 idle cores, 5-6 min when other tests share them
def test_the_cpu_plan_runs_every_part_and_checks_each(gpu_check: ModuleType, tmp_path: Path) -> None:
    python = python_without_prime_lab(tmp_path / "venv")
    make_wheel(tmp_path / "wheels")
    out = tmp_path / "report.json"
    user_home = tmp_path / "user-home"  # the user's registry: the check must not write there
    env = {**os.environ, "PRIME_LAB_HOME": str(user_home)}
    done = subprocess.run([str(python), str(BENCH), "--cpu", "--wheelhouse", str(tmp_path / "wheels"),
                           "--out", str(out)], capture_output=True, text=True, timeout=880, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-6000:]
    assert f"installed from {tmp_path / 'wheels'}: gpu_check_marker" in done.stderr
    report = json.loads(out.read_text())
    assert report["ok"] and report["mode"] == "cpu", json.dumps(report["parts"], indent=1)[-4000:]
    assert list(report["parts"]) == list(gpu_check.PARTS)
    for name, part in report["parts"].items():
        assert part["finished"] and part["checked"] and part["problems"] == [], (name, part)
    # prime_lab came from the checkout through the temp folder, after the wheels' site: the runs' processes
    # (supervisor, sampler, trainer, orchestrator) imported it through the PYTHONPATH they inherited
    site, src = report["pythonpath"].split(os.pathsep)[:2]
    assert report["prime_lab"] == str(Path(src) / "prime_lab") and Path(site).name == "site"
    assert not (user_home / "runs").exists()

    shapes = report["parts"]["shapes"]["figures"]["shapes"]
    assert set(shapes) == set(gpu_check.SHAPES)
    for shape in shapes.values():
        assert shape["ours"]["tokens_per_s"] > 0 and shape["peer"]["tokens_per_s"] > 0
        assert shape["speed_ratio"] == pytest.approx(shape["ours"]["tokens_per_s"] / shape["peer"]["tokens_per_s"])
    plan = gpu_check.CPU_PLAN
    for name, steps in (("rl", plan.rl.steps), ("sft", plan.sft_steps), ("moe", plan.moe.steps)):
        figures = report["parts"][name]["figures"]
        assert figures["state"] == "completed" and figures["steps"] == steps, (name, figures)
        assert figures["processes_left"] == [] and figures["wall_s_per_step"] > 0, (name, figures)
    for name in ("rl", "moe"):
        kl = report["parts"][name]["figures"]["kl_step1"]
        assert math.isfinite(kl) and abs(kl) < gpu_check.MAX_STEP1_KL
    goals = {row["goal"]: row for row in report["goals"]}
    assert len(goals) == 7 and all(row["figure"] is not None for row in goals.values()), goals
    rl_goal = goals["prime rl run, one shared card: wall s/step"]
    assert rl_goal["figure"] == report["parts"]["rl"]["figures"]["wall_s_per_step"]

    # the table: a line a part, a line a shape, the goals, where the JSON is
    assert "GPU check (cpu plan) on CPU, " in done.stdout
    for name in gpu_check.PARTS:
        assert f"\n{name:8} yes       passed  " in done.stdout, done.stdout
    assert "goals of issue 32 (toy sizes on the CPU: the goals are the GPU plan's):" in done.stdout
    assert f"JSON: {out}" in done.stdout


def test_the_checks_fail_on_a_kl_over_the_bound_a_missing_step_or_a_nan(gpu_check: ModuleType) -> None:
    def kl_problems(steps: dict[int, Event]) -> list[str]:
        part = gpu_check.Part("rl", 60.0)
        gpu_check.check_step1_kl(part, steps)
        return list(part.problems)

    def step(kl: float) -> dict[int, Event]:
        return {1: Event(seq=1, time=0.0, source="trainer", kind="metrics", step=1, data={"policy/kl": kl})}

    assert kl_problems(step(2e-5)) == []
    assert kl_problems(step(-2e-5)) == []
    assert kl_problems(step(2e-3)) == ["step-1 mismatch KL (policy/kl) is 0.002, not < 0.001"]
    assert kl_problems(step(float("nan"))) == ["step-1 mismatch KL (policy/kl) is nan, not < 0.001"]
    assert kl_problems({}) == ["step-1 mismatch KL (policy/kl) is None, not < 0.001"]


def test_a_process_a_run_leaves_is_found_with_its_group(gpu_check: ModuleType, tmp_path: Path) -> None:
    run = RunRegistry(tmp_path / "runs").create("rl", config_text="", resolved={})
    leader = subprocess.Popen(["sh", "-c", "sleep 60 & exec sleep 60"], start_new_session=True)
    gone = subprocess.Popen(["true"])
    gone.wait()
    try:
        run.register_process("trainer", leader.pid)
        run.register_process("cli", gone.pid)  # exited: not a leftover
        deadline = time.monotonic() + 10
        while len(found := gpu_check.run_leftovers(run)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)  # until the shell has started its background sleep
        assert leader.pid in found and len(found) == 2, found  # the leader and the sleep it left in its group
        assert gone.pid not in found
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()
    assert gpu_check.wait_gone(lambda: gpu_check.run_leftovers(run), grace=10) == []


def test_the_checkout_becomes_importable_as_prime_lab(gpu_check: ModuleType, tmp_path: Path) -> None:
    src = gpu_check.link_checkout(tmp_path / "src")
    done = subprocess.run([sys.executable, "-S", "-c", "import prime_lab, prime_lab.runs.paths as p; "
                           "print(prime_lab.__file__); print(p.__file__)"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(src)}, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    package, paths = done.stdout.split()
    assert package == str(src / "prime_lab" / "__init__.py")
    assert Path(paths) == src / "prime_lab" / "runs" / "paths.py"
    assert Path(paths).resolve() == REPO / "runs" / "paths.py"  # the checkout's own file, through the link
    for folder in ("runs", "problems", "envs", "models", "monitors", "inference", "trainer", "gepa", "evals",
                   "workspace", "workbench"):
        assert (src / "prime_lab" / folder / "__init__.py").is_file(), folder


def test_the_wheels_install_from_the_folder_alone(gpu_check: ModuleType, tmp_path: Path) -> None:
    make_wheel(tmp_path / "wheels")
    assert gpu_check.install_wheels(tmp_path / "wheels", tmp_path / "site") == ["gpu_check_marker"]
    assert (tmp_path / "site" / "gpu_check_marker" / "__init__.py").read_text() == "MARK = 1\n"
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="no .whl files there"):
        gpu_check.install_wheels(tmp_path / "empty", tmp_path / "site2")


def test_the_probe_names_the_card_and_one_card_is_used(gpu_check: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index=0: SimpleNamespace(total_memory=80 * 2**30))
    machine = gpu_check.probe()
    assert machine["missing"] == {}
    assert (machine["card"], machine["gpus"], machine["memory_gib"]) == ("NVIDIA H100 80GB HBM3", 2, 80.0)
    assert gpu_check.card_env(machine, {"CUDA_VISIBLE_DEVICES": "3,5"}) == {"CUDA_VISIBLE_DEVICES": "3"}
    assert gpu_check.card_env(machine, {}) == {"CUDA_VISIBLE_DEVICES": "0"}
    assert gpu_check.card_env({**machine, "gpus": 1}, {}) == {}
    with pytest.raises(SystemExit, match="no CUDA GPU is visible to torch .*use --cpu"):
        gpu_check.card_env({**machine, "gpus": 0}, {})


def test_the_gpu_plan_configs_validate_and_its_model_is_qwen3_0_6b_shaped(gpu_check: ModuleType,
                                                                          tmp_path: Path) -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from prime_lab.trainer.config import validate_rl_config
    from prime_lab.trainer.sft_config import validate_sft_config

    plan = gpu_check.GPU_PLAN
    assert (plan.rl.steps, plan.rl.batch, plan.rl.group, plan.rl.max_tokens, plan.sft_steps, plan.moe.steps) == \
        (10, 64, 8, 128, 10, 3)
    moe = tmp_path / "moe"
    gpu_check.build_model("tiny-qwen3-moe", moe)
    lora = f"target_modules = {json.dumps(gpu_check.ATTENTION)}\ntarget_parameters = {json.dumps(gpu_check.EXPERTS)}"
    for text, check_model in ((gpu_check.rl_config(moe, plan.moe, lora), True),
                              (gpu_check.rl_config(tmp_path / "m", plan.rl, 'target_modules = ["q_proj"]'), False)):
        result = validate_rl_config(text, check_model=check_model)
        assert result.ok, [p.format() for p in result.problems]
    sft = validate_sft_config(gpu_check.sft_config(tmp_path / "m", tmp_path / "data.jsonl", plan))
    assert sft.ok, [p.format() for p in sft.problems]

    shape = gpu_check.model_shape(plan.model)
    config = Qwen3Config(hidden_size=shape.hidden_size, intermediate_size=shape.intermediate_size,
                         num_hidden_layers=shape.num_hidden_layers, num_attention_heads=shape.num_attention_heads,
                         num_key_value_heads=shape.num_key_value_heads, head_dim=shape.head_dim,
                         vocab_size=151936, tie_word_embeddings=True)
    with torch.device("meta"):
        params = sum(p.numel() for p in Qwen3ForCausalLM(config).parameters())
    assert 0.59e9 < params < 0.61e9  # Qwen3-0.6B's count with its own vocabulary


def test_the_goals_sit_beside_the_figures(gpu_check: ModuleType) -> None:
    def shape(speed: float, memory: float, tokens: float = 1.0, peak: float = 1.0) -> dict[str, object]:
        return {"finished": True, "speed_ratio": speed, "memory_ratio": memory,
                "ours": {"tokens_per_s": tokens, "peak_gib": peak}}

    parts = {"shapes": {"figures": {"shapes": {"rl": shape(1.31, 0.5), "rl-varying": shape(2.4, 0.5),
                                               "long": shape(1.26, 0.54), "long-ac": shape(1.0, 1.0, 20_100, 4.85)}}},
             "rl": {"figures": {"wall_s_per_step": 3.2}}}
    rows = gpu_check.goal_rows(parts)
    assert [(row["figure"], row["met"]) for row in rows] == [
        (1.31, True), (2.4, False), (1.26, True), (0.54, False), (20_100, True), (4.85, True), (3.2, False)], rows
    assert [row["met"] for row in gpu_check.goal_rows({})] == [None] * 7
