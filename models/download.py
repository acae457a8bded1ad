"""A Hugging Face model downloaded into the local Hugging Face cache, as `hf download` would put it there.

`download_model("owner/name", revision)` asks the Hub (`HF_ENDPOINT`, else https://huggingface.co) for the commit the
revision names (default `main`) and its files, and downloads at that commit what a model folder needs: the top-level
`*.safetensors` weights and the config, tokenizer and chat-template files (`*.json`, `*.txt`, `*.model`, `*.tiktoken`,
`*.jinja`); `*.bin`, `*.pt`, `*.pth` or `*.gguf` weights only when the model has no safetensors.

The weights come through partial files of our own in the cache (`blobs/<etag>.incomplete`, written as the bytes
arrive, up to WORKERS at once) that outlive the process: a download cut short (Ctrl-C, a kill,
a dropped connection) goes on from the partial file's end with a Range request when the same command runs again
(huggingface_hub 2.4.0 writes to a file named for its call and deletes it when the call ends, so it resumes nothing
across calls). The small files, and a weight file the Hub serves through Xet when hf_xet is installed (Xet's own
transfer; one cut short starts over), come meanwhile through huggingface_hub's `snapshot_download`; the snapshot
folder then links the weights to their blobs as huggingface_hub does. Progress: huggingface_hub's bars on a
terminal; otherwise a plain line every `REPORT_SECONDS`.

Every failure is a `DownloadError` with one line (`obtain_model` makes it a `ModelNotFoundError`): a gated or
private model (401/403) names the page to accept and `HF_TOKEN`; a missing one (404) says so, with the closest names
in the user's cache.
"""

from __future__ import annotations

import difflib
import os
import queue
import re
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TextIO
from urllib.parse import urlsplit

from prime_lab.runs.display import size as format_bytes
from prime_lab.runs.hub_probe import hub_endpoint

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
WEIGHTS = (".safetensors",)
OTHER_WEIGHTS = (".bin", ".pt", ".pth", ".gguf")
SMALL_FILES = (".json", ".txt", ".model", ".tiktoken", ".jinja")
REPORT_SECONDS = 5.0
WORKERS = 8  # weight files at once, as snapshot_download fetches files
RETRIES = 5  # a dropped connection resumed this many times in a row, as huggingface_hub's http_get does
TOKEN_HINT = "HF_TOKEN (export HF_TOKEN=hf_..., or `prime secret create -n HF_TOKEN`)"


class DownloadError(LookupError):
    """A model that could not be downloaded; the message is the one line to show."""


def split_revision(spec: str) -> tuple[str, str | None]:
    """`owner/name@revision` -> (`owner/name`, `revision`); no `@`: (spec, None)."""
    repo_id, at, revision = spec.partition("@")
    return (repo_id, revision) if at and revision else (spec, None)


def is_hub_id(spec: str) -> bool:
    """Whether `spec` has the shape of a Hugging Face model id (`owner/name`, optionally `@revision`)."""
    return bool(HUB_ID.match(split_revision(spec)[0]))


def chosen_files(names: Sequence[str]) -> list[str]:
    """The files of a repository that make a model folder: top-level safetensors (else the other weight formats)
    and the small config and tokenizer files."""
    top = [name for name in names if "/" not in name]
    weights = [name for name in top if name.endswith(WEIGHTS)] or [name for name in top if name.endswith(OTHER_WEIGHTS)]
    return sorted({*weights, *(name for name in top if name.endswith(SMALL_FILES))})


