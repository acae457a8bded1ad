"""The config form: sections and fields read from the pydantic schema, bound to keys of ONE tomlkit document.

Attributes down (`show(document)` refreshes every control from the document), messages up (`FieldEdited`,
`EnvAction`): the screen applies the change to the document and re-renders the TOML view.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import tomlkit
from pydantic import BaseModel
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Input, Label, Select, Static, Switch
from tomlkit.exceptions import TOMLKitError

from prime_lab.problems.validation import KeyPath
from prime_lab.workbench.config_document import ConfigDocument
from prime_lab.workbench.schema_fields import FieldSpec, SectionSpec, sections

UNSET = "unset"
LABEL_MAX = 34  # the widest label column; a longer name ends in an ellipsis and shows whole in its tooltip


def field_label(spec: FieldSpec) -> str:
    return f"{spec.path[-1]}{' *' if spec.required else ''}"


def label_width(specs: Iterable[FieldSpec]) -> int:
    """The label column that fits the form's longest field name (and a space), up to LABEL_MAX."""
    return min(LABEL_MAX, 1 + max((len(field_label(spec)) for spec in specs), default=0))


def parse_value(spec: FieldSpec, text: str) -> Any:
    """What the user typed, as a TOML value: empty removes the key; numbers and TOML literals parse; anything
    else stays a string, so the validator reports it on its line instead of the form swallowing it."""
    text = text.strip()
    if not text:
        return None
    if spec.kind == "str":
        return text
    try:
        return tomlkit.parse(f"v = {text}")["v"]
    except (TOMLKitError, ValueError):
        return text


