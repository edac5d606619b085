"""One paired validation (a profile and its held-out sweep) read for `analysis.report` (no torch).

Per configuration of the sweep and per drafter/verifier pair (`PairRow`): the measured rho and tokens per
step with their 95% intervals over the sweep's prompts (`analysis.report_traces`); the paper's Eq. 3 / 4
held out (alpha: the mean of the profile's rates by position, gamma: max_lead, as `analysis.predict`
gives the paper's model) and in sample (alpha and gamma read off the sweep's own traces); our
engine-schedule model held out (`engine_pairs`: `analysis.predict`'s hierarchy from the profile played by
`analysis.simulate`); and the extended closed forms of `analysis.closed_forms`, held out (the profile's
rates by position, the simulated lead) and in sample (every ingredient from the sweep's traces).

Per configuration (`RateRow`): the measured paired speedup (`analysis.validate.check_sweep`) with its
95% interval over prompts, ours with its interval over the profile's prompts and the prediction interval
that adds the sweep's own prompt sampling and repetition noise (`prediction_interval`), the paper's
(Eq. 4 / 5 as `analysis.validate` computes it, and Eq. 6), and the target's timing (`TargetTiming`).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from analysis import closed_forms as cf
from analysis import predict, validate
from analysis.paired import REFERENCE
from analysis.profile import Profile, load_profile
from analysis.report_traces import PairReading, RunReading, read_run
from analysis.runs import Run
from pipespec.schedule import DEFAULT_MAX_LEAD


@dataclass(frozen=True)
class EnginePair:
    """Our engine-schedule model's view of one pair, pooled over its simulated generations."""

    rho: float
    tokens_per_step: float
    leads: dict[int, int]  # drafts offered per verification -> simulated verifications


@dataclass(frozen=True)
class PairRow:
    """One pair of one configuration: measured, the paper's, ours, the extended closed forms."""

    configuration: str
    strategy: str
    lookahead: int
    max_lead: int | None
    pair: tuple[str, str]
    reading: PairReading
    rho: float
    rho_interval: tuple[float, float]
    tokens_per_step: float
    tokens_per_step_interval: tuple[float, float]
    held_out: dict[str, float]  # "eq3", "ours", "lead", "position", "supply"; tokens per step: "eq4", "ours_tps", "eq1"
    in_sample: dict[str, float]  # "eq3", "lead", "position", "supply"; "eq4", "eq1"
    profile_rates: tuple[float, ...]
    profile_alpha: float
    model_free: bool = False  # a model-free drafter (prompt lookup, suffix): it proposes only where it finds a match


@dataclass(frozen=True)
class RateRow:
    """One configuration's speedup: measured, ours with its intervals, the paper's; the target's timing."""

    record: validate.SweepRecord
    prediction_interval: tuple[float, float] | None
    eq6: float | None  # pipespec: the paper's Eq. 6 over greedy (the profile's alpha, gamma = max_lead)
    timing: object  # report_traces.TargetTiming of the configuration's run
    greedy_step_s: float
    greedy_busy: float


@dataclass(frozen=True)
class SweepAnalysis:
    """One paired validation read: where it is, what it is, its pair rows and rate rows."""

    profile_path: Path
    sweep_path: Path
    hierarchy: str
    dataset: str
    in_sample: bool  # the sweep shares prompts with the profile (then nothing here is held out)
    continuations: int  # the profile's prompts
    pairs: list[PairRow]
    rates: list[RateRow]
    report: validate.SweepReport


def _mean_prompt(run: Run) -> int:
    return round(statistics.mean(int(r.get("prompt_tokens") or 0) for r in run.samples)) if run.samples else 0


