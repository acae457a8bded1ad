"""`prime eval run --adapter / --system-prompt-file` on the tiny model, and `prime eval compare` as a user meets them.

The evaluations are real `prime eval run`s on the tiny model (the built-in sampler, the test environment tiny-chars)
where the sampler matters; `compare`'s refusals and table read folders written here. The slow test trains a 2-step
RL run and evaluates its adapter against the base model.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from prime_lab.runs.registry import Run, RunRegistry
from tests.support import cli
from tests.support.rl_runs import fixture_envs, start, wait_final, write_config

__all__ = ["fixture_envs"]  # autouse: the sampler's and the CLI's processes find tiny-chars

prime = partial(cli.prime, timeout=300)
EVAL = ("-n", "4", "-r", "2", "-t", "8", "-S", '{"seed": 1}', "-c", "4")


def evaluate(tmp_path: Path, *args: str) -> tuple[Run, dict[str, Any], list[dict[str, Any]]]:
    """`prime eval run tiny-chars ARGS` that must succeed: its run, metadata.json and results.jsonl rows."""
    before = {r.id for r in RunRegistry().runs()}
    proc = prime("eval", "run", "tiny-chars", *EVAL, *args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    [run] = [r for r in RunRegistry().runs() if r.id not in before]
    out = Path(run.status()["output_dir"])
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    return run, json.loads((out / "metadata.json").read_text()), rows


def completions(rows: list[dict[str, Any]]) -> list[str]:
    return [r["completion"][-1]["content"] for r in sorted(rows, key=lambda r: (r["example_id"],
                                                                                  r["completion"][-1]["content"]))]


def rl_run_with_an_adapter(model: Path, step: int = 2) -> Run:
    """An RL run's folder as the trainer leaves it: its base model in status.json and adapters/step_N."""
    from prime_lab.models.random_lora import build_random_lora_adapter

    run = RunRegistry().create("rl", config_text="", resolved={}, model=str(model), envs=["tiny-chars"])
    run.update_status(model_path=str(model), state="completed", step=step)
    build_random_lora_adapter(model, run.adapters_dir / f"step_{step}", seed=3, b_std=0.3)
    return run


def test_an_adapter_and_a_system_prompt_are_evaluated_and_compared(tiny_model_dir: Path, tmp_path: Path) -> None:
    trained = rl_run_with_an_adapter(tiny_model_dir)
    base_run, base_meta, base_rows = evaluate(tmp_path, "-m", str(tiny_model_dir))
    assert base_meta["policy"] is None and base_meta["system_prompt"] is None
    assert base_meta["base_model"] == str(tiny_model_dir)

    adapter_run, meta, rows = evaluate(tmp_path, "--adapter", trained.id)  # -m left out: the run's base model
    served = f"{trained.id}-step-2"
    assert meta["model"] == served and meta["base_model"] == str(tiny_model_dir)
    policy = meta["policy"]
    assert (policy["run_id"], policy["step"], policy["kind"], policy["source"]) == (trained.id, 2, "adapter",
                                                                                    "adapters/step_2")
    assert policy["path"] == str((trained.adapters_dir / "step_2").resolve())
    assert Path(adapter_run.status()["output_dir"]).parent.name == f"tiny-chars--{served}"
    # The same examples and sampling seed: what the adapter wrote is not what the base model wrote.
    assert sorted(r["example_id"] for r in rows) == sorted(r["example_id"] for r in base_rows)
    assert completions(rows) != completions(base_rows)
    assert f"loaded LoRA adapter '{served}'" in adapter_run.log_path("inference").read_text()

    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Answer in letters, nothing else.\n")
    prompt_run, prompted, prompt_rows = evaluate(tmp_path, "-m", str(tiny_model_dir),
                                                 "--system-prompt-file", str(prompt))
    assert prompted["system_prompt"] == {"text": "Answer in letters, nothing else.",
                                         "source": str(prompt.resolve()), "gepa_run": None}
    assert {r["prompt"][0]["content"] for r in prompt_rows} == {"Answer in letters, nothing else."}
    assert {r["prompt"][0]["content"] for r in base_rows} == {"Reply with letters only."}

    shown = prime("eval", "compare", base_run.id, adapter_run.id, prompt_run.status()["output_dir"])
    assert shown.returncode == 0, shown.stderr
    assert "tiny-chars · 4 examples in common" in shown.stdout
    assert f"tiny-qwen3 + {trained.id} adapters/step_2" in shown.stdout
    assert "prompt prompt.txt" in shown.stdout
    assert "B vs A:" in shown.stdout and "C vs A:" in shown.stdout
    data = json.loads(prime("eval", "compare", base_run.id, adapter_run.id, "-o", "json").stdout)
    a, b = data["evaluations"]
    assert a["mean"] == pytest.approx(base_meta["avg_reward"]) and b["mean"] == pytest.approx(meta["avg_reward"])
    [difference] = data["differences"]
    assert difference["mean"] == pytest.approx(b["mean"] - a["mean"])
    assert difference["low"] <= difference["mean"] <= difference["high"]
    assert len(data["examples"]) == 4 and data["resamples"] == 10_000


