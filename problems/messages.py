"""From pydantic's validation errors to messages a person can act on: the key as the user wrote it and what to write.

`error_message` words one pydantic error (a missing key says where to add it and with what placeholder, an unknown
key gets the nearest valid name or the section it belongs in, a wrong type says how to write the value);
`normalise_loc` maps pydantic's location to the key path in the document. `validation` turns these into problems.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel

from prime_lab.problems.toml_lines import KeyPath


def _field_names(model: type[BaseModel]) -> list[str]:
    names: list[str] = []
    for name, info in model.model_fields.items():
        names.append(info.alias or name)
        for alias in _validation_aliases(info):
            if alias not in names:
                names.append(alias)
    return names


def _validation_aliases(info: Any) -> list[str]:
    alias = getattr(info, "validation_alias", None)
    if alias is None:
        return []
    choices = getattr(alias, "choices", None)
    if choices:
        return [c for c in choices if isinstance(c, str)]
    return [alias] if isinstance(alias, str) else []


def _submodel_at(model: type[BaseModel], path: KeyPath) -> type[BaseModel] | None:
    """The pydantic model that owns the keys at `path` (indices into lists are skipped)."""
    current: type[BaseModel] | None = model
    for part in path:
        if current is None:
            return None
        if isinstance(part, int):
            continue
        info = _find_field(current, part)
        if info is None:
            return None
        current = _model_in_annotation(info.annotation)
    return current


def _find_field(model: type[BaseModel], key: str) -> Any:
    for name, info in model.model_fields.items():
        if key == name or key == info.alias or key in _validation_aliases(info):
            return info
    return None


def _model_in_annotation(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_in_annotation(arg)
        if found is not None:
            return found
    return None


def _is_list(annotation: Any) -> bool:
    if getattr(annotation, "__origin__", None) is list:
        return True
    return any(_is_list(arg) for arg in getattr(annotation, "__args__", ()) or ())


def field_paths(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every key path the schema accepts (sections and their fields; list items share their list's path)."""
    out: list[tuple[str, ...]] = []
    for name, info in model.model_fields.items():
        path = prefix + (info.alias or name,)
        out.append(path)
        sub = _model_in_annotation(info.annotation)
        if sub is not None:
            out += field_paths(sub, path)
    return out


def _normal(name: str) -> str:
    return name.lower().replace("-", "_")


def nearest_name(key: str, candidates: Iterable[str]) -> str | None:
    """The candidate `key` most likely misspells (case and `-`/`_` do not count), or None."""
    by_normal = {_normal(c): c for c in candidates}
    matches = difflib.get_close_matches(_normal(key), list(by_normal), n=1, cutoff=0.6)
    return by_normal[matches[0]] if matches else None


def suggest_key(model: type[BaseModel], loc: KeyPath) -> tuple[str | None, str | None]:
    """For an unknown key at `loc`: (the name to use instead, a hint when it belongs in another section).

    A key that is exactly a field of another section (`temperature` at the top level) is most likely misplaced,
    which beats a near-miss here (`max_steps` under [sampling] is not a typo of `max_tokens`).
    """
    key = loc[-1]
    if not isinstance(key, str):
        return None, None
    here = tuple(p for p in loc[:-1] if isinstance(p, str))
    owner = _submodel_at(model, loc[:-1])
    same = [name for name in (_field_names(owner) if owner is not None else []) if _normal(name) == _normal(key)]
    if same:  # `Model` for `model`: the spelling, not the place, is wrong
        return same[0], None
    elsewhere = [p for p in field_paths(model) if p[:-1] != here and _normal(p[-1]) == _normal(key)]
    if elsewhere:
        path = min(elsewhere, key=len)  # [sampling].temperature before [teacher.sampling].temperature
        if len(path) == 1:
            return path[0], "it is a top-level setting: put it above the first [section]"
        return ".".join(path), f"it belongs in [{'.'.join(path[:-1])}]"
    return (nearest_name(key, _field_names(owner)) if owner is not None else None), None


