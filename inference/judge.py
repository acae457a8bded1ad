"""The LLM judge of a run, evaluation or GEPA run (`[judge]`, `--judge MODEL`; envs/judges.py has the table and the
wiring): a local server started for it, as a distillation teacher's is (its own process, log `logs/judge.log`, role
`judge` on the System tab, stopped with the run), or the endpoint `[judge.client]` names.

A local judge is our built-in server or vLLM, whichever `backend` picks (`inference.backend.choose_backend`), with
`[judge.sampling]` as its generation defaults (`--override-generation-config`): most environments send their judge
requests without `max_tokens`, and a small model would then write to the end of its context. Its requests are batched
with the server's own continuous batching, whoever sends them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from prime_lab.envs.judges import LOCAL_KEY, JudgeConfig, JudgeEndpoint
from prime_lab.inference.judge_metrics import UNREACHABLE, JudgeMeter
from prime_lab.runs.paths import environ_set
from prime_lab.runs.processes import RunningServer

if TYPE_CHECKING:
    from prime_lab.runs.registry import Run

ROLE = "judge"


class JudgeUnavailable(RuntimeError):
    """The judge cannot be had: its model is not here, its server did not start, its key is not set. One line."""


def generation_config(config: JudgeConfig) -> dict[str, Any]:
    """The judge server's generation defaults (vLLM's --override-generation-config names)."""
    out: dict[str, Any] = {"max_new_tokens": config.sampling.max_tokens}
    if config.sampling.temperature is not None:
        out["temperature"] = config.sampling.temperature
    return out


def external_endpoint(config: JudgeConfig) -> JudgeEndpoint:
    """`[judge.client]`'s endpoint, with its key from `api_key_var` (the variable, else `prime secret`)."""
    from prime_lab.envs.secret_store import variable_or_secret

    assert config.client.base_url is not None
    key = variable_or_secret(config.client.api_key_var)
    if not key:
        raise JudgeUnavailable(f"[judge.client] api_key_var = {config.client.api_key_var!r} is not set: store the "
                               f"judge's key with `prime secret create -n {config.client.api_key_var}`, or export it")
    return JudgeEndpoint(config.client.base_url.rstrip("/"), config.model, key)


