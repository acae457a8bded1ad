"""System metrics of a run's processes: what each one costs (CPU, memory, threads) and what each GPU holds.

The run's supervisor samples its own process tree every `interval_s` seconds (`SystemSampler`, a thread of its
own) and writes each sample to the event bus as one `system` event (source `launcher`, no step):

    {"interval_s": 5.0,
     "processes": [{"role": "trainer", "rank": 0, "pid": 1234, "cpu_percent": 97.5, "rss_bytes": 123456789,
                    "threads": 12}, ...],
     "gpus": [{"index": 0, "name": "NVIDIA H100", "utilization_percent": 55.0, "memory_used_bytes": 1,
               "memory_total_bytes": 2}]}

Roles: `supervisor` (the process that samples), `trainer` (`rank` on each of torchrun's ranks; torchrun itself has
none), `orchestrator`, `sampler` (`rank`: which server), `teacher`, `judge` (a run's LLM judge), `env_server` (`env`:
the environment), `sandbox`, `mirror` (the W&B mirror) and `other` (with its `name`). A process registered with the
run (status.json `processes`) has its registered role; one that is not (torchrun's ranks, an environment server's
first moments, the mirror) is named by its command line; the rest (vLLM's engine core, an environment server's
workers) take the role of their nearest named ancestor. CPU % is over the time since the previous sample (100 = one
core busy); a process's first sample gives its average since it started. GPUs come from NVML (`pynvml`, the
`nvidia-ml-py` package): no GPU, no driver or an NVML error gives `gpus` [].

Sandboxes (sandbox/local.py: each command a `bwrap` process, or with weak isolation the process the run's sandbox
records name, and everything under it, whichever process of the run ran it; what runs inside one never takes another
role) are one row of role `sandbox`: `count` the run's live sandboxes (the records in its `sandboxes/` folder, idle
ones included; a sampler without a run counts the outermost processes), `processes` the processes running in them,
their CPU %, RSS and threads added up, `pid` the lowest outermost one's (0 while none runs). Once a run has had a
sandbox, every sample has the row.

The reader (`SystemSample.from_event_data`, `latest_by_process`) needs neither psutil nor NVML.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prime_lab.runs.registry import Run

SYSTEM = "system"  # the events' kind
DEFAULT_INTERVAL_S = 5.0
INTERVAL_VARIABLE = "PRIME_LAB_SYSTEM_INTERVAL_S"  # tests shorten it
ROLES = ("supervisor", "trainer", "orchestrator", "sampler", "teacher", "judge", "env_server", "sandbox", "mirror",
         "other")
SANDBOX = "sandbox"
SANDBOX_PROGRAM = "bwrap"  # a local sandbox's outermost process (bubblewrap)
# Modules whose process has its role whether registered or not (`python -m MODULE`); vLLM's are matched by prefix.
MODULE_ROLES = {"prime_lab.trainer.train": "trainer", "prime_lab.trainer.sft": "trainer",
                "torch.distributed.run": "trainer", "prime_lab.trainer.orchestrator": "orchestrator",
                "prime_lab.inference.builtin": "sampler", "prime_lab.monitors.wandb_mirror": "mirror",
                "prime_lab.runs.reaper": "other"}
TORCHRUN = "torch.distributed.run"
SETTLE_S = 1.0  # a process younger than this may not run its own program yet
ENV_DRIVER = "driver.py"  # an isolated environment's server: `PYTHON -I .../envs/driver.py serve MODULE ...`


def interval_from_env(environ: Mapping[str, str] | None = None) -> float:
    """The sampling interval: PRIME_LAB_SYSTEM_INTERVAL_S seconds, 5 by default. Raises ValueError naming the
    variable for a value that is not a number of seconds above 0."""
    text = (os.environ if environ is None else environ).get(INTERVAL_VARIABLE, "").strip()
    if not text:
        return DEFAULT_INTERVAL_S
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{INTERVAL_VARIABLE} must be a number of seconds above 0, not {text!r}")
    return value


# The reader -------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ProcessSample:
    """One process in one sample. `cpu_percent`, `rss_bytes` and `threads` are None where the event lacks them. The
    `sandbox` row sums every sandbox's processes: `count` sandboxes, `processes` processes."""

    role: str
    pid: int
    cpu_percent: float | None
    rss_bytes: int | None
    threads: int | None
    rank: int | None = None
    env: str | None = None
    name: str | None = None
    count: int | None = None
    processes: int | None = None

    @property
    def shown(self) -> str:
        """The label as tables show it: the sandboxes' row with their count (`sandbox ×3`)."""
        return f"{self.label} ×{self.count}" if self.count is not None else self.label

    @property
    def label(self) -> str:
        """The process as charts and tables name it: `trainer.0`, `sampler.1`, `orchestrator`, `env_server.gsm8k`,
        `other.reaper` (within one sample `SystemSample.by_label` makes it unique)."""
        if self.env:
            return f"{self.role}.{self.env}"
        if self.rank is not None:
            return f"{self.role}.{self.rank}"
        if self.role == "other":
            return f"other.{self.name or self.pid}"
        return self.role

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role}
        if self.rank is not None:
            out["rank"] = self.rank
        if self.env is not None:
            out["env"] = self.env
        if self.name is not None:
            out["name"] = self.name
        out.update(pid=self.pid, cpu_percent=self.cpu_percent, rss_bytes=self.rss_bytes, threads=self.threads)
        if self.count is not None:
            out.update(count=self.count, processes=self.processes)
        return out


