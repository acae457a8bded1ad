"""envs/driver_v1.py's pure parts: which folder the train client's renderer reads the tokenizer from (a server's
/v1/models, as vLLM and prime-lab's server answer it), and a v1 trace's sampled nodes as trajectory steps."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

import prime_lab.envs.driver_v1 as driver_v1
from prime_lab.envs.driver import jsonable, sandbox_package
from prime_lab.envs.driver_v1 import model_folder, trajectory


@pytest.fixture
def models_listing() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    listed: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = json.dumps({"object": "list", "data": listed}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1", listed
    server.shutdown()


def test_the_renderer_reads_the_base_models_folder(models_listing: tuple[str, list[dict[str, Any]]],
                                                   tmp_path: Path) -> None:
    url, listed = models_listing
    base, adapter = tmp_path / "base", tmp_path / "adapter"
    base.mkdir()
    adapter.mkdir()
    listed += [{"id": "tiny", "root": str(base), "parent": None},
               {"id": "policy", "root": str(adapter), "parent": "tiny"}]  # vLLM's shape for a LoRA adapter
    assert model_folder(url, "tiny") == str(base)
    assert model_folder(url, "policy") == str(base)  # the adapter's folder may hold no tokenizer: its base's
    listed[:] = [{"id": "hub/name", "root": "hub/name"}, {"id": "local", "root": str(base)}]
    assert model_folder(url, "hub/name") == str(base)  # a Hub id is no folder: the one folder served
    listed[:] = [{"id": "hub/name", "root": "hub/name"}]
    assert model_folder(url, "hub/name") is None
    assert model_folder("http://127.0.0.1:9/v1", "tiny") is None  # nothing listens: the renderer's own default


def node(message: dict[str, Any], parent: int | None, ids: list[int] | None = None, mask: list[bool] | None = None,
         logprobs: list[float] | None = None) -> SimpleNamespace:
    return SimpleNamespace(message=message, parent=parent, sampled=bool(mask and any(mask)), token_ids=ids,
                           mask=mask, logprobs=logprobs)


def test_each_sampled_node_is_a_step_whose_prompt_is_everything_before_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two turns: the second turn's prompt ids are the first turn's ids (prompt, header, answer, end) and the user's
    follow-up and the new header; its completion ids are only its sampled (masked) ids, with their logprobs."""
    monkeypatch.setattr(driver_v1, "jsonable", jsonable)
    nodes = [node({"role": "user", "content": "hi"}, None, [1, 2, 3], [False] * 3),
             node({"role": "assistant", "content": "a b"}, 0, [9, 10, 11, 12], [False, True, True, False],
                  [-0.1, -0.2]),
             node({"role": "user", "content": "more"}, 1, [4, 5], [False, False]),
             node({"role": "assistant", "content": "c"}, 2, [9, 13], [False, True], [-0.3])]
    steps = trajectory(SimpleNamespace(nodes=nodes), {1: "stop", 3: "length"})
    assert [s["tokens"] for s in steps] == [
        {"prompt_ids": [1, 2, 3, 9], "prompt_mask": [0] * 4, "completion_ids": [10, 11], "completion_mask": [1, 1],
         "completion_logprobs": [-0.1, -0.2]},
        {"prompt_ids": [1, 2, 3, 9, 10, 11, 12, 4, 5, 9], "prompt_mask": [0] * 10, "completion_ids": [13],
         "completion_mask": [1], "completion_logprobs": [-0.3]}]
    assert [s["response"]["message"]["finish_reason"] for s in steps] == ["stop", "length"]
    assert [len(s["prompt"]) for s in steps] == [1, 3] and steps[1]["completion"] == [{"role": "assistant",
                                                                                      "content": "c"}]
    # an eval client's trace keeps no ids: steps without tokens
    bare = [node({"role": "user", "content": "hi"}, None), SimpleNamespace(message={"role": "assistant"}, parent=0,
                                                                           sampled=True, token_ids=None, mask=None,
                                                                           logprobs=None)]
    assert [s["tokens"] for s in trajectory(SimpleNamespace(nodes=bare), {})] == [None]


def test_the_bash_harness_is_refused_where_its_runtime_cannot_be_sandboxed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A v1 release without 0.4.0's runtime chooser would run the bash harness on verifiers' own subprocess runtime,
    the model's commands on this machine: refused, naming the release to use. With the chooser, the sandbox's own
    check decides (here: weak isolation, which needs no bubblewrap)."""
    runtimes = ModuleType("verifiers.v1.runtimes")
    for name, module in (("verifiers", ModuleType("verifiers")), ("verifiers.v1", ModuleType("verifiers.v1")),
                         ("verifiers.v1.runtimes", runtimes)):
        monkeypatch.setitem(sys.modules, name, module)
    problem = driver_v1.sandbox_problem()
    assert problem is not None and "install the taskset at verifiers 0.4.0" in problem
    runtimes._runtime_cls = lambda config: None  # type: ignore[attr-defined]
    monkeypatch.setattr(driver_v1, "sandbox_package", sandbox_package)
    monkeypatch.setenv("PRIME_LAB_SANDBOX_ISOLATION", "weak")
    assert driver_v1.sandbox_problem() is None
