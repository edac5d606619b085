"""The paper's figures, from the authors' published logs and from our own results (no torch).

    python -m analysis.figures [--official DIR] [--results DIR] [--out paper_figures]

With its defaults it regenerates exactly the committed ``paper_figures/`` set. Each
figure ``<figure>_<source>`` is written as PNG, PDF and CSV (the plotted data, one row
per point or bar, with the file or run it came from), and ``figures.csv`` lists every
figure with its data source, the runs it selected and its caption. A figure listed
there by an earlier call and no longer made is removed. Sources:

- ``official``: the authors' HumanEval logs (``--official``: the results folder or its
  ``humaneval/`` subfolder);
- ``ours``: our exact (lossless) runs with greedy decoding under ``--results``; runs
  are drawn together only when they share dataset, budget and decoding
  (``analysis.runs.run_set_key``), and each is compared with the AR run of its own
  target, dataset and budget (``analysis.runs.greedy_reference``);
- ``synthetic``: runs with synthetic acceptance (drafts accepted at a set rate: not
  lossless), only in the figure made for them.

Figures: ``fig3_accepted_histogram`` (tokens appended per final-model verification in
the bins below, with a time-per-token panel), ``fig4_lookahead`` (ms/token against
lookahead with the AR line), ``fig5_gpu_utilisation`` (official: utilisation of each
active GPU, labelled by model, with per-active-GPU means, power and energy per token) /
``fig5_timeline`` (ours: per-stage busy timeline; no power data on our CPU runs),
``rho_alpha`` (Eq. 3 with measured points, colour bar = gamma), ``model_measured``
(our wall-clock model, an in-sample decomposition whose costs are fitted on the very
run it reports, and the paper's model, against measured tokens/s), ``speedup_depth``
and ``synthetic_acceptance``. Sampled runs get no figure yet (and never a greedy one).

Each ``figure_*`` function takes plain data and returns a matplotlib Figure;
``official_figures`` / ``ours_figures`` / ``synthetic_figures`` return thunks that
build a ``Drawn`` (figure, data rows, sources, caption), so ``analysis.report`` reuses them.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import os
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable, Iterator, Sequence

import matplotlib

matplotlib.use("Agg")  # files only: no display on the measurement machines
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from analysis import evaluate, fit  # noqa: E402
from analysis import import_official as official  # noqa: E402
from analysis import paper_model as pm  # noqa: E402
from pipespec.stats import StageStats  # noqa: E402
from analysis.runs import (  # noqa: E402
    ResultsError,
    Run,
    describe_run_set,
    find_runs,
    greedy_reference,
    run_set_key,
    select_runs,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OFFICIAL = REPO_ROOT.parent / "shared" / "reference" / "pipespec-official-results"
DEFAULT_RESULTS = REPO_ROOT / "results"
DEFAULT_OUT = REPO_ROOT / "paper_figures"
COMMAND = "python -m analysis.figures"
MANIFEST = "figures.csv"
MANIFEST_COLUMNS = ("figure", "files", "data", "selection", "caption")
SUFFIXES = ("png", "pdf", "csv")
GAMMAS = (1, 2, 4, 8, 16)
# histogram bins of tokens appended per verification (own token included): one per count up to the
# synchronous window of the 70B logs (8), then two wide bins for PipeSpec's long runs
BINS = ((1, 1), (2, 2), (3, 3), (4, 4), (5, 5), (6, 6), (7, 7), (8, 8), (9, 16), (17, None))
STRATEGY_COLORS = {"greedy": "tab:gray", "sd": "tab:blue", "pipespec": "tab:orange"}
KIND_COLORS = {"draft": "tab:green", "verify": "tab:orange", "single": "tab:blue"}
DISPLAY = {"greedy": "AR", "sd": "SD", "pipespec": "PipeSpec", "chain": "SD", "async-chain": "PipeSpec"}
MARKERS = "osD^vP*X"
ORDER = ["greedy", "sd", "pipespec"]  # strategies in every legend and table
SYNTHETIC_LABEL = "synthetic acceptance (not lossless)"
IN_SAMPLE = "in-sample decomposition"
NO_ENERGY = ("energy per token: not available (our runs are on CPUs: no NVML power samples; "
             "env.json holds none)")

# one style for every figure, fixed so the files do not depend on a user's matplotlibrc
STYLE = {
    "figure.dpi": 100, "savefig.dpi": 130, "font.family": "DejaVu Sans", "font.size": 9,
    "axes.titlesize": 9.5, "axes.labelsize": 9, "legend.fontsize": 7.5, "xtick.labelsize": 8,
    "ytick.labelsize": 8, "axes.grid": True, "grid.alpha": 0.3, "grid.linewidth": 0.6,
    "axes.spines.top": False, "axes.spines.right": False, "svg.hashsalt": "pipespec",
    "pdf.compression": 6, "path.simplify": True,
}
PNG_METADATA = {"Software": None}
PDF_METADATA = {"Creator": None, "Producer": None, "CreationDate": None}


@dataclass
class Drawn:
    """A built figure with the data it plots (``rows``), where that came from, and its caption."""

    fig: plt.Figure
    rows: list[dict]
    sources: list[str]  # data folders (repo-relative where possible)
    selection: str  # which runs or logs, chosen how
    caption: str
    extra: dict = field(default_factory=dict)


def _shown(path: str | Path) -> str:
    """A path relative to the repository (stable whichever folder the command runs from; symlinks are not
    followed, so a linked `../shared` still reads `../shared`)."""
    return os.path.relpath(os.path.abspath(path), REPO_ROOT)


def _fmt(value) -> str:
    if value is None:
        return ""
    if isinstance(value, (float, np.floating)):
        return "" if not math.isfinite(value) else f"{float(value):.6g}"
    return str(value)


def _caption(fig: plt.Figure, text: str, sources: Sequence[str]) -> None:
    """The caption line at the foot of a figure: what it shows, its data and the command."""
    fig.text(0.005, 0.004, f"{text}\nData: {'; '.join(sources)}. Made by: {COMMAND}", fontsize=6.5,
             va="bottom", ha="left", color="0.25", wrap=True)


def _finish(fig: plt.Figure, title: str, caption: str, sources: Sequence[str], bottom: float = 0.12) -> None:
    fig.suptitle(title, fontsize=10.5)
    fig.tight_layout(rect=(0, bottom, 1, 0.97))
    _caption(fig, caption, sources)


# --------------------------------------------------------------------------- figure builders (plain data in)


def bin_label(low: int, high: int | None) -> str:
    return str(low) if high == low else (f"{low}+" if high is None else f"{low}-{high}")


def binned_shares(counts: Sequence[int], bins=BINS) -> list[float]:
    """Percent of ``counts`` in each (low, high) bin (high None: open)."""
    total = max(len(counts), 1)
    return [100.0 * sum(1 for c in counts if c >= low and (high is None or c <= high)) / total for low, high in bins]


def figure_accepted_histogram(panels: Sequence[tuple[str, Sequence[tuple[str, str, Sequence[int]]]]],
                              times: Sequence[tuple[str, str, float]], title: str, caption: str,
                              sources: Sequence[str]) -> tuple[plt.Figure, list[dict]]:
    """Panels of (title, [(label, strategy, counts incl. own token)]), and (label, strategy, ms/token) bars."""
    n = len(panels) + 1
    fig, axes = plt.subplots(1, n, figsize=(4.3 * n, 4.1), squeeze=False,
                             gridspec_kw={"width_ratios": [3] * len(panels) + [2]})
    rows = []
    labels = [bin_label(*b) for b in BINS]
    x = np.arange(len(BINS))
    for ax, (panel_title, series) in zip(axes[0], panels):
        width = 0.8 / max(len(series), 1)
        for i, (label, strategy, counts) in enumerate(series):
            shares = binned_shares(counts)
            mean = float(np.mean(counts)) if len(counts) else math.nan
            ax.bar(x - 0.4 + width * (i + 0.5), shares, width, color=STRATEGY_COLORS[strategy],
                   label=f"{label} (mean {mean:.2f}, n={len(counts)})")
            rows += [{"panel": panel_title, "series": label, "bin": b, "percent_of_verifications": s,
                      "verifications": len(counts), "mean_tokens_per_verification": mean}
                     for b, s in zip(labels, shares)]
        ax.set_xticks(x, labels, fontsize=7)
        ax.set_ylim(0, max([r["percent_of_verifications"] for r in rows if r["panel"] == panel_title] + [1]) * 1.4)
        ax.set_title(panel_title)
        ax.set_xlabel("tokens appended per final-model verification (count)")
        ax.set_ylabel("share of verifications (%)")
        ax.legend(loc="upper left")
    ax = axes[0, -1]
    positions = np.arange(len(times))
    ax.barh(positions, [t[2] for t in times], color=[STRATEGY_COLORS[t[1]] for t in times])
    for pos, (label, _, ms) in zip(positions, times):
        ax.text(ms, pos, f" {ms:.1f}", va="center", fontsize=7)
        rows.append({"panel": "time per token", "series": label, "bin": "", "ms_per_token": ms})
    ax.set_yticks(positions, [t[0] for t in times], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, max(t[2] for t in times) * 1.25)
    ax.set_xlabel("time per token (ms)")
    ax.set_title("time per token")
    _finish(fig, title, caption, sources)
    return fig, rows


def figure_lookahead(panels: Sequence[tuple[str, dict[str, Sequence[tuple[int, float, str]]], tuple[str, float] | None]],
                     title: str, caption: str, sources: Sequence[str]) -> tuple[plt.Figure, list[dict]]:
    """Panels of (title, {strategy: [(lookahead, ms/token, source)]}, (AR label, AR ms/token) or None)."""
    fig, axes = plt.subplots(1, len(panels), figsize=(4.8 * len(panels), 3.9), squeeze=False)
    rows = []
    for ax, (panel_title, series, ar) in zip(axes[0], panels):
        for strategy in sorted(series, key=ORDER.index):
            points = sorted(series[strategy])
            ax.plot([p[0] for p in points], [p[1] for p in points], "o-", color=STRATEGY_COLORS[strategy],
                    label=DISPLAY[strategy], markersize=4)
            rows += [{"panel": panel_title, "strategy": DISPLAY[strategy], "lookahead": p[0], "ms_per_token": p[1],
                      "source": p[2]} for p in points]
        if ar is not None:
            ax.axhline(ar[1], color=STRATEGY_COLORS["greedy"], linestyle="--", label=f"AR ({ar[1]:.1f} ms)")
            rows.append({"panel": panel_title, "strategy": "AR", "lookahead": "", "ms_per_token": ar[1],
                         "source": ar[0]})
        ax.set_title(panel_title)
        ax.set_xlabel("lookahead (tokens)")
        ax.set_ylabel("time per token (ms)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylim(bottom=0)
        ax.legend(loc="lower right")
    _finish(fig, title, caption, sources)
    return fig, rows


def figure_timeline(panels: Sequence[tuple[str, Sequence]], title: str, caption: str,
                    sources: Sequence[str]) -> tuple[plt.Figure, list[dict]]:
    """Panels of (title, stage traces of one sample): one row per stage, a bar per step."""
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 1.6 + 0.9 * sum(len(t) for _, t in panels)),
                             squeeze=False)
    rows = []
    for ax, (panel_title, traces) in zip(axes[:, 0], panels):
        origin = min(t.start_time for t in traces)
        for row, trace in enumerate(traces):
            steps = trace.steps
            for kind, color in KIND_COLORS.items():
                bars = [(s - origin, e - s) for s, e, k in zip(steps["t_start"], steps["t_end"], steps["kind"])
                        if k == kind]
                if bars:
                    ax.broken_barh(bars, (row - 0.4, 0.8), facecolors=color, edgecolors="none")
            if steps["kind"] and all(f == 0 for f in steps["fed"]):  # prompt lookup: microsecond steps, mark them
                ticks = [s - origin for s in steps["t_start"]]
                ax.plot(ticks, [row] * len(ticks), "|", color=KIND_COLORS["draft"], markersize=12)
            rollbacks = [s - origin for s, r in zip(steps["t_start"], steps["rollbacks"]) if r]
            ax.plot(rollbacks, [row + 0.45] * len(rollbacks), "v", color="tab:red", markersize=3)
            busy = sum(e - s for s, e in zip(steps["t_start"], steps["t_end"]))
            wall = max(trace.end_time - trace.start_time, 1e-9)
            ax.text(1.0, row, f" {100 * busy / wall:.0f}% busy", transform=ax.get_yaxis_transform(),
                    va="center", fontsize=7)
            rows.append({"panel": panel_title, "stage": trace.name, "steps": len(steps["kind"]),
                         "busy_s": busy, "wall_s": wall, "busy_percent": 100 * busy / wall,
                         "rollbacks": sum(1 for r in steps["rollbacks"] if r)})
        ax.set_yticks(range(len(traces)), [t.name for t in traces])
        ax.set_ylim(-0.6, len(traces) - 0.4)
        ax.set_title(panel_title)
        ax.set_xlabel("time since the sample started (s)")
        ax.grid(axis="y", visible=False)
    handles = [matplotlib.patches.Patch(color=c, label=f"{k} step") for k, c in KIND_COLORS.items()]
    handles.append(matplotlib.lines.Line2D([], [], marker="v", color="tab:red", linestyle="", label="rollback"))
    fig.suptitle(title, fontsize=10.5, y=0.995)
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.965), ncol=4, frameon=False)
    fig.tight_layout(rect=(0, 0.08, 0.93, 0.93))
    _caption(fig, caption, sources)
    return fig, rows


def gpu_panel_data(samples: Sequence[dict], gpus: dict[int, str], tokens: int) -> dict:
    """Per active GPU: utilisation over time and means; mean power; energy per token per active GPU
    (trapezoid integral of the mean active-GPU power over the sampled span / tokens) and for all of them."""
    times = np.array([s["timestamp"] for s in samples], dtype=float)
    active = sorted(gpus)
    utilisation = np.array([[s["gpu_utilizations"][g] for g in active] for s in samples], dtype=float)
    power = np.array([[s["gpu_powers"][g] for g in active] for s in samples], dtype=float) \
        if all("gpu_powers" in s for s in samples) else None
    data = {"times": times, "active": active, "utilisation": utilisation,
            "mean_utilisation": float(utilisation.mean()), "mean_power_w": None, "energy_j_per_token": None,
            "system_energy_j_per_token": None}
    if power is not None and len(times) > 1 and tokens:
        mean_power = power.mean(axis=1)
        energy = float(np.sum((mean_power[1:] + mean_power[:-1]) / 2 * np.diff(times)))
        data.update(mean_power_w=float(power.mean()), energy_j_per_token=energy / tokens,
                    system_energy_j_per_token=energy * len(active) / tokens)
    return data


def figure_gpu_utilisation(panels: Sequence[tuple[str, dict, dict[int, str]]], title: str, caption: str,
                           sources: Sequence[str]) -> tuple[plt.Figure, list[dict]]:
    """Panels of (title, ``gpu_panel_data``, GPU -> model); bars: per-active-GPU utilisation, power, energy."""
    fig = plt.figure(figsize=(11, 2.5 * len(panels) + 1.2))
    grid = fig.add_gridspec(len(panels), 2, width_ratios=(3.2, 1))
    rows = []
    bars_ax = [fig.add_subplot(grid[i, 1]) for i in range(min(3, len(panels)))]
    for i, (panel_title, data, gpus) in enumerate(panels):
        ax = fig.add_subplot(grid[i, 0])
        for column, gpu in enumerate(data["active"]):
            series = data["utilisation"][:, column]
            ax.plot(data["times"], series, linewidth=1,
                    label=f"{gpus[gpu]} (GPU {gpu}, mean {series.mean():.1f}%)")
        ax.set_title(f"{panel_title}: mean over its {len(data['active'])} active GPUs "
                     f"{data['mean_utilisation']:.1f}%")
        ax.set_ylabel("utilisation (%)")
        ax.set_ylim(0, 140)  # room above 100 % for the legend
        ax.set_yticks([0, 25, 50, 75, 100])
        ax.legend(loc="upper center", ncol=4, fontsize=6.5, frameon=False)
        ax.set_xlabel("time since the sample started (s)")
        rows.append({"panel": panel_title, "active_gpus": " ".join(f"{g}:{gpus[g]}" for g in data["active"]),
                     "mean_utilisation_percent_per_active_gpu": data["mean_utilisation"],
                     "mean_power_w_per_active_gpu": data["mean_power_w"],
                     "energy_j_per_token_per_active_gpu": data["energy_j_per_token"],
                     "energy_j_per_token_all_active_gpus": data["system_energy_j_per_token"]})
    metrics = (("mean_utilisation_percent_per_active_gpu", "utilisation per active GPU (%)"),
               ("mean_power_w_per_active_gpu", "power per active GPU (W)"),
               ("energy_j_per_token_per_active_gpu", "energy per token per active GPU (J)"))
    names = [r["panel"].split(" (")[0] for r in rows]
    colors = [STRATEGY_COLORS.get({"AR": "greedy", "SD": "sd", "PipeSpec": "pipespec"}.get(n, ""), "tab:gray")
              for n in names]
    for ax, (key, label) in zip(bars_ax, metrics):
        values = [r[key] if r[key] is not None else 0.0 for r in rows]
        ax.bar(range(len(rows)), values, color=colors)
        for pos, value in enumerate(values):
            ax.text(pos, value, f"{value:.1f}", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(rows)), names)
        ax.set_ylabel(label, fontsize=7.5)
        ax.set_ylim(0, max(values + [1]) * 1.2)
    _finish(fig, title, caption, sources, bottom=0.08)
    return fig, rows


def figure_rho_alpha(points: Sequence[tuple[float, float, float, str]], title: str, xlabel: str, caption: str,
                     sources: Sequence[str], gammas: Sequence[int] = GAMMAS) -> tuple[plt.Figure, list[dict]]:
    """Eq. 3 curves rho(alpha) for each gamma, and measured (alpha, rho, gamma, label) points; colour = gamma."""
    fig, ax = plt.subplots(figsize=(6.8, 4.9))
    alphas = np.linspace(0.0, 1.0, 201)
    cmap = plt.get_cmap("viridis")
    norm = matplotlib.colors.LogNorm(vmin=min(gammas), vmax=max(gammas))
    for gamma in gammas:
        ax.plot(alphas, [pm.steady_state_rho(a, gamma) for a in alphas], color=cmap(norm(gamma)), linewidth=1.2)
    markers: dict[str, str] = {}
    rows = []
    for alpha, rho, gamma, label in points:
        marker = markers.setdefault(label, MARKERS[len(markers) % len(MARKERS)])
        clipped = min(max(gamma, min(gammas)), max(gammas))
        ax.scatter([alpha], [rho], color=cmap(norm(clipped)), marker=marker, edgecolors="black", s=40, zorder=3)
        rows.append({"series": label, "alpha": alpha, "rho": rho, "gamma": gamma})
    handles = [matplotlib.lines.Line2D([], [], color="0.4", label="Eq. 3 (one line per gamma)")]
    handles += [matplotlib.lines.Line2D([], [], marker=m, color="white", markeredgecolor="black", linestyle="",
                                        label=label) for label, m in markers.items()]
    ax.legend(handles=handles, loc="upper left")
    bar = fig.colorbar(matplotlib.cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax)
    bar.set_label("gamma (drafts per verification, tokens)")
    bar.set_ticks(list(gammas), labels=[str(g) for g in gammas])
    bar.minorticks_off()
    ax.set_xlabel(xlabel)
    ax.set_ylabel("rho (share of target steps that verify)")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.05)
    _finish(fig, title, caption, sources)
    return fig, rows


def figure_model_measured(points: Sequence[tuple[float, float, float | None, str, str]], title: str, caption: str,
                          sources: Sequence[str], band: float = 0.15) -> tuple[plt.Figure, list[dict]]:
    """(measured, ours, paper or None, label, source) in tokens/s: a scatter against y = x, and beside it
    each run's relative error by name (no point labels to overlap)."""
    fig = plt.figure(figsize=(11, max(4.8, 1.8 + 0.2 * len(points))))
    grid = fig.add_gridspec(1, 2, width_ratios=(1, 1.1))
    ax = fig.add_subplot(grid[0, 0])
    errors_ax = fig.add_subplot(grid[0, 1])
    values = [v for m, o, p, *_ in points for v in (m, o, p) if v is not None and math.isfinite(v)]
    low, high = min(values) * 0.8, max(values) * 1.1
    line = np.array([low, high])
    ax.plot(line, line, "k-", linewidth=1, label="y = x")
    ax.fill_between(line, line * (1 - band), line * (1 + band), color="gray", alpha=0.15,
                    label=f"+-{100 * band:.0f}%")
    ax.scatter([p[0] for p in points], [p[1] for p in points], color="tab:green", edgecolors="black", zorder=3,
               label=f"our wall-clock model ({IN_SAMPLE})")
    paper = [(m, p) for m, _, p, *_ in points if p is not None and math.isfinite(p)]
    if paper:
        ax.scatter([m for m, _ in paper], [p for _, p in paper], marker="^", color="tab:red", edgecolors="black",
                   zorder=3, label="paper model (Eq. 4 / 5)")
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    ax.set_xlabel("measured throughput (tokens/s)")
    ax.set_ylabel("model throughput (tokens/s)")
    ax.legend(loc="lower right")
    rows = []
    positions = np.arange(len(points))
    ours_errors, paper_errors = [], []
    for measured, ours, paper_value, label, source in points:
        ours_errors.append(100 * (ours / measured - 1))
        paper_errors.append(None if paper_value is None else 100 * (paper_value / measured - 1))
        rows.append({"run": label, "measured_tokens_per_s": measured, "ours_in_sample_tokens_per_s": ours,
                     "ours_error": ours / measured - 1, "paper_model_tokens_per_s": paper_value,
                     "paper_error": None if paper_value is None else paper_value / measured - 1, "source": source})
    errors_ax.axvspan(-100 * band, 100 * band, color="gray", alpha=0.15)
    errors_ax.axvline(0, color="black", linewidth=0.8)
    errors_ax.barh(positions - 0.2, ours_errors, 0.4, color="tab:green", label="ours")
    errors_ax.barh(positions + 0.2, [e if e is not None else 0.0 for e in paper_errors], 0.4, color="tab:red",
                   label="paper")
    errors_ax.set_yticks(positions, [p[3] for p in points], fontsize=6.5)
    errors_ax.invert_yaxis()
    errors_ax.set_xlabel("model error against measured throughput (%)")
    errors_ax.legend(loc="lower right")
    errors_ax.grid(axis="y", visible=False)
    _finish(fig, title, caption, sources, bottom=0.09)
    return fig, rows


