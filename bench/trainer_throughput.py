"""Trainer throughput: tokens per second, seconds per step and peak memory of the real trainer process, against a
plain transformers + peft GRPO loop on a GPU, between its own settings on a CPU.

Ours runs as a run runs it (`python -m prime_lab.trainer.train RUN --model-path M`, or under torchrun with
`[trainer] nproc_per_node = 2`) on synthetic batches written beforehand, so no sampler takes a device and the figure
is the trainer's alone. Its own metrics give the figures (`time/step`, `perf/train_tokens_per_s`: prompt + completion
tokens of each sample over the step's forward, backward and optimizer time, `perf/peak_memory_gib`); step 1
(warm-up) is left out (medians of the rest). Peak memory is torch.cuda.max_memory_allocated on a GPU, the process's
peak resident size (ru_maxrss) on a CPU.

`--gpu` (one CUDA GPU; a Qwen3-0.6B-shaped model, random init, bfloat16, LoRA r16 on every linear layer): ours
against a PEER, a plain transformers + peft loop computing TRL's GRPO loss on the same card, in a process of its
own (`attn_implementation="sdpa"`, [micro-batch, seq] batches with prompts left- and completions right-padded,
`logits_to_keep` for the completion, logits divided by the temperature, TRL's selective log-softmax row by row,
PPO-clipped ratio (0.2) against the sampler's logprobs, token-level loss over the step's completion tokens, AdamW,
gradients clipped at 1.0). Its tokens are the non-pad prompt + completion tokens it trained on, as ours counts them.
Shapes (`--shapes`, default all):
  long        4 sequences of 16,384 tokens a step (a quarter prompt), one a micro-batch (ours: micro_batch_size 1)
  rl          64 x 2,048 tokens, groups of 8 sharing a 512-token prompt (ours: its GPU defaults, rows filled to the
              token budget; peer: micro-batches of 8, [8, 2048])
  rl-varying  as rl with completion lengths drawn from 256-1,536 (seeded); the peer pads each micro-batch to its
              longest
  long-ac     long with ours under `[trainer] activation_checkpointing = true` (the peer as in long)
Each prints ours / peer (tokens/s and peak memory) beside its goal, and MFU by two counts of FLOPs per token:
prime-rl's (src/prime_rl/trainer/perf.py, so figures read against its published table: 4 x the matmul weights a
token passes (frozen: forward and input gradient) + 6 x the LoRA weights + 12 x layers x hidden size x sequence
length for attention, against the card's dense bf16 peak, 989 TFLOP/s on an H100/H200 SXM) and PaLM's (6N + 12·L·d·T,
N without the input embedding, d = heads x head size). T is the token-weighted mean sample length.

CPU modes (SmolLM2 by default): 1 vs 2 processes (the cores split evenly; DDP over the adapter, gloo), without and
with activation checkpointing, and `--lm-head`: the trainer before the chunked LM head (the dense head, [tokens,
vocabulary] float32 tensors, rows of 4,096 tokens), the chunked head alone, and the defaults now (the chunked head,
the CPU's smaller rows) at 4 x 2,048 tokens (groups of 4 sharing a 512-token prompt), temperature 0.7, top_p 0.9.

    .venv/bin/python bench/trainer_throughput.py [--model smollm2-135m|PATH] [--steps 5] [--batch-size 16]
                                                 [--seq-len 256] [--procs 1,2]
    .venv/bin/python bench/trainer_throughput.py --activation-checkpointing [--seq-len 2048] [--micro-batch-size 2]
    .venv/bin/python bench/trainer_throughput.py --lm-head [--steps 3]
    .venv/bin/python bench/trainer_throughput.py --gpu [--shapes long,rl,rl-varying,long-ac] [--steps 5] [--json PATH]
(`--tiny` runs the --gpu flow with a 2-layer model and 256-512-token sequences, on the CPU unless --gpu is given, one
CPU thread a side there: a check of the code, not a figure.)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
QWEN3_06B = {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
             "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
             "tie_word_embeddings": True}
TINY_QWEN3 = {"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 4096, "max_position_embeddings": 4096,
              "tie_word_embeddings": True}
LORA_R, LORA_ALPHA = 16, 32
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LEARNING_RATE = 1e-5
TEMPERATURE = 0.7  # both sides divide the logits by it (no top-p: TRL's loss has none)
CLIP_EPSILON = 0.2
ANCHOR = "prime-rl, 1xH100, Qwen3-0.6B LoRA r16, seq 16k: 13.34k tokens/s, MFU 10.9% (its count)"


@dataclass(frozen=True)
class Shape:
    """What a step trains on: `samples` sequences of up to `seq_len` tokens, each group of `group` sharing a prompt
    of `prompt_len` tokens, completions of seq_len - prompt_len tokens or drawn from `completion_range`."""
    name: str
    samples: int
    seq_len: int
    prompt_len: int
    group: int
    completion_range: tuple[int, int] | None = None
    peer_micro_batch: int = 1
    ours: dict[str, Any] = field(default_factory=dict)  # ours' [trainer] settings beyond its defaults
    what: str = ""
    goal_speed: float | None = None  # ours / peer tokens/s at least
    goal_memory: float | None = None  # ours / peer peak memory at most
    goal_peak_gib: float | None = None  # ours' peak memory at most

    def peer_key(self) -> str:
        """The peer's run depends on these only (long-ac reuses long's)."""
        return json.dumps([self.samples, self.seq_len, self.prompt_len, self.group, self.completion_range,
                           self.peer_micro_batch])


def peer_shapes(tiny: bool) -> dict[str, Shape]:
    long_len, rl = (512, (8, 256, 64, 4, (32, 192))) if tiny else (16384, (64, 2048, 512, 8, (256, 1536)))
    samples, seq, prompt, group, lengths = rl
    long = Shape("long", 4, long_len, long_len // 4, 4, ours={"micro_batch_size": 1},
                 what=f"4 sequences of {long_len:,} tokens a step, one a micro-batch", goal_speed=1.0, goal_memory=0.35)
    rl_fixed = Shape("rl", samples, seq, prompt, group, peer_micro_batch=group, goal_speed=1.15,
                     what=f"{samples} x {seq:,} tokens, groups of {group} sharing a {prompt}-token prompt")
    return {
        "long": long,
        "rl": rl_fixed,
        "rl-varying": Shape("rl-varying", samples, seq, prompt, group, lengths, group, goal_speed=1.5,
                            what=f"{samples} sequences, groups of {group} sharing a {prompt}-token prompt, "
                                 f"completions of {lengths[0]}-{lengths[1]} tokens (seeded)"),
        "long-ac": Shape("long-ac", 4, long_len, long_len // 4, 4,
                         ours={"micro_batch_size": 1, "activation_checkpointing": True}, goal_peak_gib=8.0,
                         what=long.what + ", ours with activation checkpointing"),
    }


def shape_batches(shape: Shape, vocab: int, steps: int, seed: int = 0) -> list[list[Any]]:
    """`steps` batches of random tokens in `shape`, advantages of both signs, the sampler's logprobs at -ln(vocab)
    (about what a random-init model gives any token, so the importance ratios stay near 1)."""
    from prime_lab.trainer.batch import Sample

    rng = random.Random(seed)
    sampler_logprob = -math.log(vocab)
    batches = []
    for _ in range(steps):
        samples = []
        prompt: list[int] = []
        for i in range(shape.samples):
            if i % shape.group == 0:
                prompt = [rng.randrange(vocab) for _ in range(shape.prompt_len)]
            n = rng.randint(*shape.completion_range) if shape.completion_range else shape.seq_len - shape.prompt_len
            mask = [0] * shape.prompt_len + [1] * n
            samples.append(Sample(input_ids=prompt + [rng.randrange(vocab) for _ in range(n)], loss_mask=mask,
                                  advantage=1.0 if i % 2 else -1.0,
                                  sampler_logprobs=[sampler_logprob * m for m in mask]))
        batches.append(samples)
    return batches


# --- the model and its FLOPs ---------------------------------------------------------------------------------------

def build_qwen3(dest: Path, shape: dict[str, Any]) -> Path:
    """A Qwen3-shaped model with random weights (bfloat16); the trainer needs no tokenizer."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    if (dest / "config.json").is_file():
        return dest
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**shape))
    model.bfloat16().save_pretrained(dest)
    return dest


