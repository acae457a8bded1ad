"""The driver of an isolated environment: runs inside the environment's own interpreter, at its own verifiers release.

It imports only the standard library, verifiers (with what verifiers itself imports: openai, pydantic) and the
transport (pyzmq, msgpack; installed into every release's virtual environment), never prime-lab: it is run by
path, isolated from the caller's `PYTHONPATH` and from this folder's modules (`RELEASE_PYTHON -I .../driver.py COMMAND
...`). Three commands:

- `check MODULE OUT`: import the environment's module; write what failed (the missing module or name) if it does not,
  else its `load_environment` arguments and docstring.
- `describe MODULE ARGS_JSON OUT`: build the environment as the release builds it and write, as JSON, its dataset
  rows (after its own formatting), system prompt, sampling arguments, message type, parser format, rubric (reward
  function names and weights) and its own rollout time limit: what prime-lab's side needs besides rollouts.
- `serve MODULE ARGS_JSON ADDRESS LOG_DIR`: serve rollouts over ZMQ + msgpack in verifiers' environment-server
  protocol (`run_group` / `run_rollout` requests carrying the inputs, a `client_config` the server builds its own
  OpenAI client from, the model, sampling args and state columns; `b"ping"` for health; an empty payload cancels the
  request of that id: its task is cancelled, and with it the group's rollouts and their model requests). Releases
  that ship a server (`ZMQEnvServer`, 0.1.10 on) run their own; older ones (0.1.5 - 0.1.9) run ours, which speaks the
  same protocol, so prime-lab's client is one whatever the release. 0.1.8 and 0.1.9 run a group with their own
  `run_group`; 0.1.5 - 0.1.7 have none, and ours runs each rollout and scores it as their own evaluation does
  (`rollout`, then `rubric.score_rollout`), rebuilding from the state's `responses` the trajectory (each model call's
  tokens and logprobs) that later releases keep.

The environment is built before any event loop runs (an environment's `load_environment` may run its own with
`asyncio.get_event_loop().run_until_complete(...)`, as gpu_puzzles does), on the standard library's loop.

A failed `check` or `describe` writes its error with the chain of errors that caused it (`errors`, in the lines
prime-lab's hub.py reads: a Hub dataset out of reach gets the same message and fix as in prime-lab's process) and
the load function's arguments with their values.

Before any of them imports the environment, `import prime_sandboxes` is made to give prime-lab's local sandboxes
(unless the run's `[sandbox] provider` is "prime"): `local_sandboxes` loads prime-lab's sandbox folder, beside this
one, by path as the package `_prime_lab_sandbox` (its shim, settings and core import only the standard library) and
installs its shim; so does a worker verifiers' server starts with multiprocessing's spawn (0.3.1), which runs this
file as `__mp_main__` before it loads the environment.

The server process leads its own process group; when the process that started it dies it ends that whole group
(verifiers' servers fork workers), so nothing outlives the run, the evaluation or the GEPA run it serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import importlib
import inspect
import json
import os
import signal
import sys
import threading
import time
import traceback
import types
from typing import Any

SANDBOX_FOLDER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sandbox")
SANDBOX_PACKAGE = "_prime_lab_sandbox"  # prime-lab's sandbox folder, by path: `prime_lab` is not importable here
SERVER_MODULES = (  # where each release keeps its classic environment server
    "verifiers.serve.server.zmq_env_server",  # 0.1.12 - 0.3.0
    "verifiers.legacy.serve.server.zmq_env_server",  # 0.3.1
    "verifiers.workers.server.zmq_env_server",  # 0.1.10, 0.1.11
)


def release() -> str:
    from importlib.metadata import version

    return version("verifiers")


def jsonable(obj: Any) -> Any:
    """Plain data for JSON and msgpack: pydantic models dumped, tuples as lists, the rest as text."""
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    dump = getattr(obj, "model_dump", None)
    if callable(dump):
        return jsonable(dump())
    if isinstance(obj, BaseException):
        return f"{type(obj).__name__}: {obj}"
    for plain in ("tolist", "item"):  # numpy arrays (0.4.1 keeps token ids in them) and scalars
        convert = getattr(obj, plain, None)
        if callable(convert):
            with contextlib.suppress(Exception):
                return jsonable(convert())
    return str(obj)


def sandbox_package() -> bool:
    """prime-lab's sandbox folder registered as the package SANDBOX_PACKAGE (False where it is not beside this
    file)."""
    if not os.path.isfile(os.path.join(SANDBOX_FOLDER, "shim.py")):
        return False
    package = types.ModuleType(SANDBOX_PACKAGE)
    package.__path__ = [SANDBOX_FOLDER]
    sys.modules.setdefault(SANDBOX_PACKAGE, package)
    return True


def local_sandboxes() -> None:
    """`import prime_sandboxes` gives prime-lab's local sandboxes (prime-lab's sandbox/shim.py, by path)."""
    if not sandbox_package():
        return
    try:
        importlib.import_module(f"{SANDBOX_PACKAGE}.shim").install()
    except Exception as exc:  # noqa: BLE001 - said in the server's log; the environment still loads
        print(f"driver: prime-lab's local sandboxes could not be installed in this interpreter "
              f"({type(exc).__name__}: {exc}); prime_sandboxes stays Prime's hosted client", file=sys.stderr)


# check -------------------------------------------------------------------------------------------------------------

def check(module: str) -> dict[str, Any]:
    try:
        importlib.import_module(module)
    except BaseException as exc:  # noqa: BLE001 - any failure to import is the answer
        return failure(exc, module, {})
    load_fn = getattr(sys.modules[module], "load_environment", None)
    if not callable(load_fn):
        return {"ok": False, "release": release(), "import_error": False, "missing": None, "where": "",
                "error": f"module '{module}' has no load_environment() function"}
    doc = " ".join((inspect.getdoc(sys.modules[module]) or "").split("\n\n")[0].split())
    parameters = inspect.signature(load_fn).parameters.values()
    return {"ok": True, "release": release(), "doc": doc, "file": getattr(sys.modules[module], "__file__", None),
            "any_args": any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters),
            "args": [[p.name, None if p.default is inspect.Parameter.empty else jsonable(p.default),
                      p.default is inspect.Parameter.empty,
                      p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__", "")]
                     for p in parameters
                     if p.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)]}


def error_chain(exc: BaseException) -> list[str]:
    """`exc` and what caused it, outermost first, each as a traceback's last line (`package.module.Type: message`,
    a builtin as `Type: message`). The same lines as prime-lab's `hub.error_lines`, which cannot be imported here;
    prime-lab reads them (`hub.driver_failure_message`)."""
    lines: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        kind = type(current)
        name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
        text = str(current)
        lines.append(f"{name}: {text}" if text else name)
        current = current.__cause__ or current.__context__
    return lines


def load_arguments(module: str, args: dict[str, Any]) -> dict[str, Any]:
    """`load_environment`'s arguments for this load: its defaults, then `args` (just `args` when the module did not
    import)."""
    load_fn = getattr(sys.modules.get(module), "load_environment", None)
    defaults: dict[str, Any] = {}
    with contextlib.suppress(TypeError, ValueError):
        if load_fn is not None:
            defaults = {p.name: jsonable(p.default) for p in inspect.signature(load_fn).parameters.values()
                        if p.default is not inspect.Parameter.empty
                        and p.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)}
    return {**defaults, **jsonable(args)}


def _where(exc: BaseException, module: str) -> str:
    """`file:line` of the environment's own frame that failed (else the innermost)."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if os.path.basename(f.filename).startswith(module.split(".")[0])]
    chosen = own or list(frames)
    return f"{os.path.basename(chosen[-1].filename)}:{chosen[-1].lineno}" if chosen else ""


