"""`prime env list | init | install` through the real `prime` console script.

Installed environments are real distributions: a folder on PYTHONPATH with a module and its `.dist-info` metadata
(what pip writes), or a package that `prime env install` pip-installs into this interpreter's environment and the
test uninstalls afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from prime_lab.runs.registry import RunRegistry
from tests.envs.scripted import scripted_endpoint
from tests.support import cli

prime = partial(cli.prime, timeout=300)  # pip installs and evals outlast the default minute


def test_env_list_shows_installed_environments_and_what_each_id_loads(site: Path, tmp_path: Path) -> None:
    marks = tmp_path / "imported.txt"
    env = {**os.environ, "PYTHONPATH": str(site), "IMPORT_MARKS": str(marks)}
    proc = prime("env", "list", "-o", "json", cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    envs = {e["id"]: e for e in json.loads(proc.stdout)}
    assert set(envs) == {"reverse-text", "sums-plugin", "primeintellect/alphabet-sort", "primeintellect/gsm8k",
                         "primeintellect/math-python", "primeintellect/reverse-text", "primeintellect/wordle",
                         "primeintellect/code-tests"}
    installed = envs["reverse-text"]
    assert (installed["source"], installed["module"], installed["distribution"], installed["version"]) == \
        ("installed", "reverse_text", "reverse-text", "0.1.4")
    assert installed["description"] == "reverse-text: the installed one."
    assert [(a["name"], a["default"], a["required"]) for a in installed["args"]] == \
        [("flavour", "reverse_text", False), ("size", 2, False), ("seed", "len('ab')", False)]
    assert envs["sums-plugin"]["module"] == "plugin_impl" and envs["sums-plugin"]["source"] == "installed"
    assert envs["primeintellect/reverse-text"]["shadowed_by"] == "reverse-text"
    assert envs["primeintellect/wordle"]["shadowed_by"] is None  # `wordle` here is no environment
    assert not marks.exists()  # listed from metadata and source: nothing was imported
    table = prime("env", "list", cwd=tmp_path, env={**env, "COLUMNS": "250"}).stdout
    assert "installed: reverse-text 0.1.4" in table and "built-in, shadowed: its ids load installed" in table


@pytest.mark.parametrize(("env_id", "system"), [("reverse-text", "reverse_text speaking"),
                                                ("primeintellect/reverse-text", "reverse_text speaking"),
                                                ("sums-plugin", "plugin_impl speaking"),
                                                ("wordle", None)])
def test_an_id_loads_the_installed_environment_before_a_builtin(site: Path, tmp_path: Path, env_id: str,
                                                                system: str | None) -> None:
    with scripted_endpoint(["0"] * 4) as ep:
        proc = prime("eval", "run", env_id, "-b", ep.base_url, "-m", "m", "-n", "1", "-r", "1", cwd=tmp_path,
                     env={**os.environ, "PYTHONPATH": str(site)})
    assert proc.returncode == 0, proc.stderr
    first = ep.requests[0]["messages"][0]
    if system is None:  # the built-in wordle: an unrelated installed module does not hide it
        assert "five-letter" in first["content"]
    else:
        assert first == {"role": "system", "content": system}


def test_env_init_writes_a_package_and_refuses_to_overwrite_or_collide(tmp_path: Path) -> None:
    proc = prime("env", "init", "you/My_Sums", "-p", str(tmp_path / "envs"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    folder = tmp_path / "envs" / "my-sums"
    assert proc.stdout.strip() == str(folder)
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()) == \
        ["README.md", "my_sums.py", "pyproject.toml", "tests/test_my_sums.py"]
    pyproject = (folder / "pyproject.toml").read_text()
    assert '[project.entry-points."prime_lab.environments"]\nmy-sums = "my_sums"' in pyproject
    assert "prime env install" in proc.stderr and "prime eval run my-sums" in proc.stderr
    again = prime("env", "init", "my-sums", "-p", str(tmp_path / "envs"), cwd=tmp_path)
    assert again.returncode == 1 and "pass -f/--force" in again.stderr
    assert prime("env", "init", "my-sums", "-p", str(tmp_path / "envs"), "-f", cwd=tmp_path).returncode == 0
    taken = prime("env", "init", "json", cwd=tmp_path)
    assert taken.returncode == 1 and "a module 'json' is already installed" in taken.stderr
    bad = prime("env", "init", "9lives", cwd=tmp_path)
    assert bad.returncode == 1 and "cannot name an environment" in bad.stderr
    builtin = prime("env", "init", "gsm8k", cwd=tmp_path)
    assert builtin.returncode == 0 and "also a built-in; once installed, its ids load this package" in builtin.stderr


def test_env_init_v1_writes_a_verifiers_v1_taskset_and_refuses_it_with_verifiers(tmp_path: Path) -> None:
    proc = prime("env", "init", "my-caps", "--v1", "-p", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    folder = tmp_path / "my-caps"
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()) == \
        ["README.md", "my_caps/__init__.py", "my_caps/scoring.py", "my_caps/taskset.py", "pyproject.toml",
         "tests/test_my_caps.py"]
    assert "class MyCapsTaskset(vf.Taskset[MyCapsTask, MyCapsConfig]):" in (folder / "my_caps/taskset.py").read_text()
    assert f"next: prime env install {folder} && prime eval run my-caps" in proc.stderr
    both = prime("env", "init", "other-caps", "--v1", "--verifiers", "-p", str(tmp_path), cwd=tmp_path)
    assert both.returncode == 1 and not (tmp_path / "other-caps").exists()
    assert both.stderr.strip().count("\n") == 0 and "--v1 and --verifiers ask for two APIs" in both.stderr


def test_env_list_says_each_environment_s_api(site: Path, tmp_path: Path) -> None:
    """A v1 taskset (an isolated environment at verifiers 0.4.0) is `v1`; one at 0.3.1, one beside prime-lab and
    the built-ins are `classic`: a column of the table and `api` in the JSON rows."""
    from prime_lab.envs.isolated import IsolatedRecord, save_record

    for name, release in (("caps-v1", "0.4.0"), ("caps-old", "0.3.1")):
        save_record(IsolatedRecord(name=name, module=name.replace("-", "_"), distribution=name, version="0.1.0",
                                   release=release, python=str(tmp_path / release / "bin" / "python"),
                                   target=str(tmp_path), reason="a test's"))
    env = {**os.environ, "PYTHONPATH": str(site)}
    proc = prime("env", "list", "-o", "json", cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    api = {row["id"]: row["api"] for row in json.loads(proc.stdout)}
    assert api["caps-v1"] == "v1" and api["caps-old"] == "classic" and api["reverse-text"] == "classic"
    assert api["primeintellect/gsm8k"] == "classic"
    table = prime("env", "list", cwd=tmp_path, env={**env, "COLUMNS": "250"}).stdout.splitlines()
    assert table[0].split()[:4] == ["ID", "SOURCE", "API", "RUNS"], table[:3]
    [row] = [line for line in table if line.split()[:1] == ["caps-v1"]]
    assert " v1 " in row and "verifiers 0.4.0" in row, row


def test_env_install_refuses_what_is_not_a_package(tmp_path: Path) -> None:
    missing = prime("env", "install", str(tmp_path / "nowhere"), cwd=tmp_path)
    assert missing.returncode == 1 and "no such folder or file" in missing.stderr
    (tmp_path / "empty").mkdir()
    empty = prime("env", "install", str(tmp_path / "empty"), cwd=tmp_path)
    assert empty.returncode == 1 and "has no pyproject.toml" in empty.stderr


def init_install_and_eval(name: str, tmp_path: Path, *flags: str, host_code: bool = False) -> dict[str, Any]:
    """`prime env init` + `prime env install`, then the package's own tests, `prime env list` and an evaluation;
    with `host_code`, the module also has a function that exec()s a completion (never called): said at install and
    once in the evaluation."""
    assert prime("env", "init", name, *flags, cwd=tmp_path).returncode == 0
    folder = tmp_path / name
    module = name.replace("-", "_")
    if host_code:
        with (folder / f"{module}.py").open("a") as source:
            source.write("\n\ndef run_reply(completion):\n    exec(completion[-1]['content'], {})\n")
    outside = f"{name} runs model-written code on this machine, outside the sandbox"
    installed = prime("env", "install", str(folder), cwd=tmp_path)
    assert installed.returncode == 0, installed.stderr
    assert (f"warning: {outside} (exec(completion[-1]['content'], {{}}) at {module}.py:" in installed.stderr) == \
        host_code, installed.stderr
    assert installed.stdout.split() == [name, module]
    constraints = Path(__file__).resolve().parents[2] / "constraints.txt"
    assert f"(editable, constraints {constraints})" in installed.stderr
    own_tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
                               cwd=folder, capture_output=True, text=True, timeout=300)
    assert own_tests.returncode == 0, own_tests.stdout + own_tests.stderr
    listed = {e["id"]: e for e in json.loads(prime("env", "list", "-o", "json", cwd=tmp_path).stdout)}
    assert listed[name]["source"] == "installed" and listed[name]["distribution"] == name
    rows = 2
    with scripted_endpoint(["<answer>right</answer>"] * rows) as ep:
        proc = prime("eval", "run", name, "-b", ep.base_url, "-m", "m", "-n", str(rows), "-r", "1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count(outside) == (1 if host_code else 0), proc.stderr
    assert len(ep.requests) == rows and "Write the word in capital letters" in ep.requests[0]["messages"][0]["content"]
    [run] = RunRegistry().runs()
    assert run.status()["state"] == "completed"
    return listed[name]


def test_a_new_environment_installs_and_runs_by_id_at_once(tmp_path: Path, uninstall_after: list[str]) -> None:
    uninstall_after.append("plab-sums-test")
    info = init_install_and_eval("plab-sums-test", tmp_path, host_code=True)
    assert [a["name"] for a in info["args"]] == ["num_train_examples", "num_eval_examples", "seed", "system_prompt"]


@pytest.mark.slow
def test_a_new_verifiers_environment_installs_and_runs_by_id_at_once(tmp_path: Path,
                                                                     uninstall_after: list[str]) -> None:
    pytest.importorskip("verifiers")
    uninstall_after.append("plab-vf-sums-test")
    info = init_install_and_eval("plab-vf-sums-test", tmp_path, "--verifiers")
    assert "dataset_name" in [a["name"] for a in info["args"]]
    source = (tmp_path / "plab-vf-sums-test" / "plab_vf_sums_test.py").read_text()
    assert "import verifiers as vf" in source and "vf.SingleTurnEnv(" in source and "Dataset.from_list" in source


def test_env_list_imports_neither_torch_nor_textual() -> None:
    from tests.test_import_hygiene import loaded_after

    body = "from prime_lab.workbench.cli import main\ntry:\n    main(['env', 'list'])\nexcept SystemExit:\n    pass"
    assert loaded_after(body) == []


def test_a_long_description_is_one_short_line_in_the_table() -> None:
    from prime_lab.workbench.cli.env import DESCRIPTION_CHARS, short_description

    error = "cannot be read: ModuleNotFoundError: No module named 'nltk' while importing broken_env " + "x" * 200
    short = short_description(error)
    assert short.startswith("cannot be read: ModuleNotFoundError") and short.endswith("…")
    assert len(short) == DESCRIPTION_CHARS
    assert short_description("cannot be read: ImportError: x\n  more\n  lines") == "cannot be read: ImportError: x…"
    assert short_description("reverse a short text") == "reverse a short text"
