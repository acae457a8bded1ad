"""SFT data: rows from local files or the Hub cache, chats to tokens with a loss mask by role, and a stream that
fills each step's packed rows.

Rows come in prime-rl's two shapes: a `messages` column (the whole chat; it wins when both are there), or `prompt` +
`completion` (message lists; a plain string is one user, respectively assistant, message). An optional `tools`
column (OpenAI tool definitions) goes to the chat template.

Tokens and mask: the chat is rendered with the tokenizer's chat template one message at a time; each message's
part is the text it adds to the rendering so far, trained on when its role is on in `[data] loss_mask` (the
assistant's only, by default). An assistant message's header (`<|im_start|>assistant\\n`, what
`add_generation_prompt` adds) is never trained on, nor what the template writes after its end-of-turn token (the
tokenizer's eos, e.g. `<|im_end|>`); the end-of-turn token is, so the model learns to stop. A chat whose
template re-renders earlier messages differently as it grows cannot be split this way and is skipped, counted in
the trainer's log. The ids are the whole rendering's, tokenized once, as the sampler tokenizes a prompt: where the
parts tokenized one by one and joined give the same ids (ChatML: special tokens bound every part) those are taken
with each part's mask; where they differ (a SentencePiece tokenizer marks the start of each text it is given with
`▁`, and merges pieces across a part's edge), the whole rendering's ids are taken and a token is trained when one of
its characters (its offsets, from a fast tokenizer) is in a trained part, so a token merged across a reply's edge is
trained with the reply (as transformers' `return_assistant_tokens_mask` does).

The stream (`SFTStream`) walks the examples in a shuffled order (a new one each pass, from `[data] seed` and the
pass number); its position is two integers, saved in each checkpoint, so a restarted run reads on from where the
checkpoint was written. A step takes examples while they fill `[data] batch_size` rows of `seq_len` tokens (an
example longer than `seq_len` is cut to it; one with no trained token within it is skipped).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Any

from prime_lab.trainer.batch import Sample
from prime_lab.trainer.sft_config import DataSourceConfig, LossMaskConfig

ROLES = ("system", "user", "assistant", "tool")
LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")


class SFTDataError(ValueError):
    """A dataset that cannot be read or a row that cannot be used; the message names it and says what to do."""


# Reading -----------------------------------------------------------------------------------------------------------
def read_source(source: DataSourceConfig) -> list[dict[str, Any]]:
    """Every row of `source`'s splits: a local jsonl / json / parquet file, a folder of them or one written by
    `datasets`' save_to_disk, or a Hugging Face dataset id already in the local cache."""
    path = Path(source.dataset).expanduser()
    if path.is_file():
        return _read_file(path)
    if path.is_dir():
        return _read_folder(path, source.splits or ["train"])
    if source.dataset.startswith((".", "/", "~")) or source.dataset.endswith(LOCAL_SUFFIXES):
        raise SFTDataError(f"dataset {source.dataset!r}: no such file or folder")
    return _read_hub(source)


def _read_file(path: Path) -> list[dict[str, Any]]:
    try:
        if path.suffix == ".jsonl":
            rows = []
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        raise SFTDataError(f"{path}:{n}: not a JSON object ({exc.msg})") from None
            return _objects(rows, path)
        if path.suffix == ".json":
            data = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(data, dict):  # {"train": [...]} or {"data": [...]}
                data = next((v for v in data.values() if isinstance(v, list)), None)
            if not isinstance(data, list):
                raise SFTDataError(f"{path}: a .json dataset is a list of rows (or an object holding one)")
            return _objects(data, path)
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            return _objects(pq.read_table(path).to_pylist(), path)
    except (OSError, UnicodeDecodeError) as exc:
        raise SFTDataError(f"{path}: cannot read it ({exc})") from exc
    except json.JSONDecodeError as exc:
        raise SFTDataError(f"{path}: not JSON ({exc})") from exc
    raise SFTDataError(f"{path}: a dataset file is .jsonl, .json or .parquet")


def _objects(rows: list[Any], path: Path) -> list[dict[str, Any]]:
    for n, row in enumerate(rows, 1):
        if not isinstance(row, dict):
            raise SFTDataError(f"{path}: row {n} is a {type(row).__name__}, not an object with `messages` or "
                               "`prompt` + `completion`")
    return rows