@dataclass(frozen=True)
class GpuSample:
    index: int
    name: str
    utilization_percent: float | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "name": self.name, "utilization_percent": self.utilization_percent,
                "memory_used_bytes": self.memory_used_bytes, "memory_total_bytes": self.memory_total_bytes}


@dataclass(frozen=True)
class SystemSample:
    """One `system` event's data, read leniently: a malformed entry is skipped, never an error."""

    interval_s: float | None
    processes: tuple[ProcessSample, ...] = ()
    gpus: tuple[GpuSample, ...] = ()
    time: float | None = None  # the event's time, where the caller passes it

    @classmethod
    def from_event_data(cls, data: Mapping[str, Any], time: float | None = None) -> SystemSample:
        processes = []
        for item in _list(data.get("processes")):
            pid = item.get("pid")
            if not isinstance(pid, int) or isinstance(pid, bool):
                continue
            processes.append(ProcessSample(role=str(item.get("role") or "other"), pid=pid,
                                           cpu_percent=_float(item.get("cpu_percent")),
                                           rss_bytes=_int(item.get("rss_bytes")), threads=_int(item.get("threads")),
                                           rank=_int(item.get("rank")), env=_text(item.get("env")),
                                           name=_text(item.get("name")), count=_int(item.get("count")),
                                           processes=_int(item.get("processes"))))
        gpus = []
        for item in _list(data.get("gpus")):
            index = _int(item.get("index"))
            if index is None:
                continue
            gpus.append(GpuSample(index=index, name=str(item.get("name") or f"GPU {index}"),
                                  utilization_percent=_float(item.get("utilization_percent")),
                                  memory_used_bytes=_int(item.get("memory_used_bytes")),
                                  memory_total_bytes=_int(item.get("memory_total_bytes"))))
        return cls(interval_s=_float(data.get("interval_s")), processes=tuple(processes), gpus=tuple(gpus),
                   time=time)

    def to_json(self) -> dict[str, Any]:
        return {"interval_s": self.interval_s, "processes": [p.to_json() for p in self.processes],
                "gpus": [g.to_json() for g in self.gpus]}

    def by_label(self) -> dict[str, ProcessSample]:
        """Each process under its label; a label taken already (a sampler's engine core beside the sampler) gets
        the pid after it: `sampler.0.4711`."""
        out: dict[str, ProcessSample] = {}
        for process in self.processes:
            label = process.label
            out[label if label not in out else f"{label}.{process.pid}"] = process
        return out

    def scalars(self, prefix: str = "system/") -> dict[str, float]:
        """Flat named numbers (W&B's system metrics): `system/trainer.0/cpu_percent`, `.../rss_bytes`,
        `.../threads` (and the sandboxes' `system/sandbox/count`), `system/gpu.0/utilization_percent`,
        `system/gpu.0/memory_used_bytes`."""
        out: dict[str, float] = {}
        for label, process in self.by_label().items():
            for key in ("cpu_percent", "rss_bytes", "threads", "count"):
                value = getattr(process, key)
                if value is not None:
                    out[f"{prefix}{label}/{key}"] = float(value)
        for gpu in self.gpus:
            for key in ("utilization_percent", "memory_used_bytes"):
                value = getattr(gpu, key)
                if value is not None:
                    out[f"{prefix}gpu.{gpu.index}/{key}"] = float(value)
        return out


