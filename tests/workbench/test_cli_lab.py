"""`prime lab setup | doctor` through the real `prime` console script, and `prime lab [PATH]` still opening the
workbench (in process, with the app replaced: a terminal UI cannot run under pytest)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.support.cli import prime

BAD_CONFIG = ('model = "smollm2-135m"\nmax_stepz = 3\nbatch_size = 8\nrollouts_per_example = 4\n\n[sampling]\n'
              'max_tokens = 16\n\n[[env]]\nid = "nobody/no-such-env"\n')


def test_setup_writes_a_workspace_then_changes_nothing_and_force_overwrites(tmp_path: Path) -> None:
    first = prime("lab", "setup", "ws", "--plain", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    folder = tmp_path / "ws"
    assert "created     configs/rl/reverse-text.toml" in first.stdout
    assert "created     environments/my-env/my_env.py" in first.stdout
    assert "created     .gitignore" in first.stdout
    for row in ("cores\t", "memory\t", "GPU\t", "engine builtin\tworks", "engine vllm\t", "model smollm2-135m\t",
                "runs\t"):
        assert row in first.stdout, row
    start = first.stdout.split("Get started:", 1)[1]
    for command in ("cd ws", "prime eval run reverse-text -n 5", "prime rl run @configs/rl/reverse-text.toml",
                    "prime gepa run @configs/gepa/reverse-text.toml", "prime lab doctor", "prime lab ."):
        assert command in start, command
    if any((folder / "configs" / "sft").glob("*.toml")):
        assert "prime sft run @configs/sft/" in start

    again = prime("lab", "setup", cwd=folder)
    assert again.returncode == 0 and "Nothing changed" in again.stdout and "created" not in again.stdout
    # rich's panel into a pipe (not --plain): each command beside its whole note, not one word of it per line
    rows = [line for line in again.stdout.splitlines() if "prime lab doctor" in line or "prime rl run @" in line]
    assert len(rows) == 2 and "check the workspace and this machine" in rows[0] \
        and "train it with RL (LoRA)" in rows[1], again.stdout

    config = folder / "configs" / "gepa" / "reverse-text.toml"
    template = config.read_text()
    config.write_text(template + "# mine\n")
    kept = prime("lab", "setup", str(folder), cwd=tmp_path)
    assert "kept        configs/gepa/reverse-text.toml (differs from the template; --force overwrites it)" \
        in kept.stdout
    forced = prime("lab", "setup", str(folder), "--force", cwd=tmp_path)
    assert forced.returncode == 0 and "overwritten configs/gepa/reverse-text.toml" in forced.stdout
    assert config.read_text() == template


def test_setup_offers_the_v1_example_and_refuses_it_with_verifiers_in_one_line(tmp_path: Path) -> None:
    both = prime("lab", "setup", "ws", "--v1", "--verifiers", cwd=tmp_path)
    assert both.returncode == 1 and both.stderr.strip().count("\n") == 0, both.stderr
    assert "--v1 and --verifiers ask for two APIs" in both.stderr and not (tmp_path / "ws").exists()
    assert "--v1" in prime("lab", "setup", "--help", cwd=tmp_path, env={**os.environ, "COLUMNS": "200"}).stdout


def test_doctor_passes_a_fresh_workspace_and_fails_a_broken_one_saying_where(tmp_path: Path) -> None:
    assert prime("lab", "setup", cwd=tmp_path).returncode == 0
    fresh = prime("lab", "doctor", "--plain", cwd=tmp_path)
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr
    assert "All good" in fresh.stdout and "engine builtin" in fresh.stdout
    assert "ok    configs/rl/reverse-text.toml: valid (rl)" in fresh.stdout

    (tmp_path / "configs" / "rl" / "bad.toml").write_text(BAD_CONFIG)
    broken = tmp_path / "environments" / "broken-env"
    broken.mkdir()
    (broken / "broken_env.py").write_text("import json\nimport no_such_module_anywhere\n")
    (tmp_path / ".gitignore").write_text(".env\n")
    bad = prime("lab", "doctor", "--plain", cwd=tmp_path)
    assert bad.returncode == 1
    assert "FAIL  configs/rl/bad.toml:2: max_stepz: unknown key (did you mean `max_steps`?)" in bad.stdout
    assert "FAIL  configs/rl/bad.toml:10: env[0].id: no environment 'nobody/no-such-env'" in bad.stdout
    assert ("FAIL  environments/broken-env/broken_env.py:2: importing broken_env failed: ModuleNotFoundError: No "
            "module named 'no_such_module_anywhere'") in bad.stdout
    assert "FAIL  .gitignore: does not ignore /outputs/" in bad.stdout

    report = json.loads(prime("lab", "doctor", "-o", "json", cwd=tmp_path).stdout)
    assert report["ok"] is False and report["fixed"] == []
    assert report["machine"]["cores"] >= 1 and report["machine"]["engines"][0]["name"] == "builtin"
    failures = {(c["file"], c["line"], c["key"]) for c in report["checks"] if c["status"] == "fail"}
    assert ("configs/rl/bad.toml", 2, "max_stepz") in failures
    assert ("environments/broken-env/broken_env.py", 2, "") in failures

    fixed = prime("lab", "doctor", "--fix", "--plain", cwd=tmp_path)
    assert "fixed: .gitignore: added /outputs/" in fixed.stdout
    assert "ok    .gitignore" in fixed.stdout and fixed.returncode == 1  # the config and the package remain
    (tmp_path / "configs" / "rl" / "bad.toml").unlink()
    (broken / "broken_env.py").write_text("def load_environment(**args):\n    raise NotImplementedError\n")
    healed = prime("lab", "doctor", "-o", "json", cwd=tmp_path)
    assert healed.returncode == 0 and json.loads(healed.stdout)["ok"] is True


def test_doctor_of_a_missing_folder_says_how_to_make_one(tmp_path: Path) -> None:
    proc = prime("lab", "doctor", "nowhere", cwd=tmp_path)
    assert proc.returncode == 1 and "no such folder: nowhere (prime lab setup nowhere writes one)" in proc.stderr


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, Any]]:
    """The workbench app replaced: each `prime lab ...` that would open it records (path, run id)."""
    calls: list[tuple[Any, Any]] = []

    class App:
        def __init__(self, path: Any, run_id: Any) -> None:
            calls.append((path, run_id))

        def run(self) -> None:
            pass

    monkeypatch.setattr("prime_lab.workbench.app.create_app", lambda path, run_id=None: App(path, run_id))
    return calls


def lab(*args: str) -> Any:
    from prime_lab.workbench.cli.app import app

    return CliRunner().invoke(app, ["lab", *args])


def test_prime_lab_opens_the_workbench_on_a_folder_a_config_or_a_run(tmp_path: Path, opened: list[Any],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "folder").mkdir()
    (tmp_path / "setup").mkdir()  # a folder named like a command opens as ./setup
    (tmp_path / "my.toml").write_text("")
    for args in ([], ["folder"], ["./setup"], ["my.toml"], ["@my.toml"], ["--run", "rl-abc"], ["folder", "--run", "x"],
                 ["open", "folder"]):
        result = lab(*args)
        assert result.exit_code == 0, (args, result.output)
    assert opened == [(None, None), (Path("folder"), None), (Path("setup"), None), (Path("my.toml"), None),
                      (Path("my.toml"), None), (None, "rl-abc"), (Path("folder"), "x"), (Path("folder"), None)]


def test_prime_lab_setup_is_the_command_not_a_folder(tmp_path: Path, opened: list[Any],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = lab("setup", "ws")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "ws" / "configs" / "rl" / "reverse-text.toml").is_file() and opened == []
    doctor = lab("doctor", "ws", "-o", "json")
    assert doctor.exit_code == 0, doctor.output
    assert json.loads(doctor.stdout)["ok"] is True and opened == []
    help_page = lab("--help")
    assert help_page.exit_code == 0 and "setup" in help_page.output and "doctor" in help_page.output
    assert opened == []
