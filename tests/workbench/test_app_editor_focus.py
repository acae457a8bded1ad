"""The editor's focus and its teacher fields, driven by keys: the focus is always on a widget the user sees, in a
pane marked as focused, and what they type lands there; ctrl+t and ctrl+g move it to the pane they name. A
loss = "rl" config shows no teacher fields (and no problems); a distillation loss shows them, and the problems name
the teacher's missing model."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
from textual import events
from textual.color import Color
from textual.errors import NoWidget
from textual.widget import Widget
from textual.widgets import Input, Select

from prime_lab.problems.validation import dotted
from prime_lab.trainer.config import RLConfig
from prime_lab.workbench.config_document import ConfigDocument, schema_for
from prime_lab.workbench.schema_fields import sections
from prime_lab.workbench.screens.confirm import ConfirmScreen
from prime_lab.workbench.screens.editor import EditorScreen
from prime_lab.workbench.widgets.config_form import ConfigForm, FieldRow
from prime_lab.workbench.widgets.problems_panel import ProblemsPanel
from prime_lab.workbench.widgets.toml_editor import TomlEditor
from tests.workbench.lab_fixtures import REPO, SIZE, lab_folder, make_app, until


def on_screen(widget: Widget) -> bool:
    """Drawn where the user looks: the screen shows this widget (or a part of it) at its top-left cell."""
    region = widget.region
    if not region.area:
        return False
    try:
        at, _ = widget.screen.get_widget_at(region.x, region.y)
    except NoWidget:  # off screen
        return False
    return at is widget or widget in at.ancestors


def marked(screen: EditorScreen) -> str | None:
    """The pane drawn as focused: the one with the accent border (and only one has it)."""
    accent = Color.parse(screen.app.get_css_variables()["accent"])
    panes = [pane.id for pane in screen.query("#form, #toml, #problems") if pane.styles.border_top[1] == accent]
    assert len(panes) <= 1, panes
    return panes[0] if panes else None


def rows(screen: EditorScreen) -> dict[str, FieldRow]:
    return {r.key: r for r in screen.query(FieldRow)}


def shown_rows(screen: EditorScreen) -> dict[str, FieldRow]:
    form = screen.query_one(ConfigForm)
    return {key: r for key, r in rows(screen).items() if form.shows(r)}


def empty_required(screen: EditorScreen) -> list[str]:
    """Fields the form shows as required (`name *`) that hold no value."""
    return [key for key, r in shown_rows(screen).items() if r.required and screen.document.get(r.path) is None]


def errors(screen: EditorScreen) -> list[str]:
    return [f"{p.key}: {p.message}" for p in screen.query_one(ProblemsPanel).problems if p.severity == "error"]


def gepa_config(tmp_path: Path) -> Path:
    """A GEPA config: a short form (the RL one has ~100 fields, each key press lays them all out), the same panes."""
    path = lab_folder(tmp_path) / "configs" / "gepa" / "reverse-text.toml"
    path.parent.mkdir()
    shutil.copyfile(REPO / "configs" / "gepa" / "reverse-text.toml", path)
    return path


def test_ctrl_t_and_ctrl_g_move_a_visible_focus_that_takes_what_is_typed(tmp_path: Path) -> None:
    path = gepa_config(tmp_path)

    async def scenario() -> None:
        app = make_app(path)
        async with app.run_test(size=SIZE) as pilot:  # 80 columns: one view at a time
            await until(pilot, lambda: isinstance(app.focused, Input))
            screen = app.screen
            assert isinstance(screen, EditorScreen)
            toml, problems = screen.query_one(TomlEditor), screen.query_one(ProblemsPanel)
            model, reflection = (rows(screen)[key].query_one(Input) for key in ("model", "reflection_model"))
            assert app.focused is model and on_screen(model) and marked(screen) == "form"
            await pilot.press("tab")
            await until(pilot, lambda: app.focused is reflection)

            await pilot.press("ctrl+t")
            await until(pilot, lambda: app.focused is toml)
            assert on_screen(toml) and marked(screen) == "toml"
            assert not screen.query_one(ConfigForm).display
            await pilot.press("#")  # at the top: the first comment line starts "##"
            assert toml.text.startswith("## GEPA on reverse-text")

            await pilot.press("ctrl+g")
            await until(pilot, lambda: app.focused is problems)
            assert on_screen(problems) and marked(screen) == "problems"
            assert problems.border_subtitle == "ctrl+g: back"  # it says how to go back

            await pilot.press("ctrl+g")  # back to the view it came from
            await until(pilot, lambda: app.focused is toml)
            assert marked(screen) == "toml"

            await pilot.press("ctrl+t")  # the form again, on the field focused last
            await until(pilot, lambda: app.focused is reflection)
            await pilot.press("x")
            assert on_screen(reflection) and marked(screen) == "form"
            assert not toml.display
            assert reflection.value == "x" and 'reflection_model = "x"' in toml.text

    asyncio.run(scenario())


def test_side_by_side_the_focused_view_is_the_marked_one(tmp_path: Path) -> None:
    path = gepa_config(tmp_path)

    async def scenario() -> None:
        app = make_app(path)
        async with app.run_test(size=(120, 24)) as pilot:  # wide: both views on screen, one marked
            await until(pilot, lambda: isinstance(app.focused, Input))
            screen = app.screen
            assert isinstance(screen, EditorScreen)
            form, toml = screen.query_one(ConfigForm), screen.query_one(TomlEditor)
            assert on_screen(form) and on_screen(toml) and marked(screen) == "form"
            await pilot.press("ctrl+t")
            await until(pilot, lambda: app.focused is toml)
            assert marked(screen) == "toml" and on_screen(form)
            await pilot.press("ctrl+g")
            await until(pilot, lambda: isinstance(app.focused, ProblemsPanel))
            assert marked(screen) == "problems"

    asyncio.run(scenario())


TEACHER = {"teacher.model", "teacher.client.base_url", "teacher.sampling.temperature"}


def distillation_config(tmp_path: Path) -> Path:
    """The default RL config with loss = "opd" and no [teacher] yet."""
    path = lab_folder(tmp_path) / "configs" / "rl" / "reverse-text.toml"
    path.write_text(path.read_text().replace("max_async_level = 1", 'max_async_level = 1\nloss = "opd"'))
    return path


def test_a_plain_rl_config_shows_no_teacher_and_a_distillation_loss_asks_for_one(tmp_path: Path) -> None:
    path = lab_folder(tmp_path) / "configs" / "rl" / "reverse-text.toml"

    async def scenario() -> None:
        app = make_app(path)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: isinstance(app.focused, Input))  # the form mounted and shown
            screen = app.screen
            assert isinstance(screen, EditorScreen)
            assert screen.document.get(("loss",)) is None  # loss = "rl", the default
            assert not [key for key in shown_rows(screen) if key.startswith("teacher")]
            assert errors(screen) == [] and empty_required(screen) == []

            # A distillation loss: the teacher's fields show, its model required, marked and named by a problem.
            rows(screen)["loss"].query_one(Select).value = "sft"  # (what choosing it in the list does)
            await until(pilot, lambda: TEACHER <= set(shown_rows(screen)))
            teacher = rows(screen)["teacher.model"]
            assert empty_required(screen) == ["teacher.model"] and teacher.has_class("-invalid")
            assert teacher.query_one(Input).placeholder == "required"
            [problem] = errors(screen)
            assert problem.startswith('loss: loss = "sft" needs a [teacher] section (model')

    asyncio.run(scenario())


def test_the_teachers_model_filled_in_leaves_no_problem_and_nothing_required(tmp_path: Path) -> None:
    path = distillation_config(tmp_path)

    async def scenario() -> None:
        app = make_app(path)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: isinstance(app.focused, Input))
            screen = app.screen
            assert isinstance(screen, EditorScreen)
            assert TEACHER <= set(shown_rows(screen)) and empty_required(screen) == ["teacher.model"]
            assert [e.split(": ")[0] for e in errors(screen)] == ["loss"]

            model = rows(screen)["teacher.model"].query_one(Input)
            model.focus()
            await until(pilot, lambda: model.has_focus)
            model.post_message(events.Paste("smollm2-135m"))  # as pasted: one edit
            await until(pilot, lambda: not rows(screen)["teacher.model"].has_class("-invalid"))
            assert screen.document.get(("teacher", "model")) == "smollm2-135m"
            assert '[teacher]\nmodel = "smollm2-135m"' in screen.query_one(TomlEditor).text
            assert errors(screen) == [] and empty_required(screen) == []

    asyncio.run(scenario())


def test_back_to_loss_rl_the_teacher_hides_and_the_focus_leaves_it(tmp_path: Path) -> None:
    path = distillation_config(tmp_path)

    async def scenario() -> None:
        app = make_app(path)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: isinstance(app.focused, Input))
            screen = app.screen
            assert isinstance(screen, EditorScreen)
            model, loss = rows(screen)["teacher.model"].query_one(Input), rows(screen)["loss"].query_one(Select)
            model.focus()
            await until(pilot, lambda: model.has_focus and on_screen(model))

            loss.value = "rl"  # (as the TOML view or a click on the list would set it, with the focus here)
            await until(pilot, lambda: not TEACHER & set(shown_rows(screen)))
            assert errors(screen) == [] and empty_required(screen) == []
            await until(pilot, lambda: app.focused is loss and on_screen(loss))  # the field above them

    asyncio.run(scenario())


def test_q_outside_a_text_field_asks_before_it_drops_unsaved_edits(tmp_path: Path) -> None:
    path = gepa_config(tmp_path)

    async def scenario() -> None:
        app = make_app(path)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: isinstance(app.focused, Input))
            await pilot.press("x", "ctrl+g", "q")  # typed into the model field, then q in the problems
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            await pilot.press("n")
            await until(pilot, lambda: isinstance(app.screen, EditorScreen))
            assert app.is_running and isinstance(app.focused, ProblemsPanel)

    asyncio.run(scenario())


def test_which_tables_the_form_shows_follows_the_loss(tmp_path: Path) -> None:
    optional = {section.title: section.optional_table for section in sections(RLConfig)}
    assert optional["[teacher]"] == optional["[teacher.client]"] == ("teacher",)
    assert optional["Core"] is None and optional["[sampling]"] is None and optional["[wandb]"] == ("wandb",)

    path = lab_folder(tmp_path) / "configs" / "rl" / "reverse-text.toml"
    text = path.read_text()
    for extra, hidden, in_use in [("", True, False), ('loss = "sft"', False, True), ('loss = "opd"', False, True),
                                  ('loss = "rl"\n[teacher]\nmodel = "m"', False, True)]:
        path.write_text(text.replace("max_async_level = 1", f"max_async_level = 1\n{extra}"))
        document = ConfigDocument.load(path)
        assert (document.table_hidden(("teacher",)), document.table_in_use(("teacher",))) == (hidden, in_use), extra
        assert not document.table_hidden(("wandb",))  # tables no setting calls for always show


def empty_required_fields(document: ConfigDocument) -> list[str]:
    """The fields the form shows as required (shown tables only) that the document leaves empty."""
    empty = []
    for section in sections(schema_for(document.kind)):
        if section.optional_table is not None and document.table_hidden(section.optional_table):
            continue
        count = len(document.env_entries(str(section.path[0]))) if section.entries else 1
        prefixes = [section.path + (i,) for i in range(count)] if section.entries else [()]
        empty += [dotted(prefix + spec.path) for prefix in prefixes for spec in section.fields
                  if document.field_required(section, spec) and document.get(prefix + spec.path) is None]
    return empty


@pytest.mark.parametrize("path", sorted((REPO / "configs").glob("*/*.toml")), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_config_without_problems_shows_no_empty_required_field(path: Path) -> None:
    document = ConfigDocument.load(path)
    assert document.errors == [] and empty_required_fields(document) == []


def test_an_empty_required_field_is_named_by_a_problem(tmp_path: Path) -> None:
    path = distillation_config(tmp_path)
    document = ConfigDocument.load(path)
    assert empty_required_fields(document) == ["teacher.model"]
    assert [(p.key, p.message[:40]) for p in document.errors] == [("loss", 'loss = "opd" needs a [teacher] section (')]
