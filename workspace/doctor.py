"""`prime lab doctor`: a workspace checked the same way every time, each problem where it is (file:line); nothing goes
to the network but one probe of the Hugging Face Hub, and that only when a config names a model that is not here.

Checks: the folders `prime lab setup` makes; the .gitignore keeps secrets and run outputs out of git; every config
under `configs/` validates (with the validator of its kind, handed in by the caller: lab sits below the trainer and
GEPA); every environment id a config names resolves, every model preset it names is on this machine or can be built,
and every Hugging Face id it serves here is on this machine or named with the command that gets it (offline: one
probe of the Hub, runs/hub_probe.py, about a second, and nothing touched); every environment package under
`environments/` imports (in a child interpreter: its import errors, and whatever it imports, stay out of this
process). `fix_workspace` repairs what is safe to repair: folders and the .gitignore.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from prime_lab.envs.installed import ENTRY_POINT_GROUP, module_name
from prime_lab.envs.loader import INSTALLED, ISOLATED, EnvironmentLoadError, resolve
from prime_lab.envs.v1 import taskset_marks
from prime_lab.models.presets import PRESETS, Availability
from prime_lab.problems.toml_lines import KeyLocator, KeyPath, dotted
from prime_lab.problems.validation import Validation
from prime_lab.runs.paths import child_python
from prime_lab.workspace.layout import (
    CONFIG_KINDS,
    FOLDERS,
    GITIGNORE,
    REQUIRED_IGNORES,
    Change,
    ensure_gitignore,
    missing_ignores,
)

Status = Literal["ok", "warn", "fail"]
# A config file's kind ("rl", "sft", "gepa", "eval") and its validation; `prime lab doctor` passes one that picks
# the schema as the workbench does (workbench/config_document.py `detect_kind`).
ConfigValidator = Callable[[Path], tuple[str, Validation[Any]]]
IMPORT_TIMEOUT_S = 120.0
_IMPORT_CHECK = ("import importlib, sys; sys.path.insert(0, sys.argv[1]); "
                 "module = importlib.import_module(sys.argv[2]); "
                 "sys.exit(0 if callable(getattr(module, 'load_environment', None)) else 3)")
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)', re.MULTILINE)


@dataclass(frozen=True)
class Finding:
    """One thing checked: `ok`, a `warn`ing (works, could be better) or a `fail`ure (something will not run)."""

    check: str  # folders, gitignore, config, environment id, model, environment
    status: Status
    message: str
    file: str | None = None
    line: int | None = None
    key: str = ""

    def format(self) -> str:
        """`file:line: key: message`, as config problems print (editors and terminals link them)."""
        where = (f"{self.file}:{self.line}" if self.line else self.file) if self.file else self.check
        return ": ".join([where, *([self.key] if self.key else []), self.message])

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def check_workspace(folder: Path, validate: ConfigValidator) -> list[Finding]:
    """Every check of the workspace in `folder`, in the order they print."""
    findings = _folders(folder) + [_gitignore(folder)]
    for path in config_files(folder):
        findings += _config(folder, path, validate)
    for package, module in environment_packages(folder):
        findings.append(_environment(folder, package, module))
    return findings


def failed(findings: list[Finding]) -> bool:
    return any(f.status == "fail" for f in findings)


def _rel(folder: Path, path: Path) -> str:
    try:
        return str(path.relative_to(folder))
    except ValueError:
        return str(path)


# ------------------------------------------------------------------------------------------------------------
# folders and .gitignore

def _folders(folder: Path) -> list[Finding]:
    missing = [rel for rel in FOLDERS if not (folder / rel).is_dir()]
    if not missing:
        return [Finding("folders", "ok", "configs/{" + ",".join(CONFIG_KINDS) + "}/ and environments/ are here")]
    top = [rel for rel in missing if "/" not in rel]
    status: Status = "fail" if "configs" in top else "warn"
    return [Finding("folders", status, f"missing {', '.join(rel + '/' for rel in missing)} "
                    "(prime lab setup writes them with their configs; --fix makes the folders)")]


def _gitignore(folder: Path) -> Finding:
    path = folder / GITIGNORE
    missing = missing_ignores(folder)
    if not path.is_file():
        return Finding("gitignore", "fail", "no .gitignore: secrets (.env) and run outputs (/outputs/) could be "
                       "committed (--fix writes one)", file=GITIGNORE)
    required = [entry for entry in missing if entry in REQUIRED_IGNORES]
    if required:
        return Finding("gitignore", "fail", f"does not ignore {', '.join(required)} (secrets and run outputs "
                       f"could be committed; --fix adds {', '.join(missing)})", file=GITIGNORE)
    if missing:
        return Finding("gitignore", "warn", f"does not ignore {', '.join(missing)} (--fix adds them)", file=GITIGNORE)
    return Finding("gitignore", "ok", "ignores secrets, run outputs and caches", file=GITIGNORE)


def fix_workspace(folder: Path) -> list[str]:
    """Repair what is safe to: create missing folders, add the .gitignore's missing lines. What was done, in words."""
    done = []
    for rel in FOLDERS:
        path = folder / rel
        if not path.is_dir() and not path.exists():
            path.mkdir(parents=True)
            done.append(f"created {rel}/")
    action = ensure_gitignore(folder)
    if action.change is Change.CREATED:
        done.append(f"wrote {GITIGNORE}")
    elif action.change is Change.UPDATED:
        done.append(f"{GITIGNORE}: {action.detail}")
    return done