def cache_folder() -> Path:
    """The Hugging Face cache, read now (`HF_HUB_CACHE`, `HF_HOME`/hub, else ~/.cache/huggingface/hub)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


def cached_model_ids(cache: Path | None = None) -> list[str]:
    """The model ids the Hugging Face cache holds something of."""
    folder = cache or cache_folder()
    if not folder.is_dir():
        return []
    return sorted(p.name[len("models--"):].replace("--", "/", 1) for p in folder.glob("models--*--*"))


def safetensors_parameters(folder: Path) -> int | None:
    """The parameter count of the `*.safetensors` files in `folder`, read from their headers (None without any)."""
    import json
    import math

    total, found = 0, False
    for path in folder.glob("*.safetensors"):
        try:
            with path.open("rb") as file:
                header = json.loads(file.read(int.from_bytes(file.read(8), "little")))
        except (OSError, ValueError):
            continue
        found = True
        total += sum(math.prod(entry["shape"]) for name, entry in header.items() if name != "__metadata__")
    return total if found else None


def did_you_mean(repo_id: str, cache: Path | None = None) -> str:
    """`; did you mean 'x' (in your Hugging Face cache)?` for the closest cached ids, or ''."""
    known = cached_model_ids(cache)
    lowered = {name.lower(): name for name in known}
    close = difflib.get_close_matches(repo_id.lower(), list(lowered), n=3, cutoff=0.6)
    close += [lowered[n] for n in lowered if n.split("/")[-1] == repo_id.lower().split("/")[-1] and n not in close]
    names = list(dict.fromkeys(lowered.get(name, name) for name in close))
    if not names:
        return ""
    return "; did you mean " + " or ".join(f"'{name}'" for name in names) + " (in your Hugging Face cache)?"


def download_model(repo_id: str, revision: str | None = None, *, token: str | None = None,
                   endpoint: str | None = None, out: TextIO | None = None,
                   on_start: Callable[[str], None] | None = None) -> Path:
    """Download model `repo_id` at `revision` into the Hugging Face cache; its snapshot folder (named by commit).

    `out` gets the progress (default stderr): bars when it is a terminal, else plain lines. `on_start` is told
    the commit before the files come."""
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.hf_api import RepoFile

    url = (endpoint or hub_endpoint()).rstrip("/")
    stream = out if out is not None else sys.stderr
    cache = cache_folder()
    api = HfApi(endpoint=url, token=token)
    try:
        info = api.model_info(repo_id, revision=revision)
        if not info.sha:
            raise DownloadError(f"the Hub at {url} gave no commit for model {repo_id!r}")
        files = {entry.path: entry.size for entry in api.list_repo_tree(repo_id, revision=info.sha, recursive=True)
                 if isinstance(entry, RepoFile)}
        chosen = chosen_files(list(files))
        if not any(name.endswith(WEIGHTS + OTHER_WEIGHTS) for name in chosen):
            raise DownloadError(f"model {repo_id!r} on the Hub has no weights at its top level (*.safetensors, "
                                f"*.bin): {url}/{repo_id}/tree/{info.sha}")
        if on_start is not None:
            on_start(info.sha)
        total = sum(files[name] or 0 for name in chosen)
        terminal = bool(getattr(stream, "isatty", lambda: False)())
        stream.write(f"downloading {repo_id} at {info.sha[:12]} from {url}: {len(chosen)} files, "
                     f"{format_bytes(total)}, into {cache}\n")
        stream.flush()
        bars = None if terminal else _silent()
        folder = _storage(cache, repo_id) / "snapshots" / info.sha
        with _PlainLines(repo_id, cache, total, stream, enabled=not terminal):
            weights = [name for name in chosen if name.endswith(WEIGHTS + OTHER_WEIGHTS)]
            blobs, left = plan_blobs(repo_id, info.sha, weights, token=token, endpoint=url, cache=cache)
            others = [name for name in chosen if name not in weights] + left
            with Transfers(blobs, _storage(cache, repo_id), bars) as transfers:
                if others:  # the small files meanwhile
                    snapshot_download(repo_id, revision=info.sha, allow_patterns=others, token=token,
                                      endpoint=url, cache_dir=cache, tqdm_class=bars)
                transfers.wait()
            link_blobs(folder, blobs)
        _write_ref(cache, repo_id, revision or "main", info.sha)
    except DownloadError:
        raise
    except Exception as exc:  # huggingface_hub's and httpx's errors, read by name (no import of either here)
        raise DownloadError(failure_line(exc, repo_id, revision, url, cache)) from exc
    return Path(folder)


@dataclass
class _Blob:
    name: str
    url: str
    headers: dict[str, str]
    path: Path  # blobs/<etag>, as huggingface_hub names it
    size: int | None


def plan_blobs(repo_id: str, commit: str, names: Sequence[str], *, token: str | None, endpoint: str,
               cache: Path) -> tuple[list[_Blob], list[str]]:
    """Which of files `names` of model `repo_id` at `commit` come through our own partial files (their blobs, one
    HEAD each), and which are left to huggingface_hub (a file served through Xet with hf_xet installed, or one
    without an ETag, which huggingface_hub then names)."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.file_download import is_xet_available
    from huggingface_hub.utils import build_hf_headers

    blobs: list[_Blob] = []
    left: list[str] = []
    for name in names:
        url = hf_hub_url(repo_id, name, revision=commit, endpoint=endpoint)
        meta = get_hf_file_metadata(url, token=token, endpoint=endpoint, retry_on_errors=True)
        if meta.etag is None or (meta.xet_file_data is not None and is_xet_available()):
            left.append(name)
            continue
        headers = build_hf_headers(token=token)
        if urlsplit(meta.location).netloc != urlsplit(url).netloc:
            headers.pop("authorization", None)  # a signed CDN address, as huggingface_hub does
        blobs.append(_Blob(name, meta.location, headers, _storage(cache, repo_id) / "blobs" / meta.etag, meta.size))
    return blobs, left


