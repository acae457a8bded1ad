"""The SFT trainer process: `python -m prime_lab.trainer.sft RUN_DIR --model-path PATH [--resume]`.

The RL trainer (trainer/train.py) with a dataset in place of the orchestrator's batches: the same model loading
(LoRA or full fine-tuning), packing, chunked LM head, torchrun (DDP, FSDP2), checkpoints and events. Each step takes
the examples that fill `[data] batch_size` rows of `seq_len` tokens (trainer/sft_data.py) and minimises the
cross-entropy of their trained tokens, summed and divided by the step's count of trained tokens (prime-rl's SFT
loss). A checkpoint also holds the data stream's position, so a restart reads on from there. `[val]` computes the
same loss on the validation examples without gradients.

Metrics, named as prime-rl names them: `loss/mean`, `loss/perplexity`, `val/loss`, `val/perplexity`,
`progress/num_tokens`, `progress/num_samples`, `progress/epoch`, `optim/lr`, `optim/grad_norm`, `perf/throughput`,
`perf/peak_memory`, `time/step`; and, as the RL trainer emits them, `time/compile` and `compile/recompiles`.

When the last step is done, rank 0 writes the run's model (`Run.model_dir`): a plain Hugging Face folder, the LoRA
adapter merged into the base weights, with the tokenizer, so RL, eval and GEPA take it by the run's id.
"""

from __future__ import annotations

import math
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from prime_lab.runs.atomic import write_folder_atomic
from prime_lab.runs.registry import Run
from prime_lab.trainer.attention import packs_prefixes, row_inputs, use_row_attention
from prime_lab.trainer.batch import Sample
from prime_lab.trainer.model import accumulate_batch_gradients, peak_memory_gib, score_row
from prime_lab.trainer.packing import pack
from prime_lab.trainer.runtime import load_sft_config
from prime_lab.trainer.sft_config import SFTConfig
from prime_lab.trainer.sft_data import SFTDataError, SFTExamples, SFTStream, read_source, to_sample
from prime_lab.trainer.train import Trainer, trainer_main
from prime_lab.trainer.versions import save_weights

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "vocab.json", "merges.txt", "tokenizer.model", "generation_config.json")


