"""Which page opens a run: each run kind with a dashboard mapped to its page class, the evaluation page for the rest.

This is the one module that imports the dashboards (workbench.screens.dashboard_rl / dashboard_sft / dashboard_gepa).
They subclass the pages of `workbench.screens.run`, so that module cannot name them without importing itself back.
A dashboard's module is imported when a run of its kind opens: an evaluation's page does not load the charts.
"""

from __future__ import annotations

from collections.abc import Callable

from prime_lab.runs.registry import Run
from prime_lab.workbench.screens.run import EvalRunScreen, RunScreen


def _rl_dashboard() -> type[RunScreen]:
    from prime_lab.workbench.screens.dashboard_rl import RLDashboard

    return RLDashboard


def _sft_dashboard() -> type[RunScreen]:
    from prime_lab.workbench.screens.dashboard_sft import SFTDashboard

    return SFTDashboard


def _gepa_dashboard() -> type[RunScreen]:
    from prime_lab.workbench.screens.dashboard_gepa import GepaDashboard

    return GepaDashboard


DASHBOARDS: dict[str, Callable[[], type[RunScreen]]] = {
    "rl": _rl_dashboard,
    "sft": _sft_dashboard,
    "gepa": _gepa_dashboard,
}


def page_for(run: Run) -> RunScreen:
    """The page for a run: its kind's dashboard, or the evaluation page (an evaluation, or a kind without one)."""
    dashboard = DASHBOARDS.get(str(run.read_status().get("kind")))
    page = dashboard() if dashboard is not None else EvalRunScreen
    return page(run)
