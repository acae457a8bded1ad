"""prime-lab: one import package over the repository's top-level folders.

`lab/`, `environments/`, `trainer/`, `gepa/` and `workbench/` install as `prime_lab.lab`, `prime_lab.environments`,
... (setuptools' `package-dir` in pyproject.toml), so none of them clashes with the PyPI packages of the same
names (the reference `gepa` that verifiers depends on, Coqui's `trainer`) or with a user's own `lab/` folder.
This folder sits under `src/` so that the repository root on `sys.path` (pytest, `python -c` there) cannot shadow
the installed package with it.
"""

__version__ = "0.1.0"