# describe ----------------------------------------------------------------------------------------------------------

def load(module: str, args: dict[str, Any]) -> Any:
    import verifiers as vf

    loader: Any = getattr(vf, "load_environment", None)
    if loader is None:
        loader = importlib.import_module("verifiers.utils.env_utils").load_environment
    return loader(module, **args)


def dataset_rows(env: Any, split: str) -> list[dict[str, Any]] | None:
    """A split's rows as the release formats them (None when the environment has no such split)."""
    if getattr(env, split, None) is None and getattr(env, f"{split}_source", None) is None:
        return None
    dataset = getattr(env, f"get_{split}")()
    rows = dataset.to_list() if hasattr(dataset, "to_list") else list(dataset)
    return [jsonable(r) for r in rows]


def rubric_of(env: Any) -> dict[str, Any]:
    """Its reward functions' names and weights: `_get_reward_funcs()` (0.1.8 on), `get_reward_funcs()` (0.1.5 -
    0.1.7, whose Rubric keeps `reward_funcs`)."""
    rubric = env.rubric
    for own in ("_get_reward_", "get_reward_"):
        with contextlib.suppress(Exception):  # a rubric of another shape
            funcs, weights = list(getattr(rubric, own + "funcs")()), list(getattr(rubric, own + "weights")())
            break
    else:
        funcs, weights = list(getattr(rubric, "reward_funcs", []) or []), []
    names = [getattr(f, "__name__", type(f).__name__) for f in funcs]
    return {"names": names, "weights": [float(w) for w in weights] if len(weights) == len(names) else None}


