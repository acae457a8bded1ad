"""Trainer throughput: tokens per second and seconds per step of the real trainer process, 1 vs 2 processes.

The trainer runs as a run runs it (`python -m prime_lab.trainer.train RUN --model-path M`, or under torchrun with
`[trainer] nproc_per_node = 2`: DDP over the LoRA adapter, gloo on a CPU, nccl on GPUs) on synthetic batches
written beforehand, so no sampler takes a core and the figure is the trainer's alone. Its own metrics give the
figures (`time/step`, `perf/train_tokens_per_s`: prompt + completion tokens over the step's forward, backward and
optimizer time); step 1 (warm-up) is left out. The CPU's cores are split evenly: one process gets them all, two get
half each. Prints both, and the ratio.

With `--gpu` (a CUDA machine): one GPU, a Qwen3-0.6B-shaped model (random init, bfloat16, vocabulary 151,936),
LoRA r=16 on every linear layer, one 16k-token sequence per micro-batch: tokens/s and MFU. MFU counts 6N + 12·L·d·T
FLOPs per token (PaLM's formula: N parameters without the input embedding, L layers, d = heads x head size, T the
sequence length) against the GPU's dense bf16 peak. Anchor: prime-rl measured 13.34k tokens/s, MFU 10.9%, on 1xH100
for that setting; our goal there is 20k tokens/s.

    .venv/bin/python bench/trainer_throughput.py [--model smollm2-135m|PATH] [--steps 5] [--batch-size 16]
                                                 [--seq-len 256] [--procs 1,2]
    .venv/bin/python bench/trainer_throughput.py --gpu [--seq-len 16384] [--steps 5] [--batch-size 4] [--procs 1]
    .venv/bin/python bench/trainer_throughput.py --activation-checkpointing [--seq-len 2048] [--micro-batch-size 2]
        (one process without and with `[trainer] activation_checkpointing`: peak memory and time per step)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
QWEN3_06B = {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
             "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
             "tie_word_embeddings": True}
PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0}  # dense
ANCHOR = "prime-rl, 1xH100, Qwen3-0.6B LoRA r16, seq 16k: 13.34k tokens/s, MFU 10.9%"


def build_qwen3_06b(dest: Path) -> Path:
    """A Qwen3-0.6B-shaped model with random weights (bfloat16); the trainer needs no tokenizer."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    if (dest / "config.json").is_file():
        return dest
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**QWEN3_06B, torch_dtype="bfloat16")).to(torch.bfloat16)
    model.save_pretrained(dest)
    return dest


def model_shape(model_dir: Path) -> dict[str, Any]:
    return json.loads((model_dir / "config.json").read_text())  # type: ignore[no-any-return]


def flops_per_token(config: dict[str, Any], seq_len: int) -> float:
    """PaLM's 6N + 12·L·d·T, N without the input embedding."""
    d, layers = config["hidden_size"], config["num_hidden_layers"]
    heads, head_dim = config["num_attention_heads"], config.get("head_dim") or d // config["num_attention_heads"]
    kv = config.get("num_key_value_heads", heads)
    per_layer = d * heads * head_dim * 2 + d * kv * head_dim * 2 + 3 * d * config["intermediate_size"]
    n = layers * per_layer + d * config["vocab_size"]  # the LM head (tied or not) is a matmul per token
    return 6.0 * n + 12.0 * layers * heads * head_dim * seq_len


