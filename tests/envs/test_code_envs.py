"""The environments that run model-written code: math-python's `python` tool and code-tests' hidden tests in a
real local sandbox, and the check that names an environment whose own code runs a completion on this machine.

The model is a scripted endpoint (tests/envs/scripted.py); the sandboxes are real (bubblewrap).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI

from prime_lab.envs import SamplingArgs, host_code, load_environment
from prime_lab.envs.builtin.code_tests import extract_code
from prime_lab.evals.evaluation import EvalSpec, run_evaluation
from prime_lab.sandbox import local
from tests.envs.scripted import scripted_endpoint


@pytest.fixture(autouse=True)
def sandboxes(lab_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Where this test's sandboxes go (the default: under its PRIME_LAB_HOME); none may outlive it."""
    monkeypatch.delenv("PRIME_LAB_SANDBOXES", raising=False)
    monkeypatch.delenv(host_code.ALLOW_VAR, raising=False)
    yield lab_home / "sandboxes"
    assert not local.list_sandboxes(), "a sandbox was left behind"


def play(env: Any, replies: list[str], timeout: float | None = 60.0, row: dict[str, Any] | None = None) -> Any:
    row = row or env.get_eval_dataset(1)[0]
    with scripted_endpoint(list(replies)) as ep:
        client = AsyncOpenAI(base_url=ep.base_url, api_key="x", max_retries=0)
        [rollout] = asyncio.run(env.run_rollouts(client, "m", [row], SamplingArgs(max_tokens=32), timeout=timeout))
    return rollout, ep


def python_call(code: str) -> str:
    return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"


def assert_gone(sandbox_id: str, home: Path) -> None:
    with pytest.raises(local.SandboxGone):
        local.get(sandbox_id)
    assert not (home / sandbox_id).exists()


# math-python: the python tool ---------------------------------------------------------------------------------

def test_the_python_tool_runs_code_in_the_rollouts_sandbox_which_is_gone_after(sandboxes: Path) -> None:
    env = load_environment("math-python", python_timeout=1, max_output_chars=100)
    row = env.get_eval_dataset(1)[0]
    started = time.monotonic()
    rollout, ep = play(env, [
        python_call("import os\nprint(6 * 7)\nopen('kept.txt', 'w').write(os.getcwd())"),
        python_call("import sys\nprint(open('kept.txt').read())\nprint('x' * 500)\nsys.exit('no more')"),
        python_call("while True:\n    pass"),
        f"<answer>{row['answer']}</answer>"], row=row)
    said = [request["messages"][-1]["content"] for request in ep.requests[1:]]
    assert said[0] == "42"
    assert said[1].startswith("/app\n" + "x" * 95) and "cut: 506 characters in all" in said[1]
    assert said[1].endswith("stderr:\nno more\nexit code: 1")
    assert said[2] == "timed out after 1 s: the process was killed"
    assert time.monotonic() - started < 20
    assert rollout.error is None and rollout.reward == 1.0 and rollout.state["python_calls"] == 3
    assert "sandbox" not in rollout.state  # the object went with the sandbox; its id stays
    assert_gone(rollout.state["sandbox_id"], sandboxes)
    assert "python" in (env.system_prompt or "") and "calculate" in (env.system_prompt or "")


def running(argv: list[bytes]) -> bool:
    """Whether a process of this machine runs exactly `argv`."""
    wanted = b"\0".join(argv) + b"\0"
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "cmdline").read_bytes() == wanted:
                return True
        except OSError:
            continue
    return False


def test_a_rollout_cut_at_its_time_limit_while_its_code_runs_leaves_nothing_running(sandboxes: Path) -> None:
    env = load_environment("math-python", python_timeout=60)
    sleeper = [b"sleep", b"61.4142"]
    rollout, _ = play(env, [python_call("import os\nos.execvp('sleep', ['sleep', '61.4142'])")], timeout=3)
    assert (rollout.error or "").startswith("rollout timed out after 3 s")
    assert not [p.name for p in sandboxes.iterdir() if p.name.startswith(("sbx-", ".deleted"))]
    assert not running(sleeper)


