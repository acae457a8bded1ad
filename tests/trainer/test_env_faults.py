"""Environments that fail, in the real orchestrator against the built-in server (the tiny model): a rollout that
hangs is cut at its `[[env]] timeout` and the run goes on; an environment that fails every rollout keeps being drawn
at its weight (each failed group replaced by one of its own) and fails the run, named, after `ENV_ERRORED_STEPS`
steps; an environment whose server is down for good fails the run with its message; a server restart is an alert.

The environments are written here (`fault_env`, a two-turn environment with a fault between the turns) and loaded
by id, as a user's are. No trainer runs: with max_async_level above max_steps, version 0 (the base model) serves
every step.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from prime_lab.envs import isolated
from prime_lab.monitors.alerts import ENV_RESTART
from prime_lab.runs.registry import Run, RunRegistry
from prime_lab.trainer.batch import batch_path
from prime_lab.trainer.buffer import ExampleSampler, MixSampler
from prime_lab.trainer.config import validate_rl_config
from prime_lab.trainer.orchestrator import ENV_ERRORED_STEPS, Orchestrator, OrchestratorError
from prime_lab.trainer.runtime import guarded_main, load_config

FAULT_ENV = '''
"""Two model turns; between them, the fault of every `every`-th rollout: "raise" (the tool crashes), "hang" (it
never returns), "down" (its server is gone for good: the rollout raises EnvironmentDown), "crash" (the environment's
own `rollout` raises before the model is asked); "silent" blanks the model's replies (an empty rollout); "judge": its
reward awaits a judge that never answers."""

import asyncio

from prime_lab.envs import MultiTurnEnv, Rubric
from prime_lab.envs.env_server import EnvironmentDown
from prime_lab.envs.parsers import last_assistant_text


class FaultEnv(MultiTurnEnv):
    def __init__(self, fault, every, **kwargs):
        super().__init__(max_turns=2, **kwargs)
        self.fault, self.every, self.rollouts = fault, every, 0

    async def rollout(self, client, model, row, sampling):
        self.rollouts += 1
        faulty = self.fault != "none" and self.rollouts % self.every == 0
        if faulty and self.fault == "down":
            raise EnvironmentDown("environment 'fault-env' is down: its server died 4 times; its log ends: boom")
        if faulty and self.fault == "crash":
            raise RuntimeError("the simulator crashed")
        result = await super().rollout(client, model, {**row, "info": {**row["info"], "faulty": faulty}}, sampling)
        if faulty and self.fault == "silent":
            for message in result.completion:
                if message["role"] == "assistant":
                    message["content"] = " "
        return result

    async def env_response(self, messages, state):
        if state["info"]["faulty"] and self.fault == "raise":
            raise RuntimeError("the tool crashed")
        if state["info"]["faulty"] and self.fault == "hang":
            await asyncio.sleep(3600)
        return [{"role": "user", "content": "Once more."}], state


def load_environment(fault="none", every=1, num_examples=64):
    rows = [{"question": f"Say something. {i}", "info": {"index": i}} for i in range(num_examples)]

    async def reward(completion, info):  # varies in a group
        if info.get("faulty") and fault == "judge":
            await asyncio.Event().wait()
        return len(last_assistant_text(completion)) % 3 / 2

    return FaultEnv(fault, every, dataset=rows, rubric=Rubric([reward]))
'''

BATCH, GROUP = 8, 2


@pytest.fixture
def fault_env(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    folder = tmp_path_factory.getbasetemp() / "fault-envs"
    folder.mkdir(exist_ok=True)
    (folder / "fault_env.py").write_text(FAULT_ENV)
    monkeypatch.syspath_prepend(str(folder))
    yield


def new_run(envs: str, steps: int) -> Run:
    text = f"""model = "tiny"
max_steps = {steps}
batch_size = {BATCH}
rollouts_per_example = {GROUP}
max_async_level = {steps + 1}

