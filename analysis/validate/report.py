"""The text and `--json` report of a paired sweep's validation (`format_sweep_report`, `sweep_report_json`),
the report read back (`read_sweep_report`) and the figures over several (`format_sweep_summary`).
What each table shows: docs/prediction.md, "Validate".
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Sequence

from analysis.paired import STEP_CONDITIONS
from analysis.validate.records import ACCEPTANCE, CountCheck, Ranking, SWEEP_FORMAT, SweepRecord, SweepReport
from analysis.validate.runs import _pct
from analysis.validate.sweeps import STEP_SIZES
from analysis.validate.targets import beyond_sampling, decomposition, sampling_line, sweep_figures
from pipespec.errors import ConfigError


FIGURE_LABELS = {"speedup_median": "speedup, median |error|", "speedup_max": "speedup, largest |error|",
                 "counts_median": "counts, median |error|", "counts_max": "counts, largest |error|",
                 "regret": "regret of the top pick", "spearman": "Spearman (predicted vs measured speedups)"}  # fmt: skip


def _num(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def _span(interval: Sequence[float] | None) -> str:
    return "-" if interval is None else f"{interval[0]:.3f}-{interval[1]:.3f}"


def _abs_pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _title(report: SweepReport) -> list[str]:
    held = (f"held out: none of its {len(report.prompts)} prompts is among the profile's" if not report.in_sample else
            f"IN-SAMPLE: the profile measured acceptance on {len(report.seen)} of its {len(report.prompts)} prompts "
            f"({', '.join(report.seen[:4])}{', ...' if len(report.seen) > 4 else ''}): a decomposition, not a "
            "validation")  # fmt: skip
    return [f"paired sweep {report.sweep} against the profile {report.profile}", f"  {held}"]


def _speedup_lines(records: Sequence[SweepRecord]) -> list[str]:
    lines = ["speedup over greedy (measured: paired, 95% intervals over repetitions and over prompts; ours: 95% "
             "over the profile's prompts; floor: half the repetitions interval)",
             f"  {'configuration':<22}{'measured':>9}{'CI reps':>14}{'CI prompts':>14}{'ours':>8}{'CI':>14}"
             f"{'error':>9}{'paper':>8}{'error':>9}{'floor':>8}"]  # fmt: skip
    for r in records:
        lines.append(f"  {r.configuration:<22}{r.measured_speedup:>9.3f}{_span(r.measurement_interval):>14}"
                     f"{_span(r.sampling_interval):>14}{r.predicted_speedup:>8.3f}{_span(r.predicted_interval):>14}"
                     f"{_pct(r.speedup_error):>9}{r.paper_speedup:>8.3f}{_pct(r.paper_speedup_error):>9}"
                     f"{_abs_pct(r.speedup_floor):>8}")  # fmt: skip
    return lines


def _count_lines(records: Sequence[SweepRecord]) -> list[str]:
    lines = ["timing-free counts (measured: the runs' pooled stage statistics; floor: spread over repetitions; "
             "prompts: half the count's 95% interval over the sweep's prompts)",
             f"  {'configuration':<22}{'count':<42}{'measured':>9}{'ours':>8}{'error':>9}{'paper':>8}{'error':>9}"
             f"{'floor':>8}{'prompts':>9}"]  # fmt: skip
    for r in records:
        for c in r.counts:
            label = f"{c.figure} ({c.stage})" if c.figure == ACCEPTANCE else c.figure
            lines.append(f"  {r.configuration:<22}{label:<42}{_num(c.measured):>9}{_num(c.predicted):>8}"
                         f"{_pct(c.error):>9}{_num(c.paper):>8}{_pct(c.paper_error):>9}{_abs_pct(c.floor):>8}"
                         f"{_abs_pct(c.prompts):>9}")  # fmt: skip
    return lines


def _speed_lines(records: Sequence[SweepRecord]) -> list[str]:
    lines = ["tokens/s at the machine's speed during the sweep (a decomposition: ours / the greedy runs' median "
             "speed factor; own: the run's own factor, its contention included; schedule: target steps per second)",
             f"  {'configuration':<22}{'own':>7}{'measured':>10}{'ours':>9}{'error':>9}{'schedule':>10}{'paper':>9}"
             f"{'error':>9}{'floor':>8}"]  # fmt: skip
    for r in records:
        lines.append(f"  {r.configuration:<22}{_num(r.own_speed, '.2f'):>7}{r.measured_tokens_per_s:>10.2f}"
                     f"{r.predicted_tokens_per_s / r.machine_speed:>9.2f}{_pct(r.at_speed_error):>9}"
                     f"{_pct(r.schedule_error):>10}{r.paper_predicted_tokens_per_s / r.machine_speed:>9.2f}"
                     f"{_pct(r.paper_at_speed_error):>9}{_abs_pct(r.tokens_per_s_floor):>8}")  # fmt: skip
    return lines


def _step_lines(records: Sequence[SweepRecord]) -> list[str]:
    """Each model stage's steps by what came before them: where the schedule's error comes from."""
    columns = [(c, n) for c in STEP_CONDITIONS for n in STEP_SIZES]
    lines = ["each model stage's steps by what came before them (their median seconds over the profile's t(n), over "
             "the greedy runs' median: 1.00 = as fast, against the profile, as greedy's; how many)",
             f"  {'configuration':<22}{'stage':<18}" + "".join(f"{f'{c}, {n}':>{len(c) + 12}}" for c, n in columns)]
    for r in records:
        stages = list(dict.fromkeys(stage for stage, *_ in r.step_factors))
        for stage in stages:
            cells = {(c, n): f"{factor:.2f} ({count})" for s, c, n, factor, count in r.step_factors if s == stage}
            lines.append(f"  {r.configuration:<22}{stage:<18}" + "".join(
                f"{cells.get(key, '-'):>{len(key[0]) + 12}}" for key in columns))
    return lines


def _busy_lines(records: Sequence[SweepRecord]) -> list[str]:
    """Each model stage's busy share, measured and simulated: which stage sets the pace, and how long each waits."""
    lines = ["each model stage's busy share while the target decodes (its steps' seconds over the target's decoding "
             "time, pooled over the samples; ours: the simulation's)",
             f"  {'configuration':<22}{'stage':<18}{'measured':>10}{'ours':>8}"]
    for r in records:
        lines += [f"  {r.configuration:<22}{stage:<18}{measured:>10.2f}{_num(ours, '.2f'):>8}"
                  for stage, measured, ours in r.busy]
    return lines


