"""The launcher: `prime rl run` creates the run and starts this supervisor detached; it starts the three roles and
watches them until the run ends.

    python -m prime_lab.trainer.launcher RUN_DIR [--resume]

Order: the trainer first (it loads the model while the sampler boots), then the sampler (`[inference].num_servers`
built-in or vLLM servers booting side by side, each on its own port and GPUs, registered as `inference`,
`inference-2`, ...; or external URLs checked for an answer), then a local teacher, then the orchestrator, given every
sampler's URL. Where a vLLM engine shares a GPU with the trainer, the sampler starts only once the trainer has said
it is ready (its "trainer ready" log line, written once its model is on the device): vLLM sizes its KV cache from
what the device has free while it profiles, so the trainer must not be loading then. GPUs and each vLLM engine's
share of them are planned once, before anything starts (trainer/placement.py: the sampler servers first, then the
trainer; `self.placement`); a plan whose engines do not fit their cards fails the run with the numbers. Every wait
has a timeout. The run is `failed` within seconds when a process exits with an error (the reason is that process's
last ERROR event, or the tail of its log) or when a sampler server dies or stops answering `/health`; the other
processes are then stopped. SIGTERM (`prime rl stop`) stops them all cleanly: the trainer finishes its step and
checkpoints. The run ends `completed` when the trainer has trained `max_steps` steps. Meanwhile a thread samples
what each process of the run costs and each GPU into the event log (`system` events, runs/system_metrics.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

from prime_lab.envs.judges import JudgeConfig
from prime_lab.inference.backend import BackendChoice
from prime_lab.inference.vllm import vllm_installed, vllm_release
from prime_lab.models.store import experts_of
from prime_lab.monitors.alerts import SANDBOX_NOTICE, AlertMonitor
from prime_lab.monitors.wandb_mirror import mirror_argv, wanted
from prime_lab.runs.events import Event, EventLog
from prime_lab.runs.hardware import cuda_available, gpu_devices, usable_cores, visible_gpus
from prime_lab.runs.paths import child_python
from prime_lab.runs.processes import RunningServer, log_tail
from prime_lab.runs.reaper import ReaperHandle, die_with_parent, start_reaper
from prime_lab.runs.registry import Run
from prime_lab.runs.system_metrics import DEFAULT_INTERVAL_S, SystemSampler, interval_from_env
from prime_lab.sandbox.stats import NoticeFollower
from prime_lab.trainer.batch import batch_path
from prime_lab.trainer.config import InferenceConfig, RLConfig, TeacherConfig
from prime_lab.trainer.distributed import NODE_VARIABLES, Topology, TopologyError, topology, torchrun_argv
from prime_lab.trainer.placement import (
    SIDE_ROLES,
    ChildDevices,
    EngineNeed,
    Placement,
    PlacementError,
    child_devices,
    describe_devices,
    describe_memory,
    idle_gpus_note,
    model_size,
    plan_gpus,
    sampler_role,
    sampler_waits_for_trainer,
)
from prime_lab.trainer.runtime import StopFlag, checkpoint_to_resume, load_run_config, log_both
from prime_lab.trainer.sft_config import SFTConfig
from prime_lab.trainer.versions import drop_versions_after, weights_dir

POLL_S = 0.25
UNHEALTHY_AFTER_S = float(os.environ.get("PRIME_LAB_SAMPLER_UNHEALTHY_S", "30"))  # tests shorten it
HEALTH_EVERY_S = min(5.0, UNHEALTHY_AFTER_S / 3)
STOP_GRACE_S = 120.0  # the trainer may be mid-step on a slow CPU
# torchrun's ranks still running this long after the run's final model (SFT) or checkpoint (RL) was written are
# ended: rarely, a rank hangs in gloo's teardown once rank 0 has exited, and torchrun would wait on it for ever
RANKS_END_S = float(os.environ.get("PRIME_LAB_RANKS_END_S", "60"))  # tests shorten it
EXTERNAL_TIMEOUT_S = 30.0
MIRROR_FINISH_S = 150.0  # the W&B mirror's finish() waits up to 120 s for uploads
TRAINER_READY = "trainer ready"  # how the trainer's log line begins once its model is on the device (trainer/train.py)


def v1_sampling_problem(env_ids: list[str], backend: str, vllm: str | None) -> str | None:
    """Why a run's vLLM sampler cannot serve its verifiers v1 tasksets (installed at a v1 release: their RL rollouts
    sample through /inference/v1/generate, which vLLM serves from 0.32), in one line; None when it can."""
    from prime_lab.envs import isolated, releases
    from prime_lab.inference.vllm import GENERATE_FROM, serves_generate

    if backend != "vllm" or serves_generate(vllm):
        return None
    v1 = [env_id for env_id in env_ids
          if (record := isolated.record_for(env_id)) is not None and releases.v1_release(record.release)]
    if not v1:
        return None
    first = ".".join(str(part) for part in GENERATE_FROM)
    return (f"{', '.join(v1)}: verifiers v1 taskset(s), whose RL rollouts sample through /inference/v1/generate, "
            f"which vLLM {vllm} does not serve (vLLM {first} on does); upgrade vLLM or set [inference] backend = "
            '"builtin"')


class LaunchFailed(RuntimeError):
    pass


def card_memory() -> list[int]:
    """Each visible GPU's memory in bytes, in the order `visible_gpus` names them; [] where torch cannot say."""
    return [gpu.memory_bytes for gpu in gpu_devices()[0]]


