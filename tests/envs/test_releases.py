"""Environments at their own verifiers release, the pure logic: which releases an environment accepts (declared,
narrowed by what it imports), the release install picks, the driver's check and data shapes, the registry of
isolated environments, the loader's precedence and argument checks for them, and how `prime env list` says where
one runs. Nothing here reaches the network or creates a virtual environment: the registry's list of releases is the
one boundary replaced, and releases' wheels are small ones written into the test's PRIME_LAB_HOME.
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import sys
import textwrap
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version
from pydantic import BaseModel

from prime_lab.envs import driver, isolated, loader, releases, v1
from prime_lab.envs.arguments import EnvArg, EnvironmentLoadError
from prime_lab.envs.env_server import DRIVER, driver_command, group_request
from prime_lab.envs.install import InstallError, ReleaseChoice, choose_release
from prime_lab.envs.releases import ReleaseContents, VerifiersImport
from prime_lab.workbench.cli.env import runs_on

INSTALLED = importlib.metadata.version("verifiers")

RELEASES = [Version(v) for v in ("0.1.4", "0.1.7", "0.1.9", "0.3.0rc1", "0.1.12", "0.4.0", "0.1.9.post3", "0.2.0",
                                 "0.1.8", "0.1.10.dev3", "0.3.1", "0.1.11", "0.1.9.post1", "1.0.0")]


def versions(found: list[Version]) -> list[str]:
    return [str(v) for v in found]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def package(folder: Path, dependencies: list[str], files: dict[str, str] | None = None) -> Path:
    """An environment package folder: a pyproject.toml with `dependencies`, and `files` (path -> source)."""
    deps = ", ".join(json.dumps(d) for d in dependencies)
    write(folder / "pyproject.toml", f"""
        [project]
        name = "my-env"
        version = "0.1.0"
        dependencies = [{deps}]
        """)
    for name, source in (files or {}).items():
        write(folder / name, source)
    return folder


def wheel(path: Path, files: dict[str, str]) -> Path:
    """A wheel-shaped zip with `files` (archive name -> text)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, textwrap.dedent(text).lstrip("\n"))
    return path


def release_wheel(version: str, modules: dict[str, str]) -> Path:
    """verifiers `version`'s wheel as `release_contents` finds it already downloaded (module path -> source)."""
    files = {f"verifiers/{name}": source for name, source in modules.items()}
    files[f"verifiers-{version}.dist-info/METADATA"] = f"Name: verifiers\nVersion: {version}\n"
    return wheel(releases.releases_home() / "wheels" / f"verifiers-{version}-py3-none-any.whl", files)


@pytest.fixture(autouse=True)
def own_release_home(monkeypatch: pytest.MonkeyPatch) -> None:
    """Releases' folders under this test's PRIME_LAB_HOME, whatever the caller's environment says; pip (the
    registry, virtual environments) is out of reach."""
    monkeypatch.delenv("PRIME_LAB_VERIFIERS_HOME", raising=False)

    def no_pip(*args: str, **_: Any) -> None:
        raise AssertionError(f"pip {' '.join(args)} was run")

    monkeypatch.setattr(releases, "_pip", no_pip)


@pytest.fixture
def registry_lists(monkeypatch: pytest.MonkeyPatch) -> list[Version]:
    """The package registry's list of releases, without asking it (the only network call choose_release makes)."""
    listed = list(RELEASES)
    monkeypatch.setattr(releases, "available_releases", lambda: sorted(listed, reverse=True))
    return listed