[sampling]
max_tokens = 2
seed = 0

[buffer]
seed = 1
{envs}"""
    result = validate_rl_config(text)
    assert result.ok and result.config is not None, [p.format() for p in result.problems]
    return RunRegistry().create("rl", config_text=text, resolved=result.config.model_dump(mode="json"))


def orchestrator_for(run: Run, server: Any) -> Orchestrator:
    return Orchestrator(run, load_config(run), server.base_url, server.model_name)


def step_metrics(run: Run) -> dict[int, dict[str, Any]]:
    return {e.step: e.data for e in run.event_log().events()
            if e.kind == "metrics" and e.source == "orchestrator" and e.step is not None and "reward/mean" in e.data}


def test_a_rollout_that_hangs_is_cut_at_its_timeout_counted_and_the_run_goes_on(
        fault_env: None, builtin_server: Any) -> None:
    run = new_run("""
[[env]]
id = "fault-env"
name = "good"

[[env]]
id = "fault-env"
name = "slow"
args = { fault = "hang", every = 4 }
timeout = 2
""", steps=3)
    orchestrator = orchestrator_for(run, builtin_server)
    assert orchestrator.time_limits == {"good": 300.0, "slow": 2.0}
    started = time.perf_counter()
    assert asyncio.run(orchestrator.loop()) == 0
    assert time.perf_counter() - started < 20

    metrics = step_metrics(run)
    assert sorted(metrics) == [1, 2, 3] and all(batch_path(run.rollouts_dir, k).exists() for k in (1, 2, 3))
    # each environment's shares in each step that saw its rollouts (a step filled by the other one's groups alone
    # has none of its own)
    assert {key for data in metrics.values() for key in data if key.startswith("env/")} == {
        "env/good/errored", "env/good/timed_out", "env/good/empty", "env/slow/errored", "env/slow/timed_out",
        "env/slow/empty"}  # no server: no restarts
    for data in metrics.values():
        assert all((f"env/{name}/errored" in data) == (f"env/{name}/timed_out" in data) for name in ("good", "slow"))
        assert data.get("env/good/errored", 0.0) == data.get("env/good/timed_out", 0.0) == 0.0
        assert data.get("env/slow/errored") == data.get("env/slow/timed_out")  # every error of slow is a time-out
    assert sum(data.get("env/slow/timed_out", 0.0) for data in metrics.values()) > 0
    warnings = [e.data["message"] for e in run.event_log().events() if e.kind == "log"
                and e.data["level"] == "WARNING"]
    assert warnings and all(w.startswith("dropped a group of slow: a rollout failed: rollout timed out after 2 s")
                            for w in warnings)


def test_a_scorer_that_hangs_is_cut_at_its_timeout_counted_and_the_run_goes_on(
        fault_env: None, builtin_server: Any) -> None:
    """A reward that awaits a judge forever: its rollout fails at the [[env]] timeout (the limit covers scoring),
    counted under env/<name>/timed_out, its group dropped; the run completes. Every other group has a rollout that
    hangs (every 4th, groups of 2), and one step holds at most a batch's worth of groups (4): the step cannot fill
    before the first two hung groups are cut."""
    run = new_run("""
[[env]]
id = "fault-env"
name = "judged"
args = { fault = "judge", every = 4 }
timeout = 2
""", steps=1)
    orchestrator = orchestrator_for(run, builtin_server)

    async def bounded() -> int:  # today's hang fails the test rather than holding it
        return await asyncio.wait_for(orchestrator.loop(), 30)

    started = time.perf_counter()
    assert asyncio.run(bounded()) == 0
    assert time.perf_counter() - started < 20
    [(step, metrics)] = step_metrics(run).items()
    assert step == 1 and batch_path(run.rollouts_dir, 1).exists()
    assert metrics["env/judged/timed_out"] == metrics["env/judged/errored"] > 0
    warnings = [e.data["message"] for e in run.event_log().events() if e.kind == "log"
                and e.data["level"] == "WARNING"]
    assert warnings and all(w.startswith("dropped a group of judged: a rollout failed: rollout timed out after 2 s "
                                         "while its reward functions ran") for w in warnings)
    assert orchestrator.rollouts_in_flight == 0 and not orchestrator.tasks  # every slot given back


def test_a_rollout_that_raises_fails_its_group_which_its_environment_is_owed(
        fault_env: None, builtin_server: Any) -> None:
    """The environment's own `rollout` raises an ordinary exception (every 3rd rollout): a failed rollout, not the
    end of the run; its group is dropped and its environment owed one (the next group comes from it), counted under
    env/<name>/errored, and the run completes with every slot given back."""
    run = new_run("""
