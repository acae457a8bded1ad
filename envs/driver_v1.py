"""The driver of a verifiers v1 taskset (verifiers 0.4's API), run in the release's own interpreter.

driver.py hands over to this file, loaded by path, when the interpreter's verifiers is a v1 release
(releases.V1_RANGE); like driver.py it imports only the standard library, verifiers and what verifiers imports, never
prime-lab. The same three commands and the same protocol, so that installing, describing, restarting, watching and
reaping a v1 environment is what it is for every other release:

- `check MODULE`: the package's exported `vf.Taskset` subclass; its config's own fields are the environment's
  arguments (name, default, required, type), with `harness` ("null" or "bash") after them, and its docstring the
  summary.
- `describe MODULE ARGS`: the environment built as `vf-eval` builds it (`resolve_env_config` with the harness the
  `harness` argument picks, `null` by default or `bash`, on a local `subprocess` runtime, sandboxed for `bash`:
  SandboxedRuntime; refused where the taskset brings its own harness; `load_environment`), its tasks
  as rows (the prompt as messages, the system prompt first; `answer` where the task has one; the task's dumped data
  in `info["v1_task"]`, which a rollout rebuilds the task from, as verifiers' own env server does), its reward
  functions' names and weights as the rubric, its metrics' names.
- `serve`: `Runner.run_group` runs a group's rollouts with `env.run_slot` inside `env.serving()` (held for the
  server's life) and turns each `Episode` into the rollout output prime-lab reads: per sampled node of the trace a
  trajectory step (prompt ids: the ids of the nodes before it and its own unmasked header; completion ids and
  logprobs: its masked, sampled ids), the reward, each reward's score and each metric, the finish reasons, timings
  and errors. A request that asks for token ids and logprobs (an RL run) goes through verifiers' train client,
  which renders chat to ids itself and calls the server's `/inference/v1/generate` (the tokenizer read from the
  folder the server names as its model's `root` in /v1/models); any other through its eval client (`/v1/chat/
  completions`). GEPA's system prompt (the row's system message) reaches the task through `task.with_system_prompt`.

A run's judge (`[judge]`, `--judge`: the PRIME_LAB_JUDGE_* variables) is given to every judge config of the
environment left at Prime Inference's endpoint (`wire_judges`).

What does not run here is refused in one line: a task or harness that needs a container (an image), an environment
of several agents, a trace compacted into several branches. The harness program (a PEP 723 script) is prepared by
`uv sync --script` from the wheels the release's environment was made with (releases.py `V1_WHEELS`): uv is pointed
at them and at an empty index, never at the network.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import contextvars
import importlib
import inspect
import json
import os
import shlex
import shutil
import signal
import socket
import sys
import tempfile
import urllib.request
from collections.abc import Collection
from typing import Any

V1_WHEELS = "uv-wheels"  # releases.py V1_WHEELS: the harness program's wheels, in the release's folder
RUNTIME = {"type": "subprocess"}
HARNESS_ARG = "harness"  # the argument that picks verifiers' harness (its env.agent.harness.id)
HARNESSES: dict[str, dict[str, Any]] = {  # what each harness prime-lab runs is configured with
    "null": {"id": "null"},
    # the edit tool writes files from the harness program, which runs on this machine: off, so that every change the
    # model makes goes through its bash commands, which run in the rollout's sandbox
    "bash": {"id": "bash", "edit": False},
}
SANDBOX_PACKAGE = "_prime_lab_sandbox"  # driver.py's: prime-lab's sandbox folder, registered by path
BASH_SHIM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_bash_v1.py")
jsonable: Any = None  # driver.py's (plain data of pydantic models, numpy arrays, ...): set when it loads this file
sandbox_package: Any = None  # driver.py's: registers prime-lab's sandbox folder as SANDBOX_PACKAGE (False: not there)
sandboxed = False  # this driver's environment runs the bash harness: its runtime is SandboxedRuntime
FORKSERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "forkserver_v1.py")


class Refused(RuntimeError):
    """What this driver does not run, in one line."""


def offline_uv() -> None:
    """uv, which verifiers runs to prepare the harness program, installs from the release's wheel folder and an
    empty index, keeps its cache in the release's folder and downloads no Python (verifiers forces UV_OFFLINE=false;
    uv does not honour UV_NO_INDEX, an empty default index it does)."""
    prefix = sys.prefix
    empty = os.path.join(prefix, "uv-empty-index")
    os.makedirs(empty, exist_ok=True)
    os.environ.setdefault("UV_FIND_LINKS", os.path.join(prefix, V1_WHEELS))
    os.environ.setdefault("UV_DEFAULT_INDEX", "file://" + empty)
    os.environ.setdefault("UV_CACHE_DIR", os.path.join(prefix, "uv-cache"))
    os.environ.setdefault("UV_PYTHON_DOWNLOADS", "never")
    os.environ["PATH"] = os.path.join(prefix, "bin") + os.pathsep + os.environ.get("PATH", "")


# The harness program, forked from a warm interpreter ------------------------------------------------------------

def uv_program(argv: list[str], interpreters: Collection[str] = ()) -> tuple[str | None, str, str, list[str]] | None:
    """(venv, interpreter, script, arguments) of a uv-prepared program's argv as verifiers' `prepare_uv_script`
    builds it: `sh -c ACTIVATE uv-script VENV INTERPRETER SCRIPT ARGS...`, or (venv None: not activated, as the bash
    harness runs it) `INTERPRETER SCRIPT ARGS...` with an interpreter it prepared (`interpreters`); None for any other
    command."""
    if len(argv) >= 7 and argv[0] == "sh" and argv[1] == "-c" and argv[3] == "uv-script" and argv[6].endswith(".py"):
        return argv[4], argv[5], argv[6], list(argv[7:])
    if len(argv) >= 2 and argv[0] in interpreters and argv[1].endswith(".py"):
        return None, argv[0], argv[1], list(argv[2:])
    return None


async def read_all(fd: int) -> bytes:
    """A pipe's whole content, read on the event loop (not in a worker thread: verifiers' train client renders in
    the loop's default executor, which blocked reads of several rollouts' programs would fill)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 30)
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", 0))
    try:
        return await reader.read()
    finally:
        transport.close()


