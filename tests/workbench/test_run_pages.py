"""Which page opens a run: its kind's dashboard, the evaluation page for the rest (workbench.screens.run_pages)."""

from __future__ import annotations

import pytest

from prime_lab.workbench.screens.dashboard_gepa import GepaDashboard
from prime_lab.workbench.screens.dashboard_rl import RLDashboard
from prime_lab.workbench.screens.dashboard_sft import SFTDashboard
from prime_lab.workbench.screens.run import EvalRunScreen
from prime_lab.workbench.screens.run_pages import page_for
from tests.workbench.lab_fixtures import fixed_run


@pytest.mark.parametrize(("kind", "page"), [("rl", RLDashboard), ("sft", SFTDashboard), ("gepa", GepaDashboard),
                                            ("eval", EvalRunScreen)])
def test_a_run_opens_on_its_kinds_page(kind: str, page: type) -> None:
    run = fixed_run(f"{kind}-run", kind=kind)
    opened = page_for(run)
    assert type(opened) is page and opened.run.id == run.id
