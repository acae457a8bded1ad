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
from textual import events
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


def field_label(spec: FieldSpec, required: bool | None = None) -> str:
    required = spec.required if required is None else required
    return f"{spec.path[-1]}{' *' if required else ''}"


def field_help(spec: FieldSpec, required: bool) -> str:
    default = f" · default {spec.default}" if spec.default else (" · required" if required else "")
    help_text = f" · {spec.help}" if spec.help else ""
    return f"{spec.type_name}{default}{help_text}"


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
    """One field: its key, a control for its type, and a line with type, default and help.

    `required` is whether the field is required now: a required field of an optional table that the file leaves out
    ([teacher] model, under loss = "rl") is not, and says so."""

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
        self.required = spec.required
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
        yield Static(field_help(spec, self.required), classes="field-help", markup=False)

    def set_required(self, required: bool) -> None:
        """Mark the field required or not (its label, help line and placeholder)."""
        if required == self.required:
            return
        self.required = required
        if not self.is_mounted or not self.children:
            return
        self.query_one(".field-name", Label).update(field_label(self.spec, required))
        self.query_one(".field-help", Static).update(field_help(self.spec, required))
        control = self.query_one(".field-control")
        if isinstance(control, Input):
            control.placeholder = self._placeholder()

    def _placeholder(self) -> str:
        return self.spec.default or ("required" if self.required else UNSET)

    def _label(self) -> Label:
        text = field_label(self.spec, self.required)
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
        control = Input(placeholder=self._placeholder(), compact=True, classes="field-control",
                        select_on_focus=False)
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
    """Every field of the schema; invalid fields get the `-invalid` class.

    The focus goes to a field's control, which takes what is typed (`focus_target` says which); the form itself takes
    none (focused, then left, it would restyle all its widgets). A table that only some settings call for
    ([teacher]) shows while it is called for or the file has it."""

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
        self._last_control: Widget | None = None
        self._populated = False
        self._mounted: set[KeyPath] = set()  # sections whose rows are mounted
        self.can_focus = schema is None  # (no fields: the form holds the focus itself)

    def compose(self) -> ComposeResult:
        if self.schema is None:
            yield Static("No form for this kind of config yet: edit the TOML.", classes="form-empty")
            return
        for section in self.layout_sections:
            with Vertical(classes="form-section", id=self._section_id(section)):
                yield Static(section.title, classes="section-title")

    async def populate(self) -> None:
        """Mount the field rows, one section at a time, after the first frame.

        A full RL form is ~100 rows (several hundred widgets, ~3 s of styling on 2 cores); mounting them after the
        editor has painted keeps the first frame fast, and each section's mount yields to input in between. A hidden
        section's rows are mounted when it first shows.
        """
        for section in self.layout_sections:
            await self._mount_rows(section)
        self._populated = True

    async def _mount_rows(self, section: SectionSpec) -> None:
        if section.entries is not None or not section.fields or section.path in self._mounted:
            return
        container = self.query_one(f"#{self._section_id(section)}", Vertical)
        if not container.display:
            return
        self._mounted.add(section.path)
        await container.mount_all([FieldRow(spec, spec.path, blink=self.blink, label_width=self.label_width)
                                   for spec in section.fields])

    @staticmethod
    def _section_id(section: SectionSpec) -> str:
        return "section-" + ("core" if not section.path else "-".join(str(p) for p in section.path))

    async def show(self, document: ConfigDocument) -> None:
        """Refresh every control from the document (and rebuild [[env]] entries when their count changed), show the
        tables the document uses, and mark the fields required now and the invalid ones.

        A table called for but not written yet ([teacher] under loss = "sft") has its required fields marked
        invalid: the problems list the setting that calls for it."""
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
        for section in self.layout_sections:
            table = section.optional_table
            container = self.query_one(f"#{self._section_id(section)}", Vertical)
            container.display = table is None or not document.table_hidden(table)
            if self._populated:
                await self._mount_rows(section)
            missing = table is not None and document.table_in_use(table) and document.get(table) is None
            for row in container.query(FieldRow):
                row.set_required(document.field_required(section, row.spec))
                row.load(document.get(row.path))
                row.set_class(row.key in invalid or (missing and row.required), "-invalid")
        focused = self.screen.focused
        if focused is not None and self in focused.ancestors and not self.shows(focused):
            target = self._shown_before(focused) or self.focus_target()
            if target is not None:
                target.focus()

    def shows(self, widget: Widget) -> bool:
        """Whether a widget of the form is displayed (no section or entry around it hidden)."""
        for node in widget.ancestors_with_self:
            if node is self:
                return True
            if not node.display:
                return False
        return False

    def _shown_before(self, control: Widget) -> Widget | None:
        """The last shown control above a hidden one (the field that hid it, when it was the one above)."""
        before: Widget | None = None
        for other in self.query(".field-control"):
            if other is control:
                return before
            if self.shows(other):
                before = other
        return before

    def focus_target(self) -> Widget | None:
        """Where the form's focus goes: the control focused last, while it is still shown, else the first shown
        (None until `populate` has mounted the fields)."""
        if not self._populated:
            return None
        last = self._last_control
        if last is not None and last.is_attached and self.shows(last):
            return last
        return next((control for control in self.query(".field-control") if self.shows(control)), None)

    def on_descendant_focus(self, event: events.DescendantFocus) -> None:
        if event.widget.has_class("field-control"):
            self._last_control = event.widget

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
