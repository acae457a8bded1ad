"""Browse the rollouts of any step: steps on the left, that step's rollouts in a table, the highlighted one in full
(prompt, completion, reward, advantage, metrics, answer and the answer the environment's parser reads)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.markup import escape
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import DataTable, OptionList, Static
from textual.widgets.option_list import Option

from prime_lab.workbench.dashboards.samples import EnvParsers, messages_text, parsed_answer, read_rollouts


def _num(value: Any, fmt: str = ".3f") -> str:
    return format(value, fmt) if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


class SamplesBrowser(Horizontal):
    DEFAULT_CSS = """
    SamplesBrowser { height: 1fr; }
    SamplesBrowser #sample-steps { width: 14; border: round $primary-darken-2; }
    SamplesBrowser #sample-right { width: 1fr; }
    SamplesBrowser #sample-table { height: 2fr; border: round $primary-darken-2; }
    SamplesBrowser #sample-detail-box { height: 3fr; border: round $primary-darken-2; }
    """

    def __init__(self, rollouts_dir: Path, parsers: EnvParsers,
                 fallback: Callable[[int], list[dict[str, Any]]], **kwargs: Any) -> None:
        """`fallback(step)`: the step's `sample` events, shown when it has no rollouts file."""
        super().__init__(**kwargs)
        self.rollouts_dir = rollouts_dir
        self.parsers = parsers
        self.fallback = fallback
        self.steps: list[int] = []
        self.step: int | None = None
        self.records: list[dict[str, Any]] = []
        self.source = ""

    def compose(self) -> ComposeResult:
        steps = OptionList(id="sample-steps")
        steps.border_title = "Steps"
        yield steps
        with Vertical(id="sample-right"):
            table = DataTable[str](id="sample-table", cursor_type="row", zebra_stripes=True)
            table.border_title = "Rollouts"
            yield table
            with VerticalScroll(id="sample-detail-box"):
                yield Static("Pick a step.", id="sample-detail")

    def on_mount(self) -> None:
        self.query_one(DataTable).add_columns("#", "example", "env", "reward", "adv", "trunc", "completion")

    def set_steps(self, steps: list[int]) -> None:
        if steps == self.steps:
            return
        options = self.query_one(OptionList)
        if steps[: len(self.steps)] == self.steps:  # the usual case: new steps at the end
            options.add_options([Option(f"step {s}", id=str(s)) for s in steps[len(self.steps):]])
        else:
            highlighted = options.highlighted
            options.clear_options()
            options.add_options([Option(f"step {s}", id=str(s)) for s in steps])
            if highlighted is not None and steps:
                options.highlighted = min(highlighted, len(steps) - 1)
        self.steps = steps
        if self.step is None and steps:
            self.select_step(steps[-1])

    def select_step(self, step: int) -> None:
        self.step = step
        if step in self.steps:
            self.query_one(OptionList).highlighted = self.steps.index(step)
        self.run_worker(lambda: self._load(step), thread=True, exclusive=True, group="samples-load",
                        exit_on_error=False)

    def move(self, delta: int) -> None:
        if not self.steps:
            return
        index = self.steps.index(self.step) if self.step in self.steps else len(self.steps) - 1
        self.select_step(self.steps[max(0, min(len(self.steps) - 1, index + delta))])

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        if event.option.id is not None:
            self.select_step(int(event.option.id))

    def _load(self, step: int) -> None:
        records = read_rollouts(self.rollouts_dir, step)
        source = f"rollouts/step_{step}.jsonl"
        if records is None:
            records, source = self.fallback(step), "sample events"
        for env in {self.parsers.env_id(str(r.get("env", ""))) for r in records}:
            self.parsers.load(env)
        self.app.call_from_thread(self._show, step, records, source)

    def _show(self, step: int, records: list[dict[str, Any]], source: str) -> None:
        if step != self.step:
            return
        self.records, self.source = records, source
        table = self.query_one(DataTable)
        table.clear()
        table.border_title = f"Rollouts of step {step} ({len(records)}, {source})"
        for i, r in enumerate(records):
            completion = messages_text(r.get("completion")).replace("\n", " ")
            table.add_row(str(i), str(r.get("example_id", "-")), str(r.get("env", "-")), _num(r.get("reward")),
                          _num(r.get("advantage"), "+.3f"), "yes" if r.get("is_truncated") else "",
                          completion[:80])
        self.show_detail(0)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self.show_detail(event.cursor_row)

    def show_detail(self, index: int) -> None:
        detail = self.query_one("#sample-detail", Static)
        if not 0 <= index < len(self.records):
            detail.update("No rollouts for this step." if self.step is not None else "Pick a step.")
            return
        r = self.records[index]
        env_id = self.parsers.env_id(str(r.get("env", "")))
        parser = self.parsers.get(env_id)
        parsed = parsed_answer(parser, r.get("completion"))
        metrics = r.get("metrics") if isinstance(r.get("metrics"), dict) else {}
        lines = [
            f"[b]step {r.get('step', self.step)} · {escape(str(r.get('env', '-')))} · example "
            f"{escape(str(r.get('example_id', '-')))}[/b]  reward [b]{_num(r.get('reward'))}[/b]  advantage "
            f"{_num(r.get('advantage'), '+.3f')}" + ("  [yellow]truncated[/]" if r.get("is_truncated") else ""),
            "[b]answer[/b] " + escape(str(r.get("answer", "-"))) + "   [b]parsed[/b] " +
            (escape(repr(parsed)) if parser is not None else "[dim](no parser: raw text below)[/dim]"),
            "[b]metrics[/b] " + escape(json.dumps(metrics, default=str)),
            "", "[b]prompt[/b]", escape(messages_text(r.get("prompt"))),
            "", "[b]completion[/b]", escape(messages_text(r.get("completion"))),
        ]
        detail.update("\n".join(lines))
