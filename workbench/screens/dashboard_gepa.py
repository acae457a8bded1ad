"""The GEPA run dashboard: budget bar, best validation score over calls, the last iterations' verdicts, the Pareto
frontier (candidates by validation score against calls spent, the front highlighted), the instance x candidate
matrix, the candidate tree, and a candidate's prompt with its diffs against its parent and the seed, the logs, the
run's processes (System: from its `system` events, where its supervisor writes them) and every metric as a grid of
charts (Grid: best and mean scores, calls, ... per iteration; workbench.widgets.metrics_grid); `e` exports the RL
config that starts from the best prompt (as `prime gepa export --rl` does) and opens it in the editor."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import DataTable, Footer, Header, ProgressBar, Static, TabbedContent, TabPane, Tree
from textual.widgets.tree import TreeNode
from textual_plot import HiResMode, LegendLocation, PlotWidget

from prime_lab.runs.events import BadLine
from prime_lab.runs.registry import FINAL_STATES, Run
from prime_lab.workbench.dashboards.event_folds import MetricsFold, RawEvent
from prime_lab.workbench.dashboards.gepa_model import CandidateInfo, GepaRunModel
from prime_lab.workbench.dashboards.grid_model import gepa_metric_events
from prime_lab.workbench.dashboards.system_model import SystemModel
from prime_lab.workbench.screens.run import DashboardScreen
from prime_lab.workbench.widgets.logs_pane import LogsPane
from prime_lab.workbench.widgets.metrics_grid import MetricsGrid
from prime_lab.workbench.widgets.system_pane import SystemPane

if TYPE_CHECKING:
    from prime_lab.workbench.app import LabApp
    from prime_lab.workbench.dashboards.gepa_export import ExportedConfig

VERDICT_ROWS = 50
NARROW = 110  # columns below which the overview stacks its chart above the verdicts
MATRIX_CANDIDATES = 40
VERDICT_STYLE = {"accepted": "bold green", "rejected": "red"}
# The verdict table's columns have fixed widths: they do not jump as rows come, and the table is drawn right from
# its first paint (auto widths are measured when the table is idle; under load a screenshot caught the table drawn
# with its header widths: "refl", "accepte").
VERDICT_COLUMNS = (("it", 3), ("type", 7), ("parent", 6), ("before", 6), ("after", 5), ("verdict", 13), ("calls", 5))


def mean(values: list[float] | None) -> float | None:
    return sum(values) / len(values) if values else None


def parents_text(parent: Any) -> str:
    if isinstance(parent, list):
        return "+".join(str(p) for p in parent)
    return "-" if parent is None else str(parent)


class FrontierChart(PlotWidget, can_focus=False):
    """Candidates by validation score against the calls spent when each was found; the front in green, the best
    starred, and the best score so far as a line."""

    def __init__(self) -> None:
        super().__init__(id="gepa-chart", allow_pan_and_zoom=False)
        self.border_title = "Validation score vs metric calls (● front, ★ best)"
        self._signature: tuple[object, ...] | None = None

    def on_mount(self) -> None:
        self.margin_top = 0
        self.margin_bottom = 2
        self.margin_left = 7

    def on_resize(self) -> None:
        self._signature = None  # redraw: the legend depends on the size

    def draw(self, model: GepaRunModel) -> None:
        signature = (len(model.candidates), model.frontier_updates, model.best_over_calls.version)
        if signature == self._signature:
            return
        self._signature = signature
        self.clear()
        front, best = model.on_front(), model.frontier.best_idx
        xs, ys = model.best_over_calls.points()
        if xs:
            self.plot(xs, ys, line_style="#FFA62B", hires_mode=HiResMode.BRAILLE, label="best so far")
        groups: dict[str, list[CandidateInfo]] = {"other": [], "front": [], "best": []}
        for c in model.candidates.values():
            groups["best" if c.idx == best else "front" if c.idx in front else "other"].append(c)
        for group, marker, style in (("other", "○", "grey62"), ("front", "●", "bold #4EBF71"),
                                     ("best", "★", "bold #FFD700")):
            cs = groups[group]
            if cs:
                self.scatter([c.metric_calls for c in cs], [c.score for c in cs], marker=marker, marker_style=style,
                             label=group)
        if model.max_calls:
            self.set_xlimits(0, model.max_calls)
        self.show_legend(LegendLocation.BOTTOMRIGHT, is_visible=self.size.height >= 16)  # else it covers the plot


class GepaDashboard(DashboardScreen):
    TAB_ACTIONS = {"logs": {"next_process", "next_level"}}

    BINDINGS = [
        Binding("1", "tab('overview')", "Overview", id="gepa.tab_overview"),
        Binding("2", "tab('candidates')", "Candidates", id="gepa.tab_candidates"),
        Binding("3", "tab('matrix')", "Matrix", id="gepa.tab_matrix"),
        Binding("4", "tab('logs')", "Logs", id="gepa.tab_logs"),
        Binding("5", "tab('system')", "System", id="gepa.tab_system"),
        Binding("6", "tab('grid')", "Grid", id="gepa.tab_grid"),
        Binding("p", "next_process", "Process", id="gepa.next_process"),
        Binding("v", "next_level", "Level", id="gepa.next_level"),
        Binding("e", "export_rl", "RL config", id="gepa.export_rl"),
    ]

    def __init__(self, run: Run) -> None:
        super().__init__(run)
        self.model: GepaRunModel = GepaRunModel()
        self.system = SystemModel()
        self.metrics = MetricsFold()  # the iterations' numbers as metrics, for the Grid tab
        self.selected: int | None = None
        self._tree_size = -1
        self._matrix_key: tuple[object, ...] | None = None
        self._verdicts_key: tuple[object, ...] | None = None

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        with Vertical(id="gepa"):
            yield Static("", id="gepa-status", markup=False)
            yield ProgressBar(id="run-progress", show_eta=False)
            with TabbedContent(initial="overview", id="gepa-tabs"):
                with TabPane("Overview", id="overview"), Horizontal(id="gepa-overview"):
                    yield FrontierChart()
                    verdicts = DataTable[Any](id="gepa-verdicts", cursor_type="row", zebra_stripes=True)
                    verdicts.border_title = "Iterations (newest first)"
                    yield verdicts
                with TabPane("Candidates", id="candidates"), Horizontal():
                    tree: Tree[int] = Tree("candidates", id="gepa-tree")
                    tree.border_title = "Candidate tree"
                    yield tree
                    with VerticalScroll(id="gepa-candidate-box"):
                        yield Static("Pick a candidate.", id="gepa-candidate")
                with TabPane("Matrix", id="matrix"):
                    matrix = DataTable[Any](id="gepa-matrix", zebra_stripes=True)
                    matrix.border_title = "Validation instances x candidates (★ best on that instance)"
                    yield matrix
                with TabPane("Logs", id="logs"):
                    yield LogsPane(id="logs-pane")
                with TabPane("System", id="system"):
                    yield SystemPane(id="system-pane")
                with TabPane("Grid", id="grid"):
                    yield MetricsGrid(id="metrics-grid")
        yield Footer()

    def on_resize(self) -> None:
        """Chart beside the verdicts on a wide terminal, above them on a narrow one."""
        self.query_one("#gepa-overview").set_class(self.size.width < NARROW, "narrow")

    def on_mount(self) -> None:
        verdicts = self.query_one("#gepa-verdicts", DataTable)
        for label, width in VERDICT_COLUMNS:
            verdicts.add_column(label, width=width)
        self.query_one(Tree).root.expand()

    # Following ----------------------------------------------------------------------------------------------
    def reset(self) -> None:
        self.model = GepaRunModel()
        self.system = SystemModel()
        self.metrics = MetricsFold()
        self._tree_size = -1
        self._matrix_key = self._verdicts_key = None

    def consume(self, items: list[RawEvent | BadLine]) -> None:
        self.model.feed(items)
        self.metrics.feed(gepa_metric_events(items))
        for item in items:
            if not isinstance(item, BadLine) and item["kind"] == "system":
                self.system.add(item.get("data"), item.get("time"))

    # GEPA -> RL ---------------------------------------------------------------------------------------------
    def action_export_rl(self) -> None:
        """Write the RL config that starts from the best prompt beside the workspace and open it in the editor."""
        app = self.lab  # (taken here: a worker thread cannot reach the app through a page closed meanwhile)
        self.run_worker(lambda: self._export_rl(app), thread=True, exclusive=True, group="export",
                        exit_on_error=False)

    def _export_rl(self, app: LabApp) -> None:
        from prime_lab.workbench.dashboards.gepa_export import export_rl

        try:
            exported = export_rl(self.run, app.settings.root)
        except Exception as exc:  # (no best prompt yet, an environment that does not load, ...): shown, never raised
            app.call_from_thread(app.report, exc)
            return
        app.call_from_thread(self._exported, app, exported)

    @staticmethod
    def _exported(app: LabApp, exported: ExportedConfig) -> None:
        shown = exported.path.relative_to(app.settings.root) if exported.path.is_relative_to(app.settings.root) \
            else exported.path
        app.notify(f"Wrote {shown}: {exported.how()}.", title="RL config", timeout=12)
        if exported.warning:  # as `prime gepa export` warns: the best prompt is the seed's own
            app.notify(exported.warning.removeprefix("warning: "), title="RL config", severity="warning", timeout=20)
        app.open_config(exported.path)

    # Drawing ------------------------------------------------------------------------------------------------
    def redraw(self) -> None:
        model, status = self.model, self.status
        state = status.get("state") or model.state or "?"
        best = model.frontier
        calls = f"{model.used}/{model.max_calls}" if model.max_calls else str(model.used)
        first = (f"{self.run.id} · {state} · iteration {model.iteration} · best {best.best_score:.3f} "
                 f"(candidate {best.best_idx}) · {len(model.candidates)} candidates · {len(model.on_front())} "
                 f"on the front")
        second = [f"calls {calls}", str(status.get("model") or "-"),
                  ",".join(e.split("/")[-1] for e in status.get("envs") or []) or "-"]
        if status.get("reason"):
            second.append(str(status["reason"]))
        if self.bad_lines:
            second.append(f"{self.bad_lines} corrupt line(s) skipped")
        self.query_one("#gepa-status", Static).update(first + "\n" + " · ".join(second))
        bar = self.query_one(ProgressBar)
        if model.max_calls:
            bar.update(total=model.max_calls, progress=model.used)
        active = self.query_one(TabbedContent).active
        if active == "overview":
            self.query_one(FrontierChart).draw(model)
            self._verdicts()
        elif active == "candidates":
            self._tree()
        elif active == "matrix":
            self._matrix()
        elif active == "logs":
            self.query_one(LogsPane).show(model.logs, total=model.log_total)
        elif active == "system":
            self.query_one(SystemPane).show(self.system, ended=status.get("state") in FINAL_STATES)
        elif active == "grid":
            self.query_one(MetricsGrid).draw([(self.run.id, self.metrics.series)], 0.0)

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        super().on_tabbed_content_tab_activated(event)
        if event.pane.id == "grid":
            self.query_one(MetricsGrid).focus()  # its keys at once

    def on_metrics_grid_changed(self, event: MetricsGrid.Changed) -> None:
        """A grid key changed what it shows: draw it now (the data under the lock), not at the next poll."""
        event.stop()
        self._draw_grid(new_data=False)

    def on_metrics_grid_behind(self, event: MetricsGrid.Behind) -> None:
        """Cells wait to show new points: the next few."""
        event.stop()
        self._draw_grid(new_data=True)

    def _draw_grid(self, new_data: bool) -> None:
        if self.query_one(TabbedContent).active == "grid":
            with self.fold_lock:
                self.query_one(MetricsGrid).draw([(self.run.id, self.metrics.series)], 0.0, new_data=new_data)

    def _verdicts(self) -> None:
        records = list(self.model.iterations)[-VERDICT_ROWS:]
        key = (len(self.model.iterations), records[-1].get("iteration") if records else None)
        if key == self._verdicts_key:
            return
        self._verdicts_key = key
        table = self.query_one("#gepa-verdicts", DataTable)
        table.clear()
        for record in reversed(records):
            before, after = mean(record.get("parent_scores")), mean(record.get("child_scores"))
            verdict = str(record.get("verdict", "?"))
            table.add_row(str(record.get("iteration", "?")), str(record.get("type", "?"))[:7],
                          parents_text(record.get("parent")), f"{before:.3f}" if before is not None else "-",
                          f"{after:.3f}" if after is not None else "-",
                          Text(verdict, style=VERDICT_STYLE.get(verdict, "dim")), str(record.get("metric_calls", "")))

    def _tree(self) -> None:
        model = self.model
        if len(model.candidates) == self._tree_size:
            return
        self._tree_size = len(model.candidates)
        tree: Tree[int] = self.query_one(Tree)
        tree.clear()
        nodes: dict[int, TreeNode[int]] = {}
        front = model.on_front()
        for idx in sorted(model.candidates):
            c = model.candidates[idx]
            parent = nodes.get(c.parents[0]) if c.parents else None
            mark = " ★" if idx == model.frontier.best_idx else " ●" if idx in front else ""
            how = f" merge {parents_text(c.parents)}" if len(c.parents) > 1 else ""
            label = f"#{idx} {c.score:.3f}{mark}{how}"
            nodes[idx] = (parent or tree.root).add(label, data=idx, expand=True)
        if self.selected is None and model.candidates:
            self.show_candidate(model.frontier.best_idx)

    def on_tree_node_highlighted(self, event: Tree.NodeHighlighted[int]) -> None:
        if event.node.data is not None:
            self.show_candidate(event.node.data)

    def show_candidate(self, idx: int) -> None:
        self.selected = idx
        model = self.model
        c = model.candidates.get(idx)
        if c is None:
            return
        front_count = model.frontier.frequencies.get(idx, 0)
        parts = [f"[b]candidate {idx}[/b] · score [b]{c.score:.3f}[/b] · {escape(c.origin)} · parents "
                 f"{parents_text(c.parents) if c.parents else '-'} · found at iteration {c.iteration} after "
                 f"{c.metric_calls} calls · best on {front_count}/{len(model.frontier.instance_fronts)} instances",
                 "", "[b]prompt[/b]", escape(c.text)]
        for label, other in ((f"diff against its parent #{c.parents[0]}", c.parents[0]) if c.parents else
                             ("", None), ("diff against the seed #0", 0 if idx != 0 else None)):
            if other is None:
                continue
            parts += ["", f"[b]{label}[/b]"]
            diff = model.diff(idx, other)
            parts += [f"[green]{escape(line)}[/]" if line.startswith("+") else f"[red]{escape(line)}[/]"
                      if line.startswith("-") else f"[dim]{escape(line)}[/]" for line in diff] or ["(same text)"]
        self.query_one("#gepa-candidate", Static).update("\n".join(parts))

    def _matrix(self) -> None:
        model = self.model
        key = (len(model.candidates), model.frontier_updates)
        if key == self._matrix_key:
            return
        self._matrix_key = key
        table = self.query_one("#gepa-matrix", DataTable)
        table.clear(columns=True)
        front = model.on_front()
        ids = sorted(model.candidates)
        if len(ids) > MATRIX_CANDIDATES:  # the front and the newest
            keep = set(i for i in ids if i in front) | set(ids[-MATRIX_CANDIDATES:])
            ids = sorted(keep)[-MATRIX_CANDIDATES:]
        table.add_columns("instance", *[f"#{i}" for i in ids], "best")
        fronts = model.frontier.instance_fronts
        for row in range(len(model.frontier.instance_best)):
            winners = set(fronts[row]) if row < len(fronts) else set()
            cells: list[Any] = [str(row)]
            for i in ids:
                scores = model.candidates[i].val_scores
                if row >= len(scores):
                    cells.append("")
                elif i in winners:
                    cells.append(Text(f"★{scores[row]:.2f}", style="bold green"))
                else:
                    cells.append(Text(f" {scores[row]:.2f}", style="dim"))
            cells.append(f"{model.frontier.instance_best[row]:.2f}")
            table.add_row(*cells)
