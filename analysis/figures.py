"""The paper's figures, from the authors' published logs and from our own results (no torch).

    python -m analysis.figures [--official DIR] [--results DIR] [--out paper_figures]

writes PNG and PDF files (matplotlib, Agg backend) named ``<figure>_<source>``,
source ``official`` (the authors' HumanEval logs) or ``ours`` (run directories
under ``--results``):

- ``fig3_accepted_histogram``: tokens accepted per final-model verification
  (own token included, as the logs count it), SD against PipeSpec, with ms/token;
- ``fig4_lookahead``: ms/token against lookahead, SD against PipeSpec (greedy as a line);
- ``fig5_timeline``: one sample over time. Ours: per-stage busy timeline from the
  traces (draft / verify / one-token steps); official: per-GPU utilisation (NVML
  samples in the logs), since the logs hold no step timestamps;
- ``rho_alpha``: Eq. 3 rho against alpha for several gamma, with measured points;
- ``predicted_measured``: predicted against measured tokens/s, ours and the
  paper's model, with the y = x line and a +-15 % band;
- ``speedup_depth``: speedup over greedy against the number of stages.

A figure whose data is absent is skipped with a printed note. Every figure is
built by a ``figure_*`` function that takes plain data and returns a matplotlib
Figure, so ``analysis.report`` reuses them.
"""

from __future__ import annotations

import argparse
import io
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import Callable, Sequence

import matplotlib

matplotlib.use("Agg")  # files only: no display on the measurement machines
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from analysis import fit, wallclock  # noqa: E402
from analysis import import_official as official  # noqa: E402
from analysis import paper_model as pm  # noqa: E402
from analysis.results import ResultsError, find_runs  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OFFICIAL = REPO_ROOT.parent / "shared" / "reference" / "pipespec-official-results" / "humaneval"
DEFAULT_RESULTS = REPO_ROOT / "results"
DEFAULT_OUT = REPO_ROOT / "paper_figures"
GAMMAS = (1, 2, 4, 8, 16)
STRATEGY_COLORS = {"greedy": "tab:gray", "sd": "tab:blue", "pipespec": "tab:orange"}
KIND_COLORS = {"draft": "tab:green", "verify": "tab:orange", "single": "tab:blue"}
DISPLAY = {"greedy": "AR", "sd": "SD", "pipespec": "PipeSpec", "chain": "SD", "async-chain": "PipeSpec"}


# --------------------------------------------------------------------------- figure builders (plain data in)


def figure_accepted_histogram(panels: Sequence[tuple[str, Sequence[tuple[str, Sequence[int], float]]]],
                              title: str) -> plt.Figure:
    """Panels of (panel title, [(series label, counts incl. own token, ms/token), ...])."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.8), squeeze=False)
    for ax, (panel_title, series) in zip(axes[0], panels):
        top = max((max(c) for _, c, _ in series if len(c)), default=1)
        bins = np.arange(0.5, top + 1.5, 1.0)
        for label, counts, ms in series:
            color = STRATEGY_COLORS.get("pipespec" if "PipeSpec" in label else "sd")
            weights = np.full(len(counts), 100.0 / max(len(counts), 1))  # percent of verifications
            ax.hist(counts, bins=bins, weights=weights, alpha=0.55, color=color,
                    label=f"{label}: {ms:.1f} ms/token, mean {np.mean(counts):.2f}")
        ax.set_title(panel_title)
        ax.set_xlabel("tokens accepted per final-model verification (incl. own token)")
        ax.set_ylabel("% of verifications")
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def figure_lookahead(panels: Sequence[tuple[str, dict[str, Sequence[tuple[int, float]]], float | None]],
                     title: str) -> plt.Figure:
    """Panels of (panel title, {strategy: [(lookahead, ms/token), ...]}, greedy ms/token or None)."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.8), squeeze=False)
    for ax, (panel_title, series, greedy_ms) in zip(axes[0], panels):
        for strategy, points in series.items():
            points = sorted(points)
            ax.plot([p[0] for p in points], [p[1] for p in points], "o-", color=STRATEGY_COLORS[strategy],
                    label=DISPLAY[strategy])
        if greedy_ms is not None:
            ax.axhline(greedy_ms, color=STRATEGY_COLORS["greedy"], linestyle="--", label="AR")
        ax.set_title(panel_title)
        ax.set_xlabel("lookahead")
        ax.set_ylabel("ms / token")
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def figure_timeline(panels: Sequence[tuple[str, Sequence]], title: str) -> plt.Figure:
    """Panels of (panel title, stage traces of one sample): one row per stage, a bar per step."""
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 1.1 + 0.9 * sum(len(t) for _, t in panels)),
                             squeeze=False)
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
                    va="center", fontsize=8)
        ax.set_yticks(range(len(traces)), [t.name for t in traces])
        ax.set_ylim(-0.6, len(traces) - 0.4)
        ax.set_title(panel_title, fontsize=10)
        ax.set_xlabel("seconds")
    handles = [matplotlib.patches.Patch(color=c, label=k) for k, c in KIND_COLORS.items()]
    handles.append(matplotlib.lines.Line2D([], [], marker="v", color="tab:red", linestyle="", label="rollback"))
    fig.legend(handles=handles, loc="lower center", fontsize=8, ncol=4)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.05, 0.94, 1.0))
    return fig