class SFTTrainer(Trainer):
    config: SFTConfig

    def __init__(self, run: Run, config: SFTConfig, model_path: Path, *, resume: bool = False) -> None:
        from transformers import AutoTokenizer

        super().__init__(run, config, model_path, resume=resume)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        data = config.data
        rows = [row for source in data.datasets for row in read_source(source)]
        self.examples = SFTExamples(rows, self.tokenizer, data.loss_mask, data.seq_len)
        state = self.resume_state or {}
        position = tuple(state.get("data_position", (0, 0)))
        self.stream = SFTStream(self.examples, shuffle=data.shuffle, seed=data.seed,
                                position=(int(position[0]), int(position[1])))
        self.num_tokens = int(state.get("num_tokens", 0))
        self.num_samples = int(state.get("num_samples", 0))
        self.val_samples = self.load_val() if config.val is not None else []
        self.log(f"data: {len(rows)} examples from {', '.join(s.dataset for s in data.datasets)}; steps of "
                 f"{data.batch_size} rows x {data.seq_len} tokens"
                 + (f"; validation: {len(self.val_samples)} examples" if config.val is not None else ""))

    def load_val(self) -> list[Sample]:
        val = self.config.val
        assert val is not None
        from prime_lab.trainer.sft_config import DataSourceConfig

        named = val.data.name or val.data.source
        sources = (val.data.source or [DataSourceConfig(dataset=str(val.data.name))]) if named \
            else [DataSourceConfig(dataset=s.dataset, subsets=s.subsets) for s in self.config.data.datasets]
        rows = []
        for source in sources:
            split = DataSourceConfig(dataset=source.dataset, subsets=source.subsets or val.data.subsets,
                                     splits=source.splits or val.data.splits)
            rows += read_source(split)
        if val.num_examples is not None:
            rows = rows[:val.num_examples]
        examples = SFTExamples(rows, self.tokenizer, self.config.data.loss_mask, self.config.data.seq_len)
        return [to_sample(e) for e in examples.usable()]

    def extra_state(self) -> dict[str, Any]:
        return {"data_position": list(self.stream.position), "num_tokens": self.num_tokens,
                "num_samples": self.num_samples}

    def val_loss(self) -> float:
        """Mean cross-entropy of the validation examples' trained tokens (no gradients); every rank takes part."""
        import torch

        from prime_lab.trainer.distributed import shard_rows

        self.plan_rows(self.val_samples)  # validating before step 1 (eval_on_start) comes first
        rows = pack(self.val_samples, self.config.trainer.micro_batch_size, self.dist.world_size,
                    share_prefixes=packs_prefixes(self.model, self.attention), max_tokens=self.row_tokens)
        total = [0.0, 0.0]
        self.model.eval()
        with torch.no_grad():
            for row, weight in shard_rows(rows, self.dist.rank, self.dist.world_size):
                use_row_attention(row, self.attention, self.model)
                inputs = row_inputs(self.model, row, self.device, self.attention)
                targets = torch.tensor(row.targets, dtype=torch.long, device=self.device)
                logprobs, _ = score_row(self.forward, self.model, inputs, targets, 1.0, 1.0,
                                        self.config.trainer.lm_head_chunk_size)
                if weight:
                    total[0] -= float(logprobs.sum())
                    total[1] += len(row.targets)
        self.model.train()
        total = self.dist.sum(total)
        return total[0] / max(1.0, total[1])

    def validate(self, step: int) -> None:
        if self.config.val is None or not self.val_samples:
            return
        loss = self.val_loss()
        if self.dist.is_main:
            self.events.metrics({"val/loss": loss, "val/perplexity": math.exp(min(loss, 50.0))}, step)
            print(f"[trainer] step {step} val/loss {loss:.4f}", flush=True)

    def train(self) -> int:
        import torch

        cfg, data = self.config, self.config.data
        val = cfg.val
        if val is not None and val.eval_on_start and self.start_step == 0:
            self.validate(0)
        stopping = False
        step = self.start_step
        for step in range(self.start_step + 1, cfg.max_steps + 1):
            t0 = time.perf_counter()
            samples = self.stream.next_batch(data.batch_size, data.seq_len)
            with self.out_of_memory_as_error(step):
                self.plan_rows(samples)
                lr = self.lr_at(step)
                for group in self.optimizer.param_groups:
                    group["lr"] = lr
                self.optimizer.zero_grad(set_to_none=True)
                self.model.train()
                result = accumulate_batch_gradients(
                    self.model, samples, device=self.device, temperature=1.0, top_p=1.0,
                    micro_batch_size=cfg.trainer.micro_batch_size, micro_batch_tokens=self.row_tokens,
                    attention=self.attention, lm_head_chunk_size=cfg.trainer.lm_head_chunk_size,
                    dist=self.dist, forward=self.forward, grad_sync=self.grad_sync, loss="sft")
                norm = torch.nn.utils.clip_grad_norm_(self.params, cfg.trainer.max_grad_norm)
                grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
                nan = not math.isfinite(grad_norm) or not math.isfinite(result.loss)
                if not nan:
                    self.optimizer.step()
                else:
                    self.log(f"step {step}: the loss or gradient norm is not finite; skipped the update", "WARNING",
                             step)
            elapsed = time.perf_counter() - t0
            self.num_tokens += result.tokens
            self.num_samples += len(samples)
            metrics = {"loss/mean": result.loss, "loss/perplexity": math.exp(min(result.loss, 50.0)),
                       "loss/nan_count": float(nan), "optim/lr": lr, "optim/grad_norm": grad_norm,
                       "progress/num_tokens": float(self.num_tokens), "progress/num_samples": float(self.num_samples),
                       "progress/epoch": float(self.stream.epoch), "train/loss_tokens": float(result.loss_tokens),
                       **self.step_timing(step, elapsed, result.tokens, "perf/throughput"),
                       "perf/peak_memory": peak_memory_gib(self.device)}
            stopping = bool(self.dist.share(self.stop.set))
            if self.dist.is_main:
                self.events.metrics(metrics, step)
                self.run.update_status(step=step)
                print(f"[trainer] step {step}/{cfg.max_steps} loss {result.loss:.4f} grad_norm {grad_norm:.3f} "
                      f"{elapsed:.2f}s", flush=True)
            if val is not None and (step == cfg.max_steps or (val.interval and step % val.interval == 0)):
                self.validate(step)
            interval = self.checkpoint_interval or cfg.max_steps
            if step % max(1, interval) == 0 or step == cfg.max_steps or stopping:
                self.publish_policy(step)
                self.save_checkpoint(step)
            if stopping:
                break
        if not stopping and step == cfg.max_steps:
            self.export_model()
        elif stopping:
            self.log(f"stopped after step {step}: checkpoint saved, resume with `prime sft restart {self.run.id}`")
        self.dist.close()
        return 0

    def export_model(self) -> Path:
        """The trained model as a plain Hugging Face folder (`Run.model_dir`): LoRA merged into the base weights
        (the policy is not trained further), or the full weights; with the tokenizer and chat template."""
        full = self.full_state_dict()
        final = self.run.model_dir
        if not self.dist.is_main:
            return final
        with write_folder_atomic(final) as tmp:
            if self.config.lora.enabled:
                merged = self.model.merge_and_unload()
                merged.save_pretrained(tmp)
            else:
                save_weights(self.model, tmp, full)  # in the compute dtype (bfloat16 on CUDA), not the masters'
            self.tokenizer.save_pretrained(tmp)
            for name in TOKENIZER_FILES:  # what save_pretrained may not write (a generation config, a .jinja template)
                if (self.model_path / name).is_file() and not (tmp / name).exists():
                    shutil.copy2(self.model_path / name, tmp / name)
        self.events.emit("checkpoint", {"path": str(final), "step": self.config.max_steps, "model": True},
                         step=self.config.max_steps)
        self.log(f"model written to {final}: use it as `model = \"{self.run.id}\"` in RL and SFT configs, or "
                 f"`prime eval run ENV -m {self.run.id}`")
        return final


def build(run: Run, model_path: Path, resume: bool) -> SFTTrainer:
    try:
        return SFTTrainer(run, load_sft_config(run), model_path, resume=resume)
    except SFTDataError as exc:
        raise SFTDataError(f"[data]: {exc}") from exc


def main(argv: list[str] | None = None) -> int:
    return trainer_main("prime_lab.trainer.sft", build, argv)


if __name__ == "__main__":
    sys.exit(main())