def _read_folder(path: Path, splits: list[str]) -> list[dict[str, Any]]:
    if (path / "dataset_dict.json").is_file() or (path / "dataset_info.json").is_file() \
            or (path / "state.json").is_file():
        from datasets import Dataset, DatasetDict, load_from_disk

        loaded = load_from_disk(str(path))
        if isinstance(loaded, Dataset):
            return list(loaded)
        assert isinstance(loaded, DatasetDict)
        missing = [s for s in splits if s not in loaded]
        if missing:
            raise SFTDataError(f"{path}: no split {missing[0]!r} (it has {', '.join(loaded)}); set [data] splits")
        return [row for s in splits for row in loaded[s]]
    files = sorted(p for p in path.iterdir() if p.suffix in LOCAL_SUFFIXES)
    by_split = [p for p in files if any(p.stem == s or p.stem.startswith(f"{s}-") for s in splits)]
    chosen = by_split or files
    if not chosen:
        raise SFTDataError(f"{path}: a dataset folder holds .jsonl, .json or .parquet files (or what `datasets` "
                           "save_to_disk writes)")
    return [row for p in chosen for row in _read_file(p)]


def _hub_snapshot(repo_id: str) -> Path | None:
    """The dataset repository's files as `hf download --repo-type dataset` left them in the Hub cache (no network)."""
    import os

    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        return None
    try:
        return Path(snapshot_download(repo_id, repo_type="dataset", local_files_only=True,
                                      cache_dir=os.environ.get("HF_HUB_CACHE") or None))
    except Exception:  # not in the cache (LocalEntryNotFoundError), or not a repository id
        return None


def _read_snapshot(folder: Path, source: DataSourceConfig) -> list[dict[str, Any]]:
    """The rows of a dataset repository's data files: those of each split (`train.jsonl`, `data/train-0000.parquet`,
    `train/...`), under each subset's folder when subsets are named."""
    files = sorted(p for p in folder.rglob("*") if p.suffix in LOCAL_SUFFIXES and p.is_file()
                   and not p.name.startswith("."))
    if source.subsets:
        files = [p for p in files if any(s in p.relative_to(folder).parts[:-1] for s in source.subsets)]
    rows: list[dict[str, Any]] = []
    for split in source.splits or ["train"]:
        mine = [p for p in files if p.stem == split or p.stem.startswith((f"{split}-", f"{split}_"))
                or split in p.relative_to(folder).parts[:-1]]
        if not mine:
            raise SFTDataError(f"dataset {source.dataset!r} (in the Hub cache, {folder}) has no data file for split "
                               f"{split!r}: its files are {', '.join(str(p.relative_to(folder)) for p in files[:6])}")
        rows += [row for p in mine for row in _read_file(p)]
    return rows


def _read_hub(source: DataSourceConfig) -> list[dict[str, Any]]:
    from prime_lab.envs.hub import offline_unless_chosen

    snapshot = _hub_snapshot(source.dataset)
    if snapshot is not None:
        return _read_snapshot(snapshot, source)

    try:
        import datasets
    except ImportError as exc:
        raise SFTDataError(f"dataset {source.dataset!r} is a Hub id: reading it needs the `datasets` package "
                           "(pip install datasets), or name a local jsonl, json or parquet file") from exc
    rows: list[dict[str, Any]] = []
    try:
        with offline_unless_chosen():
            subsets: list[str | None] = [*source.subsets] if source.subsets else [None]
            for subset in subsets:
                for split in source.splits or ["train"]:
                    rows += list(datasets.load_dataset(source.dataset, subset, split=split))
    except Exception as exc:
        raise SFTDataError(f"dataset {source.dataset!r} is not a local file or folder and could not be read from "
                           f"the Hugging Face cache ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
                           f"download it on a machine with Hub access (`hf download --repo-type dataset "
                           f"{source.dataset}`) and copy the cache here, or name a local jsonl/json/parquet file"
                           ) from exc
    return rows


# Chats to tokens ---------------------------------------------------------------------------------------------------
def _as_messages(value: Any, role: str) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if isinstance(value, dict):
        return [value]
    if isinstance(value, list) and all(isinstance(m, dict) for m in value):
        return [dict(m, role=m.get("role", role)) for m in value]
    raise SFTDataError(f"expected a message list or a string, got {type(value).__name__}")


