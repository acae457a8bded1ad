"""Environments that fail, in real RL runs: is each fault found, how fast, what it costs, is anything left behind;
and what the supervisor of environment servers costs a healthy run.

    .venv/bin/python bench/env_faults.py [--steps 4] [--seed 0] [--faults server-kill,hang,...] [--model MODEL]
                                         [--run-timeout 420] [--hang-timeout 3] [--hang-share 0.05]
                                         [--home DIR] [--verifiers-home DIR]

Each run is `prime rl run @CONFIG` as a user starts it, on the built-in sampler with a tiny random model built here
(`build_tiny_model`; `--model` names another, as `smollm2-135m`): `--steps` steps of batch 16 in groups of 4, 8
tokens a turn, on-policy (`max_async_level = 0`, `oversampling_factor = 1`: each batch's groups are sampled after
the step before, so a fault after batch k meets the groups of the batches after it). The bench follows the run in
its registry, injects the fault and reads the run's events. The runs, one after another:

- `none`: healthy, on an isolated environment: tests/fixtures/verifiers_envs/vf_reverse_text, installed with
  `prime env install FOLDER --verifiers <the release beside prime-lab> --isolate` into a PRIME_LAB_HOME of the bench's
  own (a temporary folder unless --home); its release's virtual environment is made with pip once, about 40 s
  (--verifiers-home, else `$PRIME_LAB_VERIFIERS_HOME`, names a folder where an earlier one is reused). Its server
  (`env-vf-reverse-text` among the run's processes) is what the supervisor watches: the overhead below.
- `server-kill`: the same; the server gets SIGKILL (its pid only, as the OOM killer would). Expected: restarted, an
  `env_restart` alert, `env/vf-reverse-text/restarts` >= 1, the run completes. Detected: that alert and that count;
  time to detect: the kill to the alert (it includes the supervisor's first back-off, 1 s).
- `hang`: an in-process environment the bench writes into a folder on the run's PYTHONPATH (`bench_fault_env`: two
  model turns, the fault between them), `[[env]] timeout = --hang-timeout`. From the moment of injection its next
  rollout sleeps forever between its turns, and after it one in 20 (`--hang-share`, drawn with the seed). Expected:
  cut at the time limit, counted (`env/hanging/timed_out`), the run goes on and completes. Detected: a time-out
  counted and its warning; time to detect: the moment the first rollout began to sleep to the orchestrator's
  warning that dropped its group (under the time limit: the limit counts from the rollout's start).
- `hung-scorer`: the same environment as `judging`, its fault in the rubric: from the moment of injection the reward
  function of its next rollout awaits a judge that never answers, and after it one in 20 (`--hang-share`). Expected:
  cut at the same time limit (it covers the rollout and its scoring), counted (`env/judging/timed_out`), the run
  goes on and completes, the cut scorers' tasks cancelled (nothing left running). Detected: a time-out counted and
  its warning, "while its reward functions ran"; time to detect: the moment the first scorer began to wait to that
  warning.
- `raise`: two environments of that module, `healthy` and `raising` (weight 1 each); from the moment of injection
  every rollout of `raising` raises. The run has ENV_ERRORED_STEPS + 2 steps more than --steps, so that only the
  hard limit ends it early. Expected: the run fails, its reason naming `raising`. Detected: that; time to detect:
  the first raise to the orchestrator's error.
- `install-pin` (no run): `prime env install` of an environment folder that pins tokenizers 0.21.0 (a stub wheel of
  that name the bench builds; pip offline on it, PIP_NO_INDEX), beside prime-lab in the environment the bench runs
  in, whose transformers needs the tokenizers installed. Expected: refused in one line naming tokenizers and both
  versions; every installed distribution as it was (left/checked: those that changed, and each `pip check` conflict
  that was not there before, of those compared); time to detect: the command's. Alone (`--faults install-pin`) it
  needs no model, no run and no package registry.

The moment of each fault is random, seeded (`--seed`): once the orchestrator wrote batch k (k drawn from 1 ..
steps - 2: at least two batches are still to sample), after a delay drawn from 0 .. the healthy run's mean step
time. Groups lost: the sum of the orchestrator's `rollout/failed_groups` over the steps. Steps: the trainer's.
Processes left: of the processes seen while the bench followed the run (those it registered, a restarted server's
dead one too, and, looked for each second, the others in their process groups: a server leads its own, with
verifiers' workers in it; `checked` counts them), those alive 30 s after the run's final state, and any other still
in those groups then; any found are reported, then killed. A run not ended after --run-timeout seconds is hung:
stopped, and reported so.

The supervisor's overhead: while the healthy run is at work (after its first batch), the bench times against its
live server (the address its log names) TICKS turns of a waiting request's loop as env_server.py runs them (a
wake-up of `asyncio.wait`, the process poll, `EnvServerClient._watch` with a client bound to that server; the poll is
`Popen.poll` of a live child of the bench: the same waitpid as on the server, which is not the bench's child) and
PINGS watchdog pings as `_watch` sends them (an id and the release's health payload on that client's socket, until
the answer is back: the whole round trip, server side included, though the orchestrator does not wait on it). Per
step there are at most (groups in flight) x step time / POLL_S turns (every request counted as waiting the whole
step: an upper bound) plus two liveness checks per group of the batch, and at most step time / WATCHDOG_INTERVAL_S +
1 pings (one watchdog per server, one ping at a time). Overhead = those counts times the measured costs, over the
healthy run's mean step time (between the trainer's step events, step 2 on). It is measured under the run's own
load, on a machine the run shares; restarts are not in it: they happen only on faults.

Prints a table (one row a run), the runs' reasons under it, the overhead's numbers and, last:

    faults: D/N detected, H hung, P processes left; supervisor overhead X% of step time (goal <= 2%): OK|FAILED

Exits non-zero when a fault was not detected or a run did not end as expected, a run hung, a process was left, the
healthy run did not complete or counted a fault, or the overhead is above 2% (or was not measured); with a message
when the install fails (no package registry). Measured by hand, three times (2 shared cores, load 1-5, tiny model, 4
steps, 5-8 min with the release's environment reused): all detected, the server restarted 1.3-1.6 s after the kill,
the hang cut 2.7-2.9 s after it began, the raising environment failed the run 3-9 s after its first raise (its 3rd
step), nothing left, the supervisor 0.2-0.4% of a 0.6-1.2 s step. The hung scorer (2 shared cores, load ~1, tiny
model, 4 steps, `--faults hung-scorer`): cut 2.9 s after its judge began to wait (limit 3 s), 1 group lost, 4/4 steps
completed in 11 s, 0 of 4 processes left; before the limit covered scoring the same run stopped at step 2 and was
stopped as hung (`--run-timeout 90`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from prime_lab.runs.registry import FINAL_STATES, Run, RunError, RunRegistry, pid_alive, process_start_time

ROOT = Path(__file__).resolve().parents[1]
PRIME = str(Path(sys.executable).parent / "prime")
FIXTURE = ROOT / "tests" / "fixtures" / "verifiers_envs" / "vf_reverse_text"
ISOLATED_ID = "vf-reverse-text"
SERVER_ROLE = f"env-{ISOLATED_ID}"
INSTALL_FAULT = "install-pin"  # no run: an install beside prime-lab (run_install_pin)
FAULTS = ("server-kill", "hang", "hung-scorer", "raise", INSTALL_FAULT)
OVERHEAD_GOAL = 2.0  # percent of step time
LINGER_S = 30.0  # how long processes may take to end after the run's final state
TICKS, PINGS = 2000, 200

FAULT_ENV = '''\
"""bench/env_faults.py's environment: two model turns, the fault between them once `trigger` (a file) exists:
"hang" (the next rollout sleeps forever, then one in 1/share, drawn with `seed`), "raise" (every rollout raises),
"judge" (as "hang", in the reward function: a judge that never answers), "none". The first faulty rollout writes the
time it began (time.time()) to `first`."""

import asyncio
import os
import random
import time

from prime_lab.envs import MultiTurnEnv, Rubric
from prime_lab.envs.parsers import last_assistant_text


class BenchFaultEnv(MultiTurnEnv):
    def __init__(self, fault, trigger, first, share, seed, **kwargs):
        super().__init__(max_turns=2, **kwargs)
        self.fault, self.trigger, self.first, self.share = fault, trigger, first, share
        self.luck, self.faults = random.Random(seed), 0

    def faulty(self):
        if self.fault == "none" or not os.path.exists(self.trigger):
            return False
        if self.fault in ("hang", "judge") and self.faults and self.luck.random() >= self.share:
            return False
        self.faults += 1
        if self.faults == 1:
            with open(self.first, "w") as out:
                out.write(repr(time.time()))
        return True

    async def env_response(self, messages, state):
        if self.fault != "judge" and self.faulty():
            if self.fault == "raise":
                raise RuntimeError("bench fault: this environment raises")
            await asyncio.sleep(10**9)
        return [{"role": "user", "content": "Once more."}], state

    async def judged(self, completion):  # varies in a group
        if self.fault == "judge" and self.faulty():
            await asyncio.sleep(10**9)
        return len(last_assistant_text(completion)) % 3 / 2


def load_environment(fault="none", trigger="", first="", share=0.05, seed=0, num_examples=64):
    rows = [{"question": f"Say something. {i}", "info": {"index": i}} for i in range(num_examples)]
    rubric = Rubric()
    env = BenchFaultEnv(fault, trigger, first, share, seed, dataset=rows, rubric=rubric)
    rubric.add_reward_func(env.judged)
    return env
'''

CONFIG = """\
model = "{model}"
max_steps = {steps}
batch_size = 16
rollouts_per_example = 4
learning_rate = 1e-2
max_async_level = 0
oversampling_factor = 1
{envs}
[sampling]
max_tokens = 8
seed = {seed}

