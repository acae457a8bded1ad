"""One GPU, end to end, offline: the trainer beside a plain loop, `prime rl run`, `prime sft run` and an MoE run with
expert LoRA on one card, checked, in one JSON file and one table (issue 32).

    python bench/gpu_check.py [--wheelhouse DIR] [--out FILE] [--parts shapes,rl,sft,moe] [--timeouts rl=300,...]
    python bench/gpu_check.py --cpu      # the same plan at toy sizes on the CPU (tests/bench/test_gpu_check.py)

Parts, one after another, each with its own timeout; one that fails or runs out of time never stops the next:
  shapes  bench/trainer_throughput.py --gpu --json: a Qwen3-0.6B-shaped model (random init, bf16, LoRA r16 on every
          linear layer), ours with its defaults beside a plain transformers + peft loop with TRL's loss, shapes rl,
          rl-varying, long and long-ac, 3 steps each (the first is warm-up)
  rl      `prime rl run`, 10 steps, the built-in sampler and the trainer on the one card: a Qwen3-0.6B-shaped model
          (random init) with the tiny tokenizer (models/tiny.py), reverse-text, batch 64 in groups of 8, 128 tokens
  sft     `prime sft run`, 10 steps, the same model on reverse-text's worked answers (16 rows of 256 tokens a step)
  moe     `prime rl run`, 3 steps, the tiny Qwen3-MoE (`build_tiny_qwen3_moe`) with LoRA on the attention and on the
          experts (`[lora] target_parameters`)
Checks (a failed one exits 1): each part finished; each run completed all its steps with every trainer metric finite;
the step-1 mismatch KL (`policy/kl`) of the RL runs < 1e-3; no process of a run left after it ended (its registered
pids and the process groups they lead); the SFT run wrote its model; the MoE adapter holds the expert parameters;
each shape has both sides' figures. Beside them, the goals of issue 32 (figures, not checks): ours / peer on the
shapes, and the rl run's seconds a step: the median wall time between its trainer steps (what a user waits; the
trainer's own `time/step` beside it).

The runs go through the CLI as the `prime` script calls it (`python -c "...cli import main"`), detached, then
waited on through the run registry, under a private PRIME_LAB_HOME in a temp folder (the user's runs and models are
untouched; `--keep` keeps it for the logs).

Offline machines: `--wheelhouse DIR` installs every project with a wheel in DIR (`pip install --no-index
--find-links DIR --no-deps --target TEMP`) and runs this script again with TEMP on PYTHONPATH, which every process
of a run inherits (`runs.paths.child_python` is `python -P`: that drops the current folder from sys.path, not
PYTHONPATH). Where prime_lab is not installed, a temp `prime_lab/` (a copy of src/prime_lab/__init__.py and a link
to each package folder, as pyproject's package-dir maps them) goes on PYTHONPATH too. README, "Training on a GPU",
lists the wheels.

`--cpu`: the same parts at toy sizes (trainer_throughput's `--tiny`, the tiny Qwen3 for rl and sft, 3 steps each,
small batches): a check that the script and the flows work, not a figure.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
import traceback
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from importlib.machinery import PathFinder
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
THROUGHPUT = Path(__file__).resolve().with_name("trainer_throughput.py")
PARTS = ("shapes", "rl", "sft", "moe")
SHAPES = ("rl", "rl-varying", "long", "long-ac")
CLI = "import sys; from prime_lab.workbench.cli import main; sys.exit(main())"  # what the `prime` script runs
PREPARED = "PRIME_LAB_GPU_CHECK_PREPARED"  # set for the re-run under the prepared PYTHONPATH
ENV_ID = "primeintellect/reverse-text"
MOE_MODEL = "tiny-qwen3-moe"  # the moe part's model (a `--build` kind)
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
EXPERTS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
MAX_STEP1_KL = 1e-3
LEFTOVER_GRACE_S = 30.0  # how long a run's processes may take to exit after its final state
PRIME_RL_16K_AC = 13340.0  # prime-rl's published tokens/s: 1 x H100, Qwen3-0.6B LoRA r16, 16k, checkpointing
# What a run's processes import (the probe imports them first and names what is missing).
NEEDED = ("torch", "transformers", "peft", "safetensors", "tokenizers", "numpy", "pydantic", "msgspec", "tomlkit",
          "typer", "rich", "httpx", "openai", "fastapi", "uvicorn", "psutil", "pynvml")
RUN_MODULES = ("prime_lab.workbench.cli", "prime_lab.trainer.launcher", "prime_lab.trainer.orchestrator",
               "prime_lab.trainer.train", "prime_lab.trainer.sft", "prime_lab.inference.builtin.server")


@dataclass(frozen=True)
class RunSize:
    steps: int
    batch: int
    group: int
    max_tokens: int


@dataclass(frozen=True)
class Plan:
    """The sizes of each part in a mode."""
    mode: str
    shapes_flag: str  # trainer_throughput's: --gpu (the 0.6B shape) or --tiny (2 layers, on the CPU)
    shape_steps: int
    model: str  # the rl and sft runs' model (a `--build` kind)
    rl: RunSize
    sft_steps: int
    sft_rows: int
    sft_seq_len: int
    sft_batch: int
    moe: RunSize
    timeouts: dict[str, float]


GPU_PLAN = Plan("gpu", "--gpu", 3, "qwen3-0.6b-shaped", RunSize(10, 64, 8, 128), sft_steps=10, sft_rows=640,
                sft_seq_len=256, sft_batch=16, moe=RunSize(3, 16, 4, 32),
                timeouts={"shapes": 420.0, "rl": 180.0, "sft": 120.0, "moe": 150.0})
CPU_PLAN = Plan("cpu", "--tiny", 2, "tiny-qwen3", RunSize(3, 8, 4, 12), sft_steps=3, sft_rows=32, sft_seq_len=256,
                sft_batch=2, moe=RunSize(3, 8, 4, 6),
                timeouts={"shapes": 300.0, "rl": 240.0, "sft": 180.0, "moe": 240.0})


# --- the interpreter: wheels from a folder, prime_lab from the checkout ---------------------------------------------

def link_checkout(dest: Path) -> Path:
    """A folder holding `prime_lab/`: a copy of src/prime_lab/__init__.py and a link to each package folder, as
    pyproject's `[tool.setuptools.package-dir]` maps them (what an install makes importable)."""
    mapping = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    package = dest / "prime_lab"
    package.mkdir(parents=True)
    for name, folder in mapping.items():
        if name == "prime_lab":
            shutil.copy2(REPO / folder / "__init__.py", package / "__init__.py")
        else:
            (package / name.removeprefix("prime_lab.")).symlink_to(REPO / folder, target_is_directory=True)
    return dest


