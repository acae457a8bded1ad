"""reverse-text: reverse a short text character by character; reward = LCS ratio of the tagged answer."""

from __future__ import annotations

import random
from typing import Any

from prime_lab.envs import Rubric, SingleTurnEnv, XMLParser
from prime_lab.envs.builtin._common import WORDS, generate_splits, lcs_ratio, limit
from prime_lab.envs.parsers import last_assistant_text

SYSTEM_PROMPT = ("Reverse the text you are given, character by character. "
                 "Give only the reversed text inside <reversed_text> tags.")


def _text(rng: random.Random, min_words: int, max_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(min_words, max_words)))


def load_environment(
    max_examples: int = -1,
    num_train_examples: int = 1000,
    num_eval_examples: int = 100,
    min_words: int = 1,
    max_words: int = 3,
    seed: int = 0,
    system_prompt: str = SYSTEM_PROMPT,
) -> SingleTurnEnv:
    if not 1 <= min_words <= max_words:
        raise ValueError("need 1 <= min_words <= max_words")
    parser = XMLParser(["reversed_text"])

    def make(rng: random.Random, _: int) -> dict[str, Any]:
        text = _text(rng, min_words, max_words)
        return {"question": text, "answer": text[::-1]}

    train, test = generate_splits(make, seed=seed, num_train=num_train_examples, num_eval=num_eval_examples,
                                  key=lambda r: r["question"])

    def lcs_reward(completion: Any, answer: str, parser: XMLParser) -> float:
        """LCS ratio between the reversed text (tagged, or the whole reply if untagged) and the answer."""
        guess = parser.parse_answer(completion)
        if guess is None:
            guess = last_assistant_text(completion).strip()
        return lcs_ratio(guess, answer)

    return SingleTurnEnv(dataset=limit(train, max_examples), eval_dataset=limit(test, max_examples),
                         system_prompt=system_prompt, parser=parser,
                         rubric=Rubric([lcs_reward], parser=parser))


def sft_rows(num_examples: int = 1000, *, seed: int = 0, min_words: int = 1, max_words: int = 3,
             system_prompt: str = SYSTEM_PROMPT) -> list[dict[str, Any]]:
    """Worked answers for supervised fine-tuning, in the `messages` shape (`prime sft run`): the environment's
    training examples (the same seed gives the same ones `load_environment` trains on; its eval split is left out),
    each with the reply the reward scores 1.0."""
    env = load_environment(num_train_examples=num_examples, num_eval_examples=100, min_words=min_words,
                           max_words=max_words, seed=seed, system_prompt=system_prompt)
    return [{"messages": [*row["prompt"],
                          {"role": "assistant", "content": f"<reversed_text>\n{row['answer']}\n</reversed_text>"}]}
            for row in env.get_dataset()]
