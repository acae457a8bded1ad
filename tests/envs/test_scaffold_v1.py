"""`prime env init --v1`'s package (envs/scaffold.py): a verifiers v1 taskset in verifiers 0.4's shape, without
verifiers 0.4 (tests/e2e/test_v1_tasksets.py installs and runs it at a real 0.4.0 release)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from packaging.specifiers import SpecifierSet

from prime_lab.envs.releases import declared_specifier
from prime_lab.envs.scaffold import ScaffoldError, package_contents, write_package
from prime_lab.envs.v1 import taskset_marks


def test_the_v1_package_is_a_taskset_prime_lab_recognises_at_verifiers_0_4(tmp_path: Path) -> None:
    package = write_package("you/Caps_Words", tmp_path, v1=True)
    folder = tmp_path / "caps-words"
    assert package.folder == folder and (package.name, package.module) == ("caps-words", "caps_words")
    assert sorted(str(p.relative_to(folder)) for p in package.files) == [
        "README.md", "caps_words/__init__.py", "caps_words/scoring.py", "caps_words/taskset.py", "pyproject.toml",
        "tests/test_caps_words.py"]
    for path in package.files:
        if path.suffix == ".py":
            ast.parse(path.read_text(), str(path))  # every module parses
    assert SpecifierSet(declared_specifier(folder) or "") == SpecifierSet(">=0.4,<0.5")
    pyproject = (folder / "pyproject.toml").read_text()
    assert 'build-backend = "hatchling.build"' in pyproject and 'packages = ["caps_words"]' in pyproject
    marks = taskset_marks(folder)
    assert marks == ["class CapsWordsTaskset(verifiers.v1.Taskset) at caps_words/taskset.py:37"], marks
    init = (folder / "caps_words" / "__init__.py").read_text()
    assert "from caps_words.taskset import CapsWordsTaskset" in init and '__all__ = ["CapsWordsTaskset"]' in init
    taskset = (folder / "caps_words" / "taskset.py").read_text()
    # the classic example's reward, weighted; its rows as tasks with their system prompt
    assert "@vf.reward(weight=1.0)\n    async def capitalized(self, trace: vf.Trace) -> float:" in taskset
    assert "system_prompt=SYSTEM_PROMPT" in taskset and "answer=word.upper()" in taskset


def test_the_v1_package_s_own_tests_pass_without_verifiers_0_4(tmp_path: Path) -> None:
    """The words and the reward are plain Python its test loads from the file: they pass here, where verifiers is
    not 0.4 (the taskset itself does not import here)."""
    package = write_package("caps-words", tmp_path, v1=True)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
                          cwd=package.folder, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 passed" in proc.stdout


def test_the_reward_is_the_classic_example_s() -> None:
    """scoring.score gives what the classic scaffold's reward gives for the same replies."""
    namespace: dict[str, Any] = {}
    exec(package_contents("caps-words", "caps_words", v1=True)["caps_words/scoring.py"], namespace)
    score = namespace["score"]
    assert callable(score)
    cases = {"<answer>APPLE</answer>": 1.0, "Sure: <answer>PEAR</answer> <answer>APPLE</answer>": 1.0,
             "APPLE": 0.5, "<answer> apple </answer>": 0.2, "no idea": 0.0}
    assert {reply: score(reply, "APPLE") for reply in cases} == cases
    assert namespace["WORDS"][0] == "apple" and "capital letters" in str(namespace["SYSTEM_PROMPT"])


def test_v1_and_the_classic_verifiers_api_together_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ScaffoldError, match="--v1 and --verifiers ask for two APIs"):
        write_package("caps-words", tmp_path, verifiers=True, v1=True)
    assert not (tmp_path / "caps-words").exists()