@pytest.fixture
def modules_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on sys.path for modules a test writes; what they leave in sys.modules is dropped afterwards."""
    folder = tmp_path / "modules"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    before = set(sys.modules)
    yield folder
    for name in set(sys.modules) - before:
        if name.startswith("releases_test_"):
            del sys.modules[name]


# Which releases exist, and which ones an environment accepts ---------------------------------------------------

def test_drivable_is_the_classic_api_range_without_pre_releases() -> None:
    """0.1.5 up to (not including) 0.4; post-releases count, pre- and dev releases do not."""
    assert releases.drivable(Version("0.1.5")) and releases.drivable(Version("0.3.99"))
    assert releases.drivable(Version("0.1.9.post3")) and releases.drivable(Version("0.1.7.post0"))
    assert not releases.drivable(Version("0.1.4")) and not releases.drivable(Version("0.4.0"))
    assert not releases.drivable(Version("0.4")) and not releases.drivable(Version("1.0"))
    assert not releases.drivable(Version("0.3.0rc1")) and not releases.drivable(Version("0.1.10.dev3"))


def test_candidates_are_drivable_newest_first_with_one_post_release_each() -> None:
    """Any release: the drivable ones, newest first; 0.1.9.post3 stands for 0.1.9 and its other post-releases."""
    assert versions(releases.candidates("", RELEASES)) == ["0.3.1", "0.2.0", "0.1.12", "0.1.11", "0.1.9.post3",
                                                           "0.1.8", "0.1.7"]
    assert releases.candidates(">=0.1.5", RELEASES) == releases.candidates("", RELEASES)
    assert releases.candidates("", reversed(RELEASES)) == releases.candidates("", RELEASES)  # any order in


def test_candidates_honour_the_declared_specifier() -> None:
    """`==`, a `.dev0` lower bound (which still takes final releases), `~=`, and one that no drivable release
    meets."""
    assert versions(releases.candidates("==0.1.12", RELEASES)) == ["0.1.12"]
    assert versions(releases.candidates(">=0.1.11.dev0", RELEASES)) == ["0.3.1", "0.2.0", "0.1.12", "0.1.11"]
    assert versions(releases.candidates(">=0.1.9,<0.2", RELEASES)) == ["0.1.12", "0.1.11", "0.1.9.post3"]
    assert versions(releases.candidates("~=0.1.9", RELEASES)) == ["0.1.12", "0.1.11", "0.1.9.post3"]
    assert versions(releases.candidates("==0.1.9", RELEASES)) == ["0.1.9"]  # == does not take post-releases
    assert versions(releases.candidates("==0.1.9.post1", RELEASES)) == ["0.1.9.post1"]
    assert releases.candidates(">=0.4", RELEASES) == [] and releases.candidates("<0.1.5", RELEASES) == []


def test_check_specifier_refuses_what_is_not_one() -> None:
    assert releases.check_specifier(">=0.1.8,<0.2") == ">=0.1.8,<0.2"
    with pytest.raises(releases.ReleaseError, match="'0.1.8' is not a version specifier"):
        releases.check_specifier("0.1.8")


def test_requirement_specifier_finds_verifiers_among_requirements() -> None:
    """Its specifier ('' for a bare `verifiers`), whatever the spelling; None without a verifiers requirement;
    unparseable lines are skipped."""
    assert releases.requirement_specifier(["numpy", "not a requirement !!", "verifiers>=0.1.8"]) == ">=0.1.8"
    assert releases.requirement_specifier(["Verifiers==0.1.12"]) == "==0.1.12"
    assert releases.requirement_specifier(["verifiers"]) == ""
    assert releases.requirement_specifier(["verifiers (>=0.1.9)"]) == ">=0.1.9"
    assert releases.requirement_specifier(["numpy", "verifiers-extra>=1"]) is None
    assert releases.requirement_specifier([]) is None


def test_declared_specifier_of_a_package_folder(tmp_path: Path) -> None:
    """pyproject.toml's [project] dependencies; None without verifiers among them, without a pyproject, or with a
    broken one."""
    assert releases.declared_specifier(package(tmp_path / "a", ["numpy", "verifiers>=0.1.8,<0.2"])) == "<0.2,>=0.1.8"
    assert releases.declared_specifier(package(tmp_path / "b", ["verifiers"])) == ""
    assert releases.declared_specifier(package(tmp_path / "c", ["numpy"])) is None
    (tmp_path / "d").mkdir()
    assert releases.declared_specifier(tmp_path / "d") is None
    write(tmp_path / "e" / "pyproject.toml", "[project\nname = 'broken'\n")
    assert releases.declared_specifier(tmp_path / "e") is None


def test_declared_specifier_of_a_wheel(tmp_path: Path) -> None:
    """The wheel's METADATA Requires-Dist lines (markers cut off); None when none of them is verifiers; a file that
    is neither a folder nor a wheel declares nothing."""
    with_verifiers = wheel(tmp_path / "my_env-0.1.0-py3-none-any.whl", {
        "my_env.py": "import verifiers as vf\n",
        "my_env-0.1.0.dist-info/METADATA": """
            Metadata-Version: 2.1
            Name: my-env
            Version: 0.1.0
            Requires-Dist: numpy>=1
            Requires-Dist: verifiers>=0.1.8; python_version >= "3.10"
            """,
    })
    assert releases.declared_specifier(with_verifiers) == ">=0.1.8"
    without = wheel(tmp_path / "other-0.1.0-py3-none-any.whl", {
        "other-0.1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: other\nRequires-Dist: numpy\n"})
    assert releases.declared_specifier(without) is None
    assert releases.declared_specifier(write(tmp_path / "notes.txt", "verifiers>=0.1.8\n")) is None


# What an environment imports from verifiers, and whether a release has it ---------------------------------------

IMPORTING = """
    import os
    import verifiers as vf
    import verifiers.utils.data_utils
    from verifiers.utils.token_utils import get_prompt_ids, prepare_sampling_args
    from verifiers import SingleTurnEnv as Single
    from verifiers.rubrics import *
    from . import helpers
    from .verifiers import local
    import verifiers_extra.thing
    from verifiers_extra import other


    def load_environment():
        from verifiers.envs.tool_env import ToolEnv
        return ToolEnv
    """


def test_verifiers_imports_of_a_folder(tmp_path: Path) -> None:
    """Dotted `import verifiers.X` and every absolute `from verifiers[.X] import ...` (in functions too), with the
    file and line; not `import verifiers`, relative imports, other packages, nor tests, virtual environments,
    builds or files that do not parse."""
    folder = package(tmp_path / "pkg", ["verifiers>=0.1.8"], {
        "my_env/game.py": IMPORTING,
        "my_env/__init__.py": "from verifiers import Parser\n",
        "tests/test_game.py": "from verifiers.testing import nothing\n",
        ".venv/lib/site.py": "import verifiers.in_venv\n",
        "build/lib/my_env/game.py": "import verifiers.in_build\n",
        "broken.py": "from verifiers import Broken\ndef (:\n",
    })
    found = releases.verifiers_imports(folder)
    assert found == [
        VerifiersImport("verifiers", ("Parser",), "my_env/__init__.py:1"),
        VerifiersImport("verifiers.utils.data_utils", (), "my_env/game.py:3"),
        VerifiersImport("verifiers.utils.token_utils", ("get_prompt_ids", "prepare_sampling_args"),
                        "my_env/game.py:4"),
        VerifiersImport("verifiers", ("SingleTurnEnv",), "my_env/game.py:5"),
        VerifiersImport("verifiers.rubrics", (), "my_env/game.py:6"),
        VerifiersImport("verifiers.envs.tool_env", ("ToolEnv",), "my_env/game.py:14"),
    ]
    assert found[2].words() == "from verifiers.utils.token_utils import get_prompt_ids, prepare_sampling_args"
    assert found[1].words() == "import verifiers.utils.data_utils"


def test_verifiers_imports_of_a_wheel(tmp_path: Path) -> None:
    """A wheel's Python files are read from the archive."""
    built = wheel(tmp_path / "my_env-0.1.0-py3-none-any.whl", {
        "my_env/__init__.py": "from verifiers.utils.token_utils import get_prompt_ids\n",
        "my_env-0.1.0.dist-info/METADATA": "Name: my-env\nRequires-Dist: verifiers\n",
    })
    assert releases.verifiers_imports(built) == [
        VerifiersImport("verifiers.utils.token_utils", ("get_prompt_ids",), "my_env/__init__.py:1")]


