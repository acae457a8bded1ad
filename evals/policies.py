"""A trained run's policy for an evaluation (`prime eval run --adapter RUN[:STEP]`), and the sampler that serves it.

What `RUN[:STEP]` names, by the run's layout (DESIGN.md, trainer/versions.py):
- `adapters/step_N/`: a LoRA adapter, loaded into a sampler on the run's base model at runtime, and asked for by
  its own name (`/v1/load_lora_adapter`, which vLLM and the built-in server both answer);
- `weights/step_N/`: full fine-tuning's weights (no tokenizer of their own), loaded at runtime into a sampler on the
  base model, as the RL orchestrator does (`RuntimeWeights`);
- `checkpoints/step_N/`: either of the two, written beside the trainer's state;
- an SFT run without STEP: its `model/` folder (the base with its training merged in), served as the model.
Without STEP: the newest step the run published (for an SFT run with a model folder, that folder).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from prime_lab.models.store import holds_full_weights, is_model_folder
from prime_lab.runs.registry import Run, RunError, RunRegistry

if TYPE_CHECKING:
    from prime_lab.runs.processes import RunningServer

PolicyKind = Literal["adapter", "weights", "model"]
STEP_DIR = re.compile(r"^step_(\d+)$")
VERSION_FOLDERS = ("adapters", "weights", "checkpoints")  # where a step's policy is looked for, in this order


class PolicyNotFoundError(LookupError):
    """`RUN[:STEP]` names no trained policy, or the base model given does not match the run's."""


@dataclass(frozen=True)
class TrainedPolicy:
    """A run's policy at one step: what to serve and on which base model."""

    run_id: str
    run_kind: str  # rl | sft
    step: int | None  # None: an SFT run's final model folder
    kind: PolicyKind
    path: Path  # the adapter, weights or model folder
    base_model: str  # the model the run was started on, as its user wrote it
    base_model_path: Path  # the folder it resolved to

    @property
    def name(self) -> str:
        """The name requests ask for: `<run>-step-N`, or `<run>-model` for an SFT run's model folder."""
        return f"{self.run_id}-step-{self.step}" if self.step is not None else f"{self.run_id}-model"

    @property
    def source(self) -> str:
        """Where the policy is inside its run folder: `adapters/step_2`, `model`, ..."""
        return f"{self.path.parent.name}/{self.path.name}" if self.step is not None else self.path.name

    def metadata(self) -> dict[str, Any]:
        """The policy as an evaluation's metadata.json records it."""
        record = asdict(self)
        record.update(path=str(self.path), base_model_path=str(self.base_model_path), served_name=self.name,
                      source=self.source)
        return record


def parse_policy_spec(spec: str) -> tuple[str, int | None]:
    """`RUN` or `RUN:STEP` (STEP a step number, or `step_N`) -> (run, step)."""
    run_id, sep, step = spec.partition(":")
    if not run_id:
        raise PolicyNotFoundError(f"--adapter takes RUN[:STEP], got {spec!r}")
    if not sep:
        return run_id, None
    digits = step.removeprefix("step_")
    if not digits.isdigit():
        raise PolicyNotFoundError(f"--adapter {spec}: STEP must be a step number (e.g. {run_id}:20), got {step!r}")
    return run_id, int(digits)


def step_folders(run: Run) -> dict[int, list[Path]]:
    """Every step with a loadable policy in the run, with its folders (adapters/, weights/, checkpoints/ order)."""
    found: dict[int, list[Path]] = {}
    for sub in VERSION_FOLDERS:
        root = run.dir / sub
        if not root.is_dir():
            continue
        for child in root.iterdir():
            match = STEP_DIR.match(child.name)
            if match and _policy_kind(child) is not None:
                found.setdefault(int(match.group(1)), []).append(child)
    for folders in found.values():
        folders.sort(key=lambda p: VERSION_FOLDERS.index(p.parent.name))
    return found


def _policy_kind(folder: Path) -> PolicyKind | None:
    if (folder / "adapter_config.json").is_file():
        return "adapter"
    if holds_full_weights(folder):
        return "weights"
    return None


