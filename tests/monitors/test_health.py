"""monitors/health.py: a run's health line from its metrics, each item warning exactly while its alert's episode
goes on, with what usually helps; textual-free."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from prime_lab.monitors.health import OK, WARN, Health, HealthTracker, health_of
from prime_lab.runs.events import Event


def tracker(steps: list[tuple[dict[str, Any], dict[str, Any]]]) -> HealthTracker:
    """A run whose orchestrator and trainer log these metrics, step by step."""
    health = HealthTracker()
    for step, (orchestrator, trainer) in enumerate(steps, start=1):
        health.observe_metrics(orchestrator, step)
        health.observe_metrics(trainer, step)
    return health


def orchestrator(errored: float = 0.0, wait: float = 0.1, generation: float = 2.0, **more: float) -> dict[str, Any]:
    return {"reward/mean": 0.4, "env/tools/errored": errored, "env/tools/timed_out": 0.0,
            "time/wait_for_weights": wait, "rollout/generation_time": generation, **more}


def trainer(wait: float = 0.1, kl: float = 0.002, grad: float = 0.5, step: float = 2.0) -> dict[str, Any]:
    return {"loss": 0.05, "policy/kl": kl, "optim/grad_norm": grad, "time/wait_for_batch": wait, "time/step": step}


def items(health: Health) -> dict[str, tuple[str, str]]:
    return {item.name: (item.level, item.text) for item in health.items}


def test_a_healthy_run_reads_ok_on_every_item() -> None:
    health = tracker([(orchestrator(), trainer())] * 12).health()
    assert health.level == OK and health.step == 12
    assert health.text == ("ok · balanced (wait_for_batch 0.1 s vs policy 0.1 s) · errored/empty 0% · mismatch KL "
                           "flat · grad norm steady")
    assert health.short() == "ok" and health.warnings == []


def test_no_metrics_no_items() -> None:
    health = HealthTracker().health()
    assert health.items == () and health.text == "" and health.short() == "-"
    # SFT logs a grad norm and nothing else the line reads
    assert items(health_of([Event(1, 0.0, "trainer", "metrics", 1, {"loss/mean": 1.0, "optim/grad_norm": 0.4})])) == {
        "grad_norm": (OK, "grad norm steady")}


def test_errored_rollouts_warn_once_above_five_percent_for_three_steps() -> None:
    steps = [(orchestrator(), trainer())] * 5
    two = tracker(steps + [(orchestrator(errored=0.12), trainer())] * 2).health()
    assert items(two)["rollouts"] == (OK, "errored/empty 12%")  # 2 steps: not sustained yet
    three = tracker(steps + [(orchestrator(errored=0.12), trainer())] * 3).health()
    assert items(three)["rollouts"] == (WARN, "errored/empty 12% (tools, 3 steps above 5%)")
    assert three.level == WARN and three.text.startswith("warn · ")
    assert three.short() == "warn: errored/empty 12% (tools)"
    assert "logs/env-<name>.log" in three.warnings[0].hint and "[[env]] timeout" in three.warnings[0].hint


def test_empty_rollouts_count_with_the_errored_ones() -> None:
    quiet = [({"env/tools/errored": 0.0, "env/tools/empty": 0.0}, {})] * 2
    health = tracker(quiet + [({"env/tools/errored": 0.02, "env/tools/empty": 0.06}, {})] * 3).health()
    assert items(health)["rollouts"] == (WARN, "errored/empty 8% (tools, 3 steps above 5%)")
    alone = tracker(quiet + [({"env/tools/errored": 0.02, "env/tools/empty": 0.0}, {})] * 3).health()
    assert items(alone)["rollouts"] == (OK, "errored/empty 2%")


def test_the_worst_environment_is_named() -> None:
    health = tracker([({"env/a/errored": 0.0, "env/b/errored": 0.02}, {})] * 3).health()
    assert items(health)["rollouts"] == (OK, "errored/empty 2% (b)")


def test_who_waits_on_whom() -> None:
    trainer_bound = tracker([(orchestrator(wait=3.2, generation=1.0), trainer(wait=0.1))] * 4).health()
    assert items(trainer_bound)["bound"] == (OK, "trainer-bound (wait_for_batch 0.1 s vs policy 3.2 s)")
    orchestrator_bound = tracker([(orchestrator(wait=0.1), trainer(wait=5.0, step=1.0))] * 4).health()
    assert items(orchestrator_bound)["bound"] == (OK, "orchestrator-bound (wait_for_batch 5 s vs policy 0.1 s)")
    # sustained (10 steps above half of its step): a warning naming what to change
    lasting = tracker([(orchestrator(wait=0.1), trainer(wait=5.0, step=1.0))] * 10).health()
    assert items(lasting)["bound"][0] == WARN and lasting.short() == "warn: orchestrator-bound"
    assert "num_servers" in lasting.warnings[0].hint


def test_the_mismatch_kl_trend() -> None:
    rising = [(orchestrator(), trainer(kl=0.002 * 1.2 ** i)) for i in range(15)]
    health = tracker(rising).health()
    level, text = items(health)["mismatch_kl"]
    assert level == WARN and text.startswith("mismatch KL rising (") and "max_async_level" in health.warnings[0].hint
    just_starting = tracker([(orchestrator(), trainer(kl=0.002))] * 5 + [(orchestrator(), trainer(kl=0.01))] * 5)
    assert items(just_starting.health())["mismatch_kl"] == (OK, "mismatch KL rising (0.002 -> 0.01)")
    falling = tracker([(orchestrator(), trainer(kl=0.01))] * 5 + [(orchestrator(), trainer(kl=0.002))] * 5)
    assert items(falling.health())["mismatch_kl"] == (OK, "mismatch KL falling (0.01 -> 0.002)")
    few = tracker([(orchestrator(), trainer(kl=0.0021))] * 2)
    assert items(few.health())["mismatch_kl"] == (OK, "mismatch KL 0.0021")
    exploding = tracker([(orchestrator(), trainer(kl=0.002))] * 5 + [(orchestrator(), trainer(kl=2.0))])
    assert items(exploding.health())["mismatch_kl"] == (WARN, "mismatch KL exploding (2)")


def test_grad_norm_spikes() -> None:
    quiet = [(orchestrator(), trainer())] * 8
    one = tracker(quiet + [(orchestrator(), trainer(grad=5.0))] + quiet[:2]).health()
    assert items(one)["grad_norm"] == (OK, "grad norm 1 spike in 20 steps (up to 10x median)")
    three = tracker(quiet + [(orchestrator(), trainer(grad=5.0)), (orchestrator(), trainer()),
                             (orchestrator(), trainer(grad=8.0)), (orchestrator(), trainer(grad=6.0))]).health()
    assert items(three)["grad_norm"] == (WARN, "grad norm 3 spikes in 20 steps (up to 16x median)")
    assert "max_grad_norm" in three.warnings[0].hint
    long_after = tracker(quiet + [(orchestrator(), trainer(grad=5.0))] + quiet * 3).health()
    assert items(long_after)["grad_norm"] == (OK, "grad norm steady")  # out of the window


def test_it_folds_raw_log_objects_and_events_alike() -> None:
    raw = [{"seq": i, "kind": "metrics", "step": i, "data": orchestrator(errored=0.2)} for i in range(1, 4)]
    raw += [{"seq": 9, "kind": "log", "data": {"message": "x"}}, {"kind": "metrics", "data": "not a dict"}, "junk"]
    events = [Event(seq=i, time=0.0, source="orchestrator", kind="metrics", step=i, data=orchestrator(errored=0.2))
              for i in range(1, 4)]
    assert health_of(raw) == health_of(events)
    assert health_of(raw).short() == "warn: errored/empty 20% (tools)"


def test_health_imports_no_textual() -> None:
    check = "import sys, prime_lab.monitors.health\nprint(sorted(m for m in ('textual', 'torch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stderr