def test_module_names_of_a_release_wheel() -> None:
    """Files of the `verifiers` package become module names; packages by their __init__; everything else None."""
    assert releases._module_name("verifiers/__init__.py") == "verifiers"
    assert releases._module_name("verifiers/utils/__init__.py") == "verifiers.utils"
    assert releases._module_name("verifiers/utils/token_utils.py") == "verifiers.utils.token_utils"
    assert releases._module_name("verifiers-0.1.12.dist-info/METADATA") is None
    assert releases._module_name("verifiers/py.typed") is None
    assert releases._module_name("other/verifiers/x.py") is None


CONTENTS = ReleaseContents("0.1.12", {
    "verifiers": "from .envs.singleturn_env import SingleTurnEnv\n__all__ = ['SingleTurnEnv']\n",
    "verifiers.utils": "",
    "verifiers.utils.token_utils": "def get_prompt_ids(state):\n    return []\n",
})


@pytest.mark.parametrize(("wanted", "lacking"), [
    (VerifiersImport("verifiers.utils.token_utils", ("get_prompt_ids",), "game.py:3"), None),
    (VerifiersImport("verifiers.utils", ("token_utils",), "game.py:3"), None),  # a submodule, by name
    (VerifiersImport("verifiers.utils.token_utils", (), "game.py:3"), None),
    (VerifiersImport("verifiers", ("SingleTurnEnv",), "game.py:3"), None),
    (VerifiersImport("verifiers.serve", ("ZMQEnvServer",), "game.py:3"), "no module verifiers.serve"),
    (VerifiersImport("verifiers.utils.token_utils", ("get_prompt_ids", "tokenize_vllm"), "game.py:3"),
     "no tokenize_vllm in verifiers.utils.token_utils"),
    (VerifiersImport("verifiers", ("Env",), "game.py:3"), "no Env in verifiers"),  # whole words only
])
def test_release_contents_say_what_a_release_lacks(wanted: VerifiersImport, lacking: str | None) -> None:
    assert CONTENTS.lacks(wanted) == lacking


STARS = ReleaseContents("0.1.12", {
    "verifiers": "from .types import *\nfrom verifiers.utils import *\n",
    "verifiers.types": "Messages = list[dict]\n",
    "verifiers.utils": "from ..errors import *\n",
    "verifiers.utils.x": "",
    "verifiers.errors": "class Error(Exception): ...\n",
})


@pytest.mark.parametrize(("names", "lacking"), [
    (("Messages",), None),  # from .types import *
    (("Error",), None),  # from verifiers.utils import *, and there from ..errors import *
    (("State",), "no State in verifiers"),
])
def test_release_contents_follow_star_imports(names: tuple[str, ...], lacking: str | None) -> None:
    """`from verifiers import Messages` where verifiers star-exports it: the release has it."""
    assert STARS.lacks(VerifiersImport("verifiers", names, "env.py:1")) == lacking


def test_release_contents_are_read_from_a_downloaded_wheel() -> None:
    """A wheel already in `releases_home()/wheels` is read, not downloaded again."""
    release_wheel("0.1.12", {"__init__.py": "X = 1\n", "utils/__init__.py": "", "utils/token_utils.py": "Y = 2\n"})
    contents = releases.release_contents(Version("0.1.12"))
    assert contents.version == "0.1.12"
    assert contents.sources == {"verifiers": "X = 1\n", "verifiers.utils": "",
                                "verifiers.utils.token_utils": "Y = 2\n"}


def test_a_release_environment_lives_under_the_releases_home(lab_home: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """`$PRIME_LAB_HOME/verifiers/<release>` (or `$PRIME_LAB_VERIFIERS_HOME/<release>`); ready only once its
    interpreter and the ready mark are there."""
    env = releases.ReleaseEnv("0.1.12")
    assert env.folder == lab_home / "verifiers" / "0.1.12" and env.python == env.folder / "bin" / "python"
    assert not env.ready()
    write(env.python, "")
    assert not env.ready()  # half-built: no mark yet
    write(env.folder / releases.READY, "0.1.12\n")
    assert env.ready()
    monkeypatch.setenv("PRIME_LAB_VERIFIERS_HOME", str(tmp_path / "elsewhere"))
    assert releases.ReleaseEnv("0.1.12").folder == tmp_path / "elsewhere" / "0.1.12"


# The release install picks ---------------------------------------------------------------------------------------

def test_a_requested_release_is_taken_as_asked(tmp_path: Path) -> None:
    """--verifiers 0.1.9.post3: that release, whatever the package declares (no registry needed)."""
    target = package(tmp_path / "pkg", ["verifiers>=0.1.8"])
    choice = choose_release(target, requested="0.1.9.post3")
    assert choice.release == "0.1.9.post3" and choice.candidates == ("0.1.9.post3",)
    assert choice.reason == "verifiers 0.1.9.post3, asked for with --verifiers" and choice.ruled_out == ()


def test_requesting_the_release_beside_prime_lab_installs_beside_it_unless_isolated(tmp_path: Path) -> None:
    if not releases.drivable(Version(INSTALLED)):
        pytest.skip(f"verifiers {INSTALLED} beside prime-lab is not drivable")
    target = package(tmp_path / "pkg", ["verifiers"])
    beside = choose_release(target, requested=INSTALLED)
    assert beside.release is None and beside.candidates == ()
    assert beside.reason == f"verifiers {INSTALLED}, asked for, is the one installed here"
    own = choose_release(target, requested=INSTALLED, isolate=True)
    assert own.release == INSTALLED and own.candidates == (INSTALLED,)


@pytest.mark.parametrize("requested", ["0.1.4", "0.4.0", "0.3.0rc1"])
def test_a_requested_release_that_cannot_be_driven_is_refused(tmp_path: Path, requested: str) -> None:
    with pytest.raises(InstallError, match=rf"verifiers {requested} cannot be driven: .* releases 0\.1\.5 to "
                                           r"before 0\.4"):
        choose_release(package(tmp_path / "pkg", ["verifiers"]), requested=requested)


def test_a_requested_release_that_is_not_a_version_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InstallError, match="--verifiers nonsense: not a release"):
        choose_release(package(tmp_path / "pkg", ["verifiers"]), requested="nonsense")


def test_a_package_without_verifiers_goes_beside_prime_lab(tmp_path: Path) -> None:
    """Nothing declared, nothing asked: beside prime-lab, without asking the registry."""
    choice = choose_release(package(tmp_path / "pkg", ["numpy"]))
    assert choice.release is None and choice.reason == "it does not depend on verifiers"