def test_a_rollout_without_python_makes_no_sandbox(sandboxes: Path) -> None:
    env = load_environment("math-python")
    row = env.get_eval_dataset(1)[0]
    rollout, _ = play(env, [f"<answer>{row['answer']}</answer>"], row=row)
    assert rollout.reward == 1.0 and "sandbox_id" not in rollout.state


# code-tests ------------------------------------------------------------------------------------------------------

def fenced(code: str) -> str:
    return f"Here it is:\n```python\n{code}```\nIt should work."


def first_row_of(env: Any, function: str) -> dict[str, Any]:
    return next(r for r in env.get_dataset() if r["info"]["function"] == function)


def test_code_tests_scores_a_correct_a_partial_and_a_wrong_solution() -> None:
    env = load_environment("code-tests")
    row = first_row_of(env, "add")
    tests = row["info"]["tests"]
    first = tests[0]
    correct, _ = play(env, [fenced(row["answer"])], row=row)
    assert correct.reward == 1.0 and all(t["passed"] for t in correct.state["test_results"])
    # right on the example only
    partial, _ = play(env, [fenced(f"def add(a, b):\n    return {first['expected']} if [a, b] == {first['args']} "
                                   "else 0\n")], row=row)
    assert partial.reward == pytest.approx(1 / len(tests))
    # wrong: it prints what the runner reports and returns a value that claims to equal anything
    cheat = ("import json\nfor i in range(9):\n    print(json.dumps({'test': i, 'value': " + str(first["expected"])
             + "}))\nclass Anything(int):\n    def __eq__(self, other):\n        return True\n"
             "def add(a, b):\n    return Anything(-987654)\n")
    wrong, _ = play(env, [fenced(cheat)], row=row)
    assert wrong.reward == 0.0, wrong.state["test_results"]
    broken, _ = play(env, ["```python\ndef add(a, b)\n    return a + b\n```"], row=row)
    assert broken.reward == 0.0 and "SyntaxError" in broken.state["test_results"][0]["error"]
    silent, _ = play(env, ["I do not know."], row=row)
    assert silent.reward == 0.0 and silent.error is None


def test_code_in_an_endless_loop_fails_its_test_and_the_others_still_run() -> None:
    env = load_environment("code-tests", test_timeout=1.0)
    row = first_row_of(env, "add")
    tests = row["info"]["tests"]
    looping = (row["answer"] + "\n_add = add\n\ndef add(a, b):\n"
               f"    if [a, b] == {tests[0]['args']}:\n        while True:\n            pass\n    return _add(a, b)\n")
    started = time.monotonic()
    rollout, _ = play(env, [fenced(looping)], row=row)
    assert time.monotonic() - started < 15
    outcomes = rollout.state["test_results"]
    assert outcomes[0] == {"passed": False, "error": "timed out"}
    assert all(o["passed"] for o in outcomes[1:])
    assert rollout.reward == pytest.approx((len(tests) - 1) / len(tests))
    hung = "def add(a, b):\n    return a + b\n\nwhile True:\n    pass\n"  # never gets as far as a test
    rollout, _ = play(env, [fenced(hung)], row=row)
    assert rollout.reward == 0.0 and rollout.state["test_results"][0]["error"] == "the code did not run: timed out"


def test_the_code_of_a_reply_is_its_python_block_or_else_its_def() -> None:
    assert extract_code("```py\ndef f():\n    return 1\n```\n```python\nprint(f())\n```", "f") == \
        "def f():\n    return 1\n"
    assert extract_code("Sure!\nimport math\ndef f(x):\n    return x\n\n    # still f\nThat is it.", "f") == \
        "import math\ndef f(x):\n    return x\n\n    # still f\n"
    assert extract_code("```python\ndef f(x):\n    return x", "f") == "def f(x):\n    return x"  # cut short
    assert extract_code("no code here", "f") is None


# code that runs on the host, outside the sandbox ---------------------------------------------------------------