def _costs_lines(report: SweepReport) -> list[str]:
    """Each model stage's speed and contention over the sweep's steps, and every speedup predicted at them."""
    lines = ["each model stage's costs during the sweep (every configuration's steps, each sample at a speed of its "
             "own: seconds = speed x the profile's t(n) x (1 + contention x other model stages computing + wake x "
             "after a wait), least squares, terms >= 0, a term where samples show both of its regimes; speed: "
             "pooled; the profile's contention beside)",
             f"  {'stage':<22}{'speed':>7}{'contention':>12}{'wake':>7}{'the profile':>13}"]  # fmt: skip
    lines += [f"  {name:<22}{speed:>7.3f}{_num(contention):>12}{_num(wake):>7}{profile:>13.3f}"
              for name, speed, contention, wake, profile in report.stage_costs]  # fmt: skip
    lines += ["speedup over greedy at those costs (a decomposition: the sweep's own costs, the profile's acceptance)",
              f"  {'configuration':<22}{'measured':>9}{'ours':>8}{'error':>9}"]  # fmt: skip
    lines += [f"  {r.configuration:<22}{r.measured_speedup:>9.3f}{r.costs_speedup:>8.3f}"
              f"{_pct(r.costs_speedup_error):>9}" for r in report.records
              if not r.is_reference and r.costs_speedup is not None]  # fmt: skip
    return lines


def _ranking_line(model: str, rank: Ranking, best: str) -> str:
    return (f"  {model}: Spearman {_num(rank.spearman, '.2f')}; top pick {rank.top_pick} (measured "
            f"{rank.top_pick_measured:.3f}, the best measured {best}): regret {100 * rank.regret:.1f}%")


def target_lines(figures: dict, in_sample: bool) -> list[str]:
    """The targets table, and which targets the floor keeps a sweep from showing."""
    scope = "in-sample: a decomposition, not a validation" if in_sample else "held out"
    lines = [f"targets ({scope}; floor: the sweep's own noise; prompts: half the speedups' and counts' intervals over "
             "its prompts):",
             f"  {'figure':<44}{'ours':>8}{'paper':>8}{'floor':>8}{'prompts':>9}{'target':>10}  met"]
    for key, label in FIGURE_LABELS.items():
        f = figures[key]
        value = (lambda v: _num(v, ".2f")) if f["at_least"] else _abs_pct
        floor = "-" if f["floor"] is None else (f"1-{1 - f['floor']:.2f}" if f["at_least"] else _abs_pct(f["floor"]))
        target = f">= {f['target']:.2f}" if f["at_least"] else f"<= {100 * f['target']:.0f}%"
        met = "-" if f["met"] is None else ("yes" if f["met"] else "no")
        lines.append(f"  {label:<44}{value(f['ours']):>8}{value(f['paper']):>8}{floor:>8}"
                     f"{_abs_pct(f.get('prompts')):>9}{target:>10}  {met}")  # fmt: skip
    hidden = [FIGURE_LABELS[k] for k, f in figures.items() if f["shown"] is False]
    unknown = [FIGURE_LABELS[k] for k, f in figures.items() if f["shown"] is None]
    if hidden:
        lines.append(f"floor above a third of its target (this sweep cannot show it): {'; '.join(hidden)}")
    else:
        lines.append("every known floor is below a third of its target")
    if unknown:
        lines.append(f"floor unknown (one repetition, or too few configurations): {'; '.join(unknown)}")
    wide = [FIGURE_LABELS[k] for k, f in figures.items() if f.get("prompts_shown") is False]
    if wide and not in_sample:
        lines.append("the sweep's prompts spread its figures by more than a third of the target (a prediction from "
                     f"other prompts cannot show it): {'; '.join(wide)}")  # fmt: skip
    return lines


