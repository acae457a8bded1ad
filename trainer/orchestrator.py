"""The orchestrator process: `python -m trainer.orchestrator RUN_DIR --base-url URL [--base-url URL2 ...] --model NAME
[--resume]`.

It keeps `oversampling_factor * batch_size` rollouts in flight against the sampler (groups of
`rollouts_per_example` rollouts of one example, through the `openai` AsyncOpenAI client; a new group starts as soon
as a group's worth of rollouts finished, so the sampler's batch stays full while a group waits for its slowest
rollout), scores them with the environments' rubrics, filters groups by difficulty, computes group advantages, and
writes one batch of `batch_size` rollouts per step for the trainer (`rollouts/step_k.jsonl`).

Several sampler servers (`--base-url` repeated) share the work (trainer/samplers.py): each group goes to the server
with the fewest rollouts in flight, and a failed request's health check asks the server it went to.

Policy versions: a batch for step k may hold groups sampled with policy version k - 1 - max_async_level or newer.
The orchestrator loads each version the trainer publishes into the sampler as soon as it appears: a LoRA adapter
(`/v1/load_lora_adapter`, in place; requests then name the adapter), or with full fine-tuning the whole model's
weights (`RuntimeWeights`: in place; requests keep the base model's name and carry a `cache_salt` per version).
With several servers it loads the version into every one of them, side by side, and only then uses it.
It starts groups only while the loaded version is new enough for the batch being filled, so the groups still in
flight when a batch completes are fresh enough for the next one; before filling step k it waits for version
k - 1 - max_async_level. Groups older than that are dropped as stale; a newer group waits for the next batch while
the oldest allowed ones still coming can fill this one. The rule (when a group may start, where a finished one goes)
is trainer/scheduler.py's; this module keeps the groups, the asyncio tasks and the sampler servers.

A completion cut by the sampler's context rather than by `[sampling].max_tokens` (vLLM shortens `max_tokens` to the
room left after the prompt without a word) is logged once as a WARNING with the numbers and the fix (`context_cut`).

Environments that fail: each rollout and its scoring have its environment's time limit (`[[env]] timeout`, or the
environment's own where smaller; envs/environment.py `timed_rollout`), and one past it, or one that raises, fails
(`EnvironmentDown` aside). A group with a failed rollout is dropped, and its environment is owed the group
(`MixSampler`): the next group started comes from it again, so a failing environment's share of the batch is not
filled by the others. Each step logs, per environment, the share of its rollouts that errored, that timed out and
that came back empty (`env/<name>/errored`, `env/<name>/timed_out`, `env/<name>/empty`) and its server's restarts
(`env/<name>/restarts`, per `[[env]]` entry; each restart is also an `env_restart` alert). An environment with
`ENV_ERRORED_LIMIT` of its rollouts errored for `ENV_ERRORED_STEPS` steps in a row, or whose server is down for good
(`EnvironmentDown`), fails the run with its name and its last error.

Sandboxes (sandbox/local.py): each step's metrics carry what the run's sandboxes did since the previous step
(`sandbox/created`, `sandbox/commands`, `sandbox/timed_out`, `sandbox/oom`, `sandbox/command_seconds`; from
`<run_dir>/sandbox_stats.jsonl`, sandbox/stats.py), from the run's first sandbox on.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from prime_lab.envs import (
    Environment,
    Rollout,
    SamplingArgs,
    host_code,
    isolated,
    load_env_files,
    load_environment,
    replace_system_prompt,
)
from prime_lab.envs.env_server import EnvironmentDown
from prime_lab.envs.environment import DEFAULT_ROLLOUT_TIMEOUT_S, empty, rollout_time_limit, timed_out, timed_rollout
from prime_lab.envs.judges import endpoint_from_environ
from prime_lab.envs.tool_prompt import ToolPrompts
from prime_lab.inference.control import AdapterLoadError, policy_cache_salt
from prime_lab.inference.judge_metrics import JudgeMeter
from prime_lab.models.resolve import local_tokenizer
from prime_lab.monitors.alerts import ENV_RESTART
from prime_lab.runs.evaluations import Failures, with_failures
from prime_lab.runs.events import EventWriter
from prime_lab.runs.processes import answers_health
from prime_lab.runs.registry import Run
from prime_lab.sandbox.stats import StatsFollower
from prime_lab.trainer.batch import Sample, rollout_samples, write_batch
from prime_lab.trainer.buffer import GroupFilter, MixSampler
from prime_lab.trainer.config import RLConfig
from prime_lab.trainer.loss import group_advantages
from prime_lab.trainer.runtime import (
    ADAPTER_NAME,
    StopFlag,
    checkpoint_to_resume,
    guarded_main,
    latest_step,
    load_config,
    log_both,
    step_dirs,
)
from prime_lab.trainer.samplers import SamplerPool, SamplerServer
from prime_lab.trainer.scheduler import BatchSchedule
from prime_lab.trainer.teacher import Teacher, TeacherEndpoint, endpoint_of, retokenized_samples, teacher_sampling
from prime_lab.trainer.versions import drop_versions_after, versions_dir

SAMPLE_EVENTS_PER_STEP = 2
MAX_FILTERED_BATCHES = 5  # a batch's worth of groups filtered or failed this many times over: give up
ENV_ERRORED_LIMIT = 0.5  # an environment with this share of its rollouts errored ...
ENV_ERRORED_STEPS = 3  # ... in this many steps in a row fails the run
HEALTH_GRACE_S = 30.0
REQUEST_TIMEOUT_S = 600.0
CONTEXT_ERRORS = ("maximum context length", "max_model_len")  # how both engines word a request the context refuses
CONTEXT_FIX = "raise [inference].max_model_len or lower [sampling].max_tokens"


class OrchestratorError(RuntimeError):
    """The run cannot go on; the message says why."""


@dataclass
class Group:
    env: str
    rollouts: list[Rollout]
    version: int
    seconds: float
    finished_at: float = 0.0  # time.perf_counter() when its last rollout came back
    server: SamplerServer | None = None  # the sampler server its rollouts went to
    replacement: bool = False  # started in place of a failed group of its environment (`MixSampler`)


@dataclass
class EnvTally:
    """One environment's rollouts seen while a batch filled (kept, filtered, failed or stale)."""

    rollouts: int = 0
    errored: int = 0
    timed_out: int = 0
    empty: int = 0
    failed_groups: int = 0

    def add(self, group: Group) -> None:
        self.rollouts += len(group.rollouts)
        self.errored += sum(bool(r.error) for r in group.rollouts)
        self.timed_out += sum(timed_out(r) for r in group.rollouts)
        self.empty += sum(empty(r) for r in group.rollouts)


