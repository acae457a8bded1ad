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

Under torchrun (`[trainer] nproc_per_node` > 1 or several nodes: trainer/distributed.py) every rank runs this
loop. Rank 0 reads each batch and sends it to the others; each rank trains on its share of the micro-batches.
LoRA: DistributedDataParallel over the adapter's parameters (each rank keeps a replica; a checkpoint is the same
as one process's and resumes on any number of ranks). Full fine-tuning: FSDP2 (`fully_shard` on each decoder
layer and the root); the published weights are gathered to rank 0, and a checkpoint adds the sharded model and
optimizer state as a distributed checkpoint (`dcp/`), which resumes on the same number of ranks. Rank 0 alone
writes versions, checkpoints, events and status.

On a GPU, `[trainer] compile` and `attention` left to auto compile the decoder layers and run packed rows through
FlexAttention, rows of one sequence through SDPA without a mask (trainer/attention.py). The row budget and
activation checkpointing left to auto are settled at the first batch, from the memory free then (the sampler, which
may share the GPU, starts after the trainer): `plan_rows`, logged with its estimate. Compiling is measured:
`time/compile` (seconds compiling in a step; the first step's throughput is left out when it compiled) and, after a
process's first two steps, `compile/recompiles` (graphs compiled since, each also a WARNING with torch's reason). A
CUDA out-of-memory error ends the run with one line naming the settings to change (runtime.OutOfMemory).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prime_lab.runs.atomic import publish_folder, staging_folder
from prime_lab.runs.events import EventWriter
from prime_lab.runs.registry import Run
from prime_lab.trainer.attention import CPU_ROW_TOKENS, choose_attention, describe_attention, free_device_bytes
from prime_lab.trainer.batch import Sample, batch_path, read_batch, truncate
from prime_lab.trainer.config import RLConfig, TrainerConfig
from prime_lab.trainer.distributed import HEARTBEAT_S, WAITING, Dist, exit_rank, strategy
from prime_lab.trainer.lm_head import chunkable_head, head_matches_model
from prime_lab.trainer.model import (
    MemoryPlan,
    accumulate_batch_gradients,
    allow_recompiles,
    compile_clock,
    compile_layers,
    compiles,
    enable_activation_checkpointing,
    load_full_policy,
    load_policy,
    model_shape,
    peak_memory_gib,
    pick_device,
    plan_memory,
    precision_of,
    recompile_reasons,
    shard_model,
)
from prime_lab.trainer.runtime import (
    OutOfMemory,
    StopFlag,
    checkpoint_to_resume,
    guarded_main,
    link_or_copy,
    load_config,
    log_both,
    out_of_memory_message,
    step_dirs,
    warm_start_adapter,
)
from prime_lab.trainer.sft_config import SFTConfig
from prime_lab.trainer.versions import drop_versions_after, save_weights, versions_dir, warm_start_weights

DEFAULT_CHECKPOINT_INTERVAL = 10
POLL_S = 0.05
WARMUP_STEPS = 2  # steps of a process that may compile (first shapes, then lengths made dynamic); later compiles
# are recompiles, counted in the log and in `compile/recompiles`


def auto_settings_note(settings: TrainerConfig, *, cuda: bool, compiled: bool, attention: str) -> str:
    """What each `[trainer]` setting left to auto became, for the "trainer ready" line ("" when none is)."""
    autos = [f"{name} = auto: {value}" for name, value, auto in (
        ("compile", ("on" if compiled else "off") + (" (CUDA)" if cuda else " (CPU)"), settings.compile == "auto"),
        ("attention", attention, settings.attention == "auto"),
        ("activation_checkpointing", "at the first batch, from the free memory" if cuda else "off (CPU)",
         settings.activation_checkpointing == "auto")) if auto]
    return f" ({'; '.join(autos)})" if autos else ""