def resolve_policy(spec: str, model: str | None = None, *, registry: RunRegistry | None = None) -> TrainedPolicy:
    """The policy `spec` (`RUN[:STEP]`) names, on the run's base model. `model` (the `-m` a user gave, if any)
    must name that same base model. Raises PolicyNotFoundError saying what is wrong and what exists."""
    run_id, step = parse_policy_spec(spec)
    try:
        run = (registry or RunRegistry()).get(run_id)
    except RunError as exc:
        raise PolicyNotFoundError(f"--adapter {spec}: {exc}") from None
    status = run.read_status()
    kind = str(status.get("kind") or "")
    if kind not in ("rl", "sft"):
        hint = " (its best prompt is evaluated with --system-prompt-file RUN)" if kind == "gepa" else ""
        raise PolicyNotFoundError(f"--adapter {spec}: run {run.id} is a {kind or 'unknown'} run; only an RL or SFT "
                                  f"run has a trained policy{hint}")
    base, base_path = _base_model(run, status)
    if model is not None:
        _check_base(spec, model, base, base_path)
    steps = step_folders(run)
    if step is None and kind == "sft" and is_model_folder(run.model_dir):
        return TrainedPolicy(run.id, kind, None, "model", run.model_dir.resolve(), base, base_path)
    if not steps:
        state = status.get("state") or "unknown"
        raise PolicyNotFoundError(f"--adapter {spec}: run {run.id} ({state}) has no trained policy yet (no "
                                  "adapters/step_N, weights/step_N or checkpoints/step_N)")
    if step is None:
        step = max(steps)
    elif step not in steps:
        listed = ", ".join(str(k) for k in sorted(steps))
        raise PolicyNotFoundError(f"--adapter {spec}: run {run.id} has no policy of step {step}; steps it kept: "
                                  f"{listed}")
    folder = steps[step][0]
    policy_kind = _policy_kind(folder)
    assert policy_kind is not None
    return TrainedPolicy(run.id, kind, step, policy_kind, folder.resolve(), base, base_path)


def _base_model(run: Run, status: dict[str, Any]) -> tuple[str, Path]:
    """The run's base model: as its user wrote it, and the folder it resolved to when the run started."""
    from prime_lab.models import ModelNotFoundError, resolve_model

    name = str(status.get("model") or "")
    if status.get("model_path"):
        return name or Path(status["model_path"]).name, Path(status["model_path"])
    try:
        return name, resolve_model(name)
    except ModelNotFoundError as exc:
        raise PolicyNotFoundError(f"run {run.id}'s base model {name!r} is not on this machine: {exc}") from None


def _check_base(spec: str, model: str, base: str, base_path: Path) -> None:
    """Refuse `-m MODEL` when it is not the model the run was trained from."""
    from prime_lab.models import ModelNotFoundError, resolve_model

    if model == base:
        return
    try:
        given = resolve_model(model)
    except ModelNotFoundError:
        given = None
    if given is not None and given.resolve() == base_path.resolve():
        return
    raise PolicyNotFoundError(
        f"-m {model} is not the model {spec.partition(':')[0]} was trained from ({base}, {base_path}): its adapter "
        f"or weights only fit that model. Leave -m out, or give -m {base}.")


def lora_rank(adapter: Path) -> int:
    """The adapter's largest rank (`r` in adapter_config.json, or a larger one of its `rank_pattern`; 16 where it
    says nothing readable). A vLLM start rounds it up to a rank vLLM accepts (`inference.vllm.vllm_lora_rank`)."""
    try:
        config = json.loads((adapter / "adapter_config.json").read_text())
    except (OSError, ValueError):
        return 16
    if not isinstance(config, dict):
        return 16
    pattern = config.get("rank_pattern")
    ranks = [config.get("r"), *(pattern.values() if isinstance(pattern, dict) else ())]
    return max((r for r in ranks if isinstance(r, int) and r > 0), default=16)


def start_policy_sampler(policy: TrainedPolicy, run: Run, backend: str, *, role: str = "inference",
                         announce: Callable[[str], None] = print) -> RunningServer:
    """Start `backend` for `run` serving `policy` under `policy.name` (the model name requests ask for).

    An adapter is loaded at runtime into a sampler on the base model; weights are loaded at runtime into a sampler
    on the base model (they come without a tokenizer) that serves them under the policy's name; an SFT run's model
    folder is served as the model; vLLM is started for the adapter's rank and, for an adapter on MoE experts (peft
    `target_parameters`), with expert LoRA on. Raises what `inference.launch.start_sampler` raises, and
    `inference.control.AdapterLoadError` (WeightLoadError for weights) when the server refuses the policy; the
    server is stopped then."""
    from prime_lab.inference.control import RuntimeAdapters, RuntimeWeights, adapter_targets_parameters
    from prime_lab.inference.launch import SamplerOptions, start_sampler

    log = run.log_path(role)
    if policy.kind == "model":
        announce(f"Starting the {backend} sampler on {policy.path} ...")
        server = start_sampler(backend, policy.path, log, served_name=policy.name)
    elif policy.kind == "weights":
        announce(f"Starting the {backend} sampler on {policy.base_model_path} with {policy.source} ...")
        server = start_sampler(backend, policy.base_model_path, log, served_name=policy.name,
                               options=SamplerOptions(lora=False))
    else:
        announce(f"Starting the {backend} sampler on {policy.base_model_path} with adapter {policy.source} ...")
        server = start_sampler(backend, policy.base_model_path, log,
                               options=SamplerOptions(max_lora_rank=lora_rank(policy.path),
                                                      expert_lora=adapter_targets_parameters(policy.path)))
    if server.process.pid:
        run.register_process(role, server.process.pid)
    try:
        if policy.kind == "weights":
            RuntimeWeights(server.root_url).load(policy.path)
        elif policy.kind == "adapter":
            RuntimeAdapters(server.root_url).load(policy.name, policy.path)
    except BaseException:
        server.stop()
        raise
    return server