def model_shape(model_dir: Path) -> dict[str, Any]:
    return json.loads((model_dir / "config.json").read_text())  # type: ignore[no-any-return]


def _dims(config: dict[str, Any]) -> tuple[int, int, int, int, int, int]:
    d, heads = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or d // heads
    return d, config["num_hidden_layers"], heads, config.get("num_key_value_heads", heads), head_dim, \
        config["intermediate_size"]


def matmul_weights(config: dict[str, Any]) -> int:
    """Weights a token goes through in matmuls: every layer's attention and MLP projections, and the LM head (tied
    or not); the input embedding is a lookup."""
    d, layers, heads, kv, head_dim, ffn = _dims(config)
    per_layer = 2 * d * heads * head_dim + 2 * d * kv * head_dim + 3 * d * ffn
    return layers * per_layer + d * config["vocab_size"]


def lora_weights(config: dict[str, Any], r: int = LORA_R) -> int:
    """LoRA's A and B of rank r on q, k, v, o, gate, up and down of every layer: r x (inputs + outputs) each."""
    d, layers, heads, kv, head_dim, ffn = _dims(config)
    q, k = d + heads * head_dim, d + kv * head_dim
    return layers * r * (2 * q + 2 * k + 3 * (d + ffn))


def flops_per_token(config: dict[str, Any], seq_len: float) -> float:
    """PaLM's 6N + 12·L·d·T, N without the input embedding, d = heads x head size."""
    d, layers, heads, _, head_dim, _ = _dims(config)
    return 6.0 * matmul_weights(config) + 12.0 * layers * heads * head_dim * seq_len


