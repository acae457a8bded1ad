"""reverse-text in prime-rl's two steps, SmolLM2 on this CPU: the reward before, after an SFT warm-up, after RL.

    .venv/bin/python bench/sft_then_rl.py [--sft-steps 80] [--rl-steps 30] [--rl-lr 3e-4] [--eval-n 100]
                                          [--eval-r 1] [--tiny]

prime-rl's reverse-text example fine-tunes a model on worked answers, then runs RL from the result (Qwen3-0.6B:
reward ~0.05 before, ~0.8 after both). Here, as a user runs it:
  (a) base: `prime eval run primeintellect/reverse-text -m smollm2-135m -n N -r R --seed 0 -t T -T TEMP`, the mean
      reward read from the `metadata.json` it writes;
  (b) SFT: `prime sft run` on a temp copy of configs/sft/reverse-text.toml with `max_steps = --sft-steps`, its data
      generated in code (`sft_rows`, through scripts/reverse_text_sft_data.py) into a temp folder; then
      `prime eval run ... -m <SFT run id>` as in (a);
  (c) RL: `prime rl run` on a temp copy of configs/rl/reverse-text-after-sft.toml with `model = <SFT run id>`,
      `max_steps = --rl-steps` and an `[eval]` section; then `prime eval run ... --adapter <RL run id>` (its final
      adapter on the SFT model) as in (a). The RL run's own `[eval]` (the SFT model at step 0, the final policy at
      the last step: `eval/reverse-text/reward` in its events) is printed beside it as a second reading.
The RL lift is (c) minus (b): the same command, the same examples. Every eval scores the same examples the same way:
the environment's eval split
(disjoint from the SFT data), its first N rows after a shuffle with seed 0 (`--seed 0`; the orchestrator's eval uses
seed 0), R rollouts each, the RL config's [sampling] (max_tokens, temperature). The runs stay in the registry
(`prime sft list`, `prime rl list`).

`--tiny` swaps SmolLM2 for a tiny random model (`build_tiny_model`), a few steps, 8 validation rows and one CPU thread
a process: the flow end to end in a minute or two (tests/bench/test_sft_then_rl.py); its lifts mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import tomlkit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from reverse_text_sft_data import write_reverse_text_data  # noqa: E402

from prime_lab.runs.registry import RunRegistry  # noqa: E402

PRIME = str(Path(sys.executable).parent / "prime")
SFT_CONFIG = ROOT / "configs" / "sft" / "reverse-text.toml"
RL_CONFIG = ROOT / "configs" / "rl" / "reverse-text-after-sft.toml"
ENV_ID = "primeintellect/reverse-text"
EVAL_METRIC = "eval/reverse-text/reward"
TINY_VAL_EXAMPLES = 8  # --tiny: the SFT run's validation (at step 0 and the last) on 8 of the 50 held-out rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sft-steps", type=int, default=None, help="SFT steps (default: the config's max_steps).")
    parser.add_argument("--rl-steps", type=int, default=None, help="RL steps (default: the config's max_steps).")
    parser.add_argument("--rl-lr", type=float, default=None, help="RL learning_rate (default: the config's).")
    parser.add_argument("--eval-n", type=int, default=100, help="Eval examples (the eval split has 100).")
    parser.add_argument("--eval-r", type=int, default=1, help="Rollouts per eval example.")
    parser.add_argument("--sft-rows", type=int, default=400, help="SFT training rows generated (at most 1,000).")
    parser.add_argument("--tiny", action="store_true", help="A tiny random model and few steps: the flow only.")
    args = parser.parse_args()
    if args.tiny:
        args.sft_steps = args.sft_steps or 3
        args.rl_steps = args.rl_steps or 2
        args.eval_n = min(args.eval_n, 4)
        args.sft_rows = min(args.sft_rows, 64)
        # one CPU thread a process (the runs and evals inherit it; a run's supervisor then leaves the split to
        # it): a tiny model's matrices are too small to share out, and on a busy machine (CI: 2 cores, two test
        # workers) threads waiting on each other's cores made the SFT run's steps and validations 5-10x slower
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory(prefix="sft-then-rl-") as tmp:
        return bench(args, Path(tmp))


def bench(args: argparse.Namespace, tmp: Path) -> int:
    base_model = "smollm2-135m"
    if args.tiny:
        from prime_lab.models import build_tiny_model

        base_model = str(build_tiny_model(tmp / "tiny-model"))
    rl_doc = tomlkit.parse(RL_CONFIG.read_text())
    sampling = rl_doc["sampling"]
    max_tokens, temperature = int(sampling["max_tokens"]), float(sampling["temperature"])  # type: ignore[index]
    eval_flags = ["-n", str(args.eval_n), "-r", str(args.eval_r), "--seed", "0", "-t", str(max_tokens),
                  "-T", f"{temperature:g}"]
    print(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; base model {base_model}")
    print(f"eval: {ENV_ID}'s eval split, {args.eval_n} examples (shuffled with seed 0) x {args.eval_r} rollouts, "
          f"max_tokens {max_tokens}, temperature {temperature} (the RL config's [sampling]); the same for all three")

    # (a) the base model
    base, base_wall = evaluate(base_model, eval_flags, tmp / "eval-base")
    print(f"(a) base:      reward {base:.3f}  ({base_wall:.0f} s)", flush=True)

    # (b) SFT on worked answers, then the same eval
    train, val = write_reverse_text_data(tmp / "data", args.sft_rows)
    sft_doc = tomlkit.parse(SFT_CONFIG.read_text())
    sft_doc["model"] = base_model
    if args.sft_steps is not None:
        sft_doc["max_steps"] = args.sft_steps
    sft_doc["data"]["name"] = str(train)  # type: ignore[index]
    sft_doc["val"]["data"]["name"] = str(val)  # type: ignore[index]
    if args.tiny:
        sft_doc["data"]["seq_len"] = 256  # type: ignore[index]  # the tiny tokenizer spends ~130 tokens a chat
        sft_doc["val"]["num_examples"] = TINY_VAL_EXAMPLES  # type: ignore[index]  # a val loss, not a figure
    sft_id, sft_wall = train_run("sft", sft_doc, tmp / "sft.toml", "--name", "bench-sft-then-rl")
    sft_steps = int(sft_doc["max_steps"])  # type: ignore[arg-type]
    val_loss = metric_by_step(sft_id, "val/loss")
    print(f"    SFT run {sft_id}: {sft_steps} steps, lr {float(sft_doc['learning_rate']):g}, "  # type: ignore[arg-type]
          f"{len(train.read_text().splitlines())} rows; val loss "
          + " -> ".join(f"{val_loss[k]:.3f} (step {k})" for k in sorted(val_loss)) + f"  ({sft_wall:.0f} s)")
    after_sft, sft_eval_wall = evaluate(sft_id, eval_flags, tmp / "eval-sft")
    print(f"(b) after SFT: reward {after_sft:.3f}  ({sft_eval_wall:.0f} s)", flush=True)

    # (c) RL from the SFT model; its [eval] scores the SFT model at step 0 and the final policy
    rl_doc["model"] = sft_id
    if args.rl_steps is not None:
        rl_doc["max_steps"] = args.rl_steps
    if args.rl_lr is not None:
        rl_doc["learning_rate"] = args.rl_lr
    rl_steps = int(rl_doc["max_steps"])  # type: ignore[arg-type]
    rl_doc["eval"] = {"interval": 0, "num_examples": args.eval_n, "rollouts_per_example": args.eval_r,
                      "eval_base_model": True}
    rl_id, rl_wall = train_run("rl", rl_doc, tmp / "rl.toml")
    evals = metric_by_step(rl_id, EVAL_METRIC)
    if 0 not in evals or rl_steps not in evals:
        print(f"RL run {rl_id} has no {EVAL_METRIC} at steps 0 and {rl_steps} (it has {sorted(evals)})")
        return 1
    rewards = metric_by_step(rl_id, "reward/mean")
    print(f"    RL run {rl_id}: {rl_steps} steps, lr {float(rl_doc['learning_rate']):g}; reward/mean "  # type: ignore[arg-type]
          + " ".join(f"{rewards[k]:.2f}" for k in sorted(rewards)) + f"  ({rl_wall:.0f} s, its two evals included)")
    print(f"    the RL run's own [eval]: step 0 (the SFT model) {evals[0]:.3f}, step {rl_steps} {evals[rl_steps]:.3f}")
    after_rl, rl_eval_wall = evaluate(None, [*eval_flags, "--adapter", rl_id], tmp / "eval-rl")
    print(f"(c) after RL:  reward {after_rl:.3f}  ({rl_eval_wall:.0f} s)", flush=True)

    print(f"\nreverse-text, {Path(base_model).name if args.tiny else base_model}, eval {args.eval_n} x {args.eval_r}:")
    print(f"  base reward      {base:.3f}")
    print(f"  after-SFT reward {after_sft:.3f}")
    print(f"  after-RL reward  {after_rl:.3f}")
    print(f"  SFT lift {after_sft - base:+.3f} (after SFT - base)")
    print(f"  RL lift  {after_rl - after_sft:+.3f} (after RL - after SFT; the RL run's own evals: "
          f"{evals[rl_steps] - evals[0]:+.3f})")
    print(f"  wall: base eval {base_wall:.0f} s, SFT {sft_wall:.0f} s ({sft_steps} steps), SFT eval "
          f"{sft_eval_wall:.0f} s, RL {rl_wall:.0f} s ({rl_steps} steps + 2 evals), RL eval {rl_eval_wall:.0f} s; "
          f"total {base_wall + sft_wall + sft_eval_wall + rl_wall + rl_eval_wall:.0f} s")
    return 0


def evaluate(model: str | None, flags: list[str], out: Path) -> tuple[float, float]:
    """`prime eval run` of `model` (None: the one `--adapter` in `flags` was trained on) on reverse-text: (mean
    reward from its metadata.json, wall seconds)."""
    t0 = time.monotonic()
    done = subprocess.run([PRIME, "eval", "run", ENV_ID, *(["-m", model] if model else []), *flags, "-o", str(out)],
                          capture_output=True, text=True)
    wall = time.monotonic() - t0
    if done.returncode != 0:
        raise SystemExit(f"prime eval run {' '.join(flags)} failed (exit {done.returncode}):\n"
                         f"{done.stderr[-3000:]}")
    return float(json.loads((out / "metadata.json").read_text())["avg_reward"]), wall


def train_run(kind: str, doc: Any, config: Path, *extra: str) -> tuple[str, float]:
    """`prime KIND run @config --foreground`: (the run id, wall seconds); exits when the run did not complete."""
    config.write_text(tomlkit.dumps(doc))
    t0 = time.monotonic()
    done = subprocess.run([PRIME, kind, "run", f"@{config}", "--foreground", *extra], capture_output=True, text=True)
    wall = time.monotonic() - t0
    run_id = (done.stdout.strip().splitlines() or [""])[0].strip()  # the id is stdout's first line
    if done.returncode != 0 or not run_id:
        raise SystemExit(f"prime {kind} run did not complete (exit {done.returncode}, run {run_id or '?'}):\n"
                         f"{done.stderr[-3000:]}")
    return run_id, wall


def metric_by_step(run_id: str, name: str) -> dict[int, float]:
    """`name`'s value at each step of the run's metrics events (the latest write of a step wins)."""
    found: dict[int, float] = {}
    for event in RunRegistry().get(run_id).event_log().events():
        if event.kind == "metrics" and event.step is not None and name in event.data:
            found[event.step] = float(event.data[name])
    return found


if __name__ == "__main__":
    sys.exit(main())
