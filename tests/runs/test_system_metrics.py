"""System metrics (runs/system_metrics.py) on real processes with the real psutil: a stand-in supervisor starts a
tree shaped like a run's (registered children, torchrun with a rank under it, a sampler's child, an environment
server under the orchestrator, the W&B mirror, something unknown) and the sampler names, measures and writes each.
NVML is real where it answers (here: no GPU, so `gpus` is []); a fake module stands in for a GPU's answers."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest

from prime_lab.runs import system_metrics
from prime_lab.runs.registry import RunRegistry
from prime_lab.runs.system_metrics import (
    INTERVAL_VARIABLE,
    SANDBOX,
    SETTLE_S,
    SYSTEM,
    GpuReader,
    ProcessSample,
    SystemSample,
    SystemSampler,
    interval_from_env,
    latest_by_process,
)

SLEEP = "import time; time.sleep(120)"
SPIN = "import time\nend = time.time() + 120\nwhile time.time() < end: pass"

# The stand-in supervisor: starts the tree, prints the pids, sleeps. `-m MODULE` after `-c CODE` is only arguments
# to Python, but it is the command line psutil reads, as a `python -P -m MODULE` child's would be.
SUPERVISOR = """
import json, os, subprocess, sys, time
py, driver, SLEEP, SPIN = sys.executable, sys.argv[1], sys.argv[2], sys.argv[3]

def start(*argv):
    return subprocess.Popen([py, *argv]).pid

def parent_of(*argv, **env):  # code that starts `argv` (with `env`) and sleeps
    return (f"import os, subprocess, time; subprocess.Popen({list(argv)!r}, env={{**os.environ, **{env!r}}}); "
            "time.sleep(120)")

