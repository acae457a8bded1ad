"""wordle: guess a five-letter word in at most six tries, with per-letter feedback after each guess.

Feedback per letter: G (right letter, right place), Y (in the word, elsewhere), X (not in the word).
Reward: 1.0 for solving it; otherwise up to 0.5 for the greens of the best guess.
"""

from __future__ import annotations

import random
import re
from typing import Any

from prime_lab.envs import MultiTurnEnv, Rubric, XMLParser
from prime_lab.envs.builtin._common import generate_splits, limit
from prime_lab.envs.environment import State
from prime_lab.envs.parsers import Messages

WORD_LIST = (
    "about above actor acute adapt admit adopt adult after again agent agree ahead alarm album alert alike alive "
    "allow alone along alter among anger angle angry apart apple apply arena argue arise array aside asset audio "
    "audit avoid award aware badly baker basic basis beach begin being below bench birth black blade blame blank "
    "blind block blood board boost booth bound brain brand bread break breed brief bring broad brown build built "
    "buyer cable carry catch cause chain chair chart chase cheap check chest chief child china chose civil claim "
    "class clean clear climb clock close coach coast could count court cover craft crash cream crime cross crowd "
    "crown curve cycle daily dance dated dealt death debut delay depth doing doubt dozen draft drama drawn dream "
    "dress drink drive eager early earth eight elite empty enemy enjoy enter entry equal error event every exact "
    "exist extra faith false fault fiber field fifth fifty fight final first fixed flash fleet floor fluid focus "
    "force forth forty forum found frame frank fresh front fruit fully funny giant given glass globe going grace "
    "grade grand grant grass great green gross group grown guard guess guest guide happy heart heavy hence horse "
    "hotel house human ideal image index inner input issue joint judge known label large laser later laugh layer "
    "learn lease least leave legal level light limit local logic loose lower lucky lunch major maker march match "
    "maybe mayor meant media metal might minor minus mixed model money month moral motor mount mouse mouth movie "
    "music needs never newly night noise north noted novel nurse occur ocean offer often order other ought paint "
    "panel paper party peace phase phone photo piece pilot pitch place plain plane plant plate point pound power "
    "press price pride prime print prior prize proof proud prove queen quick quiet quite radio raise range rapid "
    "ratio reach ready refer right rival river robot rough round route royal rural scale scene scope score sense "
    "serve seven shall shape share sharp sheet shelf shell shift shirt shock shoot short shown sight since sixth "
    "skill sleep slide small smart smile smith smoke solid solve sorry sound south space spare speak speed spend "
    "spent split spoke sport staff stage stake stand start state steam steel stick still stock stone stood store "
    "storm story strip stuck study stuff style sugar suite super sweet table taken taste teach teeth thank theme "
    "there these thick thing think third those three threw throw tight times tired title today topic total touch "
    "tough tower track trade train treat trend trial tried truck truly trust truth twice under union unity until "
    "upper upset urban usage usual valid value video virus visit vital voice waste watch water wheel where which "
    "while white whole whose woman world worry worse worst worth would wound write wrong wrote yield young youth"
).split()

SYSTEM_PROMPT = ("Let's play Wordle. Guess the secret five-letter English word. Put each guess inside <guess> "
                 "tags, e.g. <guess>crane</guess>. After each guess you get feedback per letter: G = right letter "
                 "in the right place, Y = in the word but elsewhere, X = not in the word. You have six guesses.")
_GUESS_RE = re.compile(r"[a-z]{5}")


def feedback(guess: str, secret: str) -> str:
    """Wordle feedback with repeated letters handled as the game does (greens first, then yellows by count)."""
    result = ["X"] * 5
    remaining: dict[str, int] = {}
    for i, (g, s) in enumerate(zip(guess, secret, strict=True)):
        if g == s:
            result[i] = "G"
        else:
            remaining[s] = remaining.get(s, 0) + 1
    for i, g in enumerate(guess):
        if result[i] != "G" and remaining.get(g, 0) > 0:
            result[i] = "Y"
            remaining[g] -= 1
    return "".join(result)


def read_guess(text: str, parser: XMLParser) -> str | None:
    tagged = parser.parse(text)
    match = _GUESS_RE.search((tagged or "").lower())
    return match.group(0) if match else None


class WordleEnv(MultiTurnEnv):
    async def is_completed(self, messages: Messages, state: State) -> bool:
        return bool(state.get("solved"))

    async def env_response(self, messages: Messages, state: State) -> tuple[Messages, State]:
        guess = read_guess(str(messages[-1].get("content") or ""), self.parser)  # type: ignore[arg-type]
        secret = state["answer"]
        if guess is None:
            return [{"role": "user", "content": "No valid guess found: write five letters inside <guess> tags. "
                     f"{self.max_turns - state['turn']} guesses left."}], state
        marks = feedback(guess, secret)
        state.setdefault("guesses", []).append(guess)
        if guess == secret:
            state["solved"] = True
            state["stop_condition"] = "solved"
            return [{"role": "user", "content": f"{guess.upper()}: {marks}. Solved!"}], state
        return [{"role": "user", "content": f"{guess.upper()}: {' '.join(marks)}. "
                 f"{self.max_turns - state['turn']} guesses left."}], state


def load_environment(
    max_turns: int = 6,
    max_examples: int = -1,
    num_eval_examples: int = 60,
    seed: int = 0,
    system_prompt: str = SYSTEM_PROMPT,
) -> WordleEnv:
    words = sorted(set(WORD_LIST))
    parser = XMLParser(["guess"])

    def make(rng: random.Random, index: int) -> dict[str, Any]:
        return {"question": "Make your first guess.", "answer": rng.choice(words)}

    total = len(words)
    train, test = generate_splits(make, seed=seed, num_train=total - num_eval_examples, num_eval=num_eval_examples,
                                  key=lambda r: r["answer"])

    def wordle_reward(completion: Messages, answer: str, parser: XMLParser) -> float:
        """1.0 if solved; else half the share of green letters in the best guess."""
        read = [read_guess(str(m.get("content") or ""), parser) for m in completion if m.get("role") == "assistant"]
        guesses = [g for g in read if g]
        if answer in guesses:
            return 1.0
        greens = max((feedback(g, answer).count("G") for g in guesses), default=0)
        return 0.5 * greens / 5

    def solved(completion: Messages, answer: str, parser: XMLParser) -> float:
        return 1.0 if wordle_reward(completion, answer, parser) == 1.0 else 0.0

    return WordleEnv(dataset=limit(train, max_examples), eval_dataset=limit(test, max_examples),
                     system_prompt=system_prompt, parser=parser, max_turns=max_turns,
                     rubric=Rubric([wordle_reward, solved], weights=[1.0, 0.0], parser=parser))
