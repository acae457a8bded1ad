"""trainer/lora_targets.py's local check (`prime rl validate`, `prime rl run`): a model's outline is built on the
meta device once per configuration and read from the cache after that, without importing torch or transformers;
it is the outline of the model itself, and another configuration (or a damaged cache file) builds its own."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from prime_lab.trainer.lora_targets import ModelOutline, local_outline, outline_key

CHECK = """
import json, sys
from prime_lab.trainer.lora_targets import local_target_problems
problems = local_target_problems(sys.argv[1], json.loads(sys.argv[2]), [])
loaded = {name: name in sys.modules for name in ("torch", "transformers")}
print(json.dumps({"problems": problems, **loaded}))
"""


def check(folder: Path, targets: list[str]) -> dict[str, Any]:
    """The local check in a fresh interpreter, and whether it imported torch and transformers."""
    done = subprocess.run([sys.executable, "-c", CHECK, str(folder), json.dumps(targets)], capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout.splitlines()[-1]))


def test_an_outline_is_built_once_per_configuration_then_read_without_torch(
        tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRIME_LAB_CACHE", str(tmp_path / "cache"))
    first, again = check(tiny_model_dir, ["q_proj", "nope_proj"]), check(tiny_model_dir, ["q_proj", "nope_proj"])
    assert (first["torch"], first["transformers"]) == (True, True)
    assert (again["torch"], again["transformers"]) == (False, False)
    assert first["problems"] == again["problems"]
    [[key, message]] = again["problems"]
    assert key == "target_modules" and message.startswith(f"nope_proj not found in {tiny_model_dir}; its linear "
                                                          "layers are down_proj, gate_proj, k_proj, lm_head"), message
    assert check(tiny_model_dir, ["q_proj", "v_proj"])["problems"] == []

    # what the cache holds is the outline of the model itself
    from transformers import AutoModelForCausalLM

    assert local_outline(tiny_model_dir) == ModelOutline.of(AutoModelForCausalLM.from_pretrained(tiny_model_dir))
    [cached] = (tmp_path / "cache" / "model-outlines").iterdir()
    assert cached.name == f"{outline_key((tiny_model_dir / 'config.json').read_bytes())}.json"

    # another configuration: another key, its own outline
    other = tmp_path / "one-layer"
    shutil.copytree(tiny_model_dir, other)
    config = json.loads((other / "config.json").read_text())
    config["num_hidden_layers"] = 1
    config["layer_types"] = config.get("layer_types", [])[:1] or None
    (other / "config.json").write_text(json.dumps(config))
    assert check(other, ["q_proj"])["torch"] is True
    assert len(local_outline(other).modules) < len(local_outline(tiny_model_dir).modules)

    # a damaged cache file is built again, and replaced
    cached.write_text("{not json")
    rebuilt = check(tiny_model_dir, ["nope_proj"])
    assert rebuilt["torch"] is True and rebuilt["problems"] == first["problems"]
    assert json.loads(cached.read_text())["linear"]
