"""Rollouts of one step for the samples browser: read from rollouts/step_N.jsonl (bounded), or from the run's
`sample` events when the file is not there; answers parsed with the environment's own parser when it loads."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from prime_lab.envs import Parser
from prime_lab.workbench.dashboards.files import read_jsonl_from

MAX_ROLLOUTS = 500
MAX_BYTES = 16 << 20
_STEP_FILE = re.compile(r"^step_(\d+)\.jsonl$")


def rollout_steps(rollouts_dir: Path) -> list[int]:
    """Steps that have a rollouts file, in order."""
    try:
        names = [entry.name for entry in rollouts_dir.iterdir()]
    except OSError:
        return []
    return sorted(int(m.group(1)) for name in names if (m := _STEP_FILE.match(name)))


def read_rollouts(rollouts_dir: Path, step: int) -> list[dict[str, Any]] | None:
    """The first MAX_ROLLOUTS rollouts of a step (corrupt lines skipped); None when the step has no file."""
    path = rollouts_dir / f"step_{step}.jsonl"
    if not path.exists():
        return None
    records, _ = read_jsonl_from(path, 0, MAX_BYTES)
    return records[:MAX_ROLLOUTS]


def messages_text(messages: Any) -> str:
    if isinstance(messages, str):
        return messages
    if not isinstance(messages, list):
        return ""
    parts = []
    for message in messages:
        if isinstance(message, dict):
            parts.append(f"[{message.get('role', '?')}] {message.get('content') or ''}")
    return "\n".join(parts)


class EnvParsers:
    """The parser of each environment of a run, loaded once (in a worker: loading may build a dataset)."""

    def __init__(self, env_ids: Iterable[str]) -> None:
        self.env_ids = list(env_ids)
        self._parsers: dict[str, Parser | None] = {}
        self._lock = threading.Lock()

    def env_id(self, env: str) -> str:
        """The run's environment id for a rollout's `env` (an id or a short name)."""
        for env_id in self.env_ids:
            if env in (env_id, env_id.split("/")[-1]):
                return env_id
        return env or (self.env_ids[0] if self.env_ids else "")

    def known(self, env_id: str) -> bool:
        with self._lock:
            return env_id in self._parsers

    def get(self, env_id: str) -> Parser | None:
        with self._lock:
            return self._parsers.get(env_id)

    def load(self, env_id: str) -> Parser | None:
        """Load the environment and keep its parser (None when it does not load: raw text is shown)."""
        if self.known(env_id):
            return self.get(env_id)
        parser: Parser | None
        try:
            from prime_lab.envs import load_environment

            parser = load_environment(env_id).parser
        except Exception:  # an environment that does not load here: the browser shows the raw completion
            parser = None
        with self._lock:
            self._parsers[env_id] = parser
        return parser


def parsed_answer(parser: Parser | None, completion: Any) -> str | None:
    if parser is None:
        return None
    try:
        return parser.parse_answer(completion if isinstance(completion, (list, str)) else "")
    except Exception:  # a parser that fails on odd text: show the raw text instead
        return None
