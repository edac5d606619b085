"""The figures' drawing, from plain data (no runs, no logs): each function returns a matplotlib Figure of a paper's
column width (``analysis.style``), every measured point with its 95% interval where one is given, axes where the
data need them (bars from 0; lines and points not forced to 0), no titles, footers or paths in the image."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import MaxNLocator

from analysis import names
from analysis import paper_model as pm
from analysis import style
from analysis.figures.common import BINS, GAMMAS, bin_label

GREY = "#555555"


@dataclass
class Series:
    """A line or a set of points: ``points`` are (x, y, low, high), low / high None or NaN without an interval."""

    label: str
    color: str
    points: Sequence[tuple]
    marker: str = "o"
    linestyle: str = "-"
    filled: bool = True


@dataclass
class Panel:
    title: str
    series: list[Series]
    xlabel: str = ""
    ylabel: str = ""
    reference: tuple | None = None  # (label, value, low, high): a dashed horizontal line with its band
    integer_x: bool = True
    limits: tuple | None = None  # (x limits, y limits), None: where the data need them


def _bounds(values, lows, highs) -> list[list[float]]:
    clean = [(v, lo if lo is not None and math.isfinite(lo) else v, hi if hi is not None and math.isfinite(hi) else v)
             for v, lo, hi in zip(values, lows, highs)]
    return style.yerr([c[0] for c in clean], [c[1] for c in clean], [c[2] for c in clean])


def _grid(n: int, row_height: float, columns: int = 2):
    columns = min(columns, n)
    rows = math.ceil(n / columns)
    fig, axes = style.figure("two" if columns > 1 else "one", row_height * rows, rows, columns, squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def _legend_below(fig, axes, columns: int = 2) -> None:
    """One legend for all panels under them (each label once)."""
    handles, labels = [], []
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=columns, frameon=False)


def _draw_series(ax, series: Series, offset: float = 0.0) -> None:
    points = sorted(series.points, key=lambda p: p[0])
    x = [p[0] + offset for p in points]
    y = [p[1] for p in points]
    err = _bounds(y, [p[2] for p in points], [p[3] for p in points])
    ax.errorbar(x, y, yerr=err, color=series.color, marker=series.marker, linestyle=series.linestyle,
                label=series.label, markerfacecolor=series.color if series.filled else "white", **style.ERRORBAR)


def lines(panels: Sequence[Panel], columns: int = 2, row_height: float = 2.5, legend_columns: int = 2,
          jitter: float = 0.0) -> plt.Figure:
    """Panels of lines with interval bars, an optional reference line with its band, one legend below."""
    fig, axes = _grid(len(panels), row_height, columns)
    for ax, panel in zip(axes, panels):
        if panel.reference is not None:
            label, value, low, high = panel.reference
            ax.axhline(value, color=GREY, linestyle="--", linewidth=0.9, label=label)
            if low is not None and high is not None and math.isfinite(low) and high > low:
                ax.axhspan(low, high, color=GREY, alpha=0.15, linewidth=0)
        spread = len(panel.series) - 1
        for i, series in enumerate(panel.series):
            _draw_series(ax, series, jitter * (i - spread / 2) if jitter else 0.0)
        ax.set_title(panel.title)
        ax.set_xlabel(panel.xlabel)
        ax.set_ylabel(panel.ylabel)
        if panel.integer_x:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if panel.limits is not None:
            if panel.limits[0] is not None:
                ax.set_xlim(*panel.limits[0])
            if panel.limits[1] is not None:
                ax.set_ylim(*panel.limits[1])
    fig.tight_layout()
    _legend_below(fig, axes, legend_columns)
    return fig


@dataclass
class Bars:
    """One histogram series: a share per bin with its interval."""

    label: str
    color: str
    shares: Sequence[float]
    lows: Sequence[float] = field(default_factory=list)
    highs: Sequence[float] = field(default_factory=list)


def bin_positions() -> np.ndarray:
    """x of each histogram bin: one apart, the wide bins (9-16, 17+) further apart for their labels."""
    x, position = [], 0.0
    for i, (low, high) in enumerate(BINS):
        wide = high is None or high > low
        position += (1.3 if wide else 1.0) if i else 0.0
        x.append(position)
    return np.array(x)


def accepted_histogram(panels: Sequence[tuple[str, Sequence[Bars]]],
                       times: Sequence[tuple[str, str, float, float, float]] | None = None,
                       times_label: str = "time per token (ms)") -> plt.Figure:
    """Panels of (title, bars per bin of tokens appended per verification) and, beside them, a panel of
    (label, colour, value, low, high) horizontal bars (``times``; None: none)."""
    count = len(panels) + (1 if times else 0)
    fig, axes = _grid(count, 2.3)
    x = bin_positions()
    labels = [bin_label(*b) for b in BINS]
    for ax, (title, series) in zip(axes, panels):
        width = 0.8 / max(len(series), 1)
        top = 1.0
        for i, bars in enumerate(series):
            lows = bars.lows or [None] * len(bars.shares)
            highs = bars.highs or [None] * len(bars.shares)
            err = _bounds(bars.shares, lows, highs)
            ax.bar(x - 0.4 + width * (i + 0.5), bars.shares, width, color=bars.color, label=bars.label,
                   yerr=err, error_kw={"elinewidth": 0.6, "capsize": 1.2, "capthick": 0.6})
            top = max([top] + [s + e for s, e in zip(bars.shares, err[1])])
        ax.set_xticks(x, labels)
        ax.set_ylim(0, top * 1.55)
        ax.set_title(title)
        ax.set_xlabel("tokens appended per target verification")
        ax.set_ylabel("verifications (%)")
        ax.grid(axis="x", visible=False)
        ax.legend(loc="upper right", handlelength=1.0)
    if times:
        ax = axes[-1]
        positions = np.arange(len(times))
        values = [t[2] for t in times]
        err = _bounds(values, [t[3] for t in times], [t[4] for t in times])
        ax.barh(positions, values, color=[t[1] for t in times], xerr=err,
                error_kw={"elinewidth": 0.7, "capsize": 1.5, "capthick": 0.7})
        ax.set_yticks(positions, [t[0] for t in times])
        ax.invert_yaxis()
        ax.set_xlabel(times_label)
        ax.grid(axis="y", visible=False)
    fig.tight_layout()
    return fig


def timeline(panels: Sequence[tuple[str, Sequence, Sequence[str]]]) -> plt.Figure:
    """Panels of (title, stage traces of one sample, stage labels): one row per stage, a bar per step, rollbacks
    marked, each stage's busy share at the right."""
    heights = [0.55 + 0.32 * len(traces) for _, traces, _ in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(style.TWO_COLUMN, sum(heights) + 0.5), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    for ax, (title, traces, labels) in zip(axes[:, 0], panels):
        origin = min(t.start_time for t in traces)
        for row, trace in enumerate(traces):
            steps = trace.steps
            for kind, color in style.KIND_COLORS.items():
                bars = [(s - origin, e - s) for s, e, k in zip(steps["t_start"], steps["t_end"], steps["kind"])
                        if k == kind]
                if bars:
                    ax.broken_barh(bars, (row - 0.4, 0.8), facecolors=color, edgecolors="none")
            if steps["kind"] and all(f == 0 for f in steps["fed"]):  # prompt lookup: microsecond steps, mark them
                ticks = [s - origin for s in steps["t_start"]]
                ax.plot(ticks, [row] * len(ticks), "|", color=style.KIND_COLORS["draft"], markersize=7)
            rollbacks = [s - origin for s, r in zip(steps["t_start"], steps["rollbacks"]) if r]
            ax.plot(rollbacks, [row + 0.45] * len(rollbacks), "v", color="#D55E00", markersize=2.5)
            busy = sum(e - s for s, e in zip(steps["t_start"], steps["t_end"]))
            wall = max(trace.end_time - trace.start_time, 1e-9)
            ax.text(1.005, row, f"{100 * busy / wall:.0f}% busy", transform=ax.get_yaxis_transform(), va="center")
        ax.set_yticks(range(len(traces)), labels)
        ax.set_ylim(len(traces) - 0.4, -0.6)
        ax.set_title(title, loc="left")
        ax.grid(axis="y", visible=False)
    axes[-1, 0].set_xlabel("time since the sample started (s)")
    handles = [matplotlib.patches.Patch(color=c, label=f"{k} step") for k, c in style.KIND_COLORS.items()]
    handles.append(matplotlib.lines.Line2D([], [], marker="v", color="#D55E00", linestyle="", label="rollback"))
    fig.tight_layout()
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=4, frameon=False)
    return fig


