"""prime-lab: one import package over the repository's top-level folders.

`runs/`, `problems/`, `envs/`, `models/`, `monitors/`, `inference/`, `evals/`, `workspace/`, `trainer/`, `gepa/`
and `workbench/` install as `prime_lab.runs`, `prime_lab.problems`, ... (setuptools' `package-dir` in
pyproject.toml), so none of them clashes with the PyPI packages of the same names (the reference `gepa` that
verifiers depends on, Coqui's `trainer`) or with a user's own `models/` or `runs/` folder. Each is one floor of the
import contracts (pyproject.toml, DESIGN.md "Layout").
This folder sits under `src/` so that the repository root on `sys.path` (pytest, `python -c` there) cannot shadow
the installed package with it.
"""

__version__ = "0.1.0"