def prime_rl_flops_per_token(config: dict[str, Any], seq_len: float, lora_r: int = LORA_R) -> float:
    """prime-rl's count for LoRA: a frozen weight costs 4 FLOPs a token (forward, input gradient), an adapter weight 6
    (and its weight gradient), attention 12 x layers x heads x (hidden size / heads) x T (its head size is hidden /
    heads, whatever the model's head_dim)."""
    d, layers, heads, _, _, _ = _dims(config)
    return 4.0 * matmul_weights(config) + 6.0 * lora_weights(config, lora_r) + 12.0 * layers * heads * (d // heads) \
        * seq_len


def peak_bf16_tflops(device_name: str) -> float | None:
    """The card's dense bfloat16 peak from its datasheet; None where unknown (a CPU)."""
    if "H100" in device_name or "H200" in device_name:
        return 835.0 if "NVL" in device_name else 756.0 if "PCIe" in device_name else 989.0
    return next((v for k, v in {"A100": 312.0, "L40S": 362.0, "B200": 2250.0}.items() if k in device_name), None)


def mean_sample_len(batches: list[list[Any]]) -> float:
    """Token-weighted mean sample length (sum of len^2 over sum of len): attention FLOPs per token grow with it."""
    lengths = [len(s.input_ids) for samples in batches for s in samples]
    return sum(n * n for n in lengths) / sum(lengths)


def mfu_text(config: dict[str, Any], tokens_per_s: float, seq_len: float, device_name: str) -> str:
    """The FLOP/s the tokens/s stand for by each count, and MFU against the card's peak where it is known."""
    peak = peak_bf16_tflops(device_name)
    parts = []
    for who, per_token in (("prime-rl's", prime_rl_flops_per_token(config, seq_len)),
                           ("PaLM's", flops_per_token(config, seq_len))):
        tflops = tokens_per_s * per_token / 1e12
        achieved = f"{tflops:,.1f} TFLOP/s" if tflops >= 1 else f"{tflops:.2g} TFLOP/s"
        parts.append(f"MFU {100 * tflops / peak:.1f}% by {who} count ({achieved})" if peak
                     else f"{achieved} by {who} count")
    return ", ".join(parts) + ("" if peak else " (no MFU: no bf16 peak known for this device)")


# --- ours: the trainer process ---------------------------------------------------------------------------------------

@dataclass
class OursSettings:
    steps: int
    batch_size: int
    group: int
    seq_len: int
    device: str = "cpu"
    nproc: int = 1
    threads: int | None = None  # CPU threads a process; None: the cores split evenly between the processes
    trainer: dict[str, Any] = field(default_factory=dict)  # [trainer] settings beyond the bench's own
    sampling: dict[str, Any] = field(default_factory=dict)


def toml_value(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else json.dumps(value)


def config_text(model: Path, s: OursSettings) -> str:
    trainer = {"max_seq_len": s.seq_len + 1, "device": s.device, "nproc_per_node": s.nproc, **s.trainer}
    sampling = {"max_tokens": s.seq_len, **s.sampling}
    return f"""model = "{model}"
max_steps = {s.steps}
batch_size = {s.batch_size}
rollouts_per_example = {s.group}
learning_rate = {LEARNING_RATE}

[sampling]
{chr(10).join(f"{k} = {toml_value(v)}" for k, v in sampling.items())}

[[env]]
id = "primeintellect/reverse-text"

[lora]
r = {LORA_R}
alpha = {LORA_ALPHA}
target_modules = {json.dumps(LORA_TARGETS)}

[checkpoints]
interval = 0

[trainer]
{chr(10).join(f"{k} = {toml_value(v)}" for k, v in trainer.items())}
"""


class SideFailed(RuntimeError):
    """One side of a comparison did not finish (its output's tail in the message)."""


def measure(model: Path, batches: list[list[Any]], s: OursSettings) -> dict[str, float]:
    """Run the trainer over the batches; its per-step figures after warm-up."""
    from prime_lab.runs.registry import RunRegistry
    from prime_lab.trainer.batch import write_batch
    from prime_lab.trainer.config import validate_rl_config
    from prime_lab.trainer.distributed import Topology, torchrun_argv

    text = config_text(model, s)
    result = validate_rl_config(text)
    if not result.ok or result.config is None:
        raise SideFailed("ours: the config does not validate:\n" + "\n".join(p.format() for p in result.problems))
    run = RunRegistry().create("rl", config_text=text, resolved=result.config.model_dump(mode="json"))
    run.update_status(model_path=str(model))
    for step, samples in enumerate(batches, start=1):
        write_batch(run.rollouts_dir, step, samples)
    argv = ["prime_lab.trainer.train", str(run.dir), "--model-path", str(model)]
    if s.nproc > 1:
        argv = torchrun_argv(Topology(s.nproc), argv[0], argv[1:])
    env = dict(os.environ)
    if s.device == "cpu":
        env["OMP_NUM_THREADS"] = str(s.threads or max(1, len(os.sched_getaffinity(0)) // s.nproc))
    done = subprocess.run([sys.executable, "-P", "-m", *argv], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SideFailed(f"ours ({s.nproc} process(es)) failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    steps = {e.step: e.data for e in run.event_log().events()
             if e.kind == "metrics" and e.source == "trainer" and e.step is not None}
    timed = [steps[k] for k in sorted(steps) if k > 1]
    figures = {"step_s": statistics.median(m["time/step"] for m in timed),
               "tokens_per_s": statistics.median(m["perf/train_tokens_per_s"] for m in timed),
               "steps": float(len(timed)), "peak_gib": max(m["perf/peak_memory_gib"] for m in timed)}
    if 1 in steps:  # the warm-up step, kept for the record (--json): compile time shows here
        figures["first_step_s"] = steps[1]["time/step"]
    compiled = [m["time/compile"] for m in steps.values() if "time/compile" in m]
    if compiled:
        figures["compile_s"] = sum(compiled)
    return figures


# --- the peer: a plain transformers + peft GRPO loop -----------------------------------------------------------------

def padded_micro_batch(samples: list[Any], device: str) -> dict[str, Any]:
    """Samples as TRL lays them out: prompts left-padded, completions right-padded, [micro-batch, prompt + width]."""
    import torch

    prompts = [s.loss_mask.index(1) for s in samples]
    prompt_w = max(prompts)
    width = max(len(s.input_ids) - p for s, p in zip(samples, prompts, strict=True))
    ids, attention, completion_mask, old = [], [], [], []
    for s, p in zip(samples, prompts, strict=True):
        n = len(s.input_ids) - p
        left, right = prompt_w - p, width - n
        ids.append([0] * left + s.input_ids + [0] * right)
        attention.append([0] * left + [1] * len(s.input_ids) + [0] * right)
        completion_mask.append(s.loss_mask[p:] + [0] * right)
        old.append(s.sampler_logprobs[p:] + [0.0] * right)
    return {"input_ids": torch.tensor(ids, device=device), "attention_mask": torch.tensor(attention, device=device),
            "completion_mask": torch.tensor(completion_mask, dtype=torch.float32, device=device),
            "old_logprobs": torch.tensor(old, dtype=torch.float32, device=device),
            "advantages": torch.tensor([s.advantage for s in samples], dtype=torch.float32, device=device),
            "width": width}


def selective_log_softmax(logits: Any, index: Any) -> Any:
    """TRL's: the chosen token's logit gathered, less each row's logsumexp, a row at a time (so no log-softmax of
    the whole [micro-batch, width, vocabulary] block is held)."""
    import torch

    chosen = logits.gather(-1, index[..., None]).squeeze(-1)
    return chosen.float() - torch.stack([torch.logsumexp(row, dim=-1) for row in logits]).float()


def grpo_loss(logprobs: Any, old_logprobs: Any, advantages: Any, completion_mask: Any, num_tokens: int) -> Any:
    """TRL's GRPO objective, token-level: -min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A) summed over the
    completion tokens and divided by the step's completion tokens."""
    import torch

    ratio = torch.exp(logprobs - old_logprobs)
    advantage = advantages[:, None]
    per_token = -torch.min(ratio * advantage, torch.clamp(ratio, 1 - CLIP_EPSILON, 1 + CLIP_EPSILON) * advantage)
    return (per_token * completion_mask).sum() / max(1, num_tokens)


def peer_train(spec: dict[str, Any]) -> dict[str, float]:
    """The peer's steps over the shape's batches (the same ones ours trains on): its figures after warm-up."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from prime_lab.trainer.model import peak_memory_gib

    device = spec["device"]
    cuda = device.startswith("cuda")
    shape = Shape(**{**spec["shape"], "completion_range": tuple(spec["shape"]["completion_range"] or ()) or None})
    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.bfloat16 if cuda else torch.float32,
                                                attn_implementation="sdpa").to(device)
    base.config.use_cache = False
    model = get_peft_model(base, LoraConfig(r=LORA_R, lora_alpha=LORA_ALPHA, lora_dropout=0.0,
                                            target_modules=LORA_TARGETS, task_type="CAUSAL_LM", bias="none"))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=LEARNING_RATE)
    timed: list[tuple[float, int]] = []
    for samples in shape_batches(shape, base.config.vocab_size, spec["steps"]):
        if cuda:
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        completion_tokens = sum(s.num_loss_tokens for s in samples)
        for first in range(0, len(samples), shape.peer_micro_batch):
            batch = padded_micro_batch(samples[first:first + shape.peer_micro_batch], device)
            width = batch["width"]
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                           logits_to_keep=width + 1).logits[:, :-1]
            logits.div_(spec["temperature"])  # in place, as TRL's loop divides them
            logprobs = selective_log_softmax(logits, batch["input_ids"][:, -width:])
            grpo_loss(logprobs, batch["old_logprobs"], batch["advantages"], batch["completion_mask"],
                      completion_tokens).backward()
            del logits, logprobs
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        if cuda:
            torch.cuda.synchronize(device)
        timed.append((time.perf_counter() - start, sum(len(s.input_ids) for s in samples)))
    after_warmup = timed[1:]
    return {"step_s": statistics.median(t for t, _ in after_warmup),
            "tokens_per_s": statistics.median(n / t for t, n in after_warmup),
            "steps": float(len(after_warmup)), "peak_gib": peak_memory_gib(device)}


def run_peer(model: Path, shape: Shape, steps: int, device: str, threads: int | None = None) -> dict[str, float]:
    """`peer_train` in a process of its own (its own peak memory), through this script's hidden --peer option;
    `threads`: its CPU threads (None: torch's default)."""
    spec = {"model": str(model), "shape": asdict(shape), "steps": steps, "device": device, "temperature": TEMPERATURE,
            "threads": threads}
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--peer", json.dumps(spec)],
                          capture_output=True, text=True, cwd=REPO)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise SideFailed(f"the peer failed (exit {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])  # type: ignore[no-any-return]


# --- the comparisons -----------------------------------------------------------------------------------------------

def figures(r: dict[str, float]) -> str:
    return (f"{r['tokens_per_s']:,.0f} tokens/s, {r['step_s']:.2f} s/step, peak {r['peak_gib']:.2f} GiB "
            f"(median of {r['steps']:.0f} steps)")


def verdict(what: str, value: float, goal: float, at_least: bool, unit: str = "x") -> str:
    met = value >= goal if at_least else value <= goal
    return f"{what} {'>=' if at_least else '<='} {goal:g}{unit} ({'met' if met else 'NOT met'})"


def peer_layout(shape: Shape, batches: list[list[Any]]) -> str:
    """The peer's micro-batches and the share of their positions that is padding."""
    real = padded = 0
    widths = set()
    for samples in batches:
        for first in range(0, len(samples), shape.peer_micro_batch):
            group = samples[first:first + shape.peer_micro_batch]
            width = max(len(s.input_ids) for s in group)
            widths.add(width)
            real += sum(len(s.input_ids) for s in group)
            padded += width * len(group)
    seqs = f"{min(widths):,}-{max(widths):,}" if len(widths) > 1 else f"{max(widths):,}"
    return (f"micro-batches [{shape.peer_micro_batch}, {seqs}], {100 * (1 - real / padded):.0f}% of their positions "
            "padding")


def write_report(path: Path, report: dict[str, Any]) -> None:
    """`--json`: the figures so far, replaced whole after each shape (a reader never sees half a file; a run killed
    midway leaves the shapes it finished)."""
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(json.dumps(report, indent=2) + "\n")
    partial.replace(path)


def compare_with_peer(model: Path, device: str, card: str, shapes: list[Shape], steps: int,
                      report_path: Path | None = None, threads: int | None = None) -> int:
    """Each shape: ours, then the peer (run once per distinct peer shape); both figures, ours / peer and the goals.
    With `report_path`, the same figures as JSON (`--json`), rewritten after each shape. `threads`: each side's CPU
    threads (None: ours the cores, the peer torch's default)."""
    config = model_shape(model)
    peers: dict[str, dict[str, float]] = {}
    failures = 0
    report: dict[str, Any] = {"card": card, "device": device, "model": str(model), "steps": steps,
                              "model_shape": {k: config.get(k) for k in QWEN3_06B}, "shapes": {}}
    for shape in shapes:
        record: dict[str, Any] = {"what": shape.what, "ours_settings": shape.ours, "finished": False}
        report["shapes"][shape.name] = record
        batches = shape_batches(shape, config["vocab_size"], steps)
        settings = ", ".join(f"{k} = {toml_value(v)}" for k, v in shape.ours.items()) or "its defaults"
        print(f"[{card}] {shape.name}: {shape.what}; ours: {settings}; peer: {peer_layout(shape, batches)}",
              flush=True)
        seq = mean_sample_len(batches)
        try:
            ours = measure(model, batches, OursSettings(
                steps, shape.samples, shape.group, shape.seq_len, device=device, threads=threads, trainer=shape.ours,
                sampling={"temperature": TEMPERATURE}))
            print(f"  ours: {figures(ours)}\n        {mfu_text(config, ours['tokens_per_s'], seq, card)}", flush=True)
            if shape.peer_key() not in peers:
                peers[shape.peer_key()] = run_peer(model, shape, steps, device, threads)
            peer = peers[shape.peer_key()]
            print(f"  peer: {figures(peer)}\n        {mfu_text(config, peer['tokens_per_s'], seq, card)}", flush=True)
        except SideFailed as failed:
            failures += 1
            print(f"  {shape.name} failed: {failed}", flush=True)
            record["error"] = str(failed)[-4000:]
            if report_path:
                write_report(report_path, report)
            continue
        speed, memory = ours["tokens_per_s"] / peer["tokens_per_s"], ours["peak_gib"] / peer["peak_gib"]
        record.update(finished=True, ours=ours, peer=peer, speed_ratio=speed, memory_ratio=memory,
                      mean_sample_len=seq)
        goals = [verdict("tokens/s", speed, shape.goal_speed, True)] if shape.goal_speed else []
        goals += [verdict("peak memory", memory, shape.goal_memory, False)] if shape.goal_memory else []
        if shape.goal_peak_gib:
            goals.append(verdict("ours' peak", ours["peak_gib"], shape.goal_peak_gib, False, " GiB"))
        print(f"  ours / peer: {speed:.2f}x tokens/s, {memory:.2f}x peak memory (goal: {'; '.join(goals)})",
              flush=True)
        if report_path:
            write_report(report_path, report)
    return 1 if failures else 0


def compare_procs(model: Path, batches: list[list[Any]], base: OursSettings, procs: list[int]) -> int:
    results = {}
    for nproc in procs:
        base.nproc = nproc
        results[nproc] = r = measure(model, batches, base)
        print(f"  {nproc} process(es): {r['tokens_per_s']:,.0f} tokens/s, {r['step_s']:.2f} s/step "
              f"(median of {r['steps']:.0f} steps)", flush=True)
    for nproc in procs[1:]:
        print(f"  {nproc} vs {procs[0]}: {results[nproc]['tokens_per_s'] / results[procs[0]]['tokens_per_s']:.2f}x "
              "tokens/s", flush=True)
    return 0


def compare_settings(model: Path, batches: list[list[Any]], base: OursSettings,
                     sides: list[tuple[str, dict[str, Any]]]) -> list[dict[str, float]]:
    """One process under each side's [trainer] settings: peak memory and time per step of each."""
    runs, own = [], dict(base.trainer)
    for label, trainer in sides:
        base.trainer = {**own, **trainer}
        runs.append(r := measure(model, batches, base))
        print(f"  {label}: peak {r['peak_gib']:.2f} GiB, {r['step_s']:.2f} s/step, {r['tokens_per_s']:,.0f} "
              "tokens/s", flush=True)
    return runs


def compare_checkpointing(model: Path, batches: list[list[Any]], base: OursSettings) -> int:
    off, on = compare_settings(model, batches, base, [("activation checkpointing off", {}),
                                                      ("activation checkpointing on ", {"activation_checkpointing":
                                                                                        True})])
    print(f"  on vs off: {on['peak_gib'] / off['peak_gib']:.2f}x peak memory, "
          f"{on['step_s'] / off['step_s']:.2f}x time per step", flush=True)
    return 0


BEFORE_HEAD = {"lm_head_chunk_size": 0, "micro_batch_tokens": 4096, "micro_batch_size": 8}  # the trainer before
# the chunked head: the dense head, rows of at most 8 samples and 4,096 tokens


def compare_lm_head(model: Path, batches: list[list[Any]], base: OursSettings) -> int:
    """The trainer before the chunked LM head (its settings then: `BEFORE_HEAD`), the chunked head alone on the
    same rows, and the defaults now (the chunked head, the CPU's rows of `CPU_ROW_TOKENS`)."""
    from prime_lab.trainer.attention import CPU_ROW_TOKENS

    before, head_only, now = compare_settings(model, batches, base, [
        ("before: dense LM head, rows of 4096 tokens", BEFORE_HEAD),
        ("chunked LM head, rows of 4096 tokens", {**BEFORE_HEAD, "lm_head_chunk_size": 1024}),
        (f"now (defaults): chunked LM head, rows of {CPU_ROW_TOKENS} tokens", {})])
    print(f"  chunked head alone / before: {head_only['peak_gib'] / before['peak_gib']:.2f}x peak memory, "
          f"{head_only['step_s'] / before['step_s']:.2f}x time per step", flush=True)
    memory, step = now["peak_gib"] / before["peak_gib"], now["step_s"] / before["step_s"]
    print(f"  now / before: {memory:.2f}x peak memory, {step:.2f}x time per step (goals: "
          f"{verdict('peak memory', memory, 0.6, False)}, {verdict('time per step', step, 1.1, False)})", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="a model preset or folder (CPU modes)")
    parser.add_argument("--gpu", action="store_true", help="one GPU, Qwen3-0.6B-shaped: ours vs the peer")
    parser.add_argument("--shapes", default=",".join(peer_shapes(False)), help="with --gpu: which shapes")
    parser.add_argument("--steps", type=int, default=None, help="steps of each run, the first warm-up (default 5; 3 "
                        "with --lm-head or --tiny)")
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=None)
    parser.add_argument("--micro-batch-size", type=int, default=None)
    parser.add_argument("--procs", default="1,2", help="CPU: process counts to compare")
    parser.add_argument("--activation-checkpointing", action="store_true",
                        help="CPU: one process without and with [trainer] activation_checkpointing")
    parser.add_argument("--lm-head", action="store_true",
                        help="CPU: the chunked LM head (the default) vs the dense one (lm_head_chunk_size = 0)")
    parser.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # the --gpu flow, tiny sizes
    parser.add_argument("--device", default=None, help=argparse.SUPPRESS)  # for the --gpu flow: cuda or cpu
    parser.add_argument("--json", type=Path, default=None, metavar="PATH",
                        help="with --gpu: also write the figures as JSON to PATH (bench/gpu_check.py reads it)")
    parser.add_argument("--peer", default=None, help=argparse.SUPPRESS)  # run_peer's subprocess: its spec (JSON)
    args = parser.parse_args(argv)
    if args.json and not (args.gpu or args.tiny):
        parser.error("--json goes with --gpu: the CPU modes print their figures only")
    if args.peer:
        print(json.dumps(peer_train(json.loads(args.peer))), flush=True)
        return 0
    tiny_or_lm = args.tiny or args.lm_head
    steps = args.steps or (3 if tiny_or_lm else 5)
    if steps < 2:
        parser.error("--steps must be at least 2 (the first step is warm-up)")

    with tempfile.TemporaryDirectory(prefix="prime-lab-bench-") as home:
        from prime_lab.runs.paths import models_dir

        os.environ.setdefault("PRIME_LAB_MODELS", str(models_dir()))  # the user's models; the runs are temporary
        os.environ["PRIME_LAB_HOME"] = home
        if args.gpu or args.tiny:
            shapes = peer_shapes(args.tiny)
            unknown = [s for s in args.shapes.split(",") if s not in shapes]
            if unknown:
                parser.error(f"--shapes: unknown {', '.join(unknown)}; choose from {', '.join(shapes)}")
            device = args.device or ("cuda" if args.gpu else "cpu")
            import torch

            if device.startswith("cuda") and not torch.cuda.is_available():
                raise SystemExit("--gpu needs a CUDA GPU; none is visible")
            card = torch.cuda.get_device_name(0) if device.startswith("cuda") else \
                f"CPU, {len(os.sched_getaffinity(0))} cores"
            model = build_qwen3(Path(home) / "qwen3-shaped", TINY_QWEN3 if args.tiny else QWEN3_06B)
            # --tiny on the CPU: one thread a side. A 2-layer model's matrices are too small to share out, and on a
            # busy machine (CI: 2 cores, two test workers) threads that wait on each other's cores made each step
            # 10-20x slower than one thread does.
            threads = 1 if args.tiny and device == "cpu" else None
            print(f"[{card}] trainer vs a plain transformers + peft GRPO loop: {'a tiny' if args.tiny else 'a'} "
                  f"Qwen3{'' if args.tiny else '-0.6B'}-shaped model (random init, "
                  f"{'bfloat16' if device.startswith('cuda') else 'float32'}), LoRA r{LORA_R} on every linear layer, "
                  f"temperature {TEMPERATURE}, {steps} steps a run (the first is warm-up)"
                  f"{', one CPU thread a side' if threads else ''}", flush=True)
            try:
                code = compare_with_peer(model, device, card, [shapes[s] for s in args.shapes.split(",")], steps,
                                         args.json.resolve() if args.json else None, threads)
            finally:
                if not args.tiny:
                    print(f"[{card}] anchor: {ANCHOR}", flush=True)
            return code

        from prime_lab.models import resolve_model

        model = resolve_model(args.model)
        seq_len = args.seq_len or (2048 if args.lm_head else 256)
        batch_size = args.batch_size or (4 if args.lm_head else 16)
        group = min(args.group, batch_size)
        micro_batch = args.micro_batch_size or (None if args.lm_head else 4)
        shape = Shape("cpu", batch_size, seq_len, max(1, seq_len // 4), group)
        batches = shape_batches(shape, model_shape(model)["vocab_size"], steps)
        base = OursSettings(steps, batch_size, group, seq_len,
                            trainer={} if micro_batch is None else {"micro_batch_size": micro_batch},
                            sampling={"temperature": TEMPERATURE, "top_p": 0.9} if args.lm_head else {})
        print(f"trainer throughput on CPU, {len(os.sched_getaffinity(0))} cores: {model.name}, LoRA r{LORA_R} on every "
              f"linear layer, {batch_size} sequences of {seq_len} tokens per step (groups of {group} share a "
              f"{shape.prompt_len}-token prompt), micro-batch {micro_batch or 'unset (rows filled to the budget)'}"
              f"{', temperature 0.7, top_p 0.9' if args.lm_head else ''}, {steps} steps (the first is warm-up)",
              flush=True)
        try:
            if args.lm_head:
                return compare_lm_head(model, batches, base)
            if args.activation_checkpointing:
                return compare_checkpointing(model, batches, base)
            return compare_procs(model, batches, base, [int(p) for p in args.procs.split(",")])
        except SideFailed as failed:
            raise SystemExit(str(failed)) from None
        finally:
            print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