[buffer]
seed = {seed}

[inference]
backend = "builtin"

[lora]
r = 8
alpha = 16
target_modules = ["q_proj", "v_proj"]
"""


class BenchError(RuntimeError):
    """Why the bench has no result (the install failed, a run did not start); printed, exit 1."""


# Injecting a fault -------------------------------------------------------------------------------------------------

@dataclass
class Injection:
    """A fault, injected `delay` seconds after the orchestrator wrote batch `after_batch`, by `act` (True once it
    acted: a kill needs the server registered)."""

    after_batch: int
    delay: float
    act: Callable[[Run, dict[str, Any]], bool]
    armed: float | None = None  # when batch `after_batch` was seen (monotonic)
    at: float | None = None  # when it was injected (time.time())

    def poll(self, run: Run, status: dict[str, Any]) -> None:
        from prime_lab.trainer.batch import batch_path

        if self.at is not None:
            return
        if self.armed is None:
            if not batch_path(run.rollouts_dir, self.after_batch).exists():
                return
            self.armed = time.monotonic()
        if time.monotonic() - self.armed >= self.delay and self.act(run, status):
            self.at = time.time()

    def describe(self) -> str:
        return f"batch {self.after_batch} +{self.delay:.1f}s"


def kill_server(run: Run, status: dict[str, Any]) -> bool:
    """SIGKILL to the environment's server (its pid only), once it is registered and alive."""
    info = (status.get("processes") or {}).get(SERVER_ROLE)
    if not isinstance(info, dict) or not pid_alive(info["pid"], info.get("start_time")):
        return False
    os.kill(info["pid"], signal.SIGKILL)
    return True


