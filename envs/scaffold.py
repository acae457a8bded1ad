"""`prime env init`: a new environment package, ready for `prime env install` and `prime eval run NAME`.

The package is one module named like the environment (verifiers' convention: `my-env` -> `my_env.py`), a
pyproject that declares it under the `prime_lab.environments` entry point group (so `prime env list` finds it without
importing it), a README and a test. Its environment is a small complete task (write a word in capital letters,
with partial credit on the way: a task SmolLM2-135M half knows, so its reward starts above 0 and RL lifts it; data
generated in code, so it runs offline) to change into yours, written in prime-lab's protocol or, with
`verifiers=True`, in verifiers' classic API (`import verifiers as vf`, `datasets.Dataset` data) so that it also
runs under verifiers. With `v1=True` it is a verifiers v1 taskset (verifiers 0.4's API, the shape `vf-init` 0.4.0
writes: a package folder whose `__init__` exports one `vf.Taskset`, the reward a weighted `@vf.reward` method),
which `prime env install` puts into verifiers 0.4's own release environment.
"""

from __future__ import annotations

import importlib.util
import json
import keyword
import re
from dataclasses import dataclass
from pathlib import Path

from prime_lab.envs.installed import ENTRY_POINT_GROUP, canonical, module_name

VERIFIERS_REQUIREMENT = "verifiers>=0.1.12,<0.4"  # the classic API with async rollouts (as prime-lab's extra)
V1_REQUIREMENT = "verifiers>=0.4,<0.5"  # the v1 API, at the release range prime-lab drives it at
_NAME = re.compile(r"^[a-z][a-z0-9]*(?:-[a-z0-9]+)*$")


class ScaffoldError(ValueError):
    """The name or the folder cannot be used; the message says why and what to do."""


@dataclass(frozen=True)
class NewPackage:
    name: str  # the environment's id and the distribution's name, e.g. `my-env`
    module: str  # `my_env`
    folder: Path
    files: tuple[Path, ...]


def check_name(raw: str) -> tuple[str, str]:
    """(name, module) for a requested environment name (`you/My_Env` -> `my-env`, `my_env`)."""
    name = canonical(raw.rsplit("/", 1)[-1])
    module = module_name(name)
    if not _NAME.match(name) or keyword.iskeyword(module):
        raise ScaffoldError(f"'{raw}' cannot name an environment: use lowercase letters, digits and dashes, "
                            "starting with a letter (e.g. my-env)")
    try:
        taken = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        taken = True
    if taken:
        raise ScaffoldError(f"a module '{module}' is already installed in this environment, so '{name}' would "
                            "collide with it; pick another name (or `pip uninstall` the old package first)")
    return name, module


def write_package(raw_name: str, parent: Path, *, verifiers: bool = False, v1: bool = False,
                  force: bool = False) -> NewPackage:
    """Write the package into `parent/<name>`; an existing file is overwritten only with `force`."""
    refuse_both(verifiers, v1)
    name, module = check_name(raw_name)
    folder = parent / name
    contents = package_contents(name, module, verifiers=verifiers, v1=v1)
    existing = [rel for rel in contents if (folder / rel).exists()]
    if existing and not force:
        raise ScaffoldError(f"{folder} already has {', '.join(existing)}; pass -f/--force to overwrite them")
    written = []
    for rel, text in contents.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return NewPackage(name, module, folder, tuple(written))


def refuse_both(verifiers: bool, v1: bool) -> None:
    if verifiers and v1:
        raise ScaffoldError("--v1 and --verifiers ask for two APIs: --verifiers writes verifiers' classic API "
                            "(releases before 0.4), --v1 a verifiers 0.4 taskset; pass one of them")


