"""`prime sft run` end to end on a tiny model: the loss falls, validation is logged, the merged model equals the
trained adapter, an RL run starts from the SFT run's id, a kill -9 and `prime sft restart` resume exactly, and two
trainer processes (torchrun, DDP) train as one."""

from __future__ import annotations

import json
import math
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from prime_lab.runs.events import final_timeline
from prime_lab.runs.registry import Run
from tests.support.rl_runs import fixture_envs, logs, metrics, prime, start, wait_final, wait_step, write_config
from tests.support.sft_runs import start_sft, write_dataset, write_sft_config

pytestmark = pytest.mark.slow
__all__ = ["fixture_envs"]  # autouse: the RL run's processes find the tiny-chars environment

STEPS = 8


def losses(run: Run) -> dict[int, float]:
    return {step: m["loss/mean"] for step, m in metrics(run, "trainer").items() if "loss/mean" in m}


@dataclass(frozen=True)
class Uninterrupted:
    """The module's one uninterrupted SFT run (`STEPS` steps, a checkpoint every 2, validation every 4, W&B
    offline), in a PRIME_LAB_HOME of its own: `home`, and `data`, the dataset it trained on."""

    run: Run
    home: Path
    data: Path


@pytest.fixture(scope="module")
def uninterrupted(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Uninterrupted:
    """The run the first test checks whole, and the reference the kill -9 and two-process tests compare their
    losses with, step for step (each built its own reference run before: two trainer start-ups more, the cost of
    an SFT run of a tiny model). Its learning rate is constant (no warmup) and validation takes no training state,
    so its steps are those of any run of its config with fewer steps; [wandb] only mirrors the events."""
    root = tmp_path_factory.mktemp("uninterrupted")
    home = root / "prime-lab-home"
    home.mkdir()
    data = write_dataset(root / "chats.jsonl")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PRIME_LAB_HOME", str(home))
        env.setenv("WANDB_MODE", "offline")
        env.delenv("WANDB_API_KEY", raising=False)
        config = write_sft_config(root / "sft.toml", tiny_model_dir, data, steps=STEPS,
                                  extra='[wandb]\nproject = "sft-test"\n')
        run = start_sft(config, "--name", "warm-up")
        status = wait_final(run)
    assert status["state"] == "completed", status.get("reason", "") + logs(run)
    return Uninterrupted(run, home, data)


def test_sft_trains_validates_and_its_model_starts_an_rl_run(tiny_model_dir: Path, uninterrupted: Uninterrupted,
                                                              tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = uninterrupted.run
    monkeypatch.setenv("PRIME_LAB_HOME", str(uninterrupted.home))  # the CLI's views below find the run there
    # the W&B mirror (offline) holds every step, released as the trainer moves on
    mirrored = json.loads((run.dir / "wandb" / "run.json").read_text())
    assert mirrored["logged"] == 8 and list((run.dir / "wandb").rglob("*.wandb")), logs(run)

    by_step = metrics(run, "trainer")
    loss = losses(run)
    assert sorted(loss) == list(range(1, 9))
    assert sum(loss[k] for k in (7, 8)) < sum(loss[k] for k in (1, 2)) - 0.2, loss  # the loss falls
    for step in loss:
        m = by_step[step]
        assert m["loss/perplexity"] == pytest.approx(math.exp(m["loss/mean"]), rel=1e-6)
        assert m["progress/num_tokens"] > 0 and m["train/loss_tokens"] > 0
    tokens = [by_step[k]["progress/num_tokens"] for k in sorted(loss)]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
    assert {k for k, m in by_step.items() if "val/loss" in m} == {4, 8}
    assert by_step[8]["val/loss"] < by_step[4]["val/loss"] + 0.5 and math.isfinite(by_step[8]["val/perplexity"])

    # the model folder: the adapter merged in, the tokenizer beside it; it scores as the adapter does
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert (run.model_dir / "config.json").is_file() and list(run.model_dir.glob("*.safetensors"))
    tokenizer = AutoTokenizer.from_pretrained(run.model_dir)
    ids = torch.tensor([tokenizer("Reverse it. abcd")["input_ids"]])
    merged = AutoModelForCausalLM.from_pretrained(run.model_dir).eval()
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                                        run.adapters_dir / "step_8").eval()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    with torch.no_grad():
        got, want, untrained = (m(input_ids=ids).logits for m in (merged, adapted, base))
    assert torch.allclose(got, want, atol=1e-4) and not torch.allclose(got, untrained, atol=1e-3)

    # the CLI's views of the run
    listed = prime("sft", "list", "-o", "json")
    assert listed.returncode == 0 and [r["id"] for r in json.loads(listed.stdout)] == [run.id]
    table = prime("sft", "metrics", run.id)
    assert table.returncode == 0 and "loss/mean" in table.stdout, table.stdout
    assert "model" in json.loads(prime("sft", "get", run.id, "-o", "json").stdout)["paths"]

    # eval and GEPA take the SFT run's id as their model (a local sampler serves its model folder)
    evaluated = prime("eval", "run", "tiny-chars", "-m", run.id, "-n", "2", "-r", "1", "-t", "4", "-o",
                      str(tmp_path / "eval"))
    assert evaluated.returncode == 0, evaluated.stderr
    assert str(run.model_dir.resolve()) in evaluated.stderr
    assert json.loads((tmp_path / "eval" / "metadata.json").read_text())["model"] == run.id
    optimized = prime("gepa", "run", "tiny-chars", "-m", run.id, "-B", "6", "-n", "2", "-N", "2", "-t", "4",
                      "--minibatch-size", "1", "-o", str(tmp_path / "gepa"))
    assert optimized.returncode == 0, optimized.stderr
    assert (tmp_path / "gepa" / "gepa" / "best_prompt.txt").is_file()

    # SFT -> RL in one step: the RL config names the SFT run (by id here; by its --name works the same)
    for i, model in enumerate((run.id, "warm-up")):
        config = write_config(tmp_path / f"rl{i}.toml", tiny_model_dir, steps=2)
        config.write_text(config.read_text().replace(f'model = "{tiny_model_dir}"', f'model = "{model}"'))
        rl = start(config)
        rl_status = wait_final(rl)
        assert rl_status["state"] == "completed", rl_status.get("reason", "") + logs(rl)
        assert rl_status["model_path"] == str(run.model_dir.resolve())
        assert rl_status["model"] == model


def test_kill_9_and_restart_resume_where_the_checkpoint_was(tiny_model_dir: Path, uninterrupted: Uninterrupted,
                                                            tmp_path: Path) -> None:
    """Killed after step 3 (checkpoint at 2), restarted: steps 3.. train again from the checkpoint's data position,
    optimizer and RNG, so every step's loss equals an uninterrupted run's (the module's, of the same config)."""
    config = write_sft_config(tmp_path / "sft.toml", tiny_model_dir, uninterrupted.data, steps=STEPS,
                              checkpoint_interval=2)
    run = start_sft(config)
    wait_step(run, 3, timeout=180)
    os.killpg(run.read_status()["pgid"], signal.SIGKILL)
    deadline = time.monotonic() + 15
    while run.status().get("state") != "failed":
        assert time.monotonic() < deadline, run.status()
        time.sleep(0.2)
    assert "prime sft restart" in str(run.status().get("reason"))
    restarted = prime("sft", "restart", run.id)
    assert restarted.returncode == 0, restarted.stderr
    status = wait_final(run)
    assert status["state"] == "completed", status.get("reason", "") + logs(run)

    timeline = [e for e in final_timeline(run.event_log().events()) if e.kind == "metrics" and e.source == "trainer"
                and "loss/mean" in e.data]
    steps = [int(e.step or 0) for e in timeline]  # a metrics event without a step fails the range below
    assert steps == sorted(set(steps)) == list(range(1, STEPS + 1))
    assert max(e.attempt for e in timeline) == 2
    want = losses(uninterrupted.run)
    got = {e.step: e.data["loss/mean"] for e in timeline}
    assert got == pytest.approx(want, abs=1e-5), (got, want)
    assert (run.model_dir / "config.json").is_file()


def test_two_trainer_processes_train_as_one(tiny_model_dir: Path, uninterrupted: Uninterrupted,
                                            tmp_path: Path) -> None:
    """Two ranks train steps 1 and 2 as one process does: the module's run, of the same config but its steps."""
    two = start_sft(write_sft_config(tmp_path / "two.toml", tiny_model_dir, uninterrupted.data, steps=2,
                                     extra="[trainer]\nnproc_per_node = 2\n"))
    assert wait_final(two, timeout=400)["state"] == "completed", logs(two)
    a, b = metrics(uninterrupted.run, "trainer"), metrics(two, "trainer")
    for step in (1, 2):
        for key in ("loss/mean", "optim/grad_norm", "progress/num_tokens"):
            assert b[step][key] == pytest.approx(a[step][key], rel=1e-4), (step, key)
    assert "2 ranks" in (two.logs_dir / "trainer.log").read_text() or "torchrun" in logs(two)


def test_full_fine_tuning_writes_the_trained_weights(tiny_model_dir: Path, tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "chats.jsonl")
    config = write_sft_config(tmp_path / "sft.toml", tiny_model_dir, data, steps=2, lr=1e-3)
    config.write_text(config.read_text().replace("[lora]\n", "[lora]\nenabled = false\n"))
    run = start_sft(config)
    assert wait_final(run)["state"] == "completed", logs(run)
    import torch
    from safetensors.torch import load_file

    trained = load_file(next(run.model_dir.glob("*.safetensors")))
    base = load_file(next(tiny_model_dir.glob("*.safetensors")))
    assert trained.keys() == base.keys()
    moved = [k for k in base if not torch.equal(trained[k].to(base[k].dtype), base[k])]
    assert len(moved) > len(base) // 2  # every weight trains, not an adapter
    assert losses(run)[2] < losses(run)[1]