class JudgePlan:
    """A judge a process will have, with its endpoint known before it starts (a local one's port is chosen now), so
    that environments can be loaded wired to it (`applied`) before the run that starts it (`start`) exists."""

    def __init__(self, config: JudgeConfig) -> None:
        from prime_lab.runs.processes import free_port

        self.config = config
        self.port: int | None = None
        if config.client.base_url is not None:
            self.endpoint = external_endpoint(config)
        else:
            self.port = free_port()
            self.endpoint = JudgeEndpoint(f"http://127.0.0.1:{self.port}/v1", config.model, LOCAL_KEY)
        self.server: RunningServer | None = None
        self.reason = ""
        self.meter: JudgeMeter | None = None  # a local judge's figures since it started (`summary`)

    def describe(self) -> str:
        where = f"local, {self.reason}" if self.port is not None else "[judge.client]"
        return f"judge {self.endpoint.model} at {self.endpoint.base_url} ({where})"

    @contextmanager
    def applied(self) -> Iterator[JudgePlan]:
        """Where the judge is, in this process's environment for the block (envs/judges.py
        `endpoint_from_environ`): the environments loaded in it and the environment servers started from it are
        wired to it."""
        with environ_set(self.endpoint.environ()):
            yield self

    def start(self, log_path: Path, *, register: Callable[[str, int], None] | None = None,
              env: Mapping[str, str] | None = None, gpu_memory_utilization: float | None = None,
              timeout: float = 600.0, announce: Callable[[str], None] = print) -> RunningServer | None:
        """Start a local judge on its port and wait until it serves (its process registered under `judge` through
        `register` as soon as it runs); nothing for `[judge.client]`'s. Raises JudgeUnavailable."""
        from prime_lab.inference.backend import BackendUnavailableError, choose_backend
        from prime_lab.inference.launch import SamplerOptions, start_sampler
        from prime_lab.models import ModelNotFoundError, resolve_model
        from prime_lab.runs.processes import ServerStartError

        config = self.config
        if self.port is None:
            return None
        try:
            path = resolve_model(config.model)
            choice = choose_backend(config.backend)
        except (ModelNotFoundError, BackendUnavailableError) as exc:
            raise JudgeUnavailable(f"[judge] model = {config.model!r}: {exc}") from exc
        options = SamplerOptions(port=self.port, lora=False, generation_config=generation_config(config),
                                 gpu_memory_utilization=gpu_memory_utilization or config.gpu_memory_utilization)
        announce(f"Starting the judge: the {choice.backend} server on {config.model} ...")
        server: RunningServer | None = None
        try:
            server = start_sampler(choice.backend, path, log_path, served_name=config.model, timeout=timeout,
                                   env=env, wait=False, options=options)
            if register is not None and server.process.pid:
                register(ROLE, server.process.pid)
            self.server = server
            server.process.wait_ready(timeout=timeout)
        except (ServerStartError, OSError) as exc:
            self.stop()
            raise JudgeUnavailable(f"the judge's {choice.backend} server on {config.model} did not start: "
                                   f"{exc}") from exc
        self.reason = choice.reason
        self.meter = JudgeMeter(server.root_url)
        return server

    def summary(self) -> str | None:
        """What a local judge did since it started, in one line (None for [judge.client]'s, or one that no longer
        answers)."""
        if self.meter is None:
            return None
        figures = self.meter.step()
        if UNREACHABLE in figures:
            return None
        line = (f"judge: {figures['judge/requests']:.0f} requests, {figures['judge/generation_tokens']:.0f} tokens "
                f"generated, {figures['judge/errors']:.0f} errors, {figures['judge/timed_out']:.0f} timed out")
        if "judge/latency_p50_s" in figures:
            line += (f"; latency p50 {figures['judge/latency_p50_s']:.2f} s, "
                     f"p95 {figures['judge/latency_p95_s']:.2f} s")
        return line

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


def plan(settings: Mapping[str, Any] | JudgeConfig | None) -> JudgePlan | None:
    """The plan for a `[judge]` table (as given, or checked), None without one. Raises JudgeUnavailable for
    `[judge.client]` without its key."""
    if not settings:
        return None
    config = settings if isinstance(settings, JudgeConfig) else JudgeConfig.model_validate(dict(settings))
    return JudgePlan(config)


def settings_for(model: str | None, given: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The `[judge]` settings of an evaluation or GEPA run: `--judge MODEL` over the config file's table."""
    out = dict(given or {})
    if model:
        out = {**out, "model": model}
    return out


class JudgedJob(Protocol):
    """An evaluation's or GEPA run's job: its `[judge]` settings as given and, once made, their plan."""

    judge: dict[str, Any]
    judge_plan: JudgePlan | None


def applied_for(job: JudgedJob) -> AbstractContextManager[Any]:
    """The job's judge endpoint in this process's environment for a block (`JudgePlan.applied`; its plan made on
    first use): what loads in the block is wired to it. Raises JudgeUnavailable."""
    if job.judge_plan is None:
        job.judge_plan = plan(job.judge)
    return job.judge_plan.applied() if job.judge_plan is not None else nullcontext()


def start_for_run(job: JudgedJob, run: Run, on_exit: Callable[[Callable[[], Any]], Any],
                  announce: Callable[[str], None], *wirings: str | None) -> None:
    """Start the job's local judge for `run` (log `logs/judge.log`, process registered as `judge`, stopped
    through `on_exit`) and say where it is and how each environment (`wirings`) was pointed at it."""
    if job.judge_plan is None:
        return
    judge = job.judge_plan
    judge.start(run.log_path(ROLE), register=run.register_process, announce=announce)

    def stop() -> None:
        line = judge.summary()  # what it did, said as it stops
        if line:
            announce(line)
        judge.stop()

    on_exit(stop)
    for line in (job.judge_plan.describe(), *wirings):
        if line:
            announce(line)
