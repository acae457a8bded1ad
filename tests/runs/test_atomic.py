import json
import os
from pathlib import Path

import pytest

from prime_lab.runs import atomic
from prime_lab.runs.atomic import (
    publish_folder,
    staging_folder,
    staging_leftovers,
    write_folder_atomic,
    write_json_atomic,
    write_text_atomic,
)


def test_json_is_written_whole_and_replaces_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "status.json"
    write_json_atomic(path, {"state": "running", "at": tmp_path})
    write_json_atomic(path, {"state": "completed"}, durable=True)
    assert json.loads(path.read_text()) == {"state": "completed"} and path.read_text().endswith("}\n")
    assert [p.name for p in path.parent.iterdir()] == ["status.json"]  # no temporary file left behind


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    tmp_path = tmp_path / "rollouts"
    path = tmp_path / "step_1.jsonl"
    write_text_atomic(path, "old\n")
    with pytest.raises(TypeError):
        write_text_atomic(path, None)  # type: ignore[arg-type]
    target = tmp_path / "a-folder"
    (target / "inside").mkdir(parents=True)
    with pytest.raises(OSError):
        write_text_atomic(target, "cannot replace a folder\n")
    assert path.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["a-folder", "step_1.jsonl"]


def _contents(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in folder.iterdir()}


def test_a_folder_is_published_whole_and_leaves_nothing_beside_it(tmp_path: Path) -> None:
    final = tmp_path / "adapters" / "step_1"
    with write_folder_atomic(final) as staged:
        assert staged.parent == final.parent and staged.name.startswith(".step_1.") and not final.exists()
        (staged / "adapter_config.json").write_text("{}")
        assert staging_leftovers(final) == [staged]
    assert _contents(final) == {"adapter_config.json": "{}"}
    assert [p.name for p in final.parent.iterdir()] == ["step_1"] and staging_leftovers(final) == []


@pytest.mark.parametrize("swap", [True, False], ids=["exchange", "old-aside"])
def test_publishing_replaces_an_existing_folder_with_the_new_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 swap: bool) -> None:
    if not swap:  # a system or file system without renameat2's exchange
        monkeypatch.setattr(atomic, "_exchange", lambda a, b: False)
    final = tmp_path / "models" / "model"
    with write_folder_atomic(final) as staged:
        (staged / "old.safetensors").write_text("old")
        (staged / "config.json").write_text("old")
    with write_folder_atomic(final) as staged:
        (staged / "config.json").write_text("new")
    assert _contents(final) == {"config.json": "new"}
    assert [p.name for p in final.parent.iterdir()] == ["model"]  # the old folder is gone, not set aside


def test_a_failure_while_writing_leaves_the_old_folder_intact(tmp_path: Path) -> None:
    final = tmp_path / "weights" / "step_3"
    with write_folder_atomic(final) as staged:
        (staged / "weights").write_text("complete")
    with pytest.raises(KeyboardInterrupt), write_folder_atomic(final) as staged:
        (staged / "weights").write_text("half")
        raise KeyboardInterrupt
    assert _contents(final) == {"weights": "complete"} and [p.name for p in final.parent.iterdir()] == ["step_3"]


def test_a_failed_swap_puts_the_old_folder_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    final = tmp_path / "step_3"
    with write_folder_atomic(final) as staged:
        (staged / "weights").write_text("complete")
    staged = staging_folder(final)
    (staged / "weights").write_text("new")
    monkeypatch.setattr(atomic, "_exchange", lambda a, b: False)
    rename = os.rename

    def rename_failing_onto_final(src: Path, dst: Path) -> None:
        if Path(src) == staged and Path(dst) == final and not final.exists():  # after the old one moved aside
            raise OSError(28, "No space left on device")
        rename(src, dst)

    monkeypatch.setattr(atomic.os, "rename", rename_failing_onto_final)
    with pytest.raises(OSError, match="No space"):
        publish_folder(staged, final)
    assert _contents(final) == {"weights": "complete"} and staging_leftovers(final) == [staged]


def test_publishing_without_replace_keeps_the_folder_that_is_there(tmp_path: Path) -> None:
    final = tmp_path / "models" / "smollm2"
    with write_folder_atomic(final, replace=False) as staged:
        (staged / "config.json").write_text("first")
    with pytest.raises(FileExistsError), write_folder_atomic(final, replace=False) as staged:
        (staged / "config.json").write_text("second")
    assert _contents(final) == {"config.json": "first"} and [p.name for p in final.parent.iterdir()] == ["smollm2"]


def test_staging_leftovers_are_those_of_the_one_folder(tmp_path: Path) -> None:
    mine = staging_folder(tmp_path / "step_1")
    staging_folder(tmp_path / "step_10")
    (tmp_path / ".step_1.tmp").mkdir()
    assert staging_leftovers(tmp_path / "step_1") == [mine]
    assert staging_leftovers(tmp_path / "missing" / "step_1") == []
