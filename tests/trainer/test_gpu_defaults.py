"""The trainer's defaults on CUDA, driven on the CPU with a faked device where they need one: `compile` and
`attention` "auto" (compiled layers on CUDA; a row of one sequence through SDPA without a mask, a packed row through
FlexAttention with a BlockMask built from the row's structure, never a dense [T, T] mask), and on the CPU exactly
the behaviour from before (no compiling, SDPA with a dense mask, rows of 1,024 tokens)."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask

from prime_lab.trainer.attention import (
    CPU_ROW_TOKENS,
    FLEX,
    block_mask,
    choose_attention,
    describe_attention,
    packs_prefixes,
    padded_length,
    row_attention,
    row_inputs,
    row_structure,
    use_row_attention,
    visibility,
)
from prime_lab.trainer.batch import Sample
from prime_lab.trainer.config import TrainerConfig, validate_rl_config
from prime_lab.trainer.launcher import TRAINER_READY
from prime_lab.trainer.model import compiles, load_policy
from prime_lab.trainer.packing import pack
from prime_lab.trainer.train import auto_settings_note
from tests.support.trainer_runs import STEPS, base_batches, config_text, new_run, train, trainer_metrics


def _groups(vocab: int, rng: random.Random, groups: int, max_size: int = 4) -> list[Sample]:
    """`groups` prompts of 1-40 tokens, each with 1-`max_size` completions of 1-50 tokens."""
    samples = []
    for _ in range(groups):
        prompt = [rng.randrange(vocab) for _ in range(rng.randrange(1, 40))]
        for _ in range(rng.randrange(1, max_size + 1)):
            completion = [rng.randrange(vocab) for _ in range(rng.randrange(1, 50))]
            ids = prompt + completion
            samples.append(Sample(ids, [0] * len(prompt) + [1] * len(completion), [0.0] * len(ids), 1.0))
    return samples


# compile and attention "auto" ------------------------------------------------------------------------------------
def test_compile_auto_is_on_for_cuda_and_off_on_the_cpu_and_true_false_keep_working() -> None:
    assert compiles("auto", "cuda") and compiles("auto", "cuda:1") and not compiles("auto", "cpu")
    assert compiles(True, "cpu") and not compiles(False, "cuda")


def test_the_settings_default_to_auto_and_take_true_false_and_nothing_else() -> None:
    base = config_text(Path("m")).replace("micro_batch_size = 2\n", "")
    config = validate_rl_config(base).config
    assert config is not None
    assert (config.trainer.compile, config.trainer.attention, config.trainer.activation_checkpointing) == \
        ("auto", "auto", "auto")
    for value in ("true", "false"):
        result = validate_rl_config(base + f"compile = {value}\nactivation_checkpointing = {value}\n")
        assert result.config is not None, [p.format() for p in result.problems]
        assert result.config.trainer.compile is (value == "true")
        assert result.config.trainer.activation_checkpointing is (value == "true")
    result = validate_rl_config(base + 'compile = "yes"\nactivation_checkpointing = 1\n')
    assert {p.key for p in result.errors} == {"trainer.compile", "trainer.activation_checkpointing"}


def test_auto_attention_on_cuda_runs_one_sequence_through_sdpa_and_packed_rows_through_flex(
        tiny_model_dir: Path) -> None:
    """On a (faked) CUDA device, auto is "mixed": a row of one sequence gets no mask, its length as it is, and
    the model switched to SDPA (which then runs `is_causal`, its flash kernel on a GPU); a packed row gets a
    BlockMask over its padded length and the model switched to FlexAttention; the KL reference model follows."""
    policy, reference = load_policy(tiny_model_dir), load_policy(tiny_model_dir)
    assert choose_attention("auto", "cuda", policy, reference) == ("mixed", None)
    assert choose_attention("flex", "cuda", policy) == ("flex", None)
    assert packs_prefixes(policy, "mixed") and "SDPA without a mask" in describe_attention("mixed")
    rng = random.Random(0)
    single = pack(_groups(100, rng, 1, max_size=1), None)[0]
    packed = pack(_groups(100, rng, 2), None)[0]
    assert single.samples == 1 and packed.samples > 1 and len(packed) % 128
    assert (row_attention(single, "mixed"), row_attention(packed, "mixed")) == ("sdpa", "flex")
    assert (row_attention(single, "flex"), row_attention(packed, "sdpa")) == ("flex", "sdpa")
    for row, implementation in ((single, "sdpa"), (packed, FLEX), (single, "sdpa")):
        use_row_attention(row, "mixed", policy, reference)
        assert policy.config._attn_implementation == reference.config._attn_implementation == implementation
        inputs = row_inputs(policy, row, "cpu", "mixed")
        if implementation == "sdpa":
            assert inputs["attention_mask"] is None and inputs["input_ids"].shape == (1, len(row))
            assert inputs["position_ids"][0].tolist() == list(range(len(row)))  # no restart: not seen as packed
        else:
            assert isinstance(inputs["attention_mask"], BlockMask)
            assert inputs["input_ids"].shape == (1, padded_length(len(row)))
            assert inputs["attention_mask"].seq_lengths == (padded_length(len(row)),) * 2
    use_row_attention(packed, "flex", policy)  # flex and sdpa leave the model as choose_attention set it
    use_row_attention(single, "sdpa", policy)
    assert policy.config._attn_implementation == "sdpa"


def test_a_model_without_flex_support_keeps_sdpa_on_cuda_and_says_why(tiny_model_dir: Path) -> None:
    model = load_policy(tiny_model_dir)
    model.get_base_model()._supports_flex_attn = False
    attention, note = choose_attention("auto", "cuda", model)
    assert attention == "sdpa" and note is not None and "does not support it" in note


@torch.no_grad()
def test_mixed_rows_give_each_trained_token_the_dense_mask_logprob(tiny_model_dir: Path) -> None:
    """A batch under mixed attention (single-sequence rows through SDPA unmasked, packed rows through
    FlexAttention; forward only: FlexAttention has no backward on a CPU) scores every trained token as SDPA with a
    dense mask does."""
    model = load_policy(tiny_model_dir)
    vocab = model.config.vocab_size
    rows = pack(_groups(vocab, random.Random(1), 3), 3) + pack(_groups(vocab, random.Random(2), 2), 1)
    assert {row_attention(r, "mixed") for r in rows} == {"sdpa", "flex"}

    def logprobs(attention: str) -> list[float]:
        out = []
        for row in rows:
            use_row_attention(row, attention, model)
            logits = model(**row_inputs(model, row, "cpu", attention)).logits[0].float()
            out += torch.log_softmax(logits, -1).gather(-1, torch.tensor(row.targets)[:, None])[:, 0].tolist()
        return out

    dense = logprobs("sdpa")
    choose_attention("auto", "cuda", model)
    assert logprobs("mixed") == pytest.approx(dense, abs=1e-5)


# the BlockMask ---------------------------------------------------------------------------------------------------
def _effective(mask: BlockMask, tile: int) -> torch.Tensor:
    """The [T, T] mask FlexAttention applies: full tiles all visible, partial tiles by the mask_mod, the rest not."""
    length = mask.seq_lengths[0]
    q = torch.arange(length)
    rule = mask.mask_mod(torch.tensor(0), torch.tensor(0), q[:, None], q[None, :])
    partial = torch.zeros(length, length, dtype=torch.bool)
    full = torch.zeros_like(partial)
    for kind, num, indices in ((partial, mask.kv_num_blocks, mask.kv_indices),
                               (full, mask.full_kv_num_blocks, mask.full_kv_indices)):
        assert num is not None and indices is not None
        for i in range(num.shape[-1]):
            for j in indices[0, 0, i, :int(num[0, 0, i])].tolist():
                kind[i * tile:(i + 1) * tile, j * tile:(j + 1) * tile] = True
    return full | (partial & rule)


@pytest.mark.parametrize("seed", range(6))
def test_the_block_mask_is_the_dense_rule_and_torchs_own(seed: int) -> None:
    """Rows of several clusters (and rows of one sample), padded or not, with small tiles so that a row spans many:
    the BlockMask's tiles are exactly those `create_block_mask` finds from the dense mask, and what it lets through
    is exactly the packing mask (padding sees only padding)."""
    rng = random.Random(seed)
    rows = pack(_groups(100, rng, rng.randrange(1, 6)), rng.choice([None, 2, 3]), max_tokens=rng.choice([64, 4096]))
    full_tiles = 0
    for row in rows:
        tile = rng.choice([4, 8, 16])
        length = len(row) + rng.randrange(0, 3 * tile)
        mine = block_mask(row, length, "cpu", tile)
        block, part = row_structure(row, length, "cpu")
        torchs = create_block_mask(visibility(block, part), None, None, length, length, device="cpu",
                                   BLOCK_SIZE=tile)
        for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks",
                     "q_indices", "full_q_num_blocks", "full_q_indices"):
            assert torch.equal(getattr(mine, name), getattr(torchs, name)), (name, len(row), length, tile)
        effective = _effective(mine, tile)
        real = slice(0, len(row))
        assert torch.equal(effective[real, real], row.attention_mask("cpu")[0, 0])
        assert not effective[real, len(row):].any() and not effective[len(row):, real].any()
        full_tiles += int(mine.full_kv_num_blocks.sum())
    assert full_tiles > 0  # the full-tile path is exercised too


def test_a_long_rows_block_mask_is_built_without_a_dense_mask() -> None:
    """A 64k-token row (8 completions of a shared 512-token prompt): its dense mask alone would be 4 GiB of
    booleans (torch's `create_block_mask` holds more, as int64 indices); building the BlockMask raises the
    process's peak resident memory by well under 1 GiB, and the mask skips the tiles across completions."""
    script = textwrap.dedent("""
        import resource
        from prime_lab.trainer.attention import block_mask, padded_length
        from prime_lab.trainer.batch import Sample
        from prime_lab.trainer.packing import pack
        each = 65536 // 8
        prompt = list(range(512))
        samples = [Sample(prompt + [7] * (each - 512), [0] * 512 + [1] * (each - 512), [0.0] * each, 1.0)
                   for _ in range(8)]
        (row,) = pack(samples, None, max_tokens=65536)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        mask = block_mask(row, padded_length(len(row)), "cpu")
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        tiles = mask.kv_num_blocks.shape[-1]
        visible = int(mask.kv_num_blocks.sum() + mask.full_kv_num_blocks.sum())
        print(len(row), mask.seq_lengths[0], grown * 1024, tiles, visible)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True)
    length, padded, grown, tiles, visible = (int(x) for x in out.stdout.split())
    assert length > 60000 and padded == padded_length(length) and tiles == padded // 128
    assert grown < 2**30, f"building the BlockMask grew the process by {grown / 2**30:.2f} GiB"
    assert visible < tiles * (tiles + 1) // 2 / 4  # 8 completions: about an eighth of the causal tiles


# the CPU, as before ----------------------------------------------------------------------------------------------
def test_on_the_cpu_auto_resolves_to_what_ran_before(tiny_model_dir: Path) -> None:
    """Default settings on the CPU: no compiled layers, no checkpointing, SDPA with a dense mask, rows of 1,024
    tokens, step 1's throughput reported and no compile metrics; the log says what auto resolved to."""
    run = new_run(tiny_model_dir, config_text(tiny_model_dir), base_batches(tiny_model_dir, STEPS))
    trainer = train(run, tiny_model_dir)
    assert (trainer.compiled, trainer.checkpointing, trainer.attention, trainer.row_tokens) == \
        (False, False, "sdpa", CPU_ROW_TOKENS)
    assert not trainer.model.is_gradient_checkpointing and trainer.memory_plan is None
    layers = [m for m in trainer.model.modules() if type(m).__name__.endswith("DecoderLayer")]
    assert layers and all(layer._compiled_call_impl is None for layer in layers)
    metrics = trainer_metrics(run)
    assert all("perf/train_tokens_per_s" in m and "time/compile" not in m and "compile/recompiles" not in m
               for m in metrics.values())
    ready = [e.data["message"] for e in run.event_log().events()
             if e.kind == "log" and e.data["message"].startswith(TRAINER_READY)]
    assert len(ready) == 1  # the line the launcher waits for on a GPU it shares with vLLM
    assert "rows of up to 1024 tokens through SDPA with a dense mask" in ready[0]
    assert "(compile = auto: off (CPU); attention = auto: sdpa; activation_checkpointing = auto: off (CPU))" \
        in ready[0]


def test_the_ready_line_says_what_auto_became_on_cuda_and_on_the_cpu() -> None:
    auto = TrainerConfig()
    assert auto_settings_note(auto, cuda=True, compiled=True, attention="mixed") == (
        " (compile = auto: on (CUDA); attention = auto: mixed; activation_checkpointing = auto: at the first batch, "
        "from the free memory)")
    assert auto_settings_note(auto, cuda=False, compiled=False, attention="sdpa") == (
        " (compile = auto: off (CPU); attention = auto: sdpa; activation_checkpointing = auto: off (CPU))")
    given = TrainerConfig(compile=False, attention="flex", activation_checkpointing=True)
    assert auto_settings_note(given, cuda=True, compiled=False, attention="flex") == ""
