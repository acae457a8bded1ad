"""One GEPA run: load the environment, split its data, search through the engine, stream `gepa.*` events into
the run's event log (and each proposal, its text included, into its log), write the outputs (also when
interrupted), with a test split score seed and best on it, and say plainly when no candidate beat the seed.

An environment with tools on a task model whose chat template drops them is said once, as `prime eval run` and an
RL run say it (envs/tool_prompt.py); `tools_in_system_prompt` among the sampling args (`[sampling]`, `-S`) writes
their schemas after each candidate's system prompt (not part of the text GEPA rewrites) and is never sent.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prime_lab.envs import Environment, SamplingArgs, host_code, isolated, load_environment
from prime_lab.envs.tool_prompt import KEY as TOOLS_KEY
from prime_lab.envs.tool_prompt import ToolPlan, ToolPrompts
from prime_lab.gepa.budget import budget_for, proposals_within
from prime_lab.gepa.config import GepaSearchSection
from prime_lab.gepa.data_split import train_val_test
from prime_lab.gepa.engine import EngineConfig, GepaEngine
from prime_lab.gepa.env_adapter import SYSTEM_PROMPT, Endpoint, EnvironmentAdapter
from prime_lab.gepa.outputs import STATE_FILE, write_outputs
from prime_lab.gepa.state import GepaState
from prime_lab.models.presets import DEFAULT_MODEL
from prime_lab.models.resolve import local_tokenizer
from prime_lab.runs.registry import Run
from prime_lab.sandbox.stats import NoticeFollower

_D = GepaSearchSection()  # the defaults: gepa/config.py's, the TOML form's

OnEvent = Callable[[str, dict[str, Any]], None]
TOOLS_SETTING = "[sampling] tools_in_system_prompt = true (prime gepa run: -S '{\"tools_in_system_prompt\": true}')"


@dataclass
class GepaSettings:
    """Everything that defines a search (saved as the run's resolved config; `--resume` reads it back)."""

    env_id: str
    env_args: dict[str, Any] = field(default_factory=dict)
    model: str = DEFAULT_MODEL
    reflection_model: str | None = None
    num_train: int = _D.num_train
    num_val: int = _D.num_val
    num_test: int = _D.num_test
    max_metric_calls: int = _D.max_calls
    minibatch_size: int = _D.minibatch_size
    perfect_score: float | None = _D.perfect_score
    state_columns: list[str] = field(default_factory=list)
    seed: int = _D.seed
    max_concurrent: int = _D.max_concurrent
    num_parallel_proposals: int = _D.num_parallel_proposals
    use_merge: bool = _D.use_merge
    max_merge_invocations: int = _D.max_merge_invocations
    reflection_max_tokens: int = 1024
    reflection_temperature: float | None = _D.reflection_temperature
    sampling: dict[str, Any] = field(default_factory=dict)

    def metadata_config(self) -> dict[str, Any]:
        """The `config` block of metadata.json."""
        keys = ("env_id", "env_args", "model", "reflection_model", "num_train", "num_val", "max_metric_calls",
                "minibatch_size", "perfect_score", "state_columns", "seed")
        data = {k: getattr(self, k) for k in keys}
        data["reflection_model"] = self.reflection_model or self.model
        return data

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GepaSettings:
        known = set(cls.__dataclass_fields__)
        settings = {k: v for k, v in data.items() if k in known}
        settings.setdefault("num_parallel_proposals", 1)  # runs saved before the setting proposed one at a time
        return cls(**settings)

    @property
    def tools_in_system_prompt(self) -> bool:
        """`tools_in_system_prompt` among the sampling args: ours (envs/tool_prompt.py), never sent."""
        return self.sampling.get(TOOLS_KEY) is True

    def sampling_args(self) -> SamplingArgs:
        return SamplingArgs.from_settings({k: v for k, v in self.sampling.items() if k != TOOLS_KEY})


@dataclass
class GepaOutcome:
    state: GepaState
    metadata: dict[str, Any]
    output_dir: Path
    test: dict[str, float] | None = None
    note: str | None = None  # `no_gain_note`: set when no candidate beat the seed


def run_gepa(settings: GepaSettings, task: Endpoint, reflection: Endpoint, out_dir: Path, *,
             run: Run | None = None, env: Environment | None = None, on_event: OnEvent | None = None,
             max_iterations: int | None = None, announce: Callable[[str], None] | None = None) -> GepaOutcome:
    """Search (or resume the search saved in `out_dir`); on any exception the state and outputs so far are
    written before it propagates. `announce` is told the warnings for the user (tools the task model's chat
    template does not show)."""
    if run is not None:  # an environment at its own verifiers release serves this run: its log goes with the run's
        isolated.serve_for(run)
    env = env or load_environment(settings.env_id, **settings.env_args)
    if env.judge_wiring and announce is not None:  # how it was pointed at the run's judge
        announce(env.judge_wiring)
    train, val, test = train_val_test(env, settings.num_train, settings.num_val, settings.num_test, settings.seed)
    if not train or not val:
        raise ValueError(f"{settings.env_id} gave {len(train)} training and {len(val)} validation rows; "
                         "GEPA needs at least one of each")
    writer = run.writer("gepa") if run is not None else None
    log = open(run.log_path("gepa"), "a") if run is not None else None  # noqa: SIM115 - closed in finally

    def say(message: str, step: int, level: str = "INFO") -> None:
        """A line of the run's log, and the same as a `log` event (what `prime gepa logs` shows)."""
        if log is not None:
            log.write(f"{time.strftime('%H:%M:%S')} {message}\n")
            log.flush()
        if writer is not None:
            writer.log(message, level=level, step=step)

    notices = NoticeFollower(run.dir if run is not None else None)  # what the environment's sandboxes said

    def tell_notices() -> None:
        for message in notices.take():
            tell(message, "WARNING")

    def emit(kind: str, data: dict[str, Any], step: int) -> None:
        tell_notices()
        if writer is not None:
            writer.emit(kind, data, step=step)
        if kind == "gepa.iteration":
            say(iteration_log(data), step)
        if run is not None and kind == "gepa.iteration":
            run.update_status(step=data["iteration"], best_score=data["best_score"],
                              metric_calls=data["metric_calls"])
        if on_event is not None:
            on_event(kind, data)

    def tell(message: str, level: str) -> None:
        say(message, 0, level)
        if announce is not None:
            announce(f"{level}: {message}")

    for line in host_code.warnings_for([settings.env_id]):  # its own code runs what the model writes, on this machine
        tell(line, "WARNING")
    adapter = EnvironmentAdapter(env, task, reflection, sampling=settings.sampling_args(),
                                 max_concurrent=settings.max_concurrent, state_columns=settings.state_columns,
                                 reflection_max_tokens=settings.reflection_max_tokens,
                                 reflection_temperature=settings.reflection_temperature,
                                 tools=tool_plan(settings, env, train, tell))
    config = EngineConfig(max_metric_calls=settings.max_metric_calls, minibatch_size=settings.minibatch_size,
                          perfect_score=settings.perfect_score, seed=settings.seed, use_merge=settings.use_merge,
                          max_merge_invocations=settings.max_merge_invocations,
                          num_parallel_proposals=settings.num_parallel_proposals, max_iterations=max_iterations)
    engine = GepaEngine(adapter, train, val, {SYSTEM_PROMPT: env.system_prompt or ""}, config,
                        state_path=out_dir / STATE_FILE, emit=emit)
    completed = False
    try:
        state = engine.run()
        completed = True
        test_scores = _score_test(adapter, state, test) if test else None
        extra = {"num_test": len(test), "test": test_scores} if test_scores else {}
        metadata = write_outputs(out_dir, state, settings.metadata_config(), completed=True, extra=extra)
        note = no_gain_note(state, num_train=len(train), max_calls=settings.max_metric_calls,
                            minibatch_size=settings.minibatch_size, perfect_score=settings.perfect_score)
        if note is not None:
            say(note, state.iteration, "WARNING")
        return GepaOutcome(state, metadata, out_dir, test_scores, note)
    finally:
        tell_notices()
        if not completed:
            saved = out_dir / STATE_FILE
            if saved.exists():
                write_outputs(out_dir, GepaState.load(saved), settings.metadata_config(), completed=False)
        adapter.close()
        if writer is not None:
            writer.close()
        if log is not None:
            log.close()


def tool_plan(settings: GepaSettings, env: Environment, rows: list[dict[str, Any]],
              say: Callable[[str, str], None]) -> ToolPlan:
    """What the search does about the environment's tools (envs/tool_prompt.py): nothing where it has none or the
    task model's chat template renders them; else said once through `say`, and with `tools_in_system_prompt` their
    schemas go after each candidate's system prompt. The template is read from the model on this machine (the one a
    local run starts; an endpoint's model where it is here too)."""
    return ToolPrompts(settings.model, lambda: local_tokenizer(settings.model),
                       enabled=settings.tools_in_system_prompt, log=say, setting=TOOLS_SETTING).plan(
        settings.env_id, env, rows)


def iteration_log(data: dict[str, Any]) -> str:
    """A `gepa.iteration` event as the run's log shows it: the verdict and minibatch scores on one line, then the
    proposed text (a reflection: the component it rewrote; a merge: every component), indented."""
    parent = data["parent"]
    source = f"#{parent}" if isinstance(parent, int) else " + ".join(f"#{p}" for p in parent)
    scores = ""
    if data.get("parent_scores") and data.get("child_scores"):
        before, after = data["parent_scores"], data["child_scores"]
        scores = f"  minibatch {sum(before) / len(before):.4f} -> {sum(after) / len(after):.4f}"
    child = f" -> #{data['child_idx']}" if data.get("child_idx") is not None else ""
    lines = [f"iteration {data['iteration']} {data['type']} of {source}{child}: "
             f"{data['verdict']}{scores}  calls {data['metric_calls']}  best {data['best_score']:.4f}"]
    texts: dict[str, str] = data.get("texts") or {}
    shown = [data["component"]] if data.get("component") in texts else sorted(texts)
    for component in shown:
        lines.append(f"    {component}:")
        lines.extend(f"    | {line}" for line in texts[component].splitlines() or [""])
    return "\n".join(lines)


def no_gain_note(state: GepaState, *, num_train: int, max_calls: int, minibatch_size: int,
                 perfect_score: float | None = None) -> str | None:
    """None when a candidate beat the seed on the validation set; else one line saying so, with what was tried
    and what to change: a budget that tries more proposals (`budget.budget_for`), unless the seed is already
    perfect."""
    if not state.candidates or state.best_idx != 0:
        return None
    tried, accepted, seed = state.num_proposed, state.num_accepted, state.average(0)
    note = (f"no candidate beat the seed: {tried} proposal{'s' * (tried != 1)}, {accepted} accepted to validation, "
            f"best is the seed ({seed:.4f})")
    if perfect_score is not None and all(s >= perfect_score for s in state.val_scores[0]):
        return f"{note}; it already scores {perfect_score:g} on every validation example"
    nv = state.num_val
    room = proposals_within(max_calls, num_train=num_train, num_val=nv, minibatch_size=minibatch_size)
    target = max(4, 2 * max(tried, room))
    larger = budget_for(target, num_train=num_train, num_val=nv, minibatch_size=minibatch_size)
    flags = f"-n {num_train} -N {nv}" + (f" --minibatch-size {minibatch_size}" if minibatch_size != _D.minibatch_size
                                         else "")
    return (f"{note}; try a larger budget: -B {larger} tries {target} proposals with {flags} "
            f"(-B {max_calls} had room for {room})")


def _score_test(adapter: EnvironmentAdapter, state: GepaState, test: list[dict[str, Any]]) -> dict[str, float]:
    """The seed's and the best candidate's mean score on rows the search never saw (not counted in the budget)."""
    seed = adapter.evaluate(test, state.candidates[0], False).scores
    best_idx = state.best_idx
    best = seed if best_idx == 0 else adapter.evaluate(test, state.candidates[best_idx], False).scores
    return {"seed": sum(seed) / len(seed), "best": sum(best) / len(best)}
