"""The Environments Hub (Prime's): an environment's id, `owner/name[@version]`, to a wheel on this machine.

`prime env install owner/name` asks `GET {base}/api/v1/environmentshub/{owner}/{name}/@{version}` (`latest` when no
version is given) for the release, then fetches what it names, as Prime's `prime` CLI (0.18) installs it: from the
owner's package index (PEP 503: the file of the resolved version, its `#sha256=` checked), else the wheel's URL,
else the source archive (a private environment's, pulled with the key), extracted safely (no links, absolute paths
or `..`: refused in one line) and built into a wheel here. The wheel is kept under
`$PRIME_LAB_HOME/environments/hub/<owner>/<name>/` (a take-back can put it back from there) and installed by
`envs/install.py` as any wheel is. What came from the Hub is recorded (`hub.json` beside it) so that `prime env
list` names the id.

The base URL is `PRIME_API_BASE_URL`, then `PRIME_BASE_URL`, then `base_url` in the `prime` CLI's
`~/.prime/config.json`, then `https://api.primeintellect.ai`. The key is `PRIME_API_KEY`, then the global secret of
that name (`prime secret`), then `api_key` in that file, sent as `Authorization: Bearer KEY` when there is one.
Names follow the Hub's: the package is `name.replace("-", "_").lower()`, the environment's id on this machine is
`owner/name` (its module the package's). Every failure is one line (`HubError`): a refused or silent Hub within
`TIMEOUT_S` names the id and the command to run where there is a network.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path, PurePosixPath
from typing import Any

from prime_lab.envs.installed import canonical
from prime_lab.runs.atomic import write_json_atomic
from prime_lab.runs.paths import lab_home

DEFAULT_BASE = "https://api.primeintellect.ai"
KEY_VARIABLE = "PRIME_API_KEY"
TIMEOUT_S = 5.0  # each connect and each read; a Hub that does not answer within it is out of reach
BUILD_TIMEOUT_S = 600.0  # building a source archive into a wheel
_ID = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.-]*)/([A-Za-z0-9][A-Za-z0-9_.-]*)(?:@([A-Za-z0-9][A-Za-z0-9_.+-]*))?$")
_CHUNK = 1 << 20


class HubError(ValueError):
    """The Environments Hub could not give what was asked; the message says why and what to do, in one line."""


class HubUnreachable(HubError):
    """The Hub did not answer (refused, no such host, silent within `TIMEOUT_S`): `where` (its scheme and host) and
    `reason` in words, so that a command can say what is true of it here and what to run where there is a
    network."""

    def __init__(self, message: str, where: str, reason: str) -> None:
        super().__init__(message)
        self.where = where
        self.reason = reason


@dataclass(frozen=True)
class HubId:
    owner: str
    name: str
    version: str = "latest"

    @property
    def id(self) -> str:
        return f"{self.owner}/{self.name}"

    @property
    def package(self) -> str:
        """The distribution's name, as the Hub builds it."""
        return self.name.replace("-", "_").lower()

    def install_line(self) -> str:
        return f"prime env install {self.id}" + ("" if self.version == "latest" else f"@{self.version}")

    def __str__(self) -> str:
        return self.id + ("" if self.version == "latest" else f"@{self.version}")


def parse_id(text: str) -> HubId | None:
    """`owner/name[@version]` as a HubId; None for anything else (a path, a bare name)."""
    found = _ID.match(text.strip())
    if found is None or found.group(1) in (".", "..") or found.group(2) in (".", ".."):
        return None
    return HubId(found.group(1), found.group(2), found.group(3) or "latest")


