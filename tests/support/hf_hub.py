"""A loopback Hugging Face Hub for tests: a stdlib HTTP server on 127.0.0.1 speaking what huggingface_hub 2.4.0
(`snapshot_download`, `hf_hub_download`, `HfApi.model_info`) and datasets call (../shared/notes/hubs.md):

- `GET /api/{models,datasets}/{repo}[/revision/{rev}]`: `id`, `sha`, `siblings`, `gated` (no revision: `main`);
- `GET /api/{models,datasets}/{repo}/tree/{rev}[/{folder}]`: the folder's files (`type`, `path`, `size`, `oid`) and
  folders (`type: directory`), its direct children or, with `recursive=true`, everything below it, in one page (a
  folder that is not there: `EntryNotFound`), as `snapshot_download` and `datasets` (through `HfFileSystem`) list;
- `HEAD`/`GET /{repo}/resolve/{rev}/{path}` (`/datasets/{repo}/resolve/...` for datasets): `X-Repo-Commit`, `ETag`,
  `Content-Length`, `X-Linked-Size`; `Range` answered with 206;
- errors as the Hub gives them, with `X-Error-Code`: `RepoNotFound` (404), `RevisionNotFound` (404),
  `EntryNotFound` (404), `GatedRepo` (401 without the repo's token);
- anything else (`HEAD /`, `/api/agent-harnesses`): 404 without an error code, an answer all the same.

A file's content is bytes, or a `Path` served from disk with `sendfile` (a benchmark's large weights; its hashes are
read once, when the repo is made). `HubRepo.drop_after` cuts the connection after that many bytes of a file's first
GET (a dropped download); `HubRepo.stall_after` sends that many bytes of its first GET and then nothing until the Hub
shuts down (a download to interrupt mid-file). Every request is kept in `LoopbackHub.requests` (method, path, Range
header) for tests to read.

    with loopback_hub([HubRepo("acme/tiny", files_of(folder))]) as hub:
        env["HF_ENDPOINT"] = hub.url
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit


@dataclass
class HubRepo:
    repo_id: str
    files: Mapping[str, bytes | Path]
    sha: str = ""
    kind: str = "model"  # or "dataset"
    revisions: tuple[str, ...] = ("main",)  # the names that resolve to `sha` (besides the sha itself)
    token: str | None = None  # a gated repo: its files need `Authorization: Bearer <token>`
    drop_after: dict[str, int] = field(default_factory=dict)  # path -> bytes sent before the first GET is cut
    stall_after: dict[str, int] = field(default_factory=dict)  # path -> bytes sent before the first GET waits
    hashes: dict[str, tuple[int, str, str]] = field(default_factory=dict, init=False)  # size, sha1, sha256

    def __post_init__(self) -> None:
        for name, content in self.files.items():
            sha1, sha256 = hashlib.sha1(), hashlib.sha256()
            for chunk in _chunks(content):
                sha1.update(chunk)
                sha256.update(chunk)
            self.hashes[name] = (_size(content), sha1.hexdigest(), sha256.hexdigest())
        if not self.sha:
            digest = hashlib.sha1(self.repo_id.encode())
            for name in sorted(self.files):
                digest.update(name.encode() + bytes.fromhex(self.hashes[name][1]))
            self.sha = digest.hexdigest()


def _size(content: bytes | Path) -> int:
    return content.stat().st_size if isinstance(content, Path) else len(content)


def _chunks(content: bytes | Path, start: int = 0, end: int | None = None) -> Iterator[bytes]:
    """The bytes [start, end) of a file's content, in pieces of at most 8 MiB."""
    end = _size(content) if end is None else end
    if isinstance(content, bytes):
        view = memoryview(content)
        for at in range(start, end, 8 << 20):
            yield bytes(view[at:min(at + (8 << 20), end)])
        return
    with content.open("rb") as file:
        file.seek(start)
        while start < end:
            chunk = file.read(min(8 << 20, end - start))
            if not chunk:
                return
            start += len(chunk)
            yield chunk


