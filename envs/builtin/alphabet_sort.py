"""alphabet-sort: multi-turn; sort names alphabetically, with more names each turn.

Turn 1 gives a few names; each later turn adds more, and the model must give the whole list so far, sorted.
Reward: the mean over turns of the LCS ratio between the model's list and the sorted list (1.0 when all correct).
"""

from __future__ import annotations

import random
from typing import Any

from prime_lab.envs import MultiTurnEnv, Rubric, XMLParser
from prime_lab.envs.builtin._common import NAMES, generate_splits, lcs_ratio, limit
from prime_lab.envs.environment import State
from prime_lab.envs.parsers import Messages

SYSTEM_PROMPT = ("Sort the names alphabetically. Reply with the sorted names, one per line, inside "
                 "<alphabetical_sorted> tags. When more names arrive, reply with ALL names so far, sorted.")


def _names_block(names: list[str]) -> str:
    return "\n".join(names)


class AlphabetSortEnv(MultiTurnEnv):
    async def is_completed(self, messages: Messages, state: State) -> bool:
        return state["turn"] >= len(state["info"]["turns"])

    async def env_response(self, messages: Messages, state: State) -> tuple[Messages, State]:
        new = state["info"]["turns"][state["turn"]]
        return [{"role": "user", "content": "Add these names and sort the whole list again:\n"
                 + _names_block(new)}], state


def load_environment(
    min_turns: int = 1,
    max_turns: int = 3,
    min_names_per_turn: int = 2,
    max_names_per_turn: int = 4,
    max_examples: int = -1,
    num_train_examples: int = 1000,
    num_eval_examples: int = 100,
    seed: int = 0,
    system_prompt: str = SYSTEM_PROMPT,
) -> AlphabetSortEnv:
    if not 1 <= min_turns <= max_turns:
        raise ValueError("need 1 <= min_turns <= max_turns")
    if not 1 <= min_names_per_turn <= max_names_per_turn:
        raise ValueError("need 1 <= min_names_per_turn <= max_names_per_turn")
    parser = XMLParser(["alphabetical_sorted"])

    def make(rng: random.Random, _: int) -> dict[str, Any]:
        count = rng.randint(min_turns, max_turns)
        pool = rng.sample(NAMES, min(len(NAMES), count * max_names_per_turn))
        turns = []
        for _ in range(count):
            k = rng.randint(min_names_per_turn, max_names_per_turn)
            turns.append([pool.pop() for _ in range(min(k, len(pool)))])
        return {"question": "Sort these names:\n" + _names_block(turns[0]),
                "answer": _names_block(sorted(n for t in turns for n in t)), "info": {"turns": turns}}

    train, test = generate_splits(make, seed=seed, num_train=num_train_examples, num_eval=num_eval_examples,
                                  key=lambda r: r["question"] + repr(r["info"]))

    def sorted_lists(completion: Messages, info: dict[str, Any], parser: XMLParser) -> float:
        """Mean over the turns of the LCS ratio between the model's list and the expected sorted list."""
        replies = [m for m in completion if m.get("role") == "assistant"]
        turns = info["turns"]
        scores = []
        for i in range(len(turns)):
            expected = sorted(n for t in turns[: i + 1] for n in t)
            if i >= len(replies):
                scores.append(0.0)
                continue
            text = parser.parse(str(replies[i].get("content") or "")) or ""
            got = [line.strip() for line in text.splitlines() if line.strip()]
            scores.append(lcs_ratio(got, expected))
        return sum(scores) / len(scores)

    return AlphabetSortEnv(dataset=limit(train, max_examples), eval_dataset=limit(test, max_examples),
                           system_prompt=system_prompt, parser=parser, max_turns=max_turns,
                           rubric=Rubric([sorted_lists], parser=parser))
