"""`prime rl run @config.toml` and `prime rl restart ID`: start (or resume) a local RL run, detached.

The run's supervisor (`trainer.launcher`) runs in its own session, so closing the terminal does not end the run;
this command prints the run id and how to follow it. `--foreground` stays attached with a live progress line, and
Ctrl-C stops the run (it checkpoints). The run's environments are loaded here first: one that cannot load ends the
command with its error before a run is registered.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext, redirect_stdout
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import typer

from prime_lab.workbench.cli.common import config_path, err, fail
from prime_lab.workbench.cli.env import INSTALL_OPTION
from prime_lab.workbench.cli.render import live_output, print_evaluations

if TYPE_CHECKING:
    from pydantic import BaseModel

    from prime_lab.problems.validation import Validation
    from prime_lab.trainer.config import RLConfig

M = TypeVar("M", bound="BaseModel")

PROGRESS_KEYS = (("reward/mean", "reward"), ("loss", "loss"), ("loss/mean", "loss"), ("val/loss", "val loss"),
                 ("policy/entropy", "entropy"), ("policy/kl", "kl"), ("teacher/kl", "teacher kl"))


WANDB_KEY_HELP = "W&B API key for the run's W&B mirror (else WANDB_API_KEY; none: offline). Never written to disk."
# The options `prime rl run`, `prime sft run` and `restart` share
FOREGROUND_OPTION = typer.Option(False, "--foreground", help="Stay attached with a live progress line.")
YES_OPTION = typer.Option(False, "-y", "--yes", help="Start without asking (runs never ask locally).")
ENV_VAR_OPTION = typer.Option([], "-e", "--env-var", help="KEY=VALUE for the run's processes (repeat).")
ENV_FILE_OPTION = typer.Option([], "--env-file", help=".env file(s) for the run's processes.")
NAME_OPTION = typer.Option(None, "--name", help="A display name for the run.")
WANDB_KEY_OPTION = typer.Option(None, "--wandb-api-key", help=WANDB_KEY_HELP)


def _env_vars(pairs: list[str], files: list[Path], wandb_api_key: str | None = None,
              resolved: dict[str, Any] | None = None) -> dict[str, str]:
    """The environment the run's processes get on top of this one's; it reaches them through the supervisor's
    environment only (nothing of it is written to the run directory). With the `resolved` config of a run that
    runs environments, the stored secrets for them (`prime secret`) too, under everything else: this shell's
    variables, the config's env_file (which the orchestrator reads), --env-file and -e win."""
    from prime_lab.envs import load_env_files

    out: dict[str, str] = {}
    if files:
        try:
            out.update(load_env_files([str(f) for f in files]))
        except (OSError, ValueError) as exc:
            fail(str(exc))
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            fail(f"-e/--env-var takes KEY=VALUE, got {pair!r}")
        out[key] = value
    if wandb_api_key:
        out["WANDB_API_KEY"] = wandb_api_key
    if resolved and resolved.get("env"):
        out = {**_stored_secrets(resolved, set_elsewhere=out), **out}
    return out


def _stored_secrets(resolved: dict[str, Any], set_elsewhere: dict[str, str]) -> dict[str, str]:
    from prime_lab.envs.secrets import MissingKeyError, read_env_files
    from prime_lab.workbench.cli.secret import stored_secrets

    try:  # the config's env_file, relative to this folder as in the orchestrator (which reports a bad one)
        in_env_files = read_env_files(resolved.get("env_file") or [], base=Path.cwd())
    except MissingKeyError:
        in_env_files = {}
    shell = {k for k, v in os.environ.items() if v}
    return stored_secrets([e["id"] for e in resolved["env"]], set_elsewhere={*shell, *in_env_files, *set_elsewhere})