def package_contents(name: str, module: str, *, verifiers: bool = False, v1: bool = False) -> dict[str, str]:
    """The package's files (path relative to its folder -> text) for a checked `name` and its `module`: prime-lab's
    protocol, verifiers' classic API (`verifiers`) or a verifiers v1 taskset (`v1`, verifiers 0.4)."""
    refuse_both(verifiers, v1)
    if v1:
        return v1_contents(name, module)
    return {
        "pyproject.toml": _PYPROJECT.format(
            name=name, module=module, group=ENTRY_POINT_GROUP,
            dependencies=json.dumps([VERIFIERS_REQUIREMENT, "datasets"] if verifiers else ["prime-lab"])),
        f"{module}.py": (_VERIFIERS_MODULE if verifiers else _PRIME_LAB_MODULE).replace("{name}", name)
        .replace("{words}", _WORDS).replace("{reward_body}", _REWARD_BODY),
        "README.md": _README.format(name=name, module=module,
                                    api=("verifiers' classic API (`import verifiers as vf`)" if verifiers
                                         else "prime-lab's environment protocol (`prime_lab.envs`)"),
                                    data_arg=_README_DATA_ARG if verifiers else ""),
        f"tests/test_{module}.py": (_VERIFIERS_TEST if verifiers else _PRIME_LAB_TEST).replace("{module}", module),
    }


_PYPROJECT = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "0.1.0"
description = "A word in capital letters, in <answer> tags (a starting point: replace it with your task)."
requires-python = ">=3.11"
dependencies = {dependencies}

[project.optional-dependencies]
test = ["pytest"]

# prime-lab finds the environment through this entry point (name = the id you type, value = the module).
[project.entry-points."{group}"]
{name} = "{module}"

[tool.setuptools]
py-modules = ["{module}"]
"""

# What both modules share (the rows' words and system prompt; the reward's body), put in by `package_contents`.
_WORDS = '''\
WORDS = ("apple", "river", "stone", "cloud", "green", "table", "light", "music", "paper", "horse", "bread", "chair",
         "dream", "earth", "flame", "glass", "honey", "juice", "knife", "lemon", "mouse", "night", "ocean", "piano",
         "queen", "radio", "sugar", "tiger", "water", "zebra", "candle", "garden", "orange", "planet", "silver")
SYSTEM_PROMPT = "Write the word in capital letters, inside <answer></answer> tags."
'''

_REWARD_BODY = '''\
    """1.0 for the word in capitals inside the tags; 0.5 for it in capitals anywhere; 0.2 for it in any case."""
    if (parser.parse_answer(completion) or "").strip() == answer:
        return 1.0
    text = completion if isinstance(completion, str) else " ".join(str(m.get("content") or "") for m in completion)
    if answer in text:
        return 0.5
    return 0.2 if answer.lower() in text.lower() else 0.0
'''

_PRIME_LAB_MODULE = '''\
"""{name}: write a word in capital letters; reward 1 for it inside <answer> tags, partial credit on the way.

