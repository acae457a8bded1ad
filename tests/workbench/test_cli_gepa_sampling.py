"""`prime gepa run -t/-T`: max tokens and temperature reach the run's sampling settings, over `-S` and the TOML's
[sampling] key by key (as in `prime eval run`); an endpoint that refuses ends the run with a one-line error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prime_lab.runs.processes import free_port
from prime_lab.runs.registry import RunRegistry
from tests.support.cli import prime

SMALL = ("-B", "4", "-n", "2", "-N", "1")
CONFIG = """model = "smollm2-135m"

[env]
id = "reverse-text"

[sampling]
max_tokens = 48
temperature = 0.7
top_p = 0.9
"""


def sampling_of_a_refused_run(*args: str) -> dict[str, Any]:
    """Run `prime gepa run ARGS` against a port nobody listens on; the sampling settings the run recorded."""
    proc = prime("gepa", "run", *args, "-b", f"http://127.0.0.1:{free_port()}/v1", *SMALL)
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[-1].startswith("Error: the model endpoint failed"), proc.stderr
    run = RunRegistry().runs()[0]
    assert run.status()["state"] == "failed"
    settings: dict[str, Any] = json.loads(run.resolved_path.read_text())["settings"]
    return settings["sampling"]


def test_max_tokens_and_temperature_flags(tmp_path: Path) -> None:
    assert sampling_of_a_refused_run("reverse-text", "-t", "17", "-T", "0.25") == {"max_tokens": 17,
                                                                                   "temperature": 0.25}
    assert sampling_of_a_refused_run("reverse-text", "-S", '{"temperature": 1.0, "top_p": 0.5}', "--max-tokens",
                                     "9") == {"temperature": 1.0, "top_p": 0.5, "max_tokens": 9}
    config = tmp_path / "gepa.toml"
    config.write_text(CONFIG)
    assert sampling_of_a_refused_run(f"@{config}", "-T", "0") == {"max_tokens": 48, "temperature": 0.0, "top_p": 0.9}
    assert sampling_of_a_refused_run(f"@{config}") == {"max_tokens": 48, "temperature": 0.7, "top_p": 0.9}
    negative = prime("gepa", "run", "reverse-text", "-T", "-1")
    assert negative.returncode == 2 and "--temperature" in negative.stderr