def run(
    config: str = typer.Argument(..., help="The RL config (@file, @ file or a path).", metavar="CONFIG"),
    foreground: bool = FOREGROUND_OPTION,
    yes: bool = YES_OPTION,
    env_var: list[str] = ENV_VAR_OPTION,
    env_file: list[Path] = ENV_FILE_OPTION,
    name: str | None = NAME_OPTION,
    wandb_api_key: str | None = WANDB_KEY_OPTION,
    install: bool = INSTALL_OPTION,
) -> None:
    """Validate a config and start a local RL run: sampler, orchestrator and trainer. Prints the run id."""
    from prime_lab.trainer.config import validate_rl_file
    from prime_lab.workbench.cli.env import install_missing

    path = config_path(config)
    result = validate_rl_file(path)
    if result.ok and result.config is not None and _obtain_models(result.config, distillation=True):
        result = validate_rl_file(path)  # the models are on this machine now: their tokenizers are compared
    cfg = valid_config(result, path, "rl")
    if install:
        install_missing([e.id for e in cfg.env] + [e.id for e in (cfg.eval.env if cfg.eval is not None else [])])
    envs, resolved = [e.name or e.id for e in cfg.env], cfg.model_dump(mode="json")
    extra_env = _env_vars(env_var, env_file, wandb_api_key, resolved)
    check_environments(cfg, extra_env)
    _obtain_models(cfg, distillation=False)
    launch("rl", path, cfg.model, resolved, envs=envs, max_steps=cfg.max_steps, name=name, extra_env=extra_env,
           foreground=foreground)


def check_environments(cfg: RLConfig, extra_env: dict[str, str]) -> None:
    """Load each of the run's environments ([[env]], then [[eval.env]]) once here, with what the run's orchestrator
    will have in its environment (the config's env_file, --env-file, -e, the stored secrets): one that cannot load
    ends this command with its one-line error before the run is registered, not the run a minute later. Nothing
    loaded here reaches the run (an isolated environment is only described by its interpreter, no server starts).
    With a `[judge]` they load wired to it (inference/judge.py `JudgePlan.applied`), as the orchestrator's do."""
    from prime_lab.envs import EnvironmentLoadError, MissingKeyError, load_env_files, load_environment
    from prime_lab.inference.judge import JudgeUnavailable, plan
    from prime_lab.sandbox.config import applied

    entries: list[tuple[str, dict[str, Any]]] = [(e.id, e.args) for e in cfg.env]
    entries += [(e.id, e.args) for e in (cfg.eval.env if cfg.eval is not None else [])]
    loaded: set[str] = set()
    try:
        judge = plan(cfg.judge)
    except JudgeUnavailable as exc:
        fail(str(exc))
    with _process_environment(extra_env), applied(cfg.sandbox), redirect_stdout(sys.stderr), \
            judge.applied() if judge is not None else nullcontext():  # stdout: the run id
        try:
            if cfg.env_file:
                load_env_files(cfg.env_file, base=Path.cwd())
            for env_id, args in entries:
                key = json.dumps([env_id, args], sort_keys=True, default=str)
                if key not in loaded:
                    loaded.add(key)
                    load_environment(env_id, **args)
        except (EnvironmentLoadError, MissingKeyError) as exc:
            fail(str(exc))


@contextmanager
def _process_environment(extra: dict[str, str]) -> Iterator[None]:
    """This process's environment as the run's processes get it (`extra` over it), restored afterwards."""
    saved = dict(os.environ)
    os.environ.update(extra)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _obtain_models(cfg: RLConfig, *, distillation: bool) -> bool:
    """A local `[teacher]` model, and with `distillation` (loss "opd") the run's model too, built or downloaded here
    when they are not on this machine, before a run is registered (workbench/cli/models.py `obtain`, once per
    command; `launch` gets the run's model). With `distillation`, True when one was not here: validate again (the
    tokenizers are compared only once both are on this machine, or for a preset that builds its tokenizer alone)."""
    from prime_lab.models.resolve import local_model_folder
    from prime_lab.workbench.cli.models import obtain, obtain_judge

    if not distillation and cfg.judge is not None:
        obtain_judge(cfg.judge.model_dump(exclude_unset=True))
    teacher = cfg.teacher
    if teacher is None or teacher.client.base_url is not None or (distillation and cfg.loss != "opd"):
        return False
    wanted = [("model", cfg.model), ("[teacher] model", teacher.model)] if distillation else \
        [("[teacher] model", teacher.model)]
    absent = [(field, spec) for field, spec in wanted if local_model_folder(spec) is None]
    for field, spec in absent:
        if distillation:
            err(f"{field} {spec} is not on this machine yet: getting it, to compare the tokenizers before the run "
                "starts")
        obtain(spec, field)
    return bool(absent)


