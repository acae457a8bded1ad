"""The SFT config: our RL config's top-level fields where they mean the same, plus prime-rl's SFT `[data]` and `[val]`.

prime-rl's SFT trainer (`sft @ cfg.toml`) reads a flat config: `max_steps`, `[model] name` with `[model.lora]`,
`[data]` (`name` or `[[data.source]] dataset`, `seq_len`, `batch_size`, `micro_batch_size`, `splits`, `shuffle`,
`seed`, `loss_mask`), `[val]`, `[optim] lr`, `[ckpt]`, `[monitors.wandb]`. Those spellings are accepted beside ours
(`model = "..."`, `[lora]`, `learning_rate`, `[checkpoints]`, `[wandb]`), so prime-rl's SFT configs run here; each
setting may be given one way only, and `SFTConfig` folds them into one place after validation, so the trainer reads
one field each (`model.name`, `lora`, `learning_rate`, `checkpoints`, `wandb`, `trainer`).

`validate_sft_config(text)` returns every problem at once, with its line (problems/validation.py), like the RL config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, Field, field_validator, model_validator

from prime_lab.problems.schema import ConfigSection
from prime_lab.problems.validation import CheckContext, Validation, validate_file, validate_toml
from prime_lab.trainer.config import (
    AdaptersConfig,
    CheckpointsConfig,
    KLPenaltyConfig,
    LoraConfig,
    TrainerConfig,
    WandbConfig,
)

DEFAULT_DATASET = "PrimeIntellect/Reverse-Text-SFT"  # prime-rl's default [data] name


class LossMaskConfig(ConfigSection):
    """Which messages' tokens are trained on, by role (prime-rl's default: the assistant's only)."""

    system: bool = False
    user: bool = False
    assistant: bool = True
    tool: bool = False


class DataSourceConfig(ConfigSection):
    dataset: str = Field(description="A local file or folder (jsonl, json, parquet, a `datasets` folder) or a "
                         "Hugging Face dataset id in the local cache.")
    subsets: list[str] | None = Field(default=None, description="Dataset configurations (Hub datasets).")
    splits: list[str] | None = Field(default=None, description="Splits (default: [data].splits).")


class DataConfig(ConfigSection):
    type: Literal["sft"] = Field(default="sft", description="prime-rl's data kind; only sft here.")
    name: str | None = Field(default=None, description="A local file or folder (jsonl, json, parquet, a `datasets` "
                             "folder) or a Hugging Face dataset id in the local cache (default: "
                             f"{DEFAULT_DATASET}).")
    source: list[DataSourceConfig] = Field(default_factory=list, description="Several datasets, mixed "
                                           "(alternative to name).")
    subsets: list[str] | None = Field(default=None, description="Dataset configurations (Hub datasets).")
    splits: list[str] = Field(default_factory=lambda: ["train"], description="Splits to train on.")
    shuffle: bool = Field(default=True, description="Shuffle the examples (again each pass over the data).")
    seed: int = Field(default=0, description="Shuffling seed.")
    seq_len: int = Field(default=128, ge=8, description="Tokens per packed row; longer examples are cut to it.")
    batch_size: int = Field(default=128, ge=1, description="Packed rows of seq_len tokens per step.")
    micro_batch_size: int = Field(default=1, ge=1, description="Rows per forward pass (prime-rl); locally the "
                                  "rows of a pass are [trainer].micro_batch_tokens long.")
    loss_mask: LossMaskConfig = Field(default_factory=LossMaskConfig)

    @property
    def datasets(self) -> list[DataSourceConfig]:
        """The datasets to read, with the section's subsets and splits where a source names none."""
        sources = self.source or [DataSourceConfig(dataset=self.name or DEFAULT_DATASET)]
        return [DataSourceConfig(dataset=s.dataset, subsets=s.subsets if s.subsets is not None else self.subsets,
                                 splits=s.splits if s.splits is not None else self.splits) for s in sources]


class ValDataConfig(ConfigSection):
    name: str | None = Field(default=None, description="Validation dataset (default: the training dataset).")
    source: list[DataSourceConfig] = Field(default_factory=list)
    subsets: list[str] | None = None
    splits: list[str] = Field(default_factory=lambda: ["validation"], description="Splits to validate on.")