pids = {
    "trainer": start("-c", SPIN),
    "torchrun": start("-c", parent_of(py, "-c", SLEEP, "-m", "prime_lab.trainer.train", RANK="1"),
                      "-m", "torch.distributed.run"),
    "orchestrator": start("-c", parent_of(py, "-I", driver, "serve", "reverse_text", "{}", "tcp://127.0.0.1:1"),
                          "-m", "prime_lab.trainer.orchestrator"),
    "inference-2": start("-c", parent_of(py, "-c", SLEEP)),
    "env-vf-fruit-task": start("-c", SLEEP),
    "mirror": start("-c", SLEEP, "-m", "prime_lab.monitors.wandb_mirror"),
    "unknown": start("-c", SLEEP),
}
print(json.dumps(pids), flush=True)
time.sleep(120)
"""
REGISTERED = ("trainer", "inference-2", "env-vf-fruit-task")  # what the stand-in registers, as a supervisor does
PROCESS_KEYS = {"role", "pid", "cpu_percent", "rss_bytes", "threads"}
OPTIONAL_KEYS = {"rank", "env", "name"}


class Tree:
    def __init__(self, root: int, pids: dict[str, int]) -> None:
        self.root, self.pids = root, pids

    def roles(self) -> dict[int, str]:
        return {self.pids[name]: name for name in REGISTERED} | {self.root: "launcher"}

    def sampler(self, out: list[dict[str, Any]], **kwargs: Any) -> SystemSampler:
        return SystemSampler(out.append, roles=self.roles, root_pid=self.root, **kwargs)


def started(root: psutil.Process, count: int) -> bool:
    """`count` processes under `root`, each running its own program (a process just forked shows its parent's
    command line)."""
    try:
        found = root.children(recursive=True)
        return len(found) == count and all(p.cmdline() != p.parent().cmdline() for p in found)
    except psutil.Error:
        return False


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tree]:
    driver = tmp_path_factory.mktemp("env") / "driver.py"  # an isolated environment's server is `driver.py serve`
    driver.write_text(SLEEP)
    root = subprocess.Popen([sys.executable, "-c", SUPERVISOR, str(driver), SLEEP, SPIN], stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        assert root.stdout is not None
        pids = json.loads(root.stdout.readline())
        deadline = time.monotonic() + 10
        while not started(psutil.Process(root.pid), len(pids) + 3):  # + the three grandchildren
            assert time.monotonic() < deadline, "the stand-in's grandchildren did not start"
            time.sleep(0.05)
        yield Tree(root.pid, pids)
    finally:
        os.killpg(root.pid, signal.SIGKILL)
        root.wait()


def test_each_process_of_the_tree_gets_its_role(tree: Tree) -> None:
    out: list[dict[str, Any]] = []
    data = tree.sampler(out).sample()
    sample = SystemSample.from_event_data(data)
    labels = sample.by_label()
    pids = tree.pids
    grandchild = {name: psutil.Process(pids[name]).children()[0].pid for name in ("torchrun", "orchestrator",
                                                                                 "inference-2")}
    python = psutil.Process(pids["unknown"]).name()
    assert {label: p.pid for label, p in labels.items()} == {
        "supervisor": tree.root,
        "trainer": pids["torchrun"],  # torchrun itself: no rank
        "trainer.0": pids["trainer"],  # a registered trainer, no RANK: rank 0
        "trainer.1": grandchild["torchrun"],  # torchrun's rank, from its RANK
        "orchestrator": pids["orchestrator"],  # by its command line
        "sampler.1": pids["inference-2"],  # registered as the second server
        f"sampler.1.{grandchild['inference-2']}": grandchild["inference-2"],  # its child takes its role
        "env_server.reverse_text": grandchild["orchestrator"],  # `driver.py serve MODULE`, not registered
        "env_server.vf-fruit-task": pids["env-vf-fruit-task"],  # registered as env-<name>
        "mirror": pids["mirror"],
        f"other.{python}": pids["unknown"],
    }
    # in role order, each process named in its own right before those that took its role
    roles = [p["role"] for p in data["processes"]]
    assert roles == sorted(roles, key=["supervisor", "trainer", "orchestrator", "sampler", "env_server", "mirror",
                                       "other"].index)
    assert [p["pid"] for p in data["processes"] if p["role"] == "sampler"] == [pids["inference-2"],
                                                                               grandchild["inference-2"]]


MIRROR = "prime_lab.monitors.wandb_mirror"


def test_a_process_seen_before_it_runs_its_program_gets_its_role_after(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process just forked shows its parent's command line until it runs its own (here: execs the mirror's).
    The child execs when the test says so, not after a sleep: on a loaded machine (another test beside this one)
    a Python child's start alone took longer than the sampler's settle time. The settle time is widened to 10 s
    so that the exec always falls inside it; what is checked is the same: read again until settled. The sampler's
    wall clock is set 30 s ahead of psutil's process ages (boot time plus ticks), which drift from time.time() (here:
    a process 1 ms old read as 1.0 s old, so every process looked settled at once): settling counts from first
    sight. The wait is for the exec'd command line itself: the child's first one holds the same words inside its
    `-c` code (a fresh-clone run read it before the exec, in 0.06 s)."""
    monkeypatch.setattr(system_metrics, "SETTLE_S", 10.0)
    ahead = SimpleNamespace(time=lambda: time.time() + 30, monotonic=time.monotonic)
    monkeypatch.setattr(system_metrics, "time", ahead)
    later = f"os.execv(sys.executable, [sys.executable, '-c', {SLEEP!r}, '-m', {MIRROR!r}])"
    code = f"import os, sys; print(flush=True); sys.stdin.readline(); {later}"
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdin is not None
        child.stdout.readline()  # it runs its own first program
        sampler = SystemSampler(lambda data: None)  # this process's tree
        roles = [p["role"] for p in sampler.processes() if p["pid"] == child.pid]
        child.stdin.write(b"\n")
        child.stdin.flush()
        deadline = time.monotonic() + 30
        while psutil.Process(child.pid).cmdline()[-2:] != ["-m", MIRROR] and time.monotonic() < deadline:
            time.sleep(0.01)
        roles += [p["role"] for p in sampler.processes() if p["pid"] == child.pid]
        assert roles == ["other", "mirror"]
    finally:
        child.kill()
        child.wait()


def test_a_process_that_ended_but_was_not_waited_for_is_left_out() -> None:
    """A child that exited and that its parent has not waited for yet (a zombie: no memory, no threads; a run's
    trainer between its exit and the supervisor's poll) is no process of the run: left out, never a row of 0 bytes.
    (CI saw one in a run with two samplers: the sampler had known the process alive.)"""
    child = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({SETTLE_S + 0.5})"])
    try:
        sampler = SystemSampler(lambda data: None)  # this process's tree
        time.sleep(SETTLE_S + 0.1)
        assert child.pid in {p["pid"] for p in sampler.processes()}  # known alive, its command read and settled
        deadline = time.monotonic() + 30
        while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:  # (not waited for: it stays a zombie)
            assert time.monotonic() < deadline
            time.sleep(0.05)
        rows = sampler.processes()
        assert child.pid not in {p["pid"] for p in rows} and rows
        assert all(p["rss_bytes"] > 0 and p["threads"] >= 1 for p in rows), rows
    finally:
        child.wait()


