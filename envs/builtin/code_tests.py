"""code-tests: write a small Python function; its hidden tests run in a sandbox; reward = the share that pass.

Each row asks for one function (its signature and a docstring with one example) of 46 kinds, from returning a
constant, adding two numbers and reversing a string to counting vowels and Fibonacci numbers, some with a number or
word drawn per row; 3 to 5 hidden tests each, drawn from the kind's cases (the first is the docstring's example).
The model answers with the function in a ```python block (without one, the `def` of that name and its indented
body are taken from the reply). The code and the tests
run in a local sandbox made for the scoring and deleted after it (envs/builtin/_sandbox.py): a runner imports the
code and calls the function once per test, each call cut after `test_timeout` seconds (an endless loop fails that
test, and the rest still run; the whole run is cut after the sum), and sends back each return value as JSON, which
is compared here, outside the sandbox (a value that only claims to be equal does not pass). The answer is a
reference solution, which passes every test. Reward: tests passed / tests.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prime_lab.envs import Rubric, SingleTurnEnv
from prime_lab.envs.builtin._common import WORDS, generate_splits, limit, pick_split
from prime_lab.envs.builtin._sandbox import run_python, scoring_sandbox
from prime_lab.envs.parsers import last_assistant_text

NAME = "code-tests"
SYSTEM_PROMPT = ("You are a Python programmer. Write the function you are asked for. Reply with the complete "
                 "function in one ```python code block.")


@dataclass(frozen=True)
class Task:
    """One function to write: its signature and docstring, a reference body, the arguments its tests may take, and
    the reference (which gives each test's expected value)."""

    signature: str  # "add(a: int, b: int) -> int"
    doc: str
    body: str  # the reference implementation's body, one statement a line, not indented
    cases: tuple[tuple[Any, ...], ...]  # 3 or more; a row tests 3 to 5 of them, the first shown as its example
    ref: Callable[..., Any]

    @property
    def name(self) -> str:
        return self.signature.split("(")[0]

    def source(self) -> str:
        """The reference solution."""
        return f"def {self.signature}:\n" + "".join(f"    {line}\n" for line in self.body.splitlines())

    def row(self, rng: random.Random) -> dict[str, Any]:
        """A row: 3 to 5 of the cases drawn, the first one shown in the docstring, all of them the hidden tests."""
        chosen = rng.sample(self.cases, min(len(self.cases), rng.randint(3, 5)))
        call = f"{self.name}({', '.join(repr(a) for a in chosen[0])})"
        stub = (f'def {self.signature}:\n    """{self.doc}\n\n    >>> {call}\n    {self.ref(*chosen[0])!r}\n'
                '    """\n')
        question = (f"Write this Python function:\n\n```python\n{stub}```\n\nReply with the complete function "
                    "in a ```python code block.")
        tests = [{"args": list(args), "expected": self.ref(*args)} for args in chosen]
        return {"question": question, "answer": self.source(),
                "info": {"function": self.name, "tests": json.loads(json.dumps(tests))}}


def _k(rng: random.Random) -> int:
    return rng.randint(2, 99)


def _word(rng: random.Random) -> str:
    return rng.choice(WORDS)


Cases = tuple[tuple[Any, ...], ...]
INTS: Cases = ((0,), (1,), (-3,), (7,), (12,), (-10,), (40,))
PAIRS: Cases = ((2, 3), (0, 0), (-4, 10), (100, 23), (7, -7), (5, 3), (-2, -6))
TEXTS: Cases = (("hello",), ("",), ("ab",), ("racecar",), ("Python",), ("a b c",), ("banana",))
LISTS: Cases = (([1, 2, 3],), ([],), ([-5, 5, 10],), ([7],), ([4, 0, 4, 9],), ([3, -1, 2],))
FULL: Cases = tuple(c for c in LISTS if c[0])  # lists that are not empty


def _kinds() -> list[Callable[[random.Random], Task]]:
    """Each kind of task: a Task for the row's random draws (a number or word in the task itself, for some)."""
    def constant(rng: random.Random) -> Task:
        k = _k(rng)
        return Task("answer() -> int", f"Return the number {k}.", f"return {k}", ((),) * 3, lambda: k)

    def ignore(rng: random.Random) -> Task:
        k = _k(rng)
        return Task("always(x: int) -> int", f"Return {k}, whatever x is.", f"return {k}", INTS, lambda x: k)

    def add_k(rng: random.Random) -> Task:
        k = _k(rng)
        return Task(f"add_{k}(x: int) -> int", f"Return x plus {k}.", f"return x + {k}", INTS, lambda x: x + k)

    def times_k(rng: random.Random) -> Task:
        k = _k(rng)
        return Task(f"times_{k}(x: int) -> int", f"Return x multiplied by {k}.", f"return x * {k}", INTS,
                    lambda x: x * k)

    def greet(rng: random.Random) -> Task:
        word = rng.choice(["Hello", "Hi", "Welcome", "Goodbye", "Hey", "Good morning"])
        return Task("greet(name: str) -> str", f'Return "{word}, " followed by the name and "!".',
                    f'return "{word}, " + name + "!"', (("Ada",), ("Bob",), ("",), ("Zoe",), ("Sam",)),
                    lambda name: f"{word}, {name}!")

    def repeat(rng: random.Random) -> Task:
        k = rng.randint(2, 9)
        return Task(f"repeat_{k}(s: str) -> str", f"Return the string s repeated {k} times.", f"return s * {k}",
                    TEXTS, lambda s: s * k)

    def divisible(rng: random.Random) -> Task:
        k = rng.randint(2, 12)
        return Task(f"divisible_by_{k}(n: int) -> bool", f"Return True if n is divisible by {k}, else False.",
                    f"return n % {k} == 0", ((k * 3,), (k + 1,), (0,), (k * 7 - 1,), (-k,), (k * 11,)),
                    lambda n: n % k == 0)

    def suffix(rng: random.Random) -> Task:
        word = _word(rng)
        return Task("add_suffix(s: str) -> str", f'Return s followed by "{word}".', f'return s + "{word}"', TEXTS,
                    lambda s: s + word)

    fixed: list[Task] = [
        Task("add(a: int, b: int) -> int", "Return the sum of a and b.", "return a + b", PAIRS, lambda a, b: a + b),
        Task("subtract(a: int, b: int) -> int", "Return a minus b.", "return a - b", PAIRS, lambda a, b: a - b),
        Task("multiply(a: int, b: int) -> int", "Return the product of a and b.", "return a * b", PAIRS,
             lambda a, b: a * b),
        Task("square(x: int) -> int", "Return x squared.", "return x * x", INTS, lambda x: x * x),
        Task("reverse_string(s: str) -> str", "Return the string s reversed.", "return s[::-1]", TEXTS,
             lambda s: s[::-1]),
        Task("is_even(n: int) -> bool", "Return True if n is even, else False.", "return n % 2 == 0", INTS,
             lambda n: n % 2 == 0),
        Task("maximum(a: int, b: int) -> int", "Return the larger of a and b.", "return max(a, b)", PAIRS, max),
        Task("absolute(x: int) -> int", "Return the absolute value of x.", "return abs(x)", INTS, abs),
        Task("to_upper(s: str) -> str", "Return s in upper case.", "return s.upper()", TEXTS, lambda s: s.upper()),
        Task("first_char(s: str) -> str", "Return the first character of s (s is not empty).", "return s[0]",
             tuple(t for t in TEXTS if t[0]), lambda s: s[0]),
        Task("last_item(items: list) -> int", "Return the last element of the list items (it is not empty).",
             "return items[-1]", FULL, lambda items: items[-1]),
        Task("count_items(items: list) -> int", "Return how many elements the list items has.", "return len(items)",
             LISTS, len),
        Task("sum_list(numbers: list) -> int", "Return the sum of the numbers in the list.", "return sum(numbers)",
             LISTS, sum),
        Task("is_positive(x: int) -> bool", "Return True if x is greater than 0, else False.", "return x > 0", INTS,
             lambda x: x > 0),
        Task("double_all(numbers: list) -> list", "Return a new list with every number doubled.",
             "return [2 * n for n in numbers]", LISTS, lambda ns: [2 * n for n in ns]),
        Task("length_of(s: str) -> int", "Return the number of characters in s.", "return len(s)", TEXTS, len),
        Task("concat(a: str, b: str) -> str", "Return a and b joined together.", "return a + b",
             (("ab", "cd"), ("", "x"), ("x", ""), ("red", "fox"), ("1", "2")), lambda a, b: a + b),
        Task("is_palindrome(s: str) -> bool", "Return True if s reads the same backwards, else False.",
             "return s == s[::-1]", (*TEXTS, ("abba",), ("abca",)), lambda s: s == s[::-1]),
        Task("count_vowels(s: str) -> int", "Return how many of the characters of s are vowels (a, e, i, o, u).",
             'return sum(1 for c in s if c in "aeiou")', (*TEXTS, ("sky",), ("aeiou",)),
             lambda s: sum(1 for c in s if c in "aeiou")),
        Task("factorial(n: int) -> int", "Return n! (the product 1 * 2 * ... * n; 0! is 1).",
             "result = 1\nfor i in range(2, n + 1):\n    result *= i\nreturn result", ((0,), (1,), (3,), (5,), (10,)),
             math.factorial),
        Task("fibonacci(n: int) -> int", "Return the n-th Fibonacci number (fibonacci(0) is 0, fibonacci(1) is 1).",
             "a, b = 0, 1\nfor _ in range(n):\n    a, b = b, a + b\nreturn a", ((0,), (1,), (2,), (7,), (20,)), _fib),
        Task("largest(numbers: list) -> int", "Return the largest number in the list (it is not empty).",
             "return max(numbers)", FULL, max),
        Task("smallest(numbers: list) -> int", "Return the smallest number in the list (it is not empty).",
             "return min(numbers)", FULL, min),
        Task("evens(numbers: list) -> list", "Return the even numbers of the list, in their order.",
             "return [n for n in numbers if n % 2 == 0]", LISTS, lambda ns: [n for n in ns if n % 2 == 0]),
        Task("count_char(s: str, c: str) -> int", "Return how many times the character c occurs in s.",
             "return s.count(c)", (("banana", "a"), ("hello", "z"), ("", "a"), ("hello", "l"), ("aaa", "a")),
             lambda s, c: s.count(c)),
        Task("celsius_to_fahrenheit(c: float) -> float", "Return the temperature c (Celsius) in Fahrenheit.",
             "return c * 9 / 5 + 32", ((0,), (100,), (-40,), (10,), (37,)), lambda c: c * 9 / 5 + 32),
        Task("word_count(s: str) -> int", "Return the number of words in s (words are separated by spaces).",
             "return len(s.split())", (*TEXTS, ("hello world",), ("a b  c",)), lambda s: len(s.split())),
        Task("remove_spaces(s: str) -> str", "Return s without its space characters.", 'return s.replace(" ", "")',
             (*TEXTS, ("hello world",)), lambda s: s.replace(" ", "")),
        Task("average(numbers: list) -> float", "Return the mean of the numbers (the list is not empty).",
             "return sum(numbers) / len(numbers)", FULL, lambda ns: sum(ns) / len(ns)),
        Task("contains(items: list, x: int) -> bool", "Return True if x is in the list items, else False.",
             "return x in items", (([1, 2, 3], 2), ([], 1), ([4, 5], 6), ([0], 0), ([7, 8, 9], 9)),
             lambda items, x: x in items),
        Task("join_words(words: list) -> str", "Return the words joined with one space between each.",
             'return " ".join(words)', ((["a", "b"],), ([],), (["hello"],), (["red", "fox", "runs"],)),
             lambda ws: " ".join(ws)),
        Task("sum_to(n: int) -> int", "Return the sum 1 + 2 + ... + n (0 for n = 0).", "return n * (n + 1) // 2",
             ((0,), (1,), (10,), (100,), (7,)), lambda n: n * (n + 1) // 2),
        Task("min_of_three(a: int, b: int, c: int) -> int", "Return the smallest of a, b and c.",
             "return min(a, b, c)", ((1, 2, 3), (3, 2, 1), (5, -1, 5), (0, 0, 0), (9, 4, 6)), min),
        Task("count_positive(numbers: list) -> int", "Return how many numbers in the list are greater than 0.",
             "return sum(1 for n in numbers if n > 0)", LISTS, lambda ns: sum(1 for n in ns if n > 0)),
        Task("sorted_list(numbers: list) -> list", "Return the numbers sorted from smallest to largest.",
             "return sorted(numbers)", LISTS, sorted),
        Task("unique(items: list) -> list", "Return the elements of items without repeats, in first-seen order.",
             "seen = []\nfor x in items:\n    if x not in seen:\n        seen.append(x)\nreturn seen",
             (*LISTS, ([1, 2, 1, 3],), ([4, 4, 4],)), lambda items: list(dict.fromkeys(items))),
        Task("capitalize_words(s: str) -> str", "Return s with the first letter of every word in upper case.",
             "return s.title()", (*TEXTS, ("hello world",)), lambda s: s.title()),
        Task("digit_sum(n: int) -> int", "Return the sum of the decimal digits of n (n >= 0).",
             "return sum(int(d) for d in str(n))", ((123,), (0,), (9999,), (7,), (505,)),
             lambda n: sum(int(d) for d in str(n))),
    ]
    kinds: list[Callable[[random.Random], Task]] = [constant, ignore, add_k, times_k, greet, repeat, divisible,
                                                     suffix]
    return kinds + [_always(task) for task in fixed]


def _always(task: Task) -> Callable[[random.Random], Task]:
    return lambda _rng: task


def _fib(n: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


KINDS = _kinds()

_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)


def extract_code(text: str, name: str) -> str | None:
    """The code of a reply: its last ```python block that defines `name` (else its last block); without a block,
    the `def name(` line and the indented lines after it (imports before it kept). None when there is none."""
    blocks = [b for b in _FENCE.findall(text) if b.strip()]
    defining = [b for b in blocks if re.search(rf"^\s*def\s+{re.escape(name)}\s*\(", b, re.MULTILINE)]
    if defining:
        return defining[-1]
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if re.match(rf"\s*def\s+{re.escape(name)}\s*\(", line)), None)
    if start is None:
        return blocks[-1] if blocks else None
    indent = len(lines[start]) - len(lines[start].lstrip())
    body = [lines[start][indent:]]
    for line in lines[start + 1:]:
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break
        body.append(line[indent:] if line.strip() else "")
    imports = [line.strip() for line in lines[:start] if re.match(r"\s*(import|from)\s+\w", line)]
    return "\n".join([*imports, *body]).rstrip() + "\n"