def figure_speedup_depth(points: Sequence[tuple[str, str, int, float, str]], title: str, caption: str,
                         sources: Sequence[str]) -> tuple[plt.Figure, list[dict]]:
    """(strategy, hierarchy, depth, speedup over AR, source): colour = strategy, marker = hierarchy."""
    fig, ax = plt.subplots(figsize=(7.2, 4.6))
    ax.axhline(1.0, color=STRATEGY_COLORS["greedy"], linestyle="--", label="AR (1 stage)")
    hierarchies = sorted({p[1] for p in points})
    marker = {h: MARKERS[i % len(MARKERS)] for i, h in enumerate(hierarchies)}
    rows = []
    for strategy in ("sd", "pipespec"):
        mine = [p for p in points if p[0] == strategy]
        if not mine:
            continue
        depths = sorted({p[2] for p in mine})
        best = [max(p[3] for p in mine if p[2] == d) for d in depths]
        ax.plot([1] + depths, [1.0] + best, "-", color=STRATEGY_COLORS[strategy], alpha=0.6,
                label=f"{DISPLAY[strategy]} (best per depth)")
        for _, hierarchy, depth, speedup, source in mine:
            ax.scatter([depth], [speedup], color=STRATEGY_COLORS[strategy], marker=marker[hierarchy],
                       edgecolors="black", zorder=3, s=34)
            rows.append({"strategy": DISPLAY[strategy], "hierarchy": hierarchy, "depth": depth,
                         "speedup_vs_ar": speedup, "source": source})
    handles, _ = ax.get_legend_handles_labels()
    handles += [matplotlib.lines.Line2D([], [], marker=marker[h], color="white", markeredgecolor="black",
                                        linestyle="", label=h) for h in hierarchies]
    ax.legend(handles=handles, loc="upper left")
    ax.set_xlabel("stages in the hierarchy (count)")
    ax.set_ylabel("speedup over AR (x)")
    ax.set_xticks(sorted({1} | {p[2] for p in points}))
    ax.set_ylim(bottom=0)
    _finish(fig, title, caption, sources)
    return fig, rows