def show_value(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return str(value).lower()
    item = tomlkit.item(value)
    if isinstance(item, tomlkit.items.Table):
        inline = tomlkit.inline_table()
        inline.update(value)
        return inline.as_string()
    return item.as_string()


class FieldRow(Vertical):
    """One field: its key, a control for its type, and a line with type, default and help."""

    @dataclass
    class Edited(Message):
        path: KeyPath
        value: Any

    def __init__(self, spec: FieldSpec, path: KeyPath, *, blink: bool = True, label_width: int | None = None) -> None:
        super().__init__(classes="field-row")
        self.spec = spec
        self.path = path
        self.blink = blink
        self.label_width = label_width
        self._shown: object = None  # what load() last put in the control: its echo is not an edit

    @property
    def key(self) -> str:
        from prime_lab.problems.validation import dotted

        return dotted(self.path)

    def compose(self) -> ComposeResult:
        spec = self.spec
        with Horizontal(classes="field-line"):
            yield self._label()
            yield self._control()
        default = f" · default {spec.default}" if spec.default else (" · required" if spec.required else "")
        help_text = f" · {spec.help}" if spec.help else ""
        yield Static(f"{spec.type_name}{default}{help_text}", classes="field-help", markup=False)

    def _label(self) -> Label:
        text = field_label(self.spec)
        label = Label(text, classes="field-name")
        if self.label_width is not None:  # inline: the column is the form's, wider than the stylesheet's default
            label.styles.width = self.label_width
            label.styles.text_wrap = "nowrap"
            label.styles.text_overflow = "ellipsis"
            if len(text) >= self.label_width:
                label.tooltip = self.key
        return label

    def _control(self) -> Widget:
        spec = self.spec
        if spec.kind == "bool" and not spec.optional:
            return Switch(value=spec.default == "true", classes="field-control")
        if spec.kind in ("choice", "bool"):
            choices = spec.choices if spec.kind == "choice" else ("true", "false")
            return Select([(c, c) for c in choices], prompt=f"({spec.default or UNSET})", allow_blank=True,
                          compact=True, classes="field-control")
        control = Input(placeholder=spec.default or ("required" if spec.required else UNSET), compact=True,
                        classes="field-control", select_on_focus=False)
        control.cursor_blink = self.blink
        return control

    def load(self, value: Any) -> None:
        """Show the document's value. Controls report changes later, as messages: the echo of what was shown here
        is recognised (`_shown`) and not sent back as an edit."""
        control = self.query_one(".field-control")
        if isinstance(control, Switch):
            shown: object = value if isinstance(value, bool) else self.spec.default == "true"
            self._shown = shown
            control.value = bool(shown)
        elif isinstance(control, Select):
            text = show_value(value)
            shown = text if text in (self.spec.choices or ("true", "false")) else Select.NULL
            self._shown = shown
            control.value = shown
        elif isinstance(control, Input) and not control.has_focus:
            self._shown = show_value(value)
            control.value = str(self._shown)

    def _edited(self, shown: object, value: Any) -> None:
        if shown == self._shown:
            return
        self._shown = shown
        self.post_message(self.Edited(self.path, value))

    def on_input_changed(self, event: Input.Changed) -> None:
        """Each keystroke edits the document, except emptying the field: that removes the key (and its comment)
        only when the user leaves the field or presses enter, so retyping a value keeps its line."""
        event.stop()
        if event.value.strip():
            self._edited(event.value, parse_value(self.spec, event.value))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._edited(event.value, parse_value(self.spec, event.value))

    def on_descendant_blur(self) -> None:
        control = self.query_one(".field-control")
        if isinstance(control, Input) and not control.value.strip():
            self._edited(control.value, None)

    def on_switch_changed(self, event: Switch.Changed) -> None:
        event.stop()
        self._edited(event.value, event.value)

    def on_select_changed(self, event: Select.Changed) -> None:
        event.stop()
        value = event.value
        if value is Select.NULL or value == Select.BLANK:
            self._edited(Select.NULL, None)
        else:
            self._edited(value, (value == "true") if self.spec.kind == "bool" else value)


class EnvEntry(Vertical):
    """One [[env]] entry: its fields, keyed by the entry's index."""

    def __init__(self, section: SectionSpec, index: int, *, blink: bool, label_width: int | None = None) -> None:
        super().__init__(classes="env-entry")
        self.section = section
        self.index = index
        self.blink = blink
        self.label_width = label_width

    def compose(self) -> ComposeResult:
        yield Static(f"{self.section.title} #{self.index + 1}", classes="entry-title")
        for spec in self.section.fields:
            yield FieldRow(spec, self.section.path + (self.index,) + spec.path, blink=self.blink,
                           label_width=self.label_width)


class ConfigForm(VerticalScroll):
    """Every field of the schema; invalid fields get the `-invalid` class."""

    BINDINGS = [
        Binding("ctrl+n", "add_env", "Add env", id="form.add_env"),
        Binding("alt+x", "remove_env", "Remove env", id="form.remove_env", show=False),
        Binding("alt+up", "move_env(-1)", "Env up", id="form.env_up", show=False),
        Binding("alt+down", "move_env(1)", "Env down", id="form.env_down", show=False),
    ]

    @dataclass
    class EnvAction(Message):
        """Add (index None), remove or move an [[env]] entry."""

        action: str
        index: int | None
        offset: int = 0

    def __init__(self, schema: type[BaseModel] | None, *, blink: bool = True, id: str | None = None) -> None:
        super().__init__(id=id)
        self.schema = schema
        self.blink = blink
        self.layout_sections = sections(schema) if schema is not None else []
        self.label_width = label_width(spec for section in self.layout_sections for spec in section.fields)
        self._env_counts: dict[KeyPath, int] = {}

    def compose(self) -> ComposeResult:
        if self.schema is None:
            yield Static("No form for this kind of config yet: edit the TOML.", classes="form-empty")
            return
        for section in self.layout_sections:
            with Vertical(classes="form-section", id=self._section_id(section)):
                yield Static(section.title, classes="section-title")

    async def populate(self) -> None:
        """Mount the field rows, one section at a time, after the first frame.

        A full RL form is ~80 rows (several hundred widgets, ~3 s of styling on 2 cores); mounting them after the
        editor has painted keeps the first frame fast, and each section's mount yields to input in between.
        """
        for section in self.layout_sections:
            if section.entries is None and section.fields:
                container = self.query_one(f"#{self._section_id(section)}", Vertical)
                await container.mount_all([FieldRow(spec, spec.path, blink=self.blink, label_width=self.label_width)
                                           for spec in section.fields])

    @staticmethod
    def _section_id(section: SectionSpec) -> str:
        return "section-" + ("core" if not section.path else "-".join(str(p) for p in section.path))

    async def show(self, document: ConfigDocument) -> None:
        """Refresh every control from the document (and rebuild [[env]] entries when their count changed)."""
        for section in self.layout_sections:
            if section.entries is None:
                continue
            count = len(document.env_entries(str(section.path[0])))
            if self._env_counts.get(section.path) != count:
                self._env_counts[section.path] = count
                container = self.query_one(f"#{self._section_id(section)}", Vertical)
                await container.query(EnvEntry).remove()
                await container.mount_all([EnvEntry(section, i, blink=self.blink, label_width=self.label_width)
                                           for i in range(count)])
        invalid = document.problem_paths()
        for row in self.query(FieldRow):
            row.load(document.get(row.path))
            row.set_class(row.key in invalid, "-invalid")

    def focused_env(self) -> int | None:
        focused = self.screen.focused
        node = focused
        while node is not None and node is not self:
            if isinstance(node, EnvEntry):
                return node.index
            node = node.parent  # type: ignore[assignment]
        return None

    def action_add_env(self) -> None:
        self.post_message(self.EnvAction("add", None))

    def action_remove_env(self) -> None:
        index = self.focused_env()
        if index is not None:
            self.post_message(self.EnvAction("remove", index))

    def action_move_env(self, offset: int) -> None:
        index = self.focused_env()
        if index is not None:
            self.post_message(self.EnvAction("move", index, offset))