# Runs in the sandbox: imports the solution with its prints sent away, calls the function once per test, each call
# cut by a timer, and writes one JSON line per test to a copy of stdout the solution does not print on.
RUNNER = r'''
import json, os, signal, sys
out = os.fdopen(os.dup(1), "w")
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
spec = json.load(open("tests.json"))
limit = spec["timeout"]

class TimedOut(BaseException):
    pass

def alarm(*_):
    raise TimedOut()

def report(**fields):
    out.write(json.dumps(fields, default=lambda o: {"unreadable": repr(o)[:200]}) + "\n")
    out.flush()

def cut(seconds):
    signal.setitimer(signal.ITIMER_REAL, seconds)

signal.signal(signal.SIGALRM, alarm)
namespace = {"__name__": "solution"}
try:
    cut(limit)
    exec(compile(open("solution.py").read(), "solution.py", "exec"), namespace)
    cut(0)
except BaseException as exc:
    cut(0)
    report(error="the code did not run: " + ("timed out" if isinstance(exc, TimedOut) else
                                              type(exc).__name__ + ": " + str(exc))[:300])
    sys.exit(0)
function = namespace.get(spec["function"])
if not callable(function):
    report(error="no function named " + spec["function"])
    sys.exit(0)
for i, args in enumerate(spec["args"]):
    try:
        cut(limit)
        value = function(*args)
        cut(0)
        report(test=i, value=value)
    except BaseException as exc:
        cut(0)
        report(test=i, error="timed out" if isinstance(exc, TimedOut) else (type(exc).__name__ + ": " + str(exc))[:300])
'''