class ForkServer:
    """forkserver_v1.py for one program (interpreter and script), started at its first run, for the driver's life."""

    servers: dict[tuple[str, str], ForkServer] = {}

    def __init__(self, interpreter: str, script: str) -> None:
        self.folder = tempfile.mkdtemp(prefix="prime-lab-fork-")
        self.path = os.path.join(self.folder, "socket")
        self.interpreter, self.script = interpreter, script
        self.process: asyncio.subprocess.Process | None = None
        self.lock = asyncio.Lock()

    @classmethod
    async def get(cls, interpreter: str, script: str) -> ForkServer:
        key = (interpreter, script)
        if key not in cls.servers:  # one per program: its socket folder made once, not at every run
            cls.servers[key] = cls(interpreter, script)
        server = cls.servers[key]
        async with server.lock:
            if server.process is None or server.process.returncode is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(server.path)
                server.process = await asyncio.create_subprocess_exec(
                    interpreter, "-I", FORKSERVER, server.path, script, stdout=asyncio.subprocess.PIPE)
                assert server.process.stdout is not None
                if (await server.process.stdout.readline()).strip() != b"ready":
                    raise RuntimeError(f"the harness program's fork server ({interpreter} {FORKSERVER}) did not start")
        return server

    async def run(self, args: list[str], env: dict[str, str], cwd: str) -> tuple[int, str, str]:
        """`INTERPRETER SCRIPT ARGS` in `cwd` with exactly `env`: its exit status, stdout and stderr. Cancelled, the
        run's process group is killed, as verifiers' subprocess runtime kills its program's."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self.path)
            header = json.dumps({"argv": args, "env": env, "cwd": cwd}).encode() + b"\n"
            sent = sock.sendmsg([header], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [out_w, err_w]))])
            sock.sendall(header[sent:])
        except OSError:
            sock.close()
            for fd in (out_r, err_r):
                os.close(fd)
            raise
        finally:
            os.close(out_w)
            os.close(err_w)
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        pid = 0
        try:
            pid = int((await reader.readline()).split()[1])
            out, err, status = await asyncio.gather(read_all(out_r), read_all(err_r), reader.readline())
        except BaseException:
            if pid:
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
            raise
        finally:
            writer.close()
        words = status.split()
        code = int(words[1]) if len(words) == 2 and words[0] == b"exit" else 1
        return code, out.decode(errors="replace"), err.decode(errors="replace")

    @classmethod
    async def stop_all(cls) -> None:
        for server in cls.servers.values():
            if server.process is not None and server.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    server.process.kill()
                await server.process.wait()
            shutil.rmtree(server.folder, ignore_errors=True)
        cls.servers.clear()


def forking_runtime() -> None:
    """verifiers' `subprocess` runtime, its harness program forked from a fork server (forkserver_v1.py) instead of
    started afresh per rollout: the same environment (the host's minus names with API_KEY, the runtime's, uv's
    activation where the harness asks for it), folder, output and exit status; and, for the bash harness,
    SandboxedRuntime. verifiers 0.4.0 chooses a runtime's class through `verifiers.v1.runtimes._runtime_cls`, looked up
    at each call: rebound here for `type = "subprocess"`; a release without it keeps its own runtime."""
    import verifiers.v1.runtimes as runtimes
    from verifiers.v1.runtimes import ProgramResult
    from verifiers.v1.runtimes.subprocess import SubprocessRuntime

    chooser = getattr(runtimes, "_runtime_cls", None)
    if chooser is None or getattr(chooser, "prime_lab", False):
        return

    class ForkingSubprocessRuntime(SubprocessRuntime):  # type: ignore[misc, valid-type]
        async def run(self, argv: list[str], env: dict[str, str]) -> Any:
            program = uv_program(argv, set(self._uv_interpreters.values()))
            if program is None:
                return await super().run(argv, env)
            venv, interpreter, script, args = program
            full = {k: v for k, v in os.environ.items() if "API_KEY" not in k.upper()}
            full.update(self.process_env(env))
            if venv is not None:  # the activated form: what its `sh -c` line exports
                home = full.get("HOME", os.path.expanduser("~"))
                full.update(VIRTUAL_ENV=venv, PATH=f"{venv}/bin:{home}/.local/bin:{full.get('PATH', '')}",
                            UV_INSTALL_DIR=f"{home}/.local/bin", UV_RUN_RECURSION_DEPTH="1")
            server = await ForkServer.get(interpreter, script)
            code, out, err = await server.run(args, full, str(self.workdir))
            return ProgramResult(exit_code=code, stdout=out, stderr=err)

    class SandboxedRuntime(ForkingSubprocessRuntime):  # type: ignore[misc, valid-type]
        """The bash harness's runtime: the harness program (verifiers' chat loop) runs on this machine as on
        ForkingSubprocessRuntime, but the `bash` it runs for each of the model's commands is BASH_SHIM, which runs
        the command in this rollout's prime-lab sandbox (/app its folder); and everything else run, written or read
        in the runtime (the task's setup, its rewards' checks) is in that sandbox too. Only preparing the program and
        writing its first messages happen in the host folder."""

        sandbox: Any = None

        async def start(self) -> None:
            await super().start()
            self.sandbox = await asyncio.to_thread(new_sandbox, self.name)
            shim = self.workdir / ".prime-lab-bin" / "bash"
            shim.parent.mkdir()
            shim.write_text(bash_shim(self.sandbox.id))
            shim.chmod(0o755)

        async def prepare_uv_script(self, *args: Any, **kwargs: Any) -> Any:
            token = ON_HOST.set(True)
            try:
                return await super().prepare_uv_script(*args, **kwargs)
            finally:
                ON_HOST.reset(token)

        async def run_program(self, argv: list[str], env: dict[str, str]) -> Any:
            token = ON_HOST.set(True)
            path = self.process_env(env).get("PATH", os.environ.get("PATH", ""))
            try:
                return await super().run_program(argv, {**env, "PATH": f"{self.workdir}/.prime-lab-bin:{path}"})
            finally:
                ON_HOST.reset(token)

        async def run(self, argv: list[str], env: dict[str, str]) -> Any:
            if ON_HOST.get():
                return await super().run(argv, env)
            variables = {k: v for k, v in self.process_env(env).items() if "API_KEY" not in k.upper()}
            result = await asyncio.to_thread(self.sandbox.execute, shlex.join(argv), env=variables)
            return ProgramResult(exit_code=result.exit_code, stdout=result.stdout, stderr=result.stderr)

        async def write(self, path: str, data: bytes) -> None:
            if ON_HOST.get() or path.startswith(PROGRAM_FILES):
                await super().write(path, data)
            else:
                await asyncio.to_thread(self.sandbox.write_file, path, data)

        async def _read(self, path: str, max_bytes: int | None = None) -> bytes:
            return bytes(await asyncio.to_thread(self.sandbox.read_file, path, 0, max_bytes))

        def cleanup(self) -> None:
            if self.sandbox is not None:
                with contextlib.suppress(Exception):
                    self.sandbox.delete()
                self.sandbox = None
            super().cleanup()

        async def teardown(self) -> None:
            sandbox, self.sandbox = self.sandbox, None
            if sandbox is not None:
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(sandbox.delete)
            await super().teardown()

    def choose(config: Any) -> Any:
        if getattr(config, "type", None) != "subprocess":
            return chooser(config)
        return SandboxedRuntime if sandboxed else ForkingSubprocessRuntime

    choose.prime_lab = True  # type: ignore[attr-defined]
    runtimes._runtime_cls = choose


ON_HOST: contextvars.ContextVar[bool] = contextvars.ContextVar("prime_lab_on_host", default=False)
PROGRAM_FILES = ".vf-initial-messages-"  # what verifiers writes for the harness program to read, in its folder


def sandbox_core() -> Any:
    """prime-lab's sandbox core (sandbox/local.py) and settings, by path."""
    if not sandbox_package():
        raise Refused("prime-lab's sandbox folder is not beside this driver: the bash harness has no sandbox to run in")
    return importlib.import_module(f"{SANDBOX_PACKAGE}.local"), importlib.import_module(f"{SANDBOX_PACKAGE}.settings")