V1_TASKSET = {  # the shape `vf-init` 0.4 writes: a Taskset subclass exported from the package, no load_environment
    "reverse/__init__.py": """
        from reverse.taskset import ReverseTaskset

        __all__ = ["ReverseTaskset"]
        """,
    "reverse/taskset.py": """
        import verifiers.v1 as vf


        class ReverseTask(vf.Task[vf.TaskData]):
            @vf.reward(weight=1.0)
            async def exact(self, trace: vf.Trace) -> float:
                return 1.0


        class ReverseTaskset(vf.Taskset[ReverseTask, vf.TasksetConfig]):
            def load(self) -> list[ReverseTask]:
                return []
        """,
}


def test_a_v1_taskset_goes_to_the_tested_v1_release_without_asking_the_registry(tmp_path: Path) -> None:
    """verifiers 0.4's tasksets (envs/v1.py): recognised from the source before the registry or pip is asked (an
    install of one tried 0.3.1's environment for 80 s and then blamed the release), and placed at the tested v1
    release, or the one asked for within the v1 range; a classic release asked for is refused in one line."""
    target = package(tmp_path / "pkg", ["verifiers"], V1_TASKSET)
    choice = choose_release(target)
    assert choice.release == releases.V1_RELEASE and choice.candidates == (releases.V1_RELEASE,)
    assert choice.reason == ("a verifiers v1 taskset (class ReverseTaskset(verifiers.v1.Taskset) at "
                             "reverse/taskset.py:10): verifiers 0.4.0, the v1 release prime-lab is tested with")
    assert choose_release(target, requested="0.4.1").release == "0.4.1"
    declared = package(tmp_path / "declared", ["verifiers>=0.4.1,<0.5"], V1_TASKSET)
    assert choose_release(declared).reason.endswith("(outside what it declares, verifiers<0.5,>=0.4.1)")
    for requested, words in (("0.3.1", "it runs at verifiers<0.5,>=0.4 (e.g. 0.4.0), not 0.3.1"),
                             ("0.5.0", "not 0.5.0"), ("nope", "--verifiers nope: not a release")):
        with pytest.raises(InstallError) as refused:
            choose_release(target, requested=requested)
        assert words in str(refused.value) and "\n" not in str(refused.value)
    assert releases.v1_release("0.4.0") and releases.v1_release("0.4.9") and not releases.v1_release("0.4.1.dev86")
    assert not releases.v1_release("0.3.1") and not releases.v1_release("0.5") and not releases.v1_release("x")
    # only an import of verifiers.v1 (its Taskset imported by name and subclassed in another file: still a mark)
    target = package(tmp_path / "imports", ["verifiers"], {"t/__init__.py": "from verifiers import v1\n"})
    assert v1.taskset_marks(target) == ["from verifiers import v1 at t/__init__.py:1"]
    by_name = package(tmp_path / "by-name", ["verifiers"], {"t/__init__.py": """
        from verifiers.v1 import Taskset as Base

        class Mine(Base):
            pass
        """})
    assert v1.taskset_marks(by_name) == ["class Mine(verifiers.v1.Taskset) at t/__init__.py:3"]


def test_a_classic_environment_that_uses_verifiers_v1_stays_classic(tmp_path: Path) -> None:
    """Releases 0.1.14 - 0.3.x carry both APIs: a package with load_environment is classic whatever else it uses."""
    classic = package(tmp_path / "pkg", ["verifiers"], {**V1_TASKSET, "reverse/env.py": """
        import verifiers as vf

        def load_environment(**kwargs):
            return vf.SingleTurnEnv(dataset=[])
        """})
    assert v1.taskset_marks(classic) == []
    assert v1.taskset_marks(package(tmp_path / "plain", ["verifiers"], {"p.py": GAME})) == []


GAME = """
    import verifiers as vf
    from verifiers.utils.turn_utils import score_turn
    """  # a module and a name no real release has: the installed release never has them either


def test_imports_narrow_the_declared_releases(tmp_path: Path, registry_lists: list[Version]) -> None:
    """Releases without the imported module or name are ruled out, each with why and where; the newest that has
    everything wins, the next ones stay as fallbacks."""
    release_wheel("0.3.1", {"__init__.py": "", "utils/__init__.py": ""})
    release_wheel("0.2.0", {"__init__.py": "", "utils/__init__.py": "", "utils/turn_utils.py": "def other(): ...\n"})
    for version in ("0.1.12", "0.1.11"):
        release_wheel(version, {"__init__.py": "", "utils/__init__.py": "",
                                "utils/turn_utils.py": "def score_turn(state): ...\n"})
    target = package(tmp_path / "pkg", ["verifiers>=0.1.11"], {"game.py": GAME})
    choice = choose_release(target)
    assert choice.release == "0.1.12" and choice.candidates == ("0.1.12", "0.1.11")
    assert choice.reason == ("the newest release that satisfies verifiers>=0.1.11 (declared) and has what it "
                             "imports")
    assert choice.ruled_out == (
        ("0.3.1", "no module verifiers.utils.turn_utils (imported at game.py:2)"),
        ("0.2.0", "no score_turn in verifiers.utils.turn_utils (imported at game.py:2)"),
    )
    assert choice.ruled_out_words() == ["0.3.1: no module verifiers.utils.turn_utils (imported at game.py:2)",
                                        "0.2.0: no score_turn in verifiers.utils.turn_utils (imported at game.py:2)"]


RUBRIC_ENV = """
    import verifiers as vf


    def load_environment(**kwargs):
        rubric = vf.Rubric(parser=vf.Parser(), reward_funcs=[len])
        return vf.SingleTurnEnv(eval_dataset=[], rubric=rubric, **kwargs)
    """  # gpu_puzzles' call: only releases whose Rubric takes **kwargs keep `reward_funcs` (as an attribute)