A starting point: change the rows, the system prompt and the reward, then `prime eval run {name}`. Rows are
prime-lab's dataset format: `question` (or `prompt`, chat messages), `answer`, and optionally `info` and `task`.
The partial credit (0.5 for the word in capitals anywhere, 0.2 for it in any case) is what makes it learnable: a
reward that is 0 on every rollout gives RL nothing to reinforce.
"""

from __future__ import annotations

import random
from typing import Any

from prime_lab.envs import Rubric, SingleTurnEnv, XMLParser

{words}
parser = XMLParser(["answer"])


def make_rows(count: int, seed: int) -> list[dict[str, Any]]:
    """`count` questions with their answers, the same for the same seed."""
    rng = random.Random(seed)
    return [{"question": f"Capitalize every letter: {word}", "answer": word.upper()}
            for word in (rng.choice(WORDS) for _ in range(count))]


def capitalized(completion: Any, answer: str) -> float:
{reward_body}

def load_environment(
    num_train_examples: int = 200,
    num_eval_examples: int = 50,
    seed: int = 0,
    system_prompt: str = SYSTEM_PROMPT,
) -> SingleTurnEnv:
    return SingleTurnEnv(dataset=make_rows(num_train_examples, seed),
                         eval_dataset=make_rows(num_eval_examples, seed + 1),
                         system_prompt=system_prompt, parser=parser, rubric=Rubric([capitalized], parser=parser))
'''

_VERIFIERS_MODULE = '''\
"""{name}: write a word in capital letters; reward 1 for it inside <answer> tags, partial credit on the way
(verifiers' classic API).

A starting point: change the data, the system prompt and the reward, then `prime eval run {name}`. `dataset_name`
takes a local folder of json, jsonl, csv or parquet files with `question` and `answer` columns (or a Hub id, which
needs the Hub: prime-lab loads environments offline when the Hub does not answer). The partial credit is what makes it
learnable: a reward that is 0 on every rollout gives RL nothing to reinforce.
"""

import random

import verifiers as vf
from datasets import Dataset, load_dataset

{words}
parser = vf.XMLParser(["answer"], answer_field="answer")


def make_dataset(count: int, seed: int) -> Dataset:
    """`count` questions with their answers, the same for the same seed."""
    rng = random.Random(seed)
    words = [rng.choice(WORDS) for _ in range(count)]
    return Dataset.from_list([{"question": f"Capitalize every letter: {w}", "answer": w.upper()} for w in words])


def capitalized(parser, completion, answer, **kwargs) -> float:
{reward_body}

def load_environment(
    num_train_examples: int = 200,
    num_eval_examples: int = 50,
    seed: int = 0,
    dataset_name: str | None = None,
    system_prompt: str = SYSTEM_PROMPT,
) -> vf.Environment:
    if dataset_name is None:
        dataset, eval_dataset = make_dataset(num_train_examples, seed), make_dataset(num_eval_examples, seed + 1)
    else:
        splits = load_dataset(dataset_name)
        dataset = splits["train"]
        eval_dataset = splits["test"] if "test" in splits else None
    rubric = vf.Rubric(funcs=[capitalized], weights=[1.0], parser=parser)
    return vf.SingleTurnEnv(dataset=dataset, eval_dataset=eval_dataset, system_prompt=system_prompt,
                            parser=parser, rubric=rubric)
'''

_PRIME_LAB_TEST = '''\
"""The environment's data and reward, without a model (run: pytest)."""

from {module} import SYSTEM_PROMPT, capitalized, load_environment


def test_rows_are_questions_with_the_system_prompt_and_answers() -> None:
    env = load_environment(num_train_examples=5, num_eval_examples=3)
    rows = env.get_eval_dataset()
    assert len(rows) == 3 and len(env.get_dataset()) == 5
    assert rows[0]["prompt"][0] == {"role": "system", "content": SYSTEM_PROMPT}
    word = rows[0]["prompt"][-1]["content"].rsplit(" ", 1)[-1]
    assert rows[0]["answer"] == word.upper()


def test_the_reward_is_one_in_tags_and_partial_on_the_way() -> None:
    env = load_environment(num_train_examples=1, num_eval_examples=1)
    row = env.get_eval_dataset()[0]
    word = row["answer"]

    def score(reply: str) -> float:
        completion = [{"role": "assistant", "content": reply}]
        return env.rubric.score_sync(prompt=row["prompt"], completion=completion, answer=word, state={},
                                     info=row["info"], task=row["task"]).reward

    assert score(f"<answer>{word}</answer>") == 1.0
    assert score(f"Here: {word}") == 0.5
    assert score(f"<answer>{word.lower()}</answer>") == 0.2
    assert capitalized([{"role": "assistant", "content": "no idea"}], word) == 0.0
'''

_VERIFIERS_TEST = '''\
"""The environment's data and reward, without a model (run: pytest)."""

from {module} import capitalized, load_environment, parser


def test_rows_are_questions_with_answers() -> None:
    env = load_environment(num_train_examples=5, num_eval_examples=3)
    rows = env.get_eval_dataset(n=3)
    assert len(rows) == 3
    first = rows[0]
    question = first["question"] if "question" in first else first["prompt"][-1]["content"]
    assert first["answer"] == question.rsplit(" ", 1)[-1].upper()


def test_the_reward_is_one_in_tags_and_partial_on_the_way() -> None:
    def reward(reply: str) -> float:
        return capitalized(parser, [{"role": "assistant", "content": reply}], "APPLE")

    assert reward("<answer>APPLE</answer>") == 1.0
    assert reward("It is APPLE.") == 0.5
    assert reward("<answer>apple</answer>") == 0.2
    assert reward("<answer>PEAR</answer>") == 0.0
'''

_README = """\
# {name}

A word in capital letters: the model answers inside `<answer>` tags; the reward is 1 for the word in capitals there,
0.5 for it in capitals anywhere, 0.2 for it in any case (the partial credit that lets RL learn). A starting point
written in {api}: change the data, the system prompt and the reward in `{module}.py`.

```bash
prime env install .                  # editable: edits to {module}.py apply at the next run
prime env list                       # {name} is listed as installed, with its arguments
prime eval run {name} -n 5 -r 3      # SmolLM2 served locally; -m/-b for other models
python -m pytest tests               # the data and the reward, without a model
```

Arguments of `load_environment` (`-a '{{"seed": 1}}'`): `num_train_examples` (200), `num_eval_examples` (50),
`seed` (0), `system_prompt`{data_arg}.
"""

_README_DATA_ARG = (", `dataset_name` (a local folder of json, jsonl, csv or parquet files with `question` and "
                    "`answer` columns, instead of the generated rows)")

# ------------------------------------------------------------------------------------------------------------
# a verifiers v1 taskset (verifiers 0.4): the same task, in the shape `vf-init` 0.4.0 writes


def class_prefix(module: str) -> str:
    """`my_env` -> `MyEnv`: the stem of the taskset's class names (MyEnvTaskset, MyEnvTask, ...)."""
    return "".join(part[:1].upper() + part[1:] for part in module.split("_") if part)


def v1_contents(name: str, module: str) -> dict[str, str]:
    """The v1 package's files (path relative to its folder -> text): pyproject (hatchling, verifiers>=0.4,<0.5),
    `MODULE/__init__.py` exporting the taskset, `MODULE/taskset.py`, `MODULE/scoring.py` (the words and the reward
    as plain Python, no verifiers import), a README and a test of scoring.py that runs without verifiers."""
    def fill(template: str) -> str:
        return (template.replace("{name}", name).replace("{module}", module)
                .replace("{Cls}", class_prefix(module)).replace("{words}", _WORDS))

    return {
        "pyproject.toml": fill(_V1_PYPROJECT).replace("{dependencies}", json.dumps([V1_REQUIREMENT])),
        f"{module}/__init__.py": fill(_V1_INIT),
        f"{module}/taskset.py": fill(_V1_TASKSET),
        f"{module}/scoring.py": fill(_V1_SCORING),
        "README.md": fill(_V1_README),
        f"tests/test_{module}.py": fill(_V1_TEST),
    }


_V1_PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "{name}"
version = "0.1.0"
description = "A word in capital letters, in <answer> tags (a verifiers v1 taskset: replace it with your task)."
requires-python = ">=3.11"
dependencies = {dependencies}

[project.optional-dependencies]
test = ["pytest"]

[tool.hatch.build.targets.wheel]
packages = ["{module}"]
"""

_V1_INIT = '''\
from {module}.taskset import {Cls}Taskset

__all__ = ["{Cls}Taskset"]
'''

_V1_TASKSET = '''\
"""{name}: write a word in capital letters; reward 1 for it inside <answer> tags, partial credit on the way
(a verifiers v1 taskset: verifiers 0.4's API).

A starting point: change the words, the system prompt and the reward (scoring.py), then `prime env install .` and
`prime eval run {name}`. Each task is a `TaskData` row (its prompt, its system prompt, its answer); each
`@vf.reward` method of the task scores the final reply, weighted (the episode's reward is the weighted sum); a
`@vf.metric` is recorded beside it. The partial credit is what makes it learnable: a reward that is 0 on every
rollout gives RL nothing to reinforce.
"""

import verifiers.v1 as vf

from {module}.scoring import SYSTEM_PROMPT, make_words, question, score


class {Cls}Data(vf.TaskData):
    answer: str


class {Cls}Task(vf.Task[{Cls}Data]):
    @vf.reward(weight=1.0)
    async def capitalized(self, trace: vf.Trace) -> float:
        return score(trace.last_reply or "", self.data.answer)

    @vf.metric
    async def reply_chars(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply or ""))