def decomposition_line(kinds: dict) -> str:
    def pair(key):
        median, largest = kinds[key]
        return f"{_abs_pct(median)} / {_abs_pct(largest)}"

    line = (f"error kinds, median / largest |error|: machine speed {pair('machine_speed')}, counts {pair('counts')}, "
            f"schedule {pair('schedule')}; tokens/s at the machine's speed {pair('at_speed')} (paper "
            f"{pair('paper_at_speed')}; floor {pair('tokens_per_s_floor')})")  # fmt: skip
    if kinds.get("at_sweep_costs", (None, None))[1] is not None:
        line += f"; speedup at the sweep's own stage costs {pair('at_sweep_costs')}"
        shown, every = kinds["at_sweep_costs_of"]
        line += f" ({shown} of {every} configurations: reports written before it have none)" if shown < every else ""
    return line


def report_figures(report: SweepReport) -> dict:
    return sweep_figures(report.records, [(report.ours, report.paper)], [report.repetition_spearman],
                         [report.regret_floor])  # fmt: skip


def format_sweep_report(report: SweepReport) -> str:
    lines = _title(report) + [""] + _speedup_lines(report.records) + [""]
    lines += _count_lines([r for r in report.records if r.counts]) + [""] + _speed_lines(report.records) + [""]
    lines += _step_lines(report.records) + [""] + _busy_lines(report.records) + [""]
    lines += _costs_lines(report) + [""] if report.stage_costs else []
    lines += ["ranking over the configurations (greedy included):", _ranking_line("ours", report.ours,
              report.measured_best), _ranking_line("paper", report.paper, report.measured_best),
              f"  the sweep against itself: Spearman between repetitions {_num(report.repetition_spearman, '.2f')}; "
              f"regret among the configurations not told apart from the best {_abs_pct(report.regret_floor)}",
              ""]  # fmt: skip
    lines += target_lines(report_figures(report), report.in_sample)
    sampling = None if report.in_sample else sampling_line(beyond_sampling(report.records))
    lines += [sampling] if sampling else []
    lines.append(decomposition_line(decomposition(report.records)))
    return "\n".join(lines)


def sweep_report_json(report: SweepReport) -> dict:
    """The `--json` object of a sweep's report (`read_sweep_report` reads it back)."""
    return {"format": SWEEP_FORMAT, **asdict(report), "in_sample": report.in_sample,
            "figures": report_figures(report), "error_kinds": decomposition(report.records),
            "sampling": beyond_sampling(report.records)}  # fmt: skip


def read_sweep_report(raw: dict, path: str) -> SweepReport:
    """A sweep report from its `--json` object; a `ConfigError` naming `path` if it is not one."""
    try:
        records = tuple(SweepRecord(**{**r, "counts": tuple(CountCheck(**c) for c in r["counts"]),
                                       "stages": tuple(r["stages"]),
                                       "step_factors": tuple(tuple(f) for f in r.get("step_factors", ())),
                                       "busy": tuple(tuple(b) for b in r.get("busy", ()))})
                        for r in raw["records"])  # fmt: skip
        fields = {k: raw[k] for k in SweepReport.__dataclass_fields__ if k in raw}
        return SweepReport(**{**fields, "records": records, "ours": Ranking(**raw["ours"]),
                              "paper": Ranking(**raw["paper"]), "prompts": tuple(raw["prompts"]),
                              "seen": tuple(raw["seen"]),
                              "stage_costs": tuple(tuple(c) for c in raw.get("stage_costs", ()))})  # fmt: skip
    except (KeyError, TypeError) as error:
        raise ConfigError(f"{path}: not a sweep validation report ({error})") from None


def format_sweep_summary(reports: Sequence[SweepReport]) -> list[str]:
    """The figures over several sweeps' reports, held-out and in-sample apart."""
    lines = []
    held_out, seen = [r for r in reports if not r.in_sample], [r for r in reports if r.in_sample]
    for title, subset in (("held-out sweeps", held_out),
                          ("in-sample sweeps (a decomposition, not a validation)", seen)):  # fmt: skip
        if not subset:
            continue
        records = [record for report in subset for record in report.records]
        figures = sweep_figures(records, [(r.ours, r.paper) for r in subset], [r.repetition_spearman for r in subset],
                                [r.regret_floor for r in subset])  # fmt: skip
        configurations = sum(not r.is_reference for r in records)
        lines += [f"paired {title}: {len(subset)} sweep(s), {configurations} configurations besides greedy "
                  "(ranking: the worst sweep's)"]  # fmt: skip
        lines += ["  " + line for line in target_lines(figures, title.startswith("in-sample"))]
        sampling = None if title.startswith("in-sample") else sampling_line(beyond_sampling(records))
        lines += ["  " + sampling] if sampling else []
        lines.append("  " + decomposition_line(decomposition(records)))
    return lines