def valid_config(result: Validation[M], path: Path, group: str) -> M:
    """The config of a validation, its notes printed; or every problem printed and exit 1."""
    if not result.ok or result.config is None:
        for problem in result.problems:
            typer.echo(problem.format(), err=True)
        fail(f"Invalid config in {path}: {len(result.errors)} problem(s); fix them (`prime {group} validate "
             f"@{path}`)")
    for note in result.notes:
        err(note.format())
    return result.config


def launch(kind: str, path: Path, model: str, resolved: dict[str, Any], *, envs: list[str], max_steps: int,
           name: str | None, extra_env: dict[str, str], foreground: bool) -> None:
    """Create a run of `kind` (RL or SFT) from the validated config at `path` and start its supervisor."""
    from prime_lab.runs.registry import RunRegistry
    from prime_lab.trainer.launcher import start_supervisor
    from prime_lab.workbench.cli.models import obtain, pinned

    model_path = obtain(model)  # downloaded before the run is registered; `owner/name@branch` pinned to its commit
    if pinned(model, model_path) != model:  # RL's `model = "..."`, SFT's `[model] name = "..."`
        given = resolved.get("model")
        resolved = {**resolved, "model": pinned(model, model_path) if given == model else
                    {**given, "name": pinned(model, model_path)} if isinstance(given, dict) else given}
    run_ = RunRegistry().create(kind, config_text=path.read_text(), resolved=resolved, name=name, model=model,
                                envs=envs, max_steps=max_steps)
    run_.update_status(model_path=str(model_path), config_file=str(path.resolve()))
    start_supervisor(run_, resume=False, env=extra_env)
    _started(run_, foreground)


def restart(
    run_id: str = typer.Argument(..., help="Run id (or a unique prefix)."),
    foreground: bool = FOREGROUND_OPTION,
    env_var: list[str] = ENV_VAR_OPTION,
    env_file: list[Path] = ENV_FILE_OPTION,
    wandb_api_key: str | None = WANDB_KEY_OPTION,
) -> None:
    """Resume a stopped or failed RL or SFT run from its latest checkpoint (the same W&B run, rewound to it)."""
    from prime_lab.runs.registry import RunRegistry
    from prime_lab.trainer.launcher import LaunchFailed
    from prime_lab.trainer.launcher import restart as restart_run

    run_ = RunRegistry().get(run_id)
    try:
        step = restart_run(run_, env=_env_vars(env_var, env_file, wandb_api_key, _resolved(run_)))
    except LaunchFailed as exc:
        fail(str(exc))
    err(f"Resuming {run_.id} from its checkpoint after step {step}.")
    _started(run_, foreground)


