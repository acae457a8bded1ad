"""`prime rl` as a user runs it: the installed console script, its output streams and exit codes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from prime_lab.runs.events import EventWriter
from prime_lab.runs.registry import RunRegistry
from tests.support.cli import PRIME, prime

REPO = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = REPO / "configs" / "rl" / "reverse-text.toml"


BROKEN = """model = "smollm2-135m"
max_steps = 10
batch_size = 10
rollouts_per_example = 4

[sampling]
max_tokens = 64
temprature = 0.5

[[env]]
id = "primeintellect/reverse-text"
"""


def test_validate_prints_file_line_key_message_and_exits_1(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(BROKEN)
    proc = prime("rl", "validate", f"@{bad}")
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert f"{bad}:3: batch_size: batch_size (10) must be divisible by rollouts_per_example (4); try 8 or 12" in lines
    assert f"{bad}:8: sampling.temprature: unknown key (did you mean `temperature`?)" in lines
    assert "2 problems" in proc.stderr


@pytest.mark.parametrize("form", ["@{p}", "@ {p}", "{p}"])
def test_config_argument_forms(tmp_path: Path, form: str) -> None:
    args = form.format(p=DEFAULT_CONFIG).split(" ")
    proc = prime("rl", "validate", *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok" in proc.stderr


def test_validate_json_output(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(BROKEN)
    proc = prime("rl", "validate", "-o", "json", str(bad), str(DEFAULT_CONFIG))
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    assert [r["ok"] for r in report] == [False, True]
    keys = {(p["line"], p["key"]) for p in report[0]["problems"]}
    assert keys == {(3, "batch_size"), (8, "sampling.temprature")}
    assert report[0]["problems"][1]["suggestion"] == "temperature" or report[0]["problems"][0]["suggestion"]


def test_validate_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    proc = prime("rl", "validate", str(tmp_path / "nope.toml"))
    assert proc.returncode == 1
    assert "nope.toml: no such file" in proc.stdout


def test_init_prints_a_template_that_validates_and_refuses_to_overwrite(tmp_path: Path) -> None:
    out = prime("rl", "init")
    assert out.returncode == 0 and "[sampling]" in out.stdout
    path = tmp_path / "my.toml"
    path.write_text(out.stdout)
    assert prime("rl", "validate", str(path)).returncode == 0
    target = tmp_path / "new.toml"
    assert prime("rl", "init", str(target)).returncode == 0
    assert target.read_text() == out.stdout
    target.write_text("# mine\n")
    again = prime("rl", "init", str(target))
    assert again.returncode == 1 and "-f/--force" in again.stderr
    assert target.read_text() == "# mine\n"  # nothing the user wrote is lost
    assert prime("rl", "init", "-f", str(target)).returncode == 0


def test_list_logs_and_delete(lab_home: Path) -> None:
    registry = RunRegistry()
    run = registry.create("rl", config_text="", resolved={}, model="smollm2-135m",
                          envs=["primeintellect/reverse-text"], max_steps=5)
    with EventWriter(run.events_path, "trainer") as writer:
        writer.log("loading model", level="INFO")
        writer.metrics({"reward/mean": 0.25, "loss": 1.0}, step=1)
        writer.log("slow step", level="WARNING", step=1)
    table = prime("rl", "list")
    assert run.id in table.stdout and "queued" in table.stdout and "smollm2-135m" in table.stdout
    listed = json.loads(prime("rl", "list", "-o", "json").stdout)
    assert [r["id"] for r in listed] == [run.id]

    logs = prime("rl", "logs", run.id).stdout.splitlines()
    assert any("loading model" in line for line in logs)
    assert any("METRICS step 1 reward/mean=0.25 loss=1" in line for line in logs)
    assert prime("rl", "logs", run.id, "-n", "1").stdout.count("\n") == 1
    warnings = prime("rl", "logs", run.id, "--level", "warning").stdout.splitlines()
    assert len(warnings) == 1 and "slow step" in warnings[0]
    only_launcher = prime("rl", "logs", run.id, "-c", "launcher").stdout
    assert "STATUS" in only_launcher and "loading model" not in only_launcher
    raw = [json.loads(line) for line in prime("rl", "logs", run.id, "--raw").stdout.splitlines()]
    assert [e["seq"] for e in raw] == [1, 2, 3, 4]
    bad_component = prime("rl", "logs", run.id, "-c", "gpu")
    assert bad_component.returncode == 1 and "unknown component" in bad_component.stderr

    assert prime("rl", "stop", run.id).returncode == 0
    assert prime("rl", "delete", run.id).returncode == 0
    assert not run.dir.exists()
    missing = prime("rl", "logs", run.id)
    assert missing.returncode == 1 and missing.stderr.startswith("Error: no run")


def test_logs_follow_ends_when_the_run_ends(lab_home: Path) -> None:
    registry = RunRegistry()
    run = registry.create("rl", config_text="", resolved={}, max_steps=5)
    follower = subprocess.Popen([PRIME, "rl", "logs", run.id, "-f"], stdout=subprocess.PIPE, text=True)
    with EventWriter(run.events_path, "trainer") as writer:
        writer.log("step one done", step=1)
    run.set_state("completed", source="trainer")
    out, _ = follower.communicate(timeout=30)
    assert follower.returncode == 0
    assert "step one done" in out and "completed" in out


def test_train_is_the_same_group() -> None:
    assert "validate" in prime("train", "--help").stdout
