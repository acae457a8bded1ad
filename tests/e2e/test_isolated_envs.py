"""Every environment at the verifiers release it was written for, several releases in one run.

`prime env install` gives each fixture its release's own virtual environment, created here with pip from the package
registry (once per test session, or reused from `$PRIME_LAB_VERIFIERS_HOME`):
- vf-fruit-task declares verifiers==0.1.12 (string `task` rows, which later releases refuse) -> 0.1.12;
- vf-guess-game (a StatefulToolEnv game) declares verifiers>=0.1.8 and imports a module only 0.1.9/0.1.10 have ->
  0.1.10, whose own environment server runs it; installed with `--verifiers 0.1.9.post3` it runs on our driver;
- vf-step-down imports by a computed name a helper only 0.1.9 has -> 0.1.10 fails to import it, 0.1.9.post3 is used;
- vf-legacy-sort needs 0.3.x, the release beside prime-lab: it runs in this interpreter, as before.
Evaluations, RL runs (one mixing 0.1.12 with 0.3.1) and GEPA runs then drive them over one protocol.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from prime_lab.runs.registry import pid_alive
from tests.envs.scripted import scripted_endpoint
from tests.envs.verifiers_standins import VF_ENVS, completion, guessing_model
from tests.gepa.reflection_standin import write_gepa_config
from tests.support import cli
from tests.support.rl_runs import logs, metrics, start, wait_final, wait_step, write_envs_config

pytestmark = pytest.mark.slow
prime = partial(cli.prime, timeout=900)
BESIDE = VF_ENVS / "vf_legacy_sort"  # needs verifiers 0.3.x, the release beside prime-lab: on the path, in-process
Install = tuple[str, tuple[str, ...]]  # a fixture folder, extra arguments of `prime env install`
# registry name -> the installs it holds, in chains: each chain's one after another, the chains side by side (0.1.12,
# 0.1.10 and 0.1.9.post3 each created by the first install of its chain)
INSTALLS: dict[str, list[list[Install]]] = {
    "releases": [[("vf_fruit_task", ())], [("vf_guess_game", ()), ("vf_step_down", ())]],
    "driver": [[("vf_guess_game", ("--verifiers", "0.1.9.post3"))]],
}


@pytest.fixture(scope="session")
def installed(releases_home: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Each registry's installs, done once with `prime env install`: its registry file and what install printed.
    The chains run at once, as two users' commands may: one release's environment is created, installed into and
    taken back from by one at a time (its lock), the registry file written under its own."""
    homes = {name: tmp_path_factory.mktemp(f"home-{name}") for name in INSTALLS}

    def chain(name: str, installs: list[Install]) -> dict[str, Any]:
        env = {**os.environ, "PRIME_LAB_HOME": str(homes[name]), "PRIME_LAB_VERIFIERS_HOME": str(releases_home)}
        return {folder: prime("env", "install", str(VF_ENVS / folder), *extra, env=env) for folder, extra in installs}

    with ThreadPoolExecutor(max_workers=sum(len(chains) for chains in INSTALLS.values())) as pool:
        started = [(name, pool.submit(chain, name, installs)) for name, chains in INSTALLS.items()
                   for installs in chains]
        done = [(name, future.result()) for name, future in started]
    out: dict[str, Any] = {name: {"registry": home / "environments" / "isolated.json", "printed": {}}
                           for name, home in homes.items()}
    for name, printed in done:
        for proc in printed.values():
            assert proc.returncode == 0, proc.stderr[-3000:]
        out[name]["printed"].update(printed)
    return out