def figure_synthetic(series: dict[str, Sequence[tuple[float, float, float | None, str]]], ar: tuple[str, float] | None,
                     title: str, caption: str, sources: Sequence[str]) -> tuple[plt.Figure, list[dict]]:
    """{strategy: [(set rate, ms/token, measured draft acceptance rate, source)]}, AR (source, ms/token)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.0))
    rows = []
    for strategy in sorted(series, key=ORDER.index):
        points = sorted(series[strategy])
        color = STRATEGY_COLORS[strategy]
        left.plot([p[0] for p in points], [p[1] for p in points], "o-", color=color, label=DISPLAY[strategy])
        right.plot([p[0] for p in points], [p[2] for p in points], "o-", color=color, label=DISPLAY[strategy])
        rows += [{"strategy": DISPLAY[strategy], "set_acceptance_rate": p[0], "ms_per_token": p[1],
                  "measured_draft_acceptance_rate": p[2], "source": p[3]} for p in points]
    if ar is not None:
        left.axhline(ar[1], color=STRATEGY_COLORS["greedy"], linestyle="--", label=f"AR, exact ({ar[1]:.1f} ms)")
        rows.append({"strategy": "AR", "set_acceptance_rate": "", "ms_per_token": ar[1],
                     "measured_draft_acceptance_rate": "", "source": ar[0]})
    right.plot([0, 1], [0, 1], "k:", linewidth=1, label="measured = set")
    left.set_xlabel("set acceptance rate (probability per draft)")
    left.set_ylabel("time per token (ms)")
    left.set_ylim(bottom=0)
    left.set_title(f"time per token, {SYNTHETIC_LABEL}")
    right.set_xlabel("set acceptance rate (probability per draft)")
    right.set_ylabel("accepted / offered drafts (fraction)")
    right.set_xlim(0, 1)
    right.set_ylim(0, 1.05)
    right.set_title("target's draft acceptance rate")
    for ax in (left, right):
        ax.legend(loc="best")
    _finish(fig, title, caption, sources)
    return fig, rows


# --------------------------------------------------------------------------- data: the authors' logs


def _log_label(log: official.OfficialLog) -> str:
    return ",".join(log.model_names)


def _final_counts(log: official.OfficialLog) -> list[int]:
    return official.accepted_counts(log, log.num_pairs - 1)


@dataclass
class _Logs:
    """The authors' logs the official figures draw: all of them, those of the largest target, and their folder."""

    logs: Sequence[official.OfficialLog]
    directory: Path  # the folder of the logs (its humaneval/ subfolder)
    source: list[str]  # the data line of every caption
    largest: list[official.OfficialLog]  # the logs of the largest target
    target: str  # that target's name ("" without logs)

    @property
    def speculative(self) -> list[official.OfficialLog]:
        """The largest target's SD and PipeSpec logs (not greedy), in their order."""
        return [log for log in self.largest if log.strategy != "greedy"]


