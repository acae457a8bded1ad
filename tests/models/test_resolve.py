"""resolve_model: presets, local folders, the Hugging Face cache, and a clear message for anything else."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from prime_lab.models import ModelNotFoundError, resolve_model
from prime_lab.models.store import materialise


def test_unknown_model_says_what_to_do() -> None:
    with pytest.raises(ModelNotFoundError) as info:
        resolve_model("someone/not-on-this-machine")
    message = str(info.value)
    assert "'someone/not-on-this-machine'" in message
    assert "prime rl models" in message and "smollm2-135m" in message  # a preset
    assert "local folder" in message  # a folder on disk
    assert "hub access" in message and "hf download someone/not-on-this-machine" in message


def test_local_folder_resolves_to_itself(tiny_model_dir: Path) -> None:
    assert resolve_model(str(tiny_model_dir)) == tiny_model_dir.resolve()


def test_folder_without_config_is_refused_with_the_reason(tmp_path: Path) -> None:
    (tmp_path / "weights").mkdir()
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        resolve_model(str(tmp_path / "weights"))


def test_hugging_face_id_in_the_local_cache_resolves_offline(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The layout huggingface_hub writes: models--OWNER--NAME/{refs/main, snapshots/<commit>/...}.
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--acme--tiny-chat"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    shutil.copytree(tiny_model_dir, repo / "snapshots" / commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_model("acme/tiny-chat") == repo / "snapshots" / commit
    with pytest.raises(ModelNotFoundError):
        resolve_model("acme/other-model")


def test_a_build_that_crashes_leaves_no_model_and_no_partial_folder(tmp_path: Path) -> None:
    def crash_halfway(folder: Path) -> None:
        (folder / "config.json").write_text("{}")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        materialise(tmp_path / "models" / "m", crash_halfway)
    assert list((tmp_path / "models").iterdir()) == []


def test_materialise_builds_once_then_reuses(tmp_path: Path) -> None:
    builds: list[Path] = []

    def build(folder: Path) -> None:
        builds.append(folder)
        (folder / "config.json").write_text("{}")

    first = materialise(tmp_path / "m", build)
    second = materialise(tmp_path / "m", build)
    assert first == second == tmp_path / "m" and len(builds) == 1
    assert (first / "config.json").is_file()


def _sft_run(name: str, *, state: str = "completed", with_model: bool = True, created_at: float = 0.0) -> Path:
    from prime_lab.runs.registry import RunRegistry

    run = RunRegistry().create("sft", config_text="", resolved={}, name=name, max_steps=1)
    run.update_status(state=state, created_at=created_at)
    if with_model:
        run.model_dir.mkdir()
        (run.model_dir / "config.json").write_text("{}")
    return run.model_dir


def test_a_completed_sft_run_is_a_model_by_its_id_and_its_name() -> None:
    from prime_lab.models.resolve import local_model_folder

    older = _sft_run("warm-up", created_at=1.0)
    newer = _sft_run("warm-up", created_at=2.0)
    assert resolve_model(older.parent.name) == older.resolve()
    assert resolve_model("warm-up") == newer.resolve()  # the newest run of that name
    assert local_model_folder("warm-up") == newer.resolve()


def test_a_run_without_a_model_says_why() -> None:
    from prime_lab.runs.registry import RunRegistry

    stopped = _sft_run("half", state="stopped", with_model=False)
    with pytest.raises(ModelNotFoundError, match=f"SFT run {stopped.parent.name} has no model yet \\(stopped\\).*"
                                                 "prime sft restart"):
        resolve_model(stopped.parent.name)
    rl = RunRegistry().create("rl", config_text="", resolved={}, max_steps=1)
    with pytest.raises(ModelNotFoundError, match="is an rl run: only an SFT run's id names a model"):
        resolve_model(rl.id)
    with pytest.raises(ModelNotFoundError, match="a completed SFT run's id or --name"):
        resolve_model("half")  # a name whose run has no model: not found, and the message says what works
