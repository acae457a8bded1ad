"""Evaluations side by side (what `prime eval compare` prints): each evaluation's label, mean reward and difference to
the first with its paired bootstrap 95% interval, the per-example rewards, and the examples that changed most. The
comparison is computed in a worker (the bootstrap resamples 10,000 times); evaluations that do not compare (other
environments, no example in common) say why on the page."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static

from prime_lab.runs.registry import RunRegistry
from prime_lab.workbench.dashboards.compare_view import ComparisonView

if TYPE_CHECKING:
    from prime_lab.workbench.app import LabApp


class CompareScreen(Screen[None]):
    BINDINGS = [
        Binding("escape", "close", "Back", id="compare.close"),
    ]

    def __init__(self, sources: list[str]) -> None:
        """`sources`: evaluations' run ids (or output folders); the first is the one the others are compared to."""
        super().__init__()
        self.sources = sources
        self.view: ComparisonView | None = None
        self.refusal: str | None = None

    @property
    def lab(self) -> LabApp:
        return cast("LabApp", self.app)

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        with Vertical(id="compare"):
            yield Static(f"Comparing {', '.join(self.sources)} ...", id="compare-status", markup=False)
            evaluations = DataTable[Text](id="compare-evaluations", cursor_type="row", zebra_stripes=True)
            evaluations.border_title = "Evaluations (each against A)"
            yield evaluations
            examples = DataTable[Text](id="compare-examples", cursor_type="row", zebra_stripes=True)
            examples.border_title = "Per example"
            yield examples
            changed = Static("", id="compare-changed", markup=False)
            changed.border_title = "Changed most"
            yield changed
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = " vs ".join(self.sources)
        for table in self.query(DataTable):
            table.display = False  # until the comparison is done
        self.query_one("#compare-changed").display = False
        registry = self.lab.registry
        self.run_worker(lambda: self._compare(registry), thread=True, exclusive=True, group="compare",
                        exit_on_error=False)

    def _compare(self, registry: RunRegistry) -> None:
        try:
            view = ComparisonView.of(self.sources, registry)
        except (ValueError, OSError) as exc:  # ComparisonError (a ValueError) says why they do not compare
            self.app.call_from_thread(self.show_refusal, str(exc))
            return
        self.app.call_from_thread(self.show, view)

    def show_refusal(self, message: str) -> None:
        self.refusal = message
        self.query_one("#compare-status", Static).update(f"These evaluations do not compare: {message}")

    def show(self, view: ComparisonView) -> None:
        self.view = view
        notes = [f"Note: {note}" for note in view.comparison.notes]
        self.query_one("#compare-status", Static).update("\n".join([view.heading(), *notes]))
        fill(self.query_one("#compare-evaluations", DataTable), view.EVALUATION_COLUMNS, view.evaluation_rows())
        fill(self.query_one("#compare-examples", DataTable), view.example_columns(), view.example_rows())
        self.query_one("#compare-changed", Static).update("\n".join(view.changed_lines()))
        for widget in (*self.query(DataTable), self.query_one("#compare-changed")):
            widget.display = True
        self.query_one("#compare-examples").focus()

    def action_close(self) -> None:
        self.dismiss()


def fill(table: DataTable[Text], columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    """Columns and rows as plain text (a prompt's brackets are not markup)."""
    table.clear(columns=True)
    table.add_columns(*columns)
    table.add_rows([tuple(Text(cell) for cell in row) for row in rows])