def test_full_fine_tuning_weights_and_an_sft_runs_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    from prime_lab.models import build_tiny_model

    full = RunRegistry().create("rl", config_text="", resolved={}, model=str(tiny_model_dir))
    full.update_status(model_path=str(tiny_model_dir), state="completed")
    weights = build_tiny_model(full.dir / "weights" / "step_3", seed=5)
    for tokenizer_file in weights.glob("*token*"):  # the trainer publishes weights without a tokenizer
        tokenizer_file.unlink()
    weight_run, meta, weight_rows = evaluate(tmp_path, "--adapter", f"{full.id}:3")
    assert (meta["policy"]["kind"], meta["policy"]["source"]) == ("weights", "weights/step_3")
    assert meta["model"] == f"{full.id}-step-3"
    assert f"loaded full weights from {weights.resolve()}" in weight_run.log_path("inference").read_text()

    sft = RunRegistry().create("sft", config_text="", resolved={}, model=str(tiny_model_dir))
    sft.update_status(model_path=str(tiny_model_dir), state="completed")
    build_tiny_model(sft.model_dir, seed=6)
    _, sft_meta, sft_rows = evaluate(tmp_path, "-m", str(tiny_model_dir), "--adapter", sft.id)
    assert (sft_meta["policy"]["kind"], sft_meta["policy"]["step"]) == ("model", None)
    assert sft_meta["model"] == f"{sft.id}-model"
    assert completions(weight_rows) != completions(sft_rows)  # two different policies were served


def test_a_base_model_other_than_the_runs_is_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    trained = rl_run_with_an_adapter(tiny_model_dir)
    other = tmp_path / "other-model"
    other.mkdir()
    (other / "config.json").write_text("{}")
    proc = prime("eval", "run", "tiny-chars", "-m", str(other), "--adapter", trained.id, cwd=tmp_path)
    assert proc.returncode == 1
    assert f"-m {other} is not the model {trained.id} was trained from ({tiny_model_dir}" in proc.stderr
    assert "Leave -m out" in proc.stderr
    missing = prime("eval", "run", "tiny-chars", "--adapter", f"{trained.id}:9", cwd=tmp_path)
    assert missing.returncode == 1 and "has no policy of step 9; steps it kept: 2" in missing.stderr
    with_b = prime("eval", "run", "tiny-chars", "-b", "http://127.0.0.1:1/v1", "--adapter", trained.id, cwd=tmp_path)
    assert with_b.returncode == 1 and "leave out -b" in with_b.stderr
    gepa = RunRegistry().create("gepa", config_text="", resolved={})
    no_prompt = prime("eval", "run", "tiny-chars", "--system-prompt-file", gepa.id, cwd=tmp_path)
    assert no_prompt.returncode == 1 and f"GEPA run {gepa.id} has no best prompt yet" in no_prompt.stderr
    assert not [r for r in RunRegistry().runs() if r.read_status().get("kind") == "eval"]  # nothing was started


def write_evaluation(folder: Path, env: str, rewards: dict[int, float]) -> Path:
    folder.mkdir(parents=True)
    rows = [{"example_id": i, "task": env, "reward": r, "error": None,
             "prompt": [{"role": "user", "content": f"Question {i}?"}]} for i, r in rewards.items()]
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "metadata.json").write_text(json.dumps({"env_id": env, "env_args": {}, "model": "m", "run_id": None}))
    return folder


def test_compare_prints_the_table_and_refuses_what_does_not_compare(tmp_path: Path) -> None:
    a = write_evaluation(tmp_path / "a", "gsm8k", {i: 0.0 for i in range(6)})
    b = write_evaluation(tmp_path / "b", "gsm8k", {**{i: 1.0 for i in range(6)}, 6: 1.0})
    shown = prime("eval", "compare", str(a), str(b))
    assert shown.returncode == 0, shown.stderr
    assert "+1.000 [+1.000, +1.000]" in shown.stdout and "B vs A: +1.000 better" in shown.stdout
    assert "example 0: 0.000 -> 1.000 (+1.000)  Question 0?" in shown.stdout
    assert "Note: compared the 6 examples every evaluation has; left out: 1 of B's 7" in shown.stderr
    other = write_evaluation(tmp_path / "c", "wordle", {0: 1.0})
    refused = prime("eval", "compare", str(a), str(other))
    assert refused.returncode == 1
    assert f"different environments: {a} (gsm8k), {other} (wordle)" in refused.stderr
    alone = prime("eval", "compare", str(a))
    assert alone.returncode == 1 and "two evaluations or more" in alone.stderr
    rl = RunRegistry().create("rl", config_text="", resolved={})
    not_eval = prime("eval", "compare", str(a), rl.id)
    assert not_eval.returncode == 1 and f"prime eval run ENV --adapter {rl.id}" in not_eval.stderr


@pytest.mark.slow
def test_a_trained_rl_runs_adapter_against_its_base_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    run = start(write_config(tmp_path / "rl.toml", tiny_model_dir, steps=2))
    assert wait_final(run, timeout=600)["state"] == "completed"
    base_run, base_meta, base_rows = evaluate(tmp_path, "-m", str(tiny_model_dir))
    adapter_run, meta, rows = evaluate(tmp_path, "--adapter", run.id)
    assert meta["policy"]["run_id"] == run.id and meta["policy"]["step"] == 2
    assert meta["model"] == f"{run.id}-step-2" and meta["base_model"] == str(tiny_model_dir)
    assert completions(rows) != completions(base_rows)
    shown = prime("eval", "compare", base_run.id, adapter_run.id)
    assert shown.returncode == 0, shown.stderr
    summary = [line for line in shown.stdout.splitlines() if line.startswith(("A ", "B "))]
    assert f"{base_meta['avg_reward']:.3f}" in summary[0] and f"{meta['avg_reward']:.3f}" in summary[1]
    assert "[" in summary[1] and "]" in summary[1]  # B's difference to A with its interval