def row_chat(row: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages, tools) of a row in either shape."""
    if row.get("messages") is not None:
        messages = _as_messages(row["messages"], "user")
    elif row.get("prompt") is not None and row.get("completion") is not None:
        messages = _as_messages(row["prompt"], "user") + _as_messages(row["completion"], "assistant")
    else:
        raise SFTDataError(f"a row has neither `messages` nor `prompt` + `completion` (its columns: "
                           f"{', '.join(sorted(row)) or 'none'})")
    tools = row.get("tools") or row.get("tool_defs")
    if isinstance(tools, str):
        tools = json.loads(tools)
    for m in messages:
        if m.get("role") not in ROLES:
            raise SFTDataError(f"a message has role {m.get('role')!r}: use one of {', '.join(ROLES)}")
        if m.get("content") is None:
            m["content"] = ""
    return messages, tools or None


class TemplateMismatch(SFTDataError):
    """The chat template renders the conversation's earlier messages differently as it grows."""


def chat_tokens(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                loss_mask: LossMaskConfig) -> tuple[list[int], list[int]]:
    """The chat's token ids (the chat template's rendering, tokenized once) and a 0/1 mask: 1 on the tokens of the
    messages whose role `loss_mask` trains on, but an assistant message's header."""
    text, parts = chat_parts(tokenizer, messages, tools, loss_mask)
    ids: list[int] = []
    mask: list[int] = []
    for start, end, on in parts:
        tokens = tokenizer(text[start:end], add_special_tokens=False)["input_ids"]
        ids.extend(tokens)
        mask.extend([int(on)] * len(tokens))
    if not getattr(tokenizer, "is_fast", False):
        if tokenizer(text, add_special_tokens=False)["input_ids"] != ids:
            raise SFTDataError("the tokenizer splits a chat differently message by message than whole, and gives no "
                               "character offsets to find each message's tokens in the whole: use the model's fast "
                               "tokenizer (its tokenizer.json)")
        return ids, mask
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    if list(encoded["input_ids"]) == ids:
        return ids, mask
    return list(encoded["input_ids"]), offsets_mask(encoded["offset_mapping"], parts, len(text))


def chat_parts(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
               loss_mask: LossMaskConfig) -> tuple[str, list[tuple[int, int, bool]]]:
    """The chat template's rendering of the whole chat and its parts, (start, end, trained) character spans in
    order: each message's text, an assistant message's header and what follows its end-of-turn token apart."""
    trained = {role: bool(getattr(loss_mask, role)) for role in ROLES}

    def render(upto: int, generation_prompt: bool) -> str:
        return str(tokenizer.apply_chat_template(messages[:upto], tools=tools, tokenize=False,
                                                 add_generation_prompt=generation_prompt))

    parts: list[tuple[int, int, bool]] = []
    text = ""

    end_of_turn = tokenizer.eos_token if isinstance(tokenizer.eos_token, str) and tokenizer.eos_token else None

    def extend(upto: str, on: bool, stop_at_end_of_turn: bool = False) -> None:
        nonlocal text
        if not upto.startswith(text):
            raise TemplateMismatch("the chat template renders the earlier messages differently once a later one "
                                   "is added, so the tokens of each message cannot be told apart")
        new = upto[len(text):]
        # an assistant turn is trained up to its end-of-turn token (the sampler stops there); what the template
        # writes after it (a newline) is glue before the next message
        cut = len(new)
        if stop_at_end_of_turn and end_of_turn and end_of_turn in new:
            cut = new.rindex(end_of_turn) + len(end_of_turn)
        at = len(text)
        for start, end, part_on in ((at, at + cut, on), (at + cut, len(upto), False)):
            if end > start:
                parts.append((start, end, part_on))
        text = upto

    for i, message in enumerate(messages):
        assistant = message["role"] == "assistant"
        if assistant and i > 0:
            extend(render(i, True), False)  # the assistant header the sampler adds before generating
        extend(render(i + 1, False), trained.get(message["role"], False), stop_at_end_of_turn=assistant)
    return text, parts


def offsets_mask(offsets: list[tuple[int, int]], parts: list[tuple[int, int, bool]], length: int) -> list[int]:
    """1 on each token (its character offsets in the rendering, `length` characters) holding a character of a
    trained part; a token of no width (one the pre-tokenizer added) goes by the character at its offset."""
    chars = [0] * length
    for start, end, trained in parts:
        if trained:
            chars[start:end] = [1] * (end - start)
    before = [0, *accumulate(chars)]  # before[k]: trained characters in the first k

    def holds_one(a: int, b: int) -> int:
        if b <= a:
            a = max(min(a, length - 1), 0)
            b = min(a + 1, length)
        return int(before[b] > before[a])

    return [holds_one(a, b) for a, b in offsets]