def touch(path: Path) -> Callable[[Run, dict[str, Any]], bool]:
    def act(run: Run, status: dict[str, Any]) -> bool:
        path.touch()
        return True

    return act


# Following a run ---------------------------------------------------------------------------------------------------

@dataclass
class Followed:
    run: Run
    status: dict[str, Any]
    wall_s: float
    hung: bool
    left: list[str]
    checked: int  # the processes seen: those the run registered and the others in their process groups


def start_run(config: Path, env: dict[str, str], home: Path) -> Run:
    print(f"prime rl run @{config.name} ...", flush=True)
    done = subprocess.run([PRIME, "rl", "run", f"@{config}"], capture_output=True, text=True, env=env, cwd=ROOT,
                          check=False, timeout=600)
    run_id = (done.stdout.strip().splitlines() or [""])[0].strip()
    if done.returncode != 0 or not run_id:
        raise BenchError(f"prime rl run @{config} failed (exit {done.returncode}):\n"
                         + (done.stderr or done.stdout).strip()[-3000:])
    try:
        return RunRegistry(root=home / "runs").get(run_id)
    except RunError as exc:
        raise BenchError(f"prime rl run printed {run_id!r}, which is no run in {home / 'runs'}: {exc}") from exc


def follow(run: Run, bound: float, injection: Injection | None = None,
           during: Callable[[Run, dict[str, Any]], None] | None = None) -> Followed:
    """Poll the run until its final state (or `bound` seconds: hung, then stopped), noting every process it
    registers, the group each leads and (each second) the other processes in those groups, injecting the fault and
    calling `during` on the way; then which of them are left."""
    seen: dict[tuple[int, str | None], str] = {}  # (pid, start time) -> what it is
    groups: dict[int, str] = {}
    own = os.getpgrp()  # the `prime rl run` command is the bench's child, in the bench's group

    def note_group(pgid: Any, where: str) -> None:
        if isinstance(pgid, int) and pgid > 1 and pgid != own:
            groups.setdefault(pgid, where)

    started, scanned, hung = time.monotonic(), 0.0, False
    while True:
        status = run.status()  # a run whose processes all died is made failed here
        note_group(status.get("pgid"), "the run's group")
        for role, pid, start in run.registered_processes(status):
            if (pid, start) not in seen and pid_alive(pid, start):
                seen[(pid, start)] = role
                with contextlib.suppress(ProcessLookupError):
                    note_group(os.getpgid(pid), f"{role}'s group")
        if time.monotonic() - scanned >= 1.0:
            scanned = time.monotonic()
            for pid, where in group_members(groups):
                seen.setdefault((pid, process_start_time(pid)), f"a process in {where}")
        if injection is not None:
            injection.poll(run, status)
        if during is not None:
            during(run, status)
        if status.get("state") in FINAL_STATES:
            break
        if time.monotonic() - started > bound:
            hung = True
            with contextlib.suppress(RunError):
                RunRegistry(root=run.dir.parent).stop(run.id, grace=10)
            break
        time.sleep(0.05)
    wall = time.monotonic() - started
    deadline = time.monotonic() + LINGER_S
    while True:
        alive = {pid: what for (pid, start), what in seen.items() if pid_alive(pid, start)}
        alive.update({pid: f"a process in {where}" for pid, where in group_members(groups) if pid not in alive})
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for pid in alive:  # the bench leaves nothing behind (the report has them)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    left = [f"{what} (pid {pid})" for pid, what in alive.items()]
    return Followed(run, run.read_status(), wall, hung, left, len(seen))