[[env]]
id = "fault-env"
name = "crashy"
args = { fault = "crash", every = 3 }
""", steps=2)
    orchestrator = orchestrator_for(run, builtin_server)
    draws: list[bool] = []
    draw = orchestrator.sampler.draw

    def recorded() -> tuple[str, dict[str, Any], bool]:
        name, row, replacement = draw()
        draws.append(replacement)
        return name, row, replacement

    orchestrator.sampler.draw = recorded  # type: ignore[method-assign]
    assert asyncio.run(orchestrator.loop()) == 0
    metrics = step_metrics(run)
    assert sorted(metrics) == [1, 2]
    assert all(data["env/crashy/errored"] > 0 and data["env/crashy/timed_out"] == 0.0 for data in metrics.values())
    assert sum(data["rollout/failed_groups"] for data in metrics.values()) > 0 and any(draws)  # owed, drawn again
    warnings = [e.data["message"] for e in run.event_log().events() if e.kind == "log"
                and e.data["level"] == "WARNING"]
    assert warnings and all(w.startswith("dropped a group of crashy: a rollout failed: RuntimeError: the simulator "
                                         "crashed") for w in warnings)
    assert orchestrator.rollouts_in_flight == 0 and not orchestrator.tasks


def test_empty_rollouts_are_counted_per_environment(fault_env: None, builtin_server: Any) -> None:
    run = new_run("""
[[env]]
id = "fault-env"
name = "talks"
args = { num_examples = 8 }

[[env]]
id = "fault-env"
name = "silent"
args = { fault = "silent", every = 1 }
""", steps=2)
    assert asyncio.run(orchestrator_for(run, builtin_server).loop()) == 0
    metrics = step_metrics(run)
    assert sorted(metrics) == [1, 2]
    assert [data["env/silent/empty"] for data in metrics.values() if "env/silent/empty" in data] != []
    assert all(data.get("env/silent/empty", 1.0) == 1.0 and data.get("env/silent/errored", 0.0) == 0.0
               for data in metrics.values())  # empty, not errored


def test_an_environment_failing_every_rollout_keeps_its_draws_and_fails_the_run_named(
        fault_env: None, builtin_server: Any) -> None:
    run = new_run("""
[[env]]
id = "fault-env"
name = "good"
weight = 2