def synthetic_batches(vocab: int, steps: int, batch_size: int, seq_len: int, group: int) -> list[list[Any]]:
    """`batch_size` samples of `seq_len` tokens per step, groups of `group` sharing a prompt (a quarter of the
    sequence), the rest trained on, with advantages of both signs."""
    import random

    from prime_lab.trainer.batch import Sample

    rng = random.Random(0)
    prompt_len = max(1, seq_len // 4)
    batches = []
    for _ in range(steps):
        samples = []
        for _g in range(batch_size // group):
            prompt = [rng.randrange(vocab) for _ in range(prompt_len)]
            for i in range(group):
                completion = [rng.randrange(vocab) for _ in range(seq_len - prompt_len)]
                mask = [0] * prompt_len + [1] * len(completion)
                samples.append(Sample(input_ids=prompt + completion, loss_mask=mask,
                                      advantage=1.0 if i % 2 else -1.0,
                                      sampler_logprobs=[-5.0 * m for m in mask]))
        batches.append(samples)
    return batches


def config_text(model: Path, args: argparse.Namespace, nproc: int) -> str:
    return f"""model = "{model}"
max_steps = {args.steps}
batch_size = {args.batch_size}
rollouts_per_example = {args.group}
learning_rate = 1e-5

[sampling]
max_tokens = {args.seq_len}

[[env]]
id = "primeintellect/reverse-text"

[lora]
r = 16
alpha = 32
target_modules = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

[checkpoints]
interval = 0

[trainer]
micro_batch_size = {args.micro_batch_size}
max_seq_len = {args.seq_len + 1}
device = "{'cuda' if args.gpu else 'cpu'}"
nproc_per_node = {nproc}
activation_checkpointing = {'true' if args.ac else 'false'}
"""


def measure(model: Path, batches: list[list[Any]], args: argparse.Namespace, nproc: int) -> dict[str, float]:
    """Run the trainer over the batches with `nproc` processes; its per-step figures after warm-up."""
    from prime_lab.lab.runs import RunRegistry
    from prime_lab.trainer.batch import write_batch
    from prime_lab.trainer.config import validate_rl_config
    from prime_lab.trainer.distributed import Topology, torchrun_argv

    text = config_text(model, args, nproc)
    result = validate_rl_config(text)
    if not result.ok or result.config is None:
        raise SystemExit("\n".join(p.format() for p in result.problems))
    run = RunRegistry().create("rl", config_text=text, resolved=result.config.model_dump(mode="json"))
    run.update_status(model_path=str(model))
    for step, samples in enumerate(batches, start=1):
        write_batch(run.rollouts_dir, step, samples)
    argv = ["prime_lab.trainer.train", str(run.dir), "--model-path", str(model)]
    if nproc > 1:
        argv = torchrun_argv(Topology(nproc), argv[0], argv[1:])
    env = dict(os.environ)
    if not args.gpu:
        env["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // nproc))
    done = subprocess.run([sys.executable, "-P", "-m", *argv], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the trainer ({nproc} process(es)) failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    steps = {e.step: e.data for e in run.event_log().events()
             if e.kind == "metrics" and e.source == "trainer" and e.step is not None}
    timed = [steps[k] for k in sorted(steps) if k > 1]
    return {"step_s": statistics.median(m["time/step"] for m in timed),
            "tokens_per_s": statistics.median(m["perf/train_tokens_per_s"] for m in timed),
            "steps": float(len(timed)), "peak_gib": max(m["perf/peak_memory_gib"] for m in timed)}


def compare_checkpointing(model: Path, batches: list[list[Any]], args: argparse.Namespace) -> int:
    """One process without, then with activation checkpointing: the peak memory of the trainer (on a GPU its
    tensors', on the CPU its resident size) and its seconds per step."""
    runs = {}
    for ac in (False, True):
        args.ac = ac
        runs[ac] = r = measure(model, batches, args, 1)
        print(f"  activation checkpointing {'on ' if ac else 'off'}: peak {r['peak_gib']:.2f} GiB, "
              f"{r['step_s']:.2f} s/step, {r['tokens_per_s']:,.0f} tokens/s", flush=True)
    print(f"  on vs off: {runs[True]['peak_gib'] / runs[False]['peak_gib']:.2f}x peak memory, "
          f"{runs[True]['step_s'] / runs[False]['step_s']:.2f}x time per step", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="a model preset or folder (CPU)")
    parser.add_argument("--gpu", action="store_true", help="one GPU, Qwen3-0.6B-shaped, sequence length 16k")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=None)
    parser.add_argument("--micro-batch-size", type=int, default=None)
    parser.add_argument("--procs", default=None, help="process counts to compare, e.g. 1,2")
    parser.add_argument("--activation-checkpointing", action="store_true",
                        help="compare one process without and with [trainer] activation_checkpointing: peak memory "
                             "and time per step")
    args = parser.parse_args(argv)
    args.seq_len = args.seq_len or (16384 if args.gpu else 256)
    args.batch_size = args.batch_size or (4 if args.gpu else 16)
    args.group = min(args.group, args.batch_size)
    args.micro_batch_size = args.micro_batch_size or (1 if args.gpu else 4)
    procs = [int(p) for p in (args.procs or ("1" if args.gpu else "1,2")).split(",")]

    with tempfile.TemporaryDirectory(prefix="prime-lab-bench-") as home:
        from prime_lab.lab.paths import models_dir

        os.environ.setdefault("PRIME_LAB_MODELS", str(models_dir()))  # the user's models; the runs are temporary
        os.environ["PRIME_LAB_HOME"] = home
        if args.gpu:
            import torch

            if not torch.cuda.is_available():
                raise SystemExit("--gpu needs a CUDA GPU; none is visible")
            model = build_qwen3_06b(Path(home) / "qwen3-0.6b-shaped")
            device = torch.cuda.get_device_name(0)
        else:
            from prime_lab.lab.models import resolve_model

            model = resolve_model(args.model)
            device = f"CPU, {len(os.sched_getaffinity(0))} cores"
        shape = model_shape(model)
        batches = synthetic_batches(shape["vocab_size"], args.steps, args.batch_size, args.seq_len, args.group)
        print(f"trainer throughput on {device}: {model.name}, LoRA r16 on every linear layer, {args.batch_size} "
              f"sequences of {args.seq_len} tokens per step (groups of {args.group} share a prompt), micro-batch "
              f"{args.micro_batch_size}, {args.steps} steps (the first is warm-up)", flush=True)
        if args.activation_checkpointing:
            return compare_checkpointing(model, batches, args)
        args.ac = False
        results = {}
        for nproc in procs:
            results[nproc] = r = measure(model, batches, args, nproc)
            line = (f"  {nproc} process(es): {r['tokens_per_s']:,.0f} tokens/s, {r['step_s']:.2f} s/step "
                    f"(median of {r['steps']:.0f} steps)")
            if args.gpu:
                peak = next((v for k, v in PEAK_BF16_TFLOPS.items() if k in device), None)
                achieved = r["tokens_per_s"] * flops_per_token(shape, args.seq_len) / 1e12
                line += f", {achieved:,.0f} TFLOP/s" + (f", MFU {100 * achieved / peak:.1f}%" if peak else "")
            print(line, flush=True)
        if len(results) > 1:
            base = results[procs[0]]
            for nproc in procs[1:]:
                print(f"  {nproc} vs {procs[0]}: {results[nproc]['tokens_per_s'] / base['tokens_per_s']:.2f}x "
                      "tokens/s", flush=True)
        if args.gpu:
            print(f"  anchor: {ANCHOR}; goal: 20k tokens/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