class SFTValConfig(ConfigSection):
    interval: int = Field(default=0, ge=0, description="Validate every N steps (0: only at the end).")
    eval_on_start: bool = Field(default=False, description="Also validate before step 1.")
    num_examples: int | None = Field(default=None, ge=1, description="Validation examples (default: all).")
    data: ValDataConfig = Field(default_factory=ValDataConfig)


class ModelSection(ConfigSection):
    """prime-rl's `[model]` table; `model = "..."` is the same as `[model] name = "..."`."""

    name: str = Field(description="Model: a preset (`prime rl models`), a Hugging Face id, a local path, or a "
                      "completed SFT run's id.")
    lora: LoraConfig | None = Field(default=None, description="prime-rl's [model.lora] (alternative to [lora]).")


class OptimConfig(ConfigSection):
    lr: float | None = Field(default=None, gt=0.0, description="Learning rate (alternative to learning_rate).")
    weight_decay: float | None = Field(default=None, ge=0.0, description="AdamW weight decay (alternative to "
                                       "[trainer].weight_decay).")
    max_norm: float | None = Field(default=None, gt=0.0, description="Gradient clipping (alternative to "
                                   "[trainer].max_grad_norm).")


class CkptConfig(ConfigSection):
    interval: int | None = Field(default=None, ge=0, description="Checkpoint every N steps (alternative to "
                                 "[checkpoints].interval).")
    keep_last: int | None = Field(default=None, ge=-1, description="Checkpoints kept (alternative to "
                                  "[checkpoints].keep_cloud).")


class MonitorsConfig(ConfigSection):
    wandb: WandbConfig | None = None