def latest_by_process(samples: Iterable[SystemSample]) -> dict[str, ProcessSample]:
    """Each process's newest values over `samples` (oldest first), by label, in role order: a process that exited
    before the last sample (a run that ended) keeps its last values."""
    latest: dict[str, ProcessSample] = {}
    for sample in samples:
        latest.update(sample.by_label())
    return dict(sorted(latest.items(), key=lambda item: _order(item[1], item[0])))


def _order(process: ProcessSample, label: str) -> tuple[int, int, str]:
    role = ROLES.index(process.role) if process.role in ROLES else len(ROLES)
    return role, process.rank if process.rank is not None else -1, label


def _list(value: Any) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _text(value: Any) -> str | None:
    return str(value) if isinstance(value, str) and value else None


# Roles ------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Role:
    role: str
    rank: int | None = None
    env: str | None = None
    name: str | None = None


def registered_role(name: str) -> Role:
    """The role of a process registered with the run as `name` (its status.json key)."""
    if name == "launcher":
        return Role("supervisor")
    if name in ("trainer", "orchestrator", "teacher", "judge", "mirror"):
        return Role(name)
    if name == "inference":
        return Role("sampler", 0)
    if name.startswith("inference-") and name.removeprefix("inference-").isdigit():
        return Role("sampler", int(name.removeprefix("inference-")) - 1)
    if name == "reflection":  # GEPA's reflection model, when it has a sampler of its own
        return Role("sampler")
    if name.startswith("env-"):
        return Role("env_server", env=name.removeprefix("env-"))
    if name == "wandb":
        return Role("mirror")
    if name == SANDBOX:
        return Role(SANDBOX)
    return Role("other", name=name)


def command_role(cmdline: list[str]) -> Role | None:
    """The role a command line shows (`python -P -m MODULE ...`, an environment server's `driver.py serve
    MODULE`), or None."""
    if "-m" in cmdline[:-1]:
        module = cmdline[cmdline.index("-m") + 1]
        if module in MODULE_ROLES:
            role = MODULE_ROLES[module]
            return Role(role, name=module.rsplit(".", 1)[-1] if role == "other" else None)
        if module == "vllm" or module.startswith("vllm."):
            return Role("sampler")
    if cmdline and Path(cmdline[0]).name == SANDBOX_PROGRAM:
        return Role(SANDBOX)
    for i, arg in enumerate(cmdline[:-2]):
        if Path(arg).name == ENV_DRIVER and cmdline[i + 1] == "serve":
            return Role("env_server", env=cmdline[i + 2])
    return None


def run_sandboxes(run: Run) -> Callable[[], tuple[int, set[int]]]:
    """How many sandboxes `run` has live and the pids of the commands running in them, read anew at each call:
    sandbox/local.py records each sandbox in the run's `sandboxes/` folder while it lives, and each command's pid
    in the sandbox's folder (`Run.sandbox_processes`; runs/ cannot import sandbox/, a floor above it)."""
    def found() -> tuple[int, set[int]]:
        try:
            count = sum(1 for entry in os.scandir(run.dir / "sandboxes") if entry.name.startswith("sbx-"))
        except OSError:
            count = 0
        return count, {pid for pid, _ in run.sandbox_processes()} if count else set()

    return found


def run_roles(run: Run) -> Callable[[], dict[int, str]]:
    """The processes registered with `run` (pid -> registered name), read anew at each call."""
    def roles() -> dict[int, str]:
        found = run.read_status().get("processes")
        if not isinstance(found, dict):
            return {}
        return {info["pid"]: name for name, info in found.items()
                if isinstance(info, dict) and isinstance(info.get("pid"), int)}

    return roles


