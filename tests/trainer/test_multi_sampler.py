"""The real orchestrator over two real built-in sampler servers (HTTP, the tiny model): every rollout answered, each
server got a share of the requests (its own `/metrics` says how many it answered), and every server had loaded each
new policy version before the orchestrator sent a request with it (each server's log says when it loaded a version;
the orchestrator's event log says when it switched).

No trainer runs: a stand-in publishes policy versions the way the trainer does (a folder `step_k` under the run's
adapters/ or weights/, renamed into place) as soon as the batch of step k is written; with max_async_level = 0 the
orchestrator must load version k - 1 before it fills step k's batch.
"""

from __future__ import annotations

import asyncio
import re
import shutil
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from prime_lab.inference.builtin.launcher import BuiltinServer, start_builtin_server
from prime_lab.inference.builtin.server import BuiltinServerSettings
from prime_lab.runs.atomic import write_folder_atomic
from prime_lab.runs.registry import Run, RunRegistry
from prime_lab.trainer.batch import batch_path, read_batch
from prime_lab.trainer.config import validate_rl_config
from prime_lab.trainer.orchestrator import Orchestrator
from prime_lab.trainer.runtime import load_config
from prime_lab.trainer.versions import versions_dir

FIXTURE_ENVS = Path(__file__).resolve().parents[1] / "fixtures" / "envs"
STEPS, BATCH, GROUP = 4, 8, 2
CONFIG = f"""model = "tiny"
max_steps = {STEPS}
batch_size = {BATCH}
rollouts_per_example = {GROUP}
max_async_level = 0

[sampling]
max_tokens = 6
seed = 3

[[env]]
id = "tiny-chars"

[val]
num_examples = 6
interval = 2

[lora]
enabled = {{lora}}
"""
LOADED = re.compile(r"^(\S+ \S+) INFO \S+: loaded (?:LoRA adapter 'policy'|full weights) from (\S+)", re.M)
REQUESTS = re.compile(r'^prime_lab_requests_total\{route="chat",model="([^"]+)"\} (\d+)$', re.M)


@pytest.fixture
def two_servers(tiny_model_dir: Path, tmp_path: Path) -> Iterator[list[BuiltinServer]]:
    settings = BuiltinServerSettings(model=tiny_model_dir, served_model_name="tiny", max_model_len=512)
    servers: list[BuiltinServer] = []
    try:
        for i in range(2):  # booting side by side, as the launcher starts them
            servers.append(start_builtin_server(settings, log_path=tmp_path / f"server-{i}.log", wait=False))
        for server in servers:
            server.process.wait_ready(timeout=120)
        yield servers
    finally:
        for server in servers:
            server.stop()


def new_run(lora: bool) -> Run:
    text = CONFIG.format(lora=str(lora).lower())
    result = validate_rl_config(text)
    assert result.ok and result.config is not None, [p.format() for p in result.problems]
    return RunRegistry().create("rl", config_text=text, resolved=result.config.model_dump(mode="json"))


def orchestrate(run: Run, servers: list[BuiltinServer], versions: list[Path]) -> None:
    """Run the orchestrator to the end against `servers`; as soon as the batch of step k is written, publish
    `versions[k % len(versions)]` as policy version k (as the trainer would after training step k)."""
    config = load_config(run)
    orchestrator = Orchestrator(run, config, [s.base_url for s in servers], "tiny")
    root = versions_dir(run, config)

    async def trainer_stand_in() -> None:
        for step in range(1, STEPS):
            while not batch_path(run.rollouts_dir, step).exists():
                await asyncio.sleep(0.02)
            with write_folder_atomic(root / f"step_{step}") as tmp:
                shutil.copytree(versions[step % len(versions)], tmp, dirs_exist_ok=True)

    async def both() -> int:
        stand_in = asyncio.create_task(trainer_stand_in())
        try:
            return await orchestrator.loop()
        finally:
            stand_in.cancel()

    assert asyncio.run(both()) == 0


def answered(server: BuiltinServer) -> dict[str, int]:
    """Chat requests the server answered, by model name (its own count)."""
    text = httpx.get(server.root_url + "/metrics", timeout=10).text
    return {model: int(n) for model, n in REQUESTS.findall(text)}


def loads(server: BuiltinServer) -> dict[int, float]:
    """When the server finished loading each policy version (its log's timestamps, local time)."""
    out = {}
    for stamp, path in LOADED.findall(server.log_path.read_text()):
        version = int(Path(path).name.removeprefix("step_"))
        out[version] = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return out


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full-weights"])
def test_orchestrator_spreads_over_two_samplers_and_loads_every_version_into_both(
        lora: bool, two_servers: list[BuiltinServer], tiny_model_dir: Path, tiny_lora_adapters: tuple[Path, Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(FIXTURE_ENVS))
    run = new_run(lora)
    orchestrate(run, two_servers, list(tiny_lora_adapters) if lora else [tiny_model_dir])

    # every rollout answered: full batches, no failed group, each step sampled with the version before it
    events = run.event_log().events()
    metrics = {e.step: e.data for e in events if e.kind == "metrics" and e.source == "orchestrator"
               and "reward/mean" in e.data}
    assert sorted(metrics) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        samples = read_batch(batch_path(run.rollouts_dir, step))
        assert len(samples) == BATCH and {s.policy_version for s in samples} == {step - 1}
        assert metrics[step]["rollout/failed_groups"] == 0
    assert not [e for e in events if e.kind == "log" and e.data["level"] in ("WARNING", "ERROR")]
    assert [e.step for e in events if e.kind == "metrics" and "val_reward/mean" in e.data] == [2, 4]

    # each server answered a share (its own count), of the trained policy too
    counts = [answered(s) for s in two_servers]
    totals = [sum(c.values()) for c in counts]
    assert sum(totals) >= STEPS * BATCH and min(totals) >= sum(totals) / 4, counts
    if lora:
        assert all(c.get("policy", 0) > 0 for c in counts), counts
    assert all(m["sampler/max_share"] <= 0.75 for m in metrics.values()), metrics

    # every server finished loading version k before the orchestrator switched to it (and so before any request
    # of version k went out)
    switched = {int(m.group(1)): e.time for e in events if e.kind == "log" and e.source == "orchestrator"
                and (m := re.match(r"policy version (\d+) loaded into 2 sampler", e.data["message"]))}
    assert sorted(switched) == list(range(1, STEPS))
    for server in two_servers:
        loaded = loads(server)
        assert sorted(loaded) == list(range(1, STEPS)), server.log_path.read_text()[-2000:]
        for version, at in switched.items():
            assert loaded[version] <= at, f"{server.base_url} loaded version {version} after the switch"
