"""A workspace as `prime lab setup` writes it and `prime lab doctor` checks it (workspace), without the CLI."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prime_lab.envs import load_environment
from prime_lab.envs.scaffold import ScaffoldError
from prime_lab.envs.v1 import taskset_marks
from prime_lab.runs.hub_probe import probed_reason
from prime_lab.runs.paths import runs_dir
from prime_lab.workbench.cli.lab import validate_config
from prime_lab.workspace.doctor import Finding, check_workspace, env_references, failed, fix_workspace
from prime_lab.workspace.layout import (
    CONFIG_KINDS,
    EXAMPLE_ENVIRONMENT,
    GITIGNORE_LINES,
    Change,
    config_templates,
    covers,
    missing_ignores,
    setup_workspace,
)
from prime_lab.workspace.machine import survey
from tests.support.hf_hub import loopback_hub

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO / "workspace" / "templates"


def files_of(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def problems(findings: list[Finding]) -> list[str]:
    return [f.format() for f in findings if f.status != "ok"]


def test_the_templates_are_the_repository_configs() -> None:
    """One source: the repository's configs/{rl,sft,gepa,eval}/, shipped as package data (workspace/templates/);
    a config added or edited there is copied into the package: this test prints the commands."""
    repo = {f"configs/{kind}/{rel}": data for kind in CONFIG_KINDS
            for rel, data in files_of(REPO / "configs" / kind).items()}
    shipped = files_of(TEMPLATES)
    copies = TEMPLATES.relative_to(REPO)
    commands = [f"mkdir -p {copies / Path(rel).parent} && cp {rel} {copies / rel}"
                for rel in sorted(repo) if shipped.get(rel) != repo[rel]]
    commands += [f"rm {copies / rel}" for rel in sorted(set(shipped) - set(repo))]
    assert not commands, "the workspace templates differ from configs/; run:\n" + "\n".join(commands)
    assert dict(config_templates()) == shipped  # what setup copies: the installed package's templates


def test_setup_in_an_empty_folder_writes_a_workspace_whose_configs_all_validate(tmp_path: Path) -> None:
    folder = tmp_path / "ws"
    result = setup_workspace(folder)
    assert result.changed and all(a.change is Change.CREATED for a in result.actions)
    for kind in CONFIG_KINDS:
        assert (folder / "configs" / kind).is_dir()
    evals = {p.stem for p in (folder / "configs" / "eval").glob("*.toml")}
    assert evals >= {"reverse-text", "alphabet-sort", "wordle", "gsm8k", "math-python"}
    assert (folder / "configs" / "rl" / "reverse-text.toml").is_file()
    assert (folder / "configs" / "gepa" / "reverse-text.toml").is_file()
    package = folder / "environments" / EXAMPLE_ENVIRONMENT
    assert {p.name for p in package.iterdir()} >= {"pyproject.toml", "my_env.py", "README.md", "tests"}
    assert "from prime_lab.envs import" in (package / "my_env.py").read_text()
    gitignore = (folder / ".gitignore").read_text().splitlines()
    assert {".env", "/outputs/", "__pycache__/", "*.egg-info/"} <= set(gitignore)

    configs = sorted((folder / "configs").rglob("*.toml"))
    assert len(configs) == sum(1 for rel, _ in config_templates() if rel.endswith(".toml"))
    for path in configs:
        kind, validation = validate_config(path)
        assert kind == path.parent.name
        assert validation.ok, [p.format() for p in validation.problems]
        assert validation.data is not None
        for key, env_id in env_references(validation.data):  # their environments load with the args they give
            entry = validation.data
            for part in key[:-1]:
                entry = entry[part]
            assert load_environment(env_id, **entry.get("args", {})) is not None, (path, key)


def test_a_second_setup_changes_nothing_and_force_overwrites_an_edit(tmp_path: Path) -> None:
    folder = tmp_path / "ws"
    setup_workspace(folder)
    before = files_of(folder)
    again = setup_workspace(folder)
    assert not again.changed and {a.change for a in again.actions} == {Change.UNCHANGED}
    assert files_of(folder) == before

    config = folder / "configs" / "rl" / "reverse-text.toml"
    config.write_text(config.read_text().replace("max_steps = 30", "max_steps = 7"))
    kept = setup_workspace(folder)
    assert not kept.changed
    [action] = [a for a in kept.actions if a.path == config]
    assert action.change is Change.KEPT and "--force" in action.detail
    assert "max_steps = 7" in config.read_text()

    forced = setup_workspace(folder, force=True)
    assert [a.path for a in forced.actions if a.change is Change.OVERWRITTEN] == [config]
    assert files_of(folder) == before


def test_verifiers_flavour_of_the_example_environment(tmp_path: Path) -> None:
    setup_workspace(tmp_path, verifiers=True)
    module = (tmp_path / "environments" / EXAMPLE_ENVIRONMENT / "my_env.py").read_text()
    assert "import verifiers as vf" in module


def test_v1_flavour_of_the_example_environment_is_a_taskset_the_doctor_passes(tmp_path: Path) -> None:
    """`prime lab setup --v1`: the example as a verifiers v1 taskset (what `prime env init --v1` writes); the doctor
    recognises it without importing it (verifiers 0.4 is not this interpreter's release) and says how it runs."""
    result = setup_workspace(tmp_path, v1=True)
    package = tmp_path / "environments" / EXAMPLE_ENVIRONMENT
    written = {a.path.relative_to(package).as_posix() for a in result.actions if a.path.is_relative_to(package)}
    assert written == {"pyproject.toml", "README.md", "my_env/__init__.py", "my_env/taskset.py", "my_env/scoring.py",
                       "tests/test_my_env.py"}
    assert taskset_marks(package) and not (package / "my_env.py").exists()
    findings = check_workspace(tmp_path, validate_config)
    assert not failed(findings), problems(findings)
    [example] = [f for f in findings if f.check == "environment"]
    assert example.status == "ok" and example.file == "environments/my-env", example
    assert example.message.startswith("a verifiers v1 taskset (class MyEnvTaskset(verifiers.v1.Taskset) at "
                                      "my_env/taskset.py:"), example.message
    assert "prime env install environments/my-env" in example.message
    with pytest.raises(ScaffoldError, match="--v1 and --verifiers"):
        setup_workspace(tmp_path / "both", verifiers=True, v1=True)
    assert not (tmp_path / "both").exists()


def test_setup_keeps_a_users_gitignore_and_adds_only_what_it_lacks(tmp_path: Path) -> None:
    (tmp_path / ".gitignore").write_text("node_modules/\noutputs\n.env")
    action = next(a for a in setup_workspace(tmp_path).actions if a.path.name == ".gitignore")
    assert action.change is Change.UPDATED
    lines = (tmp_path / ".gitignore").read_text().splitlines()
    assert lines[:3] == ["node_modules/", "outputs", ".env"]
    assert "/outputs/" not in lines and "/environments/*/outputs/" not in lines  # `outputs` covers both
    assert "__pycache__/" in lines and missing_ignores(tmp_path) == []


@pytest.mark.parametrize(("patterns", "entry", "covered"), [
    (["outputs/"], "/outputs/", True),
    (["/outputs"], "/outputs/", True),
    (["output*"], "/outputs/", True),
    (["/outputs/"], "/environments/*/outputs/", False),
    (["outputs"], "/environments/*/outputs/", True),
    (["**/__pycache__"], "__pycache__/", True),
    (["*.egg-info"], "*.egg-info/", True),
    (["/build/"], "/outputs/", False),
    ([".envrc"], ".env", False),
])
def test_what_a_gitignore_line_covers(patterns: list[str], entry: str, covered: bool) -> None:
    assert covers(patterns, entry) is covered


def test_every_gitignore_line_is_covered_by_itself() -> None:
    for entry, _ in GITIGNORE_LINES:
        assert covers([entry], entry)


def test_doctor_passes_a_fresh_workspace(tmp_path: Path) -> None:
    setup_workspace(tmp_path)
    findings = check_workspace(tmp_path, validate_config)
    assert not failed(findings), problems(findings)
    [example] = [f for f in findings if f.check == "environment"]
    assert example.status == "ok" and "prime env install environments/my-env" in example.message


def test_doctor_reports_each_problem_where_it_is(tmp_path: Path) -> None:
    setup_workspace(tmp_path)
    (tmp_path / "configs" / "rl" / "typo.toml").write_text(
        'model = "smollm2-135m"\nmax_stepz = 3\nbatch_size = 8\nrollouts_per_example = 4\n\n[sampling]\n'
        'max_tokens = 16\n\n[[env]]\nid = "reverse-text"\n')
    (tmp_path / "configs" / "eval" / "unknown.toml").write_text('model = "smollm2-135m"\n\n[env]\nid = "nobody/nope"\n')
    (tmp_path / "configs" / "rl" / "local.toml").write_text(
        'model = "smollm2-135m"\nmax_steps = 3\nbatch_size = 8\nrollouts_per_example = 4\n\n[sampling]\n'
        'max_tokens = 16\n\n[[env]]\nid = "reverse-text"\n\n[[env]]\nid = "my-env"\n')
    broken = tmp_path / "environments" / "broken-env"
    broken.mkdir()
    (broken / "broken_env.py").write_text('"""Fails at import."""\n\nimport json\n\nraise RuntimeError("boom")\n')
    (tmp_path / ".gitignore").write_text(".env\n__pycache__/\n")

    findings = check_workspace(tmp_path, validate_config)
    assert failed(findings)
    found = problems(findings)
    assert "configs/rl/typo.toml:2: max_stepz: unknown key (did you mean `max_steps`?)" in found
    unknown = next(f for f in findings if f.file == "configs/eval/unknown.toml" and f.status == "fail")
    assert (unknown.check, unknown.line, unknown.key) == ("environment id", 4, "env.id")
    assert "no environment 'nobody/nope'" in unknown.message
    local = next(f for f in findings if f.file == "configs/rl/local.toml" and f.status == "fail")
    assert (local.line, local.key) == (13, "env[1].id")
    assert "environments/my-env is here: prime env install environments/my-env" in local.message
    assert "environments/broken-env/broken_env.py:5: importing broken_env failed: RuntimeError: boom" in found
    gitignore = next(f for f in findings if f.check == "gitignore")
    assert gitignore.status == "fail" and "does not ignore /outputs/" in gitignore.message
    # what still works is said to work
    assert any(f.file == "configs/rl/reverse-text.toml" and f.status == "ok" for f in findings)


def test_doctor_names_each_hugging_face_model_not_here_with_the_command_that_gets_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An RL config's model, a GEPA config's task and reflection models: online (the loopback Hub answers) a warning
    with the run's own command, which downloads it; offline (a Hub that accepts and never answers) a failure saying
    so, within seconds, the Hugging Face cache untouched. A preset, and a model reached through base_url, are not
    named."""
    (tmp_path / "configs" / "rl").mkdir(parents=True)
    (tmp_path / "configs" / "gepa").mkdir()
    (tmp_path / "configs" / "eval").mkdir()
    rl = (TEMPLATES / "configs" / "rl" / "reverse-text.toml").read_text()
    (tmp_path / "configs" / "rl" / "hub.toml").write_text(rl.replace('model = "smollm2-135m"',
                                                                     'model = "acme/policy@v2"', 1))
    (tmp_path / "configs" / "gepa" / "hub.toml").write_text(
        'model = "acme/task"\nreflection_model = "acme/reflect"\n\n[env]\nid = "reverse-text"\n')
    (tmp_path / "configs" / "eval" / "remote.toml").write_text(
        'model = "acme/served"\nbase_url = "http://127.0.0.1:9/v1"\n\n[env]\nid = "reverse-text"\n')
    (tmp_path / "configs" / "eval" / "preset.toml").write_text('model = "smollm2-135m"\n\n[env]\nid = "reverse-text"\n')
    cache = tmp_path / "hf-cache"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)

    def models() -> list[tuple[str, str]]:
        return [(f.status, f.format()) for f in check_workspace(tmp_path, validate_config) if f.check == "model"]

    with loopback_hub([]) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        assert models() == [
            ("warn", "configs/gepa/hub.toml:1: model: model acme/task is not on this machine: `prime gepa run "
                     "@configs/gepa/hub.toml` downloads it from the Hugging Face Hub before the run starts (or `hf "
                     "download acme/task` now)"),
            ("warn", "configs/gepa/hub.toml:2: reflection_model: model acme/reflect is not on this machine: `prime "
                     "gepa run @configs/gepa/hub.toml` downloads it from the Hugging Face Hub before the run starts "
                     "(or `hf download acme/reflect` now)"),
            ("warn", "configs/rl/hub.toml:6: model: model acme/policy@v2 is not on this machine: `prime rl run "
                     "@configs/rl/hub.toml` downloads it from the Hugging Face Hub before the run starts (or `hf "
                     "download acme/policy --revision v2` now)")]
    with socket.socket() as silent:  # accepts (the backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
        monkeypatch.setenv("HF_ENDPOINT", endpoint)
        started = time.monotonic()
        offline = models()
        assert time.monotonic() - started < 5
    why = probed_reason(endpoint)  # what the probe decided (kept for the process): timed out, or no answer within 1 s
    assert why is not None and why.startswith(f"the Hugging Face Hub at {endpoint} cannot be reached (")
    assert offline[2] == ("fail", f"configs/rl/hub.toml:6: model: model acme/policy@v2 is not on this machine and "
                                  f"{why}: `prime rl run @configs/rl/hub.toml` (or `hf download acme/policy --revision "
                                  "v2`) gets it where there is a network")
    assert [status for status, _ in offline] == ["fail"] * 3 and not cache.exists()


def test_doctor_finds_a_package_without_load_environment_and_a_syntax_error(tmp_path: Path) -> None:
    setup_workspace(tmp_path)
    (tmp_path / "environments" / "empty.py").write_text("X = 1\n")
    syntax = tmp_path / "environments" / "bad-syntax"
    syntax.mkdir()
    (syntax / "bad_syntax.py").write_text("def load_environment(:\n    pass\n")
    found = problems(check_workspace(tmp_path, validate_config))
    assert any(p.startswith("environments/empty.py: module empty has no load_environment()") for p in found), found
    assert any(p.startswith("environments/bad-syntax/bad_syntax.py:1: importing bad_syntax failed: SyntaxError")
               for p in found), found


def test_fix_repairs_the_gitignore_and_missing_folders(tmp_path: Path) -> None:
    (tmp_path / ".gitignore").write_text("# mine\n.env\n")
    before = check_workspace(tmp_path, validate_config)
    assert failed(before)
    assert {f.check for f in before if f.status == "fail"} == {"folders", "gitignore"}
    done = fix_workspace(tmp_path)
    assert "created configs/" in done and any(d.startswith(".gitignore: added /outputs/") for d in done)
    assert (tmp_path / ".gitignore").read_text().startswith("# mine\n.env\n")
    after = check_workspace(tmp_path, validate_config)
    assert not failed(after) and not [f for f in after if f.status == "warn"], problems(after)
    assert fix_workspace(tmp_path) == []


def test_the_machine_survey_says_what_runs_here() -> None:
    machine = survey()
    assert 1 <= machine.cores <= machine.cores_total
    assert machine.memory_bytes is not None and machine.memory_bytes > 2**28
    assert [e.name for e in machine.engines] == ["builtin", "vllm"] and machine.engines[0].works
    assert "smollm2-135m" in {m.name for m in machine.models}
    assert {m.availability for m in machine.models} <= {"present", "buildable", "missing"}
    assert machine.disk_free_bytes is not None and machine.runs_dir == str(runs_dir())
    assert bool(machine.gpus) or machine.gpu_note


def test_the_machine_survey_imports_torch_only_where_a_gpu_driver_is() -> None:
    code = ("import sys; from prime_lab.runs.hardware import nvidia_driver_present; "
            "from prime_lab.workspace.machine import survey; survey(); "
            "print(nvidia_driver_present(), 'torch' in sys.modules)")
    driver, imported = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                      check=True).stdout.split()
    assert driver == "True" or imported == "False"


def test_the_survey_lists_the_gpus_torch_sees_where_a_driver_is(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU path without a GPU: a driver file, and a torch whose CUDA reports two devices."""
    from importlib.machinery import ModuleSpec
    from types import ModuleType, SimpleNamespace

    from prime_lab.runs import hardware
    from prime_lab.workspace import machine as machine_module

    driver = tmp_path / "version"
    driver.write_text("NVRM version: 550")
    monkeypatch.setattr(hardware, "NVIDIA_DRIVER_FILES", (driver,))
    devices = [SimpleNamespace(name="NVIDIA H100 80GB HBM3", total_memory=80 * 2**30),
               SimpleNamespace(name="NVIDIA H100 80GB HBM3", total_memory=80 * 2**30)]
    cuda = SimpleNamespace(is_available=lambda: True, device_count=lambda: 2,
                           get_device_properties=lambda i: devices[i])
    torch = ModuleType("torch")
    torch.__spec__ = ModuleSpec("torch", None)
    vars(torch).update(cuda=cuda, __version__="2.9.0", version=SimpleNamespace(cuda="12.8"))
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setattr(machine_module, "vllm_installed", lambda: True)
    found = survey()
    assert [g.name for g in found.gpus] == ["NVIDIA H100 80GB HBM3"] * 2
    assert found.gpus[0].memory_bytes == 80 * 2**30 and found.gpu_note == "torch 2.9.0, CUDA 12.8"
    assert found.auto_engine.startswith("auto chose vllm: a CUDA GPU is present")

    cuda.is_available = lambda: False
    none = survey()
    assert none.gpus == () and "sees no CUDA device" in none.gpu_note
