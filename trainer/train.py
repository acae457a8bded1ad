"""The trainer process: `python -m trainer.train RUN_DIR --model-path PATH [--resume]`.

For each step k from the start: wait for the orchestrator's batch (`rollouts/step_k.jsonl`), recompute token
logprobs with the policy in micro-batches, take one AdamW step (linear warmup, gradient clipping), publish the
policy for the sampler (`adapters/step_k/`, or `weights/step_k/` for full fine-tuning: trainer/versions.py), emit
the step's metrics, and checkpoint every `[checkpoints].interval` steps and at the end. SIGTERM finishes the current
step, checkpoints and exits 0.

The policy is a LoRA adapter on the frozen base model, or with `[lora] enabled = false` the whole model (float32 on
a CPU, AdamW over every parameter). A checkpoint holds the policy as published (the adapter, or the full weights)
and `trainer_state.pt` (optimizer state, KL beta, RNG state), so a resume continues exactly. Full fine-tuning keeps
a frozen copy of the base model for the KL penalty, only when the penalty is on (LoRA disables its adapter instead).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

from prime_lab.lab.events import EventWriter
from prime_lab.lab.runs import Run
from prime_lab.trainer.batch import batch_path, read_batch, truncate
from prime_lab.trainer.config import RLConfig
from prime_lab.trainer.model import accumulate_batch_gradients, load_full_policy, load_policy, pick_device
from prime_lab.trainer.runtime import (
    StopFlag,
    checkpoint_to_resume,
    guarded_main,
    load_config,
    log_both,
    publish_dir,
    staging_dir,
    step_dirs,
    warm_start_adapter,
)
from prime_lab.trainer.versions import drop_versions_after, versions_dir, warm_start_weights

DEFAULT_CHECKPOINT_INTERVAL = 10
POLL_S = 0.05


class Trainer:
    def __init__(self, run: Run, config: RLConfig, model_path: Path, *, resume: bool = False) -> None:
        import torch

        self.run, self.config, self.model_path = run, config, model_path
        self.events: EventWriter = run.writer("trainer")
        self.stop = StopFlag().install()
        self.device = pick_device(config.trainer.device)
        lora = config.lora
        self.versions = versions_dir(run, config)
        self.start_step = 0
        start_from: Path | None = None  # the adapter, or full weights, the policy starts from
        state: dict[str, Any] | None = None
        found = checkpoint_to_resume(run) if resume else None
        if resume and found is None:
            self.log("no checkpoint to resume from: starting at step 1", "WARNING")
        if found:
            self.start_step, start_from = found
            state = torch.load(start_from / "trainer_state.pt", weights_only=False)
            drop_versions_after(self.versions, self.start_step)
        elif config.checkpoint_id:
            start_from = (warm_start_adapter if lora.enabled else warm_start_weights)(config.checkpoint_id,
                                                                                      run.dir.parent)
        self.reference: Any | None = None  # full fine-tuning: the frozen base model of the KL penalty
        if lora.enabled:
            self.model = load_policy(model_path, lora_r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                     target_modules=lora.target_modules, device=self.device,
                                     dtype=config.trainer.dtype, adapter_path=start_from)
        else:
            self.model = load_full_policy(start_from or model_path, device=self.device, dtype=config.trainer.dtype)
            if config.kl_penalty.enabled:
                self.reference = load_full_policy(model_path, device=self.device, dtype=config.trainer.dtype,
                                                  trainable=False)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=config.learning_rate,
                                           weight_decay=config.trainer.weight_decay)
        self.kl_beta = config.kl_penalty.beta if config.kl_penalty.enabled else 0.0
        if state is not None:
            self.optimizer.load_state_dict(state["optimizer"])
            self.kl_beta = float(state.get("kl_beta", self.kl_beta))
            torch.set_rng_state(state["torch_rng"])
        self.checkpoint_interval = config.checkpoints.interval
        if self.checkpoint_interval is None:
            self.checkpoint_interval = DEFAULT_CHECKPOINT_INTERVAL
        self.last_checkpoint = self.start_step
        if start_from is not None or self.start_step:
            self.publish_policy(self.start_step)  # the sampler starts from this version
        n_train = sum(p.numel() for p in self.params)
        dtype = str(next(self.model.parameters()).dtype).removeprefix("torch.")
        what = (f"LoRA r={lora.r} alpha={lora.alpha:g} on {', '.join(lora.target_modules)}" if lora.enabled
                else f"full fine-tuning in {dtype}")
        self.log(f"trainer ready on {self.device}: {model_path.name}, {what} ({n_train:,} trainable parameters); "
                 + (f"resuming after step {self.start_step}" if self.start_step else "starting at step 1"))

    def log(self, message: str, level: str = "INFO", step: int | None = None) -> None:
        log_both(self.events, message, level, step)

    def lr_at(self, step: int) -> float:
        warmup = self.config.warmup_steps
        scale = min(1.0, step / warmup) if warmup > 0 else 1.0
        return self.config.learning_rate * scale

    def wait_for_batch(self, step: int) -> Path | None:
        path = batch_path(self.run.rollouts_dir, step)
        while not path.exists():
            if self.stop.set:
                return None
            time.sleep(POLL_S)
        return path

    def train(self) -> int:
        import torch

        cfg = self.config
        for step in range(self.start_step + 1, cfg.max_steps + 1):
            t_wait = time.perf_counter()
            path = self.wait_for_batch(step)
            if path is None:
                break
            waited = time.perf_counter() - t_wait
            t0 = time.perf_counter()
            samples = [truncate(s, cfg.trainer.max_seq_len) for s in read_batch(path)]
            lr = self.lr_at(step)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.optimizer.zero_grad(set_to_none=True)
            self.model.train()
            result = accumulate_batch_gradients(
                self.model, samples, device=self.device,
                temperature=cfg.sampling.temperature, top_p=cfg.sampling.top_p,
                micro_batch_size=cfg.trainer.micro_batch_size,
                accumulation_steps=cfg.gradient_accumulation_steps, ratio_low=cfg.trainer.ratio_mask_low,
                ratio_high=cfg.trainer.ratio_mask_high, kl_beta=self.kl_beta, reference=self.reference)
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, cfg.trainer.max_grad_norm))
            if math.isfinite(grad_norm):
                self.optimizer.step()
            else:
                self.log(f"step {step}: gradient norm is {grad_norm}; skipped the update", "WARNING", step)
            self.publish_policy(step)
            elapsed = time.perf_counter() - t0
            metrics = {"loss": result.loss, "policy/entropy": result.entropy, "policy/kl": result.mismatch_kl,
                       "policy/masked_fraction": result.masked_fraction, "optim/lr": lr, "optim/grad_norm": grad_norm,
                       "time/step": elapsed, "time/wait_for_batch": waited,
                       "perf/train_tokens_per_s": result.tokens / elapsed if elapsed > 0 else 0.0,
                       "train/samples": float(len(samples)), "train/loss_tokens": float(result.loss_tokens)}
            if result.ref_kl is not None:
                metrics["policy/ref_kl"] = result.ref_kl
                metrics["policy/kl_beta"] = self.kl_beta
                self.adapt_kl_beta(result.ref_kl)
            self.events.metrics(metrics, step)
            self.run.update_status(step=step)
            print(f"[trainer] step {step}/{cfg.max_steps} loss {result.loss:.4f} entropy {result.entropy:.3f} "
                  f"grad_norm {grad_norm:.3f} {elapsed:.2f}s", flush=True)
            if step % max(1, self.checkpoint_interval or cfg.max_steps) == 0 or step == cfg.max_steps \
                    or self.stop.set:
                self.save_checkpoint(step)
            if self.stop.set:
                break
        else:
            return 0
        last = self.latest_trained_step()
        if last > self.last_checkpoint:
            self.save_checkpoint(last)
        self.log(f"stopped after step {last}: checkpoint saved, resume with `prime rl restart {self.run.id}`")
        return 0

    def latest_trained_step(self) -> int:
        return max([self.start_step, *step_dirs(self.versions)])

    def adapt_kl_beta(self, kl: float) -> None:
        target = self.config.kl_penalty.target_kl
        if target is None:
            return
        if kl > 1.5 * target:
            self.kl_beta *= 1.5
        elif kl < target / 1.5:
            self.kl_beta /= 1.5

    def publish_policy(self, step: int) -> Path:
        """Version `step` for the sampler: the adapter (LoRA) or the whole model (full fine-tuning)."""
        tmp = staging_dir(self.versions, f"step_{step}")
        self.model.save_pretrained(tmp)
        final = publish_dir(tmp, self.versions / f"step_{step}")
        self.prune_versions(step)
        return final

    def prune_versions(self, newest: int) -> None:
        """Keep the newest few (the sampler may still be loading one), every `[adapters].interval`-th, and the last
        `[adapters].keep_last`."""
        import shutil

        keep_last = self.config.adapters.keep_last
        interval = self.config.adapters.interval
        floor = max(3, self.config.max_async_level + 2, keep_last if keep_last >= 0 else 10**9)
        for k, path in step_dirs(self.versions).items():
            if newest - k < floor or (interval and k % interval == 0):
                continue
            shutil.rmtree(path, ignore_errors=True)

    def save_checkpoint(self, step: int) -> Path:
        import torch

        root = self.run.checkpoints_dir
        tmp = staging_dir(root, f"step_{step}")
        self.model.save_pretrained(tmp)
        torch.save({"optimizer": self.optimizer.state_dict(), "step": step, "kl_beta": self.kl_beta,
                    "torch_rng": torch.get_rng_state()}, tmp / "trainer_state.pt")
        final = publish_dir(tmp, root / f"step_{step}")
        self.last_checkpoint = step
        self.events.emit("checkpoint", {"path": str(final), "step": step}, step=step)
        self.prune_checkpoints()
        return final

    def prune_checkpoints(self) -> None:
        """Keep the newest `[checkpoints].keep_cloud` checkpoints (-1: all). Locally there is no cloud: the setting
        is how many the run directory keeps (a full fine-tuning checkpoint of SmolLM2 is 1.6 GB)."""
        import shutil

        keep = self.config.checkpoints.keep_cloud
        if keep < 0:
            return
        steps = sorted(step_dirs(self.run.checkpoints_dir))
        for k in steps[:-max(1, keep)]:
            shutil.rmtree(self.run.checkpoints_dir / f"step_{k}", ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prime_lab.trainer.train")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--model-path", type=Path, required=True)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)
    run = Run(args.run_dir)
    return guarded_main(run, "trainer",
                        lambda: Trainer(run, load_config(run), args.model_path, resume=args.resume).train())


if __name__ == "__main__":
    sys.exit(main())
