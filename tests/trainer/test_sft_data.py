"""SFT data: rows from each local format, both row shapes, the loss mask by role checked token by token against
the chat template's own rendering, and the stream that fills each step's rows and resumes from its position."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from prime_lab.trainer.sft_config import DataSourceConfig, LossMaskConfig
from prime_lab.trainer.sft_data import (
    SFTDataError,
    SFTExamples,
    SFTStream,
    chat_tokens,
    read_source,
    row_chat,
)
from tests.support.sft_runs import assistant_spans

ROWS = [{"messages": [{"role": "user", "content": f"say {i}"}, {"role": "assistant", "content": f"{i}!"}]}
        for i in range(6)]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Reverse abc"},
        {"role": "assistant", "content": "cba"}, {"role": "user", "content": "and xyz?"},
        {"role": "assistant", "content": "zyx"}]


def test_each_local_format_reads_the_same_rows(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets import Dataset, DatasetDict

    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS) + "\n")
    (tmp_path / "rows.json").write_text(json.dumps(ROWS))
    (tmp_path / "wrapped.json").write_text(json.dumps({"train": ROWS}))
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "rows.parquet")
    Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "one"))
    DatasetDict({"train": Dataset.from_list(ROWS), "validation": Dataset.from_list(ROWS[:2])}).save_to_disk(
        str(tmp_path / "splits"))
    folder = tmp_path / "files"
    folder.mkdir()
    (folder / "train-000.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS[:3]))
    (folder / "train-001.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS[3:]))
    (folder / "validation.jsonl").write_text(json.dumps(ROWS[0]) + "\n")
    for name in ("rows.jsonl", "rows.json", "wrapped.json", "rows.parquet", "one", "splits", "files"):
        got = read_source(DataSourceConfig(dataset=str(tmp_path / name), splits=["train"]))
        assert [row_chat(r)[0] for r in got] == [r["messages"] for r in ROWS], name
    val = read_source(DataSourceConfig(dataset=str(tmp_path / "splits"), splits=["validation"]))
    assert len(val) == 2
    assert len(read_source(DataSourceConfig(dataset=str(folder), splits=["validation"]))) == 1


def test_a_hub_dataset_in_the_local_cache_reads_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dataset repository as `hf download --repo-type dataset` leaves it in the cache, read with no network."""
    cache = tmp_path / "hub"
    snapshot = cache / "datasets--someone--chats" / "snapshots" / ("a" * 40)
    (snapshot / "data").mkdir(parents=True)
    (snapshot / "data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (cache / "datasets--someone--chats" / "refs").mkdir()
    (cache / "datasets--someone--chats" / "refs" / "main").write_text("a" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    rows = read_source(DataSourceConfig(dataset="someone/chats", splits=["train"]))
    assert [r["messages"] for r in rows] == [r["messages"] for r in ROWS]
    with pytest.raises(SFTDataError, match="someone/missing.*hf download --repo-type dataset"):
        read_source(DataSourceConfig(dataset="someone/missing", splits=["train"]))


def test_bad_data_is_reported_with_where_and_what(tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl").write_text('{"messages": []}\nnot json\n')
    with pytest.raises(SFTDataError, match=r"bad.jsonl:2: not a JSON object"):
        read_source(DataSourceConfig(dataset=str(tmp_path / "bad.jsonl")))
    with pytest.raises(SFTDataError, match="no such file"):
        read_source(DataSourceConfig(dataset="./missing.jsonl"))
    with pytest.raises(SFTDataError, match="neither `messages` nor `prompt` \\+ `completion`.*text"):
        row_chat({"text": "hello"})
    with pytest.raises(SFTDataError, match="role 'robot'"):
        row_chat({"messages": [{"role": "robot", "content": "beep"}]})


def test_prompt_completion_rows_are_chats() -> None:
    messages, tools = row_chat({"prompt": "Reverse abc", "completion": "cba"})
    assert messages == [{"role": "user", "content": "Reverse abc"}, {"role": "assistant", "content": "cba"}]
    assert tools is None
    listed, tools = row_chat({"prompt": [{"role": "system", "content": "s"}, {"content": "u"}],
                              "completion": [{"content": "a"}], "tools": json.dumps([{"type": "function"}])})
    assert [m["role"] for m in listed] == ["system", "user", "assistant"] and tools == [{"type": "function"}]
    assert row_chat({"messages": CHAT, "prompt": "ignored", "completion": "ignored"})[0] == CHAT  # messages win


def expected_mask(tokenizer: Any, messages: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
    """Independently of chat_tokens: the template's whole rendering, tokenized at once, and 1 on the tokens inside
    an assistant message's span (its content and the end-of-turn marker after it), found in the rendered text."""
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    spans = assistant_spans(text, messages, "<|im_end|>")
    mask = [int(any(s <= a < e for s, e in spans)) for a, _ in encoded["offset_mapping"]]
    return encoded["input_ids"], mask


@pytest.mark.parametrize("which", ["tiny", "smollm2"])
def test_assistant_only_mask_matches_the_chat_template_token_by_token(which: str, tiny_model_dir: Path,
                                                                        request: pytest.FixtureRequest) -> None:
    from transformers import AutoTokenizer

    folder = tiny_model_dir if which == "tiny" else request.getfixturevalue("smollm2_dir")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    for messages in (CHAT, CHAT[1:3]):  # with and without a system message (SmolLM2's template adds its own)
        ids, mask = chat_tokens(tokenizer, messages, None, LossMaskConfig())
        want_ids, want_mask = expected_mask(tokenizer, messages)
        assert ids == want_ids
        assert mask == want_mask, [(tokenizer.decode([t]), m) for t, m in zip(ids, mask, strict=True)]
        trained = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
        assert trained == "".join(f"{m['content']}<|im_end|>" for m in messages if m["role"] == "assistant")


def test_the_loss_mask_follows_the_roles_asked_for(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids, mask = chat_tokens(tokenizer, CHAT, None, LossMaskConfig(user=True, assistant=False))
    trained = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    assert "Reverse abc" in trained and "and xyz?" in trained and "cba" not in trained and "Be brief" not in trained


def test_the_stream_fills_rows_and_resumes_from_its_position(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows = [{"messages": [{"role": "user", "content": "x" * (i % 7 + 1)}, {"role": "assistant", "content": "y"}]}
            for i in range(20)] + [{"messages": [{"role": "user", "content": "no reply"}]}]  # nothing to train
    examples = SFTExamples(rows, tokenizer, LossMaskConfig(), seq_len=48)
    stream = SFTStream(examples, shuffle=True, seed=3)
    steps = []
    for _ in range(6):
        batch = stream.next_batch(rows=2, seq_len=48)
        lengths = [len(s.input_ids) for s in batch]
        assert batch and sum(lengths) <= 2 * 48 and all(sum(s.loss_mask) > 0 for s in batch)
        steps.append((stream.position, [s.input_ids for s in batch]))
    assert stream.epoch >= 1 and examples.skipped == {"no trained token": 1}
    # a new stream at the position after step 2 gives steps 3.. exactly
    resumed = SFTStream(SFTExamples(rows, tokenizer, LossMaskConfig(), seq_len=48), shuffle=True, seed=3,
                        position=steps[1][0])
    assert [[s.input_ids for s in resumed.next_batch(rows=2, seq_len=48)] for _ in range(4)] == \
        [ids for _, ids in steps[2:]]
    # each pass is a new order
    assert SFTStream(examples, shuffle=True, seed=3)._order(0) != SFTStream(examples, shuffle=True, seed=3)._order(1)
