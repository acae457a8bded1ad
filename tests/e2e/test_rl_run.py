"""`prime rl run` end to end: a real sampler, orchestrator and trainer as processes, on a tiny model that can learn.

The task (tests/fixtures/envs/tiny_chars.py, `target = "letters"`): reward = share of the reply's characters that
are letters. The model (`learnable_model_dir`) is a random-init tiny Qwen3 whose embeddings cluster tokens by
character class, as a pretrained model's do, so LoRA finds "more letters" within a few steps.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from prime_lab.runs.events import Event
from prime_lab.runs.registry import RunRegistry
from prime_lab.runs.system_metrics import INTERVAL_VARIABLE, SYSTEM
from tests.support.rl_runs import (
    fixture_envs,
    logs,
    metrics,
    prime,
    rewards,
    start,
    wait_final,
    wait_step,
    write_config,
)

__all__ = ["fixture_envs"]  # autouse: the run's processes find the tiny-chars environment

pytestmark = pytest.mark.slow

DESIGN_METRICS = ["reward/mean", "reward/std", "reward/tiny-chars", "policy/entropy", "policy/kl", "loss", "optim/lr",
                  "optim/grad_norm", "rollout/mean_length", "rollout/truncated", "rollout/generation_time",
                  "perf/tokens_per_s", "time/step", "time/wait_for_batch", "time/wait_for_weights",
                  "batch/async_level", "buffer/easy", "buffer/hard", "buffer/filtered"]


@pytest.mark.parametrize("seed", [0, 1])
def test_reward_rises_over_20_steps(seed: int, learnable_model_dir: Path, tmp_path: Path) -> None:
    run = start(write_config(tmp_path / "rl.toml", learnable_model_dir, seed=seed))
    status = wait_final(run)
    assert status["state"] == "completed", status.get("reason", "") + logs(run)
    curve = rewards(run)
    assert len(curve) == 20
    first, last = sum(curve[:5]) / 5, sum(curve[-5:]) / 5
    assert last > first + 0.2, f"seed {seed}: reward did not rise: {[round(r, 3) for r in curve]}"

    # tokens/s is over a real interval (the batch's generation span): steady from step to step. Over the wait for
    # the batch's last groups it read 40k-2.9M on steps whose groups were sampled ahead, ~1,000 on the others.
    rates = sorted(m["perf/tokens_per_s"] for m in metrics(run, "orchestrator").values())
    assert rates[0] > 0 and rates[-1] < 10 * rates[len(rates) // 2], rates

    # every metric DESIGN.md names, from the process that owns it
    merged: dict[str, float] = {}
    for source in ("orchestrator", "trainer"):
        for values in metrics(run, source).values():
            merged.update(values)
    assert not [m for m in DESIGN_METRICS if m not in merged]
    events = run.event_log().events()
    samples = [e for e in events if e.kind == "sample"]
    assert samples and {"prompt", "completion", "reward", "advantage"} <= set(samples[0].data)
    assert {e.data["state"] for e in events if e.kind == "status"} >= {"starting", "running", "completed"}
    # each process wrote its own log; the trainer's adapter and checkpoint are real peft folders
    assert {p.stem for p in run.logs_dir.glob("*.log")} >= {"launcher", "inference", "orchestrator", "trainer"}
    assert (run.adapters_dir / "step_20" / "adapter_config.json").is_file()
    assert (run.checkpoints_dir / "step_20" / "trainer_state.pt").is_file()
    batch = [json.loads(line) for line in (run.rollouts_dir / "step_20.jsonl").read_text().splitlines()]
    assert len(batch) == 16 and all(sum(s["loss_mask"]) > 0 for s in batch)
    # the sampler really served the adapter: the on-policy part of the mismatch KL stays small
    assert metrics(run, "orchestrator")[20]["policy/version"] >= 18
    # no sampling wasted: groups start only while a batch they may go into still needs them
    assert [step for step, m in metrics(run, "orchestrator").items() if m["buffer/stale"] > 0] == []
    # `prime rl logs` shows the run's events
    proc = prime("rl", "logs", run.id, "-c", "trainer", "-n", "3")
    assert proc.returncode == 0 and "loss" in proc.stdout
    # `prime rl list` shows the latest reward
    listed = json.loads(prime("rl", "list", "-o", "json").stdout)
    assert [r["reward"] for r in listed if r["id"] == run.id] == [pytest.approx(curve[-1])]


def test_vllm_backend_takes_the_trainers_adapters(learnable_model_dir: Path, tmp_path: Path) -> None:
    """Shorter, on the real vLLM CPU build: each step samples with the adapter of the step before
    (max_async_level 0), so a sampler that ignored the adapter would show as a large mismatch KL."""
    config = write_config(tmp_path / "rl.toml", learnable_model_dir, steps=6, backend="vllm", async_level=0)
    run = start(config)
    status = wait_final(run, timeout=540)
    assert status["state"] == "completed", status.get("reason", "") + logs(run)
    orch, train = metrics(run, "orchestrator"), metrics(run, "trainer")
    assert [orch[k]["policy/version"] for k in sorted(orch)] == [0, 1, 2, 3, 4, 5]
    # on-policy every step: vLLM sampled with exactly the weights the trainer had (float32 on both sides)
    assert max(train[k]["policy/kl"] for k in train) < 0.05, {k: train[k]["policy/kl"] for k in train}
    # and the policy did move between steps (so a sampler stuck on the base model would have shown)
    assert rewards(run)[-1] != rewards(run)[0]


def test_two_local_samplers_share_the_run(learnable_model_dir: Path, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """`[inference] num_servers = 2`: the launcher starts two built-in servers, the orchestrator spreads the groups
    over both and loads each new adapter into both (each step samples with the adapter of the step before). The
    supervisor's system samples carry each process of the run."""
    monkeypatch.setenv(INTERVAL_VARIABLE, "0.5")  # a short run still gets samples (default: every 5 s)
    config = write_config(tmp_path / "rl.toml", learnable_model_dir, steps=3, async_level=0)
    config.write_text(config.read_text().replace("[inference]\n", "[inference]\nnum_servers = 2\n"))
    run = start(config)
    status = wait_final(run)
    assert status["state"] == "completed", status.get("reason", "") + logs(run)
    assert {"inference", "inference-2"} <= set(status["processes"])
    for role in ("inference", "inference-2"):  # each server's own log: it loaded the adapters of steps 1 and 2
        loaded = re.findall(r"loaded LoRA adapter 'policy' from \S+/step_(\d+)", run.log_path(role).read_text())
        assert loaded == ["1", "2"], logs(run)
    orch = metrics(run, "orchestrator")
    assert [orch[k]["policy/version"] for k in sorted(orch)] == [0, 1, 2]
    assert all(m["sampler/max_share"] <= 0.75 and m["rollout/failed_groups"] == 0 for m in orch.values()), orch
    # system metrics: every process of the run in the supervisor's samples, with its registered pid
    samples = [e for e in run.event_log().events() if e.kind == SYSTEM]
    assert samples and all(e.source == "launcher" and e.step is None for e in samples)
    seen = {(p["role"], p.get("rank"), p["pid"]) for e in samples for p in e.data["processes"]}
    pids = {role: info["pid"] for role, info in status["processes"].items()}
    for role, rank, registered in (("supervisor", None, "launcher"), ("trainer", 0, "trainer"),
                                   ("orchestrator", None, "orchestrator"), ("sampler", 0, "inference"),
                                   ("sampler", 1, "inference-2")):
        assert (role, rank, pids[registered]) in seen, (role, sorted(seen))
    busy = max(p["cpu_percent"] for e in samples for p in e.data["processes"] if p["role"] == "trainer")
    assert busy > 10, busy
    assert all(p["rss_bytes"] > 0 for e in samples for p in e.data["processes"]), samples
    table = prime("rl", "metrics", run.id, "--system").stdout  # the run has ended: its samples stay
    assert {"supervisor", "trainer.0", "orchestrator", "sampler.0", "sampler.1"} <= {
        line.split()[0] for line in table.splitlines() if line.strip()}, table