def engine_pairs(profile: Profile, run: Run) -> list[EnginePair]:
    """Per pair of the run's stages, our model's rho, tokens per step and lead distribution: the profile's
    hierarchy (`predict.Hierarchy.from_profile`) played for each of its seeds at the run's mean prompt and new
    tokens (as `validate.predict_run` predicts the run)."""
    stages = validate.run_stages(profile, run)
    hierarchy = predict.Hierarchy.from_profile(profile, stages, run.tree_nodes).at_prompt(_mean_prompt(run))
    tokens = max(round(run.summary["new_tokens"] / max(run.n_samples, 1)), 1)
    max_lead = run.max_lead if run.max_lead is not None else DEFAULT_MAX_LEAD
    results = [predict.simulate_generation(hierarchy, run.strategy, tokens, run.lookahead, max_lead, seed=s)[1]
               for s in hierarchy.seeds]  # fmt: skip
    pairs = []
    for v in range(len(hierarchy.stages) - 1):
        offers = [o for r in results for o in r.step_offers[v]]
        verified = [o for o in offers if o > 0]
        kept = sum(sum(r.accepted_counts[v]) for r in results)  # own token included
        steps = len(offers)
        pairs.append(EnginePair(len(verified) / steps if steps else math.nan,
                                (kept + steps - len(verified)) / steps if steps else math.nan,
                                dict(Counter(verified))))  # fmt: skip
    return pairs


def _safe(function, *args) -> float:
    """A closed form's value, nan where its inputs leave it undefined (no drafts, no verification)."""
    try:
        value = function(*args)
    except (ValueError, ZeroDivisionError):
        return math.nan
    return float(value) if value is not None else math.nan


def _held_out(profiled, alpha: float, gamma: int, lookahead: int, engine: EnginePair) -> dict[str, float]:
    """The held-out values of a pipespec pair: Eq. 3 / 4 at the profile's alpha and gamma = max_lead, ours, and
    the extended forms at the profile's rates by position with our simulated lead. `supply`: a step verifies
    only when its drafter proposed (the profile's proposal rate r; 1 for a model drafter); at lookahead >= 1
    the verifier waits for the proposal, so every proposal is verified: rho = r; at lookahead 0 it does not
    wait: the by-position chain thinned by r (p_VV and p_SV times r)."""
    rates = tuple(profiled.acceptance_by_position)
    leads = engine.leads or {gamma: 1}
    supply = min(max(profiled.proposal_rate, 0.0), 1.0)
    p_vv = _safe(lambda: sum(w * cf.all_accepted(rates, n) for n, w in cf.normalised(leads).items()))
    q = (supply, supply, supply) if lookahead >= 1 else (supply, 0.0, rates[0] * supply)
    rho_supply = _safe(cf.supply_rho, p_vv, *q)
    return {
        "eq3": _safe(cf.eq3_rho, alpha, gamma), "eq4": _safe(cf.eq4_tokens_per_step, alpha, gamma),
        "ours": engine.rho, "ours_tps": engine.tokens_per_step,
        "lead": _safe(cf.lead_rho, alpha, leads), "position": _safe(cf.position_rho, rates, leads),
        "supply": rho_supply, "eq1": _safe(cf.tokens_per_step, rho_supply, rates, leads),
        "lead_mean": sum(w * n for w, n in leads.items()) / sum(leads.values()),
    }  # fmt: skip


def _in_sample(reading: PairReading) -> dict[str, float]:
    """Eq. 3 / 4 and the extended forms with every ingredient from the sweep's own traces."""
    alpha, gamma, rates = reading.alpha, reading.gamma, reading.rates_by_position()
    leads = dict(reading.leads)
    if not leads or not rates or not math.isfinite(alpha):
        return {key: math.nan for key in ("eq3", "eq4", "lead", "position", "supply", "eq1")}
    transitions = [reading.transition(after) for after in ("full", "reject", "single")]
    transitions = [1.0 if math.isnan(q) else q for q in transitions]  # never seen: the paper's verify-again
    return {
        "eq3": _safe(cf.eq3_rho, alpha, gamma), "eq4": _safe(cf.eq4_tokens_per_step, alpha, gamma),
        "lead": _safe(cf.lead_rho, alpha, leads), "position": _safe(cf.position_rho, rates, leads),
        "supply": _safe(cf.supply_rho, reading.kept_all, *transitions),
        "eq1": _safe(cf.tokens_per_step, reading.rho, rates, leads),
    }  # fmt: skip


