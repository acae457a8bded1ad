"""verifiers v1 tasksets (verifiers 0.4's API) as a user runs them: installed into verifiers 0.4.0's own environment
(created here with pip from the package registry, with uv and the harness program's wheels, once per session or
reused from `$PRIME_LAB_VERIFIERS_HOME`), then evaluated, optimised with GEPA and trained through envs/driver_v1.py:
the `null` harness on a local subprocess runtime, its program prepared by uv offline (no index but an empty folder).

tests/fixtures/verifiers_envs: v1_reverse (two weighted rewards and a metric), v1_dialogue (an `Env.run()` that sends
two follow-ups: three assistant turns), v1_tools (a task's MCP toolset), v1_container (tasks that ask for a container
image: refused), v1_bash (for the bash harness: its task writes a note into the runtime, its reward reads the answer
the model's commands wrote there), v1_judged (scored by a `vf.Judge` whose config is left at Prime's endpoint).
"""

from __future__ import annotations

import json
import os
import re
import uuid
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from prime_lab.envs import releases
from tests.envs.scripted import scripted_endpoint
from tests.envs.verifiers_standins import VF_ENVS
from tests.support import cli
from tests.support.rl_runs import logs, metrics, start, wait_final, write_envs_config

pytestmark = pytest.mark.slow
prime = partial(cli.prime, timeout=900)
FIXTURES = ("v1_reverse", "v1_dialogue", "v1_tools", "v1_container", "v1_bash", "v1_judged")