# The sampler ------------------------------------------------------------------------------------------------------
@dataclass
class _Seen:
    """What is known of a process across samples (psutil keeps its previous CPU times for `cpu_percent`)."""

    process: Any  # psutil.Process
    parent: int | None
    command: Role | None = None  # the role its command line shows
    rank: int | None = None  # a trainer rank's RANK (None: not read, or not a rank)
    torchrun: bool = False  # torchrun itself (its ranks are its children)
    fresh: bool = True  # not sampled yet: its CPU % is its average since it started
    settled: bool = False  # its command line was read SETTLE_S after this sampler first saw it (a process just forked
    # still shows its parent's until it runs its own program: read it again at the next sample). Measured from first
    # sight on the monotonic clock, not from psutil's create_time: that is boot time plus ticks, and boot time drifts
    # from time.time() (measured here: a process 1 ms old read as 1.0 s old, so every process looked settled)
    first_seen: float = field(default_factory=time.monotonic)


class GpuReader:
    """Each GPU's utilisation and memory through NVML. `nvml`: the module (default `pynvml`, imported on first use).
    No NVML (the package, the driver) or no GPU: `read()` gives [] and tries no more; an NVML error during a read
    gives [] for that read."""

    def __init__(self, nvml: Any = None) -> None:
        self._nvml = nvml
        self._state = "new"  # new -> open | off
        self._names: dict[int, str] = {}

    def _open(self) -> bool:
        if self._state == "new":
            self._state = "off"
            try:
                if self._nvml is None:
                    import pynvml

                    self._nvml = pynvml
                self._nvml.nvmlInit()
                self._state = "open"
            except Exception:  # noqa: BLE001 - no driver, no library, no GPU: no GPU rows
                pass
        return self._state == "open"

    def read(self) -> list[dict[str, Any]]:
        if not self._open():
            return []
        nvml = self._nvml
        try:
            gpus = []
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                if index not in self._names:
                    name = nvml.nvmlDeviceGetName(handle)
                    self._names[index] = name.decode() if isinstance(name, bytes) else str(name)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                try:
                    utilization: float | None = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
                except Exception:  # noqa: BLE001 - not supported on this GPU (a MIG slice): memory only
                    utilization = None
                gpus.append({"index": index, "name": self._names[index], "utilization_percent": utilization,
                             "memory_used_bytes": int(memory.used), "memory_total_bytes": int(memory.total)})
            return gpus
        except Exception:  # noqa: BLE001 - NVML failing mid-run never stops the sampler
            return []

    def close(self) -> None:
        if self._state == "open":
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass
        self._state = "off"


