"""tests/plugins/scheduling.py: the units the suite is spread over (a file, or a group of files that share what
a machine has once), the order they start in (the longest first), and the check that a test of a shared fixture
sits in its group."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from tests.plugins import scheduling

REPO = Path(__file__).resolve().parents[1]


def test_a_unit_is_a_group_or_a_file() -> None:
    assert scheduling.unit_of("tests/inference/test_vllm_server.py::test_x[a-b]") == "vllm"
    assert scheduling.unit_of("tests/workbench/test_cli_env.py::test_y") == "prime-lab-venv"
    assert scheduling.unit_of("tests/runs/test_events.py::TestLog::test_z") == "tests/runs/test_events.py"


def test_units_start_longest_first_each_in_its_own_order() -> None:
    ids = ["tests/a.py::t1", "tests/b.py::t1", "tests/inference/test_vllm_args.py::t1", "tests/a.py::t2",
           "tests/c.py::t1", "tests/inference/test_vllm_server.py::t1", "tests/b.py::t2"]
    seconds = {"tests/a.py": 10.0, "tests/b.py": 50.0, "tests/inference/test_vllm_args.py": 20.0,
               "tests/inference/test_vllm_server.py": 35.0}
    assert scheduling.longest_first(ids, seconds) == [
        "tests/inference/test_vllm_args.py::t1", "tests/inference/test_vllm_server.py::t1",  # vllm: 55 s in all
        "tests/b.py::t1", "tests/b.py::t2",  # 50 s
        "tests/a.py::t1", "tests/a.py::t2",  # 10 s
        "tests/c.py::t1",  # not measured: last
    ]


def test_a_test_of_a_shared_fixture_outside_its_group_is_named() -> None:
    items = [SimpleNamespace(nodeid="tests/inference/test_new.py::t", fixturenames=["tmp_path", "vllm_server"]),
             SimpleNamespace(nodeid="tests/inference/test_vllm_server.py::t", fixturenames=["vllm_server"]),
             SimpleNamespace(nodeid="tests/envs/test_new.py::t", fixturenames=["uninstall_after"])]
    assert scheduling.misplaced(items) == [  # type: ignore[arg-type]
        "tests/inference/test_new.py uses vllm_server: add it to GROUPS['vllm'] in tests/plugins/scheduling.py",
        "tests/envs/test_new.py uses uninstall_after: add it to GROUPS['prime-lab-venv'] in "
        "tests/plugins/scheduling.py"]


def test_the_groups_name_files_that_exist_and_the_durations_read_back(tmp_path: Path) -> None:
    assert [p for paths in scheduling.GROUPS.values() for p in paths if not (REPO / p).is_file()] == []
    measured = scheduling.measured()
    assert measured and all(p.startswith("tests/") and s >= 0 for p, s in measured.items())
    (tmp_path / "d.json").write_text(json.dumps({"tests/x.py": 1.5}))
    assert scheduling.measured(tmp_path / "d.json") == {"tests/x.py": 1.5}
    (tmp_path / "bad.json").write_text("{")
    assert scheduling.measured(tmp_path / "bad.json") == {}


def test_durations_out_writes_seconds_per_file(tmp_path: Path) -> None:
    (tmp_path / "test_one.py").write_text("import time\ndef test_a():\n    time.sleep(0.2)\ndef test_b():\n    pass\n")
    out = tmp_path / "durations.json"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.plugins.scheduling", "-p",
                           "no:cacheprovider", "--rootdir", str(tmp_path), "--durations-out", str(out), str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stdout + done.stderr
    seconds = json.loads(out.read_text())
    assert list(seconds) == ["test_one.py"] and seconds["test_one.py"] >= 0.2


def test_each_worker_gets_cores_of_its_own() -> None:
    assert scheduling.cores_of_worker([0, 1], 0, 2) == [0] and scheduling.cores_of_worker([0, 1], 1, 2) == [1]
    assert scheduling.cores_of_worker([0, 1, 2, 3, 4], 1, 2) == [1, 3]
    assert scheduling.cores_of_worker([0, 1], 2, 3) == [0, 1]  # more workers than cores: shared, as without it
    assert scheduling.cores_of_worker([4, 5], 0, 1) == [4, 5]


def test_a_worker_and_what_it_starts_run_on_its_core(tmp_path: Path) -> None:
    """Two xdist workers of a small suite: each test reports the cores it and a child process may use, and the
    terminal width it sees."""
    if len(os.sched_getaffinity(0)) < 2:
        return  # one core: nothing to split (the helper's own test above still runs)
    body = ("import os, subprocess, sys\n"
            "def test_report():\n"
            "    child = subprocess.run([sys.executable, '-c', 'import os; print(sorted(os.sched_getaffinity(0)))'],\n"
            "                           capture_output=True, text=True).stdout.strip()\n"
            "    line = f\"{os.environ['PYTEST_XDIST_WORKER']} {sorted(os.sched_getaffinity(0))} {child} \"\n"
            "    line += f\"{os.environ.get('COLUMNS')}\\n\"\n"
            "    with open(os.environ['CORES_OUT'], 'a') as out:\n"
            "        out.write(line)\n"
            "    import time; time.sleep(1)\n")  # the other worker takes the other file meanwhile
    for name in ("a", "b"):  # a file is a unit: two files, one for each worker
        (tmp_path / f"test_cores_{name}.py").write_text(body)
    out = tmp_path / "cores.txt"
    environ = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}  # as `prime` gets it: no terminal
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "tests.plugins.scheduling", "-p",
                           "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path)], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path,
                          env={**environ, "PYTHONPATH": str(REPO), "CORES_OUT": str(out)})
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in out.read_text().splitlines()}
    cores = sorted(os.sched_getaffinity(0))
    # and none of the COLUMNS=80 an xdist worker starts with: `prime` into a pipe keeps its 200 columns
    assert rows == {"gw0": f"{cores[0::2]} {cores[0::2]} None", "gw1": f"{cores[1::2]} {cores[1::2]} None"}, rows