def sandbox_problem() -> str | None:
    """Why the bash harness cannot run here (one line), or None: it needs the runtime chooser this driver rebinds
    (without it verifiers' own subprocess runtime would run the model's commands on this machine) and a sandbox."""
    import verifiers.v1.runtimes as runtimes

    if not callable(getattr(runtimes, "_runtime_cls", None)):
        return ("the bash harness runs here only where prime-lab can give it a sandboxed runtime, through verifiers' "
                "runtime chooser (verifiers.v1.runtimes._runtime_cls), which this verifiers release does not have: "
                "install the taskset at verifiers 0.4.0 (--verifiers 0.4.0)")
    local, settings = sandbox_core()
    if settings.from_environ().isolation != "strong":
        return None
    problem = local.isolation_problem()
    return None if problem is None else (f"the bash harness runs the model's commands in a local sandbox, which "
                                         f"cannot be isolated on this machine: {problem}. Set [sandbox] isolation = "
                                         "\"weak\" to run them with rlimits only")


def new_sandbox(name: str) -> Any:
    """A sandbox for one rollout of the bash harness, under the run's `[sandbox]` settings."""
    local, settings = sandbox_core()
    chosen = settings.from_environ()
    image = f"python:{sys.version_info.major}.{sys.version_info.minor}"
    return local.create(local.SandboxSpec(name=name, image=image, memory_gb=chosen.memory_gb or 2.0,
                                          disk_size_gb=5.0, network=chosen.network, isolation=chosen.isolation,
                                          run_dir=chosen.run_dir))