def same(value: Any, expected: Any) -> bool:
    """Whether a returned value (read back from JSON) equals the expected one: same kinds (a bool is no number),
    numbers within 1e-9 relative, lists element by element."""
    if isinstance(expected, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(expected, bool) and value == expected
    if isinstance(expected, int | float) and isinstance(value, int | float):
        return math.isclose(value, expected, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(expected, list) and isinstance(value, list):
        return len(value) == len(expected) and all(same(v, e) for v, e in zip(value, expected, strict=True))
    return type(value) is type(expected) and value == expected


async def run_tests(code: str, function: str, tests: list[dict[str, Any]], test_timeout: float) -> list[dict[str, Any]]:
    """Each test's outcome (`passed`, and the value or the error), `code` run against them in a fresh sandbox. A
    test the runner never reported (the whole run cut after the sum of the tests' limits) failed."""
    spec = {"function": function, "timeout": test_timeout, "args": [t["args"] for t in tests]}
    async with scoring_sandbox(NAME) as sandbox:
        sandbox.write_file("/app/solution.py", code.encode())
        sandbox.write_file("/app/tests.json", json.dumps(spec).encode())
        result = await run_python(sandbox, RUNNER, "runner.py", test_timeout * (len(tests) + 1) + 5.0)
    reported: dict[int, dict[str, Any]] = {}
    general = ""
    for line in result.stdout.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict) and isinstance(item.get("test"), int):
            reported.setdefault(item["test"], item)
        elif isinstance(item, dict) and "error" in item:
            general = str(item["error"])
    outcomes = []
    for i, test in enumerate(tests):
        item = reported.get(i)
        if item is None:
            error = general or ("the run was cut at its time limit" if result.timed_out else "no result")
            outcomes.append({"passed": False, "error": error})
        elif "error" in item:
            outcomes.append({"passed": False, "error": item["error"]})
        else:
            outcomes.append({"passed": same(item.get("value"), test["expected"]), "value": item.get("value")})
    return outcomes


def load_environment(
    split: str = "train",
    max_examples: int = -1,
    num_train_examples: int = 300,
    num_eval_examples: int = 60,
    seed: int = 0,
    test_timeout: float = 2.0,
    system_prompt: str = SYSTEM_PROMPT,
) -> SingleTurnEnv:
    if not test_timeout > 0:
        raise ValueError("test_timeout must be above 0")

    def make(rng: random.Random, _: int) -> dict[str, Any]:
        return rng.choice(KINDS)(rng).row(rng)

    train, test = generate_splits(make, seed=seed, num_train=num_train_examples, num_eval=num_eval_examples,
                                  key=lambda r: r["question"])

    async def passed_tests(completion: Any, info: dict[str, Any], state: dict[str, Any]) -> float:
        """The share of the hidden tests the function in the reply passes (0 without code)."""
        code = extract_code(last_assistant_text(completion), info["function"])
        if code is None:
            state["test_results"] = []
            return 0.0
        outcomes = await run_tests(code, info["function"], info["tests"], test_timeout)
        state["test_results"] = outcomes
        return sum(o["passed"] for o in outcomes) / len(outcomes)

    return SingleTurnEnv(dataset=limit(pick_split(split, train, test), max_examples),
                         eval_dataset=limit(test, max_examples), system_prompt=system_prompt,
                         rubric=Rubric([passed_tests]))
