"""The Hugging Face Hub while an environment loads: reachable when it answers, else offline; failures in one line.

Many environments call `datasets.load_dataset("owner/name")`. On a machine without Hub access that retries for about
20 s and ends in a traceback. So the Hub is probed first (runs/hub_probe.py: one request, about a second, once per
process): when it answers, environments load with it reachable and a Hub dataset downloads; when it does not, they
load with `HF_HUB_OFFLINE=1` and `HF_DATASETS_OFFLINE=1`. A user who set either (or `TRANSFORMERS_OFFLINE`) decides
alone: `HF_HUB_OFFLINE=0` lets an environment try the network whatever the probe says, `1` keeps it off. Offline, local
files (json, jsonl, csv, parquet, a folder of them) and the Hub cache load as usual; a Hub dataset that is not on the
machine fails at once, and `failure_message` says which dataset it is and how to point the environment at a local
copy. An environment in its own interpreter (isolated.py) fails there, where prime-lab cannot be imported: driver.py
writes the failure as lines of text (`error_lines`), and `driver_failure_message` reads them into the same message.

datasets and huggingface_hub read these variables when first imported. An environment that imports them while it
loads (most do) keeps them offline for the rest of the process, so a dataset built later (verifiers'
`dataset=build_fn`) does not reach for the network either; the variables are restored afterwards, so the processes
started later (a local sampler) see the user's own settings.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from prime_lab.envs import judges
from prime_lab.runs.hub_probe import hub_endpoint, hub_online, probed_reason

OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
_USER_CHOICE = (*OFFLINE_VARIABLES, "TRANSFORMERS_OFFLINE")
# The module-level flags the two libraries read on each request, for when they were imported before the load.
_LIVE_FLAGS = {"huggingface_hub.constants": ("HF_HUB_OFFLINE",),
               "datasets.config": ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}

_UNREACHABLE = {"OfflineModeIsEnabled", "LocalEntryNotFoundError"}
_MISSING = {"DatasetNotFoundError", "RepositoryNotFoundError", "GatedRepoError", "RevisionNotFoundError"}
_QUOTED_ID = re.compile(r"'([^'\s]+)'")
_URL_ID = re.compile(r"/datasets/([\w.-]+(?:/[\w.-]+)?)")
_HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


_forcing = 0  # how many `offline_unless_chosen` blocks set the variables (they are then not the user's)


def offline_chosen_by_user() -> bool:
    return _forcing == 0 and any(name in os.environ for name in _USER_CHOICE)


def forced_offline() -> bool:
    """Whether environments load with the Hub made offline here: the user set none of the offline variables and
    the Hub did not answer the probe (once per process). An isolated environment's interpreter gets the same."""
    return not offline_chosen_by_user() and not hub_online()


@contextmanager
def offline_unless_chosen() -> Iterator[None]:
    """Within the block, the Hub is offline when it did not answer the probe, unless the user set one of the
    offline variables (then theirs holds)."""
    global _forcing
    if _forcing or not forced_offline():
        yield
        return
    patched: list[tuple[Any, str, Any]] = []
    for module_name, flags in _LIVE_FLAGS.items():
        module = sys.modules.get(module_name)
        for flag in flags if module is not None else ():
            if hasattr(module, flag):
                patched.append((module, flag, getattr(module, flag)))
                setattr(module, flag, True)
    os.environ.update(dict.fromkeys(OFFLINE_VARIABLES, "1"))
    _forcing += 1
    try:
        yield
    finally:
        _forcing -= 1
        for name in OFFLINE_VARIABLES:
            os.environ.pop(name, None)
        for module, flag, value in reversed(patched):
            setattr(module, flag, value)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def error_lines(exc: BaseException) -> list[str]:
    """`exc` and what caused it, outermost first, each as a traceback's last line: `package.module.Type: message`
    (a builtin as `Type: message`). driver.py writes an environment interpreter's failure the same way
    (`error_chain`), so that one reading of these lines serves both interpreters."""
    lines = []
    for error in _chain(exc):
        kind = type(error)
        name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
        text = str(error)
        lines.append(f"{name}: {text}" if text else name)
    return lines


_LINE = re.compile(r"^([\w.]+)(?:: (.*))?$", re.DOTALL)