def install_wheels(wheelhouse: Path, site: Path) -> list[str]:
    """Every project with a wheel in `wheelhouse`, installed into `site` from there alone; their names."""
    projects = sorted({wheel.name.split("-")[0] for wheel in wheelhouse.glob("*.whl")})
    if not projects:
        raise SystemExit(f"--wheelhouse {wheelhouse}: no .whl files there; point it at the folder of wheels")
    if importlib.util.find_spec("pip") is None:
        raise SystemExit(f"--wheelhouse needs pip in this interpreter ({sys.executable} -m pip); install it or put "
                         "the wheels' contents on PYTHONPATH yourself")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                           "--no-index", "--find-links", str(wheelhouse), "--no-deps", "--target", str(site),
                           *projects], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"--wheelhouse {wheelhouse}: pip could not install its wheels (exit {done.returncode}):\n"
                         f"{done.stderr[-2000:]}")
    return projects


def rerun_prepared(argv: list[str], wheelhouse: Path | None) -> int:
    """This script again, with the wheelhouse's projects and (where it is not installed) prime_lab on PYTHONPATH."""
    with tempfile.TemporaryDirectory(prefix="prime-lab-gpu-check-python-") as tmp:
        entries: list[Path] = []
        if wheelhouse:
            site = Path(tmp) / "site"
            projects = install_wheels(wheelhouse.resolve(), site)
            print(f"[gpu-check] installed from {wheelhouse}: {', '.join(projects)}", file=sys.stderr, flush=True)
            entries.append(site)
        if importlib.util.find_spec("prime_lab") is None and PathFinder.find_spec("prime_lab",
                                                                                  [str(e) for e in entries]) is None:
            entries.append(link_checkout(Path(tmp) / "src"))
            print(f"[gpu-check] prime_lab from the checkout {REPO}", file=sys.stderr, flush=True)
        path = os.pathsep.join([*map(str, entries), *filter(None, [os.environ.get("PYTHONPATH")])])
        env = {**os.environ, "PYTHONPATH": path, PREPARED: "1"}
        return subprocess.run([sys.executable, str(Path(__file__).resolve()), *argv], env=env).returncode


# --- the hidden modes: a probe of the interpreter and the card, a model build ----------------------------------------

