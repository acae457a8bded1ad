"""The System tab of a run's page: what each of the run's processes costs (CPU %, RSS, threads) and each GPU holds
(utilisation, memory), from the run's newest `system` event (workbench.dashboards.system_model). A process that
exited keeps its last values, dimmed: a run that ended shows what its processes cost at the end."""

from __future__ import annotations

import time
from typing import Any, Literal

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from prime_lab.runs.display import size
from prime_lab.workbench.dashboards.system_model import SystemModel

PROCESS_COLUMNS = (("process", 22), ("pid", 8), ("CPU %", 7), ("RSS", 10), ("threads", 7), ("", 6))
GPU_COLUMNS = (("GPU", 4), ("name", 24), ("util %", 7), ("memory", 22))
NO_SAMPLES = ("No system samples in this run's log yet: its supervisor writes one every few seconds while it runs "
              "(a run started before system metrics existed has none).")


def number(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


class SystemPane(Vertical):
    DEFAULT_CSS = """
    SystemPane { height: 1fr; }
    SystemPane #system-summary { height: auto; padding: 0 1; }
    SystemPane #system-processes { height: 1fr; border: round $primary-darken-2; }
    SystemPane #system-gpus { height: auto; max-height: 12; border: round $primary-darken-2; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.shown: tuple[int, int, bool] | None = None  # the model drawn (a replay folds a new one), its samples

    def compose(self) -> ComposeResult:
        yield Static(NO_SAMPLES, id="system-summary", markup=False)
        processes = DataTable[Any](id="system-processes", cursor_type="row", zebra_stripes=True)
        processes.border_title = "Processes"
        yield processes
        gpus = DataTable[Any](id="system-gpus", cursor_type="none")
        gpus.border_title = "GPUs"
        yield gpus

    def on_mount(self) -> None:
        for table, columns in ((self.query_one("#system-processes", DataTable), PROCESS_COLUMNS),
                               (self.query_one("#system-gpus", DataTable), GPU_COLUMNS)):
            for label, width in columns:
                table.add_column(label, width=width)
        self.query_one("#system-gpus").display = False

    def show(self, model: SystemModel, *, ended: bool = False) -> None:
        """Draw the model's newest sample (nothing when it is the one drawn)."""
        if (id(model), model.samples, ended) == self.shown:
            return
        self.shown = (id(model), model.samples, ended)
        newest = model.newest
        summary = self.query_one("#system-summary", Static)
        processes = self.query_one("#system-processes", DataTable)
        gpus = self.query_one("#system-gpus", DataTable)
        processes.clear()
        gpus.clear()
        if newest is None:
            summary.update(NO_SAMPLES)
            gpus.display = False
            return
        rows = model.rows()
        running = [process for _, process, alive in rows if alive]
        cpu = sum(p.cpu_percent or 0.0 for p in running)
        rss = sum(p.rss_bytes or 0 for p in running)
        boxes = [p for p in running if p.count is not None]  # the sandboxes' row (runs/system_metrics.py)
        count = sum((p.processes or 0) if p.count is not None else 1 for p in running)
        sandboxes = f" · {sum(p.count or 0 for p in boxes)} sandboxes" if boxes else ""
        at = time.strftime("%H:%M:%S", time.localtime(newest.time)) if newest.time is not None else "?"
        every = f", every {newest.interval_s:g} s" if newest.interval_s else ""
        last = "the run's last sample" if ended else "sampled"
        summary.update(f"{count} processes{sandboxes} · CPU {cpu:.0f}% · RSS {size(rss)} · {last} {at}{every}"
                       + ("" if newest.gpus else " · no GPU visible"))
        for label, process, alive in rows:
            style = "" if alive else "dim"
            cells: tuple[tuple[str, Literal["left", "right"]], ...] = (
                (process.shown if label == process.label else label, "left"),
                ("-" if process.count is not None else str(process.pid), "right"),
                (number(process.cpu_percent), "right"),
                (size(process.rss_bytes), "right"),
                ("-" if process.threads is None else str(process.threads), "right"),
                ("" if alive else "exited", "left"))
            processes.add_row(*(Text(cell, style=style, justify=justify) for cell, justify in cells))
        for gpu in newest.gpus:
            used, total = gpu.memory_used_bytes, gpu.memory_total_bytes
            share = f" ({used / total:.0%})" if used is not None and total else ""
            gpus.add_row(str(gpu.index), gpu.name, Text(number(gpu.utilization_percent, 0), justify="right"),
                         f"{size(used)} / {size(total)}{share}")
        gpus.display = bool(newest.gpus)