# ------------------------------------------------------------------------------------------------------------
# configs

def config_files(folder: Path) -> list[Path]:
    """Every TOML file under configs/ (data folders of SFT configs hold no TOML)."""
    root = folder / "configs"
    return sorted(p for p in root.rglob("*.toml") if p.is_file()) if root.is_dir() else []


def _config(folder: Path, path: Path, validate: ConfigValidator) -> list[Finding]:
    rel = _rel(folder, path)
    kind, result = validate(path)
    findings = [Finding("config", "fail" if p.severity == "error" else "warn", p.message + (
        f" (did you mean `{p.suggestion}`?)" if p.suggestion else ""), file=rel, line=p.line, key=p.key)
        for p in result.problems]
    if result.data is not None:
        locator = KeyLocator(path.read_text(encoding="utf-8-sig"))
        findings += _environment_ids(folder, rel, result.data, locator) + _models(folder, rel, kind, result.data,
                                                                                   locator)
    if not any(f.status == "fail" for f in findings):
        findings.insert(0, Finding("config", "ok", f"valid ({kind})", file=rel))
    return findings


def env_references(data: dict[str, Any]) -> list[tuple[KeyPath, str]]:
    """(key path, id) of every environment a config names: `[[env]]` or `[env]`, and `[[eval.env]]`."""
    refs: list[tuple[KeyPath, str]] = []
    envs = data.get("env")
    if isinstance(envs, dict) and isinstance(envs.get("id"), str):
        refs.append((("env", "id"), envs["id"]))
    elif isinstance(envs, list):
        refs += [(("env", i, "id"), e["id"]) for i, e in enumerate(envs) if isinstance(e, dict)
                 and isinstance(e.get("id"), str)]
    evaluation = data.get("eval")
    eval_envs = evaluation.get("env") if isinstance(evaluation, dict) else None
    if isinstance(eval_envs, list):
        refs += [(("eval", "env", i, "id"), e["id"]) for i, e in enumerate(eval_envs) if isinstance(e, dict)
                 and isinstance(e.get("id"), str)]
    return refs


def _environment_ids(folder: Path, rel: str, data: dict[str, Any], locator: KeyLocator) -> list[Finding]:
    findings = []
    judge = data.get("judge")
    judge_model = str(judge.get("model")) if isinstance(judge, dict) and judge.get("model") else None
    for path, env_id in env_references(data):
        try:
            resolve(env_id)
            findings += _judge(env_id, _env_table(data, path), judge_model, rel, locator.line_of(path), dotted(path))
        except EnvironmentLoadError as exc:
            name = env_id.rsplit("/", 1)[-1]
            local = folder / "environments" / name
            message = (f"no environment '{env_id}' is installed, but environments/{name} is here: "
                       f"prime env install environments/{name}" if local.is_dir() else str(exc))
            findings.append(Finding("environment id", "fail", message, file=rel, line=locator.line_of(path),
                                    key=dotted(path)))
    return findings


