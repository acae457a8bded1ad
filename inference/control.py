"""Load adapters and weights into a running engine: both engines (vLLM and the built-in server) answer the same
routes, so one client drives either.

- LoRA adapters (`RuntimeAdapters`): vLLM's runtime routes `/v1/load_lora_adapter` and `/v1/unload_lora_adapter`
  (vLLM needs `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`). vLLM keys its prefix cache by adapter name and path, so
  reloading changed files from the same path would reuse stale state: every new adapter version is loaded from a
  path the server has not seen under that name. An adapter on fused MoE experts (peft `target_parameters` in its
  adapter_config.json) is loaded with `is_3d_lora_weight` (`load_adapter_payload`): vLLM, started with
  `--enable-mixed-moe-lora-format`, then splits its 3-D expert tensors; the built-in server ignores the field.
- Full weights (`RuntimeWeights`): `/collective_rpc` runs `weights.UPDATE_METHOD` (in vLLM through our worker
  extension, `vllm_worker.py`), then `/reset_prefix_cache`; requests in flight carry a `cache_salt` per policy
  version (`policy_cache_salt`).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import uuid
from pathlib import Path

import httpx


class AdapterLoadError(RuntimeError):
    """The server refused to load or unload a LoRA adapter."""


class WeightLoadError(AdapterLoadError):
    """The server refused to load full weights (or does not offer the routes for it)."""


class RuntimeAdapters:
    """Load, replace in place and unload LoRA adapters through vLLM's runtime routes.

    Every `load(name, path)` hands the server a path it has not loaded under `name` before: when the same path
    comes again (a trainer that rewrites its adapter folder), the files are copied to a fresh folder under
    a temporary folder first. This avoids the prefix-cache trap (cached state keyed by name and path). The routes and
    payloads are vLLM's, so this also drives any server that speaks them.
    """

    def __init__(self, root_url: str, timeout: float = 120.0) -> None:
        self.root_url = root_url.rstrip("/")
        self.timeout = timeout
        self._copies: Path | None = None
        self.loaded: dict[str, Path] = {}
        self._seen: set[tuple[str, Path]] = set()

    def load(self, name: str, path: Path) -> Path:
        """Load the adapter at `path` as `name`, replacing an adapter of that name in place; return the path used."""
        path = Path(path).resolve()
        if (name, path) in self._seen:
            path = self._fresh_copy(name, path)
        self._post("/v1/load_lora_adapter", load_adapter_payload(name, path), f"load adapter {name!r} from {path}")
        self._seen.add((name, path))
        previous = self.loaded.get(name)
        self.loaded[name] = path
        self._discard_copy(previous)
        return path

    def unload(self, name: str) -> None:
        self._post("/v1/unload_lora_adapter", {"lora_name": name}, f"unload adapter {name!r}")
        self._discard_copy(self.loaded.pop(name, None))

    def discard_copies(self) -> None:
        """Delete the fresh copies made so far (call after the server is gone)."""
        if self._copies is not None:
            shutil.rmtree(self._copies, ignore_errors=True)
            self._copies = None

    def _fresh_copy(self, name: str, path: Path) -> Path:
        if self._copies is None:
            self._copies = Path(tempfile.mkdtemp(prefix="prime-lab-adapters-"))
        fresh = self._copies / name / uuid.uuid4().hex
        shutil.copytree(path, fresh)
        return fresh

    def _discard_copy(self, path: Path | None) -> None:
        if path is not None and self._copies is not None and path.is_relative_to(self._copies):
            shutil.rmtree(path, ignore_errors=True)

    def _post(self, route: str, payload: dict[str, object], what: str) -> None:
        post_json(self.root_url + route, payload, what, timeout=self.timeout, error=AdapterLoadError)


class RuntimeWeights:
    """Load full weights (a model folder of HF-named safetensors) into a running server, in place.

    `POST /collective_rpc` runs `weights.UPDATE_METHOD` between engine steps (in vLLM our worker extension, so the
    server must be started with `VLLMSettings.taking_full_weights()`; the built-in server has its own): requests in
    flight continue on the new weights from their next token, with the cache of what they hold so far. Then `POST
    /reset_prefix_cache` drops the cached prompt state computed with the old weights, which vLLM does only while no
    request holds cache blocks. A caller that keeps requests in flight across loads (an RL orchestrator) therefore
    also tags each request with `cache_salt` of its policy version (`policy_cache_salt`, prime-rl's way): a request
    never reuses blocks cached under another salt. (Resetting with `reset_running_requests=true` instead preempts
    the running requests, and vLLM's CPU build then crashes its engine on seeded ones: `CPU Generator does not use
    offset`.) The built-in server keeps no prompt state between requests and ignores the salt.
    """

    def __init__(self, root_url: str, timeout: float = 300.0) -> None:
        self.root_url = root_url.rstrip("/")
        self.timeout = timeout

    def load(self, path: Path) -> list[object]:
        """Load the folder's weights; returns each worker's report (vLLM: one per worker)."""
        from prime_lab.inference.weights import UPDATE_METHOD

        path = Path(path).resolve()
        loaded = post_json(
            self.root_url + "/collective_rpc", {"method": UPDATE_METHOD, "args": [str(path)]},
            f"load weights from {path}", timeout=self.timeout, error=WeightLoadError,
            hint="the server must take full weights at runtime: the built-in server, or vLLM started with "
                 "VLLMSettings.taking_full_weights() (our worker extension, VLLM_SERVER_DEV_MODE=1)")
        post_json(self.root_url + "/reset_prefix_cache", {}, f"reset the prefix cache after loading {path}",
                  timeout=self.timeout, error=WeightLoadError)
        results = _json(loaded).get("results")
        return list(results) if isinstance(results, list) else []


def load_adapter_payload(name: str, path: Path) -> dict[str, object]:
    """The body of `/v1/load_lora_adapter` for the adapter folder at `path`, loaded as `name` in place. An adapter
    on parameters (peft `target_parameters`: a MoE model's fused [experts, d1, d2] tensors) says so with vLLM's
    `is_3d_lora_weight`, without which vLLM reads its tensors as 2-D ones."""
    payload: dict[str, object] = {"lora_name": name, "lora_path": str(path), "load_inplace": True}
    if adapter_targets_parameters(path):
        payload["is_3d_lora_weight"] = True
    return payload


def adapter_targets_parameters(path: Path) -> bool:
    """Whether the adapter at `path` puts LoRA on parameters (a non-empty `target_parameters` in its
    adapter_config.json) rather than only on modules."""
    try:
        config = json.loads((Path(path) / "adapter_config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and bool(config.get("target_parameters"))


def policy_cache_salt(run_id: str, version: int) -> str:
    """The `cache_salt` of requests sampled with policy `version` of a run (vLLM keys its prefix cache by it)."""
    return f"{run_id}-policy-{version}"


def post_json(url: str, payload: dict[str, object], what: str, *, timeout: float, error: type[Exception],
              hint: str = "") -> httpx.Response:
    """POST `payload`; raise `error` saying what could not be done when the server does not answer 200 (adding
    `hint` when the server has no such route)."""
    try:
        response = httpx.post(url, json=payload, timeout=timeout)
    except httpx.HTTPError as exc:
        raise error(f"could not {what}: {url} did not answer ({exc})") from exc
    if response.status_code != 200:
        message = _error_message(response)
        no_route = response.status_code in (404, 405) and ("Not Found" in message or "Not Allowed" in message)
        suffix = f" ({hint})" if hint and no_route else ""
        raise error(f"could not {what}: HTTP {response.status_code}: {message}{suffix}")
    return response


def _json(response: httpx.Response) -> dict[str, object]:
    """The response's JSON object ({} for an empty or non-object body)."""
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _error_message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:500]
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and "message" in error:
        return str(error["message"])
    return str(body)[:500]
