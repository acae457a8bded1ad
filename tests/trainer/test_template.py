"""The template `prime rl init` prints: valid as it stands, names every field, and valid with everything on."""

from __future__ import annotations

import re
import tomllib
from typing import Any, get_args, get_origin

from pydantic import BaseModel

from prime_lab.problems.validation import field_paths
from prime_lab.trainer.config import RLConfig, template_path, validate_rl_config

_SETTING_RE = re.compile(r"^# ?(\[\[?[A-Za-z][\w.-]*\]\]?|[A-Za-z_][\w.-]*\s*=)")
ALTERNATIVE = "alternative to"


def uncomment_settings(text: str, keep_commented: tuple[str, ...] = (), alternatives: bool = False) -> str:
    """Switch on every commented `# key = value` and `# [section]` line, leaving prose comments alone.

    A line (or a whole commented section) marked "alternative to" another spelling of the same setting stays off
    unless `alternatives`; so do the keys in `keep_commented`.
    """
    out: list[str] = []
    skipping = False
    for line in text.splitlines():
        if line.startswith("["):
            skipping = False
        match = _SETTING_RE.match(line)
        if not match:
            out.append(line)
            continue
        body = line[1:].removeprefix(" ")
        key = None if body.startswith("[") else body.split("=", 1)[0].strip()
        if key is None:
            skipping = ALTERNATIVE in line and not alternatives
        off = skipping or (ALTERNATIVE in line and not alternatives) or key in keep_commented
        out.append(line if off else body)
    return "\n".join(out) + "\n"


def _template() -> str:
    return template_path().read_text(encoding="utf-8")


def _has_path(data: Any, path: tuple[str, ...]) -> bool:
    node = data
    for part in path:
        if isinstance(node, list):
            node = node[0] if node else None
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def test_template_validates_as_printed() -> None:
    result = validate_rl_config(_template())
    assert not result.problems, [p.format() for p in result.problems]
    config = result.config
    assert config is not None
    assert config.model == "smollm2-135m" and [e.id for e in config.env] == ["primeintellect/reverse-text"]
    assert config.batch_size % config.rollouts_per_example == 0 and config.batch_size <= 32


def test_template_names_every_field() -> None:
    data = tomllib.loads(uncomment_settings(_template(), alternatives=True))
    missing = [".".join(p) for p in field_paths(RLConfig) if not _has_path(data, p)]
    assert not missing, f"fields not in trainer/template.toml: {missing}"


def _all_on(text: str) -> str:
    """Every setting on, with a loss that uses the [teacher] the template shows (with loss = "rl", the default,
    a teacher is an error)."""
    return text.replace('\nloss = "rl"', '\nloss = "sft"')


def test_template_with_every_setting_on_validates() -> None:
    result = validate_rl_config(_all_on(uncomment_settings(_template())))
    assert not result.errors, [p.format() for p in result.errors]
    assert result.config is not None and len(result.config.env) == 2
    assert {p.key for p in result.notes} >= {"tailscale", "checkpoints.keep_cloud", "infrastructure.compute_size"}


def test_each_alternative_spelling_also_validates_on_its_own() -> None:
    """The lines left off above are valid too, just not together with their other spelling."""
    text = _all_on(uncomment_settings(_template(), alternatives=True))
    result = validate_rl_config(text)
    assert {p.key for p in result.errors} == {
        "sampling.reasoning_effort", "teacher.sampling.reasoning_effort",
        "env[0].weight", "buffer.env_ratios", "lora.alpha", "difficulty_filter",
        "inference.tensor_parallel_size", "inference.base_urls"} - {"env[0].weight"}


def _section_model(annotation: Any) -> type[BaseModel] | None:
    for candidate in (annotation, *get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _defaults(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """Every optional leaf field with a default other than None, by path."""
    out: dict[tuple[str, ...], Any] = {}
    for name, info in model.model_fields.items():
        section = _section_model(info.annotation)
        if section is not None:
            if get_origin(info.annotation) is not list:  # [[env]]-like lists have examples, not defaults
                out.update(_defaults(section, prefix + (name,)))
        elif not info.is_required():
            default = info.get_default(call_default_factory=True)
            if default is not None:
                out[prefix + (name,)] = default
    return out


def test_template_comments_show_the_real_defaults() -> None:
    """A commented `key = value` whose field has a default shows exactly that default."""
    data = tomllib.loads(uncomment_settings(_template()))
    wrong = {}
    for path, default in _defaults(RLConfig).items():
        node: Any = data
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None and node != default and not callable(default):
            wrong[".".join(path)] = (node, default)
    assert not wrong, f"template value != schema default: {wrong}"
