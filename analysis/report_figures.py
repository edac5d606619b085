"""The figures of the model-vs-measurement report (`analysis.report`), in the paper style (`analysis.style`).

- `rho_forms`: measured rho of every pipespec pair against the paper's Eq. 3, ours and the extended form,
  held out;
- `lead_distribution`: the lead at verify time of the target pair, pipespec at lookahead 0 and max lead 8,
  against the paper's fixed window (in sample);
- `acceptance_by_position`: the target pair's acceptance by draft position, the sweep's (in sample) and the
  profile's (held out), against one constant alpha;
- `coverage`: each measured speedup over ours with ours' 95% prediction interval (held out).
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Sequence

from analysis import names, style
from analysis.report_model import SweepAnalysis
from analysis.report_tables import pair_name, pooled_pairs

LEAD_CONFIGURATION = "pipespec_L0_M8"
CAPTIONS = {
    "rho_forms": "Held out: the verification fraction rho of every PipeSpec pair, predicted against measured "
                 "(the line: equal). The paper's Eq. 3, our engine-schedule model, and Eq. 3 with the lead "
                 "distribution, acceptance by position and the drafts' supply.",
    "lead_distribution": "In sample: drafts offered per verification of the target, PipeSpec at lookahead 0 "
                         "and max lead 8 (bars), against the window the paper's Eq. 3 holds fixed (dashed: "
                         "the max lead; dotted: the mean lead).",
    "acceptance_by_position": "Acceptance of draft p given the drafts before it were kept, the target's pair: "
                              "the sweep's PipeSpec verifications (in sample), the profile's prompts (held "
                              "out), and the one constant rate (the sweep's MLE) the paper assumes.",
    "coverage": "Held out: each measured speedup over ours (markers, with the measurement's own 95% interval over "
                "prompts) and ours' 95% prediction interval (grey bars around 1); a marker outside its grey bar is a "
                "miss.",
}


def _panels(analyses: Sequence[SweepAnalysis]):
    columns = min(3, max(len(analyses), 1))
    rows = math.ceil(len(analyses) / columns) if analyses else 1
    fig, axes = style.figure("two", height=2.2 * rows, nrows=rows, ncols=columns, squeeze=False,
                             layout="constrained")
    flat = [ax for row in axes for ax in row]
    for ax in flat[len(analyses):]:
        ax.set_visible(False)
    return fig, flat


def _label(a: SweepAnalysis) -> str:
    return f"{names.hierarchy_name(a.hierarchy)}, {names.dataset_name(a.dataset).split(' (')[0]}"


def rho_forms(analyses: Sequence[SweepAnalysis], stem: Path) -> None:
    pairs = [r for a in analyses for r in a.pairs]
    fig, ax = style.figure("one")
    for i, (form, label) in enumerate((("eq3", "paper, Eq. 3"), ("ours", "ours"),
                                       ("supply", "Eq. 3 + lead + position + supply"))):  # fmt: skip
        shown = [r for r in pairs if math.isfinite(r.held_out.get(form, math.nan))]
        xs = [r.rho for r in shown]
        xerr = style.yerr(xs, [r.rho_interval[0] for r in shown], [r.rho_interval[1] for r in shown])
        ax.errorbar(xs, [r.held_out[form] for r in shown], xerr=xerr, fmt=style.MARKERS[i], color=style.PALETTE[i],
                    label=label, alpha=0.8, **style.ERRORBAR)
    ax.plot([0, 1.02], [0, 1.02], color="#555555", linewidth=0.6)
    ax.set_xlabel("measured rho")
    ax.set_ylabel("predicted rho")
    ax.set_xlim(0, 1.05)
    ax.set_ylim(0, 1.05)
    ax.legend(loc="upper left")
    style.save(fig, stem)


def lead_distribution(analyses: Sequence[SweepAnalysis], stem: Path) -> None:
    fig, axes = _panels(analyses)
    for ax, a in zip(axes, analyses):
        rows = [r for r in a.pairs if r.configuration == LEAD_CONFIGURATION]
        ax.set_title(_label(a))
        if not rows:
            continue
        row = rows[-1]  # the target's pair
        counts = row.reading.leads
        total = sum(counts.values()) or 1
        leads = sorted(counts)
        ax.bar(leads, [counts[w] / total for w in leads], color=style.color("pipespec"), width=0.8)
        ax.axvline(row.max_lead or max(leads), color="#555555", linestyle="--", linewidth=0.8)
        ax.axvline(row.reading.gamma, color="#555555", linestyle=":", linewidth=0.8)
        ax.set_xlabel(f"drafts offered ({pair_name(row)})")
        ax.set_ylabel("share of verifications" if ax is axes[0] or ax is axes[min(3, len(axes) - 1)] else "")
    style.save(fig, stem)


def acceptance_by_position(analyses: Sequence[SweepAnalysis], stem: Path, positions: int = 8) -> None:
    fig, axes = _panels(analyses)
    for ax, a in zip(axes, analyses):
        ax.set_title(_label(a))
        pooled = pooled_pairs(a)
        if not pooled:
            continue
        name, reading = list(pooled.items())[-1]  # the target's pair
        rates = reading.rates_by_position(minimum=20)[:positions]
        ax.plot(range(1, len(rates) + 1), rates, "o-", color=style.color("pipespec"), label="sweep")
        profiled = next((r for r in a.pairs if pair_name(r) == name), None)
        if profiled is not None and profiled.profile_rates:
            prof = profiled.profile_rates[:positions]
            ax.plot(range(1, len(prof) + 1), prof, "s--", color=style.PALETTE[2], label="profile")
        ax.axhline(reading.alpha, color="#555555", linestyle=":", linewidth=0.8, label="one rate")
        ax.set_xlabel(f"draft position ({name})")
        ax.set_ylabel("acceptance" if ax is axes[0] or ax is axes[min(3, len(axes) - 1)] else "")
        ax.set_ylim(0, 1.05)
    axes[0].legend(loc="lower right")
    style.save(fig, stem)


def coverage(analyses: Sequence[SweepAnalysis], stem: Path) -> None:
    fig, ax = style.figure("two", height=2.4)
    x, ticks, labels = 0, [], []
    for i, a in enumerate(analyses):
        start = x
        for r in a.rates:
            if r.prediction_interval is None:
                continue
            ours = r.record.predicted_speedup
            low, high = (v / ours for v in r.prediction_interval)
            ax.errorbar([x], [1.0], yerr=[[1.0 - low], [high - 1.0]], fmt="none", color="#999999", **style.ERRORBAR)
            measured = r.record.measured_speedup / ours  # with its own 95% interval over prompts
            low_m, high_m = (v / ours for v in r.record.sampling_interval)
            spread = style.yerr([measured], [low_m], [high_m])
            ax.errorbar([x], [measured], yerr=spread, fmt=style.MARKERS[i % len(style.MARKERS)],
                        color=style.color(r.record.strategy, i), **style.ERRORBAR)
            x += 1
        ticks.append((start + x - 1) / 2)
        labels.append(textwrap.fill(names.hierarchy_name(a.hierarchy), 15) + "\n"
                      + names.dataset_name(a.dataset).split(" (")[0])
        x += 1
    ax.axhline(1.0, color="#555555", linewidth=0.5)
    ax.set_xticks(ticks)
    ax.set_xticklabels(labels)
    ax.set_ylabel("measured / ours (speedup)")
    for strategy in ("sd", "pipespec"):
        ax.plot([], [], "o", color=style.color(strategy), label=names.STRATEGY_NAMES[strategy])
    ax.legend(loc="upper right")
    style.save(fig, stem)


FIGURES = {"rho_forms": rho_forms, "lead_distribution": lead_distribution,
           "acceptance_by_position": acceptance_by_position, "coverage": coverage}


def draw(analyses: Sequence[SweepAnalysis], figure_dir: Path) -> list[tuple[str, str]]:
    """Every figure as figure_dir/NAME.png and .pdf; (name, caption) of each."""
    drawn = []
    with style.paper():
        for name, function in FIGURES.items():
            function(analyses, figure_dir / name)
            drawn.append((name, CAPTIONS[name]))
    return drawn