def test_external_samplers_listed_in_base_urls(learnable_model_dir: Path, tmp_path: Path) -> None:
    """`[inference] base_urls`: the run samples from servers it did not start (backend auto takes the URLs), each
    checked before the orchestrator starts, and loads each adapter into every one."""
    from prime_lab.inference.builtin.launcher import start_builtin_server
    from prime_lab.inference.builtin.server import BuiltinServerSettings

    settings = BuiltinServerSettings(model=learnable_model_dir, served_model_name=str(learnable_model_dir))
    servers = [start_builtin_server(settings, log_path=tmp_path / f"external-{i}.log") for i in range(2)]
    try:
        config = write_config(tmp_path / "rl.toml", learnable_model_dir, steps=2, async_level=0)
        urls = ", ".join(f'"{s.base_url}"' for s in servers)
        config.write_text(config.read_text().replace('backend = "builtin"', f"base_urls = [{urls}]"))
        status = wait_final(start(config))
        assert status["state"] == "completed", status.get("reason")
        for server in servers:
            assert "adapters/step_1 in" in server.log_path.read_text()
        down = config.read_text().replace(servers[1].base_url, "http://127.0.0.1:9/v1")
        config.write_text(down)
        status = wait_final(start(config))
        assert status["state"] == "failed" and "http://127.0.0.1:9/v1 does not answer" in status["reason"]
    finally:
        for server in servers:
            server.stop()