def group_members(groups: dict[int, str]) -> list[tuple[int, str]]:
    """(pid, which group) of each live process in `groups` (but this one)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) in groups:
            found.append((int(entry.name), groups[int(fields[2])]))
    return found


# What the run's events say -----------------------------------------------------------------------------------------

def step_metrics(run: Run, source: str) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    for event in run.event_log().events():
        if event.kind == "metrics" and event.source == source and event.step is not None:
            out.setdefault(event.step, {}).update(event.data)
    return out


def first_event(run: Run, match: Callable[[Any], bool]) -> float | None:
    """The time of the first event `match` takes."""
    return next((e.time for e in run.event_log().events() if match(e)), None)


def read_time(path: Path) -> float | None:
    try:
        return float(path.read_text())
    except (OSError, ValueError):
        return None


@dataclass
class Row:
    fault: str
    injected: str
    detected: bool | None  # None: nothing injected
    detect_s: float | None
    groups_lost: int
    steps: str
    state: str
    wall_s: float
    hung: bool
    left: list[str]
    checked: int
    expected: bool  # ended as this fault should
    reason: str = ""

    def cells(self) -> list[str]:
        detected = "-" if self.detected is None else ("yes" if self.detected else "NO")
        return [self.fault, self.injected, detected, "-" if self.detect_s is None else f"{self.detect_s:.1f}",
                str(self.groups_lost), self.steps, self.state + ("" if self.expected else " (unexpected)"),
                f"{len(self.left)}/{self.checked}", f"{self.wall_s:.0f}" + (" HUNG" if self.hung else "")]


def row_for(fault: str, followed: Followed, injection: Injection | None, max_steps: int,
            detected: bool | None, detect_s: float | None, expected_state: str) -> Row:
    status = followed.status
    by_step = step_metrics(followed.run, "orchestrator")
    lost = int(sum(m.get("rollout/failed_groups", 0.0) for m in by_step.values()))
    state = str(status.get("state", "?"))
    reason = " ".join(str(status.get("reason") or "").split())
    return Row(fault, injection.describe() if injection is not None else "-", detected, detect_s, lost,
               f"{int(status.get('step') or 0)}/{max_steps}", state, followed.wall_s, followed.hung, followed.left,
               followed.checked, state == expected_state and not followed.hung, reason)


# The runs ----------------------------------------------------------------------------------------------------------

@dataclass
class Costs:
    """The supervisor's unit costs, measured against a live server."""

    tick_s: float = 0.0
    ping_s: float = 0.0
    pings_answered: int = 0


def server_address(run: Run) -> str | None:
    """The live server's tcp:// address: the last one its log names (the driver's first line, again at each
    restart; verifiers' server renames its process, so its command line no longer has it)."""
    try:
        text = (run.logs_dir / f"{SERVER_ROLE}.log").read_text(errors="replace")
    except OSError:
        return None
    found = re.findall(r"tcp://127\.0\.0\.1:\d+", text)
    return found[-1] if found else None


async def measure_costs(address: str, health: bytes) -> Costs:
    """TICKS ticks of a waiting request's loop and PINGS watchdog pings, against the server at `address`."""
    import uuid

    from prime_lab.envs.env_server import EnvServerClient

    child = subprocess.Popen(["sleep", "600"])  # a live child: Popen.poll is a waitpid, as on the server
    try:
        shim = SimpleNamespace(address=address, health=health, poll=child.poll, kill=lambda reason: None,
                               gone=lambda code: "", log_path="", tail=lambda: "")
        client = EnvServerClient(shim)  # type: ignore[arg-type]
        socket = client._bind()
        waiting: asyncio.Future[None] = asyncio.get_running_loop().create_future()  # a request's, never answered
        costs = Costs()
        t0 = time.perf_counter()
        for _ in range(TICKS):  # env_server.EnvServerClient.request's loop, one turn
            await asyncio.wait({waiting}, timeout=0)
            if shim.poll() is None:
                await client._watch(socket)
        costs.tick_s = (time.perf_counter() - t0) / TICKS
        times = []
        for _ in range(PINGS):  # _watch's ping: an id and the health payload; the answer matched by id
            ping_id = uuid.uuid4().hex.encode()
            answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
            client._pending[ping_id] = answer
            t = time.perf_counter()
            await socket.send_multipart([ping_id, health])
            await asyncio.wait({answer}, timeout=5.0)
            times.append(time.perf_counter() - t)
            client._pending.pop(ping_id, None)
            if not answer.done():
                break  # no answer in 5 s: the cost of a ping is not known (the overhead is not measured)
            costs.pings_answered += 1
            answer.exception()  # an undecodable answer is an answer too
        costs.ping_s = statistics.fmean(times)
        waiting.cancel()
        client.close()
        return costs
    finally:
        child.kill()
        child.wait()


def config_text(model: str, steps: int, seed: int, envs: str) -> str:
    return CONFIG.format(model=model, steps=steps, seed=seed, envs=envs)


