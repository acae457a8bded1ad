"""SFT on a SentencePiece-style tokenizer, built here in code: a Unigram model under a Metaspace pre-tokenizer that
marks the start of each text it is given with a word boundary `▁` (Llama 2's, Mistral's, Zephyr's), and a piece that
merges across a role header and the reply after it. A message tokenized alone then starts with a `▁` it does not
have inside the conversation, so per-message ids joined are ids the model never sees at inference: the SFT ids are
the whole conversation's, tokenized once, and the loss mask comes from each token's characters."""

from __future__ import annotations

import string
from typing import Any

import pytest

from prime_lab.trainer.sft_config import LossMaskConfig
from prime_lab.trainer.sft_data import SFTDataError, SFTExamples, chat_tokens
from tests.support.sft_runs import assistant_spans

# Zephyr's chat template (whose tokenizer is Mistral's SentencePiece one)
TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n"
            "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
SPECIAL = ["<unk>", "<s>", "</s>"]
# each piece scores above its characters one by one (-10 each), so the Unigram model takes it; "|>\nOK" spans a
# header's end and a reply's start
PIECES = ["<|", "|>\n", "system", "user", "assistant", "Re", "verse", "▁abc", "|>\nOK"]
CHARS = sorted(set(string.ascii_letters + string.digits + string.punctuation + "\n▁"))

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Reverse abc"},
        {"role": "assistant", "content": "cba"}, {"role": "user", "content": "and xyz?"},
        {"role": "assistant", "content": "zyx"}]
OK_CHAT = [{"role": "user", "content": "Reverse abc"}, {"role": "assistant", "content": "OK"}]


def sentencepiece_tokenizer(fast: bool = True) -> Any:
    """The tokenizer, as transformers' PreTrainedTokenizerFast with the template above; `fast=False`: one that
    gives no character offsets, as a slow (Python) tokenizer does not."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = [(p, 0.0) for p in SPECIAL] + [(p, -2.0) for p in PIECES] + [(c, -10.0) for c in CHARS]
    model = Tokenizer(models.Unigram(vocab, unk_id=0))
    model.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    model.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    model.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIAL])

    class WithoutOffsets(PreTrainedTokenizerFast):
        @property
        def is_fast(self) -> bool:
            return False

    kind = PreTrainedTokenizerFast if fast else WithoutOffsets
    tokenizer = kind(tokenizer_object=model, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    tokenizer.chat_template = TEMPLATE
    return tokenizer


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return sentencepiece_tokenizer()


def whole(tokenizer: Any, messages: list[dict[str, Any]], **kwargs: Any) -> tuple[str, Any]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
    return text, tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)


def test_the_tokenizer_is_one_where_per_message_ids_differ(tokenizer: Any) -> None:
    """The case in point, so the tests below cannot pass on a tokenizer that splits alike either way."""
    assert tokenizer.convert_ids_to_tokens(tokenizer("cba", add_special_tokens=False)["input_ids"])[0] == "▁"
    _, encoded = whole(tokenizer, CHAT)
    assert tokenizer.convert_ids_to_tokens(encoded["input_ids"])[-6:] == ["|>\n", "z", "y", "x", "</s>", "\n"]


@pytest.mark.parametrize("messages", [CHAT, CHAT[1:3], OK_CHAT], ids=["two-turns", "one-turn", "merged-header"])
def test_sft_ids_are_the_whole_conversation_tokenized_once(tokenizer: Any, messages: list[dict[str, Any]]) -> None:
    ids, _ = chat_tokens(tokenizer, messages, None, LossMaskConfig())
    text, encoded = whole(tokenizer, messages)
    assert ids == encoded["input_ids"], (tokenizer.convert_ids_to_tokens(ids),
                                         tokenizer.convert_ids_to_tokens(encoded["input_ids"]))
    assert tokenizer.decode(ids) == text
    example = SFTExamples([{"messages": messages}], tokenizer, LossMaskConfig(), seq_len=256).example(0)
    assert example is not None and example.input_ids == ids


def test_the_prompt_the_sampler_is_given_is_where_the_reply_starts(tokenizer: Any) -> None:
    """The last reply's prompt, as the sampler tokenizes it (the template with add_generation_prompt, at once), is
    the start of the training ids, and the reply is trained from there."""
    ids, mask = chat_tokens(tokenizer, CHAT, None, LossMaskConfig())
    _, prompt = whole(tokenizer, CHAT[:-1], add_generation_prompt=True)
    n = len(prompt["input_ids"])
    assert ids[:n] == prompt["input_ids"]
    assert mask[n - 1] == 0 and mask[n:] == [1, 1, 1, 1, 0]  # z y x </s>, not the newline after it


@pytest.mark.parametrize(("messages", "trained"), [(CHAT, "cba</s>zyx</s>"), (OK_CHAT, "|>\nOK</s>")],
                         ids=["two-turns", "merged-header"])
def test_the_loss_mask_trains_each_token_holding_an_assistant_character(tokenizer: Any, messages: list[dict[str, Any]],
                                                                        trained: str) -> None:
    """A token is trained when one of its characters is an assistant message's: a reply whose first characters merge
    with the header ("|>\nOK") is trained, the merged token with it."""
    _, mask = chat_tokens(tokenizer, messages, None, LossMaskConfig())
    text, encoded = whole(tokenizer, messages)
    spans = assistant_spans(text, messages, "</s>")
    want = [int(any(a < end and b > start for start, end in spans)) for a, b in encoded["offset_mapping"]]
    assert mask == want, [(text[a:b], m) for (a, b), m in zip(encoded["offset_mapping"], mask, strict=False)]
    assert "".join(text[a:b] for (a, b), m in zip(encoded["offset_mapping"], mask, strict=True) if m) == trained


def test_other_roles_are_trained_by_their_characters_too(tokenizer: Any) -> None:
    ids, mask = chat_tokens(tokenizer, CHAT, None, LossMaskConfig(user=True, assistant=False))
    text, encoded = whole(tokenizer, CHAT)
    assert ids == encoded["input_ids"]
    trained = "".join(text[a:b] for (a, b), m in zip(encoded["offset_mapping"], mask, strict=True) if m)
    assert trained == "<|user|>\nReverse abc</s>\n<|user|>\nand xyz?</s>\n"  # each user message's whole rendering


def test_a_tokenizer_without_offsets_is_refused_with_what_to_do() -> None:
    slow = sentencepiece_tokenizer(fast=False)
    with pytest.raises(SFTDataError, match="character offsets.*fast tokenizer"):
        chat_tokens(slow, CHAT, None, LossMaskConfig())
    with pytest.raises(SFTDataError, match="^row 1: "):
        SFTExamples([{"messages": CHAT}], slow, LossMaskConfig(), seq_len=256).example(0)