NEW_RUBRIC = {"__init__.py": "from .rubrics.rubric import Rubric\nfrom .parsers.parser import Parser\n"
                             "from .envs.singleturn_env import SingleTurnEnv\n",
              "parsers/parser.py": "class Parser:\n    pass\n",
              "rubrics/rubric.py": "class Rubric:\n    def __init__(self, funcs=None, weights=None, parser=None):\n"
                                   "        self.funcs = funcs\n",
              "envs/environment.py": "class Environment(ABC):\n    def __init__(self, dataset=None, eval_dataset=None, "
                                     "rubric=None, **kwargs):\n        pass\n",
              "envs/singleturn_env.py": "import verifiers as vf\n\n\nclass SingleTurnEnv(vf.Environment):\n    pass\n"}
OLD_RUBRIC = {**NEW_RUBRIC, "rubrics/rubric.py": "class Rubric:\n    def __init__(self, funcs=None, weights=None, "
                                                 "parser=None, parallelize_scoring=True, **kwargs):\n        pass\n"}


def test_a_keyword_a_release_s_class_does_not_take_rules_the_release_out(tmp_path: Path,
                                                                          registry_lists: list[Version]) -> None:
    """`vf.Rubric(parser=..., reward_funcs=[...])` (gpu_puzzles): from 0.1.8 on Rubric(funcs, weights, parser)
    refuses the keyword, so those releases are ruled out, in the words a missing name gets, with where it is called;
    0.1.7's Rubric takes **kwargs and is chosen. The installed release (0.3.1's Rubric takes no such keyword either)
    is not used beside prime-lab."""
    for version in ("0.1.12", "0.1.11", "0.1.9.post3", "0.1.8"):
        release_wheel(version, NEW_RUBRIC)
    release_wheel("0.1.7", OLD_RUBRIC)
    target = package(tmp_path / "pkg", ["verifiers>=0.1.3,<0.2"], {"env.py": RUBRIC_ENV})
    choice = choose_release(target)
    assert choice.release == "0.1.7" and choice.candidates == ("0.1.7",)
    assert choice.ruled_out_words() == ["0.1.12, 0.1.11, 0.1.9.post3, 0.1.8: no keyword reward_funcs in "
                                        "verifiers.Rubric (called at env.py:5)"]


def test_a_call_s_keywords_are_read_through_the_release_s_classes(tmp_path: Path) -> None:
    """A class's own __init__ decides (**kwargs takes any keyword); without one its bases' in the release; a class
    whose __init__ cannot be read (a base from another package, a decorator) and a name that is no class of the
    release (a function) rule nothing out; a keyword passed on with ** is none; names bound by `from verifiers...
    import` are followed too."""
    contents = ReleaseContents("0.1.8", {
        "verifiers": "from .a import *\n",
        "verifiers.a": textwrap.dedent("""
            class Base:
                def __init__(self, x=None, *, y=None):
                    pass
            class Child(Base):
                pass
            class Orphan:
                pass
            class Model(BaseModel):
                pass
            @dataclass
            class Record:
                pass
            def helper(z=None):
                pass
            """),
    })
    source = """
        import verifiers as vf
        from verifiers.a import Child as C


        def load_environment(**kwargs):
            vf.Base(x=1, y=2)
            vf.Base(w=1, **kwargs)
            C(y=1, w=2)
            vf.Orphan(q=1)
            vf.Model(q=1)
            vf.Record(q=1)
            vf.helper(q=1)
            print(sep="")
        """
    calls = releases.verifiers_calls(write(tmp_path / "pkg" / "env.py", source).parent)
    assert [(c.words(), c.at) for c in calls] == [
        ("verifiers.Base(x=..., y=...)", "called at env.py:6"), ("verifiers.Base(w=...)", "called at env.py:7"),
        ("verifiers.a.Child(y=..., w=...)", "called at env.py:8"), ("verifiers.Orphan(q=...)", "called at env.py:9"),
        ("verifiers.Model(q=...)", "called at env.py:10"), ("verifiers.Record(q=...)", "called at env.py:11"),
        ("verifiers.helper(q=...)", "called at env.py:12")]
    assert [contents.lacks(c) for c in calls] == [
        None, "no keyword w in verifiers.Base", "no keyword w in verifiers.a.Child", "no keyword q in verifiers.Orphan",
        None, None, None]


def test_at_most_three_releases_are_kept_to_try(tmp_path: Path, registry_lists: list[Version]) -> None:
    """Declared loosely, importing only `verifiers`: the newest drivable releases, no wheel read."""
    choice = choose_release(package(tmp_path / "pkg", ["verifiers>=0.1.8,<0.3"], {"game.py": "import verifiers\n"}))
    assert choice.release == "0.2.0" and choice.candidates == ("0.2.0", "0.1.12", "0.1.11")
    assert choice.reason == "the newest release that satisfies verifiers<0.3,>=0.1.8 (declared)"
    assert not (releases.releases_home() / "wheels").exists()