def run_healthy(ctx: SimpleNamespace) -> tuple[Row, dict[str, Any]]:
    """The healthy run on the isolated environment, and the supervisor's costs measured on it."""
    from prime_lab.envs.env_server import health_check

    config = ctx.home / "none.toml"
    config.write_text(config_text(ctx.model, ctx.steps, ctx.seed, f'\n[[env]]\nid = "{ISOLATED_ID}"\n'))
    costs: list[Costs] = []

    def during(run: Run, status: dict[str, Any]) -> None:
        from prime_lab.trainer.batch import batch_path

        info = (status.get("processes") or {}).get(SERVER_ROLE)
        if costs or not isinstance(info, dict) or not batch_path(run.rollouts_dir, 1).exists():
            return
        address = server_address(run)
        if address is None:
            return
        costs.append(asyncio.run(measure_costs(address, health_check(ctx.release))))

    followed = follow(start_run(config, ctx.env, ctx.home), ctx.bound, during=during)
    run = followed.run
    by_step = step_metrics(run, "orchestrator")
    counted = sum(v for m in by_step.values() for k, v in m.items()
                  if k.startswith("env/") and k.endswith(("/errored", "/timed_out", "/restarts")))
    row = row_for("none", followed, None, ctx.steps, None, None, "completed")
    row.expected = row.expected and counted == 0
    if counted:
        row.reason = f"a healthy run counted faults (env/* metrics sum {counted:g}); " + row.reason
    stepped: dict[int, float] = {}  # when the trainer logged each step
    for event in run.event_log().events():
        if event.kind == "metrics" and event.source == "trainer" and event.step is not None:
            stepped.setdefault(event.step, event.time)
    return row, {"run": run, "costs": costs[0] if costs else None, "step_times": [stepped[k] for k in sorted(stepped)]}


def run_server_kill(ctx: SimpleNamespace) -> Row:
    rng = random.Random(f"{ctx.seed}-server-kill")
    config = ctx.home / "server-kill.toml"
    config.write_text(config_text(ctx.model, ctx.steps, ctx.seed, f'\n[[env]]\nid = "{ISOLATED_ID}"\n'))
    injection = Injection(rng.randint(1, ctx.steps - 2), rng.uniform(0, ctx.step_s), kill_server)
    followed = follow(start_run(config, ctx.env, ctx.home), ctx.bound, injection)
    run = followed.run
    alert = first_event(run, lambda e: e.kind == "alert" and e.data.get("name") == "env_restart"
                        and e.data.get("env") == ISOLATED_ID)
    restarts = max((m.get(f"env/{ISOLATED_ID}/restarts", 0.0) for m in step_metrics(run, "orchestrator").values()),
                   default=0.0)
    detected = injection.at is not None and alert is not None and restarts >= 1
    detect_s = alert - injection.at if detected and alert is not None and injection.at is not None else None
    row = row_for("server-kill", followed, injection, ctx.steps, detected, detect_s, "completed")
    if detected:
        row.reason = f"{restarts:g} restart(s) counted; " + row.reason
    return row


def run_cut(ctx: SimpleNamespace, fault: str, name: str, where: str) -> Row:
    """A run whose environment `name` hangs (`fault`: "hang" between its turns, "judge" in its reward function) from
    the injection on, cut at `--hang-timeout`: detected by the time-outs counted and the warning that dropped the
    first group, whose error says `where`."""
    row_name = {"hang": "hang", "judge": "hung-scorer"}[fault]
    rng = random.Random(f"{ctx.seed}-{row_name}")
    trigger, first = ctx.faults_dir / f"{row_name}.trigger", ctx.faults_dir / f"{row_name}.first"
    for stale in (trigger, first):  # an earlier bench's, in a --home kept
        stale.unlink(missing_ok=True)
    args = (f'{{ fault = "{fault}", trigger = {json.dumps(str(trigger))}, first = {json.dumps(str(first))}, '
            f"share = {ctx.hang_share}, seed = {ctx.seed} }}")
    envs = f'\n[[env]]\nid = "bench-fault-env"\nname = "{name}"\nargs = {args}\ntimeout = {ctx.hang_timeout:g}\n'
    config = ctx.home / f"{row_name}.toml"
    config.write_text(config_text(ctx.model, ctx.steps, ctx.seed, envs))
    injection = Injection(rng.randint(1, ctx.steps - 2), rng.uniform(0, ctx.step_s), touch(trigger))
    followed = follow(start_run(config, ctx.env, ctx.home), ctx.bound, injection)
    run = followed.run
    timed_out = sum(m.get(f"env/{name}/timed_out", 0.0) for m in step_metrics(run, "orchestrator").values())
    dropped = f"dropped a group of {name}: a rollout failed: rollout timed out after {ctx.hang_timeout:g} s{where}"
    cut = [e.time for e in run.event_log().events() if e.kind == "log" and e.data.get("level") == "WARNING"
           and str(e.data.get("message", "")).startswith(dropped)]
    warned = cut[0] if cut else None
    began = read_time(first)
    detected = timed_out > 0 and warned is not None
    detect_s = warned - began if detected and warned is not None and began is not None else None
    row = row_for(row_name, followed, injection, ctx.steps, detected, detect_s, "completed")
    if detected:
        row.reason = f"{len(cut)} group(s) cut at the {ctx.hang_timeout:g} s time limit and dropped; " + row.reason
    return row