def figure_gpu_utilisation(panels: Sequence[tuple[str, Sequence[dict]]], title: str) -> plt.Figure:
    """Panels of (panel title, NVML samples {timestamp, gpu_utilizations}) of one sample each."""
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 2.3 * len(panels)), squeeze=False, sharex=False)
    for ax, (panel_title, samples) in zip(axes[:, 0], panels):
        times = [s["timestamp"] for s in samples]
        utilisation = np.array([s["gpu_utilizations"] for s in samples], dtype=float)
        for gpu in range(utilisation.shape[1]):
            ax.plot(times, utilisation[:, gpu], label=f"GPU {gpu} (mean {utilisation[:, gpu].mean():.0f}%)")
        ax.set_title(f"{panel_title}: mean over GPUs {utilisation.mean():.1f}%", fontsize=10)
        ax.set_ylabel("utilisation %")
        ax.set_ylim(0, 105)
        ax.legend(fontsize=7, ncol=4, loc="upper right")
    axes[-1, 0].set_xlabel("seconds")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def figure_rho_alpha(points: Sequence[tuple[float, float, float, str]], title: str,
                     gammas: Sequence[int] = GAMMAS) -> plt.Figure:
    """Eq. 3 curves rho(alpha) for each gamma, and measured (alpha, rho, gamma, label) points."""
    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    alphas = np.linspace(0.0, 1.0, 201)
    cmap = plt.get_cmap("viridis")
    norm = matplotlib.colors.LogNorm(vmin=min(gammas), vmax=max(gammas))
    for gamma in gammas:
        ax.plot(alphas, [pm.steady_state_rho(a, gamma) for a in alphas], color=cmap(norm(gamma)),
                label=f"Eq. 3, gamma={gamma}")
    markers = {}
    for alpha, rho, gamma, label in points:
        marker = markers.setdefault(label, "osD^vP*"[len(markers) % 7])
        ax.scatter([alpha], [rho], color=cmap(norm(min(max(gamma, min(gammas)), max(gammas)))), marker=marker,
                   edgecolors="black", s=46, zorder=3, label=label if label not in ax.get_legend_handles_labels()[1]
                   else None)
    ax.set_xlabel("alpha (acceptance rate, MLE)")
    ax.set_ylabel("rho (verification fraction)")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.05)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


def figure_predicted_measured(points: Sequence[tuple[float, float, float | None, str]], title: str,
                              unit: str = "tokens/s", band: float = 0.15) -> plt.Figure:
    """(measured, ours, paper or None, label) points; y = x with a +-band."""
    fig, ax = plt.subplots(figsize=(5.6, 5.2))
    values = [v for m, o, p, _ in points for v in (m, o, p) if v is not None and math.isfinite(v)]
    low, high = min(values) * 0.8, max(values) * 1.15
    line = np.array([low, high])
    ax.plot(line, line, "k-", linewidth=1, label="y = x")
    ax.fill_between(line, line * (1 - band), line * (1 + band), color="gray", alpha=0.15,
                    label=f"+-{100 * band:.0f}%")
    ax.scatter([m for m, *_ in points], [o for _, o, _, _ in points], color="tab:green", edgecolors="black",
               zorder=3, label="our wall-clock model")
    paper = [(m, p) for m, _, p, _ in points if p is not None and math.isfinite(p)]
    if paper:
        ax.scatter([m for m, _ in paper], [p for _, p in paper], marker="^", color="tab:red", edgecolors="black",
                   zorder=3, label="paper model (Eq. 4 / 5)")
    for measured, ours, _, label in points:
        ax.annotate(label, (measured, ours), fontsize=6, xytext=(3, 3), textcoords="offset points")
    ax.set_xlim(low, high)
    ax.set_ylim(low, max(high, max(values) * 1.05))
    ax.set_xlabel(f"measured {unit}")
    ax.set_ylabel(f"predicted {unit}")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


