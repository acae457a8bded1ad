"""`prime eval list | get | samples | logs | stop | delete` and `prime gepa list | get | logs | stop | delete`: each
group's verbs see its own kind of run only, and a run of another kind is an error naming the command for it.

The evaluation is a real `prime eval run` against a scripted endpoint; the RL and GEPA runs are recorded ones.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from prime_lab.runs.registry import Run, RunRegistry
from tests.envs.scripted import scripted_endpoint
from tests.support.cli import prime
from tests.workbench.lab_fixtures import recorded_run


def evaluate(cwd: Path) -> tuple[Run, list[dict[str, Any]]]:
    """gsm8k, 2 examples x 1 rollout, one at a time: the first answered right (reward 1), the second wrong (0)."""
    from prime_lab.envs import load_environment

    rows = load_environment("gsm8k", difficulty="easy").get_eval_dataset(2)
    with scripted_endpoint([f"<answer>{rows[0]['answer']}</answer>", "<answer>-1</answer>"]) as ep:
        proc = prime("eval", "run", "gsm8k", "-b", ep.base_url, "-m", "scripted", "-n", "2", "-r", "1", "-c", "1",
                     "-a", '{"difficulty": "easy"}', cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    [run] = [r for r in RunRegistry().runs() if r.read_status()["kind"] == "eval"]
    results = Path(run.status()["output_dir"]) / "results.jsonl"
    return run, [json.loads(line) for line in results.read_text().splitlines()]


def test_list_shows_only_the_groups_kind(tmp_path: Path) -> None:
    rl, gepa = recorded_run("rl-run"), recorded_run("gepa-run")
    evaluation, _ = evaluate(tmp_path)
    listed = {group: [(r["id"], r["kind"]) for r in json.loads(prime(group, "list", "-o", "json").stdout)]
              for group in ("eval", "gepa", "rl")}
    assert listed["eval"] == [(evaluation.id, "eval")]
    assert listed["gepa"] == [(gepa.id, "gepa")]
    assert sorted(listed["rl"]) == sorted([(evaluation.id, "eval"), (gepa.id, "gepa"), (rl.id, "rl")])  # every kind

    table = prime("eval", "list").stdout
    assert evaluation.id in table and "completed" in table and "scripted" in table
    assert rl.id not in table and gepa.id not in table
    assert prime("eval", "ls", "-o", "json").stdout == prime("eval", "list", "-o", "json").stdout  # the alias
    assert "gepa-run" in prime("gepa", "list").stdout.split()
    assert json.loads(prime("gepa", "list", "-n", "1", "-o", "json").stdout)[0]["id"] == gepa.id
    assert "No such option" in prime("eval", "list", "-k", "rl").stderr  # a group's list has no other kinds


def test_a_narrow_terminal_still_shows_whole_run_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    runs = [recorded_run("rl-run"), recorded_run("gepa-run")]
    monkeypatch.setenv("COLUMNS", "40")
    table = prime("rl", "list").stdout
    assert max(len(line) for line in table.splitlines()) <= 40
    assert all(run.id in table.split() for run in runs), table  # the id every other command takes


def test_empty_lists_say_so_on_stderr() -> None:
    recorded_run("rl-run")
    for group, says in (("eval", "No evaluations yet. Run one with `prime eval run"), ("gepa", "No GEPA runs yet.")):
        proc = prime(group, "list")
        assert proc.returncode == 0 and proc.stdout == "" and proc.stderr.startswith(says), proc.stderr
        assert json.loads(prime(group, "list", "-o", "json").stdout) == []


def test_eval_samples_get_and_logs_of_an_evaluation(tmp_path: Path) -> None:
    run, results = evaluate(tmp_path)
    assert [r["reward"] for r in results] == [1.0, 0.0]
    shown = prime("eval", "samples", run.id[:7])
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == f"{run.id} · gsm8k on scripted · 2 rollouts · reward mean of all 2: 0.500 (min 0.000, max 1.000)"
    for i, (row, reward) in enumerate(zip(results, ("1", "0"), strict=True), 1):
        assert f"#{i}  {row['task']}  {row['example_id']}  reward {reward}" in lines, shown.stdout
        question = [m["content"] for m in row["prompt"] if m["role"] == "user"][-1]
        assert f"    prompt      {' '.join(question.split())}"[:150] in shown.stdout
        assert f"    answer      {row['answer']}" in lines
    assert "    completion  <answer>-1</answer>" in lines

    first = prime("eval", "samples", run.id, "-n", "1")
    assert first.stdout.splitlines()[0] == (f"{run.id} · gsm8k on scripted · 1 of 2 rollouts · reward mean of the 1 "
                                            "shown: 1.000 (min 1.000, max 1.000); evaluation: 0.500 over 2 rollouts")
    assert "#2" not in first.stdout
    assert "(1 of 2 rollouts shown" in first.stderr
    assert json.loads(prime("eval", "samples", run.id, "-o", "json").stdout) == results
    assert json.loads(prime("eval", "samples", run.id, "--num", "1", "-o", "json").stdout) == results[:1]

    facts = json.loads(prime("eval", "get", run.id, "-o", "json").stdout)
    assert (facts["id"], facts["kind"], facts["state"], facts["model"]) == (run.id, "eval", "completed", "scripted")
    assert "kind         eval" in prime("eval", "get", run.id).stdout.splitlines()
    logs = prime("eval", "logs", run.id, "-c", "eval").stdout.splitlines()
    assert logs and all(" eval " in line for line in logs) and logs[-1].endswith("STATUS  completed")
    assert sum(" EVAL " in line for line in logs) == 2  # an event per rollout
    assert prime("eval", "logs", run.id, "-n", "1").stdout.count("\n") == 1  # rl logs' flags


def test_samples_of_an_evaluation_without_results_fails_cleanly() -> None:
    run = RunRegistry().create("eval", config_text="{}", resolved={}, model="m", envs=["gsm8k"])
    proc = prime("eval", "samples", run.id)
    assert proc.returncode == 1 and proc.stderr == f"Error: {run.id} has no results yet\n"


def test_a_run_of_another_kind_is_an_error_naming_its_command() -> None:
    rl = recorded_run("rl-run")
    evaluation = RunRegistry().create("eval", config_text="{}", resolved={}, model="m", envs=["gsm8k"])
    cases = [("eval", verb, rl.id, f"run {rl.id} is an RL run, not an evaluation (see `prime rl {verb} {rl.id}`)")
             for verb in ("get", "logs", "stop", "delete")]
    cases += [("eval", "samples", rl.id, f"run {rl.id} is an RL run, not an evaluation (see `prime rl get {rl.id}`)"),
              ("gepa", "get", evaluation.id,
               f"run {evaluation.id} is an evaluation, not a GEPA run (see `prime eval get {evaluation.id}`)"),
              ("gepa", "logs", rl.id[:4], f"run {rl.id} is an RL run, not a GEPA run (see `prime rl logs {rl.id}`)"),
              ("gepa", "delete", evaluation.id,
               f"run {evaluation.id} is an evaluation, not a GEPA run (see `prime eval delete {evaluation.id}`)")]
    for group, verb, run_id, says in cases:
        proc = prime(group, verb, run_id)
        assert (proc.returncode, proc.stdout, proc.stderr) == (1, "", f"Error: {says}\n"), (group, verb)
    assert rl.dir.exists() and evaluation.dir.exists()  # the refused deletes deleted nothing
    assert rl.state == "completed" and evaluation.state == "queued"  # and the refused stop stopped nothing
    assert prime("rl", "get", evaluation.id).returncode == 0  # `prime rl` verbs take runs of every kind
    missing = prime("gepa", "get", "nosuch")
    assert missing.returncode == 1 and missing.stderr.startswith("Error: no run 'nosuch'")


def test_gepa_get_logs_stop_delete() -> None:
    recorded = recorded_run("gepa-run")
    facts = json.loads(prime("gepa", "get", recorded.id, "-o", "json").stdout)
    assert (facts["kind"], facts["state"], facts["best_score"]) == ("gepa", "completed", 0.4756666666666667)
    budget = prime("gepa", "logs", recorded.id, "--search", "GEPA.BUDGET").stdout.splitlines()
    assert budget and all("GEPA.BUDGET" in line for line in budget)
    raw = [json.loads(line) for line in prime("gepa", "logs", recorded.id, "-r", "-n", "2").stdout.splitlines()]
    assert len(raw) == 2 and raw[-1]["seq"] == max(e.seq for e in recorded.event_log().events())

    queued = RunRegistry().create("gepa", config_text="", resolved={}, model="m", envs=["gsm8k"])
    stopped = prime("gepa", "stop", queued.id)
    assert stopped.returncode == 0 and stopped.stderr == f"{queued.id} stopped\n" and queued.state == "stopped"
    assert prime("gepa", "stop", recorded.id).stderr == f"{recorded.id} is already completed\n"
    assert prime("gepa", "delete", queued.id).stderr == f"Deleted {queued.id}\n" and not queued.dir.exists()
    assert [r["id"] for r in json.loads(prime("gepa", "list", "-o", "json").stdout)] == [recorded.id]


def test_eval_stop_and_delete(tmp_path: Path) -> None:
    run, _ = evaluate(tmp_path)
    assert prime("eval", "stop", run.id).stderr == f"{run.id} is already completed\n"
    assert prime("eval", "delete", run.id).returncode == 0 and not run.dir.exists()
    assert json.loads(prime("eval", "list", "-o", "json").stdout) == []