def bash_shim(sandbox_id: str) -> str:
    """The `bash` the harness program finds first on its PATH: BASH_SHIM for `sandbox_id`."""
    local, _ = sandbox_core()
    core = os.path.dirname(os.path.abspath(local.__file__))
    words = [sys.executable, "-I", BASH_SHIM, core, str(local.sandbox_home()), sandbox_id]
    return "#!/bin/sh\nexec " + " ".join(shlex.quote(w) for w in words) + ' "$@"\n'


def token_id_logprobs() -> None:
    """verifiers 0.4's train client reads a generate answer with renderers, whose parser (0.1.12) takes a logprob
    entry only as `{"token": "token_id:<id>", ...}` (prime-lab's server's shape); vLLM 0.32's own route writes
    `{"token_id": <id>, ...}` instead. Both name the same token: the parser is given entries of vLLM's shape in the
    shape it reads (an entry naming another token is still refused)."""
    try:
        import renderers.client as client
    except ImportError:
        return
    parse = getattr(client, "_parse_completion_logprobs", None)
    if parse is None or getattr(parse, "prime_lab", False):
        return

    def parse_either(choice: Any, completion_ids: list[int]) -> Any:
        logprobs = choice.get("logprobs") if isinstance(choice, dict) else None
        content = logprobs.get("content") if isinstance(logprobs, dict) else None
        if isinstance(logprobs, dict) and isinstance(content, list):
            named = [{**e, "token": f"token_id:{e['token_id']}"}
                     if isinstance(e, dict) and "token" not in e and isinstance(e.get("token_id"), int) else e
                     for e in content]
            choice = {**choice, "logprobs": {**logprobs, "content": named}}
        return parse(choice, completion_ids)

    parse_either.prime_lab = True  # type: ignore[attr-defined]
    client._parse_completion_logprobs = parse_either


def vf() -> Any:
    import verifiers.v1 as v1

    return v1


def taskset_class(module: str) -> type:
    """The one `vf.Taskset` subclass the package exports (its `__all__`, else its names)."""
    mod = importlib.import_module(module)
    names = getattr(mod, "__all__", None) or [n for n in dir(mod) if not n.startswith("_")]
    found = [obj for obj in (getattr(mod, n, None) for n in names)
             if inspect.isclass(obj) and issubclass(obj, vf().Taskset) and obj is not vf().Taskset]
    if not found:
        raise Refused(f"module '{module}' exports no verifiers.v1.Taskset subclass (list it in __all__)")
    return found[0]