def eval_outcome(rollouts: Sequence[Rollout]) -> tuple[float, Failures]:
    """An evaluation's mean reward, a rollout that failed counted as 0 (one whose scorer raised may hold a partial
    reward), and how many failed: timed out (`timed_out`), or failed for another reason."""
    late = sum(timed_out(r) for r in rollouts)
    failures = Failures(len(rollouts), sum(bool(r.error) for r in rollouts) - late, late)
    return sum(0.0 if r.error else r.reward for r in rollouts) / max(1, len(rollouts)), failures


def generation_span(groups: list[Group]) -> float:
    """Seconds from the first group's start to the last group's end."""
    return max(g.finished_at for g in groups) - min(g.finished_at - g.seconds for g in groups)


def context_cut(rollout: Rollout, max_tokens: int | None) -> str | None:
    """Why `rollout` was cut by the sampler's context rather than by `max_tokens`, as a warning naming the numbers
    and the fix; None when it was not. vLLM clamps a request's `max_tokens` to the context left after its prompt
    without a word, so such an answer ends with finish_reason "length" short of `max_tokens` (with no `max_tokens`,
    "length" is the context's); a prompt that leaves no room, or a `max_tokens` above the context, is refused (HTTP
    400, "maximum context length" / "max_model_len"), by the built-in server too."""
    if rollout.error and any(words in rollout.error for words in CONTEXT_ERRORS):
        return (f"the sampler refused a request for its context length ({rollout.error.splitlines()[0][:300]}): "
                f"{CONTEXT_FIX}")
    for turn in rollout.turns:
        if turn.finish_reason != "length" or turn.completion_token_ids is None:
            continue
        completion = len(turn.completion_token_ids)
        if max_tokens is not None and completion >= max_tokens:
            continue
        limit = "no max_tokens" if max_tokens is None else f"short of [sampling].max_tokens = {max_tokens}"
        if turn.prompt_token_ids is None:
            filled = "it filled the sampler's context"
        else:
            prompt = len(turn.prompt_token_ids)
            filled = (f"its prompt ({prompt} tokens) and completion filled the sampler's context "
                      f"({prompt + completion} tokens)")
        return f"a completion was cut at {completion} tokens, {limit}: {filled}; {CONTEXT_FIX}"
    return None


def sampling_args(config: RLConfig) -> SamplingArgs:
    s = config.sampling
    extra: dict[str, Any] = {}
    if s.enable_thinking is not None:
        extra["chat_template_kwargs"] = {"enable_thinking": s.enable_thinking}
    if s.reasoning_effort is not None:
        extra["reasoning_effort"] = s.reasoning_effort
    return SamplingArgs(max_tokens=s.max_tokens, temperature=s.temperature, top_p=s.top_p, stop=list(s.stop),
                        seed=s.seed, rl_fields=True, extra_body=extra)


def env_names(config: RLConfig) -> list[str]:
    return [e.name or e.id.rsplit("/", 1)[-1] for e in config.env]


