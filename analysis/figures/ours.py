"""The figures of our runs: exact (lossless), greedy-decoded runs drawn together where they share dataset, budget
and decoding (``analysis.runs.run_set_key``: one panel per such set), each against the greedy run it was paired
with; synthetic-acceptance runs only in their own figure.

Every measured point carries its 95% interval over prompts: a speedup is ``analysis.paired``'s paired speedup
(geometric mean over prompts of the per-prompt ratio to greedy, same prompt and repetition) with its interval
with prompts resampled; any other value is the mean over prompts of each prompt's mean over its repetitions,
with the interval of ``common.mean_interval`` (the same bootstrap).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Sequence

from analysis import evaluate, names, style
from analysis.figures import draw
from analysis.figures.common import (BINS, IN_SAMPLE, NO_ENERGY, SYNTHETIC_LABEL, Drawn, bin_label,
                                     binned_shares, interval_columns, mean_interval, scaled_interval, shown)
from analysis.figures.samples import RunData, configuration, hierarchy, machine, slot, system
from analysis.runs import Run, describe_run_set, run_set_key, select_runs

SPEEDUP_LABEL = "speedup over greedy (x), paired"


def exact_run_sets(runs: Sequence[Run]) -> dict[tuple, list[Run]]:
    """Lossless greedy-decoded runs by ``run_set_key``, only the sets holding a speculative run."""
    sets: dict[tuple, list[Run]] = defaultdict(list)
    for run in select_runs(runs, lossless=True, sampled=False):
        sets[run_set_key(run)].append(run)
    return {key: members for key, members in sorted(sets.items(), key=lambda kv: str(kv[0]))
            if any(r.strategy != "greedy" for r in members)}


def run_sources(runs: Sequence[Run]) -> list[str]:
    folders: dict[str, int] = defaultdict(int)
    for run in runs:
        folders[shown(run.path.parent)] += 1
    return [f"{folder} ({count} runs)" for folder, count in sorted(folders.items())]


@dataclass
class RunSet:
    """One set of our exact runs (``run_set_key``), its runs by hierarchy (shallowest first), and its title."""

    key: tuple
    title: str
    hierarchies: dict[str, list[Run]]

    @property
    def members(self) -> list[Run]:
        return [r for runs in self.hierarchies.values() for r in runs]


@dataclass
class Ours:
    """Every set of our exact runs the figures draw, with their per-sample data and evaluations."""

    sets: list[RunSet]
    data: RunData
    known: dict[int, evaluate.RunEvaluation]
    _evaluations: list[evaluate.RunEvaluation] | None = field(default=None, repr=False)

    @property
    def members(self) -> list[Run]:
        return [r for s in self.sets for r in s.members]

    def evaluated(self) -> list[evaluate.RunEvaluation]:
        """The evaluation of every member, in order (each not given is computed once, all together)."""
        if self._evaluations is None:
            missing = [r for r in self.members if id(r) not in self.known]
            fresh = {id(e.run): e for e in (evaluate.evaluate_runs(missing) if missing else [])}
            self._evaluations = [self.known.get(id(r)) or fresh[id(r)] for r in self.members]
        return self._evaluations

    def drawn(self, fig, rows: list[dict], caption: str, **extra) -> Drawn:
        selection = "exact (lossless) runs: " + "; ".join(describe_run_set(s.key) for s in self.sets)
        return Drawn(fig, rows, run_sources(self.members), selection, caption, extra, machine(self.members))


def _ours(runs: Sequence[Run], evaluations) -> Ours | None:
    sets = exact_run_sets(runs)
    datasets = [key[0] for key in sets]
    chosen = []
    for key, members in sets.items():
        by_hierarchy: dict[str, list[Run]] = defaultdict(list)
        for run in members:
            by_hierarchy[run.hierarchy].append(run)
        ordered = dict(sorted(by_hierarchy.items(), key=lambda kv: (max(r.depth for r in kv[1]), kv[0])))
        title = names.dataset_name(key[0])
        if datasets.count(key[0]) > 1:
            title += f", {key[1][0]} samples x {key[1][1]} tokens"
        chosen.append(RunSet(key, title, ordered))
    pool = [r for members in sets.values() for r in members]
    return Ours(chosen, RunData(pool), {id(e.run): e for e in (evaluations or [])}) if chosen else None


def _per_prompt(ours: Ours, run: Run, value) -> list[list[float]]:
    return ours.data.stats(run).per_prompt(value)


def _bars(ours: Ours, run: Run, panel: str) -> tuple[draw.Bars, list[dict]]:
    """A run's share of the target's verifications per bin (mean over prompts, interval), and its rows."""
    per_sample = {id(s): binned_shares(s.verify_counts) for s in ours.data.stats(run).samples if s.verify_counts}
    shares = [mean_interval(_per_prompt(ours, run, lambda s, b=b: per_sample[id(s)][b] if id(s) in per_sample
                                        else None)) for b in range(len(BINS))]
    length = mean_interval(_per_prompt(ours, run, lambda s: sum(s.verify_counts) / len(s.verify_counts)
                                       if s.verify_counts else None))
    speedup = ours.data.speedup_columns(run)
    rows = [{"panel": panel, "series": system(run), "configuration": configuration(run), "bin": bin_label(*b),
             **interval_columns("percent_of_verifications", share),
             **interval_columns("mean_acceptance_length", length), **speedup, "source": shown(run.path)}
            for b, share in zip(BINS, shares)]
    label = f"{configuration(run)}: {speedup['speedup_vs_greedy']:.2f}x" if speedup["speedup_vs_greedy"] else \
        configuration(run)
    return draw.Bars(label, style.color(run.strategy), [s[0] for s in shares], [s[1] for s in shares],
                     [s[2] for s in shares]), rows


def fig3(ours: Ours) -> Drawn:
    panels, rows = [], []
    for run_set in ours.sets:
        for runs in run_set.hierarchies.values():
            chosen = [ours.data.best(runs, s) for s in ("sd", "pipespec")]
            chosen = [r for r in chosen if r is not None]
            if not chosen:
                continue
            panel = f"{run_set.title}: {hierarchy(chosen[0])}"
            series = []
            for run in chosen:
                bars, more = _bars(ours, run, panel)
                series.append(bars)
                rows += more
            panels.append((panel, series))
    if not panels:
        raise LookupError("no sd or pipespec runs")
    fig = draw.accepted_histogram(panels)
    caption = ("Tokens the target appended per verification (accepted drafts and its own token) for the fastest SD "
               "and the fastest PipeSpec configuration of each hierarchy (by paired speedup, given in the legend): "
               "share of verifications per bin, mean over prompts (each prompt's mean over its repetitions) with "
               "its 95% interval over prompts. The same bins as the published logs' figure.")
    return ours.drawn(fig, rows, caption)


def _lookahead_series(ours: Ours, runs: Sequence[Run], panel: str, rows: list[dict]) -> list[draw.Series]:
    groups: dict[tuple, list[Run]] = defaultdict(list)
    for run in runs:
        if run.strategy in ("sd", "pipespec"):
            groups[(run.strategy, run.max_lead if run.strategy == "pipespec" else None)].append(run)
    lined = {s: max((k for k in groups if k[0] == s), key=lambda k: (len(groups[k]), -(k[1] or 0)), default=None)
             for s in ("sd", "pipespec")}
    series = []
    for (strategy, lead), members in sorted(groups.items(), key=lambda kv: (kv[0][0] != "sd", kv[0][1] or 0)):
        points = []
        for run in sorted(members, key=lambda r: r.lookahead):
            speedup = ours.data.speedup_columns(run)
            points.append((run.lookahead, speedup["speedup_vs_greedy"], speedup["speedup_vs_greedy_low"],
                           speedup["speedup_vs_greedy_high"]))
            rows.append({"panel": panel, "series": system(run), "configuration": configuration(run),
                         "lookahead": run.lookahead, "max_lead": run.max_lead if strategy == "pipespec" else "",
                         **speedup, **interval_columns("ms_per_token", mean_interval(
                             _per_prompt(ours, run, lambda s: s.ms_per_token))), "source": shown(run.path)})
        deep = members[0].depth > 2
        label = system(members[0]) + (f", max lead {lead}" if lead is not None else "")
        series.append(draw.Series(label, style.color(strategy), points, "s" if deep else "o",
                                  ("--" if deep else "-") if (strategy, lead) == lined[strategy] else "",
                                  filled=(strategy, lead) == lined[strategy]))
    return series


def fig4(ours: Ours) -> Drawn:
    panels, rows = [], []
    for run_set in ours.sets:
        series = []
        for runs in run_set.hierarchies.values():
            series += _lookahead_series(ours, runs, run_set.title, rows)
        if any(len(s.points) >= 2 for s in series):
            target = names.stage_name(run_set.members[0].target)
            panels.append(draw.Panel(run_set.title, series, "lookahead (tokens)", SPEEDUP_LABEL,
                                     (f"greedy ({target})", 1.0, None, None)))
    if not panels:
        raise LookupError("no strategy was run at two or more lookaheads")
    fig = draw.lines(panels, jitter=0.07)
    caption = ("Paired speedup over greedy decoding of the same target against lookahead (SD: draft window; "
               "PipeSpec: minimum lead a verifier waits for): geometric mean over prompts of each prompt's speedup "
               "in the same repetition (analysis.paired), with its 95% interval (prompts resampled). Lines: PipeSpec "
               "at its most-swept max lead, open markers other max leads; k=3 dashed. Time per token (mean over "
               "prompts, interval) in the data table.")
    return ours.drawn(fig, rows, caption)


def fig5(ours: Ours) -> Drawn:
    run_set = ours.sets[0]
    runs = list(run_set.hierarchies.values())[-1]  # the deepest hierarchy of the first set
    chosen = [ours.data.best(runs, "sd"), ours.data.best(runs, "pipespec")]
    chosen = [r for r in chosen if r is not None]
    greedy = ours.data.reference(chosen[-1]) if chosen else None
    panels, rows = [], []
    for run in [greedy] + chosen:
        if run is None or not run.samples:
            continue
        traces = run.traces(0)
        prompt, repetition = slot(run.samples[0])
        settings = configuration(run).partition(", ")[2]
        title = system(run) + (f", {settings}" if settings else "") + f": {prompt}, repetition {repetition}"
        panels.append((title, traces, [names.stage_name(t.name) for t in traces]))
        stats = ours.data.stats(run)
        for i, trace in enumerate(traces):
            steps = trace.steps
            busy = sum(e - s for s, e in zip(steps["t_start"], steps["t_end"]))
            wall = max(trace.end_time - trace.start_time, 1e-9)
            rows.append({"panel": title, "stage": names.stage_name(trace.name), "steps": len(steps["kind"]),
                         "busy_s": busy, "wall_s": wall, "busy_percent": 100 * busy / wall,
                         "rollbacks": sum(1 for r in steps["rollbacks"] if r),
                         **interval_columns("busy_percent_all_samples", mean_interval(
                             stats.per_prompt(lambda s, i=i: 100 * s.busy[i]))), "source": shown(run.path)})
    if not panels:
        raise LookupError("no traces")
    fig = draw.timeline(panels)
    caption = (f"Per-stage activity over one sample (one bar per step; rollbacks marked) of greedy decoding and of "
               f"the fastest SD and PipeSpec configurations of {hierarchy(runs[0])} on {run_set.title}, with each "
               "stage's busy share of that sample at the right (the data table adds each stage's busy share over "
               f"all samples, mean over prompts with its 95% interval); {NO_ENERGY}.")
    return ours.drawn(fig, rows, caption, energy=NO_ENERGY)


def rho_alpha(ours: Ours) -> Drawn:
    panels, rows = [], []
    for run_set in ours.sets:
        points = []
        for run in run_set.members:
            if run.strategy == "greedy":
                continue
            stats = ours.data.stats(run)
            stages = [names.stage_name(n) for n in run.stage_names]
            for i in range(run.depth - 1):
                values = [mean_interval(stats.per_prompt(lambda s, i=i, j=j: s.pairs[i][j])) for j in range(3)]
                label = f"{stages[i]} -> {stages[i + 1]} (k={run.depth})"
                if values[0][0] == values[0][0]:  # not NaN: drafts were offered
                    points.append((*values[0], *values[1], values[2][0], label))
                rows.append({"panel": run_set.title, "series": system(run), "configuration": configuration(run),
                             "pair": label, **interval_columns("alpha", values[0]),
                             **interval_columns("rho", values[1]), **interval_columns("gamma", values[2]),
                             "source": shown(run.path)})
        panels.append((run_set.title, points))
    if not any(points for _, points in panels):
        raise LookupError("no verifications")
    fig = draw.rho_alpha(panels, "alpha (per-draft acceptance, MLE)")
    caption = ("Eq. 3, rho = a / (1 - a^(g+1) + a), one line per gamma (colour bar), and every verifying pair of "
               "every SD and PipeSpec configuration: alpha = censored MLE from the drafts offered and accepted, "
               "rho = share of the verifier's steps that verified, gamma = mean drafts offered per verification "
               "(colour), each per sample, then the mean over prompts with its 95% interval over prompts.")
    return ours.drawn(fig, rows, caption)


def model_measured(ours: Ours) -> Drawn:
    points, rows = [], []
    for evaluation in ours.evaluated():
        run = evaluation.run
        measured = evaluation.measured_tokens_per_s
        low, high = scaled_interval(measured, _per_prompt(ours, run, lambda s: s.tokens_per_s))
        paper = evaluation.paper_tokens_per_s
        points.append((measured, low, high, evaluation.ours.tokens_per_s, paper, style.color(run.strategy)))
        rows.append({"run": system(run), "dataset": names.dataset_name(run.dataset),
                     "configuration": configuration(run), "measured_tokens_per_s": measured,
                     "measured_tokens_per_s_low": low, "measured_tokens_per_s_high": high,
                     "ours_in_sample_tokens_per_s": evaluation.ours.tokens_per_s, "ours_error": evaluation.ours_error,
                     "paper_model_tokens_per_s": paper, "paper_error": evaluation.paper_error,
                     "source": shown(run.path)})
    colors = [(names.STRATEGY_NAMES[s], style.color(s)) for s in ("greedy", "sd", "pipespec")]
    fig = draw.model_measured(points, colors)
    caption = (f"Our wall-clock model (analysis.evaluate, an {IN_SAMPLE}: step costs, contention and acceptance "
               "fitted on the very run it reports; not a held-out prediction, see analysis.validate) and the "
               "paper's model (Eq. 4 / 5 over one target step of the same run) against each run's measured pooled "
               "throughput; right, each model's error. Measured intervals: 95% over prompts (the relative "
               "interval of the prompts' geometric mean, applied to the pooled value).")
    return ours.drawn(fig, rows, caption)


def speedup_depth(ours: Ours) -> Drawn:
    panels, rows = [], []
    for run_set in ours.sets:
        by_strategy = defaultdict(list)
        for run in run_set.members:
            speedup = ours.data.speedup_columns(run)
            if run.strategy == "greedy" or speedup["speedup_vs_greedy"] is None:
                continue
            by_strategy[run.strategy].append((run.depth, speedup["speedup_vs_greedy"], speedup["speedup_vs_greedy_low"],
                                              speedup["speedup_vs_greedy_high"]))
            rows.append({"panel": run_set.title, "series": system(run), "configuration": configuration(run),
                         "depth": run.depth, **speedup, "source": shown(run.path)})
        if by_strategy:
            target = names.stage_name(run_set.members[0].target)
            panels.append(draw.Panel(run_set.title, draw.depth_series(by_strategy), "stages in the hierarchy",
                                     SPEEDUP_LABEL, (f"greedy ({target})", 1.0, None, None)))
    if not panels:
        raise LookupError("no greedy reference for the speculative runs")
    fig = draw.lines(panels)
    for ax in fig.axes:
        ax.set_xticks(sorted({1} | {r["depth"] for r in rows}))
    caption = ("Paired speedup over greedy decoding of the same target (analysis.paired: geometric mean over prompts "
               "of the per-prompt ratio in the same repetition, 95% interval with prompts resampled) of every SD and "
               "PipeSpec configuration against the number of stages (2: int8 -> fp32; 3: lookup -> int8 -> fp32), "
               "configurations of one depth side by side; lines through the best per depth.")
    return ours.drawn(fig, rows, caption)


# each figure of our runs, by name
OURS_FIGURES: dict[str, Callable[[Ours], Drawn]] = {
    "fig3_accepted_histogram": fig3, "fig4_lookahead": fig4, "fig5_timeline": fig5, "rho_alpha": rho_alpha,
    "model_measured": model_measured, "speedup_depth": speedup_depth,
}


def ours_figures(runs: Sequence[Run], evaluations: Sequence[evaluate.RunEvaluation] | None = None
                 ) -> dict[str, Callable[[], Drawn]]:
    """Figure builders from our exact (lossless), greedy-decoded runs, one panel per set of dataset and budget.
    ``evaluations``: precomputed ``evaluate.evaluate_runs`` of (some of) the runs."""
    chosen = _ours(runs, evaluations)
    return {} if chosen is None else {name: partial(build, chosen) for name, build in OURS_FIGURES.items()}