def test_the_release_beside_prime_lab_is_used_without_asking_the_registry(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Declared loosely and importing nothing it lacks: beside prime-lab, decided from the installed release's own
    files; --isolate: its own environment at the newest release (the registry asked then)."""
    if not releases.drivable(Version(INSTALLED)):
        pytest.skip(f"verifiers {INSTALLED} beside prime-lab is not drivable")

    def no_registry() -> list[Version]:
        raise AssertionError("the registry was asked")

    monkeypatch.setattr(releases, "available_releases", no_registry)
    target = package(tmp_path / "pkg", ["verifiers>=0.1.8"], {"env.py": "import verifiers as vf\n"})
    beside = choose_release(target)
    assert beside.release is None and beside.candidates == ()
    assert beside.reason == f"verifiers {INSTALLED} (installed here) satisfies verifiers>=0.1.8 and has what it " \
                            "imports"
    monkeypatch.setattr(releases, "available_releases", lambda: sorted([Version(INSTALLED), *RELEASES], reverse=True))
    own = choose_release(target, isolate=True)
    assert own.release == str(releases.candidates("", [Version(INSTALLED), *RELEASES])[0]) and own.ruled_out == ()


def test_the_installed_release_is_read_from_its_files() -> None:
    """The modules of the verifiers beside prime-lab, by name, without importing it."""
    contents = releases.installed_contents()
    assert contents is not None and contents.version == INSTALLED
    assert "verifiers" in contents.sources and all(m.startswith("verifiers") for m in contents.sources)


def test_a_package_every_release_of_which_lacks_an_import_is_refused(tmp_path: Path,
                                                                     registry_lists: list[Version]) -> None:
    """The message names each release ruled out, grouped by what it lacks."""
    for version in ("0.1.12", "0.1.11"):
        release_wheel(version, {"__init__.py": ""})
    target = package(tmp_path / "pkg", ["verifiers>=0.1.11,<0.2"], {"game.py": GAME})
    with pytest.raises(InstallError) as raised:
        choose_release(target)
    assert "every release it accepts lacks something it imports: 0.1.12, 0.1.11: no module " \
           "verifiers.utils.turn_utils (imported at game.py:2)." in str(raised.value)


def test_a_declaration_no_drivable_release_meets_is_refused(tmp_path: Path, registry_lists: list[Version]) -> None:
    with pytest.raises(InstallError, match=r"declares verifiers>=0\.4, and no release it accepts can be driven"):
        choose_release(package(tmp_path / "pkg", ["verifiers>=0.4"]))


LEGACY = Path(importlib.metadata.distribution("verifiers").locate_file("verifiers/legacy"))


@pytest.mark.skipif(not LEGACY.is_dir(), reason="the verifiers beside prime-lab keeps its classic API at top level")
@pytest.mark.parametrize("source", ["from verifiers import SingleTurnEnv",
                                    "from verifiers.envs.singleturn_env import SingleTurnEnv",
                                    "from verifiers.utils.data_utils import extract_boxed_answer"])
def test_the_installed_release_has_its_aliased_classic_api(source: str, tmp_path: Path) -> None:
    wanted = releases.verifiers_imports(write(tmp_path / "pkg" / "env.py", source + "\n").parent)
    contents = releases.installed_contents()
    assert contents is not None and [contents.lacks(w) for w in wanted] == [None]


def test_ruled_out_words_group_releases_by_reason() -> None:
    choice = ReleaseChoice("0.1.12", ("0.1.12",), "why", (
        ("0.3.1", "no module verifiers.a (imported at game.py:3)"),
        ("0.2.0", "no X in verifiers (imported at env.py:1)"),
        ("0.3.0", "no module verifiers.a (imported at game.py:3)"),
    ))
    assert choice.ruled_out_words() == ["0.3.1, 0.3.0: no module verifiers.a (imported at game.py:3)",
                                        "0.2.0: no X in verifiers (imported at env.py:1)"]
    assert ReleaseChoice(None, (), "beside").ruled_out_words() == []


# The driver --------------------------------------------------------------------------------------------------------

class Inner(BaseModel):
    pair: tuple[int, str]
    score: float


class Outer(BaseModel):
    name: str
    inner: Inner
    items: list[Inner]


class Scalar:
    def __init__(self, value: Any) -> None:
        self.value = value

    def item(self) -> Any:
        return self.value


class BrokenScalar:
    def item(self) -> Any:
        raise ValueError("no single value")

    def __str__(self) -> str:
        return "broken-scalar"


def test_jsonable_makes_plain_data() -> None:
    """Pydantic models dumped (nested too), tuples as lists, keys as text, exceptions as `Type: message`, scalars
    through item(), everything else as text; the result survives json."""
    numpy = pytest.importorskip("numpy")
    model = Outer(name="a", inner=Inner(pair=(1, "x"), score=0.5), items=[Inner(pair=(2, "y"), score=1.0)])
    value = {"model": model, 3: (1, (2, None)), "error": ValueError("bad input"), "np": numpy.int64(7),
             "np_bool": numpy.bool_(True), "scalar": Scalar(Scalar(2.5)), "broken": BrokenScalar(),
             "path": Path("/tmp/x"), "flags": [True, False]}
    out = driver.jsonable(value)
    assert out == {
        "model": {"name": "a", "inner": {"pair": [1, "x"], "score": 0.5}, "items": [{"pair": [2, "y"], "score": 1.0}]},
        "3": [1, [2, None]], "error": "ValueError: bad input", "np": 7, "np_bool": True, "scalar": 2.5,
        "broken": "broken-scalar", "path": "/tmp/x", "flags": [True, False],
    }
    assert type(out["np"]) is int and json.loads(json.dumps(out)) == out


def test_state_output_keeps_the_rollout_output_keys_and_the_asked_columns() -> None:
    """A 0.1.8/0.1.9 state as verifiers' RolloutOutput: its keys (None where the state has none) and the requested
    state columns, nothing else."""
    numpy = pytest.importorskip("numpy")
    state = {"example_id": 4, "prompt": [{"role": "user", "content": "hi"}],
             "completion": [{"role": "assistant", "content": "yo"}], "answer": "yo", "task": "t", "info": {},
             "reward": numpy.float32(0.5), "metrics": {"exact": 1.0}, "timing": {"total_ms": 3.0},
             "trajectory": [{"tokens": (1, 2)}], "responses": ["not asked for"], "turn": 1}
    out = driver.state_output(state, ["trajectory"])
    assert set(out) == {"example_id", "prompt", "completion", "answer", "task", "info", "reward", "metrics",
                        "is_truncated", "stop_condition", "timing", "error", "trajectory"}
    assert out["reward"] == 0.5 and out["trajectory"] == [{"tokens": [1, 2]}] and out["example_id"] == 4
    assert out["is_truncated"] is None and out["error"] is None and out["stop_condition"] is None
    json.dumps(out)


GOOD_ENV = '''
    """Counts letters in words.

    A second paragraph that is not the summary."""


    def load_environment(num_examples: int = 3, name: str = "x", words: tuple = ("a", "b"), *, seed: int,
                         **kwargs):
        return None
    '''


def test_check_describes_an_environment_that_imports(modules_dir: Path) -> None:
    """ok, the release, the summary, the file, and load_environment's arguments (name, default, required,
    annotation; **kwargs left out), as JSON."""
    path = write(modules_dir / "releases_test_good_env.py", GOOD_ENV)
    result = driver.check("releases_test_good_env")
    assert result["ok"] is True and result["release"] == INSTALLED
    assert result["doc"] == "Counts letters in words." and result["file"] == str(path)
    assert result["args"] == [["num_examples", 3, False, "int"], ["name", "x", False, "str"],
                              ["words", ["a", "b"], False, "tuple"], ["seed", None, True, "int"]]
    json.dumps(result)


def test_check_says_what_a_failing_import_misses_and_where(modules_dir: Path) -> None:
    """A ModuleNotFoundError: an import error, the missing module, and the environment's own file:line."""
    write(modules_dir / "releases_test_bad_env.py", '''
        """Needs a module that is not installed."""
        import os
        import releases_test_no_such_module
        ''')
    result = driver.check("releases_test_bad_env")
    assert result["ok"] is False and result["import_error"] is True and result["release"] == INSTALLED
    assert result["missing"] == "releases_test_no_such_module"
    assert result["where"] == "releases_test_bad_env.py:3"
    assert result["error"] == "ModuleNotFoundError: No module named 'releases_test_no_such_module'"
    json.dumps(result)