def run_hang(ctx: SimpleNamespace) -> Row:
    return run_cut(ctx, "hang", "hanging", " (")


def run_hung_scorer(ctx: SimpleNamespace) -> Row:
    return run_cut(ctx, "judge", "judging", " while its reward functions ran")


def run_raise(ctx: SimpleNamespace) -> Row:
    from prime_lab.trainer.orchestrator import ENV_ERRORED_STEPS

    rng = random.Random(f"{ctx.seed}-raise")
    trigger, first = ctx.faults_dir / "raise.trigger", ctx.faults_dir / "raise.first"
    for stale in (trigger, first):  # an earlier bench's, in a --home kept
        stale.unlink(missing_ok=True)
    args = f'{{ fault = "raise", trigger = {json.dumps(str(trigger))}, first = {json.dumps(str(first))} }}'
    envs = (f'\n[[env]]\nid = "bench-fault-env"\nname = "healthy"\n'
            f'\n[[env]]\nid = "bench-fault-env"\nname = "raising"\nargs = {args}\n')
    steps = ctx.steps + ENV_ERRORED_STEPS + 2
    config = ctx.home / "raise.toml"
    config.write_text(config_text(ctx.model, steps, ctx.seed, envs))
    injection = Injection(rng.randint(1, ctx.steps - 2), rng.uniform(0, ctx.step_s), touch(trigger))
    followed = follow(start_run(config, ctx.env, ctx.home), ctx.bound, injection)
    run = followed.run
    reason = str(followed.status.get("reason") or "")
    failed = first_event(run, lambda e: e.kind == "log" and e.source == "orchestrator"
                         and e.data.get("level") == "ERROR" and "raising" in str(e.data.get("message", "")))
    began = read_time(first)
    detected = followed.status.get("state") == "failed" and "environment raising" in reason
    detect_s = failed - began if detected and failed is not None and began is not None else None
    return row_for("raise", followed, injection, steps, detected, detect_s, "failed")


# Main --------------------------------------------------------------------------------------------------------------

STUB_PYPROJECT = """[project]
name = "{name}"
version = "{version}"
dependencies = [{deps}]
{entry}
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"
"""


def stub_folder(folder: Path, name: str, version: str, module: str, source: str, deps: str = "",
                entry: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pyproject.toml").write_text(STUB_PYPROJECT.format(name=name, version=version, deps=deps, entry=entry))
    (folder / f"{module}.py").write_text(source)
    return folder


def pip_check() -> set[str]:
    done = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, check=False,
                          timeout=300)
    return {line.strip() for line in done.stdout.splitlines() if line.strip()}


def installed_versions() -> dict[str, str]:
    importlib.invalidate_caches()
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        found.setdefault((dist.metadata["Name"] or "").lower(), dist.version)
    return found


def run_install_pin(home: Path, env: dict[str, str]) -> Row:
    """`prime env install` beside prime-lab of a folder that pins tokenizers 0.21.0, pip offline on a stub wheel of
    it; the row: refused in one line naming both versions, nothing changed, no new `pip check` conflict."""
    have = importlib.metadata.version("tokenizers")
    wheels, stubs = home / "install-pin" / "wheels", home / "install-pin" / "src"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                            str(wheels), str(stub_folder(stubs / "tokenizers", "tokenizers", "0.21.0", "tokenizers",
                                                         "OLD = True\n"))],
                           capture_output=True, text=True, env={**env, "PIP_NO_INDEX": "1"}, check=False, timeout=300)
    if built.returncode != 0:
        raise BenchError(f"building the stub tokenizers wheel failed:\n{(built.stderr or built.stdout)[-2000:]}")
    target = stub_folder(stubs / "bench-old-tokenizers", "bench-old-tokenizers", "1.0", "bench_old_tokenizers",
                         '"""pins an older tokenizers"""\n\ndef load_environment():\n    return None\n',
                         deps='"tokenizers==0.21.0"',
                         entry='[project.entry-points."prime_lab.environments"]\nbench-old-tokenizers = '
                               '"bench_old_tokenizers"\n')
    before, conflicts = installed_versions(), pip_check()
    t0 = time.monotonic()
    done = subprocess.run([PRIME, "env", "install", str(target)], capture_output=True, text=True, check=False,
                          env={**env, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)}, timeout=1800)
    took = time.monotonic() - t0
    after = installed_versions()
    changed = [f"{name} {before.get(name, '-')} -> {after.get(name, '-')}" for name in sorted(set(before) | set(after))
               if before.get(name) != after.get(name)]
    new = sorted(pip_check() - conflicts)
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    detected = (done.returncode == 1 and len(errors) == 1 and "tokenizers==0.21.0" in errors[0]
                and f"tokenizers=={have}" in errors[0])
    state = "refused" if done.returncode == 1 else ("installed" if done.returncode == 0 else f"exit {done.returncode}")
    reason = errors[0] if errors else " ".join(done.stderr.split())[-400:]
    return Row(INSTALL_FAULT, "tokenizers==0.21.0 (stub)", detected, took, 0, "-", state, took, False,
               [*changed, *(f"new pip check conflict: {line}" for line in new)], len(before),
               detected and not changed and not new, reason)