def time_limit(env: Any) -> float | None:
    """The environment's own limit on one rollout, in seconds: its `timeout_seconds` (verifiers' MultiTurnEnv has one
    in 0.3.1; 0.1.9 to 0.1.12 have none); None when it sets none."""
    value = getattr(env, "timeout_seconds", None)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return None
    return float(value)


def tools_of(env: Any) -> list[Any]:
    """The tools the environment sends with its requests: `tool_defs` (vf.Tool, 0.2 on) or `oai_tools` (0.1),
    as plain data (prime-lab checks that the model's chat template shows them: envs/tool_prompt.py)."""
    return jsonable(list(getattr(env, "tool_defs", None) or getattr(env, "oai_tools", None) or []))


def describe(module: str, args: dict[str, Any]) -> dict[str, Any]:
    env = load(module, args)
    load_fn = getattr(sys.modules.get(module), "load_environment", None)
    takes_prompt = False
    with contextlib.suppress(TypeError, ValueError):
        takes_prompt = load_fn is not None and "system_prompt" in inspect.signature(load_fn).parameters
    parser = getattr(env, "parser", None)
    fmt = getattr(parser, "get_format_str", None)
    return {"release": release(), "system_prompt": getattr(env, "system_prompt", None),
            "sampling_args": jsonable(dict(getattr(env, "sampling_args", None) or {})),
            "message_type": getattr(env, "message_type", "chat"), "takes_system_prompt": takes_prompt,
            "parser": {"format": str(fmt()) if callable(fmt) else ""}, "rubric": rubric_of(env),
            "timeout_seconds": time_limit(env), "tools": tools_of(env),
            "dataset": dataset_rows(env, "dataset"), "eval_dataset": dataset_rows(env, "eval_dataset")}


# serve -------------------------------------------------------------------------------------------------------------

def end_group_with_parent() -> None:
    """When the process that started this one dies, end this process group (workers included)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        with contextlib.suppress(OSError):
            os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, daemon=True).start()


def verifiers_server() -> Any:
    """This release's own ZMQEnvServer class, or None before 0.1.10."""
    for name in SERVER_MODULES:
        try:
            return importlib.import_module(name).ZMQEnvServer
        except ImportError:
            continue
    return None


def run_verifiers_server(cls: Any, module: str, args: dict[str, Any], address: str, log_dir: str) -> None:
    accepted: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is not None:
            accepted |= set(inspect.signature(init).parameters)
    options: dict[str, Any] = {"env_id": module, "env_args": args, "address": address}
    if "log_dir" in accepted:
        options["log_dir"] = log_dir
    if "log_file" in accepted:  # 0.1.10 writes logs/<env>.log under the working folder otherwise
        options["log_file"] = os.path.join(log_dir, "env_server.log")
    print(f"driver: verifiers {release()} serving {module} with its own {cls.__module__}.ZMQEnvServer on {address}",
          flush=True)
    cls.run_server(**options)