# The stream of examples --------------------------------------------------------------------------------------------
@dataclass
class Example:
    input_ids: list[int]
    loss_mask: list[int]


class SFTExamples:
    """A dataset's rows, tokenized on first use (cached): `example(i)` is None for a row that cannot be trained on
    (no trained token within `seq_len`, or a template that cannot be split), counted in `skipped`."""

    def __init__(self, rows: list[dict[str, Any]], tokenizer: Any, loss_mask: LossMaskConfig, seq_len: int) -> None:
        if not rows:
            raise SFTDataError("the dataset has no rows")
        self.rows, self.tokenizer, self.loss_mask, self.seq_len = rows, tokenizer, loss_mask, seq_len
        self.cache: dict[int, Example | None] = {}
        self.skipped: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def example(self, i: int) -> Example | None:
        if i not in self.cache:
            self.cache[i] = self._tokenize(i)
        return self.cache[i]

    def usable(self) -> Iterator[Example]:
        """The examples that can be trained on, in the dataset's order (validation)."""
        for i in range(len(self.rows)):
            example = self.example(i)
            if example is not None:
                yield example

    def _tokenize(self, i: int) -> Example | None:
        try:
            messages, tools = row_chat(self.rows[i])
            ids, mask = chat_tokens(self.tokenizer, messages, tools, self.loss_mask)
        except TemplateMismatch:
            self.skipped["template"] = self.skipped.get("template", 0) + 1
            return None
        except SFTDataError as exc:
            raise SFTDataError(f"row {i + 1}: {exc}") from exc
        ids, mask = ids[:self.seq_len], mask[:self.seq_len]
        if not any(mask[1:]):
            self.skipped["no trained token"] = self.skipped.get("no trained token", 0) + 1
            return None
        return Example(ids, mask)


def to_sample(example: Example) -> Sample:
    return Sample(list(example.input_ids), list(example.loss_mask), [0.0] * len(example.input_ids), 0.0)


class SFTStream:
    """Examples in a shuffled order, pass after pass; `position` = (pass, index in it) resumes it exactly."""

    def __init__(self, examples: SFTExamples, *, shuffle: bool, seed: int, position: tuple[int, int] = (0, 0)
                 ) -> None:
        self.examples, self.shuffle, self.seed = examples, shuffle, seed
        self.epoch, self.index = position
        self.order = self._order(self.epoch)
        self.samples_seen = 0

    def _order(self, epoch: int) -> list[int]:
        order = list(range(len(self.examples)))
        if self.shuffle:
            random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order

    @property
    def position(self) -> tuple[int, int]:
        return self.epoch, self.index

    def _advance(self) -> None:
        self.index += 1
        if self.index >= len(self.order):
            self.epoch, self.index = self.epoch + 1, 0
            self.order = self._order(self.epoch)

    def peek(self) -> Example:
        """The next usable example (skipping unusable ones for good); SFTDataError when a whole pass has none."""
        for _ in range(len(self.order) + 1):
            example = self.examples.example(self.order[self.index])
            if example is not None:
                return example
            self._advance()
        raise SFTDataError(f"no example of the dataset has a trained token within seq_len = "
                           f"{self.examples.seq_len} ({', '.join(f'{v} {k}' for k, v in self.examples.skipped.items())}"
                           "): check [data] loss_mask, seq_len and the rows' roles")

    def take(self) -> Example:
        example = self.peek()
        self._advance()
        self.samples_seen += 1
        return example

    def next_batch(self, rows: int, seq_len: int) -> list[Sample]:
        """Examples while they fill `rows` rows of `seq_len` tokens (first fit, in order): one step's samples."""
        free: list[int] = []
        out: list[Sample] = []
        while True:
            example = self.peek()
            n = len(example.input_ids)
            slot = next((k for k, room in enumerate(free) if room >= n), None)
            if slot is None:
                if len(free) >= rows:
                    return out
                free.append(seq_len)
                slot = len(free) - 1
            free[slot] -= n
            out.append(to_sample(self.take()))