def figure_speedup_depth(series: dict[str, Sequence[tuple[int, float, str]]], title: str) -> plt.Figure:
    """{strategy: [(number of stages, speedup over greedy, label), ...]}."""
    fig, ax = plt.subplots(figsize=(6.0, 4.4))
    ax.axhline(1.0, color=STRATEGY_COLORS["greedy"], linestyle="--", label="AR (1 stage)")
    for strategy, points in series.items():
        points = sorted(points)
        depths = sorted({p[0] for p in points})
        best = [max(p[1] for p in points if p[0] == d) for d in depths]
        ax.plot([1] + depths, [1.0] + best, "-", color=STRATEGY_COLORS[strategy], alpha=0.6)  # from AR at depth 1
        ax.scatter([p[0] for p in points], [p[1] for p in points], color=STRATEGY_COLORS[strategy],
                   edgecolors="black", zorder=3, label=DISPLAY[strategy])
        for depth, speedup, label in points:
            ax.annotate(label, (depth, speedup), fontsize=6, xytext=(4, 2), textcoords="offset points")
    ax.set_xlabel("stages in the hierarchy (depth)")
    ax.set_ylabel("speedup over greedy (AR)")
    ax.set_xticks(sorted({1} | {p[0] for pts in series.values() for p in pts}))
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- data: the authors' logs


def _log_label(log: official.OfficialLog) -> str:
    return ",".join(log.model_names)


def _final_counts(log: official.OfficialLog) -> list[int]:
    return official.accepted_counts(log, log.num_pairs - 1)


def official_figures(logs: Sequence[official.OfficialLog], directory: Path) -> dict[str, Callable[[], plt.Figure]]:
    """Figure builders from the logs (each a thunk, so a failing one does not stop the others)."""
    largest = wallclock.largest_target_logs(logs)
    target_name = largest[0].model_names[-1] if largest else ""
    builders: dict[str, Callable[[], plt.Figure]] = {}

    def fig3():
        panels = []
        chains = sorted({log.model_names for log in largest if log.strategy != "greedy"}, key=len)
        for models in chains:
            series = [(f"{DISPLAY[log.strategy]} ({_log_label(log)})", _final_counts(log),
                       official.pooled_ms_per_token(log))
                      for log in largest if log.model_names == models and log.strategy != "greedy"]
            panels.append((",".join(models), series))
        return figure_accepted_histogram(panels, f"Fig. 3 (published logs, HumanEval, {target_name} target)")

    def fig4():
        sweep = [log for log in logs if log not in largest and log.strategy != "greedy"]
        pairs = sorted({log.model_names for log in sweep})
        panels = []
        for models in pairs:
            series = defaultdict(list)
            for log in sweep:
                if log.model_names == models:
                    series[wallclock.STRATEGY_NAMES[log.strategy]].append((log.lookahead,
                                                                           official.pooled_ms_per_token(log)))
            greedy = next((official.pooled_ms_per_token(g) for g in logs
                           if g.strategy == "greedy" and g.model_names[-1] == models[-1]), None)
            panels.append((f"{','.join(models)} (lookahead sweep)", dict(series), greedy))
        if not panels:
            raise LookupError("no lookahead sweep among the logs")
        return figure_lookahead(panels, "Fig. 4 (published logs): ms/token against lookahead")

    def fig5():
        import json

        chosen = [log for log in largest if log.strategy == "greedy"]
        deepest = max((len(log.model_names) for log in largest), default=0)
        chosen += [log for log in largest if log.strategy != "greedy" and len(log.model_names) == deepest]
        panels = []
        for log in chosen:
            raw = json.loads(log.path.read_text())
            stats = raw["results"][0].get("gpustats")
            if stats:
                panels.append((f"{DISPLAY[log.strategy]} ({_log_label(log)}), sample 0", stats))
        if not panels:
            raise LookupError("the logs hold no gpustats")
        return figure_gpu_utilisation(panels, "Fig. 5 analogue (published logs): GPU utilisation, one sample")

    def rho_alpha():
        points = []
        for log in logs:
            if log.strategy != "async-chain":
                continue
            measured = fit.measure_official(log)
            alpha = measured.alphas[-1]
            gamma = measured.accepted_per_verify[-1]
            steps = len(official.step_times(log, len(log.model_names) - 1))
            rho = len(_final_counts(log)) / steps if steps else math.nan  # only verifications are logged
            if math.isfinite(alpha):
                points.append((alpha, min(rho, 1.0), gamma, f"async logs ({'70B' if log in largest else 'sweep'})"))
        return figure_rho_alpha(points, "rho vs alpha: Eq. 3 and the published async logs\n"
                                        "(alpha: lower bound; every logged target step is a verification)")

    def predicted_measured():
        rows = wallclock.official_predictions(directory)
        points = [(1000 / r.measured_ms, 1000 / r.ours_ms, None if r.paper_ms is None else 1000 / r.paper_ms,
                   f"{DISPLAY[r.strategy]} {','.join(r.models)}") for r in rows]
        return figure_predicted_measured(points, f"Published {target_name} logs: predicted vs measured")

    def speedup_depth():
        greedy = next((log for log in largest if log.strategy == "greedy"), None)
        if greedy is None:
            raise LookupError(f"no greedy log of {target_name}")
        base = official.pooled_ms_per_token(greedy)
        series = defaultdict(list)
        for log in largest:
            if log.strategy != "greedy":
                series[wallclock.STRATEGY_NAMES[log.strategy]].append(
                    (len(log.model_names), base / official.pooled_ms_per_token(log), _log_label(log)))
        return figure_speedup_depth(dict(series), f"Speedup vs depth (published logs, {target_name} target)")

    builders.update(fig3_accepted_histogram=fig3, fig4_lookahead=fig4, fig5_timeline=fig5, rho_alpha=rho_alpha,
                    predicted_measured=predicted_measured, speedup_depth=speedup_depth)
    return builders