@pytest.fixture(scope="session")
def v1_installed(releases_home: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The v1 fixtures installed with `prime env install`, one after the other (the first creates 0.4.0's
    environment): the registry file and what each install printed."""
    home = tmp_path_factory.mktemp("home-v1")
    env = {**os.environ, "PRIME_LAB_HOME": str(home), "PRIME_LAB_VERIFIERS_HOME": str(releases_home)}
    written = tmp_path_factory.mktemp("scaffold")
    made = prime("env", "init", "my-v1", "--v1", "-p", str(written), env=env)  # what a user starts from
    assert made.returncode == 0, made.stderr
    printed = {name: prime("env", "install", str(VF_ENVS / name), env=env) for name in FIXTURES}
    printed["my-v1"] = prime("env", "install", str(written / "my-v1"), env=env)
    for proc in printed.values():
        assert proc.returncode == 0, proc.stderr[-3000:]
    return {"registry": home / "environments" / "isolated.json", "printed": printed}


@pytest.fixture
def v1_envs(v1_installed: dict[str, Any], lab_home: Path, releases_home: Path,
            monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    target = lab_home / "environments" / "isolated.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(v1_installed["registry"].read_bytes())
    monkeypatch.setenv("PRIME_LAB_VERIFIERS_HOME", str(releases_home))
    records: dict[str, Any] = json.loads(target.read_text())["environments"]
    return records


def results(folder: Path) -> list[dict[str, Any]]:
    [found] = list(folder.rglob("results.jsonl"))
    return [json.loads(line) for line in found.read_text().splitlines()]


def test_a_v1_taskset_installs_evaluates_and_runs_gepa(v1_installed: dict[str, Any], v1_envs: dict[str, Any],
                                                      releases_home: Path, builtin_server: Any,
                                                      tmp_path: Path) -> None:
    """Installed at the tested v1 release with its arguments read from its config; `prime env list` says so; an
    evaluation scores as its rubric says (0.7 exact + 0.3 short), with its metric, the system prompt given reaching
    the model, offline; a GEPA run on it completes."""
    printed = v1_installed["printed"]["v1_reverse"].stderr
    assert ("a verifiers v1 taskset (class ReverseTaskset(verifiers.v1.Taskset) at v1_reverse/taskset.py:29): "
            f"verifiers {releases.V1_RELEASE}, the v1 release prime-lab is tested with") in printed, printed
    record = v1_envs["v1-reverse"]
    assert record["release"] == releases.V1_RELEASE and record["module"] == "v1_reverse"
    assert [a[:3] for a in record["args"]] == [["num_tasks", 4, False], ["harness", "null", False]]
    folder = releases_home / releases.V1_RELEASE
    assert (folder / "bin" / "uv").is_file() and any((folder / releases.V1_WHEELS).glob("openai-*.whl"))
    listed = prime("env", "list", "--output", "json")
    assert listed.returncode == 0, listed.stderr
    [row] = [r for r in json.loads(listed.stdout) if r["id"] == "v1-reverse"]
    assert row["verifiers"] == releases.V1_RELEASE

    (tmp_path / "system.txt").write_text("Reply in one word.")
    proc = prime("eval", "run", "v1-reverse", "-b", builtin_server.base_url, "-m", builtin_server.model_name,
                 "-n", "3", "-r", "2", "-t", "8", "-a", '{"num_tasks": 3}', "--system-prompt-file",
                 str(tmp_path / "system.txt"), "-S", '{"min_tokens": 1}', cwd=tmp_path,
                 env={**os.environ, "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9",
                      "NO_PROXY": "127.0.0.1,localhost"})  # nothing leaves this machine
    assert proc.returncode == 0, proc.stderr
    rows = results(tmp_path / "outputs")
    assert len(rows) == 6 and [r["error"] for r in rows] == [None] * 6, rows[0]["error"]
    assert sorted({r["answer"] for r in rows}) == ["elppa", "enots", "revir"]  # num_tasks=3 reached the taskset
    for row in rows:
        reply = row["completion"][-1]["content"]
        assert row["metrics"]["exact"] == float(row["answer"] in reply)
        assert row["metrics"]["short"] == float(len(reply.strip()) <= 24) and row["metrics"]["reply_chars"] > 0
        assert row["reward"] == pytest.approx(0.7 * row["metrics"]["exact"] + 0.3 * row["metrics"]["short"])
        assert row["prompt"][0] == {"role": "system", "content": "Reply in one word."}

    # the package `prime env init NAME --v1` writes installs and evaluates at verifiers 0.4.0
    proc = prime("eval", "run", "my-v1", "-b", builtin_server.base_url, "-m", builtin_server.model_name, "-n", "2",
                 "-r", "1", "-t", "8", "-o", str(tmp_path / "scaffolded"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = results(tmp_path / "scaffolded")
    assert [r["error"] for r in rows] == [None, None] and all("capitalized" in r["metrics"] for r in rows)
    assert rows[0]["prompt"][0]["role"] == "system"  # its system prompt, from the task's data

    gepa = prime("gepa", "run", "v1-reverse", "-b", builtin_server.base_url, "-m", builtin_server.model_name,
                 "-B", "10", "-n", "3", "-N", "3", "-t", "8", "--minibatch-size", "2", "-o", str(tmp_path / "gepa"),
                 cwd=tmp_path)
    assert gepa.returncode == 0, gepa.stderr
    calls = re.search(r"metric calls (\d+)/10", gepa.stdout)  # the budget spent on the taskset's rollouts
    assert calls is not None and 1 <= int(calls.group(1)) <= 10, gepa.stdout
    assert (tmp_path / "gepa" / "gepa" / "best_prompt.txt").is_file()


def test_a_multi_turn_taskset_and_one_with_an_mcp_toolset_evaluate(v1_envs: dict[str, Any], builtin_server: Any,
                                                                   tmp_path: Path) -> None:
    """v1_dialogue: its Env.run() holds one interaction of three turns (the env's two follow-ups as the user's);
    v1_tools: its toolset's MCP server starts per rollout and its tool reaches the model's requests."""
    for folder in ("dialogue", "tools"):
        (tmp_path / folder).mkdir()
    proc = prime("eval", "run", "v1-dialogue", "-b", builtin_server.base_url, "-m", builtin_server.model_name,
                 "-n", "2", "-r", "1", "-t", "8", "-S", '{"min_tokens": 1}', cwd=tmp_path / "dialogue")
    assert proc.returncode == 0, proc.stderr
    for row in results(tmp_path / "dialogue" / "outputs"):
        assert row["error"] is None, row["error"]
        assert [m["role"] for m in row["completion"]] == ["assistant", "user", "assistant", "user", "assistant"]
        assert [m["content"] for m in row["completion"][1::2]] == ["Now name its colour in one word.",
                                                                  "Last one: where does it live? One word."]
        assert row["metrics"]["assistant_turns"] == 3 and row["metrics"]["every_turn"] == 1.0
        assert row["reward"] == pytest.approx(0.8 + 0.2 * row["metrics"]["brief"])
    proc = prime("eval", "run", "v1-tools", "-b", builtin_server.base_url, "-m", builtin_server.model_name,
                 "-n", "1", "-r", "2", "-t", "8", cwd=tmp_path / "tools")
    assert proc.returncode == 0, proc.stderr
    rows = results(tmp_path / "tools" / "outputs")
    assert [r["error"] for r in rows] == [None, None] and [r["metrics"]["tools_listed"] for r in rows] == [1.0, 1.0]


def test_a_v1_taskset_trains_through_the_generate_route(v1_envs: dict[str, Any], tiny_model_dir: Path,
                                                       tmp_path: Path) -> None:
    """3 RL steps on the built-in server over a single-turn and a multi-turn taskset: verifiers' train client
    renders the chat to ids and samples through /inference/v1/generate; the trainer's first step sees the sampler's
    logprobs (mismatch KL < 1e-3), and each reward's score reaches the run's metrics."""
    config = write_envs_config(tmp_path / "rl.toml", tiny_model_dir, {"v1-reverse": {}, "v1-dialogue": {}}, steps=3,
                               batch_size=8)
    run = start(config)
    status = wait_final(run, timeout=600)
    assert status["state"] == "completed", status.get("reason", "") + logs(run)
    trainer, orchestrator = metrics(run, "trainer"), metrics(run, "orchestrator")
    assert trainer[1]["policy/kl"] < 1e-3, trainer[1]
    assert sorted(trainer) == [1, 2, 3]
    assert all("reward/v1-reverse" in step or "reward/v1-dialogue" in step for step in orchestrator.values())
    assert any("reward/v1-dialogue" in step for step in orchestrator.values()), orchestrator
    for step in orchestrator.values():
        assert step.get("env/v1-reverse/errored", 0) == 0 and step.get("env/v1-dialogue/errored", 0) == 0
        if "reward/v1-reverse" in step:
            assert step["reward/v1-reverse"] == pytest.approx(0.7 * step["metrics/v1-reverse/exact"]
                                                             + 0.3 * step["metrics/v1-reverse/short"])
        if "reward/v1-dialogue" in step:  # every turn of the multi-turn episode ran and was trained on
            assert step["metrics/v1-dialogue/assistant_turns"] == 3
    rollout = json.loads((run.dir / "rollouts" / "step_1.jsonl").read_text().splitlines()[0])
    assert sum(rollout["loss_mask"]) > 0 and len(rollout["input_ids"]) == len(rollout["sampler_logprobs"])
    assert "serving the v1 taskset v1_reverse" in (run.dir / "logs" / "env-v1-reverse.log").read_text()


def test_a_taskset_that_asks_for_a_container_is_refused_in_one_line(v1_envs: dict[str, Any], builtin_server: Any,
                                                                     tmp_path: Path) -> None:
    proc = prime("eval", "run", "v1-container", "-b", builtin_server.base_url, "-m", builtin_server.model_name,
                 "-n", "1", "-r", "1", cwd=tmp_path)
    assert proc.returncode != 0
    error = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert len(error) == 1 and "task ls asks for the container image python:3.11-slim" in error[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_bash_harness_runs_the_models_commands_in_a_sandbox(v1_envs: dict[str, Any], lab_home: Path,
                                                                tmp_path: Path) -> None:
    """`harness: "bash"` runs verifiers' bash harness: the model is offered its bash tool, and the command it sends
    runs in the rollout's local sandbox (/app, where the task's setup wrote its note; the host's files and /tmp are
    not there), where the reward then reads the answer it wrote; the sandbox is gone after. The default, the null
    harness, offers no tool and runs the task's own commands in a host folder. The model is scripted: it must call
    the tool, which no model this suite can run does on cue."""
    host_file = tmp_path / "host-only.txt"
    host_file.write_text("a file of the host\n")
    marker = Path("/tmp") / f"prime-lab-model-{uuid.uuid4().hex}"
    command = f"cat notes.txt; pwd; echo plum > answer.txt; touch {marker}; cat {host_file}; echo end"
    call = {"id": "call_1", "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"command": command})}}
    with scripted_endpoint([{"content": None, "tool_calls": [call]}, "done"]) as model:
        proc = prime("eval", "run", "v1-bash", "-b", model.base_url, "-m", "scripted", "-n", "1", "-r", "1",
                     "-a", '{"harness": "bash"}', "-o", str(tmp_path / "bash"), cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert [[t["function"]["name"] for t in r.get("tools") or []] for r in model.requests] == [["bash"], ["bash"]]
        answered = model.requests[1]["messages"][-1]
    [row] = results(tmp_path / "bash")
    assert row["error"] is None and row["reward"] == 1.0 and row["metrics"]["in_app"] == 1.0, row
    assert answered["role"] == "tool" and answered["content"].startswith("the secret word is plum\n/app\nend\n")
    assert f"cat: {host_file}: No such file or directory" in answered["content"]
    assert not marker.exists()
    assert not list((lab_home / "sandboxes").glob("sbx-*"))

    with scripted_endpoint(["plum"]) as model:
        proc = prime("eval", "run", "v1-bash", "-b", model.base_url, "-m", "scripted", "-n", "1", "-r", "1",
                     "-o", str(tmp_path / "null"), cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert [r.get("tools") for r in model.requests] == [None]
    [row] = results(tmp_path / "null")
    assert row["reward"] == 0.0 and row["metrics"]["in_app"] == 0.0, row

    proc = prime("eval", "run", "v1-bash", "-b", "http://127.0.0.1:9/v1", "-m", "scripted", "-n", "1",
                 "-a", '{"harness": "codex"}', cwd=tmp_path)
    error = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert proc.returncode != 0 and len(error) == 1, proc.stderr
    assert "harness 'codex' is not one prime-lab runs" in error[0] and "Traceback" not in proc.stderr


def test_a_v1_tasksets_judge_is_the_runs_local_judge(v1_envs: dict[str, Any], builtin_server: Any,
                                                     tiny_model_dir: Path, tmp_path: Path) -> None:
    """`--judge MODEL` starts a local judge, and the taskset's `vf.JudgeConfig` (left at Prime's endpoint) is pointed
    at it in the taskset's own interpreter: every rollout's judge call is answered there, nothing leaves the
    machine."""
    proc = prime("eval", "run", "v1-judged", "-b", builtin_server.base_url, "-m", builtin_server.model_name,
                 "-n", "2", "-r", "1", "-t", "4", "--judge", str(tiny_model_dir), "-o", str(tmp_path / "out"),
                 cwd=tmp_path, env={**os.environ, "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9",
                                    "NO_PROXY": "127.0.0.1,localhost"})
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout + proc.stderr
    assert "judge: 2 requests, " in out and ", 0 errors, 0 timed out" in out, out
    rows = results(tmp_path / "out")
    assert [(r["error"], r["reward"]) for r in rows] == [(None, 1.0), (None, 1.0)], rows[0]["error"]
    [log] = list((Path(os.environ["PRIME_LAB_HOME"]) / "runs").glob("eval-*/logs/env-v1-judged.log"))
    assert f"the run's judge {tiny_model_dir} at http://127.0.0.1:" in log.read_text()
    assert "judges for taskset.task.judge" in log.read_text()