def _env_table(data: dict[str, Any], path: KeyPath) -> dict[str, Any]:
    """The `[[env]]` (or `[env]`, `[[eval.env]]`) table whose `id` is at `path`."""
    table: Any = data
    for key in path[:-1]:
        table = table[key]
    return table if isinstance(table, dict) else {}


def _judge(env_id: str, table: dict[str, Any], judge_model: str | None, rel: str, line: int | None,
           key: str) -> list[Finding]:
    """Whether the environment takes an LLM judge, and how the config's `[judge]` (or its own args) reaches it
    (envs/judges.py): a warning where it would call a hosted judge with a key."""
    from prime_lab.envs.judges import config_advice
    from prime_lab.envs.loader import describe

    args = table.get("args")
    try:
        advice = config_advice(env_id, describe(env_id).args, args if isinstance(args, dict) else {}, judge_model)
    except EnvironmentLoadError:
        return []  # its import fails: said by the environment check
    if advice is None:
        return []
    status, message = advice
    return [Finding("environment judge", "warn" if status == "warn" else "ok", message, file=rel, line=line,
                    key=key)]


def model_references(kind: str, data: dict[str, Any]) -> list[tuple[KeyPath, str]]:
    """(key path, name) of every model a config of `kind` has served on this machine: `model` (an SFT config's
    [model] name), a [teacher] model without its own endpoint, GEPA's reflection model; none reached through a
    `base_url` (the endpoint serves it)."""
    refs: list[tuple[KeyPath, str]] = []
    named = "model" if "model" in data else "model_name"
    path: KeyPath = (named,)
    model = data.get(named)
    if isinstance(model, dict):
        model, path = model.get("name"), ("model", "name")
    remote = bool(data.get("base_url"))
    if isinstance(model, str) and not remote:
        refs.append((path, model))
    teacher = data.get("teacher")
    client = teacher.get("client") if isinstance(teacher, dict) else None
    if isinstance(teacher, dict) and isinstance(teacher.get("model"), str) and not (
            isinstance(client, dict) and client.get("base_url")):
        refs.append((("teacher", "model"), teacher["model"]))
    reflection = data.get("reflection_model")
    if kind == "gepa" and isinstance(reflection, str) and reflection != model and not (
            remote or data.get("reflection_base_url")):
        refs.append((("reflection_model",), reflection))
    return refs


def _models(folder: Path, rel: str, kind: str, data: dict[str, Any], locator: KeyLocator) -> list[Finding]:
    """A model preset whose source is not installed cannot run; a Hugging Face id not on this machine is named with
    the command that gets it (online, the run's own command downloads it; offline, one probe of the Hub, about a
    second, says so and nothing is touched). Other names are checked when a run starts."""
    from prime_lab.models.download import is_hub_id
    from prime_lab.models.resolve import hf_download_command, local_model_folder

    findings = []
    for key, name in model_references(kind, data):
        line, where = locator.line_of(key), dotted(key)
        preset = PRESETS.get(name)
        if preset is not None:
            if preset.availability() is Availability.MISSING:
                findings.append(Finding("model", "fail", f"model {name} is not on this machine and cannot be "
                                        f"built: {preset.missing_hint}", rel, line, where))
            continue
        if not is_hub_id(name) or (folder / name).exists() or local_model_folder(name) is not None:
            continue
        from prime_lab.runs.hub_probe import offline_reason

        command, by_hand = f"prime {kind} run @{rel}", hf_download_command(name)
        why = offline_reason()
        if why is None:
            findings.append(Finding("model", "warn", f"model {name} is not on this machine: `{command}` downloads it "
                                    f"from the Hugging Face Hub before the run starts (or `{by_hand}` now)", rel,
                                    line, where))
        else:
            findings.append(Finding("model", "fail", f"model {name} is not on this machine and {why}: `{command}` "
                                    f"(or `{by_hand}`) gets it where there is a network", rel, line, where))
    return findings


# ------------------------------------------------------------------------------------------------------------
# environment packages