def gpu_utilisation(panels: Sequence[tuple[str, dict, dict[int, str]]],
                    bars: Sequence[tuple[str, Sequence[tuple[str, str, float, float, float]]]]) -> plt.Figure:
    """Panels of (title, ``gpu_panel_data`` of one sample, GPU -> model) as lines (colour: the model; a model on
    two GPUs: solid, then dashed), and beside them bar panels of (title, [(name, colour, mean, low, high)])."""
    fig = plt.figure(figsize=(style.TWO_COLUMN, 1.5 * len(panels) + 0.3))
    grid = fig.add_gridspec(len(panels), 2, width_ratios=(2.5, 1))
    models = list(dict.fromkeys(m for _, _, gpus in panels for m in sorted(set(gpus.values()), key=model_size)))
    line_axes = []
    for i, (title, data, gpus) in enumerate(panels):
        ax = fig.add_subplot(grid[i, 0])
        line_axes.append(ax)
        for column, gpu in enumerate(data["active"]):
            model = gpus[gpu]
            same = [g for g in data["active"] if gpus[g] == model]
            label = model if len(same) == 1 else f"{model}, GPU {same.index(gpu) + 1} of {len(same)}"
            ax.plot(data["times"], data["utilisation"][:, column], linewidth=0.7,
                    color=style.PALETTE[models.index(model) % len(style.PALETTE)],
                    linestyle="-" if same.index(gpu) == 0 else "--", label=label)
        ax.set_title(title, loc="left")
        ax.set_ylabel("utilisation (%)")
        ax.set_ylim(0, 102)
        if i == len(panels) - 1:
            ax.set_xlabel("time since the sample started (s)")
    for i, (title, values) in enumerate(bars[:len(panels)]):
        ax = fig.add_subplot(grid[i, 1])
        positions = np.arange(len(values))
        means = [v[2] for v in values]
        ax.bar(positions, means, color=[v[1] for v in values], yerr=_bounds(means, [v[3] for v in values],
                                                                           [v[4] for v in values]),
               error_kw={"elinewidth": 0.7, "capsize": 1.5, "capthick": 0.7})
        ax.set_xticks(positions, [v[0] for v in values])
        ax.set_title(title)
        ax.grid(axis="x", visible=False)
    fig.tight_layout()
    _legend_below(fig, line_axes, 4)
    return fig