def _chain_first(logs: Sequence[official.OfficialLog]) -> list[official.OfficialLog]:
    """SD (chain) logs before PipeSpec (async-chain) ones, otherwise in their order."""
    return sorted(logs, key=lambda g: g.strategy != "chain")


def _official_fig3(logs: _Logs) -> Drawn:
    speculative = _chain_first(logs.speculative)
    chains = sorted({log.model_names for log in speculative}, key=lambda m: (len(m), m))
    series = [(log.model_names, (f"{DISPLAY[log.strategy]} (L={log.lookahead})",
                                 official.STRATEGY_NAMES[log.strategy], _final_counts(log))) for log in speculative]
    panels = [(",".join(models), [s for m, s in series if m == models]) for models in chains]
    times = [(f"{DISPLAY[log.strategy]} {_log_label(log)}", official.STRATEGY_NAMES[log.strategy],
              official.pooled_ms_per_token(log))
             for log in sorted(logs.largest, key=lambda g: (g.strategy != "greedy", len(g.model_names), g.path.name))]
    caption = (f"Tokens the {logs.target} target appended per verification (accepted drafts + its own token, as "
               "logged), pooled over all samples; bins 1..8 (the SD window), 9-16, 17+. Right: pooled time per "
               "token (sum of times / sum of tokens). The logs omit PipeSpec's last verification of each sample.")
    fig, rows = figure_accepted_histogram(panels, times, f"Fig. 3: accepted tokens per verification "
                                          f"(published logs, HumanEval, {logs.target} target)", caption, logs.source)
    return Drawn(fig, rows, logs.source, f"logs with the {logs.target} target", caption)


