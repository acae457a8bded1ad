"""The secrets store (envs/secret_store.py): its file's modes, atomic writes, the refusal of a store others can read,
Prime's name rule, scopes and precedence; and the message for a key an environment asks for that is not set."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from prime_lab.envs import EnvironmentLoadError, MissingKeyError, ensure_keys, load_environment, redact
from prime_lab.envs.secret_store import SecretError, SecretStore, apply_secrets, secret_environment, store_path
from prime_lab.envs.secrets import SECRET_NAMES_VARIABLE, missing_key_message
from prime_lab.runs import atomic
from tests.support.rl_runs import FIXTURE_ENVS


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_store_is_one_file_its_owner_alone_reads_in_a_folder_only_they_enter(lab_home: Path) -> None:
    old_umask = os.umask(0)  # the most permissive umask: the modes are ours, not the umask's
    try:
        SecretStore().create("OPENAI_API_KEY", "sk-one")
    finally:
        os.umask(old_umask)
    path = store_path()
    assert path == lab_home / "secrets" / "secrets.json"
    assert mode(path) == 0o600 and mode(path.parent) == 0o700
    assert sorted(p.name for p in path.parent.iterdir()) == [".lock", "secrets.json"]  # no temporary file left
    assert mode(path.parent / ".lock") == 0o600


def test_the_mode_is_set_before_the_content_lands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The temporary file is 0600 when it is opened for writing, before a byte is in it (and after the rename)."""
    seen: list[tuple[int, int]] = []
    real_fdopen = os.fdopen

    def spying_fdopen(fd: int, *args: Any, **kwargs: Any) -> Any:
        info = os.fstat(fd)
        seen.append((stat.S_IMODE(info.st_mode), info.st_size))
        return real_fdopen(fd, *args, **kwargs)

    monkeypatch.setattr(atomic.os, "fdopen", spying_fdopen)
    old_umask = os.umask(0)
    try:
        path = atomic.write_text_atomic(tmp_path / "s.json", "secret\n", mode=0o600)
    finally:
        os.umask(old_umask)
    assert seen == [(0o600, 0)] and mode(path) == 0o600 and path.read_text() == "secret\n"


def test_an_update_replaces_the_file_whole(lab_home: Path) -> None:
    store = SecretStore()
    store.create("A_KEY", "first")
    before = store.secret("A_KEY")
    inode = store_path().stat().st_ino
    store.update("A_KEY", "second")
    after = store.secret("A_KEY")
    assert store_path().stat().st_ino != inode  # a new file renamed over the old one, never rewritten in place
    assert after.value == "second" and after.created_at == before.created_at and mode(store_path()) == 0o600
    assert json.loads(store_path().read_text())["global"]["A_KEY"]["value"] == "second"


def test_a_store_others_can_read_is_refused_with_the_chmod_that_fixes_it(lab_home: Path) -> None:
    store = SecretStore()
    store.create("A_KEY", "value-1")
    os.chmod(store_path(), 0o644)
    with pytest.raises(SecretError, match=r"can be read by others \(mode 0644\).*chmod 600 .*secrets\.json"):
        store.secrets()
    with pytest.raises(SecretError, match="chmod 600"):
        store.values_for([])
    with pytest.raises(SecretError, match="chmod 600"):  # nor written: it would be read first
        store.create("B_KEY", "value-2")
    os.chmod(store_path(), 0o600)
    assert [s.name for s in store.secrets()] == ["A_KEY"]


@pytest.mark.parametrize("name", ["openai_api_key", "1KEY", "_KEY", "MY-KEY", "MY KEY", "KEY!", "", "Key"])
def test_names_follow_prime_rule(name: str, lab_home: Path) -> None:
    with pytest.raises(SecretError, match=r"\^\[A-Z\]\[A-Z0-9_\]\*\$"):
        SecretStore().create(name, "v")
    assert not store_path().exists()