def _resolved(run_: Any) -> dict[str, Any]:
    try:
        data = json.loads(run_.resolved_path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _started(run_: Any, foreground: bool) -> None:
    """The supervisor is started and registered: record this command's pid as `cli` (the workbench finds the run
    it started by it), print the run id and either how to follow it or follow it here."""
    run_.register_process("cli", os.getpid())
    run_id = run_.id
    group = run_.read_status().get("kind") or "rl"
    typer.echo(run_id)  # on stdout, for scripts: `id=$(prime rl run @cfg)`
    if not foreground:
        err(f"Started {run_id} in the background.\n  follow: prime {group} logs {run_id} -f\n  watch:  prime lab "
            f"--run {run_id}\n  stop:   prime {group} stop {run_id}")
        return
    err(f"Started {run_id}; following it here (Ctrl-C stops the run, which checkpoints first).")
    code = follow_progress(run_id)
    raise typer.Exit(code)


def follow_progress(run_id: str, poll: float = 0.5) -> int:
    """Print a progress line per step (rewritten in place on a terminal) until the run ends; 0 if it completed."""
    from prime_lab.runs.evaluations import run_evaluations
    from prime_lab.runs.events import Event
    from prime_lab.runs.registry import FINAL_STATES, RunRegistry

    registry = RunRegistry()
    run_ = registry.get(run_id)
    log = run_.event_log()
    offset = 0
    by_step: dict[int, dict[str, Any]] = {}
    tty = live_output()  # rewrite the line in place (not under --plain, nor into a file)
    started = time.monotonic()
    max_steps = int(run_.read_status().get("max_steps") or 0)
    attempt = run_.attempt  # a restart follows its own attempt, not the earlier ones' steps again
    try:
        while True:
            items, offset = log.read(offset)
            for item in items:
                if not isinstance(item, Event) or item.attempt < attempt:
                    continue
                if item.kind == "metrics" and item.step is not None:
                    by_step.setdefault(item.step, {}).update(item.data)
                    if item.source == "trainer":  # the orchestrator's metrics of this step came before
                        _progress(item.step, max_steps, by_step.pop(item.step), time.monotonic() - started, tty)
                elif item.kind == "log" and item.data.get("level") in ("WARNING", "ERROR"):
                    _line(f"{item.source}: {item.data.get('level')}: {item.data.get('message')}", tty)
                elif item.kind == "alert":
                    _line(f"ALERT {item.data.get('name')}: {item.data.get('message')}", tty)
                elif item.kind == "eval" and item.step is not None:
                    _line(_eval_line(item.step, item.data), tty)
            status = run_.status()
            if status.get("state") in FINAL_STATES and not items:
                if tty:
                    sys.stderr.write("\n")
                print_evaluations(run_evaluations(run_), max_steps, stderr=True)
                reason = status.get("reason")
                err(f"{run_id} {status.get('state')}" + (f": {reason}" if reason else ""))
                return 0 if status.get("state") == "completed" else 1
            time.sleep(poll)
    except KeyboardInterrupt:
        if tty:
            sys.stderr.write("\n")
        err(f"Stopping {run_id} (it checkpoints first) ...")
        result = registry.stop(run_id, grace=120.0)
        err(result.message + f"; resume with `prime {run_.read_status().get('kind') or 'rl'} restart {run_id}`")
        return 130


def _progress(step: int, max_steps: int, latest: dict[str, Any], elapsed: float, tty: bool) -> None:
    parts = [f"step {step}/{max_steps}"]
    parts += [f"{label} {latest[key]:.4g}" for key, label in PROGRESS_KEYS if isinstance(latest.get(key), float | int)]
    per_step = elapsed / max(1, step)
    parts.append(f"{per_step:.1f}s/step")
    if max_steps > step:
        parts.append(f"ETA {per_step * (max_steps - step):.0f}s")
    line = "  ".join(parts)
    if tty:
        sys.stderr.write("\r\033[K" + line)
        sys.stderr.flush()
    else:
        err(line)


def _eval_line(step: int, data: dict[str, Any]) -> str:
    """An `[eval]` evaluation as it arrives: each environment's mean reward, of the base model or the policy, with
    the rollouts that failed and counted 0 beside it."""
    from prime_lab.runs.evaluations import eval_rewards, with_failures

    rewards = [f"{env} {with_failures(f'{value:.3f}', failures)}"
               for env, value, failures in eval_rewards(data.get("metrics"))]
    who = "the base model" if step == 0 else f"the policy after step {step}"
    return f"evaluation of {who} (mean reward): " + (", ".join(rewards) or "-")


def _line(text: str, tty: bool) -> None:
    if tty:
        sys.stderr.write("\r\033[K")
    err(text)