class Trainer:
    def __init__(self, run: Run, config: RLConfig | SFTConfig, model_path: Path, *, resume: bool = False) -> None:
        import torch

        self.run, self.config, self.model_path = run, config, model_path
        self.dist = Dist(pick_device(config.trainer.device))
        self.device = self.dist.device
        # ranks other than 0 write no events (nor versions, checkpoints, status)
        self.events: EventWriter = run.writer("trainer") if self.dist.is_main \
            else EventWriter(Path(os.devnull), "trainer")
        self.stop = StopFlag().install()
        lora = config.lora
        self.strategy = strategy(config.trainer, lora.enabled) if self.dist.world_size > 1 else None
        self.versions = versions_dir(run, config)
        self.start_step = 0
        start_from: Path | None = None  # the adapter, or full weights, the policy starts from
        state: dict[str, Any] | None = None
        # Rank 0 finds what to start from; the other ranks (possibly on machines without the run's files) get
        # the step, and, with DDP, the weights (DDP copies rank 0's) and the optimizer state from it.
        found = checkpoint_to_resume(run) if resume and self.dist.is_main else None
        if resume and self.dist.is_main and found is None:
            self.log("no checkpoint to resume from: starting at step 1", "WARNING")
        if found:
            self.start_step, start_from = found
            state = torch.load(start_from / "trainer_state.pt", weights_only=False, map_location="cpu")
            drop_versions_after(self.versions, self.start_step)
        elif config.checkpoint_id and self.dist.is_main:
            start_from = (warm_start_adapter if lora.enabled else warm_start_weights)(config.checkpoint_id,
                                                                                      run.dir.parent)
        self.start_step = self.dist.share(self.start_step)
        copy: Path | None = None  # this rank's copy of rank 0's adapter, removed once loaded
        if self.strategy == "fsdp":  # every rank loads the full weights (from the same path), then keeps its shard
            start_from = self.dist.share(start_from)
        elif lora.enabled:
            shared = self.dist.share_folder(start_from)  # the adapter's shape, on every rank
            copy, start_from = (shared if shared != start_from else None), shared
        torch.manual_seed(config.seed)  # the adapter's initial weights: the same config trains the same way
        self.reference: Any | None = None  # full fine-tuning: the frozen base model of the KL penalty
        if lora.enabled:
            self.model = load_policy(model_path, lora_r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                     target_modules=lora.target_modules,
                                     target_parameters=lora.target_parameters, device=self.device,
                                     dtype=config.trainer.dtype, adapter_path=start_from)
        else:
            self.model = load_full_policy(start_from or model_path, device=self.device, dtype=config.trainer.dtype)
            if config.kl_penalty.enabled:
                self.reference = load_full_policy(model_path, device=self.device, dtype=config.trainer.dtype,
                                                  trainable=False)
        if copy is not None:
            shutil.rmtree(copy, ignore_errors=True)
        settings = config.trainer
        cuda = self.device.startswith("cuda")
        self.attention, attention_note = choose_attention(
            settings.attention, self.device, *(m for m in (self.model, self.reference) if m is not None))
        # On a GPU the row budget and activation checkpointing are settled when the first batch comes (`plan_rows`),
        # from the memory free then: the sampler, which may share the GPU, starts after the trainer.
        self.row_tokens = settings.micro_batch_tokens or CPU_ROW_TOKENS
        self.memory_plan: MemoryPlan | None = None
        self.plan_pending = cuda
        self.checkpointing = settings.activation_checkpointing is True
        if self.checkpointing:
            enable_activation_checkpointing(self.model)
        self.compiled = compiles(settings.compile, self.device)
        if self.compiled:
            compile_layers(self.model)
        if self.compiled or self.attention != "sdpa":  # FlexAttention is compiled too (by transformers, per shape)
            allow_recompiles()
        self.clock = compile_clock() if self.compiled or self.attention != "sdpa" else None
        self.clock_mark = self.clock.read() if self.clock is not None else (0.0, 0)
        self.steps_run = 0  # steps this process has trained
        self.recompiles = 0  # graphs compiled after the first WARMUP_STEPS of this process
        self.forward = self.wrap_model()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=config.learning_rate,
                                           weight_decay=config.trainer.weight_decay)
        self.kl_beta = config.kl_penalty.beta if config.kl_penalty.enabled else 0.0
        state = self.dist.share(state)
        if state is not None and "fsdp" in (state.get("strategy"), self.strategy):
            state = self.load_sharded_state(start_from, state)
        self.resume_state = state  # what a subclass saved beside the optimizer (`extra_state`), on a resume
        if state is not None:
            if state.get("optimizer") is not None:
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
        precision = precision_of(self.model)  # full fine-tuning: e.g. bfloat16 with float32 master weights
        dtype = precision.describe() if precision is not None else str(next(self.model.parameters()).dtype)
        what = (f"LoRA r={lora.r} alpha={lora.alpha:g} on {', '.join(lora.target_modules + lora.target_parameters)}"
                if lora.enabled
                else f"full fine-tuning in {dtype}")
        if self.checkpointing:
            what += ", activation checkpointing"
        if self.compiled:
            what += ", compiled layers"
        head_note = "lm_head_chunk_size = 0"
        if settings.lm_head_chunk_size:  # the chunked head where it gives the model's own logprobs, else the dense one
            mismatches = [note for m in (self.model, self.reference) if m is not None
                          if (note := head_matches_model(m, self.device))]
            if mismatches:
                self.log(mismatches[0], "WARNING")
            head_note = chunkable_head(self.model)[1]
        rows = f"rows of up to {self.row_tokens} tokens" if not cuda or settings.micro_batch_tokens else \
            "rows sized at the first batch from the free memory"
        layout = (f"{rows} through {describe_attention(self.attention)}"
                  + (f", LM head whole ({head_note})" if head_note else
                     f", LM head {settings.lm_head_chunk_size} tokens a chunk"))
        layout += auto_settings_note(settings, cuda=cuda, compiled=self.compiled, attention=self.attention)
        ranks = f" x {self.dist.world_size} ranks ({self.strategy.upper()}, {self.dist.backend})" \
            if self.strategy else ""
        self.log(f"trainer ready on {self.device}{ranks}: {model_path.name}, {what} ({n_train:,} trainable "
                 f"parameters); {layout}; " + (f"resuming after step {self.start_step}" if self.start_step
                                               else "starting at step 1"))
        if attention_note:
            self.log(attention_note, "WARNING")

    # Past one process ------------------------------------------------------------------------------------------
    def wrap_model(self) -> Any:
        """The module the policy's forward goes through: the model itself (one process), its DDP wrapper, or the
        model sharded in place by FSDP2 (each decoder layer, then the root; the KL reference likewise)."""
        import torch

        if self.strategy == "ddp":
            cuda = self.device.startswith("cuda")
            return torch.nn.parallel.DistributedDataParallel(
                self.model, device_ids=[self.dist.local_rank] if cuda else None)
        if self.strategy == "fsdp":
            for model in (self.model, self.reference):
                if model is not None:
                    shard_model(model)  # float32 master weights gathered in the compute dtype
        return self.model

    def grad_sync(self, last: bool) -> contextlib.AbstractContextManager[Any]:
        """The context of one micro-batch's backward: gradients are reduced over the ranks on the last one only."""
        if self.strategy == "ddp" and not last:
            return self.forward.no_sync()  # type: ignore[no-any-return]
        if self.strategy == "fsdp":
            self.model.set_requires_gradient_sync(last)
        return contextlib.nullcontext()

    def full_state_dict(self) -> dict[str, Any] | None:
        """FSDP: the whole model's weights gathered on rank 0 (None on the others); otherwise None (the model
        saves its own)."""
        if self.strategy != "fsdp":
            return None
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if not self.dist.is_main:
            return None
        if getattr(self.model.config, "tie_word_embeddings", False):  # a tied head is saved once, as one process
            for tied in getattr(self.model, "_tied_weights_keys", None) or []:  # saves it
                state.pop(tied, None)
        return state

    def save_sharded_state(self, folder: Path) -> None:
        """FSDP: every rank writes its shard of the model and optimizer state (a distributed checkpoint)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=str(folder / "dcp"))

    def load_sharded_state(self, folder: Path | None, state: dict[str, Any] | None) -> dict[str, Any] | None:
        """FSDP resume: the shards of `folder/dcp` (written by the same number of ranks), and rank 0's
        trainer_state (KL beta, RNG)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        assert folder is not None and state is not None
        written_by = state.get("world_size", 1)
        how = f"{written_by} FSDP ranks" if state.get("strategy") == "fsdp" else \
            f"{written_by} process(es) without FSDP"
        if written_by != self.dist.world_size or self.strategy != state.get("strategy"):
            raise ValueError(f"checkpoint {folder.name} was written by {how}, and its optimizer state resumes only "
                             f"the same way (now: {self.dist.world_size} process(es), "
                             f"{(self.strategy or 'no FSDP').upper()}): set [trainer] nproc_per_node x nnodes and "
                             "distributed back, or start a new run from its weights with checkpoint_id")
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        shards: dict[str, Any] = {"model": model_state, "optimizer": optim_state}
        dcp.load(shards, checkpoint_id=str(folder / "dcp"))
        set_state_dict(self.model, self.optimizer, model_state_dict=shards["model"],
                       optim_state_dict=shards["optimizer"])
        return {**state, "optimizer": None}

    def log(self, message: str, level: str = "INFO", step: int | None = None) -> None:
        if self.dist.is_main or level in ("WARNING", "ERROR"):
            log_both(self.events, message, level, step)

    # Memory and compiling --------------------------------------------------------------------------------------
    def plan_rows(self, samples: list[Sample]) -> None:
        """On a GPU, at the first batch: the row budget and activation checkpointing left to auto, from the memory
        free now (the smallest over the ranks: every rank packs the batch the same way), logged with the estimate."""
        if not self.plan_pending:
            return
        import torch

        self.plan_pending = False
        settings = self.config.trainer
        free, total = torch.cuda.mem_get_info(torch.device(self.device))
        available = free_device_bytes(self.device) or 0
        others = max(0, int(total) - int(free) - torch.cuda.memory_reserved(self.device))
        if self.dist.world_size > 1:  # each rank its own slot: the sum is every rank's figure
            slots = [0.0] * self.dist.world_size
            slots[self.dist.rank] = float(available)
            available = int(min(self.dist.sum(slots)))
        trainable = sum((p.to_local() if hasattr(p, "to_local") else p).numel() * p.element_size()
                        for p in self.params)  # this rank's shard under FSDP
        self.memory_plan = plan = plan_memory(
            model_shape(self.model, trainable), available=available, total=int(total), others=others,
            row_tokens=settings.micro_batch_tokens, longest=max((len(s.input_ids) for s in samples), default=0),
            checkpointing=settings.activation_checkpointing, compiled=self.compiled,
            head_chunk=settings.lm_head_chunk_size)
        self.row_tokens = plan.row_tokens
        if plan.checkpointing and not self.checkpointing:
            enable_activation_checkpointing(self.model)
            self.checkpointing = True
        self.log(plan.describe(), "WARNING" if plan.need > plan.available else "INFO")

    @contextlib.contextmanager
    def out_of_memory_as_error(self, step: int) -> Iterator[None]:
        """A CUDA out-of-memory error in the step becomes OutOfMemory: one line with the memory at the first batch
        and the settings to change (the traceback stays in the process's log)."""
        import torch

        try:
            yield
        except torch.OutOfMemoryError as exc:
            plan = self.memory_plan
            raise OutOfMemory(out_of_memory_message(
                step=step, free=plan.available if plan else None, total=plan.total if plan else None,
                others=plan.others if plan else None, row_tokens=self.row_tokens, checkpointing=self.checkpointing,
                when=" at the first batch")) from exc

    def step_timing(self, step: int, elapsed: float, tokens: int, throughput: str) -> dict[str, float]:
        """The step's time metrics: `time/step`, the throughput (`throughput`, tokens a second) unless the
        process's first step compiled, `time/compile` (seconds compiling, on a step that compiled), and, past the
        first WARMUP_STEPS, `compile/recompiles`: graphs compiled since (each also a WARNING with torch's reason)."""
        metrics = {"time/step": elapsed}
        self.steps_run += 1
        compiled_s = 0.0
        if self.clock is not None:
            seconds, graphs = self.clock.read()
            compiled_s, new_graphs = seconds - self.clock_mark[0], graphs - self.clock_mark[1]
            self.clock_mark = (seconds, graphs)
            if compiled_s > 0 or (self.steps_run == 1 and self.compiled):
                metrics["time/compile"] = compiled_s
            if self.steps_run > WARMUP_STEPS:
                self.recompiles += new_graphs
                metrics["compile/recompiles"] = float(self.recompiles)
                if new_graphs:
                    why = "; ".join(recompile_reasons(new_graphs)[:2]) or "torch gave no reason"
                    self.log(f"step {step}: torch.compile compiled {new_graphs} more graph(s) ({compiled_s:.1f} s; "
                             f"{self.recompiles} since step {self.start_step + WARMUP_STEPS}): {why}", "WARNING",
                             step)
        if not (self.steps_run == 1 and compiled_s > 0):
            metrics[throughput] = tokens / elapsed if elapsed > 0 else 0.0
        return metrics

    def lr_at(self, step: int) -> float:
        warmup = self.config.warmup_steps
        scale = min(1.0, step / warmup) if warmup > 0 else 1.0
        return self.config.learning_rate * scale

    def wait_for_batch(self, step: int) -> list[Sample] | None:
        """Step `step`'s batch (None: the run is stopping). Rank 0 waits for the file and sends the samples; the
        other ranks take what it sends, heartbeats included."""
        if not self.dist.is_main:
            while True:
                got: Any = self.dist.share(None)
                if got != WAITING:
                    return got  # type: ignore[no-any-return]
        path = batch_path(self.run.rollouts_dir, step)
        beat = time.monotonic()
        while not path.exists():
            if self.stop.set:
                return self.dist.share(None)
            if self.dist.world_size > 1 and time.monotonic() - beat >= HEARTBEAT_S:
                self.dist.share(WAITING)
                beat = time.monotonic()
            time.sleep(POLL_S)
        return self.dist.share(read_batch(path))

    def train(self) -> int:
        import torch

        cfg = self.config
        assert isinstance(cfg, RLConfig)
        for step in range(self.start_step + 1, cfg.max_steps + 1):
            t_wait = time.perf_counter()
            batch = self.wait_for_batch(step)
            if batch is None:
                break
            waited = time.perf_counter() - t_wait
            samples = [truncate(s, cfg.trainer.max_seq_len) for s in batch]
            with self.out_of_memory_as_error(step):
                self.plan_rows(samples)
                t0 = time.perf_counter()
                lr = self.lr_at(step)
                for group in self.optimizer.param_groups:
                    group["lr"] = lr
                self.optimizer.zero_grad(set_to_none=True)
                self.model.train()
                # cross-entropy (loss = "sft": a teacher's tokens) is of the model's own distribution, temperature 1
                sft = cfg.loss == "sft"
                result = accumulate_batch_gradients(
                    self.model, samples, device=self.device, loss=cfg.loss,
                    temperature=1.0 if sft else cfg.sampling.temperature, top_p=1.0 if sft else cfg.sampling.top_p,
                    micro_batch_size=cfg.trainer.micro_batch_size, micro_batch_tokens=self.row_tokens,
                    attention=self.attention, lm_head_chunk_size=cfg.trainer.lm_head_chunk_size,
                    accumulation_steps=cfg.gradient_accumulation_steps, ratio_low=cfg.trainer.ratio_mask_low,
                    ratio_high=cfg.trainer.ratio_mask_high, kl_beta=self.kl_beta, reference=self.reference,
                    dist=self.dist, forward=self.forward, grad_sync=self.grad_sync)
                norm = torch.nn.utils.clip_grad_norm_(self.params, cfg.trainer.max_grad_norm)
                grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
                if math.isfinite(grad_norm):
                    self.optimizer.step()
                else:
                    self.log(f"step {step}: gradient norm is {grad_norm}; skipped the update", "WARNING", step)
                self.publish_policy(step)
            elapsed = time.perf_counter() - t0
            metrics = {"loss": result.loss, "policy/entropy": result.entropy, "policy/kl": result.mismatch_kl,
                       "policy/masked_fraction": result.masked_fraction,
                       "policy/outside_nucleus": result.outside_nucleus, "optim/lr": lr, "optim/grad_norm": grad_norm,
                       **self.step_timing(step, elapsed, result.tokens, "perf/train_tokens_per_s"),
                       "time/wait_for_batch": waited,
                       "train/samples": float(len(samples)), "train/loss_tokens": float(result.loss_tokens),
                       "perf/peak_memory_gib": peak_memory_gib(self.device)}
            if result.teacher_kl is not None:
                metrics["teacher/kl"] = result.teacher_kl
            if result.ref_kl is not None:
                metrics["policy/ref_kl"] = result.ref_kl
                metrics["policy/kl_beta"] = self.kl_beta
                self.adapt_kl_beta(result.ref_kl)
            stopping = self.dist.share(self.stop.set)  # rank 0 decides for every rank
            if self.dist.is_main:
                self.events.metrics(metrics, step)
                self.run.update_status(step=step)
                print(f"[trainer] step {step}/{cfg.max_steps} loss {result.loss:.4f} entropy {result.entropy:.3f} "
                      f"grad_norm {grad_norm:.3f} {elapsed:.2f}s", flush=True)
            if step % max(1, self.checkpoint_interval or cfg.max_steps) == 0 or step == cfg.max_steps or stopping:
                self.save_checkpoint(step)
            if stopping:
                break
        else:
            self.dist.close()
            return 0
        last = self.dist.share(self.latest_trained_step())
        if last > self.last_checkpoint:
            self.save_checkpoint(last)
        self.dist.close()
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
        """Version `step` for the sampler: the adapter (LoRA) or the whole model (full fine-tuning). Every rank
        calls it (FSDP gathers the weights); rank 0 writes."""
        final = self.versions / f"step_{step}"
        with self.writing(self.versions, f"step_{step}") as tmp:
            if tmp is not None:
                self.save_policy(tmp)
        if self.dist.is_main:
            self.prune_versions(step)
        return final

    def save_policy(self, folder: Path) -> None:
        full = self.full_state_dict()
        if self.dist.is_main:
            save_weights(self.model, folder, full)  # full fine-tuning: in the compute dtype (bfloat16 on CUDA)

    @contextlib.contextmanager
    def writing(self, root: Path, name: str) -> Iterator[Path | None]:
        """A folder `root/name` written whole: rank 0 stages it (yielded to every rank, which may write into it
        collectively; None on the others when they write nothing), then moves it into place."""
        tmp = staging_folder(root / name) if self.dist.is_main else None
        shared = self.dist.share(tmp) if self.strategy == "fsdp" else tmp
        yield shared
        self.dist.barrier()
        if tmp is not None:
            publish_folder(tmp, root / name)

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
        """The policy as published (version `step`'s files, hard-linked: the same bytes, neither written nor
        gathered again; one process's float32 master weights, where the version is cast down, written whole) and
        trainer_state.pt (with the optimizer state; with FSDP the sharded model, masters included, and optimizer
        are in dcp/ instead). Every rank calls it; rank 0 writes all but FSDP's shards."""
        import torch

        root = self.run.checkpoints_dir
        final = root / f"step_{step}"
        with self.writing(root, f"step_{step}") as tmp:
            if self.strategy == "fsdp":
                assert tmp is not None
                self.save_sharded_state(tmp)
            if self.dist.is_main and tmp is not None:
                precision = precision_of(self.model)
                if self.strategy != "fsdp" and precision is not None and precision.params != precision.compute:
                    self.model.save_pretrained(tmp)  # the masters: a resume continues exactly
                else:
                    shutil.copytree(self.versions / f"step_{step}", tmp, copy_function=link_or_copy,
                                    dirs_exist_ok=True)
                optimizer = None if self.strategy == "fsdp" else self.optimizer.state_dict()
                torch.save({"optimizer": optimizer, "step": step, "kl_beta": self.kl_beta,
                            "torch_rng": torch.get_rng_state(), "world_size": self.dist.world_size,
                            "strategy": self.strategy, **self.extra_state()}, tmp / "trainer_state.pt")
        self.last_checkpoint = step
        if self.dist.is_main:
            self.events.emit("checkpoint", {"path": str(final), "step": step}, step=step)
            self.prune_checkpoints()
        return final

    def extra_state(self) -> dict[str, Any]:
        """More to keep in each checkpoint's trainer_state.pt (the SFT trainer's place in its data)."""
        return {}

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


def trainer_main(module: str, build: Callable[[Run, Path, bool], Trainer], argv: list[str] | None = None) -> int:
    """A trainer process (`python -m MODULE RUN_DIR --model-path PATH [--resume]`): `build(run, model_path,
    resume)` makes the trainer, which trains; an error becomes the run's reason (guarded_main), naming the rank
    under torchrun, whose ranks exit through exit_rank."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--model-path", type=Path, required=True)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)
    run = Run(args.run_dir)
    torchrun = "LOCAL_RANK" in os.environ
    code = guarded_main(run, "trainer", lambda: build(run, args.model_path, args.resume).train(),
                        who=f"trainer rank {os.environ.get('RANK')}" if torchrun else None)  # say which rank failed
    if torchrun:
        exit_rank(code)
    return code


def main(argv: list[str] | None = None) -> int:
    return trainer_main("prime_lab.trainer.train",
                        lambda run, model_path, resume: Trainer(run, load_config(run), model_path, resume=resume),
                        argv)


if __name__ == "__main__":
    sys.exit(main())