def model_size(model: str) -> float:
    """ "70B" -> 70e9, for ordering models smallest first (unknown names last)."""
    try:
        return float(model[:-1]) * (1e9 if model[-1].upper() == "B" else 1e6)
    except ValueError:
        return math.inf


def rho_alpha(panels: Sequence[tuple[str, Sequence[tuple]]], xlabel: str, gammas: Sequence[int] = GAMMAS
              ) -> plt.Figure:
    """Eq. 3 curves rho(alpha) per gamma, and per panel the measured points (alpha, low, high, rho, low, high,
    gamma, label): colour = gamma (colour bar), marker = label, intervals on both axes where given."""
    columns = min(len(panels), 2)
    # one column: narrower than the column, as the colour bar's label reaches past the figure's edge
    fig, axes = style.figure("two" if columns > 1 else style.ONE_COLUMN - 0.15, 2.9, 1, columns, squeeze=False)
    axes = list(axes.flat)
    alphas = np.linspace(0.0, 1.0, 201)
    cmap = plt.get_cmap("viridis")
    norm = matplotlib.colors.LogNorm(vmin=min(gammas), vmax=max(gammas))
    markers: dict[str, str] = {}
    for ax, (title, points) in zip(axes, panels):
        for gamma in gammas:
            ax.plot(alphas, [pm.steady_state_rho(a, gamma) for a in alphas], color=cmap(norm(gamma)), linewidth=0.9)
        for alpha, a_low, a_high, rho, r_low, r_high, gamma, label in points:
            marker = markers.setdefault(label, style.MARKERS[len(markers) % len(style.MARKERS)])
            color = cmap(norm(min(max(gamma, min(gammas)), max(gammas)))) if math.isfinite(gamma) else GREY
            ax.errorbar([alpha], [rho], xerr=_bounds([alpha], [a_low], [a_high]), yerr=_bounds([rho], [r_low], [r_high]),
                        color=color, marker=marker, markeredgecolor="black", markeredgewidth=0.4, linestyle="",
                        elinewidth=0.5, capsize=0, markersize=4, zorder=3)
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.05)
    axes[0].set_ylabel("rho (share of the verifier's steps that verify)")
    handles = [matplotlib.lines.Line2D([], [], color=GREY, label="Eq. 3 (one line per gamma)")]
    handles += [matplotlib.lines.Line2D([], [], marker=m, color="white", markeredgecolor="black", linestyle="",
                                        label=label) for label, m in markers.items()]
    bar = fig.colorbar(matplotlib.cm.ScalarMappable(norm=norm, cmap=cmap), ax=axes, fraction=0.05, pad=0.02)
    bar.set_label("gamma (drafts per verification)")
    bar.set_ticks(list(gammas), labels=[str(g) for g in gammas])
    bar.minorticks_off()
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.45, 0.0), ncol=2 if columns > 1 else 1,
               frameon=False)
    return fig


