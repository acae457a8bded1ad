"""`prime env install owner/name[@version]` and `prime env info` against a loopback Environments Hub
(tests/support/envs_hub.py: Prime's API, a PEP 503 index, the files), and what a run says of an environment that is
not installed. The one install runs in a virtual environment laid over prime-lab's (test_install_beside.py's `lab`),
pip offline on the test's own wheels; the rest never reaches pip's install."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import tarfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from prime_lab.envs import envs_hub
from tests.envs.stub_wheels import env_module, wheel
from tests.envs.test_install_beside import Lab, lab, wheels  # noqa: F401 - the layer and its wheels, as fixtures
from tests.support.cli import prime
from tests.support.envs_hub import EnvsHub, HubEnv, serve

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = """
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "{package}"
version = "{version}"
dependencies = ["prime-lab"]

[tool.setuptools]
py-modules = ["{package}"]
"""


def source_archive(folder: Path, package: str, version: str, members: dict[str, str] | None = None) -> Path:
    """A source .tar.gz as the Hub keeps one (`package-version/` with a pyproject and the module), or `members`."""
    top = f"{package}-{version}"
    members = members if members is not None else {
        f"{top}/pyproject.toml": PYPROJECT.format(package=package, version=version),
        f"{top}/{package}.py": env_module(f"{package} from source")}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{top}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, text in members.items():
            data = textwrap.dedent(text).encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[EnvsHub]:
    """The loopback Hub with acme/word-count 1.0 and 1.1 (wheels, public) and acme/secret-env 0.2 (a private
    source archive); this process and `prime` pointed at it, no key, HOME a scratch folder."""
    files = tmp_path / "hub-files"
    state = EnvsHub()
    helper = wheel(files / "deps", "word-helper", "0.1", {"word_helper.py": "WORDS = 3\n"})
    state.files[helper.name] = helper
    state.add(HubEnv("acme", "word-count", {
        v: wheel(files, "word_count", v, {"word_count.py": env_module(f"word count {v}", "import word_helper")},
                 requires=("prime-lab", "word-helper")) for v in ("1.0", "1.1")}, description="Count the words.",
        url_dependencies=(f"word-helper @ {{url}}/files/{helper.name}",)))
    state.add(HubEnv("acme", "secret-env", {"0.2": source_archive(files, "secret_env", "0.2")}, private=True))
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("PRIME_API_KEY", raising=False)
    monkeypatch.delenv("PRIME_BASE_URL", raising=False)
    with serve(state):
        monkeypatch.setenv("PRIME_API_BASE_URL", state.url)
        yield state


def error_line(proc: object) -> str:
    stderr = getattr(proc, "stderr", "")
    [line] = [line for line in stderr.splitlines() if line.startswith("Error:")]
    return line


def test_install_by_id_goes_the_way_a_wheel_goes_and_env_list_names_the_hub_id(
        hub: EnvsHub, lab: Lab) -> None:  # noqa: F811 - the fixture imported above
    """The Hub's latest (1.1) from its index, checked by sha256, installed beside prime-lab by the same safe path
    as a file, with its url_dependencies (`word-helper @ URL`, a wheel the Hub serves, which it imports): both in
    pip's dry run with every installed distribution held; `prime env list` says where it came from, the Hub id loads
    it, and `prime env uninstall` takes both (the helper is what its install added)."""
    assert lab.env["PRIME_API_BASE_URL"] == hub.url  # the layer's environment is this test's
    done = lab.prime("env", "install", "acme/word-count")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["word-count", "word_count"]
    assert "ready: prime eval run acme/word-count" in done.stderr
    helper = f"{hub.url}/files/word_helper-0.1-py3-none-any.whl"
    assert f"with its url dependencies: word-helper @ {helper}" in done.stderr
    assert "pip: installing word-count beside prime-lab (2 distribution(s); every installed one held" in done.stderr
    assert lab.installed() == {"word-count": "1.1", "word-helper": "0.1"}
    asked = [path for _, path, _ in hub.requests]
    assert asked[0] == "/api/v1/environmentshub/acme/word-count/@latest"
    assert "/acme/simple/word-count/" in asked and "/files/word_count-1.1-py3-none-any.whl" in asked
    assert "/files/word_helper-0.1-py3-none-any.whl" in asked
    listed = json.loads(lab.prime("env", "list", "-o", "json").stdout)
    [row] = [r for r in listed if r["id"] == "word-count"]
    assert row["hub_id"] == "acme/word-count@1.1" and row["version"] == "1.1"
    loads = subprocess.run([str(lab.python), "-c", "from prime_lab.envs.loader import describe; "
                            "print(describe('acme/word-count').module)"], capture_output=True, text=True, env=lab.env)
    assert loads.stdout.strip() == "word_count", loads.stderr
    gone = lab.prime("env", "uninstall", "acme/word-count")  # what its install added goes with it
    assert gone.returncode == 0 and "also uninstalled what its install added: word-helper" in gone.stderr, gone.stderr
    assert lab.installed() == {}


def test_a_url_dependency_that_is_no_url_requirement_is_refused_before_anything_is_fetched(
        hub: EnvsHub, tmp_path: Path) -> None:
    hub.add(HubEnv("acme", "loose", {"1.0": wheel(tmp_path / "w", "loose", "1.0", {"loose.py": env_module("loose")})},
                   url_dependencies=("word-helper>=0.1",)))
    refused = prime("env", "install", "acme/loose")
    assert error_line(refused) == ("Error: the Environments Hub names 'word-helper>=0.1' among acme/loose's "
                                   "url_dependencies, which is not a PEP 508 requirement with a URL (name @ URL): "
                                   "nothing installed")
    assert [path for _, path, _ in hub.requests] == ["/api/v1/environmentshub/acme/loose/@latest"]


def test_a_version_fetches_that_version_and_a_wrong_checksum_installs_nothing(hub: EnvsHub) -> None:
    found = envs_hub.release(envs_hub.parse_id("acme/word-count@1.0") or envs_hub.HubId("", ""))
    assert (found.version, found.visibility, found.description) == ("1.0", "PUBLIC", "Count the words.")
    path = envs_hub.fetch(found)
    assert path.name == "word_count-1.0-py3-none-any.whl" and path.read_bytes() == \
        hub.envs[("acme", "word-count")].files["1.0"].read_bytes()
    assert hub.requests[0][1] == "/api/v1/environmentshub/acme/word-count/@1.0"
    hub.envs[("acme", "word-count")].files["1.0"].write_bytes(b"not the wheel the index was read for")
    path.unlink()
    with pytest.raises(envs_hub.HubError, match="is not what the index says"):
        envs_hub._download(f"{hub.url}/files/{path.name}", path, "its wheel", found.hub_id, None, "0" * 64)
    assert not path.exists() and list(path.parent.iterdir()) == []


def test_a_private_environment_is_built_from_its_source_with_the_key_and_refused_without(
        hub: EnvsHub, monkeypatch: pytest.MonkeyPatch) -> None:
    without = prime("env", "install", "acme/secret-env")
    assert without.returncode == 1
    assert error_line(without) == ("Error: acme/secret-env needs a key (401: acme/secret-env is private): set "
                                   "PRIME_API_KEY, or `prime secret create PRIME_API_KEY`, to a key of its owner's "
                                   "team and run `prime env install acme/secret-env` again")
    monkeypatch.setenv("PRIME_API_KEY", hub.key)
    found = envs_hub.release(envs_hub.HubId("acme", "secret-env"))
    assert found.private and found.version == "0.2" and not found.index_url
    built = envs_hub.fetch(found)
    assert built.name == "secret_env-0.2-py3-none-any.whl" and built.parent == envs_hub.hub_folder() / "acme" / \
        "secret-env"
    assert [auth for _, path, auth in hub.requests if path.startswith("/files/")] == [f"Bearer {hub.key}"]
    monkeypatch.setenv("PRIME_API_KEY", "wrong")
    with pytest.raises(envs_hub.HubError, match=r"refused the key for acme/secret-env \(401: Not authenticated\)"):
        envs_hub.release(envs_hub.HubId("acme", "secret-env"))


def test_a_source_archive_that_reaches_outside_its_folder_is_refused(hub: EnvsHub, tmp_path: Path) -> None:
    """`..`, an absolute path and a link: refused in one line, nothing extracted."""
    hub.add(HubEnv("acme", "escape", {"1.0": source_archive(tmp_path / "bad", "escape", "1.0", {
        "escape-1.0/pyproject.toml": PYPROJECT.format(package="escape", version="1.0"),
        "escape-1.0/../../evil.py": "print('out')\n"})}))
    proc = prime("env", "install", "acme/escape")
    assert proc.returncode == 1
    assert error_line(proc) == ("Error: acme/escape's source archive is refused: its member "
                                "'escape-1.0/../../evil.py' points outside its folder; nothing extracted")
    for name in ("/etc/evil.py", "link"):
        archive = tmp_path / "one.tar.gz"
        with tarfile.open(archive, "w:gz") as tar:
            info = tarfile.TarInfo(name)
            if name == "link":
                info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tar.addfile(info, io.BytesIO(b""))
        with pytest.raises(envs_hub.HubError, match="is refused: its member .*(outside its folder|is a link)"):
            envs_hub.extract(archive, tmp_path / "out", "the archive")
        assert not (tmp_path / "out").exists()


def test_an_unknown_id_or_version_and_an_unreachable_hub_each_say_one_line(hub: EnvsHub, tmp_path: Path) -> None:
    assert error_line(prime("env", "install", "acme/nope")) == (
        f"Error: no environment acme/nope on the Environments Hub ({hub.url}) (Environment acme/nope not found): "
        "check the id")
    assert error_line(prime("env", "install", "acme/word-count@9.9")) == (
        f"Error: no acme/word-count version 9.9 on the Environments Hub ({hub.url}) (Version 9.9 not found): "
        "`prime env info acme/word-count` lists its versions")
    info = prime("env", "info", "acme/word-count")
    assert info.returncode == 0, info.stderr
    assert info.stdout.splitlines()[:2] == ["acme/word-count 1.1 (public)", "Count the words."]
    assert "1.0" in info.stdout and info.stdout.rstrip().endswith(
        "install: prime env install acme/word-count  (a version: prime env install acme/word-count@VERSION)")

    with socket.socket() as closed:  # a port nothing listens on: refused
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    env = {**os.environ, "PRIME_API_BASE_URL": f"http://127.0.0.1:{port}"}
    started = time.monotonic()
    proc = prime("env", "install", "acme/word-count", env=env)
    assert time.monotonic() - started < 10 and proc.returncode == 1
    assert error_line(proc) == (f"Error: acme/word-count is not installed: the Environments Hub "
                                f"(http://127.0.0.1:{port}) cannot be reached ([Errno 111] Connection refused); "
                                "run `prime env install acme/word-count` where there is a network (or `prime "
                                "env install PATH` with its wheel or folder)")
    # `prime env info` offline says what is true here, installed or not, and its command for where there is a network
    installed = tmp_path / "site"
    installed.mkdir()
    (installed / "word_count.py").write_text(env_module("word count here"))
    for where, state in ((env, "is not installed"), ({**env, "PYTHONPATH": str(installed)}, "is installed here")):
        started = time.monotonic()
        proc = prime("env", "info", "acme/word-count", env=where)
        assert time.monotonic() - started < 10 and proc.returncode == 1
        assert error_line(proc) == (f"Error: acme/word-count {state}; the Environments Hub (http://127.0.0.1:{port}) "
                                    "cannot be reached ([Errno 111] Connection refused): run `prime env info "
                                    "acme/word-count` where there is a network")


def test_a_config_whose_environment_is_not_installed_is_refused_with_the_install_line(tmp_path: Path) -> None:
    """Before a run is registered (`prime rl run`, `prime eval run`), and in `prime lab doctor`; with --install (`prime
    rl run`, `prime gepa run`), what the Hub says ends the command before a run is registered too (here: a Hub that
    does not have it)."""
    with serve(EnvsHub()) as hub:
        refused_with_the_install_line(tmp_path, hub)


def refused_with_the_install_line(tmp_path: Path, hub: EnvsHub) -> None:
    config = (REPO / "configs" / "rl" / "reverse-text.toml").read_text()
    assert 'id = "primeintellect/reverse-text"' in config
    (tmp_path / "configs" / "rl").mkdir(parents=True)
    path = tmp_path / "configs" / "rl" / "hub.toml"
    path.write_text(config.replace('id = "primeintellect/reverse-text"', 'id = "acme/word-count"', 1))
    line = "Install it from the Environments Hub (where there is a network): prime env install acme/word-count"
    run = prime("rl", "run", f"@{path}", cwd=tmp_path)
    assert run.returncode == 1 and run.stdout == "" and line in error_line(run), run.stderr
    assert prime("rl", "list", "-o", "json").stdout.strip() == "[]"
    evaluation = prime("eval", "run", "acme/word-count", cwd=tmp_path)
    assert evaluation.returncode == 1 and line in error_line(evaluation), evaluation.stderr
    asked = prime("rl", "run", f"@{path}", "--install", cwd=tmp_path, env={**os.environ, "PRIME_API_BASE_URL": hub.url})
    assert asked.returncode == 1 and asked.stdout == "", asked.stderr
    assert "acme/word-count is not installed: installing it from the Environments Hub (--install)" in asked.stderr
    assert error_line(asked) == (f"Error: no environment acme/word-count on the Environments Hub ({hub.url}) "
                                 "(Environment acme/word-count not found): check the id")
    assert prime("rl", "list", "-o", "json").stdout.strip() == "[]"
    gepa = prime("gepa", "run", "acme/word-count", "--install", cwd=tmp_path,
                 env={**os.environ, "PRIME_API_BASE_URL": hub.url})
    assert gepa.returncode == 1 and gepa.stdout == "", gepa.stderr
    assert "acme/word-count is not installed: installing it from the Environments Hub (--install)" in gepa.stderr
    assert error_line(gepa) == error_line(asked)
    assert prime("gepa", "list", "-o", "json").stdout.strip() == "[]"
    doctor = prime("lab", "doctor", "--plain", cwd=tmp_path)
    assert doctor.returncode == 1
    assert any(row.startswith("FAIL  configs/rl/hub.toml:") and "env[0].id: no environment 'acme/word-count'" in row
               and row.endswith(line + "; or fix the id (`prime env list` shows what is installed)")
               for row in doctor.stdout.splitlines()), doctor.stdout


def test_install_on_rl_run_installs_what_the_config_names_then_checks_it_as_before(
        hub: EnvsHub, lab: Lab, tmp_path: Path) -> None:  # noqa: F811 - the fixture imported above
    """`prime rl run --install`: acme/word-count installed from the Hub first (its lines on stderr, stdout stays the
    run id's), then loaded as every run's environments are: its arguments are not the config's, so no run starts."""
    config = (REPO / "configs" / "rl" / "reverse-text.toml").read_text()
    path = tmp_path / "hub.toml"
    path.write_text(config.replace('id = "primeintellect/reverse-text"', 'id = "acme/word-count"', 1))
    proc = lab.prime("rl", "run", f"@{path}", "--install")
    assert proc.returncode == 1 and proc.stdout == "", proc.stderr
    assert "acme/word-count is not installed: installing it from the Environments Hub (--install)" in proc.stderr
    assert lab.installed() == {"word-count": "1.1", "word-helper": "0.1"}
    assert error_line(proc) == ("Error: environment 'acme/word-count' does not take argument(s) max_words; its "
                                "arguments are: size=2")
    assert lab.prime("rl", "list", "-o", "json").stdout.strip() == "[]"


def test_the_base_url_and_the_key_come_from_where_prime_s_cli_keeps_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The variables, then a global `prime secret` (the key), then ~/.prime/config.json, then Prime's own base."""
    from prime_lab.envs.secret_store import SecretStore

    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("PRIME_API_BASE_URL", "PRIME_BASE_URL", "PRIME_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    assert (envs_hub.base_url(), envs_hub.api_key()) == ("https://api.primeintellect.ai", None)
    (tmp_path / ".prime").mkdir()
    (tmp_path / ".prime" / "config.json").write_text(json.dumps({"base_url": "http://hub.example/api/v1/",
                                                                 "api_key": "from-file"}))
    assert (envs_hub.base_url(), envs_hub.api_key()) == ("http://hub.example", "from-file")
    SecretStore().create("PRIME_API_KEY", "from-secret")
    assert envs_hub.api_key() == "from-secret"
    monkeypatch.setenv("PRIME_API_KEY", "from-env")
    monkeypatch.setenv("PRIME_BASE_URL", "http://other.example")
    assert (envs_hub.base_url(), envs_hub.api_key()) == ("http://other.example", "from-env")
    monkeypatch.setenv("PRIME_API_BASE_URL", "http://first.example")
    assert envs_hub.base_url() == "http://first.example"
