"""The last lines of scripts/test: the suite's wall clock, where it went, and whether it kept its budget.

    python scripts/suite_budget.py STARTED SET_UP CHECKED ENDED PYTEST_EXIT [PYTEST ARGS...]

(the four times are `date +%s` at the start, after the set-up, after ruff/mypy/import contracts and after pytest).
It prints one line of times and one verdict, and exits with the script's status: pytest's, or 3 where pytest
passed but the suite ran past LIMIT_S. The budget is the whole suite's: a run of a part (any pytest arguments) gets
its times and the hard limit only. CI allows 90 minutes; past 60 this fails, so that a growing suite is stopped
long before a submission cannot land.
"""

from __future__ import annotations

import sys
from typing import NamedTuple

BUDGET_S = 30 * 60
LIMIT_S = 60 * 60
OVER_LIMIT_EXIT = 3


class Verdict(NamedTuple):
    lines: list[str]
    exit_code: int
    to_stderr: bool  # the verdict line is a warning or an error


def minutes(seconds: int) -> str:
    return f"{seconds // 60} min {seconds % 60:02d} s"


def verdict(started: int, set_up: int, checked: int, ended: int, pytest_exit: int, pytest_args: list[str]) -> Verdict:
    total = ended - started
    times = (f"scripts/test: {minutes(total)} wall clock (set-up {set_up - started} s, ruff, mypy and import "
             f"contracts {checked - set_up} s, pytest {ended - checked} s; pytest exit {pytest_exit})")
    if total > LIMIT_S:
        line = (f"scripts/test: FAILED: past {LIMIT_S // 60} minutes (the budget is {BUDGET_S // 60}, CI allows 90): "
                "make the slowest tests above faster before adding more")
        return Verdict([times, line], pytest_exit or OVER_LIMIT_EXIT, True)
    if pytest_args:
        line = f"scripts/test: a part of the suite (pytest {' '.join(pytest_args)}): the budget is the whole suite's"
        return Verdict([times, line], pytest_exit, False)
    if total > BUDGET_S:
        line = (f"scripts/test: OVER BUDGET: the suite took more than {BUDGET_S // 60} minutes (past "
                f"{LIMIT_S // 60} this script fails): make the slowest tests above faster")
        return Verdict([times, line], pytest_exit, True)
    return Verdict([times, f"scripts/test: within the {BUDGET_S // 60}-minute budget"], pytest_exit, False)


def main(argv: list[str]) -> int:
    if len(argv) < 5 or not all(a.lstrip("-").isdigit() for a in argv[:5]):
        print("usage: suite_budget.py STARTED SET_UP CHECKED ENDED PYTEST_EXIT [PYTEST ARGS...]", file=sys.stderr)
        return 2
    started, set_up, checked, ended, pytest_exit = (int(a) for a in argv[:5])
    result = verdict(started, set_up, checked, ended, pytest_exit, argv[5:])
    print(result.lines[0])
    print(result.lines[1], file=sys.stderr if result.to_stderr else sys.stdout)
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
