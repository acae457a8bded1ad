"""An environment that cannot load says why in the same words in both interpreters: prime-lab's own, and an
environment's own (driver.py, here run by this project's interpreter); the driver describes the environment's
own rollout time limit; and one that verifiers' env worker cannot load fails in seconds with the worker's error."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sys
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from prime_lab.envs import EnvironmentLoadError, driver, hub, isolated, loader
from prime_lab.envs.env_server import EnvironmentCannotLoad, EnvironmentDown, WorkerWatch, run_driver
from prime_lab.envs.environment import SamplingArgs
from prime_lab.runs.processes import free_port

MISSING = "nobody-prime-lab/not-on-this-machine"  # a Hub dataset no cache holds

IMPORT_LOADS = f'''
"""Loads a Hub dataset when imported."""
import datasets

ROWS = datasets.load_dataset("{MISSING}", split="train")


def load_environment():
    return None
'''

LOAD_LOADS = f'''
"""Loads a Hub dataset in load_environment."""


def load_environment(dataset_name: str = "{MISSING}", split: str = "train"):
    import datasets

    return datasets.load_dataset(dataset_name, split=split)
'''

WITH_TIME_LIMIT = '''
"""A verifiers environment with its own rollout time limit."""
import verifiers as vf
from datasets import Dataset


def load_environment(limit: float = 90):
    rows = Dataset.from_list([{"question": "2+2?", "answer": "4"}])
    return vf.SingleTurnEnv(dataset=rows, timeout_seconds=limit)
'''

WORKER_FAILS = '''
"""Loads where prime-lab checks it; raises in verifiers' env worker, a process started with spawn."""
import multiprocessing

import verifiers as vf
from datasets import Dataset


def load_environment():
    if multiprocessing.current_process().name != "MainProcess":
        raise RuntimeError("WORKER_ONLY_KEY is not set in this process")
    return vf.SingleTurnEnv(dataset=Dataset.from_list([{"question": "2+2?", "answer": "4"}]))