# --------------------------------------------------------------------------- data: our runs


def _target_verify_counts(run) -> list[int]:
    counts = []
    for _, traces in run.iter_traces():
        steps = traces[-1].steps
        counts += [a + 1 for k, a in zip(steps["kind"], steps["accepted"]) if k == "verify"]
    return counts


def _best(runs, strategy):
    chosen = [r for r in runs if r.strategy == strategy]
    return max(chosen, key=lambda r: r.tokens_per_s) if chosen else None


def _greedy_for(run, runs):
    return next((g for g in runs if g.strategy == "greedy" and g.dataset == run.dataset
                 and g.stage_names[-1:] == run.stage_names[-1:]), None)


def ours_figures(runs: Sequence, evaluations: Sequence[wallclock.RunEvaluation] | None = None
                 ) -> dict[str, Callable[[], plt.Figure]]:
    """Figure builders from our run directories (``evaluations``: precomputed ``wallclock.evaluate_runs``)."""
    groups: dict[tuple, list] = defaultdict(list)
    for run in runs:
        groups[(run.hierarchy, run.dataset)].append(run)
    cache: dict[str, list] = {}

    def evaluated():
        if "evaluations" not in cache:
            cache["evaluations"] = list(evaluations) if evaluations is not None else wallclock.evaluate_runs(runs)
        return cache["evaluations"]

    def fig3():
        panels = []
        for (hierarchy, dataset), members in groups.items():
            series = []
            for strategy in ("sd", "pipespec"):
                run = _best(members, strategy)
                if run is not None:
                    series.append((f"{DISPLAY[strategy]} L={run.lookahead}", _target_verify_counts(run),
                                   run.ms_per_token))
            if series:
                panels.append((f"{hierarchy} ({dataset})", series))
        if not panels:
            raise LookupError("no sd or pipespec runs")
        return figure_accepted_histogram(panels, "Fig. 3 (our runs): tokens per final-model verification")

    def fig4():
        panels = []
        for (hierarchy, dataset), members in groups.items():
            series = defaultdict(list)
            for run in members:
                if run.strategy in ("sd", "pipespec"):
                    series[run.strategy].append((run.lookahead, run.ms_per_token))
            if any(len(v) >= 2 for v in series.values()):
                greedy = _best(members, "greedy")
                panels.append((f"{hierarchy} ({dataset})", dict(series),
                               greedy.ms_per_token if greedy is not None else None))
        if not panels:
            raise LookupError("no strategy was run at two or more lookaheads")
        return figure_lookahead(panels, "Fig. 4 (our runs): ms/token against lookahead")

    def fig5():
        deepest = max(runs, key=lambda r: (r.strategy == "pipespec", r.depth))
        members = groups[(deepest.hierarchy, deepest.dataset)]
        panels = []
        for strategy in ("greedy", "sd", "pipespec"):
            run = _best(members, strategy)
            if run is not None and run.samples:
                panels.append((f"{DISPLAY[strategy]}: {run.label}, sample {run.samples[0].get('sample_id', 0)}",
                               run.traces(0)))
        if not panels:
            raise LookupError("no traces")
        return figure_timeline(panels, f"Fig. 5 analogue (our runs): per-stage busy timeline, {deepest.hierarchy}")

    def rho_alpha():
        points = []
        for evaluation in evaluated():
            if evaluation.run.strategy == "greedy":
                continue
            for pair in evaluation.measurement.pairs:
                if pair.alpha is not None and pair.verify_steps:
                    points.append((pair.alpha.alpha, pair.rho, pair.gamma,
                                   f"{DISPLAY[evaluation.run.strategy]} {pair.verifier}"))
        if not points:
            raise LookupError("no verifications")
        return figure_rho_alpha(points, "rho vs alpha: Eq. 3 (lines) and our runs (points, colour = measured gamma)")

    def predicted_measured():
        points = [(e.measured_tokens_per_s, e.ours.tokens_per_s, e.paper_tokens_per_s, e.run.label)
                  for e in evaluated()]
        return figure_predicted_measured(points, "Our runs: predicted vs measured tokens/s")

    def speedup_depth():
        series = defaultdict(list)
        for run in runs:
            if run.strategy == "greedy":
                continue
            greedy = _greedy_for(run, runs)
            speedup = run.summary.get("speedup_vs_greedy")
            if speedup is None and greedy is not None:
                speedup = run.tokens_per_s / greedy.tokens_per_s
            if speedup is not None:
                series[run.strategy].append((run.depth, float(speedup), f"{run.hierarchy} L={run.lookahead}"))
        if not series:
            raise LookupError("no greedy reference for the speculative runs")
        return figure_speedup_depth(dict(series), "Speedup vs depth (our runs)")

    return dict(fig3_accepted_histogram=fig3, fig4_lookahead=fig4, fig5_timeline=fig5, rho_alpha=rho_alpha,
                predicted_measured=predicted_measured, speedup_depth=speedup_depth)