def use(installed: dict[str, Any], name: str, lab_home: Path, releases_home: Path,
        monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """This test's PRIME_LAB_HOME gets registry `name`; the beside environment goes on the path."""
    target = lab_home / "environments" / "isolated.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(installed[name]["registry"], target)
    monkeypatch.setenv("PRIME_LAB_VERIFIERS_HOME", str(releases_home))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(BESIDE), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    records: dict[str, Any] = json.loads(target.read_text())["environments"]
    return records


@pytest.fixture
def releases(installed: dict[str, Any], lab_home: Path, releases_home: Path,
             monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    return use(installed, "releases", lab_home, releases_home, monkeypatch)


@pytest.fixture
def guess_endpoint() -> Iterator[Any]:
    with scripted_endpoint([]) as endpoint:
        endpoint.next_reply = lambda request: completion(request, guessing_model(request))
        yield endpoint


def eval_rows(cwd: Path) -> list[dict[str, Any]]:
    [results] = list((cwd / "outputs" / "evals").rglob("results.jsonl"))
    return [json.loads(line) for line in results.read_text().splitlines()]


# Installing ----------------------------------------------------------------------------------------------------

def test_install_picks_each_environments_release(installed: dict[str, Any], releases: dict[str, Any]) -> None:
    printed = installed["releases"]["printed"]
    assert {name: r["release"] for name, r in releases.items()} == {
        "vf-fruit-task": "0.1.12", "vf-guess-game": "0.1.10", "vf-step-down": "0.1.9.post3"}
    # declared: the pin
    assert "verifiers 0.1.12: the newest release that satisfies verifiers==0.1.12" in printed["vf_fruit_task"].stderr
    # declared too loosely, narrowed by what it imports (read from each release's wheel)
    guess = printed["vf_guess_game"].stderr
    assert "ruled out by what it imports: verifiers 0.3.1, 0.3.0, 0.2.1, 0.2.0, 0.1.14, 0.1.12, 0.1.11" in guess
    assert "no module verifiers.utils.token_utils (imported at vf_guess_game.py:" in guess
    # what only importing shows: 0.1.10 tried, then one release down
    step = printed["vf_step_down"].stderr
    assert "verifiers 0.1.10 cannot import vf_step_down: ModuleNotFoundError: No module named " \
           "'verifiers.utils.rlm_data_serialization_utils'" in step
    assert "into verifiers 0.1.9.post3's own environment" in step
    # each release's interpreter is its own, shared by the environments that need it
    assert len({r["python"] for r in releases.values()}) == 3
    # each release's environment was created without compiling every module to bytecode: what an environment
    # imports is compiled as it is imported (verifiers), what none imports never is (sympy, which math-verify brings)
    for python in {r["python"] for r in releases.values()}:
        [site] = Path(python).parents[1].glob("lib/python*/site-packages")
        assert any((site / "verifiers").rglob("*.pyc")) and not any((site / "sympy").rglob("*.pyc")), site
    assert installed["driver"]["printed"]["vf_guess_game"].stdout.split() == ["vf-guess-game", "vf_guess_game"]

    listed = {e["id"]: e for e in json.loads(prime("env", "list", "-o", "json").stdout)}
    for name, record in releases.items():
        assert listed[name]["source"] == "isolated" and listed[name]["verifiers"] == record["release"]
        assert listed[name]["interpreter"] == record["python"] and Path(record["python"]).is_file()
    table = prime("env", "list", "--plain").stdout  # tab-separated, each field whole
    fruit = next(line.split("\t") for line in table.splitlines() if line.startswith("vf-fruit-task"))
    assert fruit[2:4] == ["classic", f"verifiers 0.1.12 (own: {Path(releases['vf-fruit-task']['python']).parents[1]})"]


def test_install_failure_names_the_releases_tried(releases: dict[str, Any], tmp_path: Path) -> None:
    proc = prime("env", "install", str(VF_ENVS / "vf_step_down"), "--verifiers", "0.1.10")
    assert proc.returncode != 0
    assert "vf-step-down cannot import under any release it was tried with: 0.1.10: ModuleNotFoundError: No module " \
           "named 'verifiers.utils.rlm_data_serialization_utils' at vf_step_down.py:" in proc.stderr
    assert "Traceback" not in proc.stderr
    # a declaration no release it accepts satisfies, by what the package imports
    package = tmp_path / "narrow"
    shutil.copytree(VF_ENVS / "vf_guess_game", package)
    pyproject = package / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace("verifiers>=0.1.8", "verifiers>=0.1.11,<0.1.13"))
    proc = prime("env", "install", str(package))
    assert proc.returncode != 0
    assert "declares verifiers<0.1.13,>=0.1.11, but every release it accepts lacks something it imports: 0.1.12, " \
           "0.1.11: no module verifiers.utils.token_utils" in proc.stderr
    assert "--verifiers VERSION" in proc.stderr


# Evaluating ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("env_id,reward_funcs", [("vf-fruit-task", {"valid_move", "move_similarity"}),
                                                  ("vf-legacy-sort", {"similarity_reward", "exact_reward"})],
                         ids=["0.1.12-own", "0.3.1-beside"])