def environment_packages(folder: Path) -> list[tuple[Path, str]]:
    """(package folder, module) of each environment under environments/: a folder with a pyproject.toml or a
    module named like it, or a single module file `environments/<name>.py`."""
    root = folder / "environments"
    if not root.is_dir():
        return []
    found = []
    for path in sorted(root.iterdir()):
        if path.name.startswith((".", "_")):
            continue
        if path.is_dir():
            module = package_module(path)
            if module is not None:
                found.append((path, module))
        elif path.suffix == ".py":
            found.append((path, path.stem))
    return found


def package_module(package: Path) -> str | None:
    """The module an environment package provides: its `prime_lab.environments` entry point, its one py-module,
    or the folder's name (verifiers' convention); None for a folder that is no package (no pyproject, no module)."""
    pyproject = package / "pyproject.toml"
    if pyproject.is_file():
        try:
            data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, OSError, UnicodeDecodeError):
            data = {}
        entry_points = data.get("project", {}).get("entry-points", {}).get(ENTRY_POINT_GROUP, {})
        for value in entry_points.values() if isinstance(entry_points, dict) else ():
            if isinstance(value, str):
                return value.partition(":")[0].strip()
        modules = data.get("tool", {}).get("setuptools", {}).get("py-modules", [])
        if isinstance(modules, list) and len(modules) == 1 and isinstance(modules[0], str):
            return modules[0]
        return module_name(package.name)
    module = module_name(package.name)
    return module if (package / f"{module}.py").is_file() or (package / module / "__init__.py").is_file() else None


def _environment(folder: Path, package: Path, module: str) -> Finding:
    rel = _rel(folder, package)
    search = package.parent if package.is_file() else package
    if package.is_dir() and not ((search / f"{module}.py").is_file() or (search / module / "__init__.py").is_file()):
        return Finding("environment", "fail", f"no module {module} ({module}.py or {module}/__init__.py) in the "
                       "package folder", file=rel)
    marks = taskset_marks(package) if package.is_dir() else []
    if marks:  # verifiers 0.4's API: it imports only in 0.4's own release environment, not in this interpreter
        return Finding("environment", "ok", f"a verifiers v1 taskset ({marks[0]}), run at verifiers 0.4 in its own "
                       f"environment{_install_hint(folder, package, module)}", file=rel)
    try:
        proc = subprocess.run([*child_python(), "-c", _IMPORT_CHECK, str(search.resolve()), module],
                              capture_output=True, text=True, timeout=IMPORT_TIMEOUT_S, cwd=search)
    except subprocess.TimeoutExpired:
        return Finding("environment", "fail", f"importing {module} took over {IMPORT_TIMEOUT_S:.0f} s", file=rel)
    if proc.returncode == 3:
        return Finding("environment", "fail", f"module {module} has no load_environment() function; define "
                       "`def load_environment(**args) -> Environment`", file=rel)
    if proc.returncode != 0:
        return _import_failure(folder, search, module, proc.stderr, rel)
    return Finding("environment", "ok", f"imports ({module}){_install_hint(folder, package, module)}", file=rel)


def _import_failure(folder: Path, search: Path, module: str, stderr: str, rel: str) -> Finding:
    """The error's last line, at the deepest frame inside the package (the line to fix) when there is one."""
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    error = lines[-1].strip() if lines else "the interpreter exited without a message"
    file, line = rel, None
    for match in _FRAME.finditer(stderr):
        frame = Path(match["file"])
        if frame.is_relative_to(search.resolve()) or frame.is_relative_to(search):
            file, line = _rel(folder.resolve(), frame.resolve()), int(match["line"])
    hint = ""
    if "No module named 'verifiers'" in error or "No module named 'datasets'" in error:
        hint = " (a verifiers environment: pip install 'prime-lab[verifiers]')"
    return Finding("environment", "fail", f"importing {module} failed: {error}{hint}", file=file, line=line)


def _install_hint(folder: Path, package: Path, module: str) -> str:
    """`; not installed: ...` when its id does not load this package yet."""
    if package.is_file():
        return ""
    try:
        where = resolve(package.name)
    except EnvironmentLoadError:
        where = None
    if where is not None and where.module == module and where.source in (INSTALLED, ISOLATED):
        return "; installed"
    return f"; not installed, so configs cannot name it yet: prime env install {_rel(folder, package)}"