[[env]]
id = "fault-env"
name = "broken"
args = { fault = "raise" }
weight = 1
""", steps=8)
    orchestrator = orchestrator_for(run, builtin_server)
    draws: list[tuple[str, bool]] = []
    draw = orchestrator.sampler.draw

    def recorded() -> tuple[str, dict[str, Any], bool]:
        name, row, replacement = draw()
        draws.append((name, replacement))
        return name, row, replacement

    orchestrator.sampler.draw = recorded  # type: ignore[method-assign]
    started = time.perf_counter()
    with pytest.raises(OrchestratorError) as failed:
        asyncio.run(orchestrator.loop())
    assert time.perf_counter() - started < 30
    message = str(failed.value)
    assert "last error: RuntimeError: the tool crashed" in message

    # it failed at the hard limit, after the steps the others filled, each step's shares logged (a step whose
    # batch filled before any of its groups came back has none of its rollouts: it neither counts nor breaks)
    metrics = step_metrics(run)
    failing = [step for step, data in metrics.items() if "env/broken/errored" in data]
    assert len(failing) == ENV_ERRORED_STEPS and failing[-1] == max(metrics) < 8
    assert message.startswith("environment broken: its rollouts errored (" + ", ".join(
        f"100% at step {step}" for step in failing) + "; the run stops when 50% or more do for 3 steps in a row)")
    for data in metrics.values():
        assert data["env/good/errored"] == 0.0
        if "env/broken/errored" in data:
            assert data["env/broken/errored"] == 1.0 and data["env/broken/timed_out"] == 0.0
            assert data["rollout/failed_groups"] > 0

    # drawn at its weight: the draws by weight are exactly the weighted sampler's, and each failed group of it was
    # replaced by one of its own (a replacement that fails is not replaced again)
    originals = [name for name, replacement in draws if not replacement]
    replacements = [name for name, replacement in draws if replacement]
    rows = {name: env.get_dataset() for name, env in orchestrator.envs.items()}
    weighted = ExampleSampler(rows, [2.0, 1.0], seed=1)
    assert originals == [weighted.next()[0] for _ in originals]
    assert set(replacements) == {"broken"}
    # (the groups in flight when the run stopped were never looked at, so never owed)
    in_flight = orchestrator.schedule.rollout_target // GROUP
    owed = len(replacements) + len(orchestrator.sampler.owed)
    assert originals.count("broken") - in_flight <= owed <= originals.count("broken")
    assert len(draws) > 3 * ENV_ERRORED_STEPS * BATCH // GROUP // 2
    started_groups = orchestrator.envs["broken"].rollouts // GROUP  # type: ignore[attr-defined]
    assert started_groups / len(draws) > 1 / 3  # never less than its weight's share of what started


def test_the_mix_is_held_when_an_environment_fails_now_and_then() -> None:
    """Over many groups, an environment failing 20% of its groups keeps nearly all of its share of the kept ones
    (all but 0.2² of it); drawn by weight alone it would lose a fifth."""
    rows = {"a": [{"i": i} for i in range(50)], "b": [{"i": i} for i in range(50)]}

    def kept_share(owing: bool) -> float:
        import random

        sampler, luck = MixSampler(rows, [1.0, 1.0], seed=3), random.Random(4)
        kept = {"a": 0, "b": 0}
        for _ in range(20_000):
            name, _, replacement = sampler.draw()
            if name == "b" and luck.random() < 0.2:
                if owing and not replacement:
                    sampler.owe(name)
                continue
            kept[name] += 1
        return kept["b"] / sum(kept.values())

    assert kept_share(owing=False) == pytest.approx(0.8 / 1.8, abs=0.01)  # b's share silently shrinks
    assert kept_share(owing=True) == pytest.approx(0.96 / 1.96, abs=0.01)


def test_an_environment_that_is_down_fails_the_run_with_its_message(fault_env: None, builtin_server: Any) -> None:
    run = new_run("""
[[env]]
id = "fault-env"
name = "gone"
args = { fault = "down", every = 3 }
""", steps=3)

    def body() -> int:
        return asyncio.run(orchestrator_for(run, builtin_server).loop())

    started = time.perf_counter()
    assert guarded_main(run, "orchestrator", body) == 1
    assert time.perf_counter() - started < 20
    errors = [e.data["message"] for e in run.event_log().events() if e.kind == "log" and e.data["level"] == "ERROR"]
    assert errors == ["orchestrator failed: OrchestratorError: environment 'fault-env' is down: its server died 4 "
                      "times; its log ends: boom"]


def test_a_server_restart_is_an_alert_a_warning_and_counted(fault_env: None, builtin_server: Any) -> None:
    from prime_lab.workbench.cli.render import format_event

    run = new_run("""