def test_stop_checkpoints_and_restart_resumes(learnable_model_dir: Path, tmp_path: Path) -> None:
    run = start(write_config(tmp_path / "rl.toml", learnable_model_dir, steps=12, checkpoint_interval=2))
    wait_step(run, 3)
    proc = prime("rl", "stop", run.id, "--grace", "120")
    assert proc.returncode == 0, proc.stderr
    status = wait_final(run)
    assert status["state"] == "stopped"
    stopped_at = int(status["step"])
    checkpoints = sorted(int(p.name.split("_")[1]) for p in run.checkpoints_dir.glob("step_*"))
    assert checkpoints and checkpoints[-1] == stopped_at  # the trainer checkpointed its last step on SIGTERM
    assert not run.live_processes()

    proc = prime("rl", "restart", run.id, "--foreground")
    assert proc.returncode == 0, proc.stderr + logs(run)
    progress = [line.split()[1] for line in proc.stderr.splitlines() if line.startswith("step ")]
    assert progress[0] == f"{stopped_at + 1}/12", proc.stderr  # the new attempt's steps, not a replay of the old
    status = run.status()
    assert status["state"] == "completed" and status["step"] == 12
    trainer_steps = [e.step for e in run.event_log().events() if e.kind == "metrics" and e.source == "trainer"]
    assert trainer_steps == list(range(1, 13))  # nothing trained twice, nothing skipped


def test_a_dead_trainer_fails_the_run_within_seconds(learnable_model_dir: Path, tmp_path: Path) -> None:
    run = start(write_config(tmp_path / "rl.toml", learnable_model_dir, steps=200))
    wait_step(run, 1)
    os.kill(run.read_status()["processes"]["trainer"]["pid"], signal.SIGKILL)
    t0 = time.monotonic()
    status = wait_final(run, timeout=60)
    assert time.monotonic() - t0 < 45  # detected within seconds; the rest is stopping the others (a loaded CI is slow)
    assert status["state"] == "failed"
    assert "trainer" in status["reason"] and "-9" in status["reason"]
    assert not run.live_processes()  # the sampler and the orchestrator were stopped too