def _official_fig4(logs: _Logs) -> Drawn:
    sweep = [log for log in logs.logs if log not in logs.largest and log.strategy != "greedy"]
    panels = []
    for models in sorted({log.model_names for log in sweep}):
        series = defaultdict(list)
        for log in sweep:
            if log.model_names == models:
                series[official.STRATEGY_NAMES[log.strategy]].append(
                    (log.lookahead, official.pooled_ms_per_token(log), log.path.name))
        greedy = next((g for g in logs.logs if g.strategy == "greedy" and g.model_names[-1] == models[-1]), None)
        ar = (greedy.path.name, official.pooled_ms_per_token(greedy)) if greedy is not None else None
        panels.append((f"{','.join(models)}: lookahead sweep", dict(series), ar))
    if not panels:
        raise LookupError("no lookahead sweep among the logs")
    caption = ("Pooled time per token against lookahead (SD: draft window; PipeSpec: minimum lead a verifier "
               "waits for), AR = greedy log of the same target (dashed).")
    fig, rows = figure_lookahead(panels, "Fig. 4: time per token against lookahead (published logs)",
                                 caption, logs.source)
    return Drawn(fig, rows, logs.source, "lookahead sweep logs and the greedy log of their target", caption)


def _official_fig5(logs: _Logs) -> Drawn:
    deepest = max((len(log.model_names) for log in logs.largest), default=0)
    chosen = [log for log in logs.largest if log.strategy == "greedy"]
    chosen += _chain_first([log for log in logs.speculative if len(log.model_names) == deepest])
    panels = []
    for log in chosen:
        samples = official.gpu_samples(log, 0)
        if samples:
            data = gpu_panel_data(samples, official.active_gpus(log), log.samples[0].tokens_generated)
            panels.append((f"{DISPLAY[log.strategy]} ({_log_label(log)}), sample 0", data, official.active_gpus(log)))
    if not panels:
        raise LookupError("the logs hold no gpustats")
    caption = ("NVML samples of one sample per log; averages over the GPUs a model was placed on "
               "(model_configs[].devices), idle GPUs excluded. Energy per token per active GPU = integral of "
               "the mean active-GPU power over the sampled span / tokens of the sample.")
    fig, rows = figure_gpu_utilisation(panels, f"Fig. 5: utilisation per active GPU, power and energy per "
                                       f"token (published logs, {logs.target} target, one sample)", caption,
                                       logs.source)
    return Drawn(fig, rows, logs.source, f"greedy and deepest SD / PipeSpec logs of the {logs.target} target, "
                 "sample 0", caption)


def _official_rho_alpha(logs: _Logs) -> Drawn:
    points = []
    for log in logs.logs:
        if log.strategy != "async-chain":
            continue
        measured = fit.measure_official(log)
        alpha = measured.alphas[-1]
        steps = len(official.step_times(log, len(log.model_names) - 1))
        rho = len(_final_counts(log)) / steps if steps else math.nan  # only verifications are logged
        if math.isfinite(alpha):
            points.append((alpha, min(rho, 1.0), measured.accepted_per_verify[-1],
                           f"PipeSpec logs ({logs.target if log in logs.largest else 'lookahead sweep'})"))
    if not points:
        raise LookupError("no async logs")
    caption = ("Eq. 3 rho = a / (1 - a^(g+1) + a) per gamma (lines, colour bar), and the async logs: alpha is a "
               "lower bound (the logs do not record drafts offered), rho = 1 because only verifications are "
               "logged, gamma = mean accepted drafts per verification (a lower bound of drafts offered).")
    fig, rows = figure_rho_alpha(points, "rho against alpha: Eq. 3 and the published async logs",
                                 "alpha (per-draft acceptance probability, lower bound)", caption, logs.source)
    return Drawn(fig, rows, logs.source, "every async-chain (PipeSpec) log", caption)