'''


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder of environment modules on this process's path; the Hub offline by prime-lab's choice, not the
    user's (no offline variable set)."""
    folder = tmp_path / "modules"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    for name in (*hub.OFFLINE_VARIABLES, "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    before = set(sys.modules)
    yield folder
    for name in set(sys.modules) - before:
        if name.startswith("hubprobe_"):
            del sys.modules[name]


def write(folder: Path, name: str, text: str) -> None:
    (folder / f"{name}.py").write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")


def own_interpreter(tmp_path: Path, modules: Path) -> Path:
    """This project's Python as an environment's own interpreter. run_driver runs it isolated (-I), which would hide
    `modules`; this stand-in drops -I and puts them on its path (still no user site, no script folder on it)."""
    script = tmp_path / "bin" / "python"
    script.parent.mkdir(exist_ok=True)
    script.write_text(f'#!/bin/sh\n[ "$1" = -I ] && shift\nPYTHONPATH={shlex.quote(str(modules))} '
                      f'exec {shlex.quote(sys.executable)} -s -P "$@"\n')
    script.chmod(0o755)
    return script


def offline_environment() -> dict[str, str]:
    """What the environment's interpreter gets when the user chose nothing (isolated.server_environment)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return {**env, **dict.fromkeys(hub.OFFLINE_VARIABLES, "1")}


def in_process_message(env_id: str, **args: Any) -> str:
    with pytest.raises(EnvironmentLoadError) as raised:
        loader.load_environment(env_id, **args)
    return str(raised.value)


def from_driver(answer: dict[str, Any], env_id: str) -> str | None:
    """The message prime-lab gives for the driver's answer, read as the loader reads it (the Hub offline meanwhile
    unless the user chose)."""
    with hub.offline_unless_chosen():
        return hub.driver_failure_message(answer, env_id)


def test_the_driver_writes_an_error_chain_as_prime_lab_reads_it() -> None:
    """driver.error_chain (which cannot import prime-lab) and hub.error_lines give the same lines, outermost first,
    a package's error with its module, a builtin's bare."""
    from huggingface_hub.errors import OfflineModeIsEnabled

    try:
        try:
            raise OfflineModeIsEnabled("Cannot reach https://hf.co/api/datasets/org/x/revision/main: offline mode")
        except OfflineModeIsEnabled as exc:
            raise RuntimeError("Failed to load environment 'e'") from exc
    except RuntimeError as chained:
        lines = hub.error_lines(chained)
        assert driver.error_chain(chained) == lines
    assert lines == ["RuntimeError: Failed to load environment 'e'",
                     "huggingface_hub.errors.OfflineModeIsEnabled: Cannot reach https://hf.co/api/datasets/org/x/"
                     "revision/main: offline mode"]
    message = hub.lines_failure_message(lines, "e", {})
    assert message is not None and "dataset 'org/x' is not on this machine and the Hub is offline" in message
    # The same words for the same failure however it reached us; other failures are not the Hub's.
    assert hub.driver_failure_message({"errors": lines, "arguments": {}}, "e") == message
    assert hub.driver_failure_message({"error": "RuntimeError: no key"}, "e") is None
    assert hub.driver_failure_message({"errors": ["ValueError: Unknown split 'tets'"]}, "e") is None


def test_the_driver_reads_the_environment_s_own_time_limit() -> None:
    """`timeout_seconds` (verifiers' MultiTurnEnv) as seconds; None where it is unset, not a positive number, or
    absent (releases before 0.3.1)."""
    class Env:
        def __init__(self, value: Any) -> None:
            self.timeout_seconds = value

    assert driver.time_limit(Env(90)) == 90.0 and driver.time_limit(Env(2.5)) == 2.5
    for value in (None, 0, -1, True, "90"):
        assert driver.time_limit(Env(value)) is None, value
    assert driver.time_limit(object()) is None


def test_a_hub_dataset_missing_offline_at_import_reads_the_same_in_both_interpreters(
        tmp_path: Path, modules: Path) -> None:
    """An environment module that loads a Hub dataset not on this machine when imported: in this process the loader
    explains it with the fix; the driver's `check` in the environment's own interpreter (this project's Python)
    gets the same words, not verifiers' or datasets' own."""
    write(modules, "hubprobe_import_env", IMPORT_LOADS)
    with ThreadPoolExecutor(1) as pool:  # the driver's interpreter starts while this one loads
        checking = pool.submit(run_driver, own_interpreter(tmp_path, modules), "check", "hubprobe_import_env",
                               env=offline_environment(), timeout=60)
        here = in_process_message("you/hubprobe-import-env")
        answer = checking.result()
    assert here == (f"environment 'you/hubprobe-import-env': dataset '{MISSING}' is not on this machine and the Hub "
                    "is offline (the Hugging Face Hub at https://huggingface.co did not answer, so environments "
                    "load offline; HF_HUB_OFFLINE=0 downloads); download it where the Hub is reachable (hf download "
                    f"{MISSING} --repo-type dataset --local-dir FOLDER), copy the folder here, and load it in the "
                    "environment with "
                    "datasets.load_dataset('/path/to/folder'), or from files with datasets.load_dataset('json', "
                    "data_files=...)")
    assert answer["ok"] is False and "on the Hub" in answer["error"], answer
    assert from_driver(answer, "you/hubprobe-import-env") == here


@pytest.mark.slow  # the driver's `describe` imports verifiers (about 6 s)
def test_a_hub_dataset_missing_offline_in_load_environment_reads_the_same_in_both_interpreters(
        tmp_path: Path, modules: Path) -> None:
    """load_environment loads the missing dataset: verifiers' own loader wraps the failure (naming its
    env_utils.py), the driver's answer still reads as the loader's message in this process, the argument that holds
    the dataset named for the fix."""
    write(modules, "hubprobe_load_env", LOAD_LOADS)
    here = in_process_message("hubprobe-load-env", split="test")
    assert f"dataset '{MISSING}' is not on this machine and the Hub is offline" in here
    assert here.endswith("pass dataset_name='/path/to/folder' (-a '{\"dataset_name\": \"/path/to/folder\"}')")
    answer = run_driver(own_interpreter(tmp_path, modules), "describe", "hubprobe_load_env",
                        json.dumps({"split": "test"}), env=offline_environment(), timeout=60)
    assert answer["where"].startswith("env_utils.py")  # what the user was shown before
    assert answer["arguments"] == {"dataset_name": MISSING, "split": "test"}
    assert from_driver(answer, "hubprobe-load-env") == here


@pytest.mark.slow  # through the loader, an isolated environment's `describe` (verifiers imported, about 6 s)
def test_an_isolated_environment_missing_a_hub_dataset_fails_with_the_in_process_message(
        tmp_path: Path, modules: Path) -> None:
    """The same environment installed at its own release (its interpreter this project's Python): loading it
    fails with exactly the words it fails with in this process."""
    write(modules, "hubprobe_load_env", LOAD_LOADS)
    here = in_process_message("hubprobe-load-env")
    isolated.save_record(isolated.IsolatedRecord(
        name="hubprobe-load-env", module="hubprobe_load_env", distribution="hubprobe-load-env", version="0.1.0",
        release="0.3.1", python=str(own_interpreter(tmp_path, modules)), target=str(modules), reason="a test",
        args=(("dataset_name", MISSING, False, "str"), ("split", "train", False, "str"))))
    assert loader.resolve("hubprobe-load-env").source == loader.ISOLATED
    assert in_process_message("hubprobe-load-env") == here


@pytest.mark.slow  # the driver's `describe` imports verifiers (about 6 s)
def test_describe_gives_the_environment_s_own_time_limit(tmp_path: Path, modules: Path) -> None:
    """A verifiers SingleTurnEnv built with timeout_seconds: describe says so, in seconds."""
    write(modules, "hubprobe_limit_env", WITH_TIME_LIMIT)
    answer = run_driver(own_interpreter(tmp_path, modules), "describe", "hubprobe_limit_env",
                        json.dumps({"limit": 45}), env=offline_environment(), timeout=60)
    assert "error" not in answer, answer
    assert answer["timeout_seconds"] == 45.0 and len(answer["dataset"]) == 1


@pytest.mark.slow  # describe, then verifiers' server and its spawned worker (verifiers imported 3 times, ~10 s)
def test_an_environment_its_env_worker_cannot_load_fails_in_seconds_naming_the_worker_s_error(
        tmp_path: Path, modules: Path) -> None:
    """verifiers 0.3.1's server loads the environment again in a worker of its own and starts a worker that dies
    again every few seconds: the group fails within seconds (not at the 300 s rollout limit, blaming the model
    endpoint) in one line naming the environment, the worker's last exception line and its log; the next group
    fails at once, no server started again."""
    write(modules, "hubprobe_worker_env", WORKER_FAILS)
    env = isolated.IsolatedEnvironment(isolated.IsolatedRecord(
        name="hubprobe-worker-env", module="hubprobe_worker_env", distribution="hubprobe-worker-env", version="0.1.0",
        release="0.3.1", python=str(own_interpreter(tmp_path, modules)), target=str(modules), reason="a test"),
        "hubprobe-worker-env", {})
    rows = env.get_eval_dataset(1)

    async def group() -> None:
        from openai import AsyncOpenAI

        client = AsyncOpenAI(base_url=f"http://127.0.0.1:{free_port()}/v1", api_key="EMPTY")
        await asyncio.wait_for(env.run_group(client, "m", rows, SamplingArgs(max_tokens=4)), 90)

    started = time.monotonic()
    with pytest.raises(EnvironmentCannotLoad) as raised:
        asyncio.run(group())
    assert time.monotonic() - started < 45
    line = raised.value.line()
    assert line == str(raised.value) and "\n" not in line
    assert line.startswith("environment 'hubprobe-worker-env' (verifiers 0.3.1) cannot load in verifiers' env worker")
    assert ": RuntimeError: Failed to load environment 'hubprobe_worker_env': WORKER_ONLY_KEY is not set in this " \
           "process (its log: " in line
    assert server_log_dir(line).joinpath("env_worker_0.log").is_file()
    again = time.monotonic()
    with pytest.raises(EnvironmentDown, match="WORKER_ONLY_KEY"):
        asyncio.run(group())
    assert time.monotonic() - again < 2 and env._server is None


def server_log_dir(line: str) -> Path:
    return Path(line.split("(its log: ", 1)[1].split(";", 1)[0]).parent


def test_the_worker_watch_tells_a_worker_that_cannot_load_from_one_that_died_after_loading(tmp_path: Path) -> None:
    """Each start of a worker logs `Loading environment`; each death by an exception puts multiprocessing's
    traceback in the server's log. A worker that loaded and later died, started again and loaded, is no failure;
    one whose latest start died before loading is, named by its traceback's last line once that traceback is whole."""
    server_log, log_dir = tmp_path / "env-x.log", tmp_path / "env-x.d"
    log_dir.mkdir()
    server_log.write_text("an earlier server's\nProcess x-0:\nTraceback (most recent call last):\nValueError: old\n")
    watch = WorkerWatch(server_log, log_dir)  # from the logs' ends
    worker = log_dir / "env_worker_0.log"

    def append(path: Path, text: str) -> None:
        with path.open("a") as fh:
            fh.write(text)

    started = "t - INFO - Loading environment: x\n"
    loaded = "t - INFO - Initialized worker x-0 on ipc://w\n"
    died = ("Process x-0:\nTraceback (most recent call last):\n  File \"w.py\"\nOSError: lost its socket\n"
            "2026-01-01 10:00:00 - router - WARNING - Worker 0 died, restarting\n")
    append(worker, started + loaded)
    append(server_log, "driver: serving\n" + died)
    append(worker, started + loaded)
    assert watch.failure() is None
    append(server_log, died)
    append(worker, started)
    assert watch.failure() is None  # started again, loading
    append(server_log, "Process x-0:\nTraceback (most recent call last):\n  File \"env.py\"\nKeyError: 'a'\n\n"
                       "The above exception was the direct cause of the following exception:\n\nTraceback (most")
    assert watch.failure() is None  # still being written
    append(server_log, " recent call last):\n  File \"w.py\"\nRuntimeError: Failed to load environment 'x': 'a'\n")
    assert watch.failure() is None  # whole now, but it may go on: the next read says
    assert watch.failure() == (f"RuntimeError: Failed to load environment 'x': 'a' (its log: {worker}; the "
                               f"traceback in {server_log})")