RUNS_ITS_COMPLETION = '''
from prime_lab.envs import Rubric, SingleTurnEnv

def ran(completion):
    scope = {}
    exec(completion[-1]["content"], scope)
    return float(scope.get("x", 0))

def load_environment():
    return SingleTurnEnv(dataset=[{"question": "Write x = 1", "answer": ""}], rubric=Rubric([ran]))
'''

RUNS_ONLY_ITS_OWN = '''
import subprocess
import sys
from prime_lab.envs import Rubric, SingleTurnEnv

CHECK = ["true"]

def fine(completion):
    subprocess.run(CHECK, check=False)
    subprocess.run([sys.executable, "-c", "pass"], check=False)
    return float(eval("1 + 0")) if "x" in completion[-1]["content"] else 0.0

def load_environment():
    return SingleTurnEnv(dataset=[{"question": "Write x = 1", "answer": ""}], rubric=Rubric([fine]))
'''


def test_the_check_finds_code_that_runs_what_it_is_given() -> None:
    flagged = {
        "import subprocess\ndef f(code):\n    subprocess.run(['python', '-c', code])": "subprocess.run",
        "from subprocess import check_output as co\ndef f(c):\n    co(c, shell=True)": "co(c, shell=True)",
        "import os\ndef f(c):\n    os.system(f'python {c}')": "os.system",
        "import asyncio\nasync def f(p):\n    await asyncio.create_subprocess_exec('python', p)": "create_subprocess",
        "def f(c):\n    eval(compile(c, 'x', 'eval'))": "eval(",
    }
    for source, call in flagged.items():
        found = [c for c in host_code.scan_source(source, "env.py") if call in c.call]
        assert len(found) == 1 and found[0].path == "env.py", source
    harmless = ("import subprocess, re\nsubprocess.run(['git', 'status'])\nre.compile(x)\neval('1')\n"
                "client.exec(code)\nsandbox.execute(code)\n")
    assert host_code.scan_source(harmless) == []


def write_env(folder: Path, module: str, source: str) -> Path:
    package = folder / module
    package.mkdir()
    (package / f"{module}.py").write_text(source)
    (package / "pyproject.toml").write_text(f'[project]\nname = "{module}"\nversion = "0.1.0"\n')
    return package


def test_an_environment_that_execs_its_completion_is_named_at_install_and_once_in_its_evaluation(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = write_env(tmp_path, "exec_env", RUNS_ITS_COMPLETION)
    good = write_env(tmp_path, "own_env", RUNS_ONLY_ITS_OWN)
    line = host_code.at_install(bad, ["exec-env"])
    assert line is not None and "exec-env runs model-written code on this machine, outside the sandbox" in line
    assert "exec_env.py:6" in line and "PRIME_LAB_ALLOW_HOST_CODE=exec-env" in line
    assert host_code.at_install(good, ["own-env"]) is None
    assert host_code.at_install(bad, ["exec-env"], {host_code.ALLOW_VAR: "exec-env"}) is None

    monkeypatch.syspath_prepend(str(bad))
    monkeypatch.syspath_prepend(str(good))

    def evaluate(env_id: str) -> list[str]:
        said: list[str] = []
        with scripted_endpoint(["x = 1"] * 2) as ep:
            spec = EvalSpec(env_id=env_id, model="m", base_url=ep.base_url, num_examples=1, rollouts_per_example=2,
                            sampling=SamplingArgs(max_tokens=8))
            result = run_evaluation(spec, tmp_path / env_id, announce=said.append)
        assert [r.reward for r in result.rollouts] == [1.0, 1.0]
        return said

    [warning] = evaluate("exec-env")
    assert warning.startswith("WARNING: environment exec-env runs model-written code on this machine, outside the "
                              "sandbox (exec(completion[-1]['content'], scope) at ")
    assert evaluate("own-env") == []
    monkeypatch.setenv(host_code.ALLOW_VAR, "someone-else,exec-env")
    assert evaluate("exec-env") == []