def _official_model_measured(logs: _Logs) -> Drawn:
    predictions = evaluate.official_predictions(logs.directory)
    points = [(1000 / r.measured_ms, 1000 / r.ours_ms, None if r.paper_ms is None else 1000 / r.paper_ms,
               f"{DISPLAY[r.strategy]} {','.join(r.models)}", r.file) for r in predictions]
    caption = ("Ours: the simulator (analysis.evaluate) with each log's own mean step times and acceptance "
               f"({IN_SAMPLE}: fitted on the log it reports, not a held-out prediction). Paper: Eq. 4 / 5 over "
               "the greedy log's step time.")
    fig, rows = figure_model_measured(points, f"Published {logs.target} logs: models ({IN_SAMPLE}) against "
                                      "measured throughput", caption, logs.source)
    return Drawn(fig, rows, logs.source, f"logs with the {logs.target} target", caption)


def _official_speedup_depth(logs: _Logs) -> Drawn:
    greedy = next((log for log in logs.largest if log.strategy == "greedy"), None)
    if greedy is None:
        raise LookupError(f"no greedy log of {logs.target}")
    base = official.pooled_ms_per_token(greedy)
    points = [(official.STRATEGY_NAMES[log.strategy], _log_label(log), len(log.model_names),
               base / official.pooled_ms_per_token(log), log.path.name) for log in logs.speculative]
    caption = f"Pooled speedup over the greedy {logs.target} log ({greedy.path.name}) against the number of models."
    fig, rows = figure_speedup_depth(points, f"Speedup against depth (published logs, {logs.target} target)",
                                     caption, logs.source)
    return Drawn(fig, rows, logs.source, f"logs with the {logs.target} target", caption)


# each official figure, by name, from the logs
OFFICIAL_FIGURES: dict[str, Callable[[_Logs], Drawn]] = {
    "fig3_accepted_histogram": _official_fig3, "fig4_lookahead": _official_fig4,
    "fig5_gpu_utilisation": _official_fig5, "rho_alpha": _official_rho_alpha,
    "model_measured": _official_model_measured, "speedup_depth": _official_speedup_depth,
}


def official_figures(logs: Sequence[official.OfficialLog], directory: Path) -> dict[str, Callable[[], Drawn]]:
    """Figure builders from the logs (each a thunk, so a failing one does not stop the others)."""
    directory = official.log_dir(directory)
    largest = official.largest_target_logs(logs)
    chosen = _Logs(logs, directory, [f"{_shown(directory)} (the authors' published HumanEval logs, 4x A100)"],
                   largest, largest[0].model_names[-1] if largest else "")
    return {name: partial(build, chosen) for name, build in OFFICIAL_FIGURES.items()}


# --------------------------------------------------------------------------- data: our runs


def _target_verify_counts(run: Run) -> list[int]:
    counts = []
    for _, traces in run.iter_traces():
        steps = traces[-1].steps
        counts += [a + 1 for k, a in zip(steps["kind"], steps["accepted"]) if k == "verify"]
    return counts


def _best(runs: Sequence[Run], strategy: str) -> Run | None:
    chosen = [r for r in runs if r.strategy == strategy]
    return max(chosen, key=lambda r: (r.tokens_per_s, -r.lookahead)) if chosen else None


def _run_sources(runs: Sequence[Run]) -> list[str]:
    folders: dict[str, int] = defaultdict(int)
    for run in runs:
        folders[_shown(run.path.parent)] += 1
    return [f"{folder} ({count} runs)" for folder, count in sorted(folders.items())]


def exact_run_sets(runs: Sequence[Run]) -> dict[tuple, list[Run]]:
    """Lossless greedy-decoded runs by ``run_set_key``, only the sets holding a speculative run."""
    sets: dict[tuple, list[Run]] = defaultdict(list)
    for run in select_runs(runs, lossless=True, sampled=False):
        sets[run_set_key(run)].append(run)
    return {key: members for key, members in sorted(sets.items(), key=lambda kv: str(kv[0]))
            if any(r.strategy != "greedy" for r in members)}


def ours_figures(runs: Sequence[Run], evaluations: Sequence[evaluate.RunEvaluation] | None = None
                 ) -> dict[str, Callable[[], Drawn]]:
    """Figure builders from our exact (lossless), greedy-decoded runs: one set per dataset and budget
    (names get the set's label when there are several). ``evaluations``: precomputed
    ``evaluate.evaluate_runs`` of (some of) the runs."""
    sets = exact_run_sets(runs)
    builders: dict[str, Callable[[], Drawn]] = {}
    for key, members in sets.items():
        suffix = "" if len(sets) == 1 else "_" + "_".join(
            [key[0], f"{key[1][0]}x{key[1][1]}"]).replace("/", "-")
        run_set = _run_set(members, key, evaluations)
        for name, build in OURS_FIGURES.items():
            builders[name + suffix] = partial(build, run_set)
    return builders


@dataclass
class _RunSet:
    """One set of our exact runs drawn together (one dataset, budget and decoding: ``run_set_key``), grouped by
    hierarchy, with the wall-clock evaluation of each run, computed on first use where not given."""

    members: list[Run]
    selection: str  # which runs, chosen how
    sources: list[str]  # their folders
    hierarchies: dict[str, list[Run]]  # hierarchy -> its runs, shallowest hierarchy first
    known: dict[int, evaluate.RunEvaluation]  # the given evaluations, by id of their run
    _evaluations: list[evaluate.RunEvaluation] | None = field(default=None, repr=False)

    def evaluated(self) -> list[evaluate.RunEvaluation]:
        """The evaluation of every member, in order (each not given is computed once, all together)."""
        if self._evaluations is None:
            missing = [r for r in self.members if id(r) not in self.known]
            fresh = {id(e.run): e for e in (evaluate.evaluate_runs(missing) if missing else [])}
            self._evaluations = [self.known.get(id(r)) or fresh[id(r)] for r in self.members]
        return self._evaluations


def _run_set(members: list[Run], key: tuple, evaluations) -> _RunSet:
    """The ``_RunSet`` of the runs of one ``run_set_key``; ``evaluations``: precomputed ones of (some of) them."""
    hierarchies: dict[str, list[Run]] = defaultdict(list)
    for run in members:
        hierarchies[run.hierarchy].append(run)
    ordered = dict(sorted(hierarchies.items(), key=lambda kv: (max(r.depth for r in kv[1]), kv[0])))
    return _RunSet(members, f"exact (lossless) runs: {describe_run_set(key)}", _run_sources(members), ordered,
                   {id(e.run): e for e in (evaluations or [])})