def worker_pids(pid: int) -> list[int]:
    """The processes `pid` started (torchrun's ranks), from Linux's /proc; none where that cannot be read."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def spawn(run: Run, *, resume: bool = False, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start the supervisor for `run` detached (its own session: it outlives the terminal that started it)."""
    argv = [*child_python(), "-m", "prime_lab.trainer.launcher", str(run.dir)] + (["--resume"] if resume else [])
    with open(run.log_path("launcher"), "ab") as log:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env={**os.environ, **(env or {})})


def prepare_resume(run: Run) -> int:
    """Drop what was written after the newest checkpoint (batches and adapters of later steps); return its step."""
    found = checkpoint_to_resume(run)
    if found is None:
        kind = run.read_status().get("kind") or "rl"
        raise LaunchFailed(f"{run.id} has no checkpoint yet (checkpoints/step_N), so there is nothing to resume "
                           f"from: start it again with `prime {kind} run`")
    step = found[0]
    for root in (run.checkpoints_dir, run.adapters_dir, weights_dir(run)):  # what a killed writer left half-written
        for partial in root.glob(".step_*.tmp"):
            shutil.rmtree(partial, ignore_errors=True)
    for root in (run.adapters_dir, weights_dir(run)):
        drop_versions_after(root, step)
    for path in run.rollouts_dir.glob("step_*.jsonl"):
        try:
            if int(path.stem.split("_", 1)[1]) > step:
                path.unlink()
        except ValueError:
            continue
    return step


def restart(run: Run, env: dict[str, str] | None = None) -> int:
    """Resume a stopped or failed RL run from its newest complete checkpoint: end what an earlier attempt left,
    drop what was written after the checkpoint, start a new attempt (its events carry the new number, after a
    `restart` event that rewinds every reader to the checkpoint's step) and spawn its supervisor (registered before
    this returns). Returns the checkpoint's step; LaunchFailed says why a run cannot restart."""
    from prime_lab.runs.events import RESTART
    from prime_lab.runs.registry import ACTIVE_STATES

    status = run.status()
    kind = status.get("kind")
    if kind not in ("rl", "sft"):
        raise LaunchFailed(f"{run.id} is a {kind} run: only RL and SFT runs restart (GEPA: `prime gepa run "
                           "--resume`)")
    if status.get("state") in ACTIVE_STATES:
        raise LaunchFailed(f"{run.id} is {status.get('state')}: stop it first (`prime {kind} stop {run.id}`)")
    left = run.end_processes()  # what an older supervisor left (a sampler of a run killed before the reaper)
    if left:
        raise LaunchFailed(f"{run.id}: processes {', '.join(map(str, left))} of the earlier attempt did not exit; "
                           "end them first")
    step = prepare_resume(run)
    if step >= int(status.get("max_steps") or 0):
        raise LaunchFailed(f"{run.id} already trained all {step} steps")
    run.update_status(step=step, reason=None, attempt=run.attempt + 1, processes={})
    with run.writer("launcher") as writer:
        writer.emit(RESTART, {"from_step": step, "attempt": run.attempt}, step=step)
    run.set_state("queued", reason=f"resuming after step {step}")
    start_supervisor(run, resume=True, env=env)
    return step


def start_supervisor(run: Run, *, resume: bool, env: dict[str, str] | None = None) -> None:
    """`spawn` the run's supervisor and register it (its own process group) at once, so the run never looks dead
    in between."""
    process = spawn(run, resume=resume, env=env)
    run.register_process("launcher", process.pid, pgid=process.pid)


