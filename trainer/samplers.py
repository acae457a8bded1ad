"""The sampler servers an orchestrator spreads its requests over: one or several OpenAI-compatible URLs.

Each group of rollouts goes to one server (its rollouts share a prompt, which then sits in one server's prefix
cache): the one with the fewest rollouts in flight, ties taken in turn. A new policy version goes into every
server, side by side, before the orchestrator uses it (`on_every_server`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prime_lab.inference.control import RuntimeAdapters, RuntimeWeights

if TYPE_CHECKING:
    from openai import AsyncOpenAI


@dataclass
class SamplerServer:
    base_url: str  # the OpenAI base URL (ends in /v1)
    client: AsyncOpenAI
    adapters: RuntimeAdapters = field(init=False)
    weights: RuntimeWeights = field(init=False)
    in_flight: int = 0  # rollouts sent and not answered yet
    started: int = 0  # rollouts sent since the last `take_counts`

    def __post_init__(self) -> None:
        self.adapters = RuntimeAdapters(self.root_url)
        self.weights = RuntimeWeights(self.root_url)

    @property
    def root_url(self) -> str:
        """Without `/v1`: where `/health` and the adapter routes are."""
        return self.base_url.rstrip("/").removesuffix("/v1")


class SamplerPool:
    def __init__(self, base_urls: Sequence[str], *, api_key: str, timeout: float, max_retries: int = 1) -> None:
        from openai import AsyncOpenAI

        if not base_urls:
            raise ValueError("a sampler pool needs at least one base URL")
        self.servers = [SamplerServer(url, AsyncOpenAI(base_url=url, api_key=api_key, timeout=timeout,
                                                       max_retries=max_retries)) for url in base_urls]
        self._turn = 0  # the next server to take a tie

    def __len__(self) -> int:
        return len(self.servers)

    def describe(self) -> str:
        return ", ".join(s.base_url for s in self.servers)

    def pick(self, rollouts: int) -> SamplerServer:
        """The server for a group of `rollouts`: the fewest rollouts in flight, ties in turn. Counts them in."""
        n = len(self.servers)
        index = min(range(n), key=lambda i: (self.servers[i].in_flight, (i - self._turn) % n))
        self._turn = (index + 1) % n
        server = self.servers[index]
        server.in_flight += rollouts
        server.started += rollouts
        return server

    def take_counts(self) -> list[int]:
        """Rollouts sent to each server since the last call."""
        counts = [s.started for s in self.servers]
        for s in self.servers:
            s.started = 0
        return counts

    def on_every_server(self, action: Callable[[SamplerServer], object]) -> None:
        """Run `action` on every server at once and wait for all of them; the first error (in server order) is
        raised after all have finished."""
        if len(self.servers) == 1:
            action(self.servers[0])
            return
        with ThreadPoolExecutor(max_workers=len(self.servers)) as threads:
            futures = [threads.submit(action, s) for s in self.servers]
        for future in futures:
            future.result()

    async def close(self) -> None:
        for s in self.servers:
            await s.client.close()
