"""The CLI and the headless packages start without torch or textual (checked in a fresh interpreter)."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHECK = """
import sys
{body}
heavy = sorted(m for m in ("torch", "textual", "transformers", "vllm") if m in sys.modules)
print("HEAVY:" + ",".join(heavy))
"""


def loaded_after(body: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", CHECK.format(body=body)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    marker = [line for line in out.stdout.splitlines() if line.startswith("HEAVY:")][-1]
    return [m for m in marker.removeprefix("HEAVY:").split(",") if m]


def test_prime_help_imports_neither_torch_nor_textual() -> None:
    body = ("from prime_lab.workbench.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "try:\n    main(['rl', 'list'])\nexcept SystemExit:\n    pass")
    assert loaded_after(body) == []


@pytest.mark.parametrize("module", [f"prime_lab.{name}" for name in (
    "runs.registry", "runs.events", "runs.processes", "problems.validation", "envs", "models", "monitors.alerts",
    "inference", "evals.compare", "workspace.machine", "trainer.config", "trainer.scheduler", "gepa")])
def test_headless_modules_import_neither_torch_nor_textual(module: str) -> None:
    assert loaded_after(f"import {module}") == []


def test_import_linter_contracts_hold() -> None:
    from pathlib import Path

    lint = Path(sys.executable).parent / "lint-imports"
    out = subprocess.run([str(lint)], capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_verifiers_adapter_needs_nothing_from_the_loader() -> None:
    """review.md item 3: the loader decides and hands a verifiers environment to the adapter; the two share
    envs/arguments.py, so no import goes in a circle."""
    import ast
    from pathlib import Path

    import prime_lab.envs.verifiers_adapter as adapter

    tree = ast.parse(Path(adapter.__file__).read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert "prime_lab.envs.loader" not in imported, imported