class {Cls}Config(vf.TasksetConfig):
    num_tasks: int = 200
    """How many tasks to build."""
    seed: int = 0
    """The same words for the same seed."""


class {Cls}Taskset(vf.Taskset[{Cls}Task, {Cls}Config]):
    def load(self) -> list[{Cls}Task]:
        return [
            {Cls}Task(
                {Cls}Data(prompt=question(word), answer=word.upper(), id=f"w{i}", system_prompt=SYSTEM_PROMPT),
                self.config.task,
            )
            for i, word in enumerate(make_words(self.config.num_tasks, self.config.seed))
        ]
'''

_V1_SCORING = '''\
"""{name}'s words and reward as plain Python: no verifiers import, so tests/ checks them without verifiers 0.4
(taskset.py builds its tasks and scores its replies with them)."""

import random
import re

{words}
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def make_words(count: int, seed: int) -> list[str]:
    """`count` words, the same for the same seed."""
    rng = random.Random(seed)
    return [rng.choice(WORDS) for _ in range(count)]


def question(word: str) -> str:
    return f"Capitalize every letter: {word}"


def score(reply: str, answer: str) -> float:
    """1.0 for the word in capitals inside the tags; 0.5 for it in capitals anywhere; 0.2 for it in any case."""
    tagged = _ANSWER.findall(reply)
    if tagged and tagged[-1].strip() == answer:
        return 1.0
    if answer in reply:
        return 0.5
    return 0.2 if answer.lower() in reply.lower() else 0.0