def _ar_line(ar: Run | None) -> tuple[str, float] | None:
    """The AR line of a time-per-token figure: (source, ms/token) of the greedy reference, None without one."""
    return (_shown(ar.path), ar.ms_per_token) if ar is not None else None


def _ours_fig3(runs: _RunSet) -> Drawn:
    panels, times = [], []
    for hierarchy, mine in runs.hierarchies.items():
        series = []
        for strategy in ("sd", "pipespec"):
            run = _best(mine, strategy)
            if run is not None:
                series.append((f"{DISPLAY[strategy]} L={run.lookahead}", strategy, _target_verify_counts(run)))
                times.append((f"{DISPLAY[strategy]} L={run.lookahead} {hierarchy}", strategy, run.ms_per_token))
        if series:
            ar = greedy_reference(mine[0], runs.members)
            if ar is not None:
                times.insert(len(times) - len(series), (f"AR {hierarchy}", "greedy", ar.ms_per_token))
            panels.append((hierarchy, series))
    if not panels:
        raise LookupError("no sd or pipespec runs")
    caption = ("Tokens the target appended per verification (accepted drafts + its own token) of the fastest SD "
               "and PipeSpec run per hierarchy, all samples; the same bins as the figure of the published logs. Right: time per "
               "token of those runs and of their AR run.")
    fig, rows = figure_accepted_histogram(panels, times, "Fig. 3: accepted tokens per verification (our runs)",
                                          f"{caption} {runs.selection}.", runs.sources)
    return Drawn(fig, rows, runs.sources, runs.selection, caption)


def _ours_fig4(runs: _RunSet) -> Drawn:
    panels = []
    for hierarchy, mine in runs.hierarchies.items():
        series = defaultdict(list)
        for run in mine:
            if run.strategy in ("sd", "pipespec"):
                series[run.strategy].append((run.lookahead, run.ms_per_token, _shown(run.path)))
        if any(len(v) >= 2 for v in series.values()):
            ar = greedy_reference(next(r for r in mine if r.strategy != "greedy"), runs.members)
            panels.append((hierarchy, dict(series), _ar_line(ar)))
    if not panels:
        raise LookupError("no strategy was run at two or more lookaheads")
    caption = ("Time per token against lookahead per hierarchy (SD: draft window; PipeSpec: minimum lead), AR "
               "dashed: the greedy run of the same target, dataset and budget.")
    fig, rows = figure_lookahead(panels, "Fig. 4: time per token against lookahead (our runs)",
                                 f"{caption} {runs.selection}.", runs.sources)
    return Drawn(fig, rows, runs.sources, runs.selection, caption)


def _ours_fig5(runs: _RunSet) -> Drawn:
    deepest = max(runs.members, key=lambda r: (r.strategy == "pipespec", r.depth, r.hierarchy))
    mine = runs.hierarchies[deepest.hierarchy]
    panels = []
    for strategy in ("greedy", "sd", "pipespec"):
        run = _best(mine, strategy) if strategy != "greedy" else greedy_reference(deepest, runs.members)
        if run is not None and run.samples:
            panels.append((f"{DISPLAY[strategy]}: {run.label}, sample {run.samples[0].get('sample_id', 0)}",
                           run.traces(0)))
    if not panels:
        raise LookupError("no traces")
    caption = (f"Per-stage busy timeline of the first sample (one bar per step), fastest run per strategy of "
               f"{deepest.hierarchy}; {NO_ENERGY}.")
    fig, rows = figure_timeline(panels, f"Fig. 5 analogue: stage activity over one sample (our runs, "
                                f"{deepest.hierarchy})", f"{caption} {runs.selection}.", runs.sources)
    return Drawn(fig, rows, runs.sources, runs.selection, caption, {"energy": NO_ENERGY})


def _ours_rho_alpha(runs: _RunSet) -> Drawn:
    points = []
    for evaluation in runs.evaluated():
        if evaluation.run.strategy == "greedy":
            continue
        for pair in evaluation.measurement.pairs:
            if pair.alpha is not None and pair.verify_steps:
                points.append((pair.alpha.alpha, pair.rho, pair.gamma,
                               f"{DISPLAY[evaluation.run.strategy]}, verifier {pair.verifier}"))
    if not points:
        raise LookupError("no verifications")
    caption = ("Eq. 3 per gamma (lines, colour bar) and every verifying pair of our runs: alpha = censored MLE "
               "from offered / accepted drafts, rho = measured share of the verifier's steps that verified, "
               "gamma = measured mean drafts offered per verification (colour).")
    fig, rows = figure_rho_alpha(points, "rho against alpha: Eq. 3 and our runs",
                                 "alpha (per-draft acceptance probability, MLE)", f"{caption} {runs.selection}.",
                                 runs.sources)
    return Drawn(fig, rows, runs.sources, runs.selection, caption)


def _ours_model_measured(runs: _RunSet) -> Drawn:
    points = [(e.measured_tokens_per_s, e.ours.tokens_per_s, e.paper_tokens_per_s, e.run.label,
               _shown(e.run.path)) for e in runs.evaluated()]
    caption = (f"Ours: analysis.evaluate, an {IN_SAMPLE} (step costs, contention and acceptance fitted on the "
               "very run it reports: not a held-out prediction, see analysis.validate). Paper: Eq. 4 / 5 over one "
               "target step of the same run.")
    fig, rows = figure_model_measured(points, f"Our runs: models ({IN_SAMPLE}) against measured throughput",
                                      f"{caption} {runs.selection}.", runs.sources)
    return Drawn(fig, rows, runs.sources, runs.selection, caption)


def _ours_speedup_depth(runs: _RunSet) -> Drawn:
    points = []
    for run in runs.members:
        if run.strategy == "greedy":
            continue
        ar = greedy_reference(run, runs.members)
        if ar is not None:
            points.append((run.strategy, run.hierarchy, run.depth, run.tokens_per_s / ar.tokens_per_s,
                           _shown(run.path)))
    if not points:
        raise LookupError("no greedy reference for the speculative runs")
    caption = ("Speedup (tokens/s over the AR run of the same target, dataset and budget) of every run against "
               "the number of stages; lines through the best run per depth.")
    fig, rows = figure_speedup_depth(points, "Speedup against depth (our runs)", f"{caption} {runs.selection}.",
                                     runs.sources)
    return Drawn(fig, rows, runs.sources, runs.selection, caption)


# each figure of a set of our runs, by name
OURS_FIGURES: dict[str, Callable[[_RunSet], Drawn]] = {
    "fig3_accepted_histogram": _ours_fig3, "fig4_lookahead": _ours_fig4, "fig5_timeline": _ours_fig5,
    "rho_alpha": _ours_rho_alpha, "model_measured": _ours_model_measured, "speedup_depth": _ours_speedup_depth,
}