def test_cpu_memory_and_threads_are_measured(tree: Tree) -> None:
    out: list[dict[str, Any]] = []
    sampler = tree.sampler(out)
    spinner, sleeper = tree.pids["trainer"], tree.pids["mirror"]
    first = {p["pid"]: p for p in sampler.processes()}  # a process's first sample: its average since it started
    process = psutil.Process(spinner)
    times = process.cpu_times()
    since_start = 100 * (times.user + times.system) / (time.time() - process.create_time())
    assert abs(first[spinner]["cpu_percent"] - since_start) < 10, (first[spinner], since_start)
    time.sleep(0.6)
    later = {p["pid"]: p for p in sampler.processes()}  # over the 0.6 s since
    assert later[spinner]["cpu_percent"] > 30, later[spinner]  # busy (two cores here, shared with the tests)
    assert first[sleeper]["cpu_percent"] < 10 and later[sleeper]["cpu_percent"] < 5, (first[sleeper],
                                                                                     later[sleeper])
    for process in later.values():
        assert set(process) - OPTIONAL_KEYS == PROCESS_KEYS, process
        assert process["threads"] >= 1 and process["rss_bytes"] > 1_000_000, process
    rss = psutil.Process(spinner).memory_info().rss
    assert abs(later[spinner]["rss_bytes"] - rss) < rss // 2


def test_the_thread_writes_system_events_and_a_last_sample(tmp_path: Path) -> None:
    run = RunRegistry(tmp_path / "runs").create("rl", config_text="", resolved={}, model="m", envs=[], max_steps=1)
    run.register_process("launcher", os.getpid())
    sleeper = subprocess.Popen([sys.executable, "-c", SLEEP])
    try:
        run.register_process("orchestrator", sleeper.pid)
        sampler = SystemSampler.for_run(run, interval_s=0.2).start()
        time.sleep(0.5)
        sampler.stop()
    finally:
        sleeper.kill()
        sleeper.wait()
    events = [e for e in run.event_log().events() if e.kind == SYSTEM]
    assert len(events) == sampler.samples and 2 <= len(events) <= 4  # at 0.2, 0.4 s and the last one on stop
    assert sampler.cpu_seconds > 0
    for event in events:
        assert (event.source, event.step) == ("launcher", None)
        assert set(event.data) == {"interval_s", "processes", "gpus"} and event.data["interval_s"] == 0.2
        by_pid = {p["pid"]: p for p in event.data["processes"]}
        assert by_pid[os.getpid()]["role"] == "supervisor" and by_pid[sleeper.pid]["role"] == "orchestrator"
    if not Path("/dev/nvidiactl").exists():  # no GPU here: the real NVML does not start, and nothing breaks
        assert all(event.data["gpus"] == [] for event in events)


def test_the_interval_comes_from_the_environment() -> None:
    assert interval_from_env({}) == 5.0 and interval_from_env({INTERVAL_VARIABLE: " 0.5 "}) == 0.5
    for bad in ("0", "-1", "soon", "inf", "nan"):
        with pytest.raises(ValueError, match=f"{INTERVAL_VARIABLE} must be a number of seconds above 0"):
            interval_from_env({INTERVAL_VARIABLE: bad})


# GPUs -------------------------------------------------------------------------------------------------------------
class NVMLError(Exception):
    pass


def fake_nvml(gpus: list[dict[str, Any]], fail_init: bool = False) -> Any:
    """NVML's calls as pynvml names them, answering from `gpus`; a GPU with utilization None raises for it (a MIG
    slice); calls are counted."""
    calls: list[str] = []

    def call(name: str, fn: Any) -> Any:
        def counted(*args: Any) -> Any:
            calls.append(name)
            return fn(*args)
        return counted

    def init() -> None:
        if fail_init:
            raise NVMLError("NVML Shared Library Not Found")

    def utilization(i: int) -> Any:
        if gpus[i]["utilization"] is None:
            raise NVMLError("Not Supported")
        return SimpleNamespace(gpu=gpus[i]["utilization"], memory=3)

    return SimpleNamespace(
        calls=calls, nvmlInit=call("init", init), nvmlShutdown=call("shutdown", lambda: None),
        nvmlDeviceGetCount=call("count", lambda: len(gpus)), nvmlDeviceGetHandleByIndex=call("handle", lambda i: i),
        nvmlDeviceGetName=call("name", lambda i: gpus[i]["name"]),
        nvmlDeviceGetUtilizationRates=call("utilization", utilization),
        nvmlDeviceGetMemoryInfo=call("memory", lambda i: SimpleNamespace(used=gpus[i]["used"],
                                                                         total=gpus[i]["total"], free=0)))


