"""`--plain`, on the root (`prime --plain ...`) and after any command: tab-separated tables, no colours, no boxes,
no progress bars, while the default output keeps them (FORCE_COLOR=1 stands in for a terminal; the progress bar of
`prime eval run` is checked in a real pseudo-terminal)."""

from __future__ import annotations

import os
import pty
import subprocess
from pathlib import Path

import pytest

from prime_lab.runs.registry import RunRegistry
from prime_lab.workbench.cli.render import when
from tests.envs.scripted import scripted_endpoint
from tests.support.cli import PRIME, prime
from tests.workbench.lab_fixtures import recorded_run

ANSI = "\x1b["
BOX = set("─│╭╮╰╯━┃┏┓┗┛═║╔╗╚╝")  # rich's panels, table borders and progress bars


@pytest.fixture(autouse=True)
def coloured(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rich colours its output as on a terminal: what --plain must turn off."""
    monkeypatch.setenv("FORCE_COLOR", "1")


def plain_text(text: str) -> bool:
    return ANSI not in text and not BOX & set(text)


def tsv(stdout: str) -> list[list[str]]:
    rows = [line.split("\t") for line in stdout.splitlines()]
    assert rows and all(len(row) == len(rows[0]) for row in rows), stdout
    return rows


def test_runs_table_is_tab_separated_under_plain_given_first_or_last() -> None:
    rl, _ = recorded_run("rl-run"), recorded_run("gepa-run")
    coloured_table = prime("rl", "list").stdout
    assert ANSI in coloured_table and "\t" not in coloured_table
    before, between, after = prime("--plain", "rl", "list"), prime("rl", "--plain", "list"), prime("rl", "list",
                                                                                                 "--plain")
    assert before.stdout == between.stdout == after.stdout and plain_text(after.stdout) and after.stderr == ""
    rows = tsv(after.stdout)
    assert rows[0] == ["ID", "STATE", "KIND", "MODEL", "ENVIRONMENTS", "STEP", "REWARD", "HEALTH", "STARTED"]
    health = rows[1:][[r[0] for r in rows[1:]].index("rl-run")][7]
    assert health == "ok" or health.startswith("warn: ")  # the RL run's, from its metrics; GEPA has none
    assert sorted(rows[1:]) == sorted([
        ["rl-run", "completed", "rl", "smollm2-135m", "primeintellect/reverse-text, primeintellect/alphabet-sort",
         "30/30", "-", health, when(1749999405.0)],  # whole: the default table cuts this row at 80 columns
        ["gepa-run", "completed", "gepa", "smollm2-135m", "primeintellect/gsm8k", "8", "-", "-",
         when(1749999405.0)]])
    gepa_only = tsv(prime("gepa", "ls", "--plain").stdout)  # no training run among them: no HEALTH column
    assert gepa_only == [[c for c in rows[0] if c != "HEALTH"], ["gepa-run", "completed", "gepa", "smollm2-135m",
                                                                 "primeintellect/gsm8k", "8", "-",
                                                                 when(1749999405.0)]]
    empty = prime("--plain", "eval", "list")
    assert empty.stdout == "" and empty.stderr.startswith("No evaluations yet.")
    assert rl.id in prime("rl", "list", "--plain", "-o", "json").stdout  # json stays json


def test_views_of_a_run_under_plain() -> None:
    run = recorded_run("rl-run")
    (run.checkpoints_dir / "step_10").mkdir(parents=True)
    (run.checkpoints_dir / "step_10" / "trainer_state.pt").write_bytes(b"x" * 10)
    (run.adapters_dir / "step_10").mkdir(parents=True)
    (run.adapters_dir / "step_10" / "adapter_config.json").write_text("{}")

    assert ANSI in prime("rl", "metrics", run.id).stdout
    metrics = tsv(prime("rl", "metrics", run.id, "--plain").stdout)
    assert plain_text(prime("rl", "metrics", run.id, "--plain").stdout)
    assert metrics[0][:2] == ["STEP", "reward/mean"] and [row[0] for row in metrics[1:]] == [str(s) for s in
                                                                                           range(1, 31)]

    assert ANSI in prime("rl", "checkpoints", run.id).stdout
    rows = tsv(prime("rl", "checkpoints", run.id, "--plain").stdout)
    assert rows[0] == ["STEP", "KIND", "SIZE", "SAVED", "PATH", ""]
    assert [(r[0], r[1], r[2], r[4], r[5]) for r in rows[1:]] == [
        ("10", "adapter", "2 B", "adapters/step_10", ""), ("10", "checkpoint", "10 B", "checkpoints/step_10",
                                                          "resumes here")]

    bar = prime("rl", "progress", run.id).stdout
    assert "[########################] 100%" in bar
    plain = prime("rl", "progress", run.id, "--plain").stdout
    assert plain.splitlines()[0] == "rl-run  completed  step 30/30  100%" and plain_text(plain)


def test_models_and_env_list_under_plain() -> None:
    assert ANSI in prime("rl", "models").stdout
    models = tsv(prime("train", "models", "--plain").stdout)
    assert models[0] == ["NAME", "PARAMS", "STATUS", "SOURCE"] and "smollm2-135m" in [r[0] for r in models]

    assert ANSI in prime("env", "list").stdout
    out = prime("env", "list", "--plain").stdout
    envs = {row[0]: row for row in tsv(out)}
    assert plain_text(out) and envs["ID"] == ["ID", "SOURCE", "API", "RUNS ON", "DESCRIPTION", "ARGS"]
    assert envs["primeintellect/gsm8k"][1:4] == ["built-in", "classic", "prime-lab"]
    assert "difficulty='medium'" in envs["primeintellect/gsm8k"][5] and envs["primeintellect/gsm8k"][5].endswith(
        "seed=0")  # whole, where the default table folds and cuts it


def test_help_and_usage_errors_under_plain() -> None:
    assert BOX & set(prime("eval", "--help").stdout)
    for args in (("--plain", "eval", "--help"), ("eval", "--help", "--plain")):
        out = prime(*args).stdout
        assert plain_text(out) and "samples" in out and "Commands:" in out, args
    own = prime("eval", "list", "--help", "--plain").stdout
    assert plain_text(own) and "Local evaluations" in own
    root = prime("--plain", "--help").stdout  # the root's help lists it (every command takes it)
    assert "--plain" in root and "tab-separated lines" in " ".join(root.split()).replace("- ", "-")
    boxed = prime("eval", "list", "-k", "rl")
    assert boxed.returncode == 2 and BOX & set(boxed.stderr)
    bare = prime("eval", "list", "-k", "rl", "--plain")
    assert bare.returncode == 2 and plain_text(bare.stderr) and "No such option: -k" in bare.stderr


def in_terminal(*args: str, cwd: Path) -> str:
    """What `prime ARGS` writes to a pseudo-terminal (stdout and stderr both)."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen([PRIME, *args], stdin=follower, stdout=follower, stderr=follower, cwd=cwd)
    os.close(follower)
    chunks = []
    try:
        while chunk := os.read(leader, 65536):
            chunks.append(chunk)
    except OSError:  # EIO: the command ended and closed the terminal
        pass
    finally:
        os.close(leader)
    assert proc.wait(timeout=120) == 0
    return b"".join(chunks).decode(errors="replace")


@pytest.mark.parametrize("command", [("eval", "run", "gsm8k", "-n", "2", "-r", "1"),
                                     ("gepa", "run", "reverse-text", "-B", "4", "-n", "2", "-N", "1")],
                         ids=["eval", "gepa"])
def test_runs_draw_progress_bars_on_a_terminal_but_not_under_plain(tmp_path: Path, command: tuple[str, ...]) -> None:
    outputs = []
    for flags in ((), ("--plain",)):
        with scripted_endpoint([]) as ep:  # every reply "(no more replies)": rewards are low, the run completes
            outputs.append(in_terminal(*command, "-b", ep.base_url, "-m", "scripted", *flags, cwd=tmp_path))
    default, plain = outputs
    assert "━" in default and ANSI in default  # rich's bar
    assert plain_text(plain) and "/4 " not in plain and "2/2" not in plain  # no bar, no count
    assert ("avg reward" if command[0] == "eval" else "best prompt: ") in plain  # the summary is all there
    assert [r.state for r in RunRegistry().runs()] == ["completed", "completed"]


def test_the_bar_goes_to_the_terminal_and_stdout_keeps_the_results(tmp_path: Path) -> None:
    """`prime eval run ... > results.txt` on a terminal: the bar is drawn on stderr, none of it lands in the file."""
    leader, follower = pty.openpty()
    with scripted_endpoint([]) as ep:
        proc = subprocess.Popen([PRIME, "eval", "run", "gsm8k", "-n", "2", "-r", "1", "-b", ep.base_url, "-m",
                                 "scripted"], stdin=follower, stdout=subprocess.PIPE, stderr=follower, cwd=tmp_path)
        os.close(follower)
        terminal = []
        try:
            while chunk := os.read(leader, 65536):
                terminal.append(chunk)
        except OSError:
            pass
        finally:
            os.close(leader)
        stdout = proc.communicate(timeout=120)[0].decode()
    assert proc.returncode == 0
    assert "━" in b"".join(terminal).decode(errors="replace")
    assert "avg reward" in stdout and "━" not in stdout and ANSI not in stdout