[[env]]
id = "owner/fault-env"
name = "vf"
""", steps=1)
    orchestrator = orchestrator_for(run, builtin_server)
    assert isolated._context["on_restart"] == orchestrator.env_restarted  # what the supervisor tells
    orchestrator.env_restarted({"env": "owner/fault-env", "restarts": 1, "max_restarts": 3, "exit_code": -9,
                                "reason": "it was killed (signal 9)", "log_tail": "loading\nKilled"})
    assert asyncio.run(orchestrator.loop()) == 0
    events = run.event_log().events()
    [alert] = [e for e in events if e.kind == "alert"]
    assert alert.source == "orchestrator" and alert.data["name"] == ENV_RESTART and alert.data["level"] == "WARNING"
    assert alert.data["message"] == ("environment vf: its server died (it was killed (signal 9)) and was restarted "
                                     "(1 of at most 3); the groups it was serving are retried")
    assert "ALERT" in format_event(alert) and alert.data["message"] in format_event(alert)  # `prime rl logs`
    [warning] = [e.data["message"] for e in events if e.kind == "log" and e.data["level"] == "WARNING"]
    assert warning.startswith(alert.data["message"]) and warning.endswith("its log ends:\nloading\nKilled")
    assert step_metrics(run)[1]["env/vf/restarts"] == 1.0


def test_the_runs_eval_counts_failed_and_timed_out_rollouts_per_environment(
        fault_env: None, builtin_server: Any) -> None:
    """The run's own `[eval]` counts a rollout that failed or timed out as reward 0, and says so: the `eval` event
    carries each environment's counts and their totals, and the orchestrator's log line prints them beside the
    mean, as every reader of the event does (runs/evaluations.py)."""
    from prime_lab.runs.evaluations import Failures, run_evaluations

    run = new_run("""
[[env]]
id = "fault-env"
name = "broken"
args = { fault = "raise", every = 4 }

[[env]]
id = "fault-env"
name = "slow"
args = { fault = "hang", every = 2 }
timeout = 2

[[env]]
id = "fault-env"
name = "good"