class SystemSampler:
    """Samples the process tree under `root_pid` (default this process) every `interval_s` seconds in a thread and
    hands each sample's event data to `emit`. `roles()` gives the registered processes (pid -> registered name).

        sampler = SystemSampler.for_run(run).start()   # ... sampler.stop()

    `sample()` takes one sample now (the thread calls it); `cpu_seconds` is the CPU time the thread has used."""

    def __init__(self, emit: Callable[[dict[str, Any]], object], *, interval_s: float = DEFAULT_INTERVAL_S,
                 roles: Callable[[], Mapping[int, str]] = dict, root_pid: int | None = None, nvml: Any = None,
                 on_close: Callable[[], object] | None = None,
                 sandboxes: Callable[[], tuple[int, set[int]]] | None = None) -> None:
        import psutil

        self._psutil = psutil
        self.emit = emit
        self.interval_s = interval_s
        self.roles = roles
        self.root_pid = os.getpid() if root_pid is None else root_pid
        self.gpus = GpuReader(nvml)
        self.cpu_seconds = 0.0
        self.samples = 0  # emitted so far
        self._on_close = on_close
        self._seen: dict[int, _Seen] = {}
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._failed = False
        self.sandboxes = sandboxes  # the run's live sandboxes and their commands' pids (None: count the bwraps)
        self._sandboxes_seen = False  # a sample had sandboxes: every later one has their row

    @classmethod
    def for_run(cls, run: Run, *, interval_s: float | None = None, nvml: Any = None) -> SystemSampler:
        """A sampler of this process's tree writing `system` events into `run`'s log (a writer of its own: the
        thread never shares one with the caller), roles from the run's registered processes."""
        import psutil  # noqa: F401 - its ImportError comes before a writer is opened

        writer = run.writer("launcher")

        def emit(data: dict[str, Any]) -> None:
            writer.emit(SYSTEM, data)

        return cls(emit, interval_s=interval_from_env() if interval_s is None else interval_s,
                   roles=run_roles(run), nvml=nvml, on_close=writer.close, sandboxes=run_sandboxes(run))

    # The thread -------------------------------------------------------------------------------------------------
    def start(self) -> SystemSampler:
        self._thread = threading.Thread(target=self._loop, name="system-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Take a last sample (unless the previous one is under half an interval old) and end the thread."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self.gpus.close()
        if self._on_close is not None:
            self._on_close()
            self._on_close = None

    def __enter__(self) -> SystemSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _loop(self) -> None:
        self._timed(self.processes)  # primes each process's CPU %: the first sample covers a whole interval
        last = time.monotonic()
        while not self._stopping.wait(self.interval_s):
            self._timed(self._emit_sample)
            last = time.monotonic()
        if time.monotonic() - last >= self.interval_s / 2:
            self._timed(self._emit_sample)

    def _timed(self, work: Callable[[], object]) -> None:
        start = time.thread_time()
        try:
            work()
        except Exception as exc:  # noqa: BLE001 - a sample that fails is skipped; the run goes on
            if not self._failed:
                self._failed = True
                print(f"system metrics: a sample failed ({type(exc).__name__}: {exc}); later failures are not "
                      "reported", file=sys.stderr, flush=True)
        self.cpu_seconds += time.thread_time() - start

    def _emit_sample(self) -> None:
        data = self.sample()
        self.emit(data)
        self.samples += 1

    # One sample -------------------------------------------------------------------------------------------------
    def sample(self) -> dict[str, Any]:
        """One sample's event data: every live process of the tree and every GPU."""
        return {"interval_s": self.interval_s, "processes": self.processes(), "gpus": self.gpus.read()}

    def processes(self) -> list[dict[str, Any]]:
        psutil = self._psutil
        tree = self._tree()
        registered = self.roles()
        live, recorded = self.sandboxes() if self.sandboxes is not None else (None, set())
        registered = {**registered, **dict.fromkeys(recorded, SANDBOX)}  # a sandbox's command, bwrap or not
        memo: dict[int, tuple[Role, bool]] = {}
        rows: list[tuple[tuple[int, int, str, bool, int], dict[str, Any]]] = []
        sandboxes: list[tuple[int, bool, float, int, int]] = []  # (pid, outermost, cpu, rss, threads)
        now = time.time()
        for pid, seen in tree.items():
            role, inherited = self._role(pid, tree, registered, memo)
            try:
                with seen.process.oneshot():
                    rss = seen.process.memory_info().rss
                    if not rss:  # ending, or ended and not waited for yet (a zombie): no process of the run now
                        continue
                    cpu = seen.process.cpu_percent(None)
                    if seen.fresh:  # its average since it started (cpu_percent has only been primed)
                        times = seen.process.cpu_times()
                        age = max(now - seen.process.create_time(), 1e-3)
                        cpu = 100.0 * (times.user + times.system) / age
                    threads = seen.process.num_threads()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            seen.fresh = False
            if role.role == SANDBOX:
                sandboxes.append((pid, not inherited, cpu, int(rss), int(threads)))
                continue
            row = ProcessSample(role=role.role, pid=pid, cpu_percent=round(cpu, 1), rss_bytes=int(rss),
                                threads=int(threads), rank=role.rank, env=role.env, name=role.name).to_json()
            order = ROLES.index(role.role) if role.role in ROLES else len(ROLES)
            # a process named in its own right first, then those that took its role (the labels stay put)
            rows.append(((order, -1 if role.rank is None else role.rank, role.env or "", inherited, pid), row))
        roots = sorted(pid for pid, outermost, *_ in sandboxes if outermost)
        count = len(roots) if live is None else live
        if sandboxes or count or self._sandboxes_seen:  # once a run had sandboxes, a row each sample (0s between)
            self._sandboxes_seen = True
            summed = ProcessSample(role=SANDBOX, pid=roots[0] if roots else 0,
                                   cpu_percent=round(sum(s[2] for s in sandboxes), 1),
                                   rss_bytes=sum(s[3] for s in sandboxes), threads=sum(s[4] for s in sandboxes),
                                   count=count, processes=len(sandboxes))
            rows.append(((ROLES.index(SANDBOX), -1, "", False, 0), summed.to_json()))
        return [row for _, row in sorted(rows, key=lambda item: item[0])]

    def _tree(self) -> dict[int, _Seen]:
        """The live processes under the root, the root first; each known one keeps its psutil.Process (its CPU
        times), a new one is read once (parent, command line, rank; the command line again while it is young)."""
        psutil = self._psutil
        try:
            root = psutil.Process(self.root_pid)
            found = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            found = []
        tree: dict[int, _Seen] = {}
        for process in found:
            seen = self._seen.get(process.pid)
            try:
                if seen is None or seen.process != process:  # new, or its pid was taken by another process
                    process.cpu_percent(None)  # primes it
                    seen = _Seen(process=process, parent=process.ppid() if process.pid != self.root_pid else None)
                if not seen.settled:
                    self._read_command(seen)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            tree[process.pid] = seen
        self._seen = tree
        return tree

    def _read_command(self, seen: _Seen) -> None:
        """What its command line says: a role, torchrun, a trainer rank's RANK."""
        psutil, process = self._psutil, seen.process
        seen.settled = time.monotonic() - seen.first_seen >= SETTLE_S
        try:
            cmdline = process.cmdline()
        except psutil.AccessDenied:
            cmdline = []
        seen.command = command_role(cmdline)
        seen.torchrun = "-m" in cmdline[:-1] and cmdline[cmdline.index("-m") + 1] == TORCHRUN
        seen.rank = None
        if seen.command is not None and seen.command.role == "trainer" and not seen.torchrun:
            try:
                seen.rank = int(process.environ().get("RANK", ""))
            except (ValueError, psutil.AccessDenied):
                pass

    def _role(self, pid: int, tree: Mapping[int, _Seen], registered: Mapping[int, str],
              memo: dict[int, tuple[Role, bool]]) -> tuple[Role, bool]:
        """A process's role, and whether it took it from an ancestor: the root is the supervisor; what runs in a
        sandbox is the sandbox's, whatever its command line says; a registered process has its registered role;
        else its command line's; else its nearest named ancestor's (not the supervisor's: what the supervisor runs
        unnamed is `other`)."""
        if pid in memo:
            return memo[pid]
        seen = tree[pid]
        parent = seen.parent
        up = self._role(parent, tree, registered, memo)[0] if parent is not None and parent in tree else None
        own = self._own_role(pid, seen, registered) if up is None or up.role != SANDBOX else None
        if own is not None:
            memo[pid] = (own, False)
        else:
            if up is None or up.role == "supervisor":
                memo[pid] = (Role("other", name=_name(seen.process)), False)
            else:
                memo[pid] = (up, True)
        return memo[pid]

    def _own_role(self, pid: int, seen: _Seen, registered: Mapping[int, str]) -> Role | None:
        if pid == self.root_pid:
            return Role("supervisor")
        role = registered_role(registered[pid]) if pid in registered else seen.command
        if role is not None and role.role == "trainer":  # torchrun itself has no rank; a lone trainer is rank 0
            return Role("trainer", None if seen.torchrun else (seen.rank if seen.rank is not None else 0))
        return role


def _name(process: Any) -> str | None:
    try:
        return str(process.name()) or None
    except Exception:  # noqa: BLE001 - gone meanwhile
        return None


@contextlib.contextmanager
def sampling(run: Run) -> Iterator[SystemSampler | None]:
    """Sample this process's tree into `run`'s log while the block runs (a GEPA search, an evaluation: the process
    that works the run is their supervisor). Sampling that cannot start (no psutil, a bad PRIME_LAB_SYSTEM_INTERVAL_S)
    is said once on stderr and left out: the work goes on."""
    try:
        sampler = SystemSampler.for_run(run).start()
    except (ImportError, ValueError) as exc:
        print(f"system metrics: none for this run ({exc})", file=sys.stderr, flush=True)
        yield None
        return
    try:
        yield sampler
    finally:
        sampler.stop()