def _prime_config() -> dict[str, Any]:
    """The `prime` CLI's own settings file (`~/.prime/config.json`), or nothing."""
    try:
        data = json.loads((Path.home() / ".prime" / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def base_url() -> str:
    """Where the Environments Hub's API is (the module docstring's order), without a trailing slash."""
    base = (os.environ.get("PRIME_API_BASE_URL") or os.environ.get("PRIME_BASE_URL")
            or str(_prime_config().get("base_url") or "") or DEFAULT_BASE)
    return base.rstrip("/").removesuffix("/api/v1")


def api_key() -> str | None:
    """The key sent to the Hub, and None without one (the module docstring's order)."""
    from prime_lab.envs.secret_store import variable_or_secret

    return variable_or_secret(KEY_VARIABLE) or str(_prime_config().get("api_key") or "") or None


# HTTP ----------------------------------------------------------------------------------------------------------------

def _open(url: str, what: str, hub_id: HubId, key: str | None) -> Any:
    """The response to GET `url` (the key as a bearer token), or HubError in one line: unreachable (with the command
    to run where there is a network), 401/403 (the key), 402, 404, 422 (the Hub's detail)."""
    request = urllib.request.Request(url, headers={"User-Agent": "prime-lab", "Accept": "application/json, */*"})
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        return urllib.request.urlopen(request, timeout=TIMEOUT_S)  # noqa: S310 - the Hub's http(s) URLs
    except urllib.error.HTTPError as exc:
        raise HubError(_http_words(exc, what, hub_id, key, url, url.startswith(_api("")))) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, socket.timeout | TimeoutError):
            reason = f"no answer within {TIMEOUT_S:g} s"
        host = urllib.parse.urlsplit(url)
        where = f"{host.scheme}://{host.netloc}"
        raise HubUnreachable(f"{installed_words(hub_id)}: the Environments Hub ({where}) cannot be reached "
                             f"({reason}); run `{hub_id.install_line()}` where there is a network (or `prime env "
                             "install PATH` with its wheel or folder)", where, str(reason)) from None


def installed_here(hub_id: HubId) -> str | None:
    """The version of `hub_id`'s environment installed on this machine ('' when its version is not known), or None
    when no installed environment answers its id. Reads this machine alone (nothing is imported)."""
    from prime_lab.envs.loader import BUILTIN, EnvironmentLoadError, resolve

    try:
        where = resolve(hub_id.id)
    except EnvironmentLoadError:
        return None
    if where.source == BUILTIN:
        return None
    found = [r.get("version", "") for r in records().values() if r.get("id") == hub_id.id]
    if found:
        return str(found[0])
    from prime_lab.envs.isolated import record_for

    isolated = record_for(hub_id.id)
    if isolated is not None:
        return isolated.version
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(hub_id.package)
    except (PackageNotFoundError, ValueError):
        return ""


def installed_words(hub_id: HubId) -> str:
    """`acme/word-count 1.1 is installed here` or `acme/word-count is not installed`: what is true of it here."""
    have = installed_here(hub_id)
    if have is None:
        return f"{hub_id.id} is not installed"
    return f"{hub_id.id}{' ' + have if have else ''} is installed here"


def _http_words(exc: urllib.error.HTTPError, what: str, hub_id: HubId, key: str | None, url: str, api: bool) -> str:
    detail = ""
    try:
        body = json.loads(exc.read().decode("utf-8", "replace") or "{}")
        found = body.get("detail") if isinstance(body, dict) else None
        if isinstance(found, list):
            detail = "; ".join(str(d.get("msg", d)) if isinstance(d, dict) else str(d) for d in found)
        elif found:
            detail = str(found)
    except (OSError, ValueError):
        pass
    said = f" ({detail})" if detail else ""
    if exc.code in (401, 403):
        if key:
            return (f"the Environments Hub refused the key for {what} ({exc.code}" + (f": {detail}" if detail else "")
                    + f"): {hub_id.id} is private or "
                    f"the key in {KEY_VARIABLE} (or `prime secret`, or ~/.prime/config.json) cannot read it; set one "
                    "that can")
        return (f"{what} needs a key ({exc.code}: {hub_id.id} is private): set {KEY_VARIABLE}, or `prime secret "
                f"create {KEY_VARIABLE}`, to a key of its owner's team and run `{hub_id.install_line()}` again")
    if exc.code == 402:
        return f"the Environments Hub asks for payment for {what} (402{said}): see its page on the Hub"
    if exc.code == 404 and not api:
        return f"the Environments Hub has no {what} at {url} (404): run `{hub_id.install_line()}` again later"
    if exc.code == 404:
        if hub_id.version != "latest":
            return (f"no {what} on the Environments Hub ({base_url()}){said}: `prime env info {hub_id.id}` lists its "
                    "versions")
        return f"no environment {hub_id.id} on the Environments Hub ({base_url()}){said}: check the id"
    return f"the Environments Hub answered {exc.code} for {what} ({url}){said}"


def _json(url: str, what: str, hub_id: HubId, key: str | None) -> Any:
    with _open(url, what, hub_id, key) as response:
        try:
            body = json.loads(response.read().decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            raise HubError(f"the Environments Hub's answer for {what} is not JSON ({url})") from None
    return body.get("data", body) if isinstance(body, dict) else body


def _download(url: str, into: Path, what: str, hub_id: HubId, key: str | None, sha256: str = "") -> Path:
    """`url` saved as `into` (written beside it, then renamed); HubError when its sha256 is not `sha256`."""
    into.parent.mkdir(parents=True, exist_ok=True)
    partial = into.with_name(f".{into.name}.{os.getpid()}")
    digest = hashlib.sha256()
    try:
        with _open(url, what, hub_id, key) as response, partial.open("wb") as out:
            while chunk := response.read(_CHUNK):
                digest.update(chunk)
                out.write(chunk)
    except OSError as exc:  # the connection dropped or went silent mid-file
        partial.unlink(missing_ok=True)
        raise HubError(f"downloading {what} from {url} failed: {exc}; run `{hub_id.install_line()}` again") from None
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    if sha256 and digest.hexdigest() != sha256.lower():
        partial.unlink(missing_ok=True)
        raise HubError(f"{what} from {url} is not what the index says (sha256 {digest.hexdigest()}, expected "
                       f"{sha256}): nothing installed")
    partial.replace(into)
    return into


# The release -------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Release:
    """One version of an environment, as the Hub describes it."""

    hub_id: HubId
    version: str  # the semantic version it resolved to ('' when the Hub did not say)
    visibility: str
    index_url: str
    wheel_url: str
    source_url: str
    url_dependencies: tuple[str, ...]
    description: str
    data: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def private(self) -> bool:
        return self.visibility.upper() == "PRIVATE"


def _api(path: str) -> str:
    return f"{base_url()}/api/v1/environmentshub/{path}"


def release(hub_id: HubId, key: str | None = None) -> Release:
    """What the Hub says of `hub_id` at its version (`latest` when none was given)."""
    key = api_key() if key is None else key
    what = f"{hub_id.id}" + ("" if hub_id.version == "latest" else f" version {hub_id.version}")
    data = _json(_api(f"{_quote(hub_id.owner)}/{_quote(hub_id.name)}/@{_quote(hub_id.version)}"), what, hub_id, key)
    if not isinstance(data, dict):
        raise HubError(f"the Environments Hub's answer for {what} is not an environment")
    meta = data.get("metadata") if isinstance(data.get("metadata"), dict) else {}
    return Release(
        hub_id=hub_id, version=str(data.get("semantic_version") or data.get("version") or ""),
        visibility=str(data.get("visibility") or "PUBLIC"),
        index_url=str(data.get("install_index_url") or data.get("simple_index_url") or ""),
        wheel_url=str(data.get("wheel_url") or ""),
        source_url=str(data.get("package_url") or data.get("tracked_package_url") or ""),
        url_dependencies=tuple(str(d) for d in data.get("url_dependencies") or ()),
        description=str((meta or {}).get("description") or data.get("description") or ""), data=data)


def versions(hub_id: HubId, key: str | None = None) -> list[dict[str, Any]]:
    """The environment's versions as the Hub lists them (newest first as it sends them): version, created_at, ..."""
    key = api_key() if key is None else key
    data = _json(_api(f"{_quote(hub_id.owner)}/{_quote(hub_id.name)}/versions"), f"{hub_id.id}'s versions", hub_id,
                 key)
    if isinstance(data, dict):
        data = data.get("versions", [])
    return [v for v in data if isinstance(v, dict)] if isinstance(data, list) else []


def url_requirements(found: Release) -> tuple[str, ...]:
    """The release's `url_dependencies`, each a PEP 508 requirement with a URL (`name @ https://...`), as pip is to
    be given them beside its wheel; HubError (one line, nothing installed) for one that is not."""
    from packaging.requirements import InvalidRequirement, Requirement

    kept = []
    for text in found.url_dependencies:
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            requirement = None
        if requirement is None or not requirement.url:
            raise HubError(f"the Environments Hub names {text!r} among {found.hub_id}'s url_dependencies, which is "
                           "not a PEP 508 requirement with a URL (name @ URL): nothing installed")
        kept.append(str(requirement))
    return tuple(kept)


def _quote(part: str) -> str:
    return urllib.parse.quote(part, safe="")


# Fetching the wheel ------------------------------------------------------------------------------------------------

def hub_folder() -> Path:
    return lab_home() / "environments" / "hub"


class _Links(HTMLParser):
    """The anchors of a PEP 503 page: (href, text)."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []
        self._href: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._href = dict(attrs).get("href") or ""
            self.links.append((self._href, ""))

    def handle_data(self, data: str) -> None:
        if self._href is not None and self.links:
            href, text = self.links[-1]
            self.links[-1] = (href, text + data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a":
            self._href = None


def _file_version(filename: str, package: str) -> tuple[str, bool] | None:
    """(version, is a wheel for any platform) of an index file of `package`; None for another's or another kind."""
    from packaging.utils import InvalidSdistFilename, InvalidWheelFilename, parse_sdist_filename, parse_wheel_filename

    try:
        if filename.endswith(".whl"):
            name, version, _, tags = parse_wheel_filename(filename)
            return (str(version), any(t.platform == "any" for t in tags)) if canonical(name) == canonical(package) \
                else None
        if filename.endswith(".tar.gz"):
            name, version = parse_sdist_filename(filename)
            return (str(version), False) if canonical(name) == canonical(package) else None
    except (InvalidWheelFilename, InvalidSdistFilename):
        return None
    return None


def _from_index(found: Release, key: str | None) -> tuple[str, str, str]:
    """(url, file name, sha256) of the file the package index holds for the release: a wheel for any platform
    first, then any wheel, then the source archive; the newest version when the Hub named none."""
    from packaging.version import InvalidVersion, Version

    hub_id = found.hub_id
    page = found.index_url.rstrip("/") + f"/{canonical(hub_id.package)}/"
    with _open(page, f"{hub_id.id}'s package index page", hub_id, key) as response:
        links = _Links()
        links.feed(response.read().decode("utf-8", "replace"))
    files = []
    for href, _ in links.links:
        url = urllib.parse.urljoin(page, href)
        path, _, fragment = url.partition("#")
        filename = urllib.parse.unquote(path.rsplit("/", 1)[-1])
        seen = _file_version(filename, hub_id.package)
        if seen is None:
            continue
        try:
            version = Version(seen[0])
        except InvalidVersion:
            continue
        if found.version and found.version != "latest":
            try:
                if version != Version(found.version):
                    continue
            except InvalidVersion:
                continue
        sha = fragment.partition("sha256=")[2] if fragment.startswith("sha256=") else ""
        files.append((version, filename.endswith(".whl"), seen[1], path, filename, sha))
    if not files:
        at = f" {found.version}" if found.version else ""
        raise HubError(f"the package index of {hub_id.id} ({page}) has no file of {hub_id.package}{at}")
    _, _, _, url, filename, sha = max(files, key=lambda f: (f[0], f[1], f[2]))
    return url, filename, sha


def fetch(found: Release, key: str | None = None, say: Any = None) -> Path:
    """The release's wheel on this machine (downloaded, or built from its source archive), kept under
    `hub_folder()`."""
    key = api_key() if key is None else key
    hub_id = found.hub_id
    folder = hub_folder() / hub_id.owner / hub_id.name
    if found.index_url:
        url, filename, sha = _from_index(found, key)
    elif found.wheel_url:
        url, filename, sha = found.wheel_url, urllib.parse.unquote(found.wheel_url.split("#")[0].rsplit("/", 1)[-1]), ""
    elif found.source_url:
        url, filename, sha = found.source_url, "", ""
    else:
        raise HubError(f"the Environments Hub names no package index, wheel or source archive for {hub_id}: nothing "
                       "to install")
    if filename.endswith(".whl"):
        if callable(say):
            say(f"downloading {filename} from {urllib.parse.urlsplit(url).netloc}")
        return _download(url, folder / filename, f"{hub_id}'s wheel", hub_id, key, sha)
    return _build(url, folder, found, key, sha, say)


def _build(url: str, folder: Path, found: Release, key: str | None, sha: str, say: Any) -> Path:
    """The source archive at `url` downloaded (with the key), extracted safely and built into a wheel in `folder`."""
    hub_id = found.hub_id
    with tempfile.TemporaryDirectory(prefix="prime-lab-hub-") as tmp:
        if callable(say):
            say(f"downloading {hub_id}'s source archive from {urllib.parse.urlsplit(url).netloc}")
        archive = _download(url, Path(tmp) / "source.tar.gz", f"{hub_id}'s source archive", hub_id, key, sha)
        source = Path(tmp) / "source"
        extract(archive, source, f"{hub_id}'s source archive")
        roots = [p for p in source.iterdir()]
        top = roots[0] if len(roots) == 1 and roots[0].is_dir() else source
        if not (top / "pyproject.toml").is_file() and not (top / "setup.py").is_file():
            raise HubError(f"{hub_id}'s source archive holds no pyproject.toml: not a Python package")
        built = Path(tmp) / "wheel"
        from prime_lab.envs.install import plan

        isolation = plan(top).build_isolation
        if callable(say):
            say(f"building {hub_id.package} from its source")
        command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-q", "-w",
                   str(built), *([] if isolation else ["--no-build-isolation"]), str(top)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise HubError(f"building {hub_id}'s source did not finish within {BUILD_TIMEOUT_S:g} s") from None
        wheels = sorted(built.glob("*.whl"))
        if done.returncode != 0 or not wheels:
            last = (done.stderr.strip().splitlines() or ["no wheel"])[-1]
            raise HubError(f"building {hub_id}'s source into a wheel failed: {last}")
        folder.mkdir(parents=True, exist_ok=True)
        return Path(shutil.copy2(wheels[0], folder / wheels[0].name))


def extract(archive: Path, into: Path, what: str) -> None:
    """Extract a .tar.gz whose every member is a plain file or folder inside `into`; HubError (one line, nothing
    extracted) for a link, a device, an absolute path or a `..`."""
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = tar.getmembers()
            for member in members:
                path = PurePosixPath(member.name)
                if path.is_absolute() or member.name.startswith(("/", "\\")) or ".." in path.parts:
                    raise HubError(f"{what} is refused: its member {member.name!r} points outside its folder; "
                                   "nothing extracted")
                if not (member.isfile() or member.isdir()):
                    kind = "link" if member.issym() or member.islnk() else "special file"
                    raise HubError(f"{what} is refused: its member {member.name!r} is a {kind}; nothing extracted")
            into.mkdir(parents=True, exist_ok=True)
            tar.extractall(into, members=members, filter="data")
    except (tarfile.TarError, OSError) as exc:
        raise HubError(f"{what} cannot be read as a .tar.gz: {exc}") from None


@contextmanager
def extra_index(found: Release) -> Iterator[None]:
    """pip (this process's children) looks in the release's package index too while the block runs
    (`PIP_EXTRA_INDEX_URL`, after any the user set), for what the wheel needs from its owner's index."""
    if not found.index_url:
        yield
        return
    saved = os.environ.get("PIP_EXTRA_INDEX_URL")
    os.environ["PIP_EXTRA_INDEX_URL"] = " ".join(u for u in (saved, found.index_url) if u)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("PIP_EXTRA_INDEX_URL", None)
        else:
            os.environ["PIP_EXTRA_INDEX_URL"] = saved


# What came from the Hub --------------------------------------------------------------------------------------------

def _records_path() -> Path:
    return hub_folder() / "hub.json"


def records() -> dict[str, dict[str, str]]:
    """distribution (canonical) -> {"id", "version", "base"} of what was installed from the Hub."""
    try:
        data = json.loads(_records_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): v for k, v in data.items() if isinstance(v, dict)} if isinstance(data, dict) else {}


def remember(distribution: str, found: Release, version: str) -> None:
    """Record that `distribution` `version` came from the Hub as `found`."""
    data = records()
    data[canonical(distribution)] = {"id": found.hub_id.id, "version": version, "base": base_url()}
    _records_path().parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(_records_path(), data)


def forget(distribution: str) -> None:
    data = records()
    if data.pop(canonical(distribution), None) is not None:
        write_json_atomic(_records_path(), data)


def hub_id_of(distribution: str, version: str) -> str:
    """`owner/name@version` when this distribution at this version came from the Hub; '' otherwise."""
    record = records().get(canonical(distribution))
    if record is None or (version and record.get("version") != version):
        return ""
    return f"{record.get('id')}@{record.get('version')}"
