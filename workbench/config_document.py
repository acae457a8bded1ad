"""One config file as ONE tomlkit document: the form and the TOML view both edit it.

tomlkit keeps comments, key order and formatting, so changing one value in the form changes one line of the file.
Validation uses the same problems collector as the CLI (`problems.validation`), picked by the config's kind.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import tomlkit
from pydantic import BaseModel
from tomlkit.exceptions import TOMLKitError
from tomlkit.items import AoT, Table

from prime_lab.problems.validation import KeyPath, Problem, Validation, validate_toml

if TYPE_CHECKING:
    from prime_lab.workbench.schema_fields import FieldSpec, SectionSpec

ConfigKind = Literal["rl", "sft", "gepa", "eval"]
Validator = Callable[[str, "str | None"], Validation[Any]]
# Settings a kind's schema keeps in a table that its configs may also write as one value: an SFT config's model is
# `[model] name = "..."` (prime-rl) or `model = "..."` (ours, the template's); the form's field edits either.
SHORTHANDS: dict[ConfigKind, dict[KeyPath, KeyPath]] = {"sft": {("model", "name"): ("model",)}}
# The losses that learn from a teacher: they need a [teacher] table (trainer/config.py's teacher check says so).
TEACHER_LOSSES = ("sft", "opd")
# Optional tables that another setting calls for, and the test for it: the form shows such a table only while it is
# called for or the file has it (an RL config's [teacher], with a distillation loss).
CALLED_FOR: dict[ConfigKind, dict[KeyPath, Callable[[ConfigDocument], bool]]] = {
    "rl": {("teacher",): lambda document: document.get(("loss",)) in TEACHER_LOSSES},
}


def _validate_rl(text: str, file: str | None) -> Validation[Any]:
    from prime_lab.trainer.config import validate_rl_config

    return validate_rl_config(text, file)


def _validate_sft(text: str, file: str | None) -> Validation[Any]:
    from prime_lab.trainer.sft_config import validate_sft_config

    return validate_sft_config(text, file)


def _validate_gepa(text: str, file: str | None) -> Validation[Any]:
    from prime_lab.gepa.config import validate_gepa_config

    return validate_gepa_config(text, file)


def _validate_eval(text: str, file: str | None) -> Validation[Any]:
    from prime_lab.evals.evaluation import EvalFileConfig

    return validate_toml(text, EvalFileConfig, file=file)


def schema_for(kind: ConfigKind) -> type[BaseModel]:
    if kind == "rl":
        from prime_lab.trainer.config import RLConfig

        return RLConfig
    if kind == "sft":
        from prime_lab.trainer.sft_config import SFTConfig

        return SFTConfig
    if kind == "eval":
        from prime_lab.evals.evaluation import EvalFileConfig

        return EvalFileConfig
    from prime_lab.gepa.config import GepaConfig

    return GepaConfig


def validator_for(kind: ConfigKind) -> Validator:
    return {"rl": _validate_rl, "sft": _validate_sft, "gepa": _validate_gepa, "eval": _validate_eval}[kind]


_DATA_TABLE = re.compile(r"^\s*\[\[?\s*data\s*[\].]", re.MULTILINE)  # [data], [data.loss_mask], [[data.source]]
_ENV_TABLE = re.compile(r"^\s*\[\[?\s*env\s*\]", re.MULTILINE)  # [env], [[env]]


def detect_kind(path: Path, text: str) -> ConfigKind:
    """GEPA when it sits under a `gepa` folder or has a [gepa] table; SFT when it sits under an `sft` folder or has a
    [data] table (prime-rl's SFT shape), and has no [env]/[[env]]; eval when it has one [env] and no max_steps."""
    if "gepa" in path.parts or "[gepa" in text:
        return "gepa"
    if ("sft" in path.parts or _DATA_TABLE.search(text)) and not _ENV_TABLE.search(text):
        return "sft"
    if "eval" in path.parts or ("max_steps" not in text and "[[env]]" not in text and "[env]" in text):
        return "eval"
    return "rl"


@dataclass
class ConfigDocument:
    """A config file's text, its tomlkit document (None while the text does not parse) and its problems."""

    path: Path
    kind: ConfigKind
    text: str
    saved_text: str
    doc: tomlkit.TOMLDocument | None = None
    problems: list[Problem] | None = None

    @classmethod
    def load(cls, path: Path) -> ConfigDocument:
        text = path.read_text(encoding="utf-8-sig")
        document = cls(path=path, kind=detect_kind(path, text), text=text, saved_text=text)
        document.set_text(text)
        return document

    @property
    def dirty(self) -> bool:
        return self.text != self.saved_text

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems or [] if p.severity == "error"]

    def set_text(self, text: str) -> None:
        """The TOML view changed: re-parse (keeping the last good document when it does not parse) and validate."""
        self.text = text
        try:
            self.doc = tomlkit.parse(text)
        except (TOMLKitError, ValueError):
            pass
        self.validate()

    def validate(self) -> list[Problem]:
        self.problems = validator_for(self.kind)(self.text, str(self.path)).problems
        return self.problems

    def spelled(self, path: KeyPath) -> KeyPath:
        """Where the document holds the setting at `path`: its shorthand, unless the document writes it as a table."""
        short = SHORTHANDS.get(self.kind, {}).get(path)
        if short is not None and not isinstance(self._get(short), dict):
            return short
        return path

    def model_name(self) -> Any:
        """The config's model (the value of `model`, or an SFT config's [model] name)."""
        return self.get(("model", "name")) if self.kind == "sft" else self.get(("model",))

    def get(self, path: KeyPath) -> Any:
        """The value at `path` as plain Python, or None when absent."""
        return self._get(self.spelled(path))

    def _get(self, path: KeyPath) -> Any:
        node: Any = self.doc
        for part in path:
            try:
                node = node[part]
            except (KeyError, IndexError, TypeError):
                return None
        return node.unwrap() if hasattr(node, "unwrap") else node

    def table_in_use(self, table: KeyPath) -> bool:
        """An optional table is in use when the file has it or another setting calls for it: then its required
        fields are required."""
        if self.get(table) is not None:
            return True
        called_for = CALLED_FOR.get(self.kind, {}).get(table)
        return called_for is not None and called_for(self)

    def field_required(self, section: SectionSpec, spec: FieldSpec) -> bool:
        """Whether the form shows a field as required now: required by the schema, in a table that is in use."""
        return spec.required and (section.optional_table is None or self.table_in_use(section.optional_table))

    def table_hidden(self, table: KeyPath) -> bool:
        """A table that only some settings call for, while none does and the file does not have it (the form hides
        [teacher] under loss = "rl")."""
        return table in CALLED_FOR.get(self.kind, {}) and not self.table_in_use(table)

    def set_value(self, path: KeyPath, value: Any) -> None:
        """The form changed: set (or, with None, remove) one value; the text is re-rendered from the document."""
        if self.doc is None:
            return
        *parents, key = self.spelled(path)
        node: Any = self.doc
        for part in parents:
            if isinstance(part, int):
                node = node[part]
            else:
                if part not in node:
                    if value is None:
                        return
                    node[part] = tomlkit.table()
                node = node[part]
        if value is None:
            if key in node:
                del node[key]
        else:
            node[key] = value
        self._render()

    def env_entries(self, key: str = "env") -> list[dict[str, Any]]:
        value = self.get((key,))
        if isinstance(value, dict):
            return [value]
        return [e for e in value or [] if isinstance(e, dict)]

    def add_env(self, env_id: str, args: dict[str, Any] | None = None, key: str = "env") -> None:
        if self.doc is None:
            return
        table = tomlkit.table()
        table["id"] = env_id
        if args:
            inline = tomlkit.inline_table()
            inline.update(args)
            table["args"] = inline
        current = self.doc.get(key)
        if isinstance(current, AoT):
            current.append(table)
        elif isinstance(current, Table):  # a single [env] table becomes the first [[env]] entry
            aot = tomlkit.aot()
            aot.append(current)
            aot.append(table)
            self.doc[key] = aot
        else:
            aot = tomlkit.aot()
            aot.append(table)
            self.doc[key] = aot
        self._render()

    def remove_env(self, index: int, key: str = "env") -> None:
        current = self.doc.get(key) if self.doc is not None else None
        if isinstance(current, AoT) and 0 <= index < len(current):
            del current[index]
            if not len(current):
                del self.doc[key]  # type: ignore[union-attr]
            self._render()

    def move_env(self, index: int, offset: int, key: str = "env") -> int:
        """Move entry `index` up (-1) or down (+1); returns its new index."""
        current = self.doc.get(key) if self.doc is not None else None
        target = index + offset
        if not isinstance(current, AoT) or not (0 <= index < len(current) and 0 <= target < len(current)):
            return index
        tables = list(current.body)
        tables[index], tables[target] = tables[target], tables[index]
        aot = tomlkit.aot()
        for table in tables:
            aot.append(table)
        self.doc[key] = aot  # type: ignore[index]
        self._render()
        return target

    def _render(self) -> None:
        assert self.doc is not None
        self.text = self.doc.as_string()
        self.validate()

    def save(self) -> None:
        self.path.write_text(self.text, encoding="utf-8")
        self.saved_text = self.text

    def problem_paths(self) -> set[str]:
        """Dotted keys with an error (the form marks these fields)."""
        return {p.key for p in self.errors if p.key}