def batch_metrics(groups: list[Group], step: int, fill_seconds: float) -> dict[str, float]:
    """The step's batch metrics. tokens/s is the batch's tokens over the span in which they were generated, from its
    first group's start to its last group's end (groups run concurrently). Not over `fill_seconds`, the wait for the
    batch's last groups, nor the time between hand-overs: both are near 0 when the groups were sampled ahead of the
    trainer (they read 40k-2.9M tokens/s on such steps). Names as in DESIGN.md."""
    rollouts = [r for g in groups for r in g.rollouts]
    rewards = [r.reward for r in rollouts]
    mean = sum(rewards) / len(rewards)
    lengths = [sum(len(t.completion_token_ids or []) for t in r.turns) for r in rollouts]
    metrics: dict[str, float] = {
        "reward/mean": mean,
        "reward/std": math.sqrt(sum((x - mean) ** 2 for x in rewards) / len(rewards)),
        "rollout/mean_length": sum(lengths) / len(lengths),
        "rollout/truncated": sum(r.is_truncated for r in rollouts) / len(rollouts),
        "rollout/generation_time": fill_seconds,
        "perf/tokens_per_s": sum(lengths) / span if (span := generation_span(groups)) > 0 else 0.0,
        "batch/async_level": float(max(step - 1 - g.version for g in groups)),
    }
    by_env: dict[str, list[float]] = {}
    scores: dict[str, list[float]] = {}  # each reward function's score and each metric, by environment
    for g in groups:
        by_env.setdefault(g.env, []).extend(r.reward for r in g.rollouts)
        for r in g.rollouts:
            for name, value in r.metrics.items():
                if isinstance(value, int | float):
                    scores.setdefault(f"metrics/{g.env}/{name}", []).append(float(value))
    for env, values in by_env.items():
        metrics[f"reward/{env}"] = sum(values) / len(values)
    metrics.update({name: sum(values) / len(values) for name, values in scores.items()})
    return metrics