def test_gpu_rows_are_what_nvml_says() -> None:
    nvml = fake_nvml([{"name": b"NVIDIA H100 80GB HBM3", "utilization": 55, "used": 10 * 2**30, "total": 80 * 2**30},
                      {"name": "NVIDIA H100 MIG 1g.10gb", "utilization": None, "used": 2**30, "total": 10 * 2**30}])
    reader = GpuReader(nvml)
    assert reader.read() == [
        {"index": 0, "name": "NVIDIA H100 80GB HBM3", "utilization_percent": 55.0, "memory_used_bytes": 10 * 2**30,
         "memory_total_bytes": 80 * 2**30},
        {"index": 1, "name": "NVIDIA H100 MIG 1g.10gb", "utilization_percent": None, "memory_used_bytes": 2**30,
         "memory_total_bytes": 10 * 2**30}]
    reader.read()
    assert nvml.calls.count("init") == 1 and nvml.calls.count("name") == 2  # names are read once
    reader.close()
    assert nvml.calls[-1] == "shutdown"
    sample = SystemSample.from_event_data({"interval_s": 5.0, "processes": [], "gpus": GpuReader(nvml).read()})
    assert sample.scalars() == {"system/gpu.0/utilization_percent": 55.0, "system/gpu.0/memory_used_bytes": 10 * 2**30,
                                "system/gpu.1/memory_used_bytes": 2**30}


def test_no_nvml_or_an_nvml_error_gives_no_gpu_rows() -> None:
    absent = fake_nvml([], fail_init=True)
    reader = GpuReader(absent)
    assert reader.read() == [] and reader.read() == [] and absent.calls == ["init"]  # tried once
    broken = fake_nvml([{"name": "GPU", "utilization": 1, "used": 1, "total": 2}])
    broken.nvmlDeviceGetMemoryInfo = lambda handle: (_ for _ in ()).throw(NVMLError("GPU is lost"))
    assert GpuReader(broken).read() == []
    if not Path("/dev/nvidiactl").exists():
        assert GpuReader().read() == []  # the real pynvml, with no driver


# The reader -------------------------------------------------------------------------------------------------------
def test_the_reader_takes_what_is_well_formed_and_labels_each_process() -> None:
    data = {"interval_s": 5, "processes": [
        {"role": "sampler", "rank": 0, "pid": 20, "cpu_percent": 150.0, "rss_bytes": 2000, "threads": 30},
        {"role": "sampler", "rank": 0, "pid": 21, "cpu_percent": 90, "rss_bytes": 1000, "threads": 3},
        {"role": "env_server", "env": "gsm8k", "pid": 30, "cpu_percent": 1.0, "rss_bytes": 10, "threads": 1},
        {"role": "trainer", "pid": "x"}, "junk",
        {"role": "other", "name": "reaper", "pid": 40, "cpu_percent": None, "rss_bytes": 5, "threads": 1}],
        "gpus": [{"index": 0, "name": "A", "utilization_percent": 1, "memory_used_bytes": 2,
                  "memory_total_bytes": 3}, {"name": "no index"}]}
    sample = SystemSample.from_event_data(data, time=12.5)
    assert sample.interval_s == 5.0 and sample.time == 12.5 and len(sample.gpus) == 1
    assert list(sample.by_label()) == ["sampler.0", "sampler.0.21", "env_server.gsm8k", "other.reaper"]
    assert sample.scalars()["system/sampler.0/cpu_percent"] == 150.0
    assert "system/other.reaper/cpu_percent" not in sample.scalars()
    assert SystemSample.from_event_data(sample.to_json()).processes == sample.processes  # round trip
    assert SystemSample.from_event_data({}).processes == () and SystemSample.from_event_data({}).gpus == ()