def mean_step(times: list[float]) -> float | None:
    """The mean time between the trainer's steps, from step 2 on (step 1 waits for the run's start)."""
    gaps = [b - a for a, b in zip(times[1:], times[2:], strict=False)]
    return statistics.fmean(gaps) if gaps else None


def overhead(healthy: dict[str, Any]) -> tuple[float | None, list[str]]:
    """The supervisor's share of the healthy run's step time, in percent, and the lines that show it."""
    from prime_lab.envs import env_server
    from prime_lab.trainer.runtime import load_config
    from prime_lab.trainer.scheduler import BatchSchedule

    costs: Costs | None = healthy["costs"]
    times: list[float] = healthy["step_times"]
    if costs is None or costs.pings_answered < PINGS or len(times) < 3:
        why = ("no live server seen" if costs is None else
               f"{costs.pings_answered} of {PINGS} pings answered" if costs.pings_answered < PINGS else
               f"{len(times)} trainer steps, 3 or more are needed")
        return None, [f"overhead: not measured ({why})"]
    step_s = mean_step(times) or 0.0
    schedule = BatchSchedule.from_config(load_config(healthy["run"]))
    in_flight = schedule.rollout_target // schedule.group_size
    ticks = in_flight * step_s / env_server.POLL_S + 2 * schedule.groups_per_batch
    pings = step_s / env_server.WATCHDOG_INTERVAL_S + 1
    cost_s = ticks * costs.tick_s + pings * costs.ping_s
    share = 100 * cost_s / step_s
    return share, [
        f"supervisor, against the live server of run {healthy['run'].id}: a tick {costs.tick_s * 1e6:.1f} us "
        f"({TICKS} timed), a ping round trip {costs.ping_s * 1e3:.2f} ms ({costs.pings_answered}/{PINGS} answered)",
        f"per step (mean {step_s:.2f} s, trainer steps 2-{len(times)}): <= {ticks:.0f} ticks ({in_flight} groups in "
        f"flight x {step_s:.2f} s / POLL_S {env_server.POLL_S:g} s + 2 x {schedule.groups_per_batch} groups) and "
        f"<= {pings:.1f} pings (WATCHDOG_INTERVAL_S {env_server.WATCHDOG_INTERVAL_S:g} s) = "
        f"{cost_s * 1e3:.2f} ms = {share:.3f}% of step time"]


def report_install(row: Row) -> int:
    """`--faults install-pin` alone: its row and verdict."""
    print(f"{row.fault}: {row.state} in {row.wall_s:.1f} s; detected: {'yes' if row.detected else 'NO'}; "
          f"changed/checked: {len(row.left)}/{row.checked}")
    print(f"{row.fault}: {row.reason}")
    for what in row.left:
        print(f"{row.fault}: left after the install: {what}")
    print(f"faults: {int(bool(row.detected))}/1 detected, 0 hung, {len(row.left)} changes left: "
          f"{'OK' if row.expected else 'FAILED'}")
    return 0 if row.expected else 1