def _render(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"' if len(value) <= 40 else f'"{value[:37]}..."'
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a table"
    return type(value).__name__


def _number_text(value: Any) -> str | None:
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return None
        return value.strip()
    return None


def _type_message(kind: str, value: Any) -> str:
    got = f"got {_render(value)}"
    if kind == "int":
        if _number_text(value) is not None:
            return f"must be a whole number, not a string: write {_number_text(value)} without quotes"
        if isinstance(value, float) and value.is_integer():
            return f"must be a whole number: write {int(value)}, not {value!r}"
        return f"must be a whole number ({got})"
    if kind == "float":
        if _number_text(value) is not None:
            return f"must be a number, not a string: write {_number_text(value)} without quotes"
        return f"must be a number ({got})"
    if kind == "bool":
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return f"must be true or false without quotes: write {value.lower()}"
        return f"must be true or false ({got})"
    if kind == "str":
        if isinstance(value, int | float) and not isinstance(value, bool):
            return f'must be a string: write "{value}" in quotes'
        return f'must be a string in quotes ({got})'
    if kind == "list":
        return f"must be a list, e.g. [...] ({got})"
    return f"must be a table: a [section] or an inline {{ key = value }} ({got})"


_TYPE_ERRORS = {
    "int_type": "int", "int_parsing": "int", "int_from_float": "int",
    "float_type": "float", "float_parsing": "float",
    "bool_type": "bool", "bool_parsing": "bool",
    "string_type": "str",
    "list_type": "list", "tuple_type": "list",
    "dict_type": "table", "model_type": "table", "model_attributes_type": "table",
}
_PLACEHOLDERS = {int: "<whole number>", float: "<number>", str: '"..."', bool: "true", list: "[...]"}


def _missing_message(model: type[BaseModel], loc: KeyPath) -> str:
    owner = _submodel_at(model, loc[:-1])
    info = _find_field(owner, str(loc[-1])) if owner is not None and isinstance(loc[-1], str) else None
    section = ".".join(p for p in loc[:-1] if isinstance(p, str))
    where = (f"to the [[{section}]] section" if loc[:-1] and isinstance(loc[-2], int) else f"to [{section}]") \
        if section else "at the top of the file, above the first [section]"
    if info is None:
        return "is required"
    name = str(loc[-1])
    full = ".".join(p for p in loc if isinstance(p, str))
    if _model_in_annotation(info.annotation) is not None:
        if _is_list(info.annotation):
            return f"is required: add at least one [[{full}]] section"
        return f"is required: add a [{full}] section"
    annotation = info.annotation
    placeholder = next((text for kind, text in _PLACEHOLDERS.items()
                        if annotation is kind or kind in (getattr(annotation, "__args__", ()) or ())), "...")
    hint = f" ({info.description.rstrip('.')})" if info.description else ""
    return f"is required: add `{name} = {placeholder}` {where}{hint}"


def value_at(data: Any, path: KeyPath, default: Any = None) -> Any:
    """The raw value at `path`, or `default` where the data has no such key (or a value of another shape)."""
    node = data
    for part in path:
        if isinstance(part, int):
            if not isinstance(node, list) or not 0 <= part < len(node):
                return default
            node = node[part]
        else:
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
    return node


def normalise_loc(loc: KeyPath, data: Any) -> KeyPath:
    """Drop list indices the user never wrote: a single `[env]` table is validated as a one-element list."""
    out: list[str | int] = []
    node = data
    for part in loc:
        if isinstance(part, int):
            if isinstance(node, dict):
                continue
            node = node[part] if isinstance(node, list) and 0 <= part < len(node) else None
        else:
            node = node.get(part) if isinstance(node, dict) else None
        out.append(part)
    return tuple(out)


def error_message(error: Any, model: type[BaseModel], loc: KeyPath, data: Any) -> tuple[str, str | None]:
    """(message, suggestion) for one pydantic error."""
    kind = error["type"]
    value = error.get("input")
    if kind == "missing":
        return _missing_message(model, loc), None
    if kind == "extra_forbidden":
        owner = _submodel_at(model, loc[:-1])
        info = _find_field(owner, str(loc[-1])) if owner is not None else None
        if info is not None and owner is not None:
            # Another spelling of a field that is also set (AliasChoices keeps the first and rejects the rest).
            node = value_at(data, loc[:-1])
            names = [n for n in _field_names(owner) if _find_field(owner, n) is info and n != loc[-1]]
            other = next((n for n in names if isinstance(node, dict) and n in node), names[0] if names else "?")
            return f"`{other}` and `{loc[-1]}` are two spellings of one setting: keep one", None
        suggestion, hint = suggest_key(model, loc)
        return ("unknown key" + (f": {hint}" if hint else "")), suggestion
    if kind in _TYPE_ERRORS:
        return _type_message(_TYPE_ERRORS[kind], value), None
    if kind == "literal_error":
        expected = error.get("ctx", {}).get("expected", "")
        choices = re.findall(r"'([^']*)'", expected)
        suggestion = nearest_name(value, choices) if isinstance(value, str) else None
        return f"must be one of {expected} (got {_render(value)})", suggestion
    if kind == "too_short":
        minimum = error.get("ctx", {}).get("min_length", 1)
        owner = _submodel_at(model, loc[:-1])
        info = _find_field(owner, str(loc[-1])) if owner is not None else None
        if info is not None and _model_in_annotation(info.annotation) is not None:
            return f"must have at least {minimum}: add a [[{'.'.join(map(str, loc))}]] section", None
        return f"must have at least {minimum} entr{'y' if minimum == 1 else 'ies'}", None
    message = str(error["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
    message = message.replace("Input should be", "must be")
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal", "multiple_of") or (
            kind == "value_error" and str(value) not in message):
        message += f" (got {_render(value)})"
    return message, None