def config_fields(cls: type) -> list[list[Any]]:
    """The taskset config's own fields (not TasksetConfig's): [name, default, required, type] each."""
    from verifiers.v1.utils.loaders import concrete_type

    config = concrete_type(cls, vf().TasksetConfig, origin=vf().Taskset) or vf().TasksetConfig
    base = set(vf().TasksetConfig.model_fields)
    rows = []
    for name, field in config.model_fields.items():
        if name in base:
            continue
        required = field.is_required()
        annotation = getattr(field.annotation, "__name__", str(field.annotation))
        rows.append([name, None if required else jsonable(field.get_default(call_default_factory=True)), required,
                     annotation])
    return rows


def check(module: str, release: str) -> dict[str, Any]:
    cls = taskset_class(module)
    doc = inspect.getdoc(sys.modules[module]) or inspect.getdoc(cls) or ""
    if doc == inspect.getdoc(vf().Taskset):
        doc = ""
    args = config_fields(cls)
    if HARNESS_ARG not in {row[0] for row in args}:  # a taskset's own field of that name keeps its meaning
        args.append([HARNESS_ARG, "null", False, "str"])
    return {"ok": True, "release": release, "api": "v1", "doc": " ".join(doc.split("\n\n")[0].split()),
            "file": getattr(sys.modules[module], "__file__", None), "any_args": False, "args": args}