def probe() -> dict[str, Any]:
    """Versions, what cannot be imported, and the card (CUDA is initialised here, in a process of its own)."""
    import importlib
    import platform

    versions: dict[str, str] = {"python": platform.python_version()}
    missing: dict[str, str] = {}
    for name in (*NEEDED, *RUN_MODULES):
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            missing[name] = exc.name or str(exc)  # the module that is not there (a dependency, often)
            continue
        except Exception as exc:  # noqa: BLE001 - any failure to import is what the probe reports
            missing[name] = f"{type(exc).__name__}: {exc}"
            continue
        if name in ("torch", "transformers", "peft"):
            versions[name] = str(module.__version__)
    out: dict[str, Any] = {"versions": versions, "missing": missing, "cores": len(os.sched_getaffinity(0))}
    if "torch" not in missing:
        import torch

        out["gpus"] = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if out["gpus"]:
            out["card"] = torch.cuda.get_device_name(0)
            out["memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
            versions["cuda"] = str(torch.version.cuda)
    return out


def model_shape(kind: str) -> Any:
    """The TinyModelShape of a `--build` kind: "qwen3-0.6b-shaped" (trainer_throughput's Qwen3-0.6B sizes; the tiny
    tokenizer's vocabulary), "tiny-qwen3" or "tiny-qwen3-moe" (models/tiny.py's presets)."""
    from prime_lab.models.tiny import TinyModelShape, tiny_moe_shape

    if kind == "qwen3-0.6b-shaped":
        sys.path.insert(0, str(THROUGHPUT.parent))
        from trainer_throughput import QWEN3_06B as Q

        return TinyModelShape(hidden_size=Q["hidden_size"], intermediate_size=Q["intermediate_size"],
                              num_hidden_layers=Q["num_hidden_layers"], num_attention_heads=Q["num_attention_heads"],
                              num_key_value_heads=Q["num_key_value_heads"], head_dim=Q["head_dim"],
                              max_position_embeddings=Q["max_position_embeddings"])
    if kind == "tiny-qwen3":
        return TinyModelShape()
    if kind == "tiny-qwen3-moe":
        return tiny_moe_shape("qwen3-moe")
    raise SystemExit(f"--build: unknown model {kind!r}")


def build_model(kind: str, dest: Path) -> None:
    """The model `kind` (random init, seed 0, with the tiny tokenizer) written to `dest`."""
    from prime_lab.models.tiny import build_tiny_model

    build_tiny_model(dest, shape=model_shape(kind))


def card_env(machine: dict[str, Any], environ: dict[str, str]) -> dict[str, str]:
    """What the GPU plan adds to the environment: with several GPUs visible, the first alone (the check is of one
    card); SystemExit where the probe saw none."""
    gpus = int(machine.get("gpus") or 0)
    if not gpus:
        raise SystemExit(f"no CUDA GPU is visible to torch {machine['versions'].get('torch')}: run this on a "
                         "machine with one, or use --cpu for the toy plan")
    if gpus == 1:
        return {}
    return {"CUDA_VISIBLE_DEVICES": (environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]}


# --- a part: its time, its checks, its figures ----------------------------------------------------------------------

class PartTimedOut(Exception):
    pass


@dataclass
class Part:
    name: str
    timeout: float
    started: float = field(default_factory=time.monotonic)
    finished: bool = False  # ran to its end within its time
    problems: list[str] = field(default_factory=list)  # failed checks
    figures: dict[str, Any] = field(default_factory=dict)
    logs: str = ""  # the tails of its logs, where a check failed
    models_after: tuple[str, ...] = ()  # models of later parts, built with this part's own (one interpreter)

    def left(self) -> float:
        return self.timeout - (time.monotonic() - self.started)

    def to_json(self) -> dict[str, Any]:
        return {"finished": self.finished, "checked": self.finished and not self.problems, "problems": self.problems,
                "wall_s": round(time.monotonic() - self.started, 1), "timeout_s": self.timeout,
                "figures": self.figures, **({"logs": self.logs} if self.logs else {})}


def group_members(groups: set[int]) -> list[int]:
    """Live processes (not zombies) in any of the process groups `groups`, from /proc."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _, pgrp = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue
        if int(pgrp) in groups and state != "Z":
            members.append(int(stat.parent.name))
    return members


def describe(pids: list[int]) -> str:
    def command(pid: int) -> str:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:160]
        except OSError:
            return "?"
    return "; ".join(f"{pid} ({command(pid).strip()})" for pid in pids)


def wait_gone(find: Any, grace: float = LEFTOVER_GRACE_S) -> list[int]:
    """Poll `find()` (live pids) until it is empty or `grace` s passed; what is still there."""
    deadline = time.monotonic() + grace
    while (left := find()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return list(left)


def kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def log_tail(path: Path, chars: int = 3000) -> str:
    try:
        return f"--- {path.name}\n{path.read_text(errors='replace')[-chars:]}"
    except OSError:
        return ""


# --- part a: the trainer's shapes beside the peer -------------------------------------------------------------------

def part_shapes(part: Part, plan: Plan, work: Path) -> None:
    """bench/trainer_throughput.py with --json, in a session of its own (killed whole at the timeout)."""
    report_path, log = work / "shapes.json", work / "shapes.log"
    argv = [sys.executable, str(THROUGHPUT), plan.shapes_flag, "--shapes", ",".join(SHAPES),
            "--steps", str(plan.shape_steps), "--json", str(report_path)]
    part.figures["command"] = " ".join(argv[1:])
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True, cwd=REPO)
    try:
        code: int | None = process.wait(timeout=max(1.0, part.left()))
    except subprocess.TimeoutExpired:
        code = None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        part.problems.append(f"timed out after {part.timeout:g} s")
    finally:
        if process.poll() is None:  # interrupted: take its processes down with it
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
    report = json.loads(report_path.read_text()) if report_path.is_file() else {}
    shapes = report.get("shapes", {})
    part.figures.update(card=report.get("card"), steps=report.get("steps"), shapes=shapes)
    for name in SHAPES:
        record = shapes.get(name) or {}
        if not record.get("finished"):
            part.problems.append(f"{name}: " + (record.get("error", "")[-600:] or "no figures"))
    if code not in (0, None) and not part.problems:
        part.problems.append(f"trainer_throughput.py exited {code}")
    left = wait_gone(lambda: group_members({process.pid}))
    if left:
        part.problems.append(f"processes left: {describe(left)}")
        kill(left)
    part.finished = code is not None
    if part.problems:
        part.logs = log_tail(log, 6000)


# --- parts b-d: runs through the CLI ----------------------------------------------------------------------------------

def ensure_model(kind: str, work: Path, part: Part) -> Path:
    """The model `kind` under work/models (built once, in a process of its own, within the part's time; with it,
    `part.models_after` not yet built: torch's and transformers' imports are most of a tiny model's build)."""
    dest = work / "models" / kind
    if (dest / "config.json").is_file():
        return dest
    kinds = list(dict.fromkeys([kind, *part.models_after]))
    kinds = [k for k in kinds if not (work / "models" / k / "config.json").is_file()]
    pairs = [(k, work / "models" / f"{k}.partial") for k in kinds]
    argv = [sys.executable, str(Path(__file__).resolve())]
    for k, partial in pairs:
        shutil.rmtree(partial, ignore_errors=True)
        argv += ["--build", k, str(partial)]
    what = f"the model{'s' if len(kinds) > 1 else ''} {', '.join(kinds)}"
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=max(1.0, part.left()))
    except subprocess.TimeoutExpired:
        raise PartTimedOut(f"building {what} took more than the part's {part.timeout:g} s") from None
    if done.returncode != 0:
        raise RuntimeError(f"building {what} failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    for k, partial in pairs:
        partial.rename(work / "models" / k)
    return dest


def rl_config(model: Path, size: RunSize, lora: str) -> str:
    return f"""model = "{model}"
max_steps = {size.steps}
batch_size = {size.batch}
rollouts_per_example = {size.group}

[sampling]
max_tokens = {size.max_tokens}

[[env]]
id = "{ENV_ID}"

[inference]
backend = "builtin"

[lora]
r = 16
alpha = 32
{lora}
"""


def sft_config(model: Path, data: Path, plan: Plan) -> str:
    return f"""model = "{model}"
max_steps = {plan.sft_steps}

[data]
name = "{data}"
seq_len = {plan.sft_seq_len}
batch_size = {plan.sft_batch}

[lora]
r = 16
alpha = 32
target_modules = {json.dumps(LORA_TARGETS)}
"""


def run_leftovers(run: Any) -> list[int]:
    """Live processes of `run`: its registered pids, and any process in the run's group or in a group one of them
    leads (a sampler leads its own); never this process's own group."""
    from prime_lab.runs.registry import pid_alive

    status = run.read_status()
    registered = run.registered_processes(status)
    alive = {pid for _, pid, start in registered if pid_alive(pid, start)}
    groups = {pid for _, pid, _ in registered} | ({status["pgid"]} if isinstance(status.get("pgid"), int) else set())
    return sorted(alive | set(group_members(groups - {os.getpgrp()})) - {os.getpid()})


def start_run(part: Part, kind: str, config: Path, work: Path) -> Any:
    """`prime KIND run @config` (detached) through the CLI; the run."""
    from prime_lab.runs.registry import RunRegistry

    argv = [sys.executable, "-P", "-c", CLI, kind, "run", f"@{config}", "--name", f"gpu-check-{part.name}"]
    part.figures["command"] = f"prime {kind} run @{config.name} --name gpu-check-{part.name}"
    limit = max(1.0, min(120.0, part.left()))
    try:
        done = subprocess.run(argv, capture_output=True, text=True, cwd=work, timeout=limit)
    except subprocess.TimeoutExpired:
        raise PartTimedOut(f"`prime {kind} run` did not return within {limit:.0f} s") from None
    run_id = (done.stdout.split() or [""])[0]
    if done.returncode != 0 or not run_id:
        raise RuntimeError(f"`prime {kind} run` exited {done.returncode}:\n{done.stderr[-2000:]}")
    part.figures["run_id"] = run_id
    return RunRegistry().get(run_id)


def follow_run(part: Part, run: Any, max_steps: int) -> dict[int, Any]:
    """Wait for the run's final state (stop it at the part's timeout), check it and its processes; the trainer's
    metrics events by step."""
    from prime_lab.runs.registry import FINAL_STATES, RunRegistry

    status: dict[str, Any] = {}
    ended = False
    started = time.monotonic()
    try:
        while part.left() > 0:
            status = run.status()
            if status.get("state") in FINAL_STATES:
                ended = True
                break
            time.sleep(0.25)
    finally:
        if not ended:  # timed out or interrupted: the run must not outlive the check (its home is temporary)
            RunRegistry().stop(run.id, grace=15.0)
            run.end_processes()
    if not ended:
        part.problems.append(f"timed out after {part.timeout:g} s at step {status.get('step')}: stopped")
    status = run.status()
    part.figures.update(state=status.get("state"), steps=status.get("step"),
                        run_wall_s=round(time.monotonic() - started, 1))
    if ended and status.get("state") != "completed":
        part.problems.append(f"the run ended {status.get('state')}: {status.get('reason') or 'no reason given'}")
    left = wait_gone(lambda: run_leftovers(run))
    part.figures["processes_left"] = left
    if left:
        part.problems.append(f"processes left after the run ended: {describe(left)}")
        kill(left)
    part.finished = ended
    steps = {e.step: e for e in run.event_log().events()
             if e.kind == "metrics" and e.source == "trainer" and e.step is not None and "time/step" in e.data}
    missing = [k for k in range(1, max_steps + 1) if k not in steps]
    if missing and ended:
        part.problems.append(f"no trainer metrics for step(s) {', '.join(map(str, missing))}")
    bad = sorted({f"{k} (step {s})" for s, e in steps.items() for k, v in e.data.items()
                  if isinstance(v, float | int) and not math.isfinite(v)})
    if bad:
        part.problems.append("non-finite trainer metrics: " + ", ".join(bad[:8]))
    if steps:
        part.figures["trainer_s_per_step"] = statistics.median(e.data["time/step"] for e in steps.values())
        times = [steps[k].time for k in sorted(steps)]
        if len(times) > 1:  # from step 1's end on: start-up and the first step's compile are left out
            part.figures["wall_s_per_step"] = statistics.median(b - a for a, b in zip(times, times[1:], strict=False))
        compiled = [e.data["time/compile"] for e in steps.values() if "time/compile" in e.data]
        if compiled:
            part.figures["compile_s"] = sum(compiled)
        recompiles = [e.data["compile/recompiles"] for _, e in sorted(steps.items()) if "compile/recompiles" in e.data]
        if recompiles:  # graphs compiled after step 2 (the trainer's running count): 0 when lengths stay reused
            part.figures["recompiles"] = recompiles[-1]
        peaks = [e.data.get("perf/peak_memory_gib", e.data.get("perf/peak_memory")) for e in steps.values()]
        if any(p is not None for p in peaks):
            part.figures["peak_gib"] = max(p for p in peaks if p is not None)
    return steps


def check_step1_kl(part: Part, steps: dict[int, Any]) -> None:
    kl = steps[1].data.get("policy/kl") if 1 in steps else None
    part.figures["kl_step1"] = kl
    if kl is None or not math.isfinite(kl) or abs(kl) >= MAX_STEP1_KL:
        part.problems.append(f"step-1 mismatch KL (policy/kl) is {kl}, not < {MAX_STEP1_KL:g}")


def with_logs(part: Part, run: Any) -> None:
    if part.problems and run is not None:
        part.logs = "\n".join(filter(None, (log_tail(p) for p in sorted(run.logs_dir.glob("*.log")))))


def part_rl(part: Part, plan: Plan, work: Path) -> None:
    model = ensure_model(plan.model, work, part)
    config = work / "rl.toml"
    config.write_text(rl_config(model, plan.rl, f"target_modules = {json.dumps(LORA_TARGETS)}"))
    part.figures.update(model=plan.model, batch=plan.rl.batch, group=plan.rl.group, max_tokens=plan.rl.max_tokens)
    run = start_run(part, "rl", config, work)
    steps = follow_run(part, run, plan.rl.steps)
    check_step1_kl(part, steps)
    with_logs(part, run)


def part_sft(part: Part, plan: Plan, work: Path) -> None:
    from prime_lab.envs.builtin.reverse_text import sft_rows

    model = ensure_model(plan.model, work, part)
    data = work / "sft-data.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in sft_rows(plan.sft_rows)))
    config = work / "sft.toml"
    config.write_text(sft_config(model, data, plan))
    part.figures.update(model=plan.model, rows=plan.sft_rows, seq_len=plan.sft_seq_len, batch=plan.sft_batch)
    run = start_run(part, "sft", config, work)
    follow_run(part, run, plan.sft_steps)
    if part.figures.get("state") == "completed" and not (run.model_dir / "config.json").is_file():
        part.problems.append(f"the completed run wrote no model ({run.model_dir}/config.json)")
    with_logs(part, run)


def part_moe(part: Part, plan: Plan, work: Path) -> None:
    model = ensure_model(MOE_MODEL, work, part)
    config = work / "moe.toml"
    lora = f"target_modules = {json.dumps(ATTENTION)}\ntarget_parameters = {json.dumps(EXPERTS)}"
    config.write_text(rl_config(model, plan.moe, lora))
    part.figures.update(model=MOE_MODEL, batch=plan.moe.batch, group=plan.moe.group)
    run = start_run(part, "rl", config, work)
    steps = follow_run(part, run, plan.moe.steps)
    check_step1_kl(part, steps)
    adapter = run.adapters_dir / f"step_{plan.moe.steps}" / "adapter_config.json"
    if part.figures.get("state") == "completed":
        targets = json.loads(adapter.read_text()).get("target_parameters") if adapter.is_file() else None
        if sorted(targets or []) != sorted(EXPERTS):
            part.problems.append(f"the final adapter's target_parameters are {targets}, not {EXPERTS}")
    with_logs(part, run)


RUNNERS = {"shapes": part_shapes, "rl": part_rl, "sft": part_sft, "moe": part_moe}


def models_of(plan: Plan, parts: list[str]) -> tuple[str, ...]:
    """The `--build` kinds `parts` run on."""
    kinds = {"rl": plan.model, "sft": plan.model, "moe": MOE_MODEL}
    return tuple(dict.fromkeys(kinds[p] for p in parts if p in kinds))


def stop_active_runs() -> list[str]:
    """Stop every run of the private registry that is still active (a `prime rl run` cut off after it started
    one, an interrupted check) and end its processes; their ids."""
    from prime_lab.runs.registry import ACTIVE_STATES, RunRegistry

    stopped = []
    for run in RunRegistry().runs():
        if run.status().get("state") in ACTIVE_STATES:
            RunRegistry().stop(run.id, grace=15.0)
            stopped.append(run.id)
        kill(run_leftovers(run))
    return stopped


def run_part(name: str, plan: Plan, work: Path, timeout: float, models_after: tuple[str, ...] = ()) -> Part:
    part = Part(name, timeout, models_after=models_after)
    print(f"[gpu-check] {name}: started (at most {timeout:g} s)", file=sys.stderr, flush=True)
    try:
        RUNNERS[name](part, plan, work)
    except PartTimedOut as exc:
        part.problems.append(str(exc))
    except Exception as exc:  # noqa: BLE001 - a part that crashes is reported; the next part still runs
        part.finished = False
        part.problems.append(f"{type(exc).__name__}: {exc}")
        part.logs = part.logs or traceback.format_exc()[-3000:]
    finally:
        if name != "shapes":  # its runs live in trainer_throughput's own home, ended with its session
            stopped = stop_active_runs()
            if stopped:
                part.problems.append(f"stopped {', '.join(stopped)}, still active after the part")
    verdict = "checked" if part.finished and not part.problems else "FAILED: " + "; ".join(part.problems)[:300]
    print(f"[gpu-check] {name}: {time.monotonic() - part.started:.0f} s, {verdict}", file=sys.stderr, flush=True)
    return part


# --- the goals, the table ------------------------------------------------------------------------------------------

def goal_rows(parts: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 32's goals beside the figures (None where a part did not give one)."""
    shapes = parts.get("shapes", {}).get("figures", {}).get("shapes", {})

    def shape(name: str, *keys: str) -> float | None:
        value: Any = shapes.get(name) or {}
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        return float(value) if isinstance(value, int | float) else None

    rows = [("rl (64 x 2,048, groups of 8): ours / peer tokens/s", shape("rl", "speed_ratio"), ">=", 1.3, "x"),
            ("rl-varying (completions 256-1,536): ours / peer tokens/s", shape("rl-varying", "speed_ratio"), ">=",
             2.5, "x"),
            ("long (one 16k sequence a row): ours / peer tokens/s", shape("long", "speed_ratio"), ">=", 1.2, "x"),
            ("long: ours / peer peak memory", shape("long", "memory_ratio"), "<=", 0.35, "x"),
            ("long-ac (16k, checkpointing): ours tokens/s, 1.5x prime-rl's 13.34k",
             shape("long-ac", "ours", "tokens_per_s"), ">=", 1.5 * PRIME_RL_16K_AC, " tok/s"),
            ("long-ac: ours peak memory (prime-rl's 5.1 GiB)", shape("long-ac", "ours", "peak_gib"), "<=", 5.1,
             " GiB"),
            ("prime rl run, one shared card: wall s/step", parts.get("rl", {}).get("figures", {}).get(
                "wall_s_per_step"), "<=", 3.0, " s")]
    return [{"goal": what, "figure": figure, "op": op, "target": target, "unit": unit,
             "met": None if figure is None else (figure >= target if op == ">=" else figure <= target)}
            for what, figure, op, target, unit in rows]


def number(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == " tok/s":
        return f"{value:,.0f}{unit}"
    return f"{value:.3g}{unit}" if unit != "x" else f"{value:.2f}x"


def part_summary(name: str, part: dict[str, Any]) -> str:
    f = part["figures"]
    if name == "shapes":
        return f"{sum(1 for s in (f.get('shapes') or {}).values() if s.get('finished'))}/{len(SHAPES)} shapes"
    if "state" not in f:
        return "no run"
    parts = [f"{f.get('steps')} steps, {f.get('state')}"]
    if f.get("kl_step1") is not None:
        parts.append(f"step-1 KL {f['kl_step1']:.2g}")
    if f.get("wall_s_per_step") is not None:
        parts.append(f"{f['wall_s_per_step']:.2f} s/step (trainer {f.get('trainer_s_per_step', 0):.2f})")
    elif f.get("trainer_s_per_step") is not None:
        parts.append(f"trainer {f['trainer_s_per_step']:.2f} s/step")
    if f.get("compile_s") is not None:
        parts.append(f"compile {f['compile_s']:.0f} s, {f.get('recompiles', 0):g} recompiles after step 2")
    parts.append(f"{len(f.get('processes_left') or [])} processes left")
    return ", ".join(parts)


def table(report: dict[str, Any]) -> str:
    machine = report["machine"]
    versions = ", ".join(f"{k} {v}" for k, v in machine["versions"].items())
    lines = [f"GPU check ({report['mode']} plan) on {report['card']} ({versions}), {report['wall_s']:.0f} s", "",
             f"{'part':8} {'finished':9} {'checks':7} figures"]
    for name, part in report["parts"].items():
        lines.append(f"{name:8} {'yes' if part['finished'] else 'no':9} {'passed' if part['checked'] else 'FAILED':7} "
                     f"{part_summary(name, part)} ({part['wall_s']:.0f} s)")
    shapes = report["parts"].get("shapes", {}).get("figures", {}).get("shapes") or {}
    if shapes:
        lines += ["", f"{'shape':11} {'ours tok/s':>11} {'ours peak':>10} {'peer tok/s':>11} {'peer peak':>10} "
                      f"{'ours/peer':>9} {'memory':>7}"]
        for name, s in shapes.items():
            if s.get("finished"):
                o, p = s["ours"], s["peer"]
                lines.append(f"{name:11} {o['tokens_per_s']:>11,.0f} {o['peak_gib']:>6.2f} GiB "
                             f"{p['tokens_per_s']:>11,.0f} {p['peak_gib']:>6.2f} GiB {s['speed_ratio']:>8.2f}x "
                             f"{s['memory_ratio']:>6.2f}x")
            else:
                lines.append(f"{name:11} failed")
    toy = "" if report["mode"] == "gpu" else " (toy sizes on the CPU: the goals are the GPU plan's)"
    lines += ["", f"goals of issue 32{toy}:"]
    for row in report["goals"]:
        met = "-" if row["met"] is None else "met" if row["met"] else "NOT met"
        lines.append(f"  {row['goal']:66} {number(row['figure'], row['unit']):>13}  {row['op']} "
                     f"{number(row['target'], row['unit']):>12}  {met}")
    problems = [f"  {name}: {p}" for name, part in report["parts"].items() for p in part["problems"]]
    if problems:
        lines += ["", "failed checks:", *problems]
    return "\n".join(lines)


# --- main ---------------------------------------------------------------------------------------------------------

def parse_timeouts(text: str, parser: argparse.ArgumentParser) -> dict[str, float]:
    out = {}
    for item in filter(None, text.split(",")):
        name, _, seconds = item.partition("=")
        try:
            out[name] = float(seconds)
        except ValueError:
            parser.error(f"--timeouts: {item!r} is not PART=SECONDS (e.g. rl=300)")
        if name not in PARTS:
            parser.error(f"--timeouts: unknown part {name!r}; choose from {', '.join(PARTS)}")
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="the same plan at toy sizes on the CPU")
    parser.add_argument("--wheelhouse", type=Path, default=None, metavar="DIR",
                        help="install the wheels in DIR (offline) and run with them on PYTHONPATH")
    parser.add_argument("--out", type=Path, default=None, metavar="FILE",
                        help="the JSON report (default outputs/gpu-check/<mode>-<UTC time>.json)")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"which parts (default {','.join(PARTS)})")
    parser.add_argument("--timeouts", default="", metavar="PART=S,...", help="seconds a part may take (defaults: "
                        + ", ".join(f"{k} {v:g}" for k, v in GPU_PLAN.timeouts.items()) + "; --cpu: "
                        + ", ".join(f"{k} {v:g}" for k, v in CPU_PLAN.timeouts.items()) + ")")
    parser.add_argument("--keep", action="store_true", help="keep the private PRIME_LAB_HOME (the runs' logs)")
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)  # the probe's own process
    parser.add_argument("--build", nargs=2, action="append", default=None,
                        help=argparse.SUPPRESS)  # KIND DEST: a model build (repeated: several, one interpreter)
    args = parser.parse_args(argv)
    if args.probe:
        print(json.dumps(probe()), flush=True)
        return 0
    if args.build:
        for kind, dest in args.build:
            build_model(kind, Path(dest))
        return 0
    parts = [p for p in args.parts.split(",") if p]
    unknown = [p for p in parts if p not in PARTS]
    if unknown or not parts:
        parser.error(f"--parts: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(PARTS)}")
    if args.wheelhouse and not args.wheelhouse.is_dir():
        parser.error(f"--wheelhouse {args.wheelhouse}: no such folder")
    plan = CPU_PLAN if args.cpu else GPU_PLAN
    timeouts = {**plan.timeouts, **parse_timeouts(args.timeouts, parser)}
    if not os.environ.get(PREPARED) and (args.wheelhouse or importlib.util.find_spec("prime_lab") is None):
        return rerun_prepared(argv, args.wheelhouse)
    if importlib.util.find_spec("prime_lab") is None:
        raise SystemExit("prime_lab is not importable here, even from the checkout's folders")
    out = args.out or Path("outputs") / "gpu-check" / f"{plan.mode}-{datetime.now(UTC):%Y%m%d-%H%M%S}.json"
    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="prime-lab-gpu-check-"))
    try:
        return check(plan, parts, timeouts, work, out)
    finally:
        if args.keep:
            print(f"[gpu-check] kept the private PRIME_LAB_HOME: {work / 'home'}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


def check(plan: Plan, parts: list[str], timeouts: dict[str, float], work: Path, out: Path) -> int:
    started = time.monotonic()
    os.environ["PRIME_LAB_HOME"] = str(work / "home")  # the runs' registry: private, removed at the end
    os.environ["PRIME_LAB_MODELS"] = str(work / "home" / "models")
    try:
        found = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--probe"], capture_output=True,
                               text=True, timeout=300)
    except subprocess.TimeoutExpired:
        raise SystemExit("the probe of this interpreter (imports, the card) took over 300 s") from None
    if found.returncode != 0:
        raise SystemExit(f"the probe of this interpreter failed (exit {found.returncode}):\n{found.stderr[-2000:]}")
    machine = json.loads(found.stdout.strip().splitlines()[-1])
    if machine["missing"]:
        raise SystemExit(f"this interpreter cannot import what the runs need; missing: "
                         f"{', '.join(sorted(set(machine['missing'].values())))} (for "
                         f"{', '.join(machine['missing'])}): give --wheelhouse DIR with their wheels (README.md, "
                         "\"Training on a GPU\")")
    if plan.mode == "gpu":
        one = card_env(machine, dict(os.environ))
        if one:
            os.environ.update(one)
            machine["note"] = f"{machine['gpus']} GPUs visible; the check uses one ({one})"
    card = machine.get("card") if plan.mode == "gpu" else f"CPU, {machine['cores']} cores"
    report: dict[str, Any] = {"mode": plan.mode, "card": card, "machine": machine, "plan": asdict(plan),
                              "started_at": datetime.now(UTC).isoformat(timespec="seconds"), "parts": {}}
    import prime_lab

    report["prime_lab"] = str(Path(prime_lab.__file__).parent)
    report["pythonpath"] = os.environ.get("PYTHONPATH", "")  # what the runs' processes inherit
    for i, name in enumerate(parts):
        later = models_of(plan, parts[i + 1:]) if plan.mode == "cpu" else ()  # the GPU plan's builds stay apart
        report["parts"][name] = run_part(name, plan, work, timeouts[name], later).to_json()
        report["wall_s"] = time.monotonic() - started
        report["goals"] = goal_rows(report["parts"])
        report["ok"] = all(p["checked"] for p in report["parts"].values())
        out.write_text(json.dumps(report, indent=2) + "\n")
    print(table(report), flush=True)
    print(f"\nJSON: {out}", flush=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
