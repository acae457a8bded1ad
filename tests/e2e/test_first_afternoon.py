"""From an empty folder to a measured better model, as README's "A first afternoon" shows it, on SmolLM2: setup,
doctor, a baseline evaluation of the example environment, GEPA, its best prompt exported as an RL config, the RL
run, an evaluation of its adapter, and `prime eval compare` of base, best prompt and adapter. The RL run is the
exported config cut to 12 steps and 24-token answers (README, "A first afternoon"), and the test checks the lift
itself: the run's own evaluation, base model and final policy on the same 20 examples x 4 rollouts."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
import tomlkit

from tests.support import cli

pytestmark = pytest.mark.slow
prime = partial(cli.prime, timeout=900)
N = "6"  # evaluation examples: the same 6 of the eval split for every evaluation


@pytest.fixture
def installed_example() -> Iterator[None]:
    yield
    subprocess.run([sys.executable, "-m", "pip", "uninstall", "-q", "-y", "my-env"], timeout=300, check=False)


def newest(kind: str, cwd: Path) -> str:
    listed = prime(kind, "list", "-o", "json", cwd=cwd)
    assert listed.returncode == 0, listed.stderr
    return str(json.loads(listed.stdout)[0]["id"])


def test_a_first_afternoon(tmp_path: Path, smollm2_dir: Path, installed_example: None) -> None:
    ws = tmp_path / "my-lab"
    step = prime("lab", "setup", str(ws))
    assert step.returncode == 0, step.stderr
    doctor = prime("lab", "doctor", str(ws))
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr

    # the example environment, installed, then its baseline
    step = prime("env", "install", "environments/my-env", cwd=ws)
    assert step.returncode == 0, step.stderr
    step = prime("eval", "run", "my-env", "-n", N, "-r", "1", "-t", "24", "-o", "outputs/base", cwd=ws)
    assert step.returncode == 0, step.stderr

    # GEPA on its system prompt, and the best prompt as an RL config
    step = prime("gepa", "run", "my-env", "-B", "10", "-n", "3", "-N", "3", "-t", "24", "--minibatch-size", "2",
                 "-P", "1", cwd=ws)
    assert step.returncode == 0, step.stderr
    gepa = newest("gepa", ws)
    step = prime("gepa", "export", gepa, "--rl", "-o", "configs/rl/my-env.toml", "--max-steps", "12", cwd=ws)
    assert step.returncode == 0 and "takes system_prompt" in step.stderr, step.stderr
    config = ws / "configs" / "rl" / "my-env.toml"
    doc = tomlkit.parse(config.read_text())  # sized for a CI machine, as the README's note says
    assert (doc["batch_size"], doc["rollouts_per_example"]) == (16, 4)  # kept: the lift needs the batch and steps
    doc["sampling"]["max_tokens"] = 24  # type: ignore[index]  # "<answer>APPLE</answer>" and a few words fit
    doc["eval"]["num_examples"], doc["eval"]["rollouts_per_example"] = 20, 4  # type: ignore[index]
    config.write_text(tomlkit.dumps(doc))
    step = prime("rl", "run", "@configs/rl/my-env.toml", "--foreground", cwd=ws)
    assert step.returncode == 0, step.stderr
    # the run's own base -> final evaluation, where the user looks: at the end of the foreground run
    assert "evaluation (mean reward over 20 examples x 4 rollouts)" in step.stderr, step.stderr
    rl = newest("rl", ws)
    # the lift: +0.125, +0.140 and +0.080 in three runs of this config (x 1, 2, 2 rollouts); the change's noise
    # from sampling alone is about 0.025 at 20 x 4 (rewards of sd ~0.15), so 0.03 is well below what it learns
    got = prime("rl", "get", rl, "-o", "json", cwd=ws)
    evaluation = json.loads(got.stdout)["evaluation"]
    print("the run's evaluation:", json.dumps(evaluation))
    [row] = evaluation
    assert (row["env"], row["examples"], row["rollouts_per_example"]) == ("my-env", 20, 4), row
    assert row["final_step"] == 12 and row["final"] - row["base"] >= 0.03, row

    # before/after on the same examples: the best prompt, and the trained adapter under it
    for out, flags in (("outputs/best", ["--system-prompt-file", gepa]),
                       ("outputs/adapter", ["--adapter", rl, "--system-prompt-file", gepa])):
        step = prime("eval", "run", "my-env", "-n", N, "-r", "1", "-t", "24", "-o", out, *flags, cwd=ws)
        assert step.returncode == 0, step.stderr
    adapter_meta = json.loads((ws / "outputs" / "adapter" / "metadata.json").read_text())
    assert adapter_meta["policy"]["run_id"] == rl and adapter_meta["system_prompt"]["gepa_run"] == gepa
    compared = prime("eval", "compare", "outputs/base", "outputs/best", "outputs/adapter", "-o", "json", cwd=ws)
    assert compared.returncode == 0, compared.stderr
    result = json.loads(compared.stdout)
    assert result["env_id"] == "my-env" and len(result["evaluations"]) == 3 and len(result["examples"]) == int(N)
    assert len(result["differences"]) == 2  # best prompt and adapter, each against the base, with an interval
    text = prime("eval", "compare", "outputs/base", "outputs/best", "outputs/adapter", cwd=ws)
    assert text.returncode == 0 and "95%" in text.stdout, text.stdout