def _parse(line: str) -> tuple[str, str, str]:
    """(package, type name, message) of one `error_lines` line."""
    match = _LINE.match(line)
    if match is None:
        return "", "", line
    qualified, text = match.group(1), match.group(2) or ""
    return qualified.split(".")[0] if "." in qualified else "builtins", qualified.rsplit(".", 1)[-1], text


def _kind(package: str, name: str, text: str) -> str | None:
    """'unreachable' or 'missing' for a Hub failure (datasets' or huggingface_hub's), else None."""
    if package in ("datasets", "huggingface_hub"):
        if name in _MISSING:
            return "missing"
        if name in _UNREACHABLE:
            return "unreachable"
    if name == "ConnectionError" and "on the Hub" in text:  # datasets: "Couldn't reach 'x' on the Hub"
        return "unreachable"
    return None


def _dataset_id(text: str) -> str | None:
    for pattern in (_URL_ID, _QUOTED_ID):
        match = pattern.search(text)
        if match:
            return match.group(1)
    return None


# Arguments that commonly name an environment's dataset, for when none holds the failing id itself.
_DATASET_ARGUMENTS = ("dataset_name", "dataset_path", "dataset_id", "dataset", "data_path", "data_dir")


def failure_message(exc: BaseException, env_id: str, arguments: dict[str, Any]) -> str | None:
    """A one-line message for a Hub dataset out of reach (None when `exc` is something else).

    `arguments` are the environment's `load_environment` arguments with their values for this load (defaults
    included): the one holding the dataset id is the one to point at a local copy. An LLM judge with no key gets its
    own line (`judges.lines_failure_message`), as it fails the same way in both interpreters."""
    lines = error_lines(exc)
    return lines_failure_message(lines, env_id, arguments) or judges.lines_failure_message(lines, env_id, arguments)


def driver_failure_message(answer: Mapping[str, Any], env_id: str) -> str | None:
    """`failure_message` for a failure in an environment's own interpreter: driver.py's `check` or `describe`
    answer (its `errors` lines and `arguments`), in the same words as in this process."""
    lines = answer.get("errors")
    arguments = answer.get("arguments")
    if not isinstance(lines, list):
        return None
    texts, given = [str(line) for line in lines], dict(arguments) if isinstance(arguments, dict) else {}
    return lines_failure_message(texts, env_id, given) or judges.lines_failure_message(texts, env_id, given)


def lines_failure_message(lines: Sequence[str], env_id: str, arguments: Mapping[str, Any]) -> str | None:
    """`failure_message` read from an error's `error_lines`."""
    failures = []
    for package, name, text in map(_parse, lines):
        kind = _kind(package, name, text)
        if kind is not None:
            failures.append((name, text, kind))
    if not failures:
        return None
    error, message, kind = failures[0]
    dataset = next((d for _, text, _ in failures if (d := _dataset_id(text))), None)
    if dataset is None:
        dataset = next((v for v in arguments.values() if isinstance(v, str) and _HUB_ID.match(v)), None)
    named = f"dataset '{dataset}'" if dataset else "a Hugging Face Hub dataset"
    if kind == "missing":
        why = f"{named} is not on the Hugging Face Hub or is not public (a gated one needs HF_TOKEN)"
    elif "OfflineModeIsEnabled" in f"{error} {message}":
        probed = not offline_chosen_by_user() and probed_reason() is not None
        chosen = f"the Hugging Face Hub at {hub_endpoint()} did not answer, so environments load offline; " \
            if probed else ""
        why = f"{named} is not on this machine and the Hub is offline ({chosen}HF_HUB_OFFLINE=0 downloads)"
    else:
        why = f"{named} is not on this machine and the Hugging Face Hub cannot be reached"
    folder = "/path/to/folder"
    download = (f"download it where the Hub is reachable (hf download {dataset} --repo-type dataset --local-dir "
                "FOLDER), copy the folder here, and ") if dataset else "put a copy in a local folder and "
    argument = next((name for name, value in arguments.items() if dataset and value == dataset), None)
    argument = argument or next((name for name in _DATASET_ARGUMENTS if name in arguments), None)
    if argument is not None:
        fix = f"pass {argument}='{folder}' (-a '{{\"{argument}\": \"{folder}\"}}')"
    else:
        fix = (f"load it in the environment with datasets.load_dataset('{folder}'), or from files with "
               "datasets.load_dataset('json', data_files=...)")
    return f"environment '{env_id}': {why}; {download}{fix}"