[eval]
num_examples = 4
rollouts_per_example = 2
""", steps=1)
    orchestrator = orchestrator_for(run, builtin_server)

    async def base_evaluation() -> None:
        try:
            await orchestrator.evaluate(0, orchestrator.eval_sets())
        finally:
            await orchestrator.samplers.close()

    asyncio.run(base_evaluation())
    events = run.event_log().events()
    [event] = [e for e in events if e.kind == "eval"]
    counts = {key: value for key, value in event.data["metrics"].items() if not key.endswith("/reward")}
    assert counts == {"eval/broken/rollouts": 8, "eval/broken/failed": 2, "eval/broken/timed_out": 0,
                      "eval/slow/rollouts": 8, "eval/slow/failed": 0, "eval/slow/timed_out": 4,
                      "eval/good/rollouts": 8, "eval/good/failed": 0, "eval/good/timed_out": 0,
                      "eval/rollouts": 24, "eval/failed": 2, "eval/timed_out": 4}
    broken, slow, good = run_evaluations(run)
    assert (broken.base_failures, slow.base_failures, good.base_failures) == (
        Failures(8, failed=2), Failures(8, timed_out=4), Failures(8))
    [line] = [e.data["message"] for e in events if e.kind == "log" and "eval at step 0" in e.data["message"]]
    assert line == (f"eval at step 0: broken {broken.base:.3f} (2 of 8 failed, counted 0), "
                    f"slow {slow.base:.3f} (4 of 8 timed out, counted 0), good {good.base:.3f}")


def test_an_eval_mean_counts_every_failed_rollout_as_0() -> None:
    """A rollout whose scorer raised keeps the reward of the functions that ran: the run's eval counts it as 0, as
    its printed line says, and as failed (not timed out)."""
    from prime_lab.envs import Rollout
    from prime_lab.envs.environment import TIMED_OUT
    from prime_lab.runs.evaluations import Failures
    from prime_lab.trainer.orchestrator import eval_outcome

    def rollout(reward: float, error: str | None = None) -> Rollout:
        return Rollout(example_id=0, task="", prompt=[], reward=reward, error=error)

    mean, failures = eval_outcome([rollout(1.0), rollout(0.5), rollout(0.75, "a reward function raised"),
                                   rollout(0.0, f"{TIMED_OUT} 2 s")])
    assert (mean, failures) == (1.5 / 4, Failures(4, failed=1, timed_out=1))
    assert eval_outcome([]) == (0.0, Failures(0))


SANDBOX_ENV = '''
"""Each rollout runs one command in a sandbox of its own, made and deleted around it (as verifiers' SandboxEnv
does), for the run PRIME_LAB_RUN_DIR names (as an environment's processes are told); every `every`-th command runs
past its time limit."""

import os

from prime_lab.envs import MultiTurnEnv, Rubric
from prime_lab.envs.parsers import last_assistant_text
from prime_lab.sandbox import local


class SandboxedEnv(MultiTurnEnv):
    def __init__(self, every, **kwargs):
        super().__init__(max_turns=2, **kwargs)
        self.every, self.commands = every, 0

    async def env_response(self, messages, state):
        self.commands += 1
        slow = self.commands % self.every == 0
        sandbox = local.create(local.SandboxSpec(run_dir=os.environ["PRIME_LAB_RUN_DIR"]))
        try:
            result = await sandbox.aexecute("sleep 5" if slow else "echo ran", timeout=0.5)
        finally:
            sandbox.delete()
        return [{"role": "user", "content": result.stdout or "too slow"}], state


def load_environment(every=4, num_examples=64):
    rows = [{"question": f"Say something. {i}", "info": {}} for i in range(num_examples)]

    async def reward(completion):
        return len(last_assistant_text(completion)) % 3 / 2

    return SandboxedEnv(every, dataset=rows, rubric=Rubric([reward]))
'''


def test_each_step_says_what_the_runs_sandboxes_did(tmp_path_factory: pytest.TempPathFactory, builtin_server: Any,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """sandbox/created, commands, timed_out, oom and command_seconds in the orchestrator's metrics each step: what
    the run's sandboxes appended to its sandbox_stats.jsonl since the step before (sandbox/stats.py)."""
    folder = tmp_path_factory.getbasetemp() / "sandbox-envs"
    folder.mkdir(exist_ok=True)
    (folder / "sandboxed_env.py").write_text(SANDBOX_ENV)
    monkeypatch.syspath_prepend(str(folder))
    run = new_run('[[env]]\nid = "sandboxed-env"\n', steps=2)
    monkeypatch.setenv("PRIME_LAB_RUN_DIR", str(run.dir))
    orchestrator = orchestrator_for(run, builtin_server)
    assert asyncio.run(orchestrator.loop()) == 0
    metrics = step_metrics(run)
    assert sorted(metrics) == [1, 2]
    counts = {key: [metrics[step][key] for step in (1, 2)] for key in (
        "sandbox/created", "sandbox/commands", "sandbox/timed_out", "sandbox/oom", "sandbox/command_seconds")}
    # one command in each sandbox (a command still running when step 1 is written counts in step 2)
    assert sum(counts["sandbox/created"]) == sum(counts["sandbox/commands"]) >= BATCH, counts
    assert counts["sandbox/created"][0] >= BATCH and sum(counts["sandbox/timed_out"]) >= 2, counts
    assert counts["sandbox/oom"] == [0.0, 0.0], counts
    for commands, seconds in zip(counts["sandbox/commands"], counts["sandbox/command_seconds"], strict=True):
        assert 0 < seconds < 5 if commands else seconds == 0.0, counts  # a step without commands: 0s
    lines = (run.dir / "sandbox_stats.jsonl").read_text().splitlines()
    assert sum(counts["sandbox/commands"]) <= sum('"command"' in line for line in lines)  # later ones: no step