def test_eval_single_turn(env_id: str, reward_funcs: set[str], releases: dict[str, Any], builtin_server: Any,
                          tmp_path: Path) -> None:
    proc = prime("eval", "run", env_id, "-b", builtin_server.base_url, "-m", builtin_server.model_name,
                 "-n", "3", "-r", "2", "-t", "8", "-S", '{"seed": 3}', cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = eval_rows(tmp_path)
    assert len(rows) == 6 and [r["error"] for r in rows] == [None] * 6, rows[0]["error"]
    assert rows[0]["prompt"][0]["role"] == "system"  # its system prompt, from its own release's formatting
    assert reward_funcs <= set(rows[0]["metrics"])  # its rubric ran there
    assert sum(r["reward"] for r in rows) > 0
    assert all(r["token_usage"]["completion_tokens"] > 0 for r in rows)


def test_secrets_reach_the_environments_interpreter(releases: dict[str, Any], builtin_server: Any,
                                                    tmp_path: Path) -> None:
    """An environment's own secret reaches its interpreter (where it loads and where its rollouts run)."""
    args = ["eval", "run", "vf-fruit-task", "-b", builtin_server.base_url, "-m", builtin_server.model_name, "-n", "2",
            "-r", "1", "-t", "4", "-a", '{"key_var": "FRUIT_KEY"}',
            "-S", '{"min_tokens": 1}']  # the tiny model's answer is never empty (verifiers 0.1.12 errs on an empty one)
    missing = prime(*args, cwd=tmp_path)
    assert missing.returncode != 0 and "FRUIT_KEY is not set" in missing.stderr
    assert "environment 'vf-fruit-task' (isolated, verifiers 0.1.12" in missing.stderr
    assert prime("env", "secret", "create", "vf-fruit-task", "-n", "FRUIT_KEY", "-v", "s3cret-value").returncode == 0
    proc = prime(*args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = eval_rows(tmp_path)
    assert [r["info"]["key_length"] for r in rows] == [len("s3cret-value")] * 2 and rows[0]["error"] is None
    assert "s3cret-value" not in "".join(p.read_text() for p in (tmp_path / "outputs").rglob("*.json*"))


@pytest.mark.parametrize("registry,release", [("releases", "0.1.10"), ("driver", "0.1.9.post3")],
                         ids=["own-server", "our-driver"])
def test_eval_tool_game(registry: str, release: str, installed: dict[str, Any], lab_home: Path,
                        releases_home: Path, monkeypatch: pytest.MonkeyPatch, guess_endpoint: Any,
                        tmp_path: Path) -> None:
    """A StatefulToolEnv game written for 0.1.9/0.1.10: tools sent natively, calls run, the hidden number kept in
    its state, through verifiers 0.1.10's own server and through our driver on 0.1.9.post3."""
    records = use(installed, registry, lab_home, releases_home, monkeypatch)
    assert records["vf-guess-game"]["release"] == release
    proc = prime("eval", "run", "vf-guess-game", "-b", guess_endpoint.base_url, "-m", "guesser", "-n", "3", "-r", "2",
                 cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = eval_rows(tmp_path)
    assert [r["error"] for r in rows] == [None] * 6
    for row in rows:
        roles = [m["role"] for m in row["completion"]]
        assert roles[:2] == ["assistant", "tool"] and roles.count("tool") >= 2, roles
        assert row["reward"] == pytest.approx(1.5) and row["metrics"]["solved_reward"] == 1.0
    [log] = list((lab_home / "runs").glob("eval-*/logs/env-vf-guess-game.log"))  # with the evaluation's run
    assert f"verifiers {release}" in log.read_text()


# Training ------------------------------------------------------------------------------------------------------

def test_rl_run_mixing_releases(releases: dict[str, Any], learnable_model_dir: Path, tmp_path: Path) -> None:
    """One run: vf-fruit-task on verifiers 0.1.12 in its own interpreter, vf-legacy-sort on 0.3.1 beside us. Its
    environment server is killed (-9) after the first step: restarted, counted, and the run completes."""
    envs = ["vf-fruit-task", "vf-legacy-sort"]
    run = start(write_envs_config(tmp_path / "rl.toml", learnable_model_dir, dict.fromkeys(envs, {}), steps=5))
    wait_step(run, 1, timeout=300)
    killed = run.status()["processes"]["env-vf-fruit-task"]["pid"]
    os.kill(killed, signal.SIGKILL)
    status = wait_final(run, timeout=600)
    assert status["state"] == "completed", status.get("reason", "") + logs(run)
    restarts = [e.data for e in run.event_log().events() if e.kind == "alert" and e.data.get("name") == "env_restart"]
    assert len(restarts) == 1 and "vf-fruit-task" in restarts[0]["message"], restarts
    assert max(m.get("env/vf-fruit-task/restarts", 0.0) for m in metrics(run, "orchestrator").values()) == 1.0
    samples = [json.loads(line) for step in range(1, 6)
               for line in (run.rollouts_dir / f"step_{step}.jsonl").read_text().splitlines()]
    assert {s["env"] for s in samples} == set(envs)
    for sample in samples:  # the sampler's token ids and logprobs reached the trainer, from both interpreters
        assert len(sample["input_ids"]) == len(sample["loss_mask"]) == len(sample["sampler_logprobs"])
        assert [lp for lp, m in zip(sample["sampler_logprobs"], sample["loss_mask"], strict=True) if m]
    by_step = metrics(run, "orchestrator")
    assert {f"reward/{e}" for e in envs} <= {k for m in by_step.values() for k in m}
    for env in envs:
        assert any(s["reward"] > 0 for s in samples if s["env"] == env), env
    trained = metrics(run, "trainer")
    assert len(trained) == 5 and all(m["optim/grad_norm"] > 0 for m in trained.values())
    # the environment's server was the run's: registered with its reaper, logged with it, ended with it (the
    # restarted one under the same role)
    server = (status.get("processes") or {}).get("env-vf-fruit-task")
    assert server is not None and server["pid"] != killed and not pid_alive(server["pid"], server.get("start_time"))
    assert "verifiers 0.1.12" in (run.dir / "logs" / "env-vf-fruit-task.log").read_text()


def test_rl_run_tool_game(releases: dict[str, Any], learnable_model_dir: Path, tmp_path: Path) -> None:
    run = start(write_envs_config(tmp_path / "rl.toml", learnable_model_dir, {"vf-guess-game": {}}, steps=2))
    status = wait_final(run, timeout=600)
    assert status["state"] == "completed", status.get("reason", "") + logs(run)
    samples = [json.loads(line) for step in (1, 2)
               for line in (run.rollouts_dir / f"step_{step}.jsonl").read_text().splitlines()]
    assert samples and all(s["env"] == "vf-guess-game" and sum(s["loss_mask"]) > 0 for s in samples)
    assert len(metrics(run, "trainer")) == 2


def test_server_dies_with_its_run(releases: dict[str, Any], learnable_model_dir: Path, tmp_path: Path) -> None:
    """kill -9 of the run's process group: the reaper ends the environment's server (its own group) too."""
    run = start(write_envs_config(tmp_path / "rl.toml", learnable_model_dir, {"vf-fruit-task": {}}, steps=50))
    deadline = time.monotonic() + 300
    while (run.read_status().get("processes") or {}).get("env-vf-fruit-task") is None:
        assert time.monotonic() < deadline and run.status().get("state") not in ("failed", "completed"), logs(run)
        time.sleep(0.2)
    server = run.read_status()["processes"]["env-vf-fruit-task"]
    assert pid_alive(server["pid"], server.get("start_time"))
    os.killpg(run.read_status()["pgid"], signal.SIGKILL)
    deadline = time.monotonic() + 20
    while pid_alive(server["pid"], server.get("start_time")) or run.status().get("state") != "failed":
        assert time.monotonic() < deadline, f"server {server['pid']} alive after the run was killed"
        time.sleep(0.1)


def test_dead_server_is_restarted(releases: dict[str, Any], builtin_server: Any,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A server killed with -9 is started again at the next group, which it serves; one that dies past the bound
    fails the environment (EnvironmentDown), naming it and quoting its log."""
    from openai import AsyncOpenAI

    from prime_lab.envs import SamplingArgs, isolated, load_environment
    from prime_lab.envs.env_server import EnvironmentDown
    from prime_lab.envs.isolated import IsolatedEnvironment, stop_servers

    monkeypatch.setattr(isolated, "MAX_RESTARTS", 1)
    monkeypatch.setattr(isolated, "RESTART_BACKOFF_S", (0.1,))
    env = load_environment("vf-fruit-task")
    assert isinstance(env, IsolatedEnvironment) and env.release == "0.1.12"
    rows = env.get_eval_dataset(1)

    async def group() -> Any:
        client = AsyncOpenAI(base_url=builtin_server.base_url, api_key="x")
        return await env.run_group(client, builtin_server.model_name, rows * 2, SamplingArgs(max_tokens=4, seed=1))

    try:
        first = asyncio.run(group())
        assert [r.error for r in first] == [None, None]
        assert env._server is not None and env._server.pid is not None
        killed = env._server.pid
        os.killpg(killed, signal.SIGKILL)
        second = asyncio.run(group())
        assert [r.error for r in second] == [None, None]
        assert env._server is not None and env._server.pid not in (None, killed)
        os.killpg(env._server.pid, signal.SIGKILL)
        with pytest.raises(EnvironmentDown) as down:
            asyncio.run(group())
    finally:
        stop_servers()
    # a second environment of the same id in this process (other arguments) logs and registers apart
    other = load_environment("vf-fruit-task", seed=1)
    assert isinstance(other, IsolatedEnvironment) and other._server_name().startswith(f"{env._server_name()}-")
    message = str(down.value)
    assert message.startswith("environment 'vf-fruit-task' (verifiers 0.1.12, in its own interpreter) is down: its "
                              "server died 2 times (1 restart tried, the most allowed); the last time its server "
                              "exited (code -9)")
    assert "ZMQEnvServer" in message  # the last lines of its log


# GEPA ----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("env_id,seed_prompt", [("vf-fruit-task", "You are playing Fruit Box"),
                                                ("vf-legacy-sort", None), ("vf-guess-game", None)])
def test_gepa_run(env_id: str, seed_prompt: str | None, releases: dict[str, Any], builtin_server: Any,
                  tmp_path: Path) -> None:
    """GEPA optimizes an isolated environment's system prompt as it does one in this process."""
    proposals = [f"```\nA better prompt, attempt {i}.\n```" for i in range(20)]
    with scripted_endpoint(proposals) as reflection:
        config = write_gepa_config(tmp_path / "gepa.toml", builtin_server, reflection, env_id, max_calls=12,
                                   num_train=4, num_val=2, seed=1)
        proc = prime("gepa", "run", f"@{config}", "-o", str(tmp_path / "run"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "run" / "gepa"
    meta = json.loads((out / "metadata.json").read_text())
    assert 0 < meta["total_metric_calls"] <= 12
    candidates = [json.loads(line) for line in (out / "candidates.jsonl").read_text().splitlines()]
    if seed_prompt is not None:
        assert candidates[0]["texts"]["system_prompt"].startswith(seed_prompt)
    assert (out / "best_prompt.txt").read_text() == candidates[meta["best_idx"]]["texts"]["system_prompt"]
    # an isolated environment's server served the GEPA run: its log is the run's
    assert (tmp_path / "run" / "logs" / f"env-{env_id}.log").is_file() == (env_id != "vf-legacy-sort")
    if reflection.requests:  # the reflection model saw rollouts scored by the environment's own rubric
        assert "Generated Outputs" in reflection.requests[0]["messages"][0]["content"]