def test_a_sampler_that_stops_answering_fails_the_run(learnable_model_dir: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRIME_LAB_SAMPLER_UNHEALTHY_S", "3")
    run = start(write_config(tmp_path / "rl.toml", learnable_model_dir, steps=200))
    wait_step(run, 1)
    server = run.read_status()["processes"]["inference"]["pid"]
    os.kill(server, signal.SIGSTOP)
    try:
        status = wait_final(run, timeout=90)
    finally:
        try:
            os.kill(server, signal.SIGCONT)
        except ProcessLookupError:
            pass
    assert status["state"] == "failed"
    assert "stopped answering" in status["reason"]


def test_every_group_filtered_fails_with_the_reason(learnable_model_dir: Path, tmp_path: Path) -> None:
    extra = "\n[difficulty_filter]\nenabled = true\nmin_reward_variance = 5.0\n"
    run = start(write_config(tmp_path / "rl.toml", learnable_model_dir, steps=5, extra=extra))
    status = wait_final(run, timeout=120)
    assert status["state"] == "failed"
    assert "min_reward_variance" in status["reason"] and "groups in a row were dropped" in status["reason"]
    errors = [e for e in run.event_log().events() if e.kind == "log" and e.data.get("level") == "ERROR"]
    assert any("orchestrator" == e.source for e in errors)


def test_bad_configs_and_models_fail_before_a_run_exists(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('model = "tiny-qwen3"\nmax_steps = 0\nbatch_size = 10\nrollouts_per_example = 4\n'
                   '[sampling]\nmax_tokens = 8\n[[env]]\nid = "reverse-text"\n')
    proc = prime("rl", "run", f"@{bad}")
    assert proc.returncode == 1
    assert f"{bad}:2: max_steps" in proc.stderr and f"{bad}:3: batch_size" in proc.stderr
    missing = tmp_path / "missing.toml"
    missing.write_text(bad.read_text().replace("max_steps = 0", "max_steps = 2").replace("10", "8")
                       .replace('"tiny-qwen3"', '"no-such/model-xyz"'))
    proc = prime("rl", "run", f"@{missing}")
    assert proc.returncode == 1 and "no-such/model-xyz" in proc.stderr
    assert RunRegistry().runs() == []


def test_the_workbench_launch_path_starts_an_rl_run(learnable_model_dir: Path, tmp_path: Path) -> None:
    from prime_lab.workbench.launch import config_argv, launch, wait_for_run

    config = write_config(tmp_path / "rl.toml", learnable_model_dir, steps=3)
    launched = launch(config_argv("rl", config))
    run = wait_for_run(launched, RunRegistry())
    assert wait_final(run)["state"] == "completed"
    assert [e.step for e in run.event_log().events() if isinstance(e, Event) and e.kind == "metrics"
            and e.source == "trainer"] == [1, 2, 3]


def test_eval_and_val_during_training(learnable_model_dir: Path, tmp_path: Path) -> None:
    extra = """
[eval]
interval = 2
num_examples = 4
eval_base_model = true

[[eval.env]]
id = "tiny-chars"
name = "digits"
args = { target = "digits" }

[val]
num_examples = 4
interval = 2
"""
    run = start(write_config(tmp_path / "rl.toml", learnable_model_dir, steps=4, extra=extra))
    status = wait_final(run)
    assert status["state"] == "completed", status.get("reason", "") + logs(run)
    evals = {e.step: e.data["metrics"] for e in run.event_log().events() if e.kind == "eval"}
    assert sorted(evals) == [0, 2, 4]  # the base model, every 2 steps, and the end
    assert all(0.0 <= m["eval/digits/reward"] <= 1.0 for m in evals.values())
    val = {k: v["val_reward/mean"] for k, v in metrics(run, "orchestrator").items() if "val_reward/mean" in v}
    assert sorted(val) == [2, 4]