def test_create_update_delete_in_each_scope(lab_home: Path) -> None:
    store = SecretStore()
    store.create("SHARED", "global-value")
    store.create("SHARED", "env-value", "primeintellect/needs-key")
    with pytest.raises(SecretError, match="already exists; change it with `prime secret update SHARED`"):
        store.create("SHARED", "again")
    with pytest.raises(SecretError, match="`prime env secret update needs_key SHARED`"):
        store.create("SHARED", "again", "needs_key")  # any spelling of the id names the same environment
    with pytest.raises(SecretError, match="no global secret OTHER .*`prime secret create -n OTHER`"):
        store.update("OTHER", "v")
    with pytest.raises(SecretError, match="`prime env secret create needs-key -n OTHER`"):
        store.delete("OTHER", "needs-key")
    with pytest.raises(SecretError, match="cannot be empty"):
        store.create("EMPTY", "")
    assert [(s.name, s.scope) for s in store.secrets()] == [("SHARED", "global")]
    assert [(s.name, s.scope) for s in store.secrets("needs-key")] == [("SHARED", "primeintellect/needs-key")]
    assert [s.scope for s in store.all_secrets()] == ["global", "primeintellect/needs-key"]
    assert "env-value" not in repr(store.all_secrets()) and "value" not in store.secrets()[0].to_json()
    store.delete("SHARED", "needs_key")
    assert store.secrets("needs-key") == [] and json.loads(store_path().read_text())["environments"] == {}


def test_precedence_global_then_the_environment_then_anything_set_elsewhere(lab_home: Path) -> None:
    store = SecretStore()
    store.create("A", "global-a")
    store.create("B", "global-b")
    store.create("C", "global-c")
    store.create("B", "env-b", "needs-key")
    store.create("D", "other-env-d", "tiny-chars")
    assert store.values_for(["needs-key"]) == {"A": "global-a", "B": "env-b", "C": "global-c"}
    child = secret_environment(["primeintellect/needs-key"], set_elsewhere={"C"}, store=store)
    assert child == {"A": "global-a", "B": "env-b", SECRET_NAMES_VARIABLE: "A,B"}
    assert secret_environment(["needs-key"], set_elsewhere={"A", "B", "C"}, store=store) == {}


def test_apply_secrets_fills_only_what_is_unset_and_redaction_knows_the_values(
        lab_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = SecretStore()
    store.create("NEEDS_KEY_TOKEN", "tok")
    store.create("SHELL_WINS", "stored-value")
    store.create("PLAIN_NAME", "a-stored-value-9")
    monkeypatch.setenv("SHELL_WINS", "from-the-shell")
    for name in ("NEEDS_KEY_TOKEN", "PLAIN_NAME", SECRET_NAMES_VARIABLE):
        monkeypatch.delenv(name, raising=False)
    assert apply_secrets(["needs-key"], store=store) == ["NEEDS_KEY_TOKEN", "PLAIN_NAME"]
    assert os.environ["NEEDS_KEY_TOKEN"] == "tok" and os.environ["SHELL_WINS"] == "from-the-shell"
    assert os.environ[SECRET_NAMES_VARIABLE] == "NEEDS_KEY_TOKEN,PLAIN_NAME"
    # a name that looks like no key still has its value redacted (values of 6 characters and more)
    assert redact({"row": "saw a-stored-value-9"}) == {"row": "saw ***"}


def test_a_missing_key_names_the_key_and_the_commands_that_store_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NEEDS_KEY_TOKEN", raising=False)
    monkeypatch.syspath_prepend(str(FIXTURE_ENVS))
    with pytest.raises(EnvironmentLoadError) as info:
        load_environment("needs-key")
    message = str(info.value)
    assert message.startswith("environment 'needs-key' needs NEEDS_KEY_TOKEN, not set")
    assert "`prime secret create -n NEEDS_KEY_TOKEN`" in message
    assert "`prime env secret create needs-key -n NEEDS_KEY_TOKEN`" in message
    with pytest.raises(MissingKeyError) as ours:
        ensure_keys(["A_KEY", "lower_key"])
    assert ours.value.keys == ["A_KEY", "lower_key"]
    several = missing_key_message(ours.value, "x") or ""
    assert "needs A_KEY, lower_key" in several and "`prime secret create -n A_KEY`" in several
    assert "lower_key`" not in several  # a name Prime's rule refuses is not offered to `prime secret create`
    assert missing_key_message(ValueError("something else"), "x") is None


def test_verifiers_missing_key_error_gets_the_same_message() -> None:
    vf = pytest.importorskip("verifiers")
    try:
        vf.ensure_keys(["NO_SUCH_KEY_SET_ANYWHERE"])
    except Exception as exc:  # verifiers' MissingKeyError (a ValueError with .keys)
        try:
            raise RuntimeError("load_environment failed") from exc
        except RuntimeError as wrapped:
            message = missing_key_message(wrapped, "me/judge") or ""
    assert "environment 'me/judge' needs NO_SUCH_KEY_SET_ANYWHERE" in message
    assert "`prime secret create -n NO_SUCH_KEY_SET_ANYWHERE`" in message
