"""`prime secret` and `prime env secret` as a user meets them: every verb, values typed at a hidden prompt (here
through a pipe), names refused by Prime's rule, and no value ever printed."""

from __future__ import annotations

import json
import os
from functools import partial
from pathlib import Path

from tests.support import cli
from tests.support.rl_runs import fixture_envs  # noqa: F401  (autouse: the needs-key test environment resolves)

prime = partial(cli.prime, timeout=60)
VALUE, OTHER = "sk-global-4f1d9a", "sk-typed-7c2e0b"


def shown(*procs: object) -> str:
    return "".join(p.stdout + p.stderr for p in procs)  # type: ignore[attr-defined]


def test_global_secret_verbs(lab_home: Path) -> None:
    created = prime("secret", "create", "-n", "OPENAI_API_KEY", "-v", VALUE)
    assert created.returncode == 0, created.stderr
    assert "created global secret OPENAI_API_KEY" in created.stderr
    typed = prime("secret", "create", "-n", "JUDGE_KEY", input=OTHER + "\n")  # no -v: read from stdin
    assert typed.returncode == 0, typed.stderr
    listed = json.loads(prime("secret", "list", "-o", "json").stdout)
    assert [(s["name"], s["scope"]) for s in listed] == [("JUDGE_KEY", "global"), ("OPENAI_API_KEY", "global")]
    assert all(set(s) == {"name", "scope", "created_at", "updated_at"} for s in listed)
    table = prime("secret", "list")
    assert "OPENAI_API_KEY" in table.stdout and "JUDGE_KEY" in table.stdout
    again = prime("secret", "create", "-n", "OPENAI_API_KEY", "-v", "x")
    assert again.returncode == 1 and "`prime secret update OPENAI_API_KEY`" in again.stderr

    updated = prime("secret", "update", "OPENAI_API_KEY", input="sk-rotated-1\n")
    assert updated.returncode == 0 and "updated global secret OPENAI_API_KEY" in updated.stderr
    missing = prime("secret", "update", "NOPE", "-v", "x")
    assert missing.returncode == 1 and "`prime secret create -n NOPE`" in missing.stderr
    kept = prime("secret", "delete", "JUDGE_KEY", input="n\n")  # asked, and answered no
    assert kept.returncode == 1 and "Delete global secret JUDGE_KEY?" in kept.stdout + kept.stderr
    deleted = prime("secret", "delete", "JUDGE_KEY", "-y")
    assert deleted.returncode == 0 and "deleted global secret JUDGE_KEY" in deleted.stderr
    assert [s["name"] for s in json.loads(prime("secret", "list", "-o", "json").stdout)] == ["OPENAI_API_KEY"]
    store = json.loads((lab_home / "secrets" / "secrets.json").read_text())
    assert store["global"]["OPENAI_API_KEY"]["value"] == "sk-rotated-1"
    everything = shown(created, typed, table, again, updated, missing, kept, deleted)
    assert VALUE not in everything and OTHER not in everything and "sk-rotated-1" not in everything


def test_names_outside_prime_rule_are_refused_with_the_rule(lab_home: Path) -> None:
    for name in ("openai_api_key", "1KEY", "MY-KEY"):
        proc = prime("secret", "create", "-n", name, "-v", "x")
        assert proc.returncode == 1 and "^[A-Z][A-Z0-9_]*$" in proc.stderr, proc.stderr
        proc = prime("env", "secret", "create", "needs-key", "-n", name, "-v", "x")
        assert proc.returncode == 1 and "^[A-Z][A-Z0-9_]*$" in proc.stderr, proc.stderr
    assert not (lab_home / "secrets" / "secrets.json").exists()
    empty = prime("secret", "create", "-n", "EMPTY", input="\n")
    assert empty.returncode == 1 and "cannot be empty" in empty.stderr


def test_environment_secret_verbs(lab_home: Path) -> None:
    created = prime("env", "secret", "create", "needs-key", "-n", "NEEDS_KEY_TOKEN", input=OTHER + "\n")
    assert created.returncode == 0 and "environment needs-key's secret NEEDS_KEY_TOKEN" in created.stderr
    for spelling in ("needs-key", "primeintellect/needs-key", "needs_key"):
        listed = json.loads(prime("env", "secret", "list", spelling, "-o", "json").stdout)
        assert [(s["name"], s["scope"]) for s in listed] == [("NEEDS_KEY_TOKEN", "needs-key")]
    assert json.loads(prime("secret", "list", "-o", "json").stdout) == []  # global ones only
    every = json.loads(prime("secret", "list", "--all", "-o", "json").stdout)
    assert [(s["name"], s["scope"]) for s in every] == [("NEEDS_KEY_TOKEN", "needs-key")]
    table = prime("env", "secret", "list", "needs-key")
    assert "NEEDS_KEY_TOKEN" in table.stdout and OTHER not in shown(created, table)
    updated = prime("env", "secret", "update", "needs-key", "NEEDS_KEY_TOKEN", "-v", "sk-new-value")
    assert updated.returncode == 0, updated.stderr
    unknown = prime("env", "secret", "create", "no-such-env", "-n", "A_KEY", "-v", "x")
    assert unknown.returncode == 1 and "no environment 'no-such-env'" in unknown.stderr
    deleted = prime("env", "secret", "delete", "needs-key", "NEEDS_KEY_TOKEN", "-y")
    assert deleted.returncode == 0
    assert json.loads(prime("env", "secret", "list", "needs-key", "-o", "json").stdout) == []
    gone = prime("env", "secret", "delete", "needs-key", "NEEDS_KEY_TOKEN", "-y")
    assert gone.returncode == 1 and "`prime env secret create needs-key -n NEEDS_KEY_TOKEN`" in gone.stderr


def test_a_store_others_can_read_is_refused(lab_home: Path) -> None:
    assert prime("secret", "create", "-n", "A_KEY", "-v", VALUE).returncode == 0
    store = lab_home / "secrets" / "secrets.json"
    os.chmod(store, 0o644)
    proc = prime("secret", "list")
    assert proc.returncode == 1 and f"chmod 600 {store}" in proc.stderr and VALUE not in proc.stdout