def _storage(cache: Path, repo_id: str) -> Path:
    return cache / f"models--{repo_id.replace('/', '--')}"


def link_blobs(folder: Path, blobs: Sequence[_Blob]) -> None:
    """`folder/<name>` -> `../../blobs/<etag>` for each blob, as huggingface_hub links a snapshot's files."""
    for blob in blobs:
        pointer = folder / blob.name
        if not os.path.lexists(pointer):
            pointer.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.path.relpath(blob.path, pointer.parent), pointer)


class Transfers:
    """`blobs` not in the cache yet, up to WORKERS at once in daemon threads while the block runs, each through
    `blobs/<etag>.incomplete`, which is kept when its transfer stops (an exception, Ctrl-C, a kill) and resumed from
    its end by the next command. `wait()` waits for them and raises the first failure; leaving the block on an
    exception (KeyboardInterrupt included) stops them at their next chunk, without waiting."""

    def __init__(self, blobs: Sequence[_Blob], storage: Path, tqdm_class: Any) -> None:
        self.storage, self.tqdm_class = storage, tqdm_class
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.pending: queue.SimpleQueue[_Blob] = queue.SimpleQueue()
        todo = [blob for blob in blobs if not blob.path.exists()]
        for blob in todo:
            self.pending.put(blob)
        self.threads = [threading.Thread(target=self._work, name="download-blob", daemon=True)
                        for _ in range(min(WORKERS, len(todo)))]

    def __enter__(self) -> Transfers:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, kind: Any, value: Any, traceback: Any) -> None:
        self.stop.set()  # daemon threads: the process may end before they notice

    def _work(self) -> None:
        while not self.errors and not self.stop.is_set():
            try:
                blob = self.pending.get_nowait()
            except queue.Empty:
                return
            try:
                _fetch_blob(blob, self.storage, self.stop, self.tqdm_class)
            except BaseException as exc:  # handed to the calling thread
                self.errors.append(exc)

    def wait(self) -> None:
        for thread in self.threads:
            thread.join()
        if self.errors and not isinstance(self.errors[0], _Stopped):
            raise self.errors[0]


class _Stopped(Exception):
    """A transfer stopped because the calling thread was interrupted."""


def _fetch_blob(blob: _Blob, storage: Path, stop: threading.Event, tqdm_class: Any) -> None:
    """`blob` through `blobs/<etag>.incomplete`, appended from its end and renamed to `blobs/<etag>` when whole. The
    lock is the one huggingface_hub takes for the same blob, so two commands never append to one file."""
    from huggingface_hub.utils import WeakFileLock

    lock = storage.parent / ".locks" / storage.name / f"{blob.path.name}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    blob.path.parent.mkdir(parents=True, exist_ok=True)
    partial = blob.path.with_name(blob.path.name + ".incomplete")
    with WeakFileLock(lock):
        if blob.path.exists():
            return
        with partial.open("ab") as file:
            if blob.size is not None and file.tell() > blob.size:  # not a prefix of this blob: start over
                file.seek(0)
                file.truncate()
            _append(blob, file, stop, tqdm_class)
        os.replace(partial, blob.path)


def _append(blob: _Blob, file: BinaryIO, stop: threading.Event, tqdm_class: Any) -> None:
    """The rest of `blob` onto `file`: a GET with `Range: bytes=<its size>-` (from the start if the server answers
    200), each piece written as it arrives (memory stays flat whatever the file's size, and a stop loses nothing that
    arrived). A dropped connection or a timeout is resumed the same way, RETRIES times in a row at most, as
    huggingface_hub's own `http_get` does; `stop` set ends it at the next piece (`_Stopped`)."""
    import httpx2
    from huggingface_hub import constants
    from huggingface_hub.utils import hf_raise_for_status, http_stream_backoff
    from huggingface_hub.utils import tqdm as hub_tqdm

    bar_class = tqdm_class or hub_tqdm
    retries = RETRIES
    with bar_class(total=blob.size, initial=file.tell(), unit="B", unit_scale=True, unit_divisor=1024,
                   desc=blob.name) as bar:
        while blob.size is None or file.tell() < blob.size:
            done = file.tell()
            headers = {**blob.headers, **({"Range": f"bytes={done}-"} if done else {})}
            try:
                with http_stream_backoff(method="GET", url=blob.url, headers=headers,
                                         timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT, retry_on_exceptions=(),
                                         retry_on_status_codes=(408, 429)) as response:
                    hf_raise_for_status(response)
                    if done and response.status_code == 200:  # the Range was not honoured: from the start
                        file.seek(0)
                        file.truncate()
                        bar.reset(total=blob.size)
                    for piece in response.iter_bytes():
                        if stop.is_set():
                            raise _Stopped
                        file.write(piece)
                        bar.update(len(piece))
                        retries = RETRIES
                if blob.size is None:
                    break
            except (httpx2.ConnectError, httpx2.TimeoutException, httpx2.RemoteProtocolError):
                if retries <= 0:
                    raise
                retries -= 1
                time.sleep(1)
    if blob.size is not None and file.tell() != blob.size:
        raise OSError(f"{blob.name} has {file.tell()} bytes, the Hub said {blob.size}")