class Orchestrator:
    def __init__(self, run: Run, config: RLConfig, base_urls: str | Sequence[str], model: str, *,
                 resume: bool = False, api_key: str = "prime-lab", teacher: TeacherEndpoint | None = None,
                 model_path: Path | None = None) -> None:
        self.run, self.config, self.base_model = run, config, model
        self.events: EventWriter = run.writer("orchestrator")
        self.stop = StopFlag().install()
        if config.env_file:
            load_env_files(config.env_file, base=Path.cwd())
        self.names = env_names(config)
        self.restarts: dict[str, int] = {}  # environment servers restarted so far, by environment
        # an environment at its own verifiers release runs as a server of this run: logged beside the run's other
        # processes, registered so that the reaper ends it with the run, restarted if it dies (`env_restarted`)
        isolated.serve_for(run, on_restart=self.env_restarted)
        self.envs: dict[str, Environment] = {
            name: load_environment(e.id, **e.args) for name, e in zip(self.names, config.env, strict=True)}
        for env in self.envs.values():  # how each was pointed at the run's LLM judge ([judge], envs/judges.py)
            if env.judge_wiring:
                self.log(env.judge_wiring)
        # each environment's rollout time limit: its [[env]] timeout, or its own where smaller
        self.timeouts = {name: e.timeout for name, e in zip(self.names, config.env, strict=True)}
        self.time_limits = {name: rollout_time_limit(env, self.timeouts[name]) for name, env in self.envs.items()}
        # `[[env]] system_prompt` (a GEPA run's best, exported): each row's system message, as GEPA tried it
        self.system_prompts = {name: e.system_prompt for name, e in zip(self.names, config.env, strict=True)
                               if e.system_prompt is not None}
        # tools the model's chat template does not show: said once per environment, or with [sampling]
        # tools_in_system_prompt their schemas written into the rows' system messages (envs/tool_prompt.py)
        self.tools = ToolPrompts(config.model, lambda: local_tokenizer(str(model_path or model)),
                                 enabled=config.sampling.tools_in_system_prompt, log=self.log)
        # an environment whose own code runs what the model writes on this machine, outside the sandbox: said once
        for line in host_code.warnings_for([e.id for e in (*config.env, *(config.eval.env if config.eval else ()))]):
            self.log(line, "WARNING")
        self.sampler = MixSampler({n: self.rows(n, e.get_dataset()) for n, e in self.envs.items()},
                                  config.env_weights, seed=config.buffer.seed)
        self.filter = GroupFilter(config.buffer, config.difficulty_filter)
        self.sampling = sampling_args(config)
        # distillation (trainer/teacher.py): the teacher generates (loss = "sft") or scores (loss = "opd")
        self.teacher = Teacher(teacher, timeout=REQUEST_TIMEOUT_S) if teacher is not None else None
        self.teacher_sampling = teacher_sampling(config, self.sampling) if config.loss == "sft" else None
        self.tokenizer: Any = None
        if config.loss == "sft":
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(model_path or model)
        self.samplers = SamplerPool([base_urls] if isinstance(base_urls, str) else base_urls, api_key=api_key,
                                    timeout=REQUEST_TIMEOUT_S)
        self.versions = versions_dir(run, config)
        found = checkpoint_to_resume(run) if resume else None
        self.start_step = found[0] if found else 0
        if found:
            drop_versions_after(self.versions, self.start_step)  # the stopped attempt's: never the resumed run's
        self.version = -1  # the policy version the sampler serves; -1: not loaded yet
        self.model_name = model
        self.schedule = BatchSchedule.from_config(config)
        self.group_size = self.schedule.group_size
        self.rollouts_in_flight = 0
        self.filling = self.start_step + 1  # the step whose batch is being filled
        self.kept: list[Group] = []  # groups kept so far for the batch being filled
        self.tasks: dict[asyncio.Task[Group], int] = {}  # groups in flight -> their policy version
        self.load_lock = asyncio.Lock()
        self.loading = False  # a version is being loaded into the servers
        self.closing = False  # every batch is written (or the run stops): start no more groups
        self.ready: list[Group] = []  # finished, not yet looked at
        self.deferred: list[Group] = []  # finished, fresh enough for the next batch, kept for it
        self.reported: set[str] = set()  # rollout failures logged whole already
        self.context_warned = False  # a completion cut by the sampler's context was logged (once a run)
        self.rollouts_started = self.start_step * 100_000  # per-rollout seeds differ after a resume too
        self.last_errors: dict[str, str] = {}  # each environment's last rollout error (its first line)
        self.errored_steps: dict[str, list[tuple[int, float]]] = {}  # (step, errored share) in a row >= limit
        self.tallies: dict[str, EnvTally] = {}  # each environment's rollouts seen while the last batch filled
        self.sandbox_stats = StatsFollower(run.dir)  # what the run's sandboxes did since the previous step
        # the run's LLM judge ([judge]): its judge/* metrics from its own /metrics, where it is on this machine (a
        # hosted [judge.client] endpoint has none to give)
        judge = endpoint_from_environ()
        local = judge is not None and judge.base_url.startswith(("http://127.0.0.1:", "http://localhost:"))
        self.judge_meter = JudgeMeter(judge.base_url) if judge is not None and local else None

    def log(self, message: str, level: str = "INFO", step: int | None = None) -> None:
        log_both(self.events, message, level, step)

    # Environments that fail ------------------------------------------------------------------------------------
    def env_name(self, env: str, role: str | None = None) -> str:
        """This run's name for the environment an isolated server names: the entry whose server has `role` (two
        entries of one id have a server each), else by its id, its id's last part or our name."""
        for name, environment in self.envs.items():
            if role is not None and getattr(environment, "server_role", None) == role:
                return name
        for name, e in zip(self.names, self.config.env, strict=True):
            if env in (name, e.id, e.id.rsplit("/", 1)[-1], getattr(self.envs.get(name), "env_id", None)):
                return name
        return env

    def env_restarted(self, info: Mapping[str, Any]) -> None:
        """An environment's server died and was started again (`isolated.serve_for`'s `on_restart`): counted for
        `env/<name>/restarts`, an `env_restart` alert on the bus (the run page and `prime rl logs` show it) and a
        WARNING with its log's last lines."""
        name = self.env_name(str(info.get("env", "")), info.get("role"))
        self.restarts[name] = self.restarts.get(name, 0) + 1
        code = info.get("exit_code")
        why = str(info.get("reason") or (f"exit code {code}" if code is not None else "it stopped answering"))
        message = (f"environment {name}: its server died ({why}) and was restarted "
                   f"({info.get('restarts', self.restarts[name])} of at most {info.get('max_restarts', '?')}); "
                   "the groups it was serving are retried")
        step = self.filling
        self.events.emit("alert", {"name": ENV_RESTART, "message": message, "level": "WARNING", "env": name},
                         step=step)
        tail = str(info.get("log_tail") or "").strip()
        self.log(message + (f"; its log ends:\n{tail}" if tail else ""), "WARNING", step)

    def env_metrics(self, tallies: Mapping[str, EnvTally]) -> dict[str, float]:
        """`env/<name>/errored`, `env/<name>/timed_out` and `env/<name>/empty` (shares of the environment's rollouts
        seen while the batch filled, dropped groups included) for each environment with rollouts seen;
        `env/<name>/restarts` (so far) for each environment with a server of its own or a restart."""
        metrics: dict[str, float] = {}
        for name, tally in tallies.items():
            if tally.rollouts:
                metrics[f"env/{name}/errored"] = tally.errored / tally.rollouts
                metrics[f"env/{name}/timed_out"] = tally.timed_out / tally.rollouts
                metrics[f"env/{name}/empty"] = tally.empty / tally.rollouts
        for name, env in self.envs.items():
            if name in self.restarts or isinstance(env, isolated.IsolatedEnvironment):
                metrics[f"env/{name}/restarts"] = float(self.restarts.get(name, 0))
        return metrics

    def check_env_errors(self, step: int, tallies: Mapping[str, EnvTally]) -> None:
        """Fail the run when an environment had `ENV_ERRORED_LIMIT` of its rollouts errored in each of the last
        `ENV_ERRORED_STEPS` steps (a step without its rollouts neither counts nor breaks the run of steps)."""
        for name, tally in tallies.items():
            if not tally.rollouts:
                continue
            share = tally.errored / tally.rollouts
            steps = self.errored_steps.setdefault(name, [])
            if share < ENV_ERRORED_LIMIT:
                steps.clear()
                continue
            steps.append((step, share))
            if len(steps) >= ENV_ERRORED_STEPS:
                shares = ", ".join(f"{x:.0%} at step {k}" for k, x in steps[-ENV_ERRORED_STEPS:])
                raise OrchestratorError(
                    f"environment {name}: its rollouts errored ({shares}; the run stops when {ENV_ERRORED_LIMIT:.0%} "
                    f"or more do for {ENV_ERRORED_STEPS} steps in a row); last error: "
                    f"{self.last_errors.get(name, '?')}. Look at its server's log (logs/env-*.log in the run's folder "
                    "for an isolated environment) and the orchestrator's warnings; rollouts that time out need a "
                    "longer [[env]] timeout")

    def check_context(self, rollouts: Sequence[Rollout], max_tokens: int | None) -> None:
        """Warn once when a sampler answer was cut by its context rather than by `max_tokens` (`context_cut`)."""
        if self.context_warned:
            return
        for rollout in rollouts:
            if (cut := context_cut(rollout, max_tokens)) is not None:
                self.context_warned = True
                self.log(cut, "WARNING")
                return

    def rows(self, env_name: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """An environment's rows with its configured system prompt, if any, and its tools as `self.tools` has them."""
        prompt = self.system_prompts.get(env_name)
        rows = rows if prompt is None else [replace_system_prompt(r, prompt) for r in rows]
        return self.tools.rows(env_name, self.envs[env_name], rows)

    # Weights -----------------------------------------------------------------------------------------------
    def needs_published_version(self) -> bool:
        """Whether version 0 comes from the trainer (a resume or a warm start) rather than being the base model."""
        return self.start_step > 0 or self.config.checkpoint_id is not None

    async def wait_for_version(self, minimum: int) -> float:
        """Block until the trainer has published version >= `minimum`; load the newest into the sampler."""
        t0 = time.perf_counter()
        while True:
            newest = latest_step(self.versions)
            have = newest if newest is not None else (-1 if self.needs_published_version() else 0)
            if have >= minimum:
                break
            if self.stop.set:
                raise asyncio.CancelledError
            await asyncio.sleep(0.05)
        waited = time.perf_counter() - t0
        await self.refresh_policy()
        return waited

    async def refresh_policy(self) -> None:
        """Load the newest published version into the sampler if it is newer than the one it serves."""
        async with self.load_lock:
            newest = latest_step(self.versions)
            if newest is not None and newest > self.version:
                # no group starts while servers change weights: it would carry the old version (and, with full
                # fine-tuning, its cache salt) to a server that may already hold the new one
                self.loading = True
                try:
                    await asyncio.to_thread(self.load_version, newest)
                finally:
                    self.loading = False
            elif self.version < 0 and not self.needs_published_version():
                self.version = 0

    def load_version(self, version: int) -> None:
        """Load `version` into every sampler server, then use it: no request of a version goes out before every
        server serves it."""
        path = step_dirs(self.versions).get(version)
        if path is None:  # pruned in between: take whatever is newest now
            newest = latest_step(self.versions)
            if newest is None:
                return
            version, path = newest, step_dirs(self.versions)[newest]
        lora = self.config.lora.enabled

        def load_into(server: SamplerServer) -> None:
            try:
                if lora:
                    server.adapters.load(ADAPTER_NAME, path)
                else:
                    server.weights.load(path)
            except AdapterLoadError as exc:
                raise OrchestratorError(f"the sampler at {server.base_url} refused the trainer's "
                                        f"{'adapter' if lora else 'weights'}: {exc}") from exc

        t0 = time.perf_counter()
        self.samplers.on_every_server(load_into)
        if lora:
            self.model_name = ADAPTER_NAME
        self.log(f"policy version {version} loaded into {len(self.samplers)} sampler server(s) in "
                 f"{time.perf_counter() - t0:.2f} s", "DEBUG")
        self.version = version

    # Sampling ----------------------------------------------------------------------------------------------
    def sampling_at(self, version: int) -> SamplingArgs:
        """The sampling arguments of requests made with policy `version`. Full fine-tuning tags them with a
        `cache_salt` per version: the sampler's prefix cache may still hold prompt state computed with older
        weights (vLLM keeps it while requests are in flight), and a salted request never reuses another salt's."""
        if self.config.lora.enabled:
            return self.sampling
        salt = policy_cache_salt(self.run.id, version)
        return replace(self.sampling, extra_body={**self.sampling.extra_body, "cache_salt": salt})

    async def sample_group(self, env_name: str, row: dict[str, Any], version: int, server: SamplerServer,
                           replacement: bool = False) -> Group:
        """`rollouts_per_example` rollouts of one example on one sampler server, scored, each rollout and its scoring
        within its environment's time limit (one past it fails, `timed_rollout`; a rollout's slot is free for a new
        group once it is back, while it is scored). With a `[sampling] seed`, each rollout gets its own seed derived
        from it (one seed for all would make every rollout of a group the same)."""
        t0 = time.perf_counter()
        env = self.envs[env_name]
        first = self.rollouts_started
        self.rollouts_started += self.group_size

        sampling = self.sampling_at(version)

        client, model = server.client, self.model_name
        if self.teacher is not None and self.teacher_sampling is not None:  # loss = "sft": the teacher generates
            client, model, sampling = self.teacher.client, self.teacher.model, self.teacher_sampling

        limit = env.time_limit(row, self.timeouts[env_name])  # time_limits[env_name]; an EnvGroup: its member's

        async def one(i: int) -> Rollout:
            args = sampling if sampling.seed is None else \
                replace(sampling, seed=sampling.seed * 1_000_003 + first + i)
            freed = False

            def free() -> None:  # this rollout's slot goes to a new group as soon as a group's worth is free
                nonlocal freed
                if not freed:
                    freed = True
                    self.rollouts_in_flight -= 1
                    server.in_flight -= 1
                    self.top_up()

            try:
                return await timed_rollout(env, client, model, row, args, limit, generated=free)
            finally:
                free()

        rollouts = await asyncio.gather(*(one(i) for i in range(self.group_size)))
        now = time.perf_counter()
        self.check_context(rollouts, sampling.max_tokens)
        return Group(env_name, list(rollouts), version, now - t0, now, server, replacement)

    def may_start_group(self) -> bool:
        """Whether a group started now, with the loaded policy, will be used (`BatchSchedule.may_start_group`)."""
        return self.schedule.may_start_group(
            version=self.version, filling=self.filling,
            groups_held=len(self.kept) + len(self.tasks) + len(self.ready) + len(self.deferred),
            rollouts_in_flight=self.rollouts_in_flight, stopping=self.closing or self.stop.set, loading=self.loading)

    def pending_at(self, version: int) -> int:
        """Groups of `version` in flight or finished and not yet looked at."""
        return sum(v == version for v in self.tasks.values()) + sum(g.version == version for g in self.ready)

    def top_up(self) -> None:
        """Start groups while `may_start_group`: an environment owed a group first (`MixSampler`)."""
        while self.may_start_group():
            env_name, row, replacement = self.sampler.draw()
            self.rollouts_in_flight += self.group_size
            server = self.samplers.pick(self.group_size)
            task = asyncio.create_task(self.sample_group(env_name, row, self.version, server, replacement))
            self.tasks[task] = self.version

    async def next_group(self) -> Group:
        if self.ready:
            return self.ready.pop(0)
        await self.refresh_policy()
        self.top_up()
        done, _ = await asyncio.wait(self.tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            self.tasks.pop(task, None)
            self.ready.append(task.result())
        return self.ready.pop(0)

    async def fill_batch(self, step: int) -> tuple[list[Group], dict[str, float]]:
        need_groups = self.schedule.groups_per_batch
        oldest_ok = self.schedule.oldest_version(step)
        kept: list[Group] = []
        self.kept = kept
        self.ready, self.deferred = self.deferred + self.ready, []
        counts = {"easy": 0, "hard": 0, "filtered": 0, "failed": 0, "stale": 0}
        tallies = {name: EnvTally() for name in self.names}
        seen = 0
        last_reason = ""
        while len(kept) < need_groups:
            if self.stop.set:
                raise asyncio.CancelledError
            if self.deferred and not self.schedule.oldest_can_fill(len(kept), self.pending_at(oldest_ok)):
                self.ready[:0], self.deferred = self.deferred, []  # the oldest ones were dropped: take them now
            group = await self.next_group()
            seen += 1
            placement = self.schedule.place(group.version, step, kept=len(kept),
                                            pending_oldest=self.pending_at(oldest_ok))
            if placement == "deferred":
                # the oldest groups still coming can fill this batch and no later one could take them: this one
                # waits for the next batch
                seen -= 1
                self.deferred.append(group)
                continue
            tallies.setdefault(group.env, EnvTally()).add(group)
            errors = [r.error for r in group.rollouts if r.error]
            if errors:
                self.last_errors[group.env] = errors[0].splitlines()[0][:300]
            if placement == "stale":
                counts["stale"] += 1
                continue
            if errors:
                counts["failed"] += 1
                tallies[group.env].failed_groups += 1
                if not group.replacement:  # its environment's next group comes from it again
                    self.sampler.owe(group.env)
                last_reason = f"a rollout failed: {errors[0].splitlines()[0]}"
                told = last_reason in self.reported  # the whole error (a dead server's log) once, then its line
                self.reported.add(last_reason)
                self.log(f"dropped a group of {group.env}: {last_reason if told else 'a rollout failed: ' + errors[0]}",
                         "WARNING", step)
                await self.check_sampler(errors[0], group.server or self.samplers.servers[0])
            else:
                verdict = self.filter.judge([r.reward for r in group.rollouts])
                if verdict.difficulty in ("easy", "hard"):
                    counts[verdict.difficulty] += 1
                if verdict.keep:
                    kept.append(group)
                    continue
                counts["filtered"] += 1
                last_reason = verdict.reason
            if seen - len(kept) >= MAX_FILTERED_BATCHES * need_groups:
                dropped = seen - len(kept)
                failing = max(tallies, key=lambda name: tallies[name].failed_groups)
                if 2 * counts["failed"] >= dropped:  # mostly failures: the environment is the problem
                    raise OrchestratorError(
                        f"step {step}: {dropped} groups in a row were dropped and only {len(kept)} of {need_groups} "
                        f"kept; {counts['failed']} failed, {tallies[failing].failed_groups} of them of environment "
                        f"{failing} (last error: {self.last_errors.get(failing, '?')}). Look at its server's log "
                        "and the orchestrator's warnings; rollouts that time out need a longer [[env]] timeout")
                raise OrchestratorError(
                    f"step {step}: {dropped} groups in a row were dropped and only {len(kept)} of "
                    f"{need_groups} kept (last: {last_reason}). If every group is filtered, loosen [buffer] / "
                    "[difficulty_filter] or pick a task whose rewards vary within a group")
        total = max(1, seen)
        self.tallies = tallies
        return kept, {"buffer/easy": counts["easy"] / total, "buffer/hard": counts["hard"] / total,
                      "buffer/filtered": counts["filtered"] / total, "buffer/stale": counts["stale"] / total,
                      "rollout/failed_groups": float(counts["failed"]), **self.env_metrics(tallies)}

    async def check_sampler(self, error: str, server: SamplerServer) -> None:
        """A failed request: if the server it went to no longer answers /health within the grace period, give up."""
        deadline = time.monotonic() + HEALTH_GRACE_S
        while not await asyncio.to_thread(answers_health, server.root_url, 5.0):
            if time.monotonic() > deadline:
                raise OrchestratorError(f"the sampler at {server.base_url} stopped answering (no /health for "
                                        f"{HEALTH_GRACE_S:g} s); last request error: {error.splitlines()[0]}")
            await asyncio.sleep(1.0)

    # Steps -------------------------------------------------------------------------------------------------
    def to_samples(self, groups: list[Group]) -> list[Sample]:
        rewards = [r.reward for g in groups for r in g.rollouts]
        advantages = group_advantages(rewards, self.group_size, self.config.trainer.std_normalize_advantages)
        samples: list[Sample] = []
        i = 0
        for g in groups:
            for r in g.rollouts:
                if self.config.loss == "sft":  # the teacher's text, in the student's tokens
                    samples += retokenized_samples(r, self.tokenizer, env=g.env, policy_version=g.version)
                else:
                    samples += rollout_samples(r, advantages[i], self.config.trajectory_strategy,
                                               policy_version=g.version, env=g.env)
                i += 1
        return samples

    def emit_samples(self, step: int, samples: list[Sample]) -> None:
        picked = samples[:: max(1, len(samples) // SAMPLE_EVENTS_PER_STEP)][:SAMPLE_EVENTS_PER_STEP]
        for s in picked:
            self.events.emit("sample", {"env": s.env, "example_id": s.example_id, "prompt": s.prompt,
                                        "completion": s.completion, "answer": s.answer, "reward": s.reward,
                                        "advantage": s.advantage, "metrics": s.metrics}, step=step)

    # Validation and evaluation ---------------------------------------------------------------------------------
    def eval_sets(self) -> list[tuple[str, Environment, int, int]]:
        """(metric name, environment, examples, rollouts per example) for each `[eval]` environment."""
        ev = self.config.eval
        if ev is None:
            return []
        if not ev.env:
            return [(name, env, ev.num_examples, ev.rollouts_per_example) for name, env in self.envs.items()]
        # an [[eval.env]] is evaluated as it is (a run's own environments, above, with their system prompts)
        out = []
        for e in ev.env:
            env = load_environment(e.id, **e.args)
            out.append((e.name or e.id.rsplit("/", 1)[-1], env,
                        e.num_examples if e.num_examples is not None else ev.num_examples,
                        e.rollouts_per_example or ev.rollouts_per_example))
        return out

    async def mean_reward(self, env: Environment, rows: list[dict[str, Any]], rollouts_per_example: int
                          ) -> tuple[float, Failures]:
        """The mean reward of the current policy on `rows`, the rows dealt out over the sampler servers, each rollout
        within the environment's time limit (a run's environment: its [[env]] timeout); and how many of its
        rollouts failed or timed out, each counted as 0 (`eval_outcome`)."""
        sampling = replace(self.sampling_at(self.version), rl_fields=False)
        timeout = next((self.timeouts[name] for name, e in self.envs.items() if e is env), DEFAULT_ROLLOUT_TIMEOUT_S)
        n = len(self.samplers)
        parts = await asyncio.gather(*(
            env.run_rollouts(server.client, self.model_name, rows[i::n], sampling,
                             rollouts_per_example=rollouts_per_example, max_concurrent=32, timeout=timeout)
            for i, server in enumerate(self.samplers.servers) if rows[i::n]))
        done = [r for part in parts for r in part]
        self.check_context(done, sampling.max_tokens)
        return eval_outcome(done)

    async def validate(self, step: int) -> None:
        val = self.config.val
        if val is None or not val.interval or step % val.interval:
            return
        per_env = val.num_examples if val.num_examples == -1 else max(1, val.num_examples // len(self.envs))
        rewards = [(await self.mean_reward(env, self.rows(name, env.get_eval_dataset(per_env, seed=0)),
                                           val.rollouts_per_example))[0] for name, env in self.envs.items()]
        self.events.metrics({"val_reward/mean": sum(rewards) / len(rewards)}, step)

    async def evaluate(self, step: int, sets: list[tuple[str, Environment, int, int]]) -> None:
        """An `eval` event: per environment `eval/<env>/reward` and its failed and timed-out rollouts (`Failures`,
        runs/evaluations.py), and their totals over the environments."""
        metrics: dict[str, float] = {}
        examples: dict[str, int] = {}
        rollouts: dict[str, int] = {}
        total, shown = Failures(0), []
        for name, env, n, r in sets:
            rows = env.get_eval_dataset(n, seed=0)
            examples[name], rollouts[name] = len(rows), r  # what each mean is over (runs/evaluations.py reads them)
            reward, failures = await self.mean_reward(
                env, self.rows(name, rows) if self.envs.get(name) is env else self.tools.rows(name, env, rows), r)
            metrics[f"eval/{name}/reward"] = reward
            metrics.update(failures.metrics(name))
            total += failures
            shown.append(f"{name} {with_failures(f'{reward:.3f}', failures)}")
        metrics.update(total.metrics())
        self.events.emit("eval", {"metrics": metrics, "policy_version": self.version, "examples": examples,
                                  "rollouts_per_example": rollouts}, step=step)
        self.events.metrics(metrics, step)
        self.log(f"eval at step {step}: " + ", ".join(shown), step=step)

    def eval_due(self, step: int) -> bool:
        ev = self.config.eval
        if ev is None:
            return False
        return step == self.config.max_steps or bool(ev.interval and step % ev.interval == 0)

    async def loop(self) -> int:
        cfg = self.config
        eval_sets = self.eval_sets()
        self.log(f"sampling from {self.samplers.describe()} ({self.base_model}); environments: "
                 f"{', '.join(self.names)}; {self.schedule.rollout_target} rollouts in flight "
                 f"(groups of {self.group_size}); max_async_level {cfg.max_async_level}")
        try:
            if eval_sets and cfg.eval is not None and cfg.eval.eval_base_model and self.start_step == 0:
                await self.wait_for_version(0)
                await self.evaluate(0, eval_sets)
            for step in range(self.start_step + 1, cfg.max_steps + 1):
                if eval_sets and self.eval_due(step - 1) and step > 1:
                    # evaluate the policy after step - 1 with its own weights (on-policy, not the async one)
                    await self.wait_for_version(step - 1)
                    await self.evaluate(step - 1, eval_sets)
                if step > 1:
                    await self.validate(step - 1)
                self.filling, self.kept = step, []
                waited = await self.wait_for_version(self.schedule.oldest_version(step))
                t0 = time.perf_counter()
                groups, buffer_metrics = await self.fill_batch(step)
                fill = time.perf_counter() - t0
                samples = self.to_samples(groups)
                if self.config.loss == "opd" and self.teacher is not None:
                    t_score = time.perf_counter()
                    await self.teacher.score(samples)
                    scoring = time.perf_counter() - t_score
                write_batch(self.run.rollouts_dir, step, samples)
                metrics = batch_metrics(groups, step, fill)
                metrics.update(buffer_metrics)
                metrics["time/wait_for_weights"] = waited
                metrics["policy/version"] = float(self.version)
                if self.config.loss == "opd":
                    metrics["time/teacher_scoring"] = scoring
                if len(self.samplers) > 1:  # the largest share of the step's rollouts one server got
                    counts = self.samplers.take_counts()
                    metrics["sampler/max_share"] = max(counts) / max(1, sum(counts))
                metrics.update(self.sandbox_stats.take())
                if self.judge_meter is not None:  # a scrape of the judge's /metrics, off the event loop
                    metrics.update(await asyncio.to_thread(self.judge_meter.step))
                self.events.metrics(metrics, step)
                self.run.update_status(reward=metrics["reward/mean"])  # the runs list's REWARD column
                self.emit_samples(step, samples)
                self.check_env_errors(step, self.tallies)
                print(f"[orchestrator] step {step}: reward {metrics['reward/mean']:.3f} "
                      f"(policy version {self.version}, {fill:.1f}s)", flush=True)
            self.closing = True
            await self.validate(cfg.max_steps)
            if eval_sets and self.eval_due(cfg.max_steps):
                await self.wait_for_version(cfg.max_steps)
                await self.evaluate(cfg.max_steps, eval_sets)
        except EnvironmentDown as exc:  # its server died more often than it may be restarted: its message, no trace
            raise OrchestratorError(str(exc)) from exc
        except asyncio.CancelledError:
            self.log("stopping: the run was asked to stop")
        finally:
            self.closing = True
            for task in self.tasks:
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
            await self.samplers.close()
            if self.teacher is not None:
                await self.teacher.close()
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prime_lab.trainer.orchestrator")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--base-url", required=True, action="append", help="a sampler's URL (repeat for several)")
    parser.add_argument("--model", required=True)
    parser.add_argument("--api-key-var", default=None)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--model-path", type=Path, default=None, help="the model's folder (its tokenizer)")
    parser.add_argument("--teacher-url", default=None, help="the local teacher sampler's URL")
    parser.add_argument("--teacher-model", default=None, help="the name the local teacher serves")
    args = parser.parse_args(argv)
    run = Run(args.run_dir)

    def body() -> int:
        import os

        from prime_lab.sandbox.config import apply as apply_sandbox

        api_key = os.environ.get(args.api_key_var, "prime-lab") if args.api_key_var else "prime-lab"
        config = load_config(run)
        apply_sandbox(config.sandbox, run.dir)  # [sandbox] for the environments loaded here and their servers
        teacher = endpoint_of(config, args.teacher_url, args.teacher_model) if config.teacher is not None else None
        orchestrator = Orchestrator(run, config, args.base_url, args.model, resume=args.resume,
                                    api_key=api_key, teacher=teacher, model_path=args.model_path)
        return asyncio.run(orchestrator.loop())

    return guarded_main(run, "orchestrator", body)


if __name__ == "__main__":
    sys.exit(main())