def test_latest_by_process_keeps_each_process_last_values() -> None:
    def sample(*processes: ProcessSample) -> SystemSample:
        return SystemSample(5.0, processes)

    trainer = ProcessSample("trainer", 10, 99.0, 100, 8, rank=0)
    orchestrator = ProcessSample("orchestrator", 11, 20.0, 50, 4)
    supervisor = ProcessSample("supervisor", 1, 0.5, 10, 3)
    later_trainer = ProcessSample("trainer", 10, 50.0, 120, 9, rank=0)
    latest = latest_by_process([sample(orchestrator, trainer), sample(supervisor, later_trainer)])
    # the orchestrator exited before the last sample: its last values stay; the trainer's are the newest
    assert latest == {"supervisor": supervisor, "trainer.0": later_trainer, "orchestrator": orchestrator}
    assert latest_by_process([]) == {}


# Sandboxes --------------------------------------------------------------------------------------------------------
def _command_lines(pids: list[int]) -> dict[int, list[str]]:
    found = {}
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            found[pid] = psutil.Process(pid).cmdline()
    return found


def _settled_processes(jobs: dict[Any, Any], timeout: float = 30) -> list[int]:
    """Every process of the sandboxes in `jobs` once each one's job runs its python (the last process of the chain
    bwrap, sh, timeout, sh, python3) and two looks 0.1 s apart find the same processes; each sandbox's processes,
    command lines and job result if that does not happen within `timeout` s."""
    deadline = time.monotonic() + timeout
    last: list[int] = []
    while True:
        lines = {sandbox: _command_lines(sandbox.processes()) for sandbox in jobs}
        now = sorted(pid for found in lines.values() for pid in found)
        ready = all(any(argv and "python" in Path(argv[0]).name and "vllm" in " ".join(argv) for argv in found.values())
                    for found in lines.values())
        if ready and now == last:
            return now
        last = now
        assert time.monotonic() < deadline, [(lines[sandbox], sandbox.job_status(job)) for sandbox, job in jobs.items()]
        time.sleep(0.1)


def test_a_runs_sandboxes_are_one_row_whatever_runs_in_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Real sandboxes (sandbox/local.py), made by this process as an orchestrator makes them for its rollouts: every
    process of theirs (bwrap, the shell, a command line that would be a sampler's outside; with weak isolation, no
    bwrap: the command the sandbox recorded) sums into the `sandbox` row, which counts the run's live sandboxes, the
    idle one too; once they are gone the row stays, at 0."""
    from prime_lab.sandbox import local

    monkeypatch.setenv("PRIME_LAB_SANDBOXES", str(tmp_path / "sandboxes"))
    run = RunRegistry(tmp_path / "runs").create("rl", config_text="", resolved={}, model="m", envs=[], max_steps=1)
    sampler = SystemSampler(lambda data: None, sandboxes=system_metrics.run_sandboxes(run))  # this process's tree
    assert SANDBOX not in {p["role"] for p in sampler.processes()}  # no sandbox yet: no row
    busy, idle, weak = (local.create(local.SandboxSpec(run_dir=str(run.dir), isolation=isolation))
                        for isolation in ("strong", "strong", "weak"))
    try:
        jobs = {sandbox: sandbox.start_job(f"python3 -c {SLEEP!r} -m vllm.entrypoints.openai.api_server")
                for sandbox in (busy, weak)}
        inside = _settled_processes(jobs)
        rows = sampler.processes()
        (row,) = [p for p in rows if p["role"] == SANDBOX]  # one row for all of them
        assert not [p for p in rows if p["pid"] in inside and p is not row]  # none of theirs a `sampler`
        assert (row["count"], row["processes"], row["pid"]) == (3, len(inside), min(inside)), (row, inside)
        rss = sum(psutil.Process(pid).memory_info().rss for pid in inside)
        assert abs(row["rss_bytes"] - rss) < rss // 4 and row["threads"] >= len(inside)
        assert SystemSample.from_event_data({"processes": rows}).by_label()["sandbox"].shown == "sandbox ×3"
    finally:
        for sandbox in (busy, idle, weak):
            sandbox.delete()
    assert [(p["role"], p["count"], p["processes"], p["cpu_percent"], p["rss_bytes"]) for p in sampler.processes()
            if p["role"] == SANDBOX] == [(SANDBOX, 0, 0, 0.0, 0)]