def pair_rows(profile: Profile, name: str, run: Run, reading: RunReading) -> list[PairRow]:
    """The pipespec configuration's pairs (sd verifies at every step: rho is 1 by construction, not a fit)."""
    stages = validate.run_stages(profile, run)
    engine = engine_pairs(profile, run)
    rows = []
    max_lead = run.max_lead if run.max_lead is not None else DEFAULT_MAX_LEAD
    gamma = max(max_lead, run.lookahead)
    for v, (pair, model) in enumerate(zip(reading.pairs, engine)):
        profiled = profile.pair(stages[v], stages[v + 1])
        rates = tuple(profiled.acceptance_by_position) if profiled else ()
        alpha = statistics.mean(rates) if rates else math.nan
        rows.append(PairRow(
            name, run.strategy, run.lookahead, run.max_lead, (pair.drafter, pair.verifier), pair,
            pair.rho, pair.rho_interval(), pair.tokens_per_step, pair.tokens_per_step_interval(),
            _held_out(profiled, alpha, gamma, run.lookahead, model) if rates else {}, _in_sample(pair), rates, alpha,
            profile.stages[stages[v]].model_free,
        ))  # fmt: skip
    return rows


def prediction_interval(record: validate.SweepRecord, continuations: int) -> tuple[float, float] | None:
    """Our 95% prediction interval of the measured speedup: the interval over the profile's C prompts (the
    standard error of their mean, sd / sqrt(C)) widened to sd sqrt(1 / C + 1 / n) for the sweep's own n
    prompts drawn from the same spread, and the repetitions' noise (half the measured repetitions interval)
    added in quadrature, all in log space. None where ours has no interval."""
    if record.predicted_interval is None or continuations < 2:
        return None
    centre = math.log(record.predicted_speedup)
    low, high = (math.log(v) - centre for v in record.predicted_interval)
    widen = math.sqrt(1 + continuations / max(record.prompts, 1))
    m_low, m_high = record.measurement_interval
    noise = (math.log(m_high) - math.log(m_low)) / 2 if m_low > 0 else 0.0
    below = math.sqrt((widen * low) ** 2 + noise ** 2)
    above = math.sqrt((widen * high) ** 2 + noise ** 2)
    return math.exp(centre - below), math.exp(centre + above)


def _eq6(profile: Profile, run: Run) -> float | None:
    if run.strategy != "pipespec":
        return None
    stages = validate.run_stages(profile, run)
    alpha, gamma = predict.paper_alpha_gamma(profile, stages, "pipespec", run.lookahead,
                                             run.max_lead if run.max_lead is not None else DEFAULT_MAX_LEAD)
    return _safe(cf.eq6_tokens_per_step, alpha, gamma)


def analyse(profile_path: Path, sweep_path: Path) -> SweepAnalysis:
    """Read one paired validation; `analysis.runs.ResultsError` / `ConfigError` / `ProfileError` on bad input."""
    profile = load_profile(profile_path)
    sweep = validate.load_sweep(sweep_path)
    validate.check_hierarchy(profile, sweep)
    report = validate.check_sweep(profile, sweep)
    readings = {name: read_run(run.iter_traces()) for name, run in sweep.runs.items()}
    greedy = readings[REFERENCE].timing
    pairs, rates = [], []
    for record in report.records:
        if record.is_reference:
            continue
        run = sweep.runs[record.configuration]
        if run.strategy == "pipespec":
            pairs += pair_rows(profile, record.configuration, run, readings[record.configuration])
        rates.append(RateRow(record, prediction_interval(record, profile.pairs[-1].continuations), _eq6(profile, run),
                             readings[record.configuration].timing, greedy.mean_step_s, greedy.busy_share))
    first = next(iter(sweep.runs.values()))
    return SweepAnalysis(Path(profile_path), Path(sweep_path), profile.hierarchy, first.dataset, report.in_sample,
                         profile.pairs[-1].continuations, pairs, rates, report)  # fmt: skip
