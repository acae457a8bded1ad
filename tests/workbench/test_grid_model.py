"""The metrics grid's model without the app: the filter (glob and regex), pinned cells first, layout and pages, the
highlight, log-Y with values <= 0, a colour per run that does not move, downsampling, the braille raster, and
redrawing only the cells whose series moved."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from prime_lab.workbench.dashboards.grid_model import (
    RUN_COLOURS,
    FilterError,
    GridState,
    MetricFilter,
    PointsCache,
    cell_data,
    cell_signature,
    column_spans,
    compact,
    draw_order,
    fold_metrics,
    fold_metrics_apart,
    gepa_metric_events,
    gepa_metrics,
    min_max_buckets,
    only_data_moved,
    rasterize,
    run_colour,
    run_colours,
    step_label,
)
from prime_lab.workbench.dashboards.series import DownsampledSeries

NAMES = ["eval/gsm8k/avg@4", "loss", "optim/grad_norm", "optim/lr", "policy/kl", "reward/mean", "reward/std",
         "time/wait_for_batch", "val/loss"]


def shown(text: str) -> list[str]:
    pattern = MetricFilter.parse(text)
    return [name for name in NAMES if pattern(name)]


def test_a_glob_matches_whole_names_with_wildcards_and_parts_without() -> None:
    assert MetricFilter.parse("reward/*").kind == "glob"
    assert shown("reward/*") == ["reward/mean", "reward/std"]
    assert shown("loss") == ["loss", "val/loss"]  # no wildcard: a part of the name
    assert shown("LOSS") == ["loss", "val/loss"]  # case ignored
    assert shown("optim/*, reward/m?an") == ["optim/grad_norm", "optim/lr", "reward/mean"]  # alternatives
    assert shown("*/[kl]*") == ["optim/lr", "policy/kl", "val/loss"]
    assert shown("") == NAMES and MetricFilter.parse("  ").kind == "all"


def test_a_regex_by_its_prefix_or_its_syntax() -> None:
    assert MetricFilter.parse("re:kl").kind == "regex" and shown("re:kl") == ["policy/kl"]
    assert MetricFilter.parse("^reward/").kind == "regex"  # ^ exists only in a regex
    assert shown("^(loss|val/)") == ["loss", "val/loss"]
    assert shown("eval/.*avg") == ["eval/gsm8k/avg@4"]  # .* is a regex's
    assert shown("loss$") == ["loss", "val/loss"]
    assert MetricFilter.parse("re:^reward/").describe() == "regex ^reward/"


def test_a_bad_regex_says_what_to_fix_and_keeps_the_filter() -> None:
    state = GridState()
    state.set_filter("reward/*")
    with pytest.raises(FilterError, match=r"bad regex '\(reward': missing \), unterminated subpattern"):
        state.set_filter("re:(reward")
    assert state.filter.text == "reward/*"  # left as it was
    assert MetricFilter.parse("reward/[").kind == "glob"  # a glob's unclosed [ matches itself: no error


def test_pinned_metrics_come_first_whatever_the_filter() -> None:
    state = GridState()
    state.set_filter("optim/*")
    state.toggle_pin("reward/mean")
    state.toggle_pin("gone/metric")  # pinned, then no run logs it: not shown
    assert state.ordered(NAMES) == ["reward/mean", "optim/grad_norm", "optim/lr"]
    state.toggle_pin("reward/mean")
    assert state.ordered(NAMES) == ["optim/grad_norm", "optim/lr"]


def test_layout_fits_the_room_until_set_and_the_keys_cycle_one_to_four() -> None:
    state = GridState()
    assert state.layout(120, 30) == (3, 3) and state.layout(30, 5) == (1, 1) and state.layout(400, 100) == (4, 4)
    view = state.view(NAMES, 120, 30)
    state.cycle_columns(view)
    assert state.columns == 4
    state.cycle_columns(state.view(NAMES, 120, 30))
    assert state.columns == 1
    state.cycle_rows(state.view(NAMES, 120, 30))
    assert state.layout(120, 30) == (1, 4)


def test_the_highlight_moves_across_cells_and_pages_and_stays_on_its_metric() -> None:
    state = GridState()
    state.columns, state.rows = 2, 2
    view = state.view(NAMES, 100, 100)
    assert view.metrics == NAMES[:4] and view.pages == 3 and view.highlighted == NAMES[0]
    state.move(view, 1, 1)  # right, then down a row
    assert state.highlighted == NAMES[3]
    state.move(state.view(NAMES, 100, 100), 0, 1)  # past the page's bottom: the next page
    view = state.view(NAMES, 100, 100)
    assert view.page == 1 and view.highlighted == NAMES[5] and view.metrics == NAMES[4:8]
    state.turn_page(view, 1)
    assert state.view(NAMES, 100, 100).metrics == NAMES[8:]
    state.turn_page(state.view(NAMES, 100, 100), 5)  # no further than the last page
    assert state.highlighted == NAMES[8]
    state.move(state.view(NAMES, 100, 100), 0, 7)
    assert state.highlighted == NAMES[-1]
    # New metrics come in before it: it stays on its metric (and its page follows).
    view = state.view(["a/new", "b/new", *NAMES], 100, 100)
    assert view.highlighted == NAMES[-1] and view.page == 2
    state.toggle_pin(NAMES[-1])
    assert state.view(NAMES, 100, 100).page == 0  # pinned: on the first page, still highlighted


def series(*points: tuple[float, float]) -> DownsampledSeries:
    s = DownsampledSeries(16)
    for x, y in points:
        s.append(x, y)
    return s


def test_log_y_leaves_out_values_at_or_below_zero_and_a_cell_of_none_stays_linear() -> None:
    cache = PointsCache()
    runs = [("a", {"loss": series((1, 100.0), (2, 0.0), (3, -1.0), (4, 0.01))}),
            ("b", {"loss": series((1, -5.0), (2, -1.0))})]
    data = cell_data("loss", runs, 64, True, 0.0, None, cache)
    assert data.log_y and data.hidden == 4  # two of a's, two of b's
    assert [line.run_id for line in data.lines] == ["a"]  # b has no positive value: no curve
    assert data.lines[0].ys == [2.0, -2.0]
    only_negative = cell_data("loss", runs[1:], 64, True, 0.0, None, cache)
    assert not only_negative.log_y and only_negative.lines[0].ys == [-5.0, -1.0]  # drawn linear


def test_a_run_keeps_its_colour_across_redraws_orders_and_interpreters() -> None:
    ids = ["rl-20260101-aaaa", "rl-20260101-bbbb", "rl-20260101-cccc"]
    colours = run_colours(ids)
    assert colours == run_colours(list(reversed(ids))) == run_colours(ids)
    assert len(set(colours.values())) == 3 and set(colours.values()) <= set(RUN_COLOURS)
    # Two runs whose ids land on one colour: the later in id order takes the next free one.
    first = "run-0"
    clash = next(f"run-{i}" for i in range(1, 1000) if run_colour(f"run-{i}") == run_colour(first))
    both = run_colours([clash, first])
    assert both[first] == run_colour(first) and both[clash] != both[first]
    # The same in a fresh interpreter (no salted hash), which also imports the model without textual.
    code = ("import json, sys\nfrom prime_lab.workbench.dashboards.grid_model import run_colours\n"
            f"print(json.dumps([run_colours({ids!r}), 'textual' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [colours, False]


def test_the_run_on_top_is_drawn_last() -> None:
    assert draw_order(["own", "b", "c"], None) == ["b", "c", "own"]
    assert draw_order(["own", "b", "c"], "b") == ["own", "c", "b"]
    assert draw_order(["own", "b"], "gone") == ["b", "own"]
    assert draw_order([], None) == []


def test_downsampling_keeps_each_buckets_lowest_and_highest_in_order() -> None:
    xs = [float(x) for x in range(1000)]
    ys = [0.0] * 1000
    ys[501] = 9.0  # a grad-norm spike
    ys[10] = -3.0
    out_x, out_y = min_max_buckets(xs, ys, 50)
    assert len(out_x) <= 100 and out_x == sorted(out_x)
    assert 9.0 in out_y and -3.0 in out_y and out_x[out_y.index(9.0)] == 501.0
    assert min_max_buckets(xs[:80], ys[:80], 50) == (xs[:80], ys[:80])  # fewer than 2 per bucket: as they are


def test_the_cache_recomputes_a_series_only_when_it_moved() -> None:
    cache = PointsCache()
    reward, loss = series((1, 0.1), (2, 0.2)), series((1, 1.0), (2, 0.9))
    runs = [("a", {"reward": reward, "loss": loss})]
    for metric in ("reward", "loss"):
        cell_data(metric, runs, 64, False, 0.0, None, cache)
    assert cache.computed == 2
    before = {m: cell_signature(m, runs, (32, 6), False, 0.0, None) for m in ("reward", "loss")}
    reward.append(3, 0.3)  # a new step of one metric
    after = {m: cell_signature(m, runs, (32, 6), False, 0.0, None) for m in ("reward", "loss")}
    assert after["loss"] == before["loss"] and after["reward"] != before["reward"]  # only its cell redraws
    assert only_data_moved(after["reward"], before["reward"])  # (a key's redraw leaves it to the next one)
    assert not only_data_moved(cell_signature("reward", runs, (32, 6), True, 0.0, None), before["reward"])
    assert not only_data_moved(cell_signature("reward", runs, (40, 6), False, 0.0, None), before["reward"])
    two = [*runs, ("b", {"reward": reward})]
    assert not only_data_moved(cell_signature("reward", two, (32, 6), False, 0.0, None), before["reward"])
    for metric in ("reward", "loss"):
        cell_data(metric, runs, 64, False, 0.0, None, cache)
    assert cache.computed == 3
    cell_data("loss", runs, 64, True, 0.0, None, cache)  # log-Y: its own points
    cell_data("loss", runs, 32, False, 0.6, None, cache)  # narrower, smoothed
    assert cache.computed == 5


def test_the_raster_draws_each_curve_in_braille_with_the_top_one_owning_overlaps() -> None:
    rising = ([0.0, 1.0, 2.0, 3.0], [0.0, 1.0, 2.0, 3.0])
    falling = ([0.0, 3.0], [3.0, 0.0])
    raster = rasterize([rising, falling], 4, 2)
    assert raster.x_range == (0.0, 3.0) and raster.y_range == (0.0, 3.0)
    assert len(raster.rows) == 2 and all(len(row) == 4 for row in raster.rows)
    # The rising curve: bottom-left to top-right; its first dot is the bottom-left one of the bottom row.
    assert ord(raster.rows[1][0]) - 0x2800 & 0x40
    assert ord(raster.rows[0][3]) - 0x2800 & 0x08  # and its last, the top-right dot of the top row
    alone = [rasterize([curve], 4, 2) for curve in (rising, falling)]  # (the same ranges as both together)
    shared = [(r, c) for r in range(2) for c in range(4) if alone[0].rows[r][c] != " " != alone[1].rows[r][c]]
    assert shared and all(raster.owners[r][c] == 1 for r, c in shared)  # where both draw: the top one's colour
    assert raster.owners[1][0] == 0 and raster.owners[0][0] == 1  # where one draws: its own
    empty = rasterize([], 3, 2)
    assert empty.rows == ["   ", "   "] and empty.owners == [[-1] * 3] * 2
    flat = rasterize([([5.0], [2.0])], 3, 3)  # one point: in the middle of a padded range
    assert flat.y_range[0] < 2.0 < flat.y_range[1] and sum(ch != " " for row in flat.rows for ch in row) == 1


def test_each_dot_column_spans_the_rows_its_points_and_crossings_cover() -> None:
    import numpy as np

    rng = np.random.default_rng(7)
    for _ in range(200):  # polylines of 1 to 40 points, x increasing (repeats too), against a loop over each point
        n, columns, rows = int(rng.integers(1, 40)), int(rng.integers(1, 30)), int(rng.integers(1, 20))
        x = np.sort(rng.uniform(-1, columns, n)).round(int(rng.integers(0, 3)))
        y = rng.uniform(-2, rows + 2, n)
        low, high = column_spans(x, y, columns, rows)
        covered = []  # (column, row) of each point, and of each crossing of an edge for the columns on both sides
        px = [min(max(int(np.rint(v)), 0), columns - 1) for v in x]
        covered += [(column, min(max(int(np.rint(value)), 0), rows - 1)) for column, value in zip(px, y, strict=True)]
        for edge in range(px[0], px[-1]):
            row = min(max(int(np.rint(np.interp(edge + 0.5, x, y))), 0), rows - 1)
            covered += [(edge, row), (edge + 1, row)]
        want_low = [min([r for c, r in covered if c == column], default=rows) for column in range(columns)]
        want_high = [max([r for c, r in covered if c == column], default=-1) for column in range(columns)]
        assert low.tolist() == want_low and high.tolist() == want_high


def test_labels_fit_seven_characters() -> None:
    assert [compact(v) for v in (0, 0.7341, 1500.0, 12345.0, 3e-5, -0.5, 1e-2)] == \
        ["0", "0.734", "1500", "1.2e4", "3e-5", "-0.5", "0.01"]
    assert [step_label(x) for x in (950, 12000, 1.2e7)] == ["950", "12k", "12M"]


def test_a_gepa_runs_numbers_fold_into_metric_series_for_the_grid() -> None:
    from prime_lab.workbench.dashboards.event_folds import MetricsFold
    from prime_lab.workbench.dashboards.files import read_events
    from tests.workbench.lab_fixtures import FIXTURES

    items, _ = read_events(FIXTURES / "gepa-run" / "events.jsonl", 0)
    fold = MetricsFold()
    fold.feed(gepa_metric_events(items))
    assert sorted(fold.series) == ["budget/remaining", "budget/used", "frontier/best_score", "frontier/candidates",
                                   "iteration/accepted", "iteration/child_score", "iteration/metric_calls",
                                   "iteration/parent_score", "iteration/seconds"]
    xs, best = fold.series["frontier/best_score"].points()
    assert best[-1] == pytest.approx(0.476, abs=1e-3) and best == sorted(best)  # the best only rises
    assert fold.series["iteration/child_score"].count == 8  # one per iteration
    assert gepa_metrics("gepa.iteration", {"parent_scores": [0.2, 0.4], "child_scores": [], "verdict": "rejected",
                                           "seconds": True}) == {"iteration/parent_score": pytest.approx(0.3),
                                                                 "iteration/accepted": 0.0}


def test_runs_folded_in_their_own_processes_fold_as_they_do_here() -> None:
    from tests.workbench.lab_fixtures import FIXTURES

    path = FIXTURES / "rl-run" / "events.jsonl"
    here = fold_metrics(path, 16)
    apart = fold_metrics_apart([path, path], 16)  # (two processes, a real child each)
    assert len(apart) == 2 and sorted(apart[0].series) == sorted(here.series) and len(here.series) == 22
    for model in apart:
        for key, series in here.series.items():
            assert model.series[key].points() == series.points() and model.series[key].capacity == 16
        assert model.latest_step == 30 and not model.logs  # an overlay draws no log lines