def test_check_tells_other_failures_from_import_errors(modules_dir: Path) -> None:
    """An AttributeError at import counts as an import problem (a release without the name); a RuntimeError does
    not; a module without load_environment() is not an environment."""
    write(modules_dir / "releases_test_attr_env.py", "import os\nos.no_such_attribute\n")
    attr = driver.check("releases_test_attr_env")
    assert attr["ok"] is False and attr["import_error"] is True and attr["missing"] is None
    assert attr["where"] == "releases_test_attr_env.py:2"
    write(modules_dir / "releases_test_raising_env.py", "X = 1\nY = 2\nraise RuntimeError('no key')\n")
    raising = driver.check("releases_test_raising_env")
    assert raising["import_error"] is False and raising["error"] == "RuntimeError: no key"
    assert raising["where"] == "releases_test_raising_env.py:3"
    write(modules_dir / "releases_test_no_load_env.py", "X = 1\n")
    no_load = driver.check("releases_test_no_load_env")
    assert no_load["ok"] is False and no_load["import_error"] is False
    assert "has no load_environment() function" in no_load["error"]


def test_the_driver_runs_isolated_and_imports_nothing_of_prime_lab() -> None:
    """It runs by path with -I in another interpreter: its module-level imports are the standard library's, and
    prime_lab appears nowhere in it."""
    assert driver_command("/r/bin/python", "check", "my_env") == ["/r/bin/python", "-I", str(DRIVER), "check",
                                                                  "my_env"]
    assert DRIVER.is_file() and DRIVER.name == "driver.py"
    import ast

    tree = ast.parse(DRIVER.read_text(encoding="utf-8"))
    top = [a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names]
    top += [n.module for n in tree.body if isinstance(n, ast.ImportFrom) and n.module]
    assert top and all(name.split(".")[0] in sys.stdlib_module_names | {"__future__"} for name in top), top
    every = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    every += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [m for m in every if m.startswith("prime_lab")]


def test_group_request_is_verifiers_run_group_request() -> None:
    """The inputs (copied), the client config the server builds its own client from, model, sampling args, no
    retries, and the trajectory column."""
    inputs = [{"prompt": [{"role": "user", "content": "hi"}], "example_id": 0}]
    request = group_request(inputs, "http://127.0.0.1:8000/v1", "PRIME_LAB_MODEL_API_KEY", "m",
                            {"max_tokens": 8, "temperature": 1.0})
    assert request == {"request_type": "run_group", "group_inputs": inputs,
                       "client_config": {"api_base_url": "http://127.0.0.1:8000/v1",
                                         "api_key_var": "PRIME_LAB_MODEL_API_KEY"},
                       "model": "m", "sampling_args": {"max_tokens": 8, "temperature": 1.0}, "max_retries": 0,
                       "state_columns": ["trajectory"]}
    request["group_inputs"][0]["example_id"] = 9
    assert inputs[0]["example_id"] == 0


# The registry of isolated environments ----------------------------------------------------------------------------

def record(name: str = "name-with-dashes", module: str = "name_with_dashes", **changes: Any) -> isolated.IsolatedRecord:
    fields: dict[str, Any] = dict(
        name=name, module=module, distribution=name, version="0.2.0", release="0.1.12",
        python="/home/u/.prime-lab/verifiers/0.1.12/bin/python", target="/src/pkg",
        reason="verifiers 0.1.12: the newest release that satisfies verifiers>=0.1.8 (declared)",
        summary="Counts letters.", args=(("num_examples", 3, False, "int"), ("split", "test", False, "str"),
                                         ("seed", None, True, "int")))
    fields.update(changes)
    return isolated.IsolatedRecord(**fields)


def test_isolated_records_round_trip(lab_home: Path) -> None:
    """Saved under $PRIME_LAB_HOME/environments/isolated.json, found by any spelling of the id, removed by one."""
    assert isolated.records() == {} and isolated.record_for("owner/name-with-dashes") is None
    mine = record()
    isolated.save_record(mine)
    isolated.save_record(record("other-env", "other_env"))
    assert isolated.registry_path() == lab_home / "environments" / "isolated.json"
    assert set(isolated.records()) == {"name-with-dashes", "other-env"}
    for spelling in ("owner/name-with-dashes", "name_with_dashes", "name-with-dashes", "you/Name_With_Dashes"):
        assert isolated.record_for(spelling) == mine, spelling
    isolated.save_record(record(release="0.1.11"))  # saved again: replaced
    found = isolated.record_for("name-with-dashes")
    assert found is not None and found.release == "0.1.11"
    isolated.remove_record("Name_With_Dashes")
    assert isolated.record_for("owner/name-with-dashes") is None and set(isolated.records()) == {"other-env"}
    isolated.remove_record("never-installed")
    assert set(isolated.records()) == {"other-env"}


def test_a_broken_registry_reads_as_empty_and_bad_entries_are_skipped() -> None:
    isolated.registry_path().parent.mkdir(parents=True)
    isolated.registry_path().write_text("{not json")
    assert isolated.records() == {}
    isolated.registry_path().write_text(json.dumps({"environments": {
        "odd": {"name": "odd", "unexpected": 1}, "fine": json.loads(json.dumps(record("fine", "fine").__dict__))}}))
    assert set(isolated.records()) == {"fine"}


