"""The Hub while environments load: offline unless it answered the probe or the user chose, restored afterwards;
failures in one line."""

from __future__ import annotations

import os

import pytest

from prime_lab.envs import hub


def test_the_hub_is_offline_while_loading_unless_the_user_chose(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets.config
    import huggingface_hub.constants

    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    with hub.offline_unless_chosen():
        assert os.environ["HF_HUB_OFFLINE"] == os.environ["HF_DATASETS_OFFLINE"] == "1"
        assert huggingface_hub.constants.is_offline_mode() and datasets.config.HF_HUB_OFFLINE
        assert not hub.offline_chosen_by_user()
    assert "HF_HUB_OFFLINE" not in os.environ and "HF_DATASETS_OFFLINE" not in os.environ
    assert not huggingface_hub.constants.is_offline_mode() and not datasets.config.HF_HUB_OFFLINE
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    with hub.offline_unless_chosen():
        assert os.environ["HF_HUB_OFFLINE"] == "0" and "HF_DATASETS_OFFLINE" not in os.environ
        assert not huggingface_hub.constants.is_offline_mode()


def test_failure_messages_name_the_dataset_and_where_to_point_instead() -> None:
    from datasets.exceptions import DatasetNotFoundError
    from huggingface_hub.errors import OfflineModeIsEnabled

    missing = DatasetNotFoundError("Dataset 'org/data' doesn't exist on the Hub or cannot be accessed.")
    message = hub.failure_message(missing, "you/env", {"source": "org/data", "dataset_split": "train"})
    assert message is not None and "\n" not in message
    assert message.startswith("environment 'you/env': dataset 'org/data' is not on the Hugging Face Hub or is not "
                              "public (a gated one needs HF_TOKEN); download it")
    assert message.endswith("pass source='/path/to/folder' (-a '{\"source\": \"/path/to/folder\"}')")
    try:
        try:
            raise OfflineModeIsEnabled("Cannot reach https://hf.co/api/datasets/org/other/revision/main: offline mode")
        except OfflineModeIsEnabled as exc:
            raise RuntimeError("building the dataset failed") from exc
    except RuntimeError as wrapped:
        offline = hub.failure_message(wrapped, "e", {"size": 3})
    assert offline is not None and "dataset 'org/other' is not on this machine and the Hub is offline" in offline
    assert offline.endswith("load it in the environment with datasets.load_dataset('/path/to/folder'), or from "
                            "files with datasets.load_dataset('json', data_files=...)")
    # Local problems are not Hub problems: they keep the loader's own message.
    assert hub.failure_message(FileNotFoundError("Couldn't find any data file at /x"), "e", {}) is None
    assert hub.failure_message(ValueError("Unknown split 'tets'"), "e", {}) is None


def test_a_hub_that_answers_stays_reachable_while_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants

    from tests.support.hf_hub import loopback_hub

    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    with loopback_hub([]) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        assert not hub.forced_offline()
        with hub.offline_unless_chosen():
            assert "HF_HUB_OFFLINE" not in os.environ and not huggingface_hub.constants.is_offline_mode()
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: offline, and the message says why
    assert hub.forced_offline()
    error = RuntimeError("x")
    error.__cause__ = type("OfflineModeIsEnabled", (Exception,), {"__module__": "huggingface_hub.errors"})(
        "Cannot reach https://huggingface.co/api/datasets/acme/data: offline mode is enabled.")
    line = hub.failure_message(error, "acme/env", {})
    assert line is not None and "acme/data" in line
    assert "the Hugging Face Hub at http://127.0.0.1:9 did not answer, so environments load offline" in line