def model_measured(points: Sequence[tuple], colors: Sequence[tuple[str, str]], band: float = 0.15) -> plt.Figure:
    """(measured, low, high, ours, paper or None, colour) in tokens/s: left both models against measured with
    y = x and a +-band; right each model's error against the measured value, with the measured interval.
    ``colors``: (label, colour) of the legend's colours."""
    fig, (ax, errors) = style.figure("two", 2.8, 1, 2)
    values = [v for m, lo, hi, o, p, _ in points for v in (m, lo, hi, o, p) if v is not None and math.isfinite(v)]
    low, high = min(values) * 0.92, max(values) * 1.05
    line = np.array([low, high])
    ax.plot(line, line, color="black", linewidth=0.8)
    ax.fill_between(line, line * (1 - band), line * (1 + band), color=GREY, alpha=0.15, linewidth=0)
    errors.axhspan(-100 * band, 100 * band, color=GREY, alpha=0.15, linewidth=0)
    errors.axhline(0, color="black", linewidth=0.8)
    handles = [matplotlib.lines.Line2D([], [], color="black", linewidth=0.8, label="y = x"),
               matplotlib.patches.Patch(color=GREY, alpha=0.15, label=f"+-{100 * band:.0f}%")]
    for key, marker, label in ((3, "o", "our wall-clock model (in-sample)"), (4, "^", "paper model (Eq. 4 / 5)")):
        chosen = [p for p in points if p[key] is not None and math.isfinite(p[key])]
        if not chosen:
            continue
        measured = [p[0] for p in chosen]
        model = [p[key] for p in chosen]
        error = [100 * (m / x - 1) for m, x in zip(model, measured)]
        ax.errorbar(measured, model, xerr=_bounds(measured, [p[1] for p in chosen], [p[2] for p in chosen]),
                    linestyle="", color=GREY, elinewidth=0.5, capsize=0)
        errors.errorbar(measured, error, xerr=_bounds(measured, [p[1] for p in chosen], [p[2] for p in chosen]),
                        yerr=_bounds(error, [100 * (m / p[2] - 1) for m, p in zip(model, chosen)],
                                     [100 * (m / p[1] - 1) for m, p in zip(model, chosen)]),
                        linestyle="", color=GREY, elinewidth=0.5, capsize=0)
        for target in (ax, errors):
            target.scatter(measured, model if target is ax else error, c=[p[5] for p in chosen], marker=marker,
                           edgecolors="black", linewidths=0.4, s=16, zorder=3)
        handles.append(matplotlib.lines.Line2D([], [], marker=marker, color="white", markeredgecolor="black",
                                               linestyle="", label=label))
    handles += [matplotlib.lines.Line2D([], [], marker="s", color=c, linestyle="", label=name) for name, c in colors]
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    ax.set_xlabel("measured throughput (tokens/s)")
    ax.set_ylabel("model throughput (tokens/s)")
    errors.set_xlabel("measured throughput (tokens/s)")
    errors.set_ylabel("model error against measured (%)")
    fig.tight_layout()
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=4, frameon=False)
    return fig


def depth_series(by_strategy: dict[str, list[tuple]]) -> list[Series]:
    """Per strategy its points (depth, speedup, low, high), the configurations of one depth side by side (SD's
    first), and a line through the best per depth from greedy's 1 at depth 1."""
    order = sorted(by_strategy, key=lambda s: s != "sd")
    placed: dict[str, list[tuple]] = {s: [] for s in order}  # (x beside its depth, speedup, low, high, depth)
    for depth in sorted({p[0] for points in by_strategy.values() for p in points}):
        here = [(s, p) for s in order for p in by_strategy[s] if p[0] == depth]
        for i, (strategy, p) in enumerate(here):
            placed[strategy].append((depth + 0.07 * (i - (len(here) - 1) / 2), *p[1:], depth))
    series = []
    for strategy in order:
        spread = placed[strategy]
        best = [(1, 1.0)] + [max(((p[0], p[1]) for p in spread if p[4] == d), key=lambda p: p[1])
                             for d in sorted({p[4] for p in spread})]
        name = names.STRATEGY_NAMES[strategy]
        series.append(Series(f"{name}, best per depth", style.color(strategy), [(x, y, None, None) for x, y in best],
                             "", "-"))
        series.append(Series(f"{name}, every configuration", style.color(strategy), [p[:4] for p in spread],
                             "o" if strategy == "sd" else "s", ""))
    return series
