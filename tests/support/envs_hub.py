"""A loopback Environments Hub for tests: Prime's API as `prime env install` asks it (docs: ../shared/notes/hubs.md),
a PEP 503 package index per owner, and the files, served by the standard library on 127.0.0.1.

- `GET /api/v1/environmentshub/{owner}/{name}/@{version}` (`latest` or a version): `{"data": {...}}` with
  `visibility`, `semantic_version`, `simple_index_url` (a public environment with wheels), `package_url` (a source
  archive: the only way to a private one), `metadata.description`; 401 without the key for a private one, 404 with a
  `detail` for an unknown id or version.
- `GET /api/v1/environmentshub/{owner}/{name}/versions`: `{"data": [{"version", "created_at", "sha256", "size"}]}`.
- `GET /{owner}/simple/{package}/`: anchors to each file, `#sha256=...`.
- `GET /files/{name}`: a wheel or an archive (the key needed for a private environment's), or one of `files` (what
  a release's `url_dependencies` name).

Every request is kept (`requests`: method, path, the Authorization header) so a test can say what was asked.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


@dataclass
class HubEnv:
    owner: str
    name: str
    files: dict[str, Path]  # version -> the wheel or the source archive of that version
    private: bool = False
    description: str = ""
    url_dependencies: tuple[str, ...] = ()  # PEP 508 `name @ URL`; `{url}` stands for the server's URL

    @property
    def package(self) -> str:
        return self.name.replace("-", "_").lower()

    def latest(self) -> str:
        from packaging.version import Version

        return max(self.files, key=Version)


@dataclass
class EnvsHub:
    """The server's state: the environments, the key a private one needs, and the requests seen."""

    key: str = "test-key"
    envs: dict[tuple[str, str], HubEnv] = field(default_factory=dict)
    requests: list[tuple[str, str, str]] = field(default_factory=list)
    url: str = ""
    files: dict[str, Path] = field(default_factory=dict)  # more files served at /files/{name} (a url dependency's)

    def add(self, env: HubEnv) -> HubEnv:
        self.envs[(env.owner, env.name)] = env
        return env

    def _authorised(self, header: str) -> bool:
        return header == f"Bearer {self.key}"

    def answer(self, path: str, auth: str) -> tuple[int, str, bytes]:
        """(status, content type, body) for GET `path`."""
        parts = [p for p in path.split("?")[0].split("/") if p]
        if parts[:3] == ["api", "v1", "environmentshub"] and len(parts) == 6:
            env = self.envs.get((parts[3], parts[4]))
            if env is None:
                return _json(404, {"detail": f"Environment {parts[3]}/{parts[4]} not found"})
            if env.private and not self._authorised(auth):
                return _json(401, {"detail": "Not authenticated"})
            if parts[5] == "versions":
                return _json(200, {"data": [{"version": v, "created_at": "2026-11-30T12:00:00Z",
                                             "sha256": _sha(p), "size": p.stat().st_size}
                                            for v, p in sorted(env.files.items(), reverse=True)]})
            version = parts[5].removeprefix("@")
            version = env.latest() if version == "latest" else version
            if version not in env.files:
                return _json(404, {"detail": f"Version {version} not found"})
            archive = env.files[version]
            wheel = archive.name.endswith(".whl")
            return _json(200, {"data": {
                "id": f"{env.owner}-{env.name}-{version}", "visibility": "PRIVATE" if env.private else "PUBLIC",
                "semantic_version": version, "simple_index_url": f"{self.url}/{env.owner}/simple/" if wheel else None,
                "wheel_url": None, "url_dependencies": [d.replace("{url}", self.url) for d in env.url_dependencies],
                "package_url": f"{self.url}/files/{archive.name}" if not wheel else None,
                "metadata": {"description": env.description}}})
        if len(parts) == 3 and parts[1] == "simple":
            found = [e for e in self.envs.values() if e.owner == parts[0] and e.package.replace("_", "-") == parts[2]]
            if not found:
                return 404, "text/plain", b"not found"
            links = "".join(f'<a href="../../../files/{p.name}#sha256={_sha(p)}">{p.name}</a>\n'
                            for p in found[0].files.values())
            return 200, "text/html", f"<!DOCTYPE html><html><body>\n{links}</body></html>\n".encode()
        if len(parts) == 2 and parts[0] == "files" and parts[1] in self.files:
            return 200, "application/octet-stream", self.files[parts[1]].read_bytes()
        if len(parts) == 2 and parts[0] == "files":
            for env in self.envs.values():
                for file in env.files.values():
                    if file.name == parts[1]:
                        if env.private and not self._authorised(auth):
                            return _json(401, {"detail": "Not authenticated"})
                        return 200, "application/octet-stream", file.read_bytes()
        return 404, "text/plain", b"not found"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _json(status: int, body: Any) -> tuple[int, str, bytes]:
    return status, "application/json", json.dumps(body).encode()


@contextmanager
def serve(hub: EnvsHub) -> Iterator[EnvsHub]:
    """`hub` served on 127.0.0.1 (its `url` set) while the block runs."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            auth = self.headers.get("Authorization") or ""
            hub.requests.append(("GET", self.path, auth))
            status, kind, body = hub.answer(self.path, auth)
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