class SFTConfig(ConfigSection):
    model: ModelSection = Field(validation_alias=AliasChoices("model", "model_name"))
    max_steps: int = Field(ge=1, description="Training steps (the data loops until then).")
    learning_rate: float = Field(default=1e-4, gt=0.0)
    warmup_steps: int = Field(default=0, ge=0)
    checkpoint_id: str | None = Field(default=None, description="Warm-start: a run id or a checkpoints/step_N folder.")
    data: DataConfig = Field(default_factory=DataConfig)
    val: SFTValConfig | None = None
    lora: LoraConfig = Field(default_factory=LoraConfig)
    wandb: WandbConfig | None = None
    checkpoints: CheckpointsConfig = Field(default_factory=CheckpointsConfig)
    adapters: AdaptersConfig = Field(default_factory=AdaptersConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    # prime-rl's spellings
    optim: OptimConfig | None = None
    ckpt: CkptConfig | None = None
    monitors: MonitorsConfig | None = None

    @field_validator("model", mode="before")
    @classmethod
    def _name_as_table(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _merge_spellings(self) -> SFTConfig:
        """Fold prime-rl's spellings into ours (both given: `_check_spellings` reports it)."""
        if self.model.lora is not None:
            self.lora = self.model.lora
        if self.optim is not None:
            if self.optim.lr is not None:
                self.learning_rate = self.optim.lr
            if self.optim.weight_decay is not None:
                self.trainer.weight_decay = self.optim.weight_decay
            if self.optim.max_norm is not None:
                self.trainer.max_grad_norm = self.optim.max_norm
        if self.ckpt is not None:
            if self.ckpt.interval is not None:
                self.checkpoints.interval = self.ckpt.interval
            if self.ckpt.keep_last is not None:
                self.checkpoints.keep_cloud = self.ckpt.keep_last
        if self.monitors is not None and self.monitors.wandb is not None:
            self.wandb = self.monitors.wandb
        return self

    # What the trainer (trainer/train.py) reads from an RL config, at its SFT value
    @property
    def kl_penalty(self) -> KLPenaltyConfig:
        return KLPenaltyConfig()

    @property
    def max_async_level(self) -> int:
        return 0

    @property
    def seed(self) -> int:
        """The run's seed (the trainer's initial adapter weights, and the data order): [data].seed."""
        return self.data.seed


def _conflict(ctx: CheckContext, ours: tuple[str, ...], theirs: tuple[str, ...], what: str) -> None:
    if ctx.has(ours) and ctx.has(theirs):
        ctx.problem(theirs, f"{'.'.join(ours)} and {'.'.join(theirs)} both set {what}: keep one")


def _check_spellings(ctx: CheckContext) -> None:
    _conflict(ctx, ("lora",), ("model", "lora"), "the LoRA adapter")
    _conflict(ctx, ("learning_rate",), ("optim", "lr"), "the learning rate")
    _conflict(ctx, ("trainer", "weight_decay"), ("optim", "weight_decay"), "the weight decay")
    _conflict(ctx, ("trainer", "max_grad_norm"), ("optim", "max_norm"), "gradient clipping")
    _conflict(ctx, ("checkpoints", "interval"), ("ckpt", "interval"), "the checkpoint interval")
    _conflict(ctx, ("checkpoints", "keep_cloud"), ("ckpt", "keep_last"), "how many checkpoints are kept")
    _conflict(ctx, ("wandb",), ("monitors", "wandb"), "W&B")
    _conflict(ctx, ("data", "name"), ("data", "source"), "the dataset")
    _conflict(ctx, ("val", "data", "name"), ("val", "data", "source"), "the validation dataset")
    if ctx.has(("trainer", "max_seq_len")):
        ctx.problem(("trainer", "max_seq_len"), "SFT rows are [data].seq_len tokens long: set that instead")


def _check_rows(ctx: CheckContext) -> None:
    seq_len = ctx.get(("data", "seq_len"), DataConfig.model_fields["seq_len"].default)
    row = ctx.get(("trainer", "micro_batch_tokens"))
    if isinstance(seq_len, int) and isinstance(row, int) and not isinstance(row, bool) and 0 < row < seq_len:
        ctx.problem(("trainer", "micro_batch_tokens"), f"micro_batch_tokens ({row}) is shorter than [data].seq_len "
                    f"({seq_len}): an example of seq_len tokens would not fit a row; raise it or lower seq_len")
    if not ctx.has(("data",)) or not (ctx.has(("data", "name")) or ctx.has(("data", "source"))):
        ctx.problem(("data",) if ctx.has(("data",)) else ("max_steps",),
                    f"no dataset named: [data] name defaults to {DEFAULT_DATASET} (the Hub), which must be in "
                    "this machine's Hugging Face cache; name a local jsonl, json, parquet or datasets folder",
                    severity="note")


def _check_full_finetuning(ctx: CheckContext) -> None:
    from prime_lab.trainer.config import FULL_FINETUNING_LR, LORA_SCALE_LR

    lora = ctx.get(("model", "lora")) if ctx.has(("model", "lora")) else ctx.get(("lora",), {})
    if not isinstance(lora, dict) or lora.get("enabled", True) is not False:
        return
    lr = ctx.get(("optim", "lr"), ctx.get(("learning_rate",), SFTConfig.model_fields["learning_rate"].default))
    if isinstance(lr, int | float) and not isinstance(lr, bool) and lr >= LORA_SCALE_LR:
        ctx.problem(("lora", "enabled") if ctx.has(("lora",)) else ("model", "lora", "enabled"),
                    f"a learning rate of {lr:g} is a LoRA rate; full fine-tuning moves every weight: about "
                    f"{FULL_FINETUNING_LR:g}-2e-5 (prime-rl's SFT examples use 1e-5 to 2e-5)", severity="note")


SFT_CHECKS = (_check_spellings, _check_rows, _check_full_finetuning)


def validate_sft_config(text: str, file: str | None = None) -> Validation[SFTConfig]:
    """Every problem of the SFT config `text` (never raises for bad input)."""
    return validate_toml(text, SFTConfig, file=file, checks=SFT_CHECKS)


def validate_sft_file(path: Path) -> Validation[SFTConfig]:
    return validate_file(path, SFTConfig, checks=SFT_CHECKS)


def template_path() -> Path:
    return Path(__file__).with_name("sft_template.toml")
