"""Metric charts on textual-plot's PlotWidget: which metrics each chart draws, EMA smoothing, overlays of other runs.

A chart redraws only when what it shows changed (series versions, smoothing, the runs compared) and only while it
is on screen; the data are bounded series (workbench.dashboards.series), so a redraw costs a few milliseconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from textual.app import RenderResult
from textual.css.query import NoMatches
from textual_plot import HiResMode, LegendLocation, PlotWidget

from prime_lab.workbench.dashboards.event_folds import MetricsFold
from prime_lab.workbench.dashboards.series import ema

PALETTE = ("#4EBF71", "#0178D4", "#FFA62B", "#E06C75", "#C678DD", "#56B6C2", "#D19A66", "#98C379")
BAND_STYLE = "grey42"
POINT_STYLE = "bold #FFD700"
SMOOTHING_STEPS = (0.0, 0.6, 0.9, 0.99)
LEGEND_MIN_WIDTH = 70


@dataclass(frozen=True)
class ChartSpec:
    """One chart: metric keys drawn as lines, keys matched by prefix (per-environment lines), keys drawn as points
    (evaluations), and an optional (mean, std) band."""

    id: str
    title: str
    lines: tuple[str, ...]
    line_prefixes: tuple[str, ...] = ()
    points: tuple[str, ...] = ()
    point_patterns: tuple[tuple[str, str], ...] = ()  # (prefix, suffix)
    band: tuple[str, str] | None = None

    def line_keys(self, available: Sequence[str]) -> list[str]:
        extra = [k for k in available if k not in self.lines and k not in self.excluded()
                 and any(k.startswith(p) for p in self.line_prefixes)]
        return [k for k in self.lines if k in available] + extra

    def point_keys(self, available: Sequence[str]) -> list[str]:
        return [k for k in available if k in self.points
                or any(k.startswith(p) and k.endswith(s) for p, s in self.point_patterns)]

    def excluded(self) -> set[str]:
        return set(self.band or ()) | set(self.points)

    def keys(self) -> set[str]:
        return set(self.lines) | set(self.points) | set(self.band or ())


RL_CHARTS: tuple[ChartSpec, ...] = (
    ChartSpec("reward", "reward (mean ± std, per env; ● eval/val)", ("reward/mean",), line_prefixes=("reward/",),
              points=("val_reward/mean",), point_patterns=(("eval/", "/reward"),), band=("reward/mean", "reward/std")),
    ChartSpec("entropy", "policy/entropy", ("policy/entropy",)),
    ChartSpec("kl", "KL: mismatch (policy/kl), reference (policy/ref_kl)", ("policy/kl", "policy/ref_kl")),
    ChartSpec("teacher-kl", "teacher/kl: KL(sampler || teacher)", ("teacher/kl",)),
    ChartSpec("loss", "loss", ("loss",)),
    ChartSpec("lr", "optim/lr", ("optim/lr",)),
    ChartSpec("grad", "optim/grad_norm", ("optim/grad_norm",)),
    ChartSpec("length", "rollout/mean_length", ("rollout/mean_length",)),
    ChartSpec("truncated", "rollout/truncated", ("rollout/truncated",)),
    ChartSpec("throughput", "perf/tokens_per_s", ("perf/tokens_per_s",)),
)

SFT_CHARTS: tuple[ChartSpec, ...] = (
    ChartSpec("loss", "loss (loss/mean; ● val/loss)", ("loss/mean",), points=("val/loss",)),
    ChartSpec("perplexity", "loss/perplexity (● val/perplexity)", ("loss/perplexity",),
              points=("val/perplexity",)),
    ChartSpec("lr", "optim/lr", ("optim/lr",)),
    ChartSpec("grad", "optim/grad_norm", ("optim/grad_norm",)),
    ChartSpec("tokens", "progress/num_tokens", ("progress/num_tokens",)),
    ChartSpec("throughput", "perf/throughput (tokens/s)", ("perf/throughput",)),
)


def custom_chart(key: str) -> ChartSpec:
    return ChartSpec("m-" + "".join(c if c.isalnum() else "-" for c in key), key, (key,))


class MetricChart(PlotWidget, can_focus=False):
    """A PlotWidget bound to a ChartSpec. Not focusable: the dashboard's keys stay the dashboard's."""

    DEFAULT_CSS = """
    MetricChart { height: 12; border: round $primary-darken-2; border-title-color: $text; }
    """

    def __init__(self, spec: ChartSpec) -> None:
        super().__init__(id=f"chart-{spec.id}", allow_pan_and_zoom=False)
        self.spec = spec
        self.border_title = spec.title
        self._signature: tuple[object, ...] | None = None
        self._drawn_wide: bool | None = None  # whether the last redraw had room for a legend
        self.drawn_points = 0  # points drawn by the last redraw (tests and the bench read it)

    @property
    def wide(self) -> bool:
        return self.size.width >= LEGEND_MIN_WIDTH

    def render(self) -> RenderResult:
        try:
            return super().render()
        except NoMatches:  # being removed (the charts were replaced): textual-plot's legend child is already gone
            return ""

    def on_resize(self) -> None:
        if self.wide != self._drawn_wide:
            self._signature = None  # redraw: there is room for the legend now, or no longer

    @property
    def needs_draw(self) -> bool:
        """Never drawn, or resized to or from a width with room for the legend since."""
        return self._signature is None

    def on_mount(self) -> None:
        self.margin_top = 0
        self.margin_bottom = 2
        self.margin_left = 8

    def signature(self, runs: Sequence[tuple[str, MetricsFold]], smoothing: float) -> tuple[object, ...]:
        parts: list[object] = [smoothing]
        for label, model in runs:
            parts.append(label)
            keys = self.spec.keys() | set(self.spec.line_keys(list(model.series)))
            keys |= set(self.spec.point_keys(list(model.series)))
            parts.extend((k, model.series[k].version) for k in sorted(keys) if k in model.series)
        return tuple(parts)

    def draw(self, runs: Sequence[tuple[str, MetricsFold]], smoothing: float) -> bool:
        """Redraw from `runs` (this run first, then runs compared with it); False when nothing changed."""
        signature = self.signature(runs, smoothing)
        if signature == self._signature:
            return False
        if not self.query("#legend"):  # composed, children not mounted yet (the charts were just rebuilt): draw
            if self.is_attached:       # after the next refresh, when they are (clearing needs the legend)
                self.call_after_refresh(self.draw, runs, smoothing)
            return False
        self._signature = signature
        wide = self._drawn_wide = self.wide
        self.clear()
        drawn = 0
        labelled = len(runs) > 1
        legend = labelled
        for r, (label, model) in enumerate(runs):
            available = list(model.series)
            line_keys = self.spec.line_keys(available)
            point_keys = self.spec.point_keys(available) if r == 0 else []
            if r > 0:  # a compared run: its main curves only, in its own colour
                line_keys = [k for k in self.spec.lines if k in available]
            if r == 0 and self.spec.band and all(k in model.series for k in self.spec.band):
                drawn += self._band(model, smoothing)
            for i, key in enumerate(line_keys):
                xs, ys = model.series[key].points()
                if not xs:
                    continue
                color = PALETTE[(r if r > 0 else i) % len(PALETTE)]
                name = f"{label} {key}" if labelled else key
                with_label = labelled or len(line_keys) > 1 or bool(point_keys)  # (points have a legend)
                legend |= with_label
                if len(xs) == 1:  # a line needs two points
                    self.scatter(xs, ys, marker="●", marker_style=color, label=name if with_label else None)
                else:
                    self.plot(xs, ema(ys, smoothing), line_style=color, hires_mode=HiResMode.BRAILLE,
                              label=name if with_label else None)
                drawn += len(xs)
            for key in point_keys:  # (this run's only)
                xs, ys = model.series[key].points()
                self.scatter(xs, ys, marker="●", marker_style=POINT_STYLE, label=key)
                drawn += len(xs)
                legend = True
        self._pad_flat_axes()
        # A legend covers a narrow chart: there the title says what the lines are.
        self.show_legend(LegendLocation.BOTTOMRIGHT if self.spec.id == "reward" else LegendLocation.TOPRIGHT,
                         is_visible=legend and wide)
        self.drawn_points = drawn
        return True

    def _band(self, model: MetricsFold, smoothing: float) -> int:
        mean_key, std_key = self.spec.band or ("", "")
        xs, means = model.series[mean_key].points()
        sx, stds = model.series[std_key].points()
        if not xs or len(sx) != len(xs):
            return 0
        means, stds = ema(means, smoothing), ema(stds, smoothing)
        self.plot(xs, [m + s for m, s in zip(means, stds, strict=True)], line_style=BAND_STYLE,
                  hires_mode=HiResMode.BRAILLE)
        self.plot(xs, [m - s for m, s in zip(means, stds, strict=True)], line_style=BAND_STYLE,
                  hires_mode=HiResMode.BRAILLE)
        return 2 * len(xs)

    def _pad_flat_axes(self) -> None:
        """One step or a constant metric: give the axis some room instead of ticks 1e-6 apart."""
        xs = [v for d in self._datasets for v in (float(d.x.min()), float(d.x.max())) if len(d.x)]
        ys = [v for d in self._datasets for v in (float(d.y.min()), float(d.y.max())) if len(d.y)]
        if xs and max(xs) - min(xs) < 1e-9:
            self.set_xlimits(xs[0] - 1, xs[0] + 1)
        else:
            self.set_xlimits(None, None)
        if ys and max(ys) - min(ys) < 1e-9:
            pad = max(abs(ys[0]) * 0.1, min(abs(ys[0]), 0.1)) or 0.1  # (a learning rate of 1e-4: room of its size)
            self.set_ylimits(ys[0] - pad, ys[0] + pad)
        else:
            self.set_ylimits(None, None)