def harness_choice(module: str, args: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The harness the arguments pick (HARNESS_ARG: "null", the default, or "bash") and the taskset's own
    arguments."""
    fields = {row[0] for row in config_fields(taskset_class(module))}
    if HARNESS_ARG in fields:
        return "null", args
    rest = {k: v for k, v in args.items() if k != HARNESS_ARG}
    harness = args.get(HARNESS_ARG, "null")
    if harness not in HARNESSES:
        raise Refused(f"{module}: harness {harness!r} is not one prime-lab runs: \"null\" (the model answers; the "
                      "default) or \"bash\" (the model's commands run in a local sandbox); other harnesses need a "
                      "container")
    return str(harness), rest


def env_config(module: str, args: dict[str, Any]) -> Any:
    """verifiers' EnvConfig for the taskset: its arguments and the harness they pick (`null` unless "bash"; refused
    where the taskset brings its own) on a local `subprocess` runtime, sandboxed for `bash`."""
    global sandboxed
    from verifiers.v1.utils.loaders import default_harness_id

    if default_harness_id(module) == module:
        raise Refused(f"{module} brings its own harness, whose program would run on this machine outside a sandbox: "
                      "prime-lab runs v1 tasksets with verifiers' null harness (the model answers; the taskset's "
                      "tools and rewards do the rest) or its bash harness (the model's commands in a local sandbox)")
    harness, rest = harness_choice(module, args)
    if harness == "bash":
        problem = sandbox_problem()
        if problem is not None:
            raise Refused(problem)
    sandboxed = harness == "bash"
    return vf().resolve_env_config({"taskset": {"id": module, **rest},
                                    "agent": {"harness": dict(HARNESSES[harness]), "runtime": dict(RUNTIME)}})


def build(module: str, args: dict[str, Any]) -> Any:
    env = vf().load_environment(env_config(module, args))
    refuse_unrunnable(env)
    wired = wire_judges(env.config, os.environ)
    if wired:
        print(f"driver: the run's judge {os.environ[JUDGE_MODEL]} at {os.environ[JUDGE_URL]} judges for "
              f"{', '.join(wired)}", file=sys.stderr, flush=True)
    return env


JUDGE_URL, JUDGE_MODEL, JUDGE_KEY = (  # envs/judges.py JUDGE_VARIABLES: the run's judge, which env servers inherit
    "PRIME_LAB_JUDGE_BASE_URL", "PRIME_LAB_JUDGE_MODEL", "PRIME_LAB_JUDGE_API_KEY")


def wire_judges(config: Any, environ: Any) -> list[str]:
    """Point every judge of the environment's config (a `vf.JudgeConfig` anywhere in it: a task config's `judges`,
    a config field of the taskset or its tasks) that is left at Prime's inference endpoint at the run's judge
    (`[judge]`, `--judge`), when it has one: its URL, model and key's variable. A judge whose endpoint the taskset or
    the user set stays as it is. Returns where each wired judge sits (`taskset.task.judge`, ...)."""
    url, model = environ.get(JUDGE_URL), environ.get(JUDGE_MODEL)
    if not url or not model:
        return []
    from pydantic import BaseModel
    from verifiers.v1.configs import client as clients

    prime = {clients.DEFAULT_PRIME_INFERENCE_URL, environ.get("PRIME_INFERENCE_URL"),
             clients.load_prime_config().get("inference_url")}
    wired: list[str] = []

    def walk(node: Any, where: str) -> None:
        if isinstance(node, vf().JudgeConfig):
            if node.base_url in prime:
                node.base_url, node.model, node.api_key_var = url, model, JUDGE_KEY
                wired.append(where)
        elif isinstance(node, BaseModel):
            for name in type(node).model_fields:
                walk(getattr(node, name), f"{where}.{name}" if where else name)
        elif isinstance(node, list | tuple):
            for i, item in enumerate(node):
                walk(item, f"{where}[{i}]")
        elif isinstance(node, dict):
            for key, item in node.items():
                walk(item, f"{where}.{key}")

    walk(config, "")
    return wired


def refuse_unrunnable(env: Any) -> None:
    """One line for what cannot run on this machine: an environment of several agents, a harness or task that
    needs a container."""
    agents = [name for name, field in type(env.config).model_fields.items()
              if inspect.isclass(field.annotation) and issubclass(field.annotation, vf().AgentConfig)]
    if len(agents) != 1:
        raise Refused(f"{type(env).__name__} has {len(agents)} agent roles ({', '.join(agents) or 'none'}): "
                      "prime-lab runs single-agent v1 environments only")
    harness = getattr(env, "agent", None) or getattr(env, "harness", None)
    for part in (harness, getattr(harness, "harness", None)):
        if part is not None and getattr(part, "NEEDS_CONTAINER", False):
            raise Refused(f"the harness {type(part).__name__} needs a container, which prime-lab does not start; "
                          "use the null harness")


def needs_container(task: Any) -> str | None:
    if getattr(type(task), "NEEDS_CONTAINER", False):
        return f"its task type {type(task).__name__} needs a container (NEEDS_CONTAINER)"
    image = getattr(task.data, "image", None)
    if image:
        return f"task {task.data.id or task.data.idx} asks for the container image {image}"
    return None


def prompt_messages(data: Any) -> list[dict[str, Any]]:
    prompt = data.prompt
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else jsonable(list(prompt or []))
    if data.system_prompt and not any(m.get("role") == "system" for m in messages):
        messages.insert(0, {"role": "system", "content": data.system_prompt})
    return messages


def describe(module: str, args: dict[str, Any], release: str, limit: int = 10000) -> dict[str, Any]:
    env = build(module, args)
    taskset = env.taskset
    if not taskset.bounded:
        taskset = taskset.take(limit)
    rows = []
    first = None  # its reward and metric hooks are the rubric (a second pass would load the tasks again)
    for number, task in enumerate(taskset):
        first = task if first is None else first
        why = needs_container(task)
        if why is not None:
            raise Refused(f"{module}: {why}; prime-lab runs v1 tasks on a local runtime, without containers")
        data = task.data
        rows.append({"example_id": data.idx if data.idx is not None else number, "prompt": prompt_messages(data),
                     "answer": jsonable(getattr(data, "answer", "") or ""), "task": module,
                     "info": {"v1_task": jsonable(data), "v1_id": data.id}})
    rewards = first.hooks("reward") if first is not None else []
    system_prompt = rows[0]["prompt"][0]["content"] if rows and rows[0]["prompt"][0].get("role") == "system" \
        else None
    return {"release": release, "api": "v1", "system_prompt": system_prompt, "sampling_args": {},
            "message_type": "chat", "takes_system_prompt": True, "parser": {"format": ""},
            "rubric": {"names": [f.__name__ for f in rewards],
                       "weights": [float(getattr(f, "_vf_weight", 1.0)) for f in rewards]},
            "metrics": [f.__name__ for f in first.hooks("metric")] if first is not None else [],
            "timeout_seconds": None, "tools": [], "dataset": rows, "eval_dataset": None}


# serve -------------------------------------------------------------------------------------------------------------

def model_folder(base_url: str, model: str) -> str | None:
    """The folder the server at `base_url` loaded `model` from (its /v1/models `root`, as vLLM and prime-lab's
    server give it; for a LoRA adapter, its base model's, named by `parent`), where the train client's renderer reads
    the tokenizer, offline; None when it names none."""
    try:
        with urllib.request.urlopen(base_url.rstrip("/") + "/models", timeout=30) as answer:
            entries = [e for e in json.loads(answer.read()).get("data") or [] if isinstance(e, dict)]
    except (OSError, ValueError, AttributeError):
        return None
    by_id = {e.get("id"): e for e in entries}
    entry = by_id.get(model) or (entries[0] if len(entries) == 1 else None)
    seen: set[str] = set()
    while entry is not None and entry.get("parent") in by_id and entry.get("parent") not in seen:
        seen.add(entry["parent"])
        entry = by_id[entry["parent"]]  # an adapter: its base model's folder holds the tokenizer
    folders = [e.get("root") for e in ([entry] if entry is not None else []) + entries]
    return next((f for f in folders if isinstance(f, str) and os.path.isdir(f)), None)


def train_renderer(folder: str | None) -> dict[str, Any] | None:
    """The train client's renderer for a model served from `folder`: its chat template, with Hermes-style
    `<tool_call>` blocks parsed from what it writes, as prime-lab's server and vLLM's `hermes` parser read them
    (renderers maps Hub names only; its fallback for a folder has no tool parser and refuses every request that offers
    tools, as a taskset's toolset does). None (renderers' own choice) for a model named by its Hub id."""
    return None if folder is None else {"name": "default", "tool_parser": "qwen3"}


def wants_tokens(sampling: dict[str, Any]) -> bool:
    extra = sampling.get("extra_body") or {}
    return bool(sampling.get("logprobs")) and bool(extra.get("return_token_ids"))


def sampling_config(sampling: dict[str, Any], train: bool) -> Any:
    """verifiers' SamplingConfig from the request's sampling args (the train client asks for logprobs and ids
    itself; its generate route takes no extra_body)."""
    known = {k: v for k, v in sampling.items() if k in ("temperature", "top_p", "max_tokens", "stop", "seed")}
    extra = {k: v for k, v in (sampling.get("extra_body") or {}).items() if k != "return_token_ids"}
    if not train and extra:
        known["extra_body"] = extra
    elif train:
        known.update({k: v for k, v in extra.items() if k in ("min_tokens", "top_k", "repetition_penalty")})
    return vf().SamplingConfig(**known)


def node_ids(node: Any) -> list[int]:
    return [int(i) for i in jsonable(node.token_ids if node.token_ids is not None else [])]


def trajectory(trace: Any, finish: dict[int, str | None]) -> list[dict[str, Any]]:
    """One step per sampled node: the messages before it and its message; its tokens where the client kept them
    (prompt ids: every id before the node on its branch and its unmasked header; completion ids: its sampled ids)."""
    nodes = list(trace.nodes)
    steps = []
    for index, node in enumerate(nodes):
        if not node.sampled:
            continue
        chain: list[Any] = []
        parent = node.parent
        while parent is not None:
            chain.insert(0, nodes[parent])
            parent = nodes[parent].parent
        tokens = None
        ids = node_ids(node)
        if ids and node.mask is not None:
            mask = [bool(m) for m in jsonable(node.mask)]
            first = mask.index(True) if True in mask else len(mask)
            before = [i for n in chain for i in node_ids(n)]
            completion = [i for i, m in zip(ids, mask, strict=False) if m]
            logprobs = [float(x) for x in jsonable(node.logprobs or [])]
            tokens = {"prompt_ids": before + ids[:first], "prompt_mask": [0] * (len(before) + first),
                      "completion_ids": completion, "completion_mask": [1] * len(completion),
                      "completion_logprobs": logprobs}
        steps.append({"prompt": [jsonable(n.message) for n in chain], "completion": [jsonable(node.message)],
                      "response": {"message": {"finish_reason": finish.get(index)}}, "tokens": tokens})
    return steps


def episode_output(episode: Any, row: dict[str, Any], seconds: float) -> dict[str, Any]:
    """An Episode as the rollout output prime-lab reads (verifiers' classic RolloutOutput fields)."""
    out: dict[str, Any] = {"example_id": row.get("example_id"), "prompt": row.get("prompt"), "completion": [],
                           "answer": row.get("answer", ""), "task": row.get("task"), "info": row.get("info") or {},
                           "reward": 0.0, "metrics": {}, "is_truncated": False, "stop_condition": None,
                           "timing": {"total_ms": seconds * 1000}, "error": None, "trajectory": []}
    trainable = [t for t in episode.traces if getattr(t.agent, "trainable", True)]
    errors = [f"{e.type}: {e.message}" if hasattr(e, "message") else str(e) for e in episode.errors]
    if len(trainable) > 1:
        errors.append(f"an episode of {len(trainable)} agents' traces: prime-lab trains single-agent episodes only")
    if not trainable:
        out["error"] = "; ".join(errors) or "the episode has no trace"
        return out
    trace = trainable[0]
    if len(trace.branches) > 1:
        errors.append(f"a trace compacted into {len(trace.branches)} branches: not supported yet")
    finish = {call.node: call.finish_reason for call in trace.calls if call.node is not None}
    steps = trajectory(trace, finish)
    scores = {name: float(r.score) for name, r in trace.rewards.items()}
    timing = trace.timing
    phases = {}
    for phase in ("setup", "agent", "finalize", "scoring"):
        span = getattr(timing, phase, None)
        if span is not None and getattr(span, "end", None) and getattr(span, "start", None):
            phases[f"{phase}_ms"] = (span.end - span.start) * 1000
    model = getattr(getattr(timing, "agent", None), "model", None)
    if model is not None and getattr(model, "duration", None) is not None:
        phases["generation_ms"] = float(model.duration) * 1000
    if not trace.ok and trace.last_error is not None:
        error = trace.last_error
        errors.append(f"{getattr(error, 'type', type(error).__name__)}: {getattr(error, 'message', error)}")
    messages = [jsonable(n.message) for n in trace.nodes]
    first = next((i for i, n in enumerate(trace.nodes) if n.sampled), len(messages))
    out.update(prompt=messages[:first] or out["prompt"], completion=messages[first:],
               reward=float(trace.reward), metrics={**scores, **{k: float(v) for k, v in trace.metrics.items()}},
               is_truncated=bool(trace.is_truncated), stop_condition=trace.stop_condition,
               timing={**out["timing"], **phases}, trajectory=steps,
               error="; ".join(dict.fromkeys(errors)) if errors and not (episode.ok and trace.ok) else None)
    return out


class Runner:
    """A group's rollouts through verifiers v1 (`run_group` of driver.py's server)."""

    def __init__(self, module: str, args: dict[str, Any]) -> None:
        self.module = module
        forking_runtime()
        token_id_logprobs()
        self.env = build(module, args)
        self.task_cls = type(self.env.taskset).task_type()
        self.data_cls = self.task_cls.data_type()
        self.serving: contextlib.AsyncExitStack | None = None
        self.folders: dict[tuple[str, str], str | None] = {}

    async def open(self) -> None:
        if self.serving is None:
            self.serving = contextlib.AsyncExitStack()
            await self.serving.enter_async_context(self.env.serving())

    async def close(self) -> None:
        if self.serving is not None:
            await self.serving.aclose()
            self.serving = None
        await ForkServer.stop_all()

    def task(self, row: dict[str, Any]) -> Any:
        data = (row.get("info") or {}).get("v1_task")
        if not isinstance(data, dict):
            raise Refused("the row carries no v1 task (info.v1_task): describe the environment again")
        task = self.task_cls(self.data_cls.model_validate(data), self.env.config.taskset.task)
        system = next((m.get("content") for m in row.get("prompt") or [] if m.get("role") == "system"), None)
        if isinstance(system, str) and system != (task.data.system_prompt or None):
            task = task.with_system_prompt(system)  # GEPA's candidate prompt
        why = needs_container(task)
        if why is not None:
            raise Refused(f"{self.module}: {why}; prime-lab runs v1 tasks on a local runtime, without containers")
        return task

    def context(self, request: dict[str, Any]) -> Any:
        config = request.get("client_config") or {}
        base_url, key_var = str(config.get("api_base_url")), str(config.get("api_key_var") or "PRIME_LAB_NO_KEY")
        sampling = dict(request.get("sampling_args") or {})
        train = wants_tokens(sampling)
        if train:
            where = (base_url, request["model"])
            if where not in self.folders:
                self.folders[where] = model_folder(base_url, request["model"])
            client = vf().TrainClientConfig(base_url=base_url, api_key_var=key_var,
                                            renderer_model_name=self.folders[where],
                                            renderer=train_renderer(self.folders[where]))
        else:
            client = vf().EvalClientConfig(base_url=base_url, api_key_var=key_var)
        return vf().ModelContext(model=request["model"], client=client, sampling=sampling_config(sampling, train))

    async def rollout(self, row: dict[str, Any], ctx: Any) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        (slot,) = self.env.slots(self.task(row), 1)
        episode = await self.env.run_slot(slot, ctx)
        return episode_output(episode, row, loop.time() - start)

    async def run_group(self, request: dict[str, Any]) -> list[dict[str, Any]]:
        await self.open()
        rows = request.get("group_inputs") or [request["input"]]
        ctx = self.context(request)
        return list(await asyncio.gather(*(self.rollout(row, ctx) for row in rows)))
