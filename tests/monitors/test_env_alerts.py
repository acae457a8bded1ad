"""The `env_errored` alert: an environment whose rollouts keep failing (`env/<name>/errored` above 5% for 3 steps in
a row), once per episode, each environment on its own, raised from the metrics events the orchestrator writes."""

from __future__ import annotations

from typing import Any

from prime_lab.monitors.alerts import ALERT_NAMES, ENV_ERRORED, AlertMonitor, AlertThresholds
from prime_lab.runs.events import Event


def feed(monitor: AlertMonitor, steps: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    return [(step, alert) for step, metrics in enumerate(steps, start=1)
            for alert in monitor.observe(Event(seq=step, time=0.0, source="orchestrator", kind="metrics", step=step,
                                               data={"reward/mean": 0.4, **metrics}))]


def test_an_environment_failing_above_five_percent_for_three_steps_raises_one_alert_naming_it() -> None:
    shares = [0.0, 0.1, 0.2, 0.08, 0.3, 0.5, 0.06]  # above 5% from step 2: the third such step is 4
    fired = feed(AlertMonitor(), [{"env/tools/errored": x, "env/tools/timed_out": x} for x in shares])
    assert [(step, alert["name"], alert["level"]) for step, alert in fired] == [(4, ENV_ERRORED, "WARNING")]
    message = fired[0][1]["message"]
    assert message.startswith("Environment tools is failing at step 4: 8% of its rollouts errored or came back "
                              "empty (above 5% for 3 steps in a row)")
    assert "server's log" in message and "[[env]] timeout" in message and "env/tools/timed_out" in message


def test_empty_rollouts_add_to_the_errored_share() -> None:
    fired = feed(AlertMonitor(), [{"env/tools/errored": 0.03, "env/tools/empty": 0.04}] * 3)
    assert [(step, alert["name"]) for step, alert in fired] == [(3, ENV_ERRORED)]
    assert "7% of its rollouts errored or came back empty" in fired[0][1]["message"]
    assert "env/tools/empty" in fired[0][1]["message"]
    assert feed(AlertMonitor(), [{"env/tools/errored": 0.03, "env/tools/empty": 0.0}] * 3) == []


def test_a_short_spike_or_a_low_error_rate_raises_nothing() -> None:
    shares = [0.0, 0.5, 0.9, 0.0, 0.04, 0.05, 0.05, 0.05, 0.05, 1.0, 1.0, 0.0, 1.0]
    assert feed(AlertMonitor(), [{"env/tools/errored": x} for x in shares]) == []
    # a step without the environment's rollouts (no metric) neither counts nor breaks its run of steps
    steps: list[dict[str, Any]] = [{"env/tools/errored": 0.2}, {}, {"env/tools/errored": 0.2}, {},
                                   {"env/tools/errored": 0.2}]
    assert [step for step, _ in feed(AlertMonitor(), steps)] == [5]


def test_each_environment_has_its_own_episodes_and_one_rearms_once_it_recovers() -> None:
    steps = [{"env/a/errored": a, "env/b/errored": b, "env/a/timed_out": 1.0}
             for a, b in [(0.1, 0.0), (0.1, 0.2), (0.1, 0.2), (0.1, 0.2), (0.03, 0.2), (0.01, 0.2), (0.1, 0.2),
                          (0.1, 0.0), (0.1, 0.0)]]
    fired = feed(AlertMonitor(), steps)
    # a: fires at step 3, stays quiet above the re-arm level (2%), re-arms at 1% (step 6) and fires again at 9;
    # b fires once at step 4; timed_out alone raises nothing
    assert [(step, alert["message"].split(" is failing")[0]) for step, alert in fired] == [
        (3, "Environment a"), (4, "Environment b"), (9, "Environment a")]


def test_the_thresholds_are_settings_and_training_alerts_are_unchanged() -> None:
    strict = AlertThresholds(env_errored=0.0, env_errored_steps=1)
    assert [step for step, _ in feed(AlertMonitor(strict), [{"env/x/errored": 0.01}])] == [1]
    assert ENV_ERRORED not in ALERT_NAMES  # the training-health signs; this one is the environments'
    # names with slashes of their own, and values that are not numbers
    assert [step for step, _ in feed(AlertMonitor(strict), [{"env/a/b/errored": 0.5, "env/c/errored": "n/a"}])] == [1]