def state_output(state: Any, columns: list[str]) -> dict[str, Any]:
    """A finished state of a release without `state_to_output` (0.1.5 - 0.1.9) as a RolloutOutput-shaped dict."""
    keys = ("example_id", "prompt", "completion", "answer", "task", "info", "reward", "metrics", "is_truncated",
            "stop_condition", "timing", "error")
    out = {k: jsonable(state.get(k)) for k in keys}
    for column in columns:
        out[column] = jsonable(state.get(column))
    return out


def _get(obj: Any, name: str) -> Any:
    """A field of a value that is a dict or an object (openai's models keep vLLM's extra fields as attributes)."""
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def response_tokens(response: Any) -> dict[str, Any] | None:
    """The token ids and logprobs a chat completion carries when the request asked for them (vLLM's
    `prompt_token_ids`, the choice's `token_ids` and `logprobs.content`), in verifiers' TrajectoryStepTokens shape;
    None without them."""
    choice = (_get(response, "choices") or [None])[0]
    prompt_ids, completion_ids = _get(response, "prompt_token_ids"), _get(choice, "token_ids")
    content = _get(_get(choice, "logprobs"), "content")
    if prompt_ids is None or completion_ids is None or content is None:
        return None
    return {"prompt_ids": list(prompt_ids), "prompt_mask": [0] * len(prompt_ids),
            "completion_ids": list(completion_ids), "completion_mask": [1] * len(completion_ids),
            "completion_logprobs": [_get(token, "logprob") for token in content]}


def classic_trajectory(prompt: Any, completion: Any, responses: list[Any]) -> list[dict[str, Any]]:
    """The trajectory a release before 0.1.8 does not keep, from its state's `responses`: one step per model call,
    with the messages it was sent (the prompt and the completion before its answer), its answer, its finish reason
    and its tokens."""
    answers = [i for i, m in enumerate(completion) if _get(m, "role") == "assistant"] \
        if isinstance(completion, list) else []
    steps = []
    for k, response in enumerate(responses):
        at = answers[k] if k < len(answers) else None
        before = completion[:at] if at is not None else []
        choice = (_get(response, "choices") or [None])[0]
        steps.append({"prompt": [*prompt, *before] if isinstance(prompt, list) else prompt,
                      "completion": completion[at:at + 1] if at is not None else [],
                      "response": {"message": {"finish_reason": _get(choice, "finish_reason")}},
                      "tokens": response_tokens(response)})
    return steps


def _accepted(function: Any, arguments: dict[str, Any]) -> dict[str, Any]:
    """Those of `arguments` that `function` names as parameters (its `**kwargs` would pass the rest on)."""
    named = {name for name, p in inspect.signature(function).parameters.items()
             if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}
    return {k: v for k, v in arguments.items() if k in named}


async def classic_rollout(env: Any, row: dict[str, Any], client: Any, model: str, sampling_args: dict[str, Any],
                          columns: list[str]) -> dict[str, Any]:
    """One rollout of a release without `run_group` (0.1.5 - 0.1.7), scored, as a RolloutOutput-shaped dict: the
    state from `init_state` (0.1.6 on), `rollout` -> (completion, state), `rubric.score_rollout` -> RolloutScore,
    each called with the arguments its release names (0.1.5's rollout takes no completion, state or example id). An
    `info` the dataset keeps as JSON text is read first, and the environment's tools put in it, as the release's own
    evaluation does."""
    info = row.get("info") or {}
    if isinstance(info, str):
        info = json.loads(info) if info.strip() else {}
    if getattr(env, "oai_tools", None) and "oai_tools" not in info:  # where their rollout reads the tools from
        info = {**info, "oai_tools": env.oai_tools}
    prompt, answer = row["prompt"], row.get("answer") or ""
    task, example_id = row.get("task") or "default", row.get("example_id") or 0
    completion: Any = [] if getattr(env, "message_type", "chat") == "chat" else ""
    arguments: dict[str, Any] = {"completion": completion, "answer": answer, "task": task, "info": info,
                                 "example_id": example_id, "sampling_args": copy.deepcopy(sampling_args)}
    if callable(getattr(env, "init_state", None)):
        arguments["state"] = await env.init_state(prompt, completion, answer, task, info, example_id)
    completion, state = await env.rollout(client, model, prompt, **_accepted(env.rollout, arguments))
    scored = {"prompt": prompt, "completion": completion, "answer": answer, "state": state, "task": task,
              "info": info, "example_id": example_id}
    score = await env.rubric.score_rollout(**_accepted(env.rubric.score_rollout, scored))
    steps = classic_trajectory(prompt, completion, list(state.get("responses") or []))
    too_long = bool(state.get("prompt_too_long"))
    state.update(example_id=example_id, prompt=prompt, completion=completion, answer=answer, task=task, info=info,
                 reward=score.reward, metrics=dict(score.metrics), trajectory=steps,
                 is_truncated=too_long or any(s["response"]["message"]["finish_reason"] == "length" for s in steps),
                 stop_condition="prompt_too_long" if too_long else None)
    return state_output(state, columns)