def files_of(folder: Path) -> dict[str, bytes]:
    """Every file under `folder`, by its path relative to it."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@dataclass
class Request:
    method: str
    path: str
    range: str | None
    authorization: str | None


class LoopbackHub:
    def __init__(self, repos: Iterable[HubRepo]) -> None:
        self.repos = {(r.kind, r.repo_id): r for r in repos}
        self.requests: list[Request] = []
        self.lock = threading.Lock()
        self.closing = threading.Event()  # set at shutdown: a stalled answer ends
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="loopback-hub", daemon=True)

    def file_gets(self, path: str) -> list[Request]:
        """The GETs of a file (any repo) whose URL ends with `/path`."""
        return [r for r in self.requests if r.method == "GET" and "/resolve/" in r.path and r.path.endswith(path)]


_API = re.compile(r"^/api/(models|datasets)/(?P<repo>[^/]+/[^/]+)(?:/(?P<what>revision|tree)/(?P<rev>[^/]+)"
                  r"(?:/(?P<folder>.+))?)?$")
_RESOLVE = re.compile(r"^/(?P<datasets>datasets/)?(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")


def _handler(hub: LoopbackHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def do_GET(self) -> None:
            self._answer(body=True)

        def _answer(self, body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            with hub.lock:
                hub.requests.append(Request(self.command, path, self.headers.get("Range"),
                                            self.headers.get("Authorization")))
            api, resolve = _API.match(path), _RESOLVE.match(path)
            if api:
                kind = api.group(1)[:-1]
                repo = self._repo(kind, api.group("repo"), api.group("rev") or "main")
                if repo is None:
                    return
                if api.group("what") in ("revision", None):
                    info = {"id": repo.repo_id, "sha": repo.sha, "gated": "manual" if repo.token else False,
                            "private": False, "siblings": [{"rfilename": name} for name in sorted(repo.files)]}
                    self._json(info)
                else:
                    folder = (api.group("folder") or "").strip("/")
                    recursive = "recursive=true" in urlsplit(self.path).query.lower()
                    prefix = folder + "/" if folder else ""
                    listed = [entry for name, entry in sorted(_entries(repo).items()) if name.startswith(prefix)
                              and (recursive or "/" not in name[len(prefix):])]
                    if folder and not listed:
                        self._error(404, "EntryNotFound", f"{folder} does not exist on \"{api.group('rev')}\"")
                        return
                    self._json(listed)
            elif resolve:
                kind = "dataset" if resolve.group("datasets") else "model"
                repo = self._repo(kind, resolve.group("repo"), resolve.group("rev"))
                if repo is None:
                    return
                if repo.token and self.headers.get("Authorization") != f"Bearer {repo.token}":
                    self._error(401, "GatedRepo", f"Access to model {repo.repo_id} is restricted. You must have "
                                "access to it and be authenticated to access it. Please log in.")
                    return
                name = resolve.group("path")
                if name not in repo.files:
                    self._error(404, "EntryNotFound", f"{name} does not exist on \"{resolve.group('rev')}\"")
                    return
                self._file(repo, name, body)
            else:
                self._error(404, None, "Not Found")

        def _repo(self, kind: str, repo_id: str, revision: str) -> HubRepo | None:
            repo = hub.repos.get((kind, repo_id))
            if repo is None:
                self._error(404, "RepoNotFound", f"Repository not found: {repo_id}")
                return None
            if revision != repo.sha and revision not in repo.revisions:
                self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
                return None
            return repo

        def _file(self, repo: HubRepo, name: str, body: bool) -> None:
            content = repo.files[name]
            size, _, sha256 = repo.hashes[name]
            start = 0
            match = re.match(r"bytes=(\d+)-", self.headers.get("Range") or "")
            if match and body:
                start = int(match.group(1))
            self.send_response(206 if start else 200)
            self.send_header("X-Repo-Commit", repo.sha)
            self.send_header("ETag", f'"{sha256}"')
            self.send_header("X-Linked-Size", str(size))
            self.send_header("Content-Length", str(size - start))
            if start:
                self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
            self.end_headers()
            if not body:
                return
            cut = repo.drop_after.pop(name, None) if not start else None
            stall = repo.stall_after.pop(name, None) if not start else None
            if cut is not None or stall is not None:  # part of the body, then nothing (at once, or at shutdown)
                for chunk in _chunks(content, 0, cut if cut is not None else stall):
                    self.wfile.write(chunk)
                self.wfile.flush()
                if stall is not None:
                    hub.closing.wait()
                self.close_connection = True
                return
            if isinstance(content, Path):
                with content.open("rb") as file:
                    self.connection.sendfile(file, offset=start)
                return
            self.wfile.write(memoryview(content)[start:])

        def _json(self, value: Any) -> None:
            data = json.dumps(value).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def _error(self, status: int, code: str | None, message: str) -> None:
            data = json.dumps({"error": message}).encode()
            self.send_response(status)
            if code:
                self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", message)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

    return Handler


def _entries(repo: HubRepo) -> dict[str, dict[str, Any]]:
    """The repo's files and the folders that hold them, by path, as the tree endpoint describes each."""
    entries: dict[str, dict[str, Any]] = {}
    for name in repo.files:
        entries[name] = {"type": "file", "path": name, "size": repo.hashes[name][0], "oid": repo.hashes[name][1]}
        parts = name.split("/")[:-1]
        for depth in range(1, len(parts) + 1):
            folder = "/".join(parts[:depth])
            entries.setdefault(folder, {"type": "directory", "path": folder, "size": 0,
                                        "oid": hashlib.sha1(f"{repo.sha}/{folder}".encode()).hexdigest()})
    return entries


@contextmanager
def loopback_hub(repos: Iterable[HubRepo]) -> Iterator[LoopbackHub]:
    """A loopback Hub serving `repos` for the block (its base URL: `.url`)."""
    hub = LoopbackHub(repos)
    hub.thread.start()
    try:
        yield hub
    finally:
        hub.closing.set()
        hub.server.shutdown()
        hub.server.server_close()