'''

_V1_TEST = '''\
"""The taskset's words and reward, without a model (run: pytest).

scoring.py is loaded from its file: importing the package imports the taskset, which needs verifiers 0.4 (it is
there once `prime env install .` has put the package into verifiers 0.4's own environment)."""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "{module}_scoring", Path(__file__).resolve().parents[1] / "{module}" / "scoring.py")
assert _spec is not None and _spec.loader is not None
scoring = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scoring)


def test_the_words_are_the_same_for_a_seed_and_each_question_names_its_word() -> None:
    words = scoring.make_words(5, seed=0)
    assert len(words) == 5 and words == scoring.make_words(5, seed=0) and set(words) <= set(scoring.WORDS)
    assert scoring.question("apple").rsplit(" ", 1)[-1] == "apple"


def test_the_reward_is_one_in_tags_and_partial_on_the_way() -> None:
    assert scoring.score("<answer>APPLE</answer>", "APPLE") == 1.0
    assert scoring.score("It is APPLE.", "APPLE") == 0.5
    assert scoring.score("<answer>apple</answer>", "APPLE") == 0.2
    assert scoring.score("<answer>PEAR</answer>", "APPLE") == 0.0
'''

_V1_README = """\
# {name}

A word in capital letters: the model answers inside `<answer>` tags; the reward is 1 for the word in capitals there,
0.5 for it in capitals anywhere, 0.2 for it in any case (the partial credit that lets RL learn). A verifiers v1
taskset (verifiers 0.4's API): `{module}/taskset.py` builds the tasks (`{Cls}Taskset.load`) and scores the final
reply with `{Cls}Task`'s weighted `@vf.reward` methods; the words, the system prompt and the reward's logic are
plain Python in `{module}/scoring.py`. Change them into your task.

```bash
prime env install .                  # into verifiers 0.4's own environment (made once; runs offline after)
prime env list                       # {name}, API v1
prime eval run {name} -n 5 -r 3      # the null harness on a local subprocess runtime; SmolLM2 served locally
python -m pytest tests               # the words and the reward, without a model or verifiers
```

The taskset's config (`-a '{"seed": 1}'`): `num_tasks` (200), `seed` (0).
"""
