"""One `prime_lab` import package: prime-lab runs beside PyPI packages that share its folder names (`gepa` is the
reference GEPA that verifiers depends on; `trainer` is Coqui's), started from a project folder that holds
`runs/`, `models/`, `envs/`, `environments/`, `trainer/`, `gepa/`, ... (every top-level folder of ours) of its own,
as verifiers projects do.

The project's folders raise on import and are also on PYTHONPATH (as an installed module named `trainer` would be),
so a bare `import trainer` / `import runs` anywhere in the CLI, the servers, the orchestrator or the trainer fails the
run. The reference `gepa` (a dev dependency) must still import and run its own `optimize` in the same environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from prime_lab.runs.registry import RunRegistry
from tests.envs.scripted import scripted_endpoint
from tests.gepa.reflection_standin import write_gepa_config
from tests.support.cli import prime
from tests.support.rl_runs import FIXTURE_ENVS, write_config

SHADOWING = ("runs", "problems", "envs", "models", "monitors", "inference", "evals", "workspace", "trainer", "gepa",
             "workbench", "environments", "lab")
pytestmark = pytest.mark.slow


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's project folder whose own packages are named like ours, first on the path of every process."""
    folder = tmp_path / "my-project"
    for name in SHADOWING:
        (folder / name).mkdir(parents=True)
        (folder / name / "__init__.py").write_text(f"raise ImportError('the project\\'s own `{name}` was imported')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(folder), str(FIXTURE_ENVS)]))
    return folder


def prime_in(project: Path, *args: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    """`prime ARGS` from the project folder; none of the project's own packages was imported."""
    proc = prime(*args, cwd=project, timeout=timeout)
    assert "was imported" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    return proc


def test_the_project_folders_shadow_bare_names(project: Path) -> None:
    """The set-up is real: a bare import from that folder gets the project's package, not ours or PyPI's."""
    for name in ("trainer", "gepa"):
        proc = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True, text=True, cwd=project)
        assert proc.returncode != 0 and f"the project's own `{name}` was imported" in proc.stderr


def test_eval_and_gepa_run_from_a_shadowing_project(project: Path, builtin_server: Any) -> None:
    out = project / "outputs"
    proc = prime_in(project, "eval", "run", "reverse-text", "-m", builtin_server.model_name, "-b",
                    builtin_server.base_url, "-n", "2", "-r", "2", "-t", "8")
    assert proc.returncode == 0, proc.stderr
    results = list((out / "evals").rglob("results.jsonl"))
    assert len(results) == 1 and len(results[0].read_text().splitlines()) == 4

    proposals = [f"```\nReverse the text (attempt {i}).\n```" for i in range(20)]
    with scripted_endpoint(proposals) as reflection:
        config = write_gepa_config(project / "gepa.toml", builtin_server, reflection, "reverse-text", max_calls=12,
                                   num_train=4, num_val=2)
        proc = prime_in(project, "gepa", "run", f"@{config}", "-o", str(project / "gepa-run"))
    assert proc.returncode == 0, proc.stderr
    meta = json.loads((project / "gepa-run" / "gepa" / "metadata.json").read_text())
    assert 0 < meta["total_metric_calls"] <= 12


def test_rl_run_from_a_shadowing_project(project: Path, learnable_model_dir: Path) -> None:
    config = write_config(project / "rl.toml", learnable_model_dir, steps=2, checkpoint_interval=1)
    proc = prime_in(project, "rl", "run", f"@{config}", "--foreground", timeout=500)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = [r for r in RunRegistry().runs() if (r.dir / "adapters").exists()]
    assert len(runs) == 1 and runs[0].status()["state"] == "completed"
    assert (runs[0].dir / "adapters" / "step_2" / "adapter_model.safetensors").exists()


def test_reference_gepa_runs_its_own_optimize_beside_prime_lab(tmp_path: Path) -> None:
    """PyPI `gepa` in the same environment: it imports as itself and its `optimize` runs a small search."""
    script = r'''
import gepa, prime_lab.gepa
from gepa import EvaluationBatch
assert not gepa.__file__.startswith(prime_lab.gepa.__path__[0]), gepa.__file__

class Adapter:
    propose_new_texts = None
    def evaluate(self, batch, candidate, capture_traces=False):
        scores = [float(x in candidate["system_prompt"]) for x in batch]
        traces = [{"Inputs": x, "Score": s} for x, s in zip(batch, scores)] if capture_traces else None
        return EvaluationBatch(outputs=list(batch), scores=scores, trajectories=traces)
    def make_reflective_dataset(self, candidate, eval_batch, components):
        return {c: eval_batch.trajectories for c in components}

result = gepa.optimize(seed_candidate={"system_prompt": "say"}, trainset=["a", "b"], valset=["a", "b"],
                       adapter=Adapter(), reflection_lm=lambda prompt: "```\nsay a b\n```", max_metric_calls=12,
                       reflection_minibatch_size=2, seed=0)
print("BEST", result.val_aggregate_scores[result.best_idx])
'''
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "BEST 1.0" in proc.stdout, proc.stdout + proc.stderr
