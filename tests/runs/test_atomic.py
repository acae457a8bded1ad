import json
from pathlib import Path

import pytest

from prime_lab.runs.atomic import write_json_atomic, write_text_atomic


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