class Supervisor:
    def __init__(self, run: Run, resume: bool = False) -> None:
        self.run, self.resume = run, resume
        self.config: RLConfig | SFTConfig = load_run_config(run)
        self.sft = isinstance(self.config, SFTConfig)  # an SFT run: the trainer alone, on a dataset
        status = run.read_status()
        self.model_path = Path(status["model_path"])
        self.stop = StopFlag().install()
        self.events = run.writer("launcher")
        self.servers: list[RunningServer] = []  # the local sampler servers, in role order
        self.teacher_server: RunningServer | None = None  # distillation's local teacher
        self.judge_server: RunningServer | None = None  # the environments' local LLM judge ([judge])
        self.placement = Placement([], [], 1)  # planned in start(), before any process starts
        self.devices: dict[str, ChildDevices] = {}  # each local process's GPUs, environment and memory share
        self.vllm_roles: list[str] = []  # the local processes that are vLLM engines on a GPU
        self.trainer_ready = False  # the trainer has said "trainer ready" (its model is on the device)
        self.written_at: float | None = None  # when torchrun's run was first seen with its final output written
        self.ranks_ended = False  # torchrun and its ranks were killed once that output was written (trainer: 0)
        self.started_at = time.time()  # what an earlier attempt wrote is older
        self.topology = Topology()  # likewise
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self.reaper: ReaperHandle | None = None
        self.mirror: subprocess.Popen[bytes] | None = None  # the W&B mirror (not registered: never a run failure)
        self.system: SystemSampler | None = None  # samples every process of the run (`system` events)
        self.offset = 0
        self.last_error: dict[str, str] = {}
        self.monitor = AlertMonitor(loss=self.config.loss if isinstance(self.config, RLConfig) else "rl")
        # what the run's sandboxes say once (a command without the network names the setting), from any process
        self.sandbox_notices = NoticeFollower(run.dir, from_start=not resume)

    def log(self, message: str, level: str = "INFO") -> None:
        log_both(self.events, message, level)

    def start_child(self, role: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        with open(self.run.log_path(role), "ab") as log:
            process = subprocess.Popen([*child_python(), "-m", *argv], stdin=subprocess.DEVNULL, stdout=log,
                                       stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                       preexec_fn=die_with_parent)
        self.children[role] = process
        self.run.register_process(role, process.pid)

    # Start ------------------------------------------------------------------------------------------------
    def start(self) -> None:
        cfg, run = self.config, self.run
        self.run.register_process("launcher", os.getpid(), pgid=os.getpgrp())
        self.reaper = start_reaper(self.run)
        run.set_state("starting")
        resume = ["--resume"] if self.resume else []
        try:
            self.topology = topology(cfg.trainer)
        except TopologyError as exc:
            raise LaunchFailed(str(exc)) from exc
        for name in NODE_VARIABLES:  # torchrun sets each rank's own; the sampler and orchestrator get none
            os.environ.pop(name, None)
        if self.sft:
            self.placement = self.plan_placement("external")  # every GPU is the trainer's
            self.start_trainer(0, resume, module="prime_lab.trainer.sft")
            run.set_state("running")
            self.start_mirror()
            return
        assert isinstance(cfg, RLConfig)
        # a node other than 0 runs trainer ranks only: no sampler to choose or give GPUs to
        choice = self.choose_backend() if self.topology.runs_sampler else BackendChoice("external", "node 0's")
        self.placement = self.plan_placement(choice.backend)
        trainer_threads, sampler_threads = self.cpu_split(choice.backend)
        if trainer_threads:
            servers = cfg.inference.num_servers
            split = f" (split over {servers} servers)" if servers > 1 else ""
            self.log(f"CPU only: {trainer_threads} thread(s) for the trainer, {sampler_threads} for the sampler{split} "
                     "(they run at the same time; oversubscribed cores make both slower)")
            os.environ["OMP_NUM_THREADS"] = str(sampler_threads)  # the sampler inherits this process's environment
        self.start_trainer(trainer_threads, resume)
        if not self.topology.runs_sampler:
            self.log(f"node {self.topology.node_rank} of {self.topology.nnodes}: this machine runs trainer ranks only; "
                     f"node 0 ({self.topology.master_addr}) samples, and its run holds the events and adapters")
            run.set_state("running")
            return
        if sampler_waits_for_trainer(self.devices, self.vllm_roles):
            self.wait_for_trainer(cfg.inference.startup_timeout)
            if self.stop.set:
                return
        base_urls, model_name = self.start_sampler(choice, sampler_threads)
        teacher = self.start_teacher(sampler_threads)
        judge = self.start_judge(sampler_threads)
        if self.stop.set:
            return
        api_key = ["--api-key-var", cfg.inference.api_key_var] if choice.backend == "external" else []
        urls = [arg for url in base_urls for arg in ("--base-url", url)]
        self.start_child("orchestrator", ["prime_lab.trainer.orchestrator", str(run.dir), *urls,
                                          "--model", model_name, "--model-path", str(self.model_path), *api_key,
                                          *teacher, *resume], env=judge)
        run.set_state("running")
        self.start_mirror()

    def start_trainer(self, threads: int, resume: list[str], module: str = "prime_lab.trainer.train") -> None:
        """The trainer (`module`: RL's, or SFT's): one process, or `nproc_per_node` ranks under torchrun
        (trainer/distributed.py), on the trainer's GPUs of the placement."""
        topo = self.topology
        argv = [module, str(self.run.dir), "--model-path", str(self.model_path), *resume]
        env = dict(self.devices["trainer"].env)
        if threads:
            env["OMP_NUM_THREADS"] = str(max(1, threads // topo.nproc_per_node))
        if topo.distributed:
            argv = torchrun_argv(topo, argv[0], argv[1:])
            env["PYTHONSAFEPATH"] = "1"  # torchrun starts its workers without `-P`: this is the same
            where = f" on {topo.nnodes} nodes (this is node {topo.node_rank})" if topo.nnodes > 1 else ""
            self.log(f"trainer: {topo.nproc_per_node} processes under torchrun{where}, "
                     f"{topo.world_size} ranks in all")
        self.start_child("trainer", argv, env=env or None)

    def wait_for_trainer(self, timeout: float) -> None:
        """On a GPU the trainer shares with a vLLM engine: wait until the trainer says it is ready (its model on the
        device), so that vLLM's profiling sees the trainer's memory settled. LaunchFailed when the trainer exits
        first or is not ready within `timeout` seconds; returns early on a stop."""
        where = self.placement.where(self.devices["trainer"].gpus)
        self.log(f"{where} is shared: the sampler starts once the trainer has its model on it (vLLM sizes its KV "
                 "cache from the memory free while it profiles)")
        deadline = time.monotonic() + timeout
        while True:
            self.follow_events()
            if self.trainer_ready or self.stop.set:
                return
            code = self.children["trainer"].poll()
            if code is not None:
                raise LaunchFailed(self.reason("trainer", code))
            if time.monotonic() > deadline:
                raise LaunchFailed(f"the trainer was not ready within {timeout:g} s ([inference] startup_timeout), "
                                   "and on a shared GPU the sampler starts only after it: see "
                                   f"{self.run.log_path('trainer')}")
            time.sleep(POLL_S)

    def start_mirror(self) -> None:
        """With a `[wandb]` section: the W&B mirror follows the event log in its own process, so W&B (slow, offline,
        failing) never holds up training. It gets this process's environment (WANDB_API_KEY from
        --wandb-api-key or the user's); it writes nothing of the key."""
        if not wanted(json.loads(self.run.resolved_path.read_text())):
            return
        with open(self.run.log_path("wandb"), "ab") as log:
            self.mirror = subprocess.Popen(mirror_argv(self.run.dir), stdin=subprocess.DEVNULL, stdout=log,
                                           stderr=subprocess.STDOUT)

    def start_system_sampler(self) -> None:
        """Sample what each process of the run costs (CPU, memory, threads) and each GPU, every few seconds, into
        the event log as `system` events (runs/system_metrics.py) until the run ends."""
        try:
            interval = interval_from_env()
        except ValueError as exc:
            self.log(f"{exc}; sampling every {DEFAULT_INTERVAL_S:g} s", "WARNING")
            interval = DEFAULT_INTERVAL_S
        try:
            self.system = SystemSampler.for_run(self.run, interval_s=interval).start()
        except ImportError as exc:  # an interpreter without psutil (a wheelhouse that lacks it): the run goes on
            self.log(f"no system metrics for this run: {exc.name or exc} is not installed (pip install psutil)",
                     "WARNING")

    def stop_system_sampler(self) -> None:
        """Its last sample, taken before the processes are stopped (what they cost running, not stopping)."""
        if self.system is not None:
            self.system.stop()
            self.system = None

    def finish_mirror(self) -> None:
        """After the final state: the mirror logs what it holds and exits by itself (seconds offline; online it may
        wait on uploads, up to MIRROR_FINISH_S); then SIGINT makes it finish at once."""
        if self.mirror is None:
            return
        for sig, wait in ((None, MIRROR_FINISH_S), (signal.SIGINT, 15.0), (signal.SIGKILL, 5.0)):
            if sig is not None:
                self.mirror.send_signal(sig)
            try:
                self.mirror.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                self.log(f"the W&B mirror did not finish within {wait:g} s", "WARNING")
        self.mirror = None

    def choose_backend(self) -> BackendChoice:
        from prime_lab.inference.backend import BackendUnavailableError, choose_backend

        inf = self.rl.inference
        url = inf.base_url or next(iter(inf.base_urls), None)
        requested = "external" if inf.backend == "auto" and url else inf.backend  # a URL given: the sampler is there
        try:
            choice = choose_backend(requested, external_url=", ".join(inf.base_urls) or url)
        except BackendUnavailableError as exc:
            raise LaunchFailed(str(exc)) from exc
        problem = v1_sampling_problem([e.id for e in self.rl.env], choice.backend, vllm_release())
        if problem is not None:
            raise LaunchFailed(problem)
        if choice.backend == "vllm" and self.config.lora.enabled and experts_of(self.model_path) \
                and not cuda_available():
            raise LaunchFailed(f"vLLM's CPU build cannot serve LoRA on a Mixture-of-Experts model "
                               f"({self.model_path.name} has experts): with --enable-lora it runs MoE layers through "
                               "a Triton-only kernel and its engine dies on the first request; set [inference] "
                               'backend = "builtin"')
        return choice

    @property
    def rl(self) -> RLConfig:
        """The config of an RL run (what only RL runs have: samplers, environments)."""
        assert isinstance(self.config, RLConfig)
        return self.config

    def plan_placement(self, backend: str) -> Placement:
        """GPUs for the samplers, the trainer (an SFT run's gets them all: `backend` "external") and the side
        engines (a local teacher, a local judge); each local process's devices and each vLLM engine's share of its
        GPUs (`self.devices`), checked against the cards where torch gives their memory; logged, with the GPUs the
        plan leaves idle."""
        cfg = self.config
        inf = cfg.inference if isinstance(cfg, RLConfig) else InferenceConfig()
        sides = self.local_sides()
        try:
            placement = plan_gpus(visible_gpus(), backend=backend,
                                  num_gpus=cfg.num_gpus if isinstance(cfg, RLConfig) else None,
                                  tensor_parallel_size=inf.tensor_parallel_size,
                                  data_parallel_size=inf.data_parallel_size,
                                  num_servers=inf.num_servers, nproc_per_node=cfg.trainer.nproc_per_node,
                                  trainer_on_gpu=cfg.trainer.device != "cpu", sides=list(sides))
        except PlacementError as exc:
            raise LaunchFailed(str(exc)) from exc
        self.vllm_roles = []
        if placement.devices:
            self.vllm_roles = [sampler_role(i) for i, gpus in enumerate(placement.sampler_gpus)
                               if gpus and backend == "vllm"]
            self.vllm_roles += [role for role, side in sides.items()
                                if side.backend == "vllm" or side.backend == "auto" and vllm_installed()]
        cards = card_memory() if self.vllm_roles else []
        needs = self.engine_needs(self.vllm_roles) if cards and len(cards) == len(placement.devices) else {}
        try:
            self.devices = child_devices(placement, memory_override=inf.gpu_memory_utilization,
                                         side_memory={r: s.gpu_memory_utilization for r, s in sides.items()},
                                         cards=cards, needs=needs)
        except PlacementError as exc:
            raise LaunchFailed(str(exc)) from exc
        if placement.devices:
            self.log(describe_devices(placement, self.devices, self.vllm_roles))
            for line in describe_memory(placement, self.devices, cards, needs):
                self.log(line)
            idle = idle_gpus_note(placement, backend=backend,
                                  num_gpus=cfg.num_gpus if isinstance(cfg, RLConfig) else None)
            if idle:
                self.log(idle)
        return placement

    def local_sides(self) -> dict[str, TeacherConfig | JudgeConfig]:
        """The side engines this node starts, by role (trainer/placement.py SIDE_ROLES): `[teacher]` and `[judge]`
        without a `client` base_url, beside a local or an external sampler (a node of trainer ranks only starts
        none)."""
        if not isinstance(self.config, RLConfig) or not self.topology.runs_sampler:
            return {}
        tables = {"teacher": self.config.teacher, "judge": self.config.judge}
        return {role: side for role in SIDE_ROLES
                if (side := tables[role]) is not None and side.client.base_url is None}

    def engine_needs(self, roles: list[str]) -> dict[str, EngineNeed]:
        """What each vLLM engine in `roles` needs of each of its GPUs at the least (trainer/placement.py
        `EngineNeed`): its model's weights and the KV cache of one sequence of `[inference] max_model_len` tokens
        (vLLM refuses a cache that holds less), or with it unset of the longest completion (vLLM then fits its
        context to the cache). A judge's sequence is a rollout that long (its prompt) and its own `[judge.sampling]
        max_tokens` answer; it is served in its model's own dtype."""
        cfg = self.rl
        inf = cfg.inference
        needs: dict[str, EngineNeed] = {}
        sampler = model_size(self.model_path, inf.dtype)
        rollout = inf.max_model_len or cfg.sampling.max_tokens
        for role in roles:
            if role == "teacher" and cfg.teacher is not None:
                tokens = inf.max_model_len or cfg.teacher.sampling.max_tokens or cfg.sampling.max_tokens
                needs[role] = model_size(self.side_folder(role), inf.dtype).need(tokens)
            elif role == "judge" and cfg.judge is not None:
                needs[role] = model_size(self.side_folder(role)).need(rollout + cfg.judge.sampling.max_tokens)
            else:
                needs[role] = sampler.need(rollout, inf.tensor_parallel_size)
        return needs

    def teacher_folder(self) -> Path:
        """The local teacher's model folder (a preset is built, a Hugging Face id found in the cache)."""
        return self.side_folder("teacher")

    def side_folder(self, role: str) -> Path:
        """The model folder of the side engine `role` (`[teacher]`, `[judge]`; a preset is built, a Hugging Face id
        found in the cache)."""
        from prime_lab.models import ModelNotFoundError, resolve_model

        side = self.local_sides()[role]
        try:
            return resolve_model(side.model)
        except ModelNotFoundError as exc:
            raise LaunchFailed(f"[{role}] model = {side.model!r}: {exc}") from exc

    def cpu_split(self, backend: str) -> tuple[int, int]:
        """On a CPU-only machine with the built-in sampler, the cores split between trainer and sampler: (trainer,
        sampler) thread counts, or (0, 0) to leave both to their defaults (a GPU, vLLM binding its own cores,
        an external sampler, or a user's OMP_NUM_THREADS)."""
        if "OMP_NUM_THREADS" in os.environ or backend != "builtin" or self.config.trainer.device == "cuda" \
                or cuda_available():
            return 0, 0
        cores = usable_cores()
        if cores < 2:
            return 0, 0
        return cores // 2, cores - cores // 2

    def start_sampler(self, choice: BackendChoice, threads: int = 0) -> tuple[list[str], str]:
        """Start `[inference].num_servers` local servers side by side (or check the external URLs); returns every
        sampler's URL and the model name requests use. `threads`: the CPU threads the sampler side may use (0: the
        default), split among the servers."""
        from prime_lab.inference.launch import SamplerOptions, start_sampler
        from prime_lab.runs.processes import ServerStartError

        cfg = self.rl
        inf = cfg.inference
        self.log(f"sampler: {choice.reason}")
        if choice.backend == "external":
            urls = inf.base_urls or [str(inf.base_url)]
            for url in urls:
                self.check_external(url)
            return urls, cfg.model
        options = SamplerOptions(dtype=inf.dtype, max_model_len=inf.max_model_len,
                                 tensor_parallel_size=inf.tensor_parallel_size,
                                 data_parallel_size=self.placement.data_parallel_size,
                                 gpu_memory_utilization=inf.gpu_memory_utilization, kv_cache_gb=inf.kv_cache_gb,
                                 max_lora_rank=cfg.lora.r, lora=cfg.lora.enabled,
                                 expert_lora=cfg.lora.enabled and bool(cfg.lora.target_parameters))
        served = None if Path(cfg.model).exists() else cfg.model
        deadline = time.monotonic() + inf.startup_timeout
        role = sampler_role(0)
        try:
            for i in range(inf.num_servers):
                role = sampler_role(i)
                devices = self.devices[role]
                env = dict(devices.env)
                if threads:
                    env["OMP_NUM_THREADS"] = str(max(1, threads // inf.num_servers))
                server = start_sampler(choice.backend, self.model_path, self.run.log_path(role),
                                       served_name=served, timeout=inf.startup_timeout, env=env, wait=False,
                                       options=replace(options, port=inf.port + i if inf.port else None,
                                                       gpu_memory_utilization=devices.gpu_memory_utilization))
                self.servers.append(server)
                if server.process.pid:
                    self.run.register_process(role, server.process.pid)
            for i, server in enumerate(self.servers):  # they boot side by side: one deadline for all
                role = sampler_role(i)
                server.process.wait_ready(timeout=max(1.0, deadline - time.monotonic()))
        except (ServerStartError, OSError) as exc:
            which = f" ({role})" if inf.num_servers > 1 else ""
            raise LaunchFailed(f"the {choice.backend} sampler{which} did not start: {exc}") from exc
        urls = [s.base_url for s in self.servers]
        self.log(f"sampler ready at {', '.join(urls)} serving {self.servers[0].model_name}")
        return urls, self.servers[0].model_name

    def start_teacher(self, threads: int = 0) -> list[str]:
        """Distillation (`[teacher]`, trainer/teacher.py): start a local sampler for the teacher model (role
        `teacher`, on the one GPU the placement gives it), or check that `[teacher.client]`'s endpoint answers.
        Returns the orchestrator's arguments for a local teacher."""
        from prime_lab.inference.backend import BackendUnavailableError, choose_backend
        from prime_lab.inference.launch import SamplerOptions, start_sampler
        from prime_lab.runs.processes import ServerStartError

        teacher = self.rl.teacher
        if teacher is None:
            return []
        if teacher.client.base_url is not None:
            if not teacher.client.skip_model_check:
                self.check_external(teacher.client.base_url)
            self.log(f"teacher: {teacher.model} at {teacher.client.base_url}")
            return []
        path = self.teacher_folder()
        try:
            choice = choose_backend(teacher.backend)
        except BackendUnavailableError as exc:
            raise LaunchFailed(f"[teacher]: {exc}") from exc
        inf = self.rl.inference
        devices = self.devices.get("teacher", ChildDevices([], {}))
        env = dict(devices.env)
        if threads:
            env["OMP_NUM_THREADS"] = str(max(1, threads // 2))
        options = SamplerOptions(dtype=inf.dtype, max_model_len=inf.max_model_len,
                                 gpu_memory_utilization=devices.gpu_memory_utilization, kv_cache_gb=inf.kv_cache_gb,
                                 lora=False)
        try:
            server = start_sampler(choice.backend, path, self.run.log_path("teacher"), timeout=inf.startup_timeout,
                                   env=env, wait=False, options=options)
            if server.process.pid:
                self.run.register_process("teacher", server.process.pid)
            self.teacher_server = server
            server.process.wait_ready(timeout=inf.startup_timeout)
        except (ServerStartError, OSError) as exc:
            raise LaunchFailed(f"the teacher's {choice.backend} sampler did not start: {exc}") from exc
        self.log(f"teacher ready at {server.base_url} serving {teacher.model} ({choice.reason})")
        return ["--teacher-url", server.base_url, "--teacher-model", server.model_name]

    def check_external(self, base_url: str) -> None:
        url = base_url.rstrip("/") + "/models"
        try:
            with urllib.request.urlopen(url, timeout=EXTERNAL_TIMEOUT_S):
                pass
        except urllib.error.HTTPError as exc:
            if exc.code not in (401, 403):
                raise LaunchFailed(f"the external sampler at {base_url} answered GET /models with HTTP "
                                   f"{exc.code}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise LaunchFailed(f"the external sampler at {base_url} does not answer ({exc}); start it, or fix "
                               "[inference].base_url / base_urls") from exc

    def start_judge(self, threads: int = 0) -> dict[str, str]:
        """`[judge]`: start the environments' LLM judge (inference/judge.py; role `judge`, its log `logs/judge.log`,
        on the GPU the placement gives it), or take `[judge.client]`'s endpoint. Returns the orchestrator's
        environment that says where it is (envs/judges.py `endpoint_from_environ`): its environments, in its process
        and in their servers, are wired to it."""
        from prime_lab.inference.judge import JudgePlan, JudgeUnavailable

        judge = self.rl.judge if isinstance(self.config, RLConfig) else None
        if judge is None:
            return {}
        devices = self.devices.get("judge", ChildDevices([], {}))
        env = dict(devices.env)
        if threads:
            env["OMP_NUM_THREADS"] = str(max(1, threads // 2))
        try:
            plan = JudgePlan(judge)
            self.judge_server = plan.start(self.run.log_path("judge"), register=self.run.register_process, env=env,
                                           gpu_memory_utilization=devices.gpu_memory_utilization,
                                           timeout=self.rl.inference.startup_timeout, announce=self.log)
        except JudgeUnavailable as exc:
            raise LaunchFailed(str(exc)) from exc
        self.log(f"{plan.describe()} ready")
        return plan.endpoint.environ()

    # Watch ------------------------------------------------------------------------------------------------
    def follow_events(self) -> None:
        """Read new events: remember each process's last error, and raise alerts on the metrics and for what the
        run's sandboxes said (`sandbox` alerts, each once)."""
        for message in self.sandbox_notices.take():
            self.events.emit("alert", {"name": SANDBOX_NOTICE, "message": message, "level": "WARNING"})
        items, self.offset = EventLog(self.run.events_path).read(self.offset)
        for item in items:
            if not isinstance(item, Event):
                continue
            if item.kind == "log" and item.data.get("level") == "ERROR":
                self.last_error[item.source] = str(item.data.get("message", ""))
            if item.kind == "log" and item.source == "trainer" \
                    and str(item.data.get("message", "")).startswith(TRAINER_READY):
                self.trainer_ready = True
            if item.kind != "alert":
                for alert in self.monitor.observe(item):
                    self.events.emit("alert", alert, step=item.step)

    def reason(self, role: str, code: int | None) -> str:
        if role in self.last_error:
            return self.last_error[role]
        tail = log_tail(self.run.log_path(role), 8).strip()
        return f"the {role} exited with code {code}" + (f"; its log ends:\n{tail}" if tail else "")

    def child_failed(self, role: str, code: int) -> LaunchFailed:
        """The failure of a child that exited with `code`. When a server the run needs has exited too, that is the
        cause (an orchestrator whose judge was killed fails on its next few groups, often before this loop next
        looks at the servers), so the failure names the server."""
        return LaunchFailed(self.dead_server() or self.reason(role, code))

    def dead_server(self) -> str | None:
        """What to say of the first local server of the run that has exited (None while all of them run)."""
        for which, server in self.checked_servers():
            code = server.process.poll()
            if code is not None:
                return f"the inference server{which} exited with code {code}; its log ends:\n" \
                       f"{log_tail(server.log_path, 8)}"
        return None

    def watch(self) -> str:
        """Until the run ends: returns the final state."""
        last_health = time.monotonic()
        healthy_at = [last_health] * len(self.checked_servers())
        while True:
            self.follow_events()
            if self.stop.set:
                return "stopped"
            trainer = 0 if self.ranks_ended else self.children["trainer"].poll()
            if trainer is None and self.final_output_written():
                trainer = self.end_lingering_ranks()
            if trainer is not None and trainer != 0:
                raise self.child_failed("trainer", trainer)
            if "orchestrator" not in self.children:  # SFT, or a node other than 0 (its ranks end when node 0's do)
                if trainer == 0:
                    done = int(self.run.read_status().get("step") or 0) >= self.config.max_steps
                    return "completed" if done or not self.sft else "stopped"
                time.sleep(POLL_S)
                continue
            orchestrator = self.children["orchestrator"].poll()
            if orchestrator is not None and orchestrator != 0:
                raise self.child_failed("orchestrator", orchestrator)
            if trainer == 0:
                if int(self.run.read_status().get("step") or 0) < self.config.max_steps:
                    return "stopped"
                if orchestrator == 0:
                    return "completed"
                # else: the orchestrator is still running the final evaluation
            elif orchestrator == 0 and not batch_path(self.run.rollouts_dir, self.config.max_steps).exists():
                return "stopped"
            probe = time.monotonic() - last_health >= HEALTH_EVERY_S
            if probe:
                last_health = time.monotonic()
            self.check_samplers(healthy_at, probe)
            time.sleep(POLL_S)

    def final_output_written(self) -> bool:
        """Under torchrun on node 0: the trainer has written, in this attempt, all it writes (an SFT run's model
        folder, an RL run's last checkpoint; both put in place whole), so its ranks have only the process group's
        teardown left."""
        if not self.topology.distributed or self.topology.node_rank != 0:
            return False
        final = self.run.model_dir if self.sft else \
            self.run.checkpoints_dir / f"step_{self.config.max_steps}" / "trainer_state.pt"
        try:
            return final.stat().st_mtime >= self.started_at
        except OSError:
            return False

    def end_lingering_ranks(self) -> int | None:
        """None while torchrun may still end by itself (RANKS_END_S after the final output was first seen);
        then its ranks and torchrun are killed and the trainer counts as ended well (0): nothing is left unwritten."""
        now = time.monotonic()
        if self.written_at is None:
            self.written_at = now
        if now - self.written_at < RANKS_END_S:
            return None
        torchrun = self.children["trainer"]
        ranks = worker_pids(torchrun.pid)
        self.log(f"trainer rank(s) {', '.join(map(str, ranks)) or '-'} still running {RANKS_END_S:g} s after the "
                 "run's final output was written; ended them", "WARNING")
        for pid in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        torchrun.kill()
        torchrun.wait()
        self.ranks_ended = True
        return 0

    def check_samplers(self, healthy_at: list[float], probe: bool) -> None:
        """Raise LaunchFailed when a local sampler server has exited, or (`probe`: ask /health now) has not answered
        /health for UNHEALTHY_AFTER_S seconds; `healthy_at` holds when each one last answered."""
        dead = self.dead_server()
        if dead is not None:
            raise LaunchFailed(dead)
        if not probe:
            return
        for i, (_, server) in enumerate(self.checked_servers()):
            now = time.monotonic()
            if server.process.is_healthy(timeout=5.0):
                healthy_at[i] = now
            elif now - healthy_at[i] > UNHEALTHY_AFTER_S:
                raise LaunchFailed(f"the inference server at {server.base_url} stopped answering /health for "
                                   f"{now - healthy_at[i]:.0f} s")

    def checked_servers(self) -> list[tuple[str, RunningServer]]:
        """The local servers the run needs, each with the words that name it in a failure."""
        several = len(self.servers) > 1
        out = [(f" ({sampler_role(i)})" if several else "", s) for i, s in enumerate(self.servers)]
        out += [(" (the teacher)", s) for s in (self.teacher_server,) if s is not None]
        return out + [(" (the judge)", s) for s in (self.judge_server,) if s is not None]

    def stop_children(self, grace: float = STOP_GRACE_S) -> None:
        for role, process in self.children.items():
            if process.poll() is not None:
                continue
            # torchrun's ranks are asked directly: each finishes its step and checkpoints, and torchrun exits
            # when they have (torchrun itself, signalled, would kill them after 30 s and print a traceback)
            ranks = worker_pids(process.pid) if role == "trainer" and self.topology.distributed else []
            for pid in ranks:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
            if not ranks:
                process.terminate()
        deadline = time.monotonic() + grace
        for role, process in self.children.items():
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.log(f"the {role} did not exit within {grace:g} s; killed", "WARNING")
                process.kill()
                process.wait()
        while self.servers:
            self.servers.pop().stop()
        for side in (self.teacher_server, self.judge_server):
            if side is not None:
                side.stop()
        self.teacher_server = self.judge_server = None

    def supervise(self) -> int:
        final, reason = "failed", ""
        try:
            self.start()
            self.start_system_sampler()
            final = "stopped" if self.stop.set else self.watch()
            reason = {"stopped": "stopped by the user", "completed": f"trained {self.config.max_steps} steps"}[final]
        except LaunchFailed as exc:
            final, reason = "failed", str(exc)
        except Exception as exc:  # a bug of ours: still leave a failed run with the reason, never a hung one
            import traceback

            traceback.print_exc()
            final, reason = "failed", f"launcher error: {type(exc).__name__}: {exc}"
        finally:
            self.stop_system_sampler()
            self.stop_children(STOP_GRACE_S if final != "failed" else 15.0)
            self.follow_events()
        if final == "failed":
            self.log(reason, "ERROR")
        self.run.set_state(final, reason=reason)  # type: ignore[arg-type]
        self.finish_mirror()
        if self.reaper is not None:
            self.reaper.release()
        return 0 if final != "failed" else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prime_lab.trainer.launcher")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)
    return Supervisor(Run(args.run_dir), resume=args.resume).supervise()


if __name__ == "__main__":
    sys.exit(main())