def test_described_rubric_and_parser_are_for_showing() -> None:
    """The rubric carries the names and weights (equal weights when they do not fit); scoring is elsewhere."""
    parser = isolated.DescribedParser("<answer>...</answer>")
    assert parser.format_hint() == "<answer>...</answer>" and parser.parse("x") is None
    assert parser.parse_answer([{"role": "assistant", "content": "x"}]) is None
    rubric = isolated.described_rubric({"names": ["exact", "format"], "weights": [1.0, 0.2]}, parser)
    assert [f.__name__ for f in rubric.funcs] == ["exact", "format"] and rubric.weights == [1.0, 0.2]
    assert rubric.parser is parser
    with pytest.raises(RuntimeError, match="exact runs in the environment's own interpreter"):
        rubric.funcs[0]()
    assert isolated.described_rubric({"names": ["a", "b"], "weights": [1.0]}, parser).weights == [1.0, 1.0]
    assert isolated.described_rubric({}, parser).funcs == []


# The loader -------------------------------------------------------------------------------------------------------

def test_an_isolated_environment_named_like_a_built_in_wins() -> None:
    """Without a record `reverse-text` is the built-in; with one, every spelling of it is the isolated one."""
    assert loader.resolve("primeintellect/reverse-text").source == loader.BUILTIN
    isolated.save_record(record("reverse-text", "releases_test_never_imported"))
    for spelling in ("reverse-text", "primeintellect/reverse-text", "reverse_text"):
        assert loader.resolve(spelling) == loader.Resolution("releases_test_never_imported", "load_environment",
                                                             loader.ISOLATED)


def test_describe_of_an_isolated_environment_imports_nothing() -> None:
    """The recorded summary, arguments, release and interpreter, under the id asked for."""
    isolated.save_record(record("reverse-text", "releases_test_never_imported"))
    info = loader.describe("primeintellect/reverse-text")
    assert info.id == "primeintellect/reverse-text" and info.source == loader.ISOLATED
    assert info.module == "releases_test_never_imported" and info.doc == "Counts letters."
    assert info.args == (EnvArg("num_examples", 3, False, "int"), EnvArg("split", "test", False, "str"),
                         EnvArg("seed", None, True, "int"))
    assert info.release == "0.1.12" and info.interpreter.endswith("/verifiers/0.1.12/bin/python")
    assert info.where() == "isolated: reverse-text 0.2.0"
    assert "releases_test_never_imported" not in sys.modules


def test_loading_an_isolated_environment_with_an_unknown_argument_names_the_valid_ones() -> None:
    isolated.save_record(record("reverse-text", "releases_test_never_imported"))
    with pytest.raises(EnvironmentLoadError) as raised:
        loader.load_environment("reverse-text", num_examples=2, bogus=1, other=2)
    assert str(raised.value) == ("environment 'reverse-text' does not take argument(s) bogus, other; its arguments "
                                 "are: num_examples=3, split='test', seed")


def test_known_arguments_reach_the_environment_s_own_interpreter() -> None:
    """Arguments it takes pass the check and go to its interpreter (here one that fails at once): the failure
    names the release, the interpreter and the call."""
    false = shutil.which("false")
    if false is None:
        pytest.skip("no `false` program")
    isolated.save_record(record("reverse-text", "releases_test_never_imported", python=false))
    with pytest.raises(EnvironmentLoadError) as raised:
        loader.load_environment("reverse-text", num_examples=2)
    message = str(raised.value)
    assert message.startswith(f"environment 'reverse-text' (isolated, verifiers 0.1.12, {false}): "
                              "load_environment(num_examples=2) failed in its own interpreter: the driver exited "
                              "with code 1")


def test_an_environment_taking_kwargs_accepts_other_arguments(modules_dir: Path) -> None:
    write(modules_dir / "releases_test_kwargs_env.py", "def load_environment(n: int = 3, **kwargs):\n    return None\n")
    checked = driver.check("releases_test_kwargs_env")
    false = shutil.which("false") or "/bin/false"
    isolated.save_record(record("kwargs-env", "releases_test_kwargs_env", python=false,
                                args=tuple(tuple(a) for a in checked["args"]), any_args=checked["any_args"]))
    with pytest.raises(EnvironmentLoadError, match="failed in its own interpreter"):
        loader.load_environment("kwargs-env", max_turns=4)


def test_an_isolated_environment_whose_interpreter_is_gone_says_so(tmp_path: Path) -> None:
    isolated.save_record(record("gone-env", "releases_test_never_imported", python=str(tmp_path / "no" / "python")))
    with pytest.raises(EnvironmentLoadError):
        loader.load_environment("gone-env")


# `prime env list`: where an environment runs -----------------------------------------------------------------------

def test_runs_on_says_which_release_and_interpreter(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """prime-lab's own protocol; the release beside prime-lab; a release's own environment, home as ~ (its whole
    interpreter with verbose)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    python = str(tmp_path / "home" / ".prime-lab" / "verifiers" / "0.1.12" / "bin" / "python")
    assert runs_on("", python) == "prime-lab"
    assert runs_on("0.3.1", sys.executable) == "verifiers 0.3.1"
    assert runs_on("0.3.1", "") == "verifiers 0.3.1"
    assert runs_on("0.1.12", python) == "verifiers 0.1.12 (own: ~/.prime-lab/verifiers/0.1.12)"
    assert runs_on("0.1.12", python, verbose=True) == f"verifiers 0.1.12 (own: {python})"
    assert runs_on("0.1.12", "/opt/verifiers/0.1.12/bin/python") == "verifiers 0.1.12 (own: /opt/verifiers/0.1.12)"


def test_runs_on_abbreviates_only_the_home_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "al"))
    python = str(tmp_path / "alice" / "verifiers" / "0.1.12" / "bin" / "python")
    assert runs_on("0.1.12", python) == f"verifiers 0.1.12 (own: {tmp_path / 'alice' / 'verifiers' / '0.1.12'})"