def bench(args: argparse.Namespace, home: Path) -> int:
    os.environ["PRIME_LAB_HOME"] = str(home)
    if args.verifiers_home is not None:
        os.environ["PRIME_LAB_VERIFIERS_HOME"] = str(args.verifiers_home.expanduser().resolve())
    from prime_lab.envs.releases import releases_home

    pinned = run_install_pin(home, dict(os.environ)) if INSTALL_FAULT in args.faults else None
    if pinned is not None and args.faults == [INSTALL_FAULT]:
        return report_install(pinned)
    release = importlib.metadata.version("verifiers")
    model = args.model
    if model is None:
        from prime_lab.models import build_tiny_model

        model = str(build_tiny_model(home / "tiny-model"))
    faults_dir = home / "faults"
    faults_dir.mkdir(exist_ok=True)
    (faults_dir / "bench_fault_env.py").write_text(FAULT_ENV)
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": str(faults_dir) + (os.pathsep + path if path else ""),
           "HF_DATASETS_OFFLINE": "1"}
    print(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; model {model}; {args.steps} steps "
          f"(raise: more), batch 16 x 4 rollouts, 8 tokens; seed {args.seed}; PRIME_LAB_HOME {home}", flush=True)

    venv = releases_home() / release
    existed = (venv / ".prime-lab-ready").is_file()
    t0 = time.monotonic()
    done = subprocess.run([PRIME, "env", "install", str(FIXTURE), "--verifiers", release, "--isolate"],
                          capture_output=True, text=True, env=env, check=False, timeout=1800)
    if done.returncode != 0:
        raise BenchError(f"prime env install {FIXTURE} --verifiers {release} --isolate failed (exit "
                         f"{done.returncode}):\n{(done.stderr or done.stdout).strip()[-3000:]}")
    print(f"prime env install {FIXTURE.relative_to(ROOT)} --verifiers {release} --isolate: "
          f"{time.monotonic() - t0:.0f} s ({venv} {'reused' if existed else 'created'})", flush=True)

    ctx = SimpleNamespace(home=home, model=model, steps=args.steps, seed=args.seed, env=env, bound=args.run_timeout,
                          release=release, faults_dir=faults_dir, hang_share=args.hang_share,
                          hang_timeout=args.hang_timeout)
    runs: dict[str, Callable[[SimpleNamespace], Row]] = {
        "server-kill": run_server_kill, "hang": run_hang, "hung-scorer": run_hung_scorer, "raise": run_raise}
    row, healthy = run_healthy(ctx)
    rows = [row] + ([pinned] if pinned is not None else [])
    ctx.step_s = mean_step(healthy["step_times"]) or 1.0  # the faults come within a step's time after a batch
    print(f"run none (healthy): {row.state} in {row.wall_s:.0f} s, {ctx.step_s:.2f} s a step", flush=True)
    for fault in (f for f in args.faults if f != INSTALL_FAULT):
        rows.append(runs[fault](ctx))
        print(f"run {fault}: {rows[-1].state} in {rows[-1].wall_s:.0f} s", flush=True)

    header = ["fault", "injected", "detected", "detect s", "groups lost", "steps", "final state", "left/checked",
              "wall s"]
    table = [header] + [r.cells() for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    print()
    for line in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
    print()
    for r in rows:
        if r.reason:
            print(f"{r.fault}: {r.reason if len(r.reason) <= 400 else r.reason[:400] + ' ...'}")
        for process in r.left:
            print(f"{r.fault}: left after the run: {process}")
    share, lines = overhead(healthy)
    print()
    for text in lines:
        print(text)

    faults = [r for r in rows if r.detected is not None]
    detected = sum(bool(r.detected) for r in faults)
    hung = sum(r.hung for r in rows)
    left = sum(len(r.left) for r in rows)
    ok = (detected == len(faults) and all(r.expected for r in rows) and not hung and not left
          and share is not None and share <= OVERHEAD_GOAL)
    shown = "not measured" if share is None else f"{share:.3f}%"
    print(f"faults: {detected}/{len(faults)} detected, {hung} hung, {left} processes left"
          + ("" if all(r.expected for r in rows) else ", a run ended otherwise than expected")
          + f"; supervisor overhead {shown} of step time (goal <= {OVERHEAD_GOAL:g}%): {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4, help="max_steps of each run (the raise run: more; >= 3)")
    parser.add_argument("--seed", type=int, default=0, help="draws the moment of each fault; the runs' seed")
    parser.add_argument("--faults", default=",".join(FAULTS),
                        help=f"which faults, comma-separated (default all: {','.join(FAULTS)})")
    parser.add_argument("--model", default=None, help="a model id or folder (default: a tiny random model)")
    parser.add_argument("--run-timeout", type=float, default=420.0,
                        help="seconds a run may take before it counts as hung (default 420)")
    parser.add_argument("--hang-timeout", type=float, default=3.0, help="the hang run's [[env]] timeout (default 3)")
    parser.add_argument("--hang-share", type=float, default=0.05,
                        help="after the first, the share of rollouts that hang (default 0.05)")
    parser.add_argument("--home", type=Path, default=None,
                        help="PRIME_LAB_HOME to install and run in, kept after (default: a temporary folder)")
    parser.add_argument("--verifiers-home", type=Path, default=None,
                        help="where releases' virtual environments live (PRIME_LAB_VERIFIERS_HOME; default: that "
                             "variable, else <home>/verifiers)")
    args = parser.parse_args(argv)
    if args.steps < 3:
        parser.error("--steps must be at least 3 (a fault comes after batch 1 and meets at least two more)")
    args.faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    unknown = [f for f in args.faults if f not in FAULTS]
    if unknown or not args.faults:
        parser.error(f"--faults: {', '.join(unknown) or 'none given'}; choose from {', '.join(FAULTS)}")
    if not 0 <= args.hang_share <= 1 or args.hang_timeout <= 0 or args.run_timeout <= 0:
        parser.error("--hang-share must be within 0-1, --hang-timeout and --run-timeout above 0")
    try:
        if args.home is not None:
            home = args.home.expanduser().resolve()
            home.mkdir(parents=True, exist_ok=True)
            return bench(args, home)
        with tempfile.TemporaryDirectory(prefix="prime-lab-bench-faults-") as tmp:
            return bench(args, Path(tmp))
    except BenchError as exc:
        print(f"bench/env_faults.py: {exc}", flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
