"""The local sandbox as the built-in environments use it: one per rollout, Python run in it, what it printed.

A rollout's sandbox is created the first time its rollout needs one (`open_sandbox`, kept in the rollout's state)
and deleted when the rollout ends (`close_sandbox`, from `MultiTurnEnv.cleanup_state`); scoring that runs code
opens its own for the call (`scoring_sandbox`). Each follows the run's `[sandbox]` settings as its process received
them (sandbox/settings.py: network, isolation, memory, the run it belongs to); the built-ins always use the local
sandbox (prime_lab.sandbox.local), whatever the provider.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from prime_lab.sandbox import settings as sandbox_settings
from prime_lab.sandbox.local import CommandResult, Sandbox, SandboxSpec, create

SANDBOX = "sandbox"  # the rollout state's key for its sandbox (taken out when it is deleted)
SANDBOX_ID = "sandbox_id"  # the state's record of which sandbox the rollout had (stays)


def spec(name: str) -> SandboxSpec:
    """A sandbox for one rollout of the built-in `name`, with the run's [sandbox] settings."""
    given = sandbox_settings.from_environ()
    return SandboxSpec(name=name, network=given.network, isolation=given.isolation,
                       memory_gb=given.memory_gb or 1.0, run_dir=given.run_dir,
                       labels={"environment": name}, timeout_minutes=60)


async def made(name: str) -> Sandbox:
    """A new sandbox for the built-in `name`, made in a thread (the first one of an image makes its Python
    environment, a few seconds); one whose caller is cancelled meanwhile is deleted, not left behind."""
    lock = threading.Lock()
    held: dict[str, Any] = {"abandoned": False, "sandbox": None}

    def make() -> Sandbox | None:
        sandbox = create(spec(name))
        with lock:
            if not held["abandoned"]:
                held["sandbox"] = sandbox
                return sandbox
        sandbox.delete()
        return None

    try:
        sandbox = await asyncio.to_thread(make)
    except asyncio.CancelledError:
        with lock:
            held["abandoned"] = True
            left = held["sandbox"]
        if left is not None:
            left.delete()
        raise
    assert sandbox is not None  # only an abandoned one is None, and its caller is gone
    return sandbox


async def open_sandbox(state: dict[str, Any], name: str) -> Sandbox:
    """The rollout's sandbox, made at the first call (a SandboxError when it cannot be: the rollout fails)."""
    sandbox = state.get(SANDBOX)
    if sandbox is None:
        sandbox = state[SANDBOX] = await made(name)
        state[SANDBOX_ID] = sandbox.id
    return sandbox  # type: ignore[no-any-return]


async def close_sandbox(state: dict[str, Any]) -> None:
    """Delete the rollout's sandbox, if it opened one (in a thread, which finishes even when the rollout is
    cancelled meanwhile)."""
    sandbox = state.pop(SANDBOX, None)
    if sandbox is not None:
        await asyncio.to_thread(sandbox.delete)


@asynccontextmanager
async def scoring_sandbox(name: str) -> AsyncIterator[Sandbox]:
    """A sandbox for one scoring call, deleted after it whatever happens."""
    sandbox = await made(name)
    try:
        yield sandbox
    finally:
        await asyncio.to_thread(sandbox.delete)


async def run_python(sandbox: Sandbox, code: str, filename: str, timeout: float,
                     args: str = "") -> CommandResult:
    """`code` written to `filename` in the sandbox's /app and run with its Python, cut after `timeout` seconds."""
    sandbox.write_file(f"/app/{filename}", code.encode())
    return await sandbox.aexecute(f"python {filename} {args}".rstrip(), timeout=timeout)


def clip(text: str, limit: int) -> str:
    """`text`, its first `limit` characters and a note where it was longer."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n... (cut: {len(text)} characters in all, the first {limit} shown)"


def tool_output(result: CommandResult, limit: int, timeout: float) -> str:
    """What a command gave, as a tool's answer to the model: its stdout, its stderr and a non-zero exit code, each
    output cut at `limit` characters."""
    parts = []
    if result.stdout:
        parts.append(clip(result.stdout, limit).rstrip("\n"))
    if result.stderr:
        parts.append("stderr:\n" + clip(result.stderr, limit).rstrip("\n"))
    if result.timed_out:
        parts.append(f"timed out after {timeout:g} s: the process was killed")
    elif result.oom:
        parts.append("killed: out of memory")
    elif result.exit_code != 0:
        parts.append(f"exit code: {result.exit_code}")
    return "\n".join(parts) or "(no output: print() what you want to see)"