# --------------------------------------------------------------------------- output


def save_figure(fig: plt.Figure, out: Path, name: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for suffix in ("png", "pdf"):
        path = out / f"{name}.{suffix}"
        fig.savefig(path, dpi=130)
        paths.append(path)
    plt.close(fig)
    return paths


def png_bytes(fig: plt.Figure) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    return buffer.getvalue()


def render(builders: dict[str, Callable[[], plt.Figure]], source: str, out: Path, notes: list[str]) -> list[Path]:
    """Build and save each figure; a figure whose data is missing becomes a note."""
    written = []
    for name, build in builders.items():
        try:
            fig = build()
        except (LookupError, ValueError, ResultsError) as reason:
            notes.append(f"skipped {name}_{source}: {reason}")
            continue
        written += save_figure(fig, out, f"{name}_{source}")
    return written


def make_figures(official_dir: Path | None, results_dir: Path | None, out: Path) -> tuple[list[Path], list[str]]:
    """Every figure from both sources; returns (files written, notes on what was skipped)."""
    written: list[Path] = []
    notes: list[str] = []
    if official_dir is not None:
        if Path(official_dir).is_dir():
            try:
                logs = official.load_dir(official_dir)
            except official.OfficialLogError as error:
                notes.append(f"skipped the published logs: {error}")
            else:
                written += render(official_figures(logs, Path(official_dir)), "official", out, notes)
        else:
            notes.append(f"skipped the published logs: {official_dir} is absent")
    if results_dir is not None:
        try:
            runs = find_runs([results_dir])
        except ResultsError as error:
            notes.append(f"skipped our results: {error}")
        else:
            written += render(ours_figures(runs), "ours", out, notes)
    return written, notes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.figures", description=__doc__.split("\n\n")[0])
    parser.add_argument("--official", type=Path, default=DEFAULT_OFFICIAL,
                        help=f"folder of the authors' logs (default {DEFAULT_OFFICIAL})")
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
