"""The form's layout, read from a pydantic schema: sections, fields, each with its type, default and help."""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from prime_lab.problems.validation import KeyPath, dotted

FieldKind = Literal["bool", "int", "float", "str", "choice", "value"]


@dataclass(frozen=True)
class FieldSpec:
    """One form field: where it lives in the TOML, what it holds and what it defaults to."""

    path: KeyPath
    kind: FieldKind
    help: str
    default: str
    required: bool
    choices: tuple[str, ...] = ()
    optional: bool = False

    @property
    def key(self) -> str:
        return dotted(self.path)

    @property
    def type_name(self) -> str:
        return "|".join(self.choices) if self.kind == "choice" else ("TOML" if self.kind == "value" else self.kind)


@dataclass(frozen=True)
class SectionSpec:
    """A group of fields: `()` for the top level, ("sampling",) for [sampling]; `entries` for [[env]] lists.

    `optional_table` is the optional table the section sits in (("teacher",) for [teacher] and [teacher.client]):
    a file may leave it out, and then its required fields are not required."""

    path: KeyPath
    fields: tuple[FieldSpec, ...]
    help: str = ""
    entries: type[BaseModel] | None = None  # a list of tables ([[env]]): the entry schema
    optional_table: KeyPath | None = None

    @property
    def title(self) -> str:
        if not self.path:
            return "Core"
        return f"[[{dotted(self.path)}]]" if self.entries else f"[{dotted(self.path)}]"


def _strip_optional(annotation: Any) -> tuple[Any, bool]:
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return annotation, False


def _unannotated(annotation: Any) -> Any:
    while hasattr(annotation, "__metadata__"):
        annotation = get_args(annotation)[0]
    return annotation


def _model(annotation: Any) -> type[BaseModel] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _list_of_models(annotation: Any) -> type[BaseModel] | None:
    if get_origin(annotation) is list:
        args = get_args(annotation)
        return _model(args[0]) if args else None
    return None


def _kind(annotation: Any) -> tuple[FieldKind, tuple[str, ...]]:
    annotation = _unannotated(annotation)
    if get_origin(annotation) is Literal:
        return "choice", tuple(str(a) for a in get_args(annotation))
    if annotation is bool:
        return "bool", ()
    if annotation is int:
        return "int", ()
    if annotation is float:
        return "float", ()
    if annotation is str:
        return "str", ()
    return "value", ()


def _default_text(info: Any) -> str:
    if info.default is not PydanticUndefined:
        value = info.default
    elif info.default_factory is not None:
        try:
            value = info.default_factory()
        except TypeError:
            return ""
    else:
        return ""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, BaseModel):
        return ""
    return repr(value) if isinstance(value, str) else str(value)


def field_spec(path: KeyPath, info: Any) -> FieldSpec:
    annotation, optional = _strip_optional(info.annotation)
    kind, choices = _kind(annotation)
    help_text = (info.description or "").split(". ")[0].rstrip(".")
    return FieldSpec(path=path, kind=kind, help=help_text, default=_default_text(info),
                     required=info.is_required(), choices=choices, optional=optional)


def _table_sections(path: KeyPath, schema: type[BaseModel], help_text: str,
                    optional_table: KeyPath | None = None) -> list[SectionSpec]:
    """A table's fields, then a section per table nested in it ([teacher.sampling]), depth first; a table with no
    fields of its own ([monitors]) has no section."""
    fields: list[FieldSpec] = []
    nested: list[SectionSpec] = []
    for name, info in schema.model_fields.items():
        annotation, optional = _strip_optional(info.annotation)
        sub = _model(annotation)
        if sub is not None:
            inner = optional_table or ((path + (name,)) if optional else None)
            nested += _table_sections(path + (name,), sub, info.description or "", inner)
        elif _list_of_models(info.annotation) is None:  # (a list of tables inside a table: the TOML view edits it)
            fields.append(field_spec(path + (name,), info))
    own = [SectionSpec(path, tuple(fields), help=help_text, optional_table=optional_table)] if fields else []
    return own + nested


def sections(schema: type[BaseModel]) -> list[SectionSpec]:
    """The top-level fields, then one section per table (nested tables after theirs), in the schema's order."""
    top: list[FieldSpec] = []
    out: list[SectionSpec] = []
    for name, info in schema.model_fields.items():
        annotation, optional = _strip_optional(info.annotation)
        sub = _model(annotation)
        entries = _list_of_models(annotation)
        if sub is not None:
            out += _table_sections((name,), sub, info.description or "", (name,) if optional else None)
        elif entries is not None:
            fields = [field_spec((n,), i) for n, i in entries.model_fields.items()]
            out.append(SectionSpec((name,), tuple(fields), help=info.description or "", entries=entries))
        else:
            top.append(field_spec((name,), info))
    return [SectionSpec((), tuple(top))] + out
