"""The one `prime_lab` import package: every folder with an `__init__.py` is installed, under its mapped name."""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def setuptools_table() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_folder_is_listed_under_prime_lab() -> None:
    table = setuptools_table()
    mapped = {name: REPO / folder for name, folder in table["package-dir"].items()}
    on_disk: set[str] = set()
    for name, root in mapped.items():
        for init in root.rglob("__init__.py"):
            rel = init.parent.relative_to(root)
            on_disk.add(".".join([name, *rel.parts]))
    assert set(table["packages"]) == on_disk, (
        "pyproject.toml [tool.setuptools] packages must list every package folder: "
        f"missing {sorted(on_disk - set(table['packages']))}, stale {sorted(set(table['packages']) - on_disk)}")


def test_installed_modules_come_from_this_checkout() -> None:
    for name, folder in setuptools_table()["package-dir"].items():
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None, name
        assert Path(spec.origin).resolve().parent == (REPO / folder).resolve(), (name, spec.origin)


def test_bare_folder_names_are_not_ours() -> None:
    """`runs`, `gepa`, ... are not importable as ours: PyPI packages of those names keep them."""
    for bare in setuptools_table()["package-dir"]:
        bare = bare.removeprefix("prime_lab.")
        if bare == "prime_lab":
            continue
        spec = importlib.util.find_spec(bare)
        if spec is None or spec.origin is None:
            continue
        # The repository root is on sys.path under pytest; from there a bare folder may be found, but never the
        # installed package's copy, and never through the editable install's link tree.
        assert "__editable__" not in spec.origin, (bare, spec.origin)


def test_every_data_file_is_installed() -> None:
    """Files that are not Python (styles, the config template) are declared package data, so the editable link tree
    and the wheel carry them: each is found through the installed package."""
    table = setuptools_table()
    for name, folder in table["package-dir"].items():
        root = REPO / folder
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.submodule_search_locations
        installed = Path(list(spec.submodule_search_locations)[0])
        for path in root.rglob("*"):
            if path.is_file() and path.suffix not in (".py", ".pyc") and "__pycache__" not in path.parts:
                assert (installed / path.relative_to(root)).exists(), (
                    f"{path.relative_to(REPO)} is not installed: add it to [tool.setuptools.package-data]")


def test_the_example_environments_tests_run_with_what_the_setup_installs(tmp_path: Path) -> None:
    """`scripts/setup` (no --dev) installs prime-lab's own requirements: pytest is one of them, and the example
    environment's tests pass with the command its README gives."""
    import importlib.metadata
    import subprocess
    import sys

    from packaging.requirements import Requirement

    core = {Requirement(r).name for r in importlib.metadata.requires("prime-lab") or [] if "extra ==" not in r}
    assert "pytest" in core
    from tests.support.cli import prime

    assert prime("lab", "setup", "ws", "--plain", cwd=tmp_path).returncode == 0
    folder = tmp_path / "ws" / "environments" / "my-env"
    assert "python -m pytest tests" in (folder / "README.md").read_text()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=folder,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
