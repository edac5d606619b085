"""The tables of the model-vs-measurement report (`analysis.report`), from `analysis.report_model` readings.

Every table's first words say whether its numbers are held out (the profile's prompts 0-9 predicting the
sweep's prompts 20-27) or in sample (read off the sweep's own traces). A residual is predicted / measured - 1.
"""

from __future__ import annotations

import math
import statistics
from typing import Iterable, Sequence

from analysis import names, validate
from analysis.report_model import PairRow, RateRow, SweepAnalysis
from analysis.report_runs import Table

RHO_FORMS = ("eq3", "lead", "position", "supply")  # the paper's Eq. 3, then one measured ingredient at a time
FORM_NAMES = {"eq3": "Eq. 3", "ours": "ours", "lead": "+ lead", "position": "+ by position", "supply": "+ supply"}
TOLERANCE = 0.15  # a residual within this counts as a fit in the headline


def num(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None or not math.isfinite(value) else format(value, spec)


def pct(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{100 * value:+.1f}%"


def span(interval: Sequence[float] | None) -> str:
    if interval is None or not all(math.isfinite(v) for v in interval):
        return "-"
    return f"{interval[0]:.3f}-{interval[1]:.3f}"


def residual(predicted: float | None, measured: float | None) -> float:
    """predicted / measured - 1 (nan where either is missing or measured is 0)."""
    if predicted is None or measured is None or not (math.isfinite(predicted) and math.isfinite(measured)):
        return math.nan
    return predicted / measured - 1 if measured else math.nan


def inside(value: float, interval: Sequence[float] | None) -> bool | None:
    return None if interval is None else interval[0] <= value <= interval[1]


def median_largest(values: Iterable[float]) -> tuple[float, float, int, int]:
    """Median and largest |value| over the finite values, how many are within TOLERANCE, how many in all."""
    finite = [abs(v) for v in values if math.isfinite(v)]
    if not finite:
        return math.nan, math.nan, 0, 0
    return statistics.median(finite), max(finite), sum(v <= TOLERANCE for v in finite), len(finite)


def fit_text(values: Iterable[float]) -> str:
    """ "12.3% / 45.6% (7/10 within 15%)": median / largest |residual|."""
    med, big, within, n = median_largest(values)
    return "-" if not n else f"{100 * med:.1f}% / {100 * big:.1f}% ({within}/{n} within {100 * TOLERANCE:.0f}%)"


def where(a: SweepAnalysis) -> list[str]:
    return [names.hierarchy_name(a.hierarchy), names.dataset_name(a.dataset)]


def pair_name(row: PairRow) -> str:
    return f"{names.stage_name(row.pair[0])} -> {names.stage_name(row.pair[1])}"


def config(name: str) -> str:
    return names.configuration_name(name)


# ---- rho -------------------------------------------------------------------------------------------------


def rho_held_out(analyses: Sequence[SweepAnalysis]) -> Table:
    header = ["hierarchy", "dataset", "configuration", "pair", "measured rho", "95% over prompts", "Eq. 3",
              "residual", "ours", "residual", "+ lead", "+ by position", "+ supply", "residual"]
    rows = []
    for a in analyses:
        for r in a.pairs:
            h = r.held_out
            rows.append(where(a) + [config(r.configuration), pair_name(r), num(r.rho), span(r.rho_interval),
                                    num(h.get("eq3")), pct(residual(h.get("eq3"), r.rho)), num(h.get("ours")),
                                    pct(residual(h.get("ours"), r.rho)), num(h.get("lead")), num(h.get("position")),
                                    num(h.get("supply")), pct(residual(h.get("supply"), r.rho))])  # fmt: skip
    return Table(header, rows)


def rho_in_sample(analyses: Sequence[SweepAnalysis]) -> Table:
    header = ["hierarchy", "dataset", "configuration", "pair", "measured rho", "alpha (MLE)", "gamma (mean lead)",
              "Eq. 3", "residual", "+ lead", "residual", "+ by position", "residual", "+ supply", "residual"]
    rows = []
    for a in analyses:
        for r in a.pairs:
            s = r.in_sample
            cells = [num(r.rho), num(r.reading.alpha), num(r.reading.gamma, ".2f")]
            for form in RHO_FORMS:
                cells += [num(s.get(form)), pct(residual(s.get(form), r.rho))]
            rows.append(where(a) + [config(r.configuration), pair_name(r)] + cells)
    return Table(header, rows)


MISFIT_CLASSES = (
    ("model drafter, lookahead 0", lambda r: not r.model_free and r.lookahead == 0),
    ("model drafter, lookahead >= 1 (the verifier waits)", lambda r: not r.model_free and r.lookahead >= 1),
    ("model-free drafter (proposes only on a match)", lambda r: r.model_free),
)


def residual_removed(analyses: Sequence[SweepAnalysis]) -> Table:
    """Median / largest |residual| of rho per form, held out and in sample: how much each ingredient removes."""
    pairs = [r for a in analyses for r in a.pairs]
    rows = []
    for form in ("eq3", "ours", "lead", "position", "supply"):
        held = fit_text(residual(r.held_out.get(form), r.rho) for r in pairs)
        own = "-" if form == "ours" else fit_text(residual(r.in_sample.get(form), r.rho) for r in pairs)
        rows.append([FORM_NAMES[form], FORM_DESCRIPTIONS[form], held, own])
    return Table(["form", "what it assumes", "held out: median / largest abs. residual",
                  "in sample: median / largest abs. residual"], rows)


def residual_by_class(analyses: Sequence[SweepAnalysis]) -> Table:
    """Held out: rho's median |residual| per form within each class of pair, and its mean signed residual."""
    pairs = [r for a in analyses for r in a.pairs]
    rows = []
    for label, member in MISFIT_CLASSES:
        chosen = [r for r in pairs if member(r)]
        if not chosen:
            continue
        cells = [label, str(len(chosen)), f"{statistics.mean(r.rho for r in chosen):.3f}"]
        for form in ("eq3", "ours", "lead", "position", "supply"):
            values = [residual(r.held_out.get(form), r.rho) for r in chosen]
            finite = [v for v in values if math.isfinite(v)]
            med = median_largest(values)[0]
            cells.append("-" if not finite else f"{100 * med:.1f}% ({100 * statistics.mean(finite):+.1f}%)")
        rows.append(cells)
    return Table(["class (held out)", "pairs", "mean measured rho"]
                 + [f"{FORM_NAMES[f]}: median abs. residual (mean)" for f in ("eq3", "ours", "lead", "position",
                                                                             "supply")],
                 rows)  # fmt: skip


FORM_DESCRIPTIONS = {
    "eq3": "the paper: a fixed window g, one i.i.d. rate alpha, a verification follows a full acceptance "
           "(a^(g+1)) or an agreeing one-token step (alpha)",
    "ours": "the engine's schedule simulated with the profile's t(n), contention and acceptance along prompts",
    "lead": "Eq. 3 with the lead at verify time drawn from its distribution instead of a fixed g",
    "position": "and acceptance by draft position a_p instead of one alpha",
    "supply": "and a step verifies when drafts wait for the verifier: it waits for them at lookahead >= 1; a "
              "model-free drafter proposes only at its proposal rate",
}


# ---- tokens per step and speedup ---------------------------------------------------------------------------


def tokens_per_step(analyses: Sequence[SweepAnalysis]) -> Table:
    header = ["hierarchy", "dataset", "configuration", "pair", "measured tokens/step", "95% over prompts",
              "Eq. 4", "residual", "ours", "residual", "Eq. 1 extended", "residual"]
    rows = []
    for a in analyses:
        for r in a.pairs:
            h, m = r.held_out, r.tokens_per_step
            rows.append(where(a) + [config(r.configuration), pair_name(r), num(m), span(r.tokens_per_step_interval),
                                    num(h.get("eq4")), pct(residual(h.get("eq4"), m)), num(h.get("ours_tps")),
                                    pct(residual(h.get("ours_tps"), m)), num(h.get("eq1")),
                                    pct(residual(h.get("eq1"), m))])  # fmt: skip
    return Table(header, rows)


def paper_equation(row: RateRow) -> str:
    return "Eq. 5" if row.record.strategy == "sd" else "Eq. 4"


def speedups(analyses: Sequence[SweepAnalysis]) -> Table:
    header = ["hierarchy", "dataset", "configuration", "measured speedup", "95% over prompts", "ours",
              "95% prediction interval", "inside", "residual", "ours at the sweep's step costs", "residual", "paper",
              "equation", "residual", "Eq. 6", "residual"]
    rows = []
    for a in analyses:
        for r in a.rates:
            rec = r.record
            hit = inside(rec.measured_speedup, r.prediction_interval)
            rows.append(where(a) + [
                config(rec.configuration), num(rec.measured_speedup), span(rec.sampling_interval),
                num(rec.predicted_speedup), span(r.prediction_interval),
                "-" if hit is None else ("yes" if hit else "no"),
                pct(rec.speedup_error), num(rec.costs_speedup), pct(rec.costs_speedup_error), num(rec.paper_speedup),
                paper_equation(r), pct(rec.paper_speedup_error),
                num(r.eq6), pct(residual(r.eq6, rec.measured_speedup))])  # fmt: skip
    return Table(header, rows)


def timing(analyses: Sequence[SweepAnalysis]) -> Table:
    """In sample: the speedup as tokens per target step x the target's step cost ratio x its busy ratio."""
    header = ["hierarchy", "dataset", "configuration", "output tokens per target decode step", "one-token step ms",
              "verification ms", "greedy step ms", "cost ratio", "busy share", "greedy busy", "product",
              "measured speedup", "paper tokens/target step", "paper x cost x busy", "residual"]
    rows = []
    for a in analyses:
        for r in a.rates:
            t, rec = r.timing, r.record
            cost = r.greedy_step_s / t.mean_step_s if t.mean_step_s else math.nan
            busy = t.busy_share / r.greedy_busy if r.greedy_busy else math.nan
            paper_tps = paper_tokens_per_step(rec)
            paper_timed = paper_tps * cost * busy
            rows.append(where(a) + [
                config(rec.configuration), num(t.tokens_per_step), num(_mean_ms(t.single_s), ".1f"),
                num(_mean_ms(t.verify_s), ".1f"), num(1000 * r.greedy_step_s, ".1f"), num(cost), num(t.busy_share),
                num(r.greedy_busy), num(t.tokens_per_step * cost * busy), num(rec.measured_speedup),
                num(paper_tps), num(paper_timed), pct(residual(paper_timed, rec.measured_speedup))])  # fmt: skip
    return Table(header, rows)


def paper_tokens_per_step(record) -> float:
    """The paper's tokens per target step held out: Eq. 1's verification term (sd) or Eq. 4 (pipespec), from
    the validation's timing-free counts (one over its target steps per token)."""
    steps = next((c.paper for c in record.counts if c.figure == validate.STEPS), None)
    return 1 / steps if steps else math.nan


def _mean_ms(values: Sequence[float]) -> float:
    return 1000 * statistics.mean(values) if values else math.nan


# ---- the assumptions that fail, in the traces ----------------------------------------------------------------


def leads(analyses: Sequence[SweepAnalysis]) -> Table:
    """In sample: the lead at verify time (drafts offered per verification) against the paper's fixed window."""
    header = ["hierarchy", "dataset", "configuration", "pair", "max lead", "verifications", "mean lead",
              "median", "share at 1", "share at max lead or more", "range", "ours (held out): mean lead"]
    rows = []
    for a in analyses:
        for r in a.pairs:
            counts = r.reading.leads
            total = sum(counts.values())
            if not total:
                continue
            cap = r.max_lead if r.max_lead is not None else max(counts)
            expanded = sorted(w for w, n in counts.items() for _ in range(n))
            simulated = r.held_out.get("lead_mean", math.nan)
            rows.append(where(a) + [config(r.configuration), pair_name(r), str(cap), str(total),
                                    num(r.reading.gamma, ".2f"),
                                    str(expanded[len(expanded) // 2]), num(counts[1] / total, ".2f"),
                                    num(sum(n for w, n in counts.items() if w >= cap) / total, ".2f"),
                                    f"{min(counts)}-{max(counts)}", num(simulated, ".2f")])  # fmt: skip
    return Table(header, rows)


def by_position(analyses: Sequence[SweepAnalysis], positions: int = 8) -> Table:
    """In sample (the sweep's pooled pipespec verifications) against held out (the profile): acceptance by draft
    position against one constant alpha."""
    header = ["hierarchy", "dataset", "pair", "source", "alpha (one rate)"]
    header += [f"a_{p}" for p in range(1, positions + 1)]
    rows = []
    for a in analyses:
        for pair, pooled in pooled_pairs(a).items():
            rates = pooled.rates_by_position(minimum=20)
            rows.append(where(a) + [pair, "sweep traces (in sample)", num(pooled.alpha)]
                        + [num(rates[p]) if p < len(rates) else "-" for p in range(positions)])
            profiled = next((r for r in a.pairs if pair_name(r) == pair), None)
            if profiled is not None and profiled.profile_rates:
                rates = profiled.profile_rates
                rows.append(where(a) + [pair, "profile (held out)", num(profiled.profile_alpha)]
                            + [num(rates[p]) if p < len(rates) else "-" for p in range(positions)])
    return Table(header, rows)


def pooled_pairs(a: SweepAnalysis) -> dict:
    """Per pair name, the PairReading of every pipespec configuration of the sweep pooled."""
    from analysis.report_traces import PairReading

    pooled: dict[str, PairReading] = {}
    for r in a.pairs:
        into = pooled.setdefault(pair_name(r), PairReading(*r.pair))
        for field in ("tested", "kept", "leads", "next_verify", "next_steps"):
            getattr(into, field).update(getattr(r.reading, field))
        into.accepted += r.reading.accepted
        into.offered += r.reading.offered
    return pooled


def transitions(analyses: Sequence[SweepAnalysis]) -> Table:
    """In sample: the chain's transitions measured against the paper's a^(g+1) and a."""
    header = ["hierarchy", "dataset", "configuration", "pair", "paper p_VV = a^(g+1)", "verify after a full accept",
              "verify after a rejection", "paper p_SV = a", "verify after a one-token step", "kept every draft"]
    rows = []
    for a in analyses:
        for r in a.pairs:
            alpha, gamma = r.reading.alpha, r.reading.gamma
            p_vv = alpha ** (gamma + 1) if math.isfinite(alpha) and math.isfinite(gamma) else math.nan
            rows.append(where(a) + [config(r.configuration), pair_name(r), num(p_vv, ".2f"),
                                    num(r.reading.transition("full"), ".2f"),
                                    num(r.reading.transition("reject"), ".2f"),
                                    num(alpha, ".2f"), num(r.reading.transition("single"), ".2f"),
                                    num(r.reading.kept_all, ".2f")])  # fmt: skip
    return Table(header, rows)


# ---- coverage and headline -------------------------------------------------------------------------------------


def coverage_counts(rates: Sequence[RateRow]) -> tuple[int, int, int, int]:
    """(inside our prediction interval, with one, inside the interval over the profile's prompts alone, with one)."""
    pi = [inside(r.record.measured_speedup, r.prediction_interval) for r in rates]
    ci = [inside(r.record.measured_speedup, r.record.predicted_interval) for r in rates]
    return (sum(h is True for h in pi), sum(h is not None for h in pi),
            sum(h is True for h in ci), sum(h is not None for h in ci))


def model_error(rates: Sequence[RateRow]) -> float:
    """The root mean square of ours' log residual (log measured - log ours) over ``rates``; nan without any."""
    logs = [math.log(r.record.measured_speedup / r.record.predicted_speedup) for r in rates]
    return math.sqrt(sum(v * v for v in logs) / len(logs)) if logs else math.nan


def with_model_error(row: RateRow, sigma: float) -> tuple[float, float] | None:
    """Ours' prediction interval widened by a model error sigma (log scale, 1.96 sigma added in quadrature)."""
    if row.prediction_interval is None or not math.isfinite(sigma):
        return None
    centre = math.log(row.record.predicted_speedup)
    low, high = (abs(math.log(v) - centre) for v in row.prediction_interval)
    extra = 1.96 * sigma
    return math.exp(centre - math.hypot(low, extra)), math.exp(centre + math.hypot(high, extra))


def calibrated_counts(analyses: Sequence[SweepAnalysis]) -> list[tuple[int, int]]:
    """Per sweep: (inside, with an interval) for ours' prediction interval widened by the model error of the
    OTHER sweeps (leave one sweep out, so the width is held out too)."""
    counts = []
    for i, a in enumerate(analyses):
        sigma = model_error([r for j, b in enumerate(analyses) if j != i for r in b.rates])
        hits = [inside(r.record.measured_speedup, with_model_error(r, sigma)) for r in a.rates]
        counts.append((sum(h is True for h in hits), sum(h is not None for h in hits)))
    return counts


def _share(hits: int, total: int) -> str:
    return "-" if not total else f"{hits}/{total} ({100 * hits / total:.0f}%)"


def coverage(analyses: Sequence[SweepAnalysis]) -> Table:
    """Held out: how many measured speedups fall inside ours' 95% intervals, per hierarchy and dataset."""
    rows = []
    calibrated = calibrated_counts(analyses)
    for a, (cal, n_cal) in zip(analyses, calibrated):
        pi, n_pi, ci, n_ci = coverage_counts(a.rates)
        rows.append(where(a) + [_held(a), _share(ci, n_ci), _share(pi, n_pi), _share(cal, n_cal)])
    every = [r for a in analyses for r in a.rates]
    pi, n_pi, ci, n_ci = coverage_counts(every)
    rows.append(["all", "all", "held out" if all(not a.in_sample for a in analyses) else "mixed", _share(ci, n_ci),
                 _share(pi, n_pi), _share(sum(c for c, _ in calibrated), sum(n for _, n in calibrated))])  # fmt: skip
    return Table(["hierarchy", "dataset", "kind", "inside the 95% interval of the profile's mean alone",
                  "inside the 95% prediction interval (prompt sampling)",
                  "inside it widened by the other sweeps' model error"], rows)


def _held(a: SweepAnalysis) -> str:
    return "in sample" if a.in_sample else "held out"


def headline(analyses: Sequence[SweepAnalysis]) -> Table:
    """Per hierarchy and dataset: speedup accuracy and coverage, held out; rho's fit per form."""
    rows = []
    for a in analyses:
        speed = [r.record.speedup_error for r in a.rates]
        paper = [r.record.paper_speedup_error for r in a.rates]
        pi, n_pi, _, _ = coverage_counts(a.rates)
        eq3 = [residual(r.held_out.get("eq3"), r.rho) for r in a.pairs]
        supply = [residual(r.held_out.get("supply"), r.rho) for r in a.pairs]
        eq3_own = [residual(r.in_sample.get("eq3"), r.rho) for r in a.pairs]
        rows.append(where(a) + [_held(a), fit_text(speed), fit_text(paper), _share(pi, n_pi), fit_text(eq3),
                                fit_text(supply), fit_text(eq3_own)])  # fmt: skip
    return Table(["hierarchy", "dataset", "kind", "speedup, ours: median / largest abs. residual", "speedup, paper",
                  "coverage of ours' 95% prediction interval", "rho, Eq. 3 (held out)",
                  "rho, Eq. 3 + lead + by position + supply (held out)", "rho, Eq. 3 (in sample)"], rows)