def synthetic_figures(runs: Sequence[Run]) -> dict[str, Callable[[], Drawn]]:
    """The figure made for synthetic-acceptance runs (one per hierarchy and run set, greedy decoding)."""
    synthetic = select_runs(runs, lossless=False, sampled=False)
    groups: dict[tuple, list[Run]] = defaultdict(list)
    for run in synthetic:
        groups[(run.hierarchy, run_set_key(run))].append(run)
    builders: dict[str, Callable[[], Drawn]] = {}
    for index, ((hierarchy, key), members) in enumerate(sorted(groups.items(), key=lambda kv: str(kv[0]))):
        def build(hierarchy=hierarchy, key=key, members=members) -> Drawn:
            series = defaultdict(list)
            for run in members:
                target = StageStats.from_dict(run.summary["stages"][-1]) if run.summary.get("stages") else None
                series[run.strategy].append((run.synthetic_rate, run.ms_per_token,
                                             target.draft_acceptance_rate if target else None, _shown(run.path)))
            ar = greedy_reference(members[0], runs)
            selection = f"{SYNTHETIC_LABEL}: {hierarchy}, {describe_run_set(key)}"
            sources = _run_sources(members + ([ar] if ar is not None else []))
            lookaheads = ", ".join(f"{DISPLAY[s]} L=" + "/".join(str(v) for v in sorted(
                {r.lookahead for r in members if r.strategy == s})) for s in sorted(series, key=ORDER.index))
            caption = (f"Drafts accepted with a set probability, whatever they are ({SYNTHETIC_LABEL}: outputs differ "
                       f"from greedy decoding); {lookaheads}. AR: the exact greedy run of the same target, dataset "
                       "and budget. Right: accepted / offered counts drafts offered after a rejection too, so it "
                       "sits below the set per-draft probability.")
            fig, rows = figure_synthetic(dict(series), _ar_line(ar),
                                         f"Time per token against a set acceptance rate: {SYNTHETIC_LABEL}, {hierarchy}",
                                         f"{caption} {selection}.", sources)
            return Drawn(fig, rows, sources, selection, caption)

        builders["synthetic_acceptance" + ("" if len(groups) == 1 else f"_{index}")] = build
    return builders


# --------------------------------------------------------------------------- output


def save_figure(drawn: Drawn, out: Path, name: str) -> list[Path]:
    """PNG, PDF (no timestamps in their metadata) and the plotted data as CSV."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.{suffix}" for suffix in SUFFIXES]
    drawn.fig.savefig(paths[0], metadata=PNG_METADATA)
    drawn.fig.savefig(paths[1], metadata=PDF_METADATA)
    plt.close(drawn.fig)
    paths[2].write_text(rows_csv(drawn.rows))
    return paths


def rows_csv(rows: Sequence[dict]) -> str:
    columns: list[str] = []
    for row in rows:
        columns += [c for c in row if c not in columns]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows({c: _fmt(row.get(c)) for c in columns} for row in rows)
    return buffer.getvalue()


def png_bytes(fig: plt.Figure) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, metadata=PNG_METADATA)
    plt.close(fig)
    return buffer.getvalue()


def drawn_figures(builders: dict[str, Callable[[], Drawn]]
                  ) -> Iterator[tuple[str, Drawn | None, Exception | None]]:
    """Each figure built in ``STYLE``, one at a time and in order, as (name, figure, None), or as
    (name, None, why) when its data is missing; the caller saves it (outside the style)."""
    for name, build in builders.items():
        try:
            with plt.rc_context(STYLE):
                drawn, reason = build(), None
        except (LookupError, ValueError, ResultsError, official.OfficialLogError) as error:
            drawn, reason = None, error
        yield name, drawn, reason


def render(builders: dict[str, Callable[[], Drawn]], source: str, out: Path, notes: list[str],
           manifest: list[dict]) -> list[Path]:
    """Build and save each figure; a figure whose data is missing becomes a note."""
    written = []
    for name, drawn, reason in drawn_figures(builders):
        full = f"{name}_{source}"
        if drawn is None:
            notes.append(f"skipped {full}: {reason}")
            continue
        written += save_figure(drawn, out, full)
        manifest.append({"figure": full, "files": " ".join(f"{full}.{s}" for s in SUFFIXES),
                         "data": "; ".join(drawn.sources), "selection": drawn.selection, "caption": drawn.caption})
    return written


def _prune(out: Path, manifest: list[dict]) -> list[Path]:
    """Remove the files of figures an earlier manifest in ``out`` listed and this call did not make."""
    previous = out / MANIFEST
    if not previous.is_file():
        return []
    made = {name for row in manifest for name in row["files"].split()}
    removed = []
    for row in csv.DictReader(io.StringIO(previous.read_text())):
        for name in (row.get("files") or "").split():
            path = out / name
            if name not in made and path.is_file() and path.parent == out:
                path.unlink()
                removed.append(path)
    return removed


def make_figures(official_dir: Path | None, results_dir: Path | None, out: Path) -> tuple[list[Path], list[str]]:
    """Every figure from both sources, and ``out/figures.csv``; returns (files written, notes)."""
    written: list[Path] = []
    notes: list[str] = []
    manifest: list[dict] = []
    out = Path(out)
    if official_dir is not None:
        try:
            logs = official.load_dir(official_dir)
        except official.OfficialLogError as error:
            notes.append(f"skipped the published logs: {error}")
        else:
            written += render(official_figures(logs, Path(official_dir)), "official", out, notes, manifest)
    if results_dir is not None:
        try:
            runs = find_runs([results_dir])
        except ResultsError as error:
            notes.append(f"skipped our results: {error}")
        else:
            written += render(ours_figures(runs), "ours", out, notes, manifest)
            written += render(synthetic_figures(runs), "ours", out, notes, manifest)
            sampled = select_runs(runs, sampled=True)
            if sampled:
                notes.append(f"{len(sampled)} sampled runs: no figure draws sampled runs yet "
                             "(never against greedy references)")
    if manifest:
        for path in _prune(out, manifest):
            notes.append(f"removed {path} (no longer made)")
        (out / MANIFEST).write_text(rows_csv(manifest) if manifest else "")
        written.append(out / MANIFEST)
    return written, notes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    parser.add_argument("--official", type=Path, default=DEFAULT_OFFICIAL,
                        help=f"the authors' results folder or its humaneval/ subfolder (default {DEFAULT_OFFICIAL})")
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS,
                        help=f"run directories, or a folder holding them (default {DEFAULT_RESULTS})")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    written, notes = make_figures(args.official, args.results, args.out)
    for note in notes:
        print(f"note: {note}")
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