class Driver:
    """Our server for releases without one: verifiers' request and response shapes over a ZMQ ROUTER socket.
    0.1.8 and 0.1.9 run a group with their own `run_group`; 0.1.5 - 0.1.7, which have none, a rollout at a time
    (`classic_rollout`), the group's rollouts at once."""

    def __init__(self, module: str, args: dict[str, Any], address: str, runner: Any = None) -> None:
        self.runner = runner  # a v1 taskset's (driver_v1.Runner): it runs the groups
        self.env = load(module, args) if runner is None else None
        self.address = address
        self.clients: dict[tuple[str, str], Any] = {}
        self.tasks: dict[tuple[bytes, bytes], asyncio.Task[None]] = {}  # requests at work, by (client, request id)

    def client(self, config: dict[str, Any]) -> Any:
        from openai import AsyncOpenAI

        key = (str(config.get("api_base_url")), str(config.get("api_key_var") or ""))
        if key not in self.clients:
            self.clients[key] = AsyncOpenAI(base_url=key[0], api_key=os.environ.get(key[1]) or "EMPTY",
                                            timeout=float(config.get("timeout") or 3600.0), max_retries=0)
        return self.clients[key]

    async def run_group(self, request: dict[str, Any]) -> list[dict[str, Any]]:
        if self.runner is not None:
            return list(await self.runner.run_group(request))
        inputs = request.get("group_inputs") or [request["input"]]
        columns = list(request.get("state_columns") or [])
        client = self.client(request.get("client_config") or {})
        run_group = getattr(self.env, "run_group", None)
        if run_group is None:  # 0.1.5 - 0.1.7
            return list(await asyncio.gather(*(
                classic_rollout(self.env, row, client, request["model"], request.get("sampling_args") or {}, columns)
                for row in inputs)))
        if "gen_sem" in inspect.signature(run_group).parameters:  # 0.1.8, 0.1.9: semaphores, states back
            free = contextlib.AsyncExitStack()
            states = await run_group(inputs, client, request["model"], request.get("sampling_args") or {}, free,
                                     free)
            return [state_output(s, columns) for s in states]
        outputs = await run_group(inputs, client, request["model"], request.get("sampling_args") or {},
                                  state_columns=columns)
        return [jsonable(o) for o in outputs]

    async def answer(self, socket: Any, client_id: bytes, request_id: bytes, payload: bytes) -> None:
        import msgpack

        try:
            request = msgpack.unpackb(payload, raw=False)
            kind = request.get("request_type")
            if kind not in ("run_group", "run_rollout"):
                raise ValueError(f"unknown request type {kind!r}")
            outputs = await self.run_group(request)
            response: dict[str, Any] = {"success": True, "error": None}
            response.update({"outputs": outputs} if kind == "run_group" else {"output": outputs[0]})
        except asyncio.CancelledError:
            return
        except Exception as exc:  # the environment's own failure: the client fails these rollouts with it
            response = {"success": False, "error": f"{type(exc).__name__}: {exc} (verifiers {release()})"}
            traceback.print_exc()
        await socket.send_multipart([client_id, request_id, msgpack.packb(response, use_bin_type=True)])

    def forget(self, key: tuple[bytes, bytes], task: asyncio.Task[None]) -> None:
        """A request's task is done: no cancel reaches it any more (a request id sent again is a new one)."""
        if self.tasks.get(key) is task:
            del self.tasks[key]

    async def serve(self) -> None:
        import msgpack
        import zmq
        import zmq.asyncio

        context = zmq.asyncio.Context()
        socket = context.socket(zmq.ROUTER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.bind(self.address)
        print(f"driver: verifiers {release()} serving with prime-lab's driver on {self.address}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        health = msgpack.packb({"success": True, "error": None}, use_bin_type=True)
        while not stop.is_set():
            if not await socket.poll(100):
                continue
            frames = await socket.recv_multipart()
            if len(frames) != 3:
                continue
            client_id, request_id, payload = frames
            key = (client_id, request_id)
            if payload == b"ping":
                await socket.send_multipart([client_id, request_id, health])
            elif not payload:  # verifiers' cancel: the request's task ends, its model requests with it
                task = self.tasks.pop(key, None)
                if task is not None:
                    task.cancel()
                    print(f"driver: request {request_id.decode(errors='replace')} cancelled by its client", flush=True)
            else:
                task = asyncio.create_task(self.answer(socket, client_id, request_id, payload))
                self.tasks[key] = task
                task.add_done_callback(functools.partial(self.forget, key))
        if self.runner is not None:
            await self.runner.close()
        socket.close()
        context.term()


def v1_driver() -> Any:
    """driver_v1.py (beside this file, loaded by path) when this interpreter's verifiers is a v1 release (0.4 on,
    whose package holds no classic API), else None."""
    try:
        if tuple(int(part) for part in release().split(".")[:2]) < (0, 4):
            return None
    except ValueError:
        return None
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "driver_v1.py")
    spec = importlib.util.spec_from_file_location("_prime_lab_driver_v1", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    module.jsonable = jsonable  # type: ignore[attr-defined]
    module.sandbox_package = sandbox_package  # type: ignore[attr-defined]
    module.offline_uv()
    return module


def failure(exc: BaseException, module: str, load_args: dict[str, Any]) -> dict[str, Any]:
    """What a failed `check` or `describe` writes (prime-lab says it, with what to do)."""
    return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "where": _where(exc, module), "release": release(),
            "import_error": isinstance(exc, ImportError | AttributeError),
            "missing": getattr(exc, "name", None) if isinstance(exc, ImportError) else None,
            "errors": error_chain(exc), "arguments": load_arguments(module, load_args)}


def serve(module: str, args: dict[str, Any], address: str, log_dir: str) -> None:
    end_group_with_parent()
    v1 = v1_driver()
    if v1 is not None:
        print(f"driver: verifiers {release()} serving the v1 taskset {module} (prime-lab's driver_v1)", flush=True)
        asyncio.run(Driver(module, args, address, runner=v1.Runner(module, args)).serve())
        return
    cls = verifiers_server()
    if cls is not None:
        run_verifiers_server(cls, module, args, address, log_dir)
    else:
        asyncio.run(Driver(module, args, address).serve())


def main(argv: list[str]) -> int:
    command, module, *rest = argv
    local_sandboxes()
    if command in ("check", "describe"):  # the answer goes to a file: the environment may print on stdout
        *args, out = rest
        v1 = v1_driver()
        load_args: dict[str, Any] = {}
        try:
            if command == "check":
                result = check(module) if v1 is None else v1.check(module, release())
            else:
                load_args = json.loads(args[0])
                result = describe(module, load_args) if v1 is None else v1.describe(module, load_args, release())
        except BaseException as exc:  # noqa: BLE001 - reported to prime-lab, which says what to do
            result = failure(exc, module, load_args)
        with open(out, "w", encoding="utf-8") as handle:
            json.dump(result, handle)
        return 0
    if command == "serve":
        args_json, address, log_dir = rest
        serve(module, json.loads(args_json), address, log_dir)
        return 0
    print(f"driver: unknown command {command!r}", file=sys.stderr)
    return 2


if __name__ == "__mp_main__":  # a process started with multiprocessing's spawn (verifiers 0.3.1's env workers) runs
    local_sandboxes()  # this file under that name before it loads the environment: prime_sandboxes is local there too

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