def _write_ref(cache: Path, repo_id: str, revision: str, commit: str) -> None:
    """`refs/<revision>` of the repository in the cache, as `hf download` leaves it (the download itself was asked
    by commit, which writes none), so that `owner/name[@revision]` resolves offline afterwards."""
    if revision == commit:
        return
    ref = cache / f"models--{repo_id.replace('/', '--')}" / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    partial = ref.with_name(f".{ref.name}.{os.getpid()}.tmp")
    partial.write_text(commit)
    partial.replace(ref)


def failure_line(exc: BaseException, repo_id: str, revision: str | None, endpoint: str, cache: Path) -> str:
    """One line for a failed download: what happened to which model and what to do."""
    names = {kind.__name__ for kind in type(exc).__mro__}
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    page = f"{endpoint}/{repo_id}"
    if "GatedRepoError" in names:
        return (f"model {repo_id!r} is gated on the Hugging Face Hub: accept its terms at {page} while logged in, "
                f"then give a token of that account in {TOKEN_HINT}")
    if "RevisionNotFoundError" in names:
        return f"model {repo_id!r} has no revision {revision!r} on the Hugging Face Hub ({page}: its branches, tags " \
               "and commits are there)"
    if "RepositoryNotFoundError" in names or status in (401, 403, 404):
        if status in (401, 403):
            return (f"model {repo_id!r} is private or gated on the Hugging Face Hub ({status}): ask for access at "
                    f"{page}, then give a token with access in {TOKEN_HINT}")
        return (f"model {repo_id!r} is not on the Hugging Face Hub ({endpoint}){did_you_mean(repo_id, cache)}; a "
                f"private one needs {TOKEN_HINT}")
    if status is not None:
        return f"the Hugging Face Hub answered {status} for model {repo_id!r} ({page}); try again later"
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return (f"the download of model {repo_id!r} from {endpoint} stopped ({type(exc).__name__}: {reason}); run the "
            "same command again to go on from where it stopped (what was downloaded is kept)")


def _silent() -> Any:
    """huggingface_hub's progress bar class, never shown (plain lines are written instead)."""
    from huggingface_hub.utils import tqdm

    class Silent(tqdm):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

    return Silent


class _PlainLines:
    """A line on `out` every REPORT_SECONDS while the block runs, and one at its end: the bytes in the cache's
    blobs folder of the repository since the start (finished files and those being written), of `total`."""

    def __init__(self, repo_id: str, cache: Path, total: int, out: TextIO, *, enabled: bool) -> None:
        self.repo_id, self.total, self.out, self.enabled = repo_id, total, out, enabled
        self.blobs = cache / f"models--{repo_id.replace('/', '--')}" / "blobs"
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="download-progress", daemon=True)

    def __enter__(self) -> _PlainLines:
        self.start = time.monotonic()
        self.baseline = self._on_disk()
        if self.enabled:
            self.thread.start()
        return self

    def __exit__(self, kind: Any, value: Any, traceback: Any) -> None:
        self.stop.set()
        if self.enabled:
            self.thread.join()
            if kind is None:
                self._say(final=True)

    def _on_disk(self) -> int:
        if not self.blobs.is_dir():
            return 0
        total = 0
        for path in self.blobs.iterdir():
            try:
                total += path.stat().st_size
            except OSError:  # renamed or removed meanwhile
                pass
        return total

    def _run(self) -> None:
        while not self.stop.wait(REPORT_SECONDS):
            self._say(final=False)

    def _say(self, *, final: bool) -> None:
        done = max(0, self._on_disk() - self.baseline)
        seconds = max(time.monotonic() - self.start, 1e-6)
        rate = done / seconds
        if final:
            line = f"downloaded {self.repo_id}: {format_bytes(done)} in {seconds:.1f} s ({format_bytes(rate)}/s)"
        else:
            left = max(self.total - done, 0)
            eta = f", about {left / rate:.0f} s left" if rate > 0 else ""
            share = f" ({100 * done / self.total:.0f}%)" if self.total else ""
            line = (f"downloading {self.repo_id}: {format_bytes(done)} of {format_bytes(self.total)}{share}, "
                    f"{format_bytes(rate)}/s{eta}")
        self.out.write(line + "\n")
        self.out.flush()
