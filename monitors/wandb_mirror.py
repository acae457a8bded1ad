"""The W&B mirror: a run's event log, copied into a Weights & Biases run by a process of its own.

    python -P -m prime_lab.monitors.wandb_mirror RUN_DIR

The RL supervisor starts it beside the run's processes when the resolved config has a `[wandb]` section
(`wanted`, `mirror_argv`). It follows `events.jsonl` (the single source, DESIGN.md) until the run reaches a final
state, then logs what is left and finishes the W&B run. Nothing of the run waits on it: a slow, unreachable or
refusing W&B only delays or degrades this process, and what goes wrong is reported as a `log` event.

What it logs: every `metrics` event at its `step` (W&B's `_step` is the training step), `eval` results, the
`sample` rollouts of a step as a `wandb.Table` (`samples`), `alert` events as W&B alerts plus an `alerts/<name>`
point at their step, the resolved config as the run config, and the supervisor's `system` samples as system metrics
(`system/trainer.0/cpu_percent`, `system/gpu.0/memory_used_bytes`, ...: runs/system_metrics.py). A sample has no
step: it goes with the step the trainer is on (the newest sample of a step wins), so the charts share the x-axis.

Steps: the orchestrator and the trainer both write `metrics` for a step, the orchestrator up to `max_async_level`
steps ahead, and W&B drops a step lower than one already logged. So values are collected per step and a step is
logged once both have moved past it (or it is `max_async_level + 3` steps old, or the run ended): `StepAssembler`.

Mode: `WANDB_API_KEY` in the environment means online (`WANDB_MODE` overrides either way); without one the run is
written offline under `RUN_DIR/wandb/`, said once on stderr and as a `log` event with the `wandb sync` command that
uploads it. An online start that fails (no network, bad key) is reported once and the mirror goes on offline, with
the same run id, so nothing is lost. The key itself is never written by this module (messages are redacted).

Ending: when the run's final `status` event is read (the status of the current attempt), the mirror logs the steps
it still holds and finishes the W&B run. A SIGTERM (`prime rl stop` signals the whole process group) does not cut
the run's last steps off: the mirror keeps following until the final state, `STOP_GRACE_S` at most. SIGINT or a
second SIGTERM: log what it holds and finish now. It also ends when its parent (the supervisor) is gone.

Restarts (DESIGN.md, restart contract): the W&B run id is made once and kept in `RUN_DIR/wandb/run.json` with the
last step logged and the last `restart` event applied. A mirror started again replays the log from the start and
logs only what is not in W&B yet; a `restart` event at step k after steps beyond k were logged resumes the same run
rewound to k (`resume_from="ID?_step=k"`), so W&B shows the final timeline, each step once.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import secrets
import signal
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from prime_lab.runs.atomic import write_json_atomic
from prime_lab.runs.events import RESTART, BadLine, Event
from prime_lab.runs.paths import child_python
from prime_lab.runs.registry import FINAL_STATES, Run
from prime_lab.runs.system_metrics import SYSTEM, SystemSample

MODULE = "prime_lab.monitors.wandb_mirror"
Mode = Literal["online", "offline", "disabled"]
STEP_SOURCES = ("orchestrator", "trainer")  # the sources whose `metrics` a step waits for
SAMPLE_COLUMNS = ("step", "env", "example_id", "prompt", "completion", "answer", "reward", "advantage", "metrics")
POLL_S = 0.25
FINAL_GRACE_S = 10.0  # a final status.json with no final status event in the log yet: wait this long, then stop
STOP_GRACE_S = 150.0  # after a SIGTERM, follow the run this long at most for its last steps and final state
ONLINE_FINISH_TIMEOUT_S = 120.0  # an online finish() waits at most this long for uploads (`wandb sync` does the rest)
_ID_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"


# The launcher's side ----------------------------------------------------------------------------------------------
def wanted(resolved_config: dict[str, Any]) -> bool:
    """Whether a run with this resolved config is mirrored to W&B (it has a `[wandb]` section)."""
    return isinstance(resolved_config.get("wandb"), dict)


def mirror_argv(run_dir: Path) -> list[str]:
    """The command that starts the mirror for the run in `run_dir`."""
    return [*child_python(), "-m", MODULE, str(run_dir)]


# Steps ------------------------------------------------------------------------------------------------------------
@dataclass
class StepRecord:
    """Everything logged at one W&B step."""

    step: int
    values: dict[str, float] = field(default_factory=dict)
    samples: list[dict[str, Any]] = field(default_factory=list)
    alerts: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Rewind:
    """W&B holds steps after `step` that a restart replaced: resume the run rewound to `step`."""

    step: int
    seq: int  # the restart event's seq


@dataclass(frozen=True)
class AlertNow:
    """An alert with no step to attach to (or whose step is already logged): sent on its own."""

    alert: dict[str, Any]  # name, message, level, seq


Action = StepRecord | Rewind | AlertNow


class StepAssembler:
    """Turns events into W&B actions in step order, each step once. Pure logic (no wandb).

    `logged` is the last step W&B holds, `restart_seq` the last restart event applied and `alert_seq` the last alert
    sent (all from `run.json`), so a replay from the start of the log produces only what W&B does not have yet."""

    def __init__(self, logged: int = -1, restart_seq: int = 0, alert_seq: int = 0, max_async_level: int = 2,
                 sources: tuple[str, ...] = STEP_SOURCES) -> None:
        self.logged = logged
        self.restart_seq = restart_seq
        self.alert_seq = alert_seq
        self.window = max_async_level + 3
        self.pending: dict[int, StepRecord] = {}
        self.progress = {source: -1 for source in sources}  # an SFT run's steps come from the trainer alone
        self.late = 0  # events for a step already logged (a replay of the log counts those W&B has as well)

    def feed(self, event: Event) -> list[Action]:
        if event.kind == RESTART and event.step is not None:
            return self._restart(event.step, event.seq)
        step = event.step
        if event.kind == "alert":
            if event.seq <= self.alert_seq:
                return []  # sent by an earlier mirror of this run
            alert = {"name": str(event.data.get("name", "alert")), "message": str(event.data.get("message", "")),
                     "level": str(event.data.get("level", "WARNING")), "seq": event.seq}
            if step is None or step <= self.logged:
                return [AlertNow(alert)]
            self._record(step).alerts.append(alert)
            return self._ready()
        if event.kind == SYSTEM:
            return self._system(event)
        if event.kind not in ("metrics", "eval", "sample") or step is None:
            return []
        if step <= self.logged:
            self.late += 1
            return []
        record = self._record(step)
        if event.kind == "metrics":
            record.values.update(_scalars(event.data))
            if event.source in self.progress:
                self.progress[event.source] = max(self.progress[event.source], step)
        elif event.kind == "eval":
            found = event.data.get("metrics")
            record.values.update(_scalars(found if isinstance(found, dict) else {}))
        else:
            record.samples.append(event.data)
        return self._ready()

    def flush(self) -> list[StepRecord]:
        """Every pending step, in order (the run has ended)."""
        out = [self.pending.pop(step) for step in sorted(self.pending)]
        if out:
            self.logged = out[-1].step
        return out

    def _system(self, event: Event) -> list[Action]:
        """A system sample joins the step the trainer is on (its newest step, still waiting to be logged; step 0
        before its first), never a step W&B holds already."""
        trainer = self.progress.get("trainer", min(self.progress.values()))
        self._record(max(self.logged + 1, trainer, 0)).values.update(SystemSample.from_event_data(event.data).scalars())
        return self._ready()

    def _record(self, step: int) -> StepRecord:
        if step not in self.pending:
            self.pending[step] = StepRecord(step)
        return self.pending[step]

    def _ready(self) -> list[Action]:
        """Steps every source has moved past, and steps too old to wait for any longer, in order."""
        done = min(self.progress.values())
        newest = max(self.pending, default=-1)
        out: list[Action] = []
        for step in sorted(self.pending):
            if step < done or step <= newest - self.window:
                out.append(self.pending.pop(step))
                self.logged = step
            else:
                break
        return out

    def _restart(self, step: int, seq: int) -> list[Action]:
        """A restart from the checkpoint of `step`: what came after it is replaced by the new attempt."""
        self.pending = {s: r for s, r in self.pending.items() if s <= step}
        self.progress = {source: min(done, step) for source, done in self.progress.items()}
        if seq <= self.restart_seq:
            return []  # applied by an earlier mirror of this run (W&B has been rewound already)
        self.restart_seq = seq
        if self.logged > step:
            self.logged = step
            return [Rewind(step, seq)]
        return []


def _scalars(data: dict[str, Any]) -> dict[str, float]:
    return {str(k): float(v) for k, v in data.items() if isinstance(v, int | float)}


# State kept in the run directory ------------------------------------------------------------------------------------
@dataclass
class MirrorState:
    """`RUN_DIR/wandb/run.json`: the W&B run id and what was last logged (never a key)."""

    id: str
    logged: int = -1  # the last W&B step logged
    restart_seq: int = 0  # the seq of the last restart event applied
    alert_seq: int = 0  # the seq of the last alert event sent
    started: bool = False  # a W&B run with this id has been started (later starts resume it)
    mode: str = ""
    folders: list[str] = field(default_factory=list)  # W&B's local run folders, oldest first (`wandb sync` order)
    url: str | None = None

    @classmethod
    def load(cls, path: Path) -> MirrorState:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            data = None
        if not isinstance(data, dict) or not isinstance(data.get("id"), str):
            return cls(id="".join(secrets.choice(_ID_ALPHABET) for _ in range(12)))
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)

    def save(self, path: Path) -> None:
        write_json_atomic(path, asdict(self))


# The W&B side ------------------------------------------------------------------------------------------------------
class WandbRun:
    """The one W&B run of a prime-lab run: opened lazily, resumed or rewound, online or (falling back) offline."""

    def __init__(self, run: Run, state: MirrorState, resolved: dict[str, Any], mode: Mode, key: str | None) -> None:
        self.run = run
        self.state = state
        self.resolved = resolved
        self.mode: Mode = mode
        self.key = key
        self.home = run.dir / "wandb"
        self.state_path = self.home / "run.json"
        self.handle: Any = None
        self.announced = False
        self.fell_back = False  # an online start failed: this process goes on offline

    def open(self, rewind_to: int | None = None) -> None:
        import wandb

        section = self.resolved.get("wandb") or {}
        kwargs: dict[str, Any] = {
            "project": section.get("project") or "prime-lab", "entity": section.get("entity"),
            "name": section.get("name") or self.run.id, "id": self.state.id, "dir": str(self.home),
            "config": self.resolved, "job_type": str(self.run.read_status().get("kind") or "rl"),
        }
        if rewind_to is not None:
            kwargs["resume_from"] = f"{self.state.id}?_step={rewind_to}"
        elif self.state.started:
            kwargs["resume"] = "allow"
        try:
            self.handle = wandb.init(mode=self.mode, settings=self._settings(), **kwargs)
        except Exception as exc:  # noqa: BLE001 - any failure of an online start: report it, go on offline
            if self.mode == "offline":
                raise
            wandb.teardown()  # the failed run keeps its id busy in wandb's service otherwise
            self.report(f"W&B could not start the run online ({_first_line(exc)}); mirroring offline instead",
                        "WARNING")
            self.mode, self.fell_back = "offline", True
            self.handle = wandb.init(mode="offline", settings=self._settings(), **kwargs)
        self.state.started, self.state.mode = True, self.mode
        folder = str(Path(self.handle.dir).parent)
        if folder not in self.state.folders:
            self.state.folders.append(folder)
        self.state.url = self.handle.url if self.mode == "online" else None
        self.save()
        if self.mode == "offline" and not self.announced:
            self.announced = True
            reason = "no WANDB_API_KEY" if self.key is None else \
                "the online start failed" if self.fell_back else "WANDB_MODE=offline"
            self.report(f"W&B is offline ({reason}): run {self.state.id} is saved under {self.home}; upload it "
                        f"later with `wandb sync {' '.join(self.state.folders)}`")
        elif self.mode == "online":
            print(f"W&B run {self.state.id}: {self.state.url}", file=sys.stderr, flush=True)

    def _settings(self) -> Any:
        import wandb

        # console off: the mirror's own output is not a training log; stats off: they would measure this process.
        return wandb.Settings(silent=True, console="off", x_disable_stats=True, x_disable_machine_info=True,
                              disable_code=True, finish_timeout=ONLINE_FINISH_TIMEOUT_S)

    def apply(self, action: Action) -> None:
        if isinstance(action, Rewind):
            if self.handle is not None:
                self.handle.finish()
                self.handle = None
            self.open(rewind_to=action.step)
            self.state.logged, self.state.restart_seq = action.step, action.seq
            self.save()
            return
        if self.handle is None:
            self.open()
        if isinstance(action, AlertNow):
            self.alert(action.alert)
            self.save()
            return
        self.log(action)

    def log(self, record: StepRecord) -> None:
        import wandb

        data: dict[str, Any] = dict(record.values)
        if record.samples:
            rows = [[record.step, *(_cell(sample.get(c)) for c in SAMPLE_COLUMNS[1:])] for sample in record.samples]
            data["samples"] = wandb.Table(columns=list(SAMPLE_COLUMNS), data=rows)
        for alert in record.alerts:
            data[f"alerts/{alert['name']}"] = 1.0
        self.handle.log(data, step=record.step)
        for alert in record.alerts:
            self.alert(alert)
        self.state.logged = record.step
        self.save()

    def alert(self, alert: dict[str, Any]) -> None:
        level = {"ERROR": "ERROR", "INFO": "INFO", "DEBUG": "INFO", "SUCCESS": "INFO"}.get(alert["level"].upper(),
                                                                                        "WARN")
        try:
            self.handle.alert(title=alert["name"], text=alert["message"] or alert["name"], level=level,
                              wait_duration=0)
        except Exception as exc:  # noqa: BLE001 - an alert W&B refuses is reported, the mirror goes on
            self.report(f"W&B refused alert {alert['name']}: {_first_line(exc)}", "WARNING")
        self.state.alert_seq = max(self.state.alert_seq, alert["seq"])

    def finish(self, final_state: str) -> None:
        if self.handle is None:
            self.open()
        self.handle.summary["prime_lab/state"] = final_state
        self.handle.finish(exit_code=0 if final_state == "completed" else 1)
        self.handle = None

    def save(self) -> None:
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        self.state.save(self.state_path)

    def report(self, message: str, level: str = "INFO") -> None:
        """Say it on stderr (the mirror's log file) and in the run's event log, with any key redacted."""
        if self.key:
            message = message.replace(self.key, "***")
        print(f"[wandb] {level}: {message}", file=sys.stderr, flush=True)
        with self.run.writer("launcher") as writer:
            writer.log(f"wandb: {message}", level)


def _cell(value: Any) -> Any:
    """A table cell: numbers and text as they are, chat messages as `role: content` lines, the rest as JSON."""
    if value is None or isinstance(value, str | int | float):
        return value
    if isinstance(value, list) and all(isinstance(m, dict) and "content" in m for m in value):
        return "\n".join(f"{m.get('role', '?')}: {m.get('content')}" for m in value)
    return json.dumps(value, default=str)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def choose_mode(environ: Mapping[str, str]) -> Mode:
    """online with a key, offline without one; `WANDB_MODE` (online, offline, dryrun, disabled) wins."""
    explicit = _MODES.get(environ.get("WANDB_MODE", "").strip().lower())
    if explicit is not None:
        return explicit
    return "online" if environ.get("WANDB_API_KEY") else "offline"


_MODES: dict[str, Mode] = {"online": "online", "offline": "offline", "dryrun": "offline", "disabled": "disabled"}


# The process -------------------------------------------------------------------------------------------------------
class Mirror:
    """Follows one run's event log into its W&B run until the run ends."""

    def __init__(self, run: Run, resolved: dict[str, Any], mode: Mode, key: str | None) -> None:
        self.run = run
        state = MirrorState.load(run.dir / "wandb" / "run.json")
        level = resolved.get("max_async_level")
        self.kind = str(run.read_status().get("kind") or "rl")
        self.steps = StepAssembler(state.logged, state.restart_seq, state.alert_seq,
                                   level if isinstance(level, int) else 2,
                                   sources=("trainer",) if self.kind == "sft" else STEP_SOURCES)
        self.wandb = WandbRun(run, state, resolved, mode, key)
        self.terminated = False  # stop now (SIGINT, or a second SIGTERM)
        self.stop_asked_at: float | None = None  # a SIGTERM: the run is being stopped, its last steps are coming
        self.final_event: Event | None = None  # the latest `status` event with a final state
        self.final_seen_at: float | None = None
        self.parent = os.getppid()

    def handle(self, event: Event) -> None:
        if event.kind == "status":
            self.final_event = event if event.data.get("state") in FINAL_STATES else None
        for action in self.steps.feed(event):
            self.wandb.apply(action)
        if self.steps.restart_seq != self.wandb.state.restart_seq:
            # a restart that needed no rewind (W&B held nothing after its step): remember it was applied, or a
            # later mirror would replay it against steps the new attempt has logged since
            self.wandb.state.restart_seq = self.steps.restart_seq
            self.wandb.save()

    def finished(self) -> bool:
        """The run has ended (its final status event is read), the mirror was told to stop, or its parent died."""
        if self.terminated or os.getppid() != self.parent:
            return True
        if self.stop_asked_at is not None and time.monotonic() - self.stop_asked_at > STOP_GRACE_S:
            return True
        status = self.run.read_status()
        if status.get("state") not in FINAL_STATES:
            self.final_seen_at = None
            return False
        if self.final_event is not None and self.final_event.attempt >= self.run.attempt:
            return True
        # status.json says final but its event has not been read (or belongs to an earlier attempt that is about to
        # be restarted): wait a little for the log to catch up.
        now = time.monotonic()
        self.final_seen_at = self.final_seen_at or now
        return now - self.final_seen_at > FINAL_GRACE_S

    def run_to_end(self) -> int:
        log = self.run.event_log()

        def bad(line: BadLine) -> None:
            print(f"[wandb] skipped a bad line at byte {line.offset}: {line.text[:80]}", file=sys.stderr)

        # Replay what is in the log already (W&B may hold part of it: a restart, or this mirror started again),
        # then open the W&B run (if the replay has not: a rewind opens it its own way) and follow.
        items, offset = log.read(0)
        for item in items:
            if isinstance(item, Event):
                self.handle(item)
            else:
                bad(item)
        self.steps.late = 0
        if self.wandb.handle is None:
            self.wandb.open()
        for event in log.tail(offset, follow=True, poll=POLL_S, stop=self.finished, on_bad_line=bad):
            self.handle(event)
        for record in self.steps.flush():
            self.wandb.apply(record)
        final = str(self.run.read_status().get("state", "unknown"))
        self.wandb.finish(final)
        state = self.wandb.state
        late = f"; {self.steps.late} events were for steps already in W&B" if self.steps.late else ""
        print(f"[wandb] run {state.id} ({state.mode}) holds steps up to {state.logged}{late}", file=sys.stderr,
              flush=True)
        return 0


@contextlib.contextmanager
def _only_mirror(run: Run) -> Iterator[bool]:
    """One mirror per run at a time: True when this process holds the run's mirror lock."""
    home = run.dir / "wandb"
    home.mkdir(parents=True, exist_ok=True)
    fd = os.open(home / ".mirror.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}",
                                     description="Mirror a run's event log into its W&B run until the run ends.")
    parser.add_argument("run_dir", type=Path)
    args = parser.parse_args(argv)
    run = Run(args.run_dir)
    try:
        resolved = json.loads(run.resolved_path.read_text())
    except (OSError, ValueError) as exc:
        print(f"[wandb] cannot read {run.resolved_path}: {exc}", file=sys.stderr)
        return 2
    if not isinstance(resolved, dict) or not wanted(resolved):
        print(f"[wandb] {run.id} has no [wandb] section: nothing to mirror", file=sys.stderr)
        return 0
    mode = choose_mode(os.environ)
    if mode == "disabled":
        print("[wandb] WANDB_MODE=disabled: not mirroring", file=sys.stderr)
        return 0
    home = run.dir / "wandb"
    # wandb stages tables (artifacts) in its data dir until they are uploaded: keep them with the run.
    os.environ.setdefault("WANDB_DATA_DIR", str(home / "data"))
    os.environ.setdefault("WANDB_CACHE_DIR", str(home / "cache"))
    os.environ["WANDB_SILENT"] = "true"
    with _only_mirror(run) as alone:
        if not alone:
            print(f"[wandb] another mirror is following {run.id}; leaving it to that one", file=sys.stderr)
            return 0
        mirror = Mirror(run, resolved, mode, os.environ.get("WANDB_API_KEY") or None)

        def stop(signum: int, frame: object) -> None:
            # `prime rl stop` signals the run's process group, this process too: the trainer still finishes its
            # step and the launcher records the final state, so a first SIGTERM only bounds how long to wait.
            if signum == signal.SIGTERM and mirror.stop_asked_at is None:
                mirror.stop_asked_at = time.monotonic()
            else:
                mirror.terminated = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        try:
            return mirror.run_to_end()
        except Exception as exc:  # noqa: BLE001 - W&B failing ends the mirror, never the run: report and exit
            mirror.wandb.report(f"the W&B mirror stopped: {_first_line(exc)}", "ERROR")
            return 1


if __name__ == "__main__":
    sys.exit(main())
