"""Measured against predicted: a machine profile's predictions checked on measurements (no torch).

    python -m analysis.validate PROFILE SWEEP_DIR [--json]          # a paired sweep (python -m experiments.sweep)
    python -m analysis.validate PROFILE RUN_DIRS... [--json]        # sequential runs (no pairing)
    python -m analysis.validate PROFILE RUN_DIRS... --costs     # the profile's t(n) beside the runs' own
    python -m analysis.validate PROFILE RUN_DIRS... --greedy-speed   # costs at the greedy run's speed
    python -m analysis.validate PROFILE RUN_DIRS... --repeats   # identical runs: their spread, the floor
    python -m analysis.validate --summary VALIDATION_JSON...    # the figures over several --json reports

**A paired sweep** (one directory of `experiments.sweep`: greedy and every configuration of one hierarchy in
the same prompt slots, `analysis.paired`) is checked on what it can measure, each configuration predicted
from the profile (`predict_run`) at its mean new tokens and prompt tokens:

- the speedup over greedy: measured, the paired geometric-mean speedup with its 95% intervals over
  repetitions and over prompts; ours, predict_profile(configuration) / predict_profile(greedy), with the
  prediction's 95% interval over the profile's prompts (`Prediction.tokens_per_s_interval`); the paper's;
- the timing-free counts (`CountCheck`): per verifier its mean acceptance length (bonus included), the
  target's steps per generated token and verification fraction, measured from the runs' pooled stage
  statistics (`analysis.rundir.stage_stats`), predicted from the `Prediction` and by the paper's model;
- tokens/s at the machine's speed during the sweep, a decomposition: the prediction over the greedy runs'
  median speed factor (`analysis.paired.speed_factor`: their target's step seconds over the profile's t(n));
  what the counts leave of its error is the schedule's (target steps per second);
- the ranking (`Ranking`): Spearman between predicted and measured speedups, and the regret of the top pick
  (1 - its measured speedup / the best measured);
- each model stage's steps by what came before them (`speed_factors`: after its own step, after a wait, beside
  another stage), their seconds over the profile's t(n): where the schedule's error comes from;
- each model stage's costs during the sweep (`sweep_costs`: its speed and contention fitted on every
  configuration's steps, `analysis.learn.StepCosts`) beside the profile's contention, and every speedup
  predicted again at those costs with the profile's acceptance (a decomposition: what is left is the
  counts' and the schedule's);

each beside the sweep's own noise floor (`sweep_figures`): half the repetitions interval of each speedup,
each count's and tokens/s' spread over the repetitions (`repetition_spread`), the regret among the
configurations the sweep does not tell apart from the best (`regret_floor`), and 1 - the Spearman between
repetitions (`repetition_agreement`), with the targets (`TARGETS`) and the ones whose floor is above a third
of the target: those the sweep cannot show. A sweep whose prompts the profile measured acceptance on
(same dataset, a shared sample id) is in-sample: said so and labelled a decomposition. A sweep without
traces, without greedy pairs, or of another hierarchy than the profile's is one `error:` line (exit 2).

**Sequential runs (no pairing)**, measured one after another: for each run (`analysis.runs`), the
configuration it ran is predicted and set against the run's measured tokens/s, error = predicted /
measured - 1. On a shared machine identical runs minutes apart differ by a third, so these absolute
figures mostly measure the machine's drift.

A run whose samples overlap the profile's (same dataset, a shared sample id) is in-sample: the profile
saw its prompts. It is reported on its own and never enters the held-out summary (median and largest
|error| per model). A run of another hierarchy, dataset or machine than the profile is predicted with a
warning naming the mismatch; a run that cannot be predicted (draft_confidence, synthetic acceptance,
sampling, stages the profile lacks) is skipped with a note.

`--costs` checks the profile's step costs instead: per number of tokens fed n, the target's t(n) in the
profile (alone) beside the median duration of the runs' own target steps that fed n tokens (from their
traces; the runs' stages computed side by side, so their steps include contention).

`--greedy-speed` is a decomposition, not a prediction: it multiplies the profile's step costs and
prefill by the greedy run's median one-token target step over the profile's t(1), so the machine's
speed during the runs (which drifts by 10-20% over minutes on a shared VM) is taken from a run. What is
left is the model's error plus the runs' own drift around that one run's speed. Every record is then
in-sample.

`--repeats` groups the held-out runs by configuration (strategy, lookahead, max_lead, stages): where one
configuration ran several times on the same prompts, its measured tokens/s spread shows the machine's own
variation, and (max - min) / (max + min) is the floor: no single prediction per configuration can have a
largest |error| below it on those runs (the best one, 2 max min / (max + min), is off by that much on
both ends).

`--summary` reads `--json` reports (of one profile each) and prints the figures over all their records
together, held-out and in-sample apart: for sweeps the targets table over their configurations pooled
(the ranking: the worst sweep's), for sequential runs median and largest |error| per model, how many
within 10% and 20%.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
import sys
from dataclasses import MISSING, asdict, dataclass, fields, replace
from pathlib import Path
from typing import Iterable, Mapping, NamedTuple, Sequence

import numpy as np

from analysis.paired import (LEVEL, REFERENCE, RESAMPLES, STEP_CONDITIONS, PairedSpeedup, Sample, decoding_busy,
                             log_ratios, overlapping, paired_speedups, profile_step_seconds, speed_factor, step_conditions,
                             sweep_samples)  # fmt: skip
from analysis.learn import Observed, learned_costs
from analysis.predict import Prediction, paper_profile_counts, predict_profile, profile_contention, sample_cost
from analysis.profile import Profile, ProfileError, StageProfile, load_profile, mismatches
from analysis.rundir import CONFIG, is_run_dir, read_config, stage_stats
from analysis.runs import ResultsError, Run, find_runs, load_run
from pipespec.errors import ConfigError
from pipespec.schedule import DEFAULT_MAX_LEAD
from pipespec.stats import StageStats, pool, ratio


@dataclass(frozen=True)
class Validation:
    run: str
    strategy: str
    lookahead: int
    max_lead: int | None
    stages: tuple[str, ...]
    measured_tokens_per_s: float
    predicted_tokens_per_s: float
    paper_predicted_tokens_per_s: float
    error: float  # predicted / measured - 1 (our model)
    paper_error: float
    in_sample: bool
    warnings: tuple[str, ...] = ()
    speed_from: str | None = None  # the greedy run whose speed the profile's costs were scaled to


def _stage_name(name: str) -> str:
    """'1:smollm2-fp32' (a run's stage name) -> 'smollm2-fp32' (the profile's)."""
    head, sep, rest = name.partition(":")
    return rest if sep and head.isdigit() else name


def run_stages(profile: Profile, run: Run) -> tuple[int, ...] | None:
    """The profile positions of the stages the run used, by name; None if one is not in the profile."""
    names = [s.name for s in profile.stages]
    used = [_stage_name(n) for n in run.stage_names]
    if any(n not in names for n in used):
        return None
    return tuple(names.index(n) for n in used)


def in_sample(profile: Profile, run: Run) -> bool:
    """The run's prompts overlap the profile's: same dataset and a shared sample id."""
    if profile.dataset is not None and run.dataset != profile.dataset:
        return False
    prompts = {str((s.get("slot") or {}).get("prompt", s["sample_id"])) for s in run.samples}  # a sweep's: ID@rN
    return bool(prompts & set(profile.sample_ids))


def run_warnings(profile: Profile, run: Run) -> list[str]:
    env = run.env or {}
    here = {"cpu": env.get("cpu"), "torch": env.get("torch"), "transformers": env.get("transformers")}
    found = mismatches(profile, hierarchy=run.hierarchy, here=here)
    if profile.dataset is not None and run.dataset != profile.dataset:
        found.append(f"dataset: profile {profile.dataset!r}, run {run.dataset!r}")
    along, tokens = profile.continuation_tokens, run.max_new_tokens
    if along is not None and tokens is not None and tokens > along:
        found.append(f"continuations: the profile read acceptance along {along} tokens, the run generates {tokens}; "
                     f"positions past {along} repeat the continuations' start (profile.continuation={tokens} "
                     "measures them)")  # fmt: skip
    return found


def why_not(run: Run) -> str | None:
    """Why the profile cannot predict this run (None: it can)."""
    if not run.lossless:
        return "synthetic acceptance"
    if run.sampled:
        return "sampled decoding (the profile measures greedy acceptance)"
    if float(run.summary.get("draft_confidence") or 0.0):
        return "draft_confidence (the simulator has no model of it)"
    if float(run.summary.get("value_stop") or 0.0):
        return "value_stop (the simulator has no model of its online estimates)"
    if run.summary.get("cascade"):
        return "cascade (the profile has no acceptance of the mixed drafts the target then verifies)"
    return None


def predict_run(profile: Profile, run: Run) -> Prediction:
    """The profile's prediction of the configuration a run ran (strategy, lookahead, max_lead, its stages, its
    first stage's token trees), at its mean new tokens and prompt tokens per sample."""
    stages = run_stages(profile, run)
    if stages is None and run.strategy != "greedy":
        raise ConfigError(f"{run.path}: its stages {run.stage_names} are not all in the profile "
                          f"{[s.name for s in profile.stages]}")  # fmt: skip
    tokens = max(round(run.summary["new_tokens"] / max(run.n_samples, 1)), 1)
    prompt = round(statistics.mean(int(r.get("prompt_tokens") or 0) for r in run.samples)) if run.samples else 0
    max_lead = run.max_lead if run.max_lead is not None else DEFAULT_MAX_LEAD
    return predict_profile(profile, run.strategy, run.lookahead, max_lead, tokens,
                           stages=None if run.strategy == "greedy" else stages, prompt_tokens=prompt,
                           size_verification=bool(run.summary.get("size_verification", False)),
                           tree_nodes=0 if run.strategy == "greedy" else run.tree_nodes)  # fmt: skip


def validate_run(profile: Profile, run: Run) -> Validation:
    problem = why_not(run)
    if problem:
        raise ConfigError(f"{run.path}: cannot be predicted: {problem}")
    prediction = predict_run(profile, run)
    measured = run.tokens_per_s
    return Validation(
        run=str(run.path), strategy=run.strategy, lookahead=run.lookahead, max_lead=run.max_lead,
        stages=prediction.stages, measured_tokens_per_s=measured,
        predicted_tokens_per_s=prediction.predicted_tokens_per_s,
        paper_predicted_tokens_per_s=prediction.paper_predicted_tokens_per_s,
        error=prediction.predicted_tokens_per_s / measured - 1,
        paper_error=prediction.paper_predicted_tokens_per_s / measured - 1,
        in_sample=in_sample(profile, run), warnings=tuple(run_warnings(profile, run)),
    )  # fmt: skip


def validate(profile: Profile, runs: Sequence[Run]) -> tuple[list[Validation], list[str]]:
    """One Validation per predictable run, and a note per skipped one."""
    done, notes = [], []
    for run in runs:
        try:
            done.append(validate_run(profile, run))
        except ConfigError as error:
            notes.append(str(error))
    return done, notes


def summary(records: Sequence[Validation]) -> dict:
    """Median and largest |error| per model over the given records (None when there are none), and how
    many are within 10% and 20%."""
    def stats(errors):
        errors = [abs(e) for e in errors]
        return {"median_abs_error": statistics.median(errors) if errors else None,
                "max_abs_error": max(errors) if errors else None, "runs": len(errors),
                "within_10": sum(e <= 0.10 for e in errors), "within_20": sum(e <= 0.20 for e in errors)}  # fmt: skip

    return {"ours": stats(r.error for r in records), "paper": stats(r.paper_error for r in records)}


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:+.1f}%"


SEQUENTIAL = "sequential runs (no pairing): each run's absolute tokens/s against the prediction"


def format_report(records: Sequence[Validation]) -> str:
    lines = [SEQUENTIAL] if records else []
    for title, subset in (("held-out runs", [r for r in records if not r.in_sample]),
                          ("in-sample runs (the profile saw their prompts, or its costs took a greedy run's speed)",
                           [r for r in records if r.in_sample])):
        if not subset:
            continue
        lines += [f"{title}:", f"  {'run':<44}{'measured':>10}{'ours':>9}{'error':>9}{'paper':>10}{'error':>9}"]
        for r in subset:
            name = r.run if len(r.run) <= 43 else "..." + r.run[-40:]
            lines.append(f"  {name:<44}{r.measured_tokens_per_s:>10.2f}{r.predicted_tokens_per_s:>9.2f}"
                         f"{_pct(r.error):>9}{r.paper_predicted_tokens_per_s:>10.2f}"
                         f"{_pct(r.paper_error):>9}")  # fmt: skip
        figures = summary(subset)
        for model in ("ours", "paper"):
            f = figures[model]
            lines.append(f"  {model}: {_figures(f)}")
    return "\n".join(lines) if lines else "no run could be predicted"


def _figures(f: dict) -> str:
    return (f"median |error| {100 * f['median_abs_error']:.1f}%, largest {100 * f['max_abs_error']:.1f}% "
            f"over {f['runs']} runs ({f['within_10']} within 10%, {f['within_20']} within 20%)")


def configuration(record: Validation) -> str:
    """What a run ran, as one label: identical labels are repeats of one configuration."""
    label = record.strategy
    if record.strategy != "greedy":
        label += f" L{record.lookahead}"
    if record.strategy == "pipespec":
        label += f" M{record.max_lead if record.max_lead is not None else DEFAULT_MAX_LEAD}"
    return f"{label} [{'>'.join(map(str, record.stages))}]"


@dataclass(frozen=True)
class Repeats:
    configuration: str
    runs: int
    measured_min: float  # tokens/s
    measured_max: float
    errors: tuple[float, ...]  # ours, one per run

    @property
    def spread(self) -> float:
        return self.measured_max / self.measured_min - 1

    @property
    def floor(self) -> float:
        """The least largest |error| that one prediction can have on these runs."""
        return (self.measured_max - self.measured_min) / (self.measured_max + self.measured_min)


def repeats(records: Sequence[Validation]) -> list[Repeats]:
    """The held-out records grouped by configuration, in the order first seen."""
    groups: dict[str, list[Validation]] = {}
    for r in records:
        if not r.in_sample:
            groups.setdefault(configuration(r), []).append(r)
    return [Repeats(key, len(g), min(r.measured_tokens_per_s for r in g), max(r.measured_tokens_per_s for r in g),
                    tuple(r.error for r in g)) for key, g in groups.items()]  # fmt: skip


def format_repeats(records: Sequence[Validation]) -> str:
    groups = [g for g in repeats(records) if g.runs > 1]
    if not groups:
        return "no configuration ran more than once (held out)"
    lines = ["identical configurations, held out (measured tokens/s; ours: error per run):",
             f"  {'configuration':<46}{'runs':>5}{'min':>8}{'max':>8}{'spread':>8}{'floor':>8}  ours"]
    for g in groups:
        lines.append(f"  {g.configuration:<46}{g.runs:>5}{g.measured_min:>8.2f}{g.measured_max:>8.2f}"
                     f"{100 * g.spread:>7.1f}%{100 * g.floor:>7.1f}%  {' '.join(_pct(e) for e in g.errors)}")
    worst = max(groups, key=lambda g: g.floor)
    lines.append(f"floor: any one prediction per configuration is off by at least {100 * worst.floor:.1f}% on "
                 f"some run of {worst.configuration}")  # fmt: skip
    return "\n".join(lines)


def read_reports(paths: Sequence[str]) -> tuple[list[Validation], list[SweepReport]]:
    """The records of `--json` reports of sequential runs (a list), and the reports of sweeps (an object)."""
    fields = set(Validation.__dataclass_fields__)
    required = {name for name, f in Validation.__dataclass_fields__.items()
                if f.default is MISSING and f.default_factory is MISSING}  # fmt: skip
    records, sweeps = [], []
    for path in paths:
        try:
            raw = json.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as error:
            raise ConfigError(f"{path}: cannot read: {error.strerror or error}") from None
        except json.JSONDecodeError as error:
            raise ConfigError(f"{path}: not JSON ({error.msg}, line {error.lineno})") from None
        if isinstance(raw, dict) and raw.get("format") == SWEEP_FORMAT:
            sweeps.append(read_sweep_report(raw, path))
            continue
        if not isinstance(raw, list) or not all(isinstance(r, dict) and required <= set(r) for r in raw):
            raise ConfigError(f"{path}: not a validation report (python -m analysis.validate ... --json)")
        records += [Validation(**{k: v for k, v in r.items() if k in fields}) for r in raw]
    return records, sweeps


def format_summary(records: Sequence[Validation], paths: Sequence[str],
                   sweeps: Sequence[SweepReport] = ()) -> str:  # fmt: skip
    lines = format_sweep_summary(sweeps)
    if records:
        lines.append(SEQUENTIAL)
    for title, subset in (("held-out runs", [r for r in records if not r.in_sample]),
                          ("in-sample runs (a decomposition, not a prediction)", [r for r in records if r.in_sample])):
        if subset:
            figures = summary(subset)
            lines += [f"{title}, {len(paths)} report(s):",
                      *(f"  {model}: {_figures(figures[model])}" for model in ("ours", "paper"))]
    return "\n".join(lines) if lines else f"no record in {len(paths)} report(s)"


def target_step_costs(runs: Sequence[Run], max_fed: int) -> list[tuple[float | None, int]]:
    """Per n = 1..max_fed: the median seconds of the runs' target steps that fed n tokens, and their count."""
    durations: list[list[float]] = [[] for _ in range(max_fed)]
    for run in runs:
        if not run.has_traces():
            continue
        for _, stages in run.iter_traces():
            steps = stages[-1].steps
            for fed, start, end in zip(steps["fed"], steps["t_start"], steps["t_end"]):
                if 1 <= fed <= max_fed:
                    durations[fed - 1].append(end - start)
    return [(statistics.median(d) if d else None, len(d)) for d in durations]


def greedy_speed(profile: Profile, runs: Sequence[Run]) -> tuple[float, str]:
    """The machine's speed during the runs against the profile's: the median one-token step of the greedy
    run among `runs` over the profile's target t(1), and that run's path."""
    greedy = [r for r in runs if r.strategy == "greedy" and r.has_traces()]
    if not greedy:
        raise ConfigError("--greedy-speed needs a greedy run with traces among the run directories")
    step_s, _ = target_step_costs(greedy[:1], 1)[0]
    if step_s is None:
        raise ConfigError(f"{greedy[0].path}: its traces have no one-token target step")
    return step_s / profile.stages[-1].step_s_alone[0], str(greedy[0].path)


def at_speed(profile: Profile, factor: float) -> Profile:
    """The profile with every model stage's step costs and prefill multiplied by `factor`."""
    def scaled(stage):
        if stage.model_free:
            return stage
        return replace(stage, step_s_alone=tuple(factor * t for t in stage.step_s_alone),
                       step_s_loaded=tuple(factor * t for t in stage.step_s_loaded),
                       prefill_s_per_token=factor * stage.prefill_s_per_token)  # fmt: skip

    return replace(profile, stages=tuple(scaled(s) for s in profile.stages))


def format_costs(profile: Profile, runs: Sequence[Run]) -> str:
    target = profile.stages[-1]
    measured = target_step_costs(runs, len(target.step_s_alone))
    lines = [f"target {target.name}: t(n) in ms, the profile's (alone) beside the runs' target steps (median)",
             f"  {'n':>3}{'profile':>10}{'runs':>10}{'steps':>8}"]  # fmt: skip
    for n, (alone, (runs_s, count)) in enumerate(zip(target.step_s_alone, measured), 1):
        if count:
            lines.append(f"  {n:>3}{1000 * alone:>10.1f}{1000 * runs_s:>10.1f}{count:>8}")
    return "\n".join(lines)


# ==== paired sweeps =====================================================================================
#
# `python -m experiments.sweep` runs greedy and every configuration of one hierarchy in the same prompt slots
# (prompt, repetition), seconds apart: a configuration's speedup over greedy is a paired ratio that the
# machine's drift over minutes cannot bend (`analysis.paired`). A sweep is checked on what it can measure:
# the speedup (and its intervals), the timing-free counts, tokens/s at the machine's speed during the sweep
# (a decomposition), and the ranking; each beside the sweep's own noise floor.

SWEEP_FORMAT = "pipespec-sweep-validation"
ACCEPTANCE, STEPS, VERIFY = "mean acceptance length", "target steps per token", "verification fraction"
# what a held-out sweep must show: a largest value (|error|, regret), for spearman a least one
TARGETS = {"speedup_median": 0.06, "speedup_max": 0.15, "counts_median": 0.06, "counts_max": 0.15, "regret": 0.03,
           "spearman": 0.8}  # fmt: skip
SHOWN_BELOW = 1 / 3  # a sweep can show a target only where its floor is below this share of the target


@dataclass(frozen=True)
class SweepRuns:
    """A paired sweep as read: per configuration (its folder name) its run, and the sweep's samples and
    paired speedups against greedy."""

    path: Path
    runs: dict[str, Run]
    samples: tuple[Sample, ...]
    speedups: dict[str, PairedSpeedup]


@dataclass(frozen=True)
class CountCheck:
    """One timing-free count of a configuration: measured (pooled stage statistics), ours, the paper's."""

    figure: str  # ACCEPTANCE (per verifier), STEPS or VERIFY (the target's)
    stage: str  # the verifier it is of
    measured: float | None
    predicted: float | None
    paper: float | None
    error: float | None  # predicted / measured - 1 (None where either is missing, or measured is 0)
    paper_error: float | None
    floor: float | None  # its spread over the sweep's repetitions (`repetition_spread`)
    prompts: float | None = None  # half its interval over the sweep's prompts (`count_prompt_spreads`); None: older


@dataclass(frozen=True)
class SweepRecord:
    """One configuration of a sweep against its prediction from the profile."""

    configuration: str
    strategy: str
    lookahead: int
    max_lead: int | None
    stages: tuple[str, ...]
    prompts: int
    repetitions: int
    measured_speedup: float  # geometric-mean paired speedup over greedy
    measurement_interval: tuple[float, float]  # 95%, repetitions resampled within prompts
    sampling_interval: tuple[float, float]  # 95%, prompts resampled
    predicted_speedup: float  # ours: predict_profile(configuration) / predict_profile(greedy)
    predicted_interval: tuple[float, float] | None  # 95% over the profile's prompts
    paper_speedup: float
    speedup_error: float
    paper_speedup_error: float
    counts: tuple[CountCheck, ...]
    measured_tokens_per_s: float  # pooled over the run's samples
    predicted_tokens_per_s: float  # at the profile's speed
    paper_predicted_tokens_per_s: float
    machine_speed: float  # the greedy runs' median speed factor: the machine's speed during the sweep
    own_speed: float | None  # this run's median speed factor (its target's steps, contention included)
    at_speed_error: float  # predicted / machine_speed / measured - 1 (a decomposition)
    paper_at_speed_error: float
    schedule_error: float | None  # what the counts leave of at_speed_error: seconds per target step
    speedup_floor: float | None  # the measurement interval's relative half-width
    tokens_per_s_floor: float | None  # spread of the run's tokens/s over the repetitions
    # each model stage's steps by what came before them and their size (`speed_factors`): (stage, condition, size,
    # their median speed factor over the machine's speed, how many); () in reports written before it
    step_factors: tuple[tuple[str, str, str, float, int], ...] = ()
    # each model stage's busy share while the target decodes (`speed_factors`): (stage, measured, the simulation's);
    # () in reports written before it
    busy: tuple[tuple[str, float, float | None], ...] = ()
    # ours at the sweep's own stage costs (`sweep_costs`), the profile's acceptance; None in reports written before it
    costs_speedup: float | None = None

    @property
    def costs_speedup_error(self) -> float | None:
        return None if self.costs_speedup is None else self.costs_speedup / self.measured_speedup - 1

    @property
    def is_reference(self) -> bool:
        return self.configuration == REFERENCE


@dataclass(frozen=True)
class Ranking:
    """How a model orders a sweep's configurations: Spearman against the measured speedups, and its top pick."""

    spearman: float | None  # None with fewer than three configurations
    top_pick: str
    top_pick_measured: float
    regret: float  # 1 - the top pick's measured speedup / the best measured


@dataclass(frozen=True)
class SweepReport:
    profile: str
    sweep: str
    prompts: tuple[str, ...]
    seen: tuple[str, ...]  # the sweep's prompts that the profile measured acceptance on
    records: tuple[SweepRecord, ...]
    ours: Ranking
    paper: Ranking
    measured_best: str
    repetition_spearman: float | None  # `repetition_agreement`
    regret_floor: float | None  # `regret_floor`
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    # per model stage with steps: (name, speed, contention or None, wake or None, the profile's contention)
    # (`sweep_costs`); () in reports written before it
    stage_costs: tuple[tuple[str, float, float | None, float | None, float], ...] = ()

    @property
    def in_sample(self) -> bool:
        return bool(self.seen)


# ---- statistics on hand-made numbers ------------------------------------------------------------------


def relative_error(predicted: float | None, measured: float | None) -> float | None:
    """predicted / measured - 1; None where either is missing or measured is 0 (0 where both are)."""
    if predicted is None or measured is None or not (math.isfinite(predicted) and math.isfinite(measured)):
        return None
    if measured == 0:
        return 0.0 if predicted == 0 else None
    return predicted / measured - 1


def repetition_spread(values: Sequence[float | None]) -> float | None:
    """(max - min) / (max + min) of one figure over a sweep's repetitions: no single prediction has a smaller
    largest |error| against them; None with fewer than two values."""
    values = [v for v in values if v is not None]
    if len(values) < 2 or max(values) + min(values) <= 0:
        return None
    return (max(values) - min(values)) / (max(values) + min(values))


def relative_half_width(interval: Sequence[float], center: float) -> float:
    """Half an interval's width over its center: the relative error the measurement cannot rule out."""
    return (interval[1] - interval[0]) / (2 * center)


def average_ranks(values: Sequence[float]) -> list[float]:
    """Ranks 1..n, ties sharing their mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    first = 0
    while first < len(order):
        last = first
        while last + 1 < len(order) and values[order[last + 1]] == values[order[first]]:
            last += 1
        for position in range(first, last + 1):
            ranks[order[position]] = (first + last) / 2 + 1
        first = last + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rank correlation (Pearson's on average ranks); None for fewer than three pairs or a
    constant side."""
    if len(x) != len(y):
        raise ValueError("spearman needs two sequences of one length")
    if len(x) < 3:
        return None
    rx, ry = np.asarray(average_ranks(x)), np.asarray(average_ranks(y))
    dx, dy = rx - rx.mean(), ry - ry.mean()
    norm = math.sqrt(float(dx @ dx) * float(dy @ dy))
    return float(dx @ dy) / norm if norm else None


def top_pick(predicted: Mapping[str, float], measured: Mapping[str, float]) -> tuple[str, float, float]:
    """The configuration predicted fastest (the first of ties), its measured speedup and its regret: 1 - that
    over the best measured."""
    pick = max(predicted, key=lambda name: (predicted[name], -list(predicted).index(name)))
    return pick, measured[pick], 1 - measured[pick] / max(measured.values())


def ranking(predicted: Mapping[str, float], measured: Mapping[str, float]) -> Ranking:
    names = list(predicted)
    pick, pick_measured, regret = top_pick(predicted, measured)
    return Ranking(spearman([predicted[n] for n in names], [measured[n] for n in names]), pick, pick_measured, regret)


def regret_floor(speedups: Sequence[PairedSpeedup]) -> float | None:
    """The regret noise alone can give: the largest 1 - speedup / the best's over the configurations whose
    measurement interval overlaps the best's (`analysis.paired.overlapping`: the sweep does not tell them
    apart); 0 where none does; None with one repetition (no interval)."""
    if not speedups or max(s.repetitions for s in speedups) < 2:
        return None
    best = max(speedups, key=lambda s: s.speedup)
    return max([1 - s.speedup / best.speedup for s in speedups if overlapping(s, best)], default=0.0)


def repetition_speedups(samples: Sequence[Sample], repetition: int) -> dict[str, float]:
    """Each configuration's paired speedup over greedy within one repetition (geometric mean over prompts)."""
    ratios = log_ratios([s for s in samples if s.repetition == repetition], REFERENCE)
    return {name: math.exp(statistics.mean(statistics.mean(v) for v in by_prompt.values()))
            for name, by_prompt in ratios.items()}  # fmt: skip


def repetition_agreement(samples: Sequence[Sample], names: Sequence[str]) -> float | None:
    """The median Spearman correlation between the measured speedups of `names` in two repetitions (over every
    pair of repetitions): how well the sweep ranks its own configurations again. None with one repetition or
    fewer than three configurations measured in both."""
    by_repetition = [repetition_speedups(samples, r) for r in sorted({s.repetition for s in samples})]
    found = []
    for a, b in itertools.combinations(by_repetition, 2):
        shared = [n for n in names if n in a and n in b]
        rho = spearman([a[n] for n in shared], [b[n] for n in shared])
        if rho is not None:
            found.append(rho)
    return statistics.median(found) if found else None


# ---- reading and checking a sweep -----------------------------------------------------------------------


def is_sweep_dir(path: str | Path) -> bool:
    """A paired sweep's directory (`experiments.sweep`): not a run directory itself, holding run directories
    whose config names the sweep they belong to."""
    path = Path(path)
    if not path.is_dir() or is_run_dir(path) or (path / CONFIG).is_file():
        return False
    for child in sorted(path.iterdir()):
        if (child / CONFIG).is_file():
            try:
                if isinstance(read_config(child).get("sweep"), dict):
                    return True
            except ResultsError:
                continue
    return False


def load_sweep(path: str | Path) -> SweepRuns:
    """A sweep directory's runs, samples and paired speedups; a `ResultsError` for a sweep without greedy,
    without pairs or without traces."""
    path = Path(path)
    samples = sweep_samples(path)
    names = sorted({s.configuration for s in samples})
    if REFERENCE not in names:
        raise ResultsError(f"{path}: no {REFERENCE} configuration: a sweep's speedups are paired against greedy")
    runs = {name: load_run(path / name) for name in names}
    for name, run in runs.items():
        if not run.has_traces():
            raise ResultsError(f"{path / name}: no traces: the counts and speed factors are read from the stages' "
                               "steps (traces/)")  # fmt: skip
    try:
        speedups = {s.configuration: s for s in paired_speedups(samples, REFERENCE)}
    except ValueError as error:
        raise ResultsError(f"{path}: {error}") from None
    if len(speedups) < 2:
        raise ResultsError(f"{path}: no configuration shares a prompt and repetition with {REFERENCE}: nothing is "
                           "paired")  # fmt: skip
    return SweepRuns(path, runs, tuple(samples), speedups)


def check_hierarchy(profile: Profile, sweep: SweepRuns) -> None:
    """A `ConfigError` unless every configuration ran the profile's hierarchy on its stages (greedy: the target;
    a configuration with `stages`: some of them, ending with the target)."""
    names = [s.name for s in profile.stages]
    for name, run in sweep.runs.items():
        if run.hierarchy != profile.hierarchy:
            raise ConfigError(f"{sweep.path / name} ran hierarchy {run.hierarchy!r}, the profile {profile.path} is of "
                              f"{profile.hierarchy!r}: validate a sweep with a profile of its own hierarchy")  # fmt: skip
        positions = run_stages(profile, run)  # a configuration may run some of them (`stages`)
        last = len(names) - 1
        if not positions or list(positions) != sorted(set(positions)) or positions[-1] != last or (
                run.strategy == REFERENCE and positions != (last,)):  # fmt: skip
            used = [_stage_name(n) for n in run.stage_names]
            raise ConfigError(f"{sweep.path / name} ran the stages {used}, not the profile's {names} (or some of them "
                              "ending with its target): validate a sweep with a profile of its own hierarchy")  # fmt: skip


def sweep_overlap(profile: Profile, sweep: SweepRuns) -> tuple[str, ...]:
    """The sweep's prompts that the profile measured acceptance on (same dataset, a shared sample id)."""
    if profile.dataset is not None and sweep.runs[REFERENCE].dataset != profile.dataset:
        return ()
    seen = set(profile.sample_ids)
    return tuple(sorted({s.prompt for s in sweep.samples} & seen))


STEP_SIZES = ("n = 1", "n >= 2")


class TraceReading(NamedTuple):
    """What one pass over a run's traces gives (`speed_factors`)."""

    per_sample: list[float]  # per sample, its target's speed factor
    per_step: dict[tuple[str, str, str], list[float]]  # per (model stage, condition, size), each step's factor
    busy: dict[str, list[float]]  # per model stage, [seconds computing, seconds of decoding] over the samples


def speed_factors(run: Run, profile: Profile) -> TraceReading:
    """One pass over the run's traces, each step priced at its own context where the profile measured how the
    cost grows with it (`predict.sample_cost`): per sample, its target's steps' seconds over the profile's for
    them (`paired.speed_factor`); per (model stage, what came before the step, its size), each step of that
    stage: its seconds over the profile's for it (`paired.step_conditions`: after its own step, after a wait,
    beside another stage; `STEP_SIZES`); and per model stage [seconds computing, seconds of decoding] summed
    over the samples (`paired.decoding_busy`)."""
    positions = run_stages(profile, run) or ()
    per_sample: list[float] = []
    per_step: dict[tuple[str, str, str], list[float]] = {}
    busy: dict[str, list[float]] = {}
    for sample, stages in run.iter_traces():
        factor = speed_factor(stages[-1].steps, sample_cost(profile.stages[-1], sample.get("prompt_tokens")))
        if factor is not None:
            per_sample.append(factor)
        for position, trace in zip(positions, stages):
            stage = profile.stages[position]
            if stage.model_free:
                continue
            steps = trace.steps
            computing, decoding = decoding_busy(steps, stages[-1].steps)
            total = busy.setdefault(stage.name, [0.0, 0.0])
            total[0], total[1] = total[0] + computing, total[1] + decoding
            predicted = profile_step_seconds(steps, sample_cost(stage, sample.get("prompt_tokens")))
            for i, condition in enumerate(step_conditions(steps, [s.steps for s in stages if s is not trace])):
                if condition is not None and int(steps["fed"][i]) > 0 and predicted[i] > 0:  # fed 0: passed on
                    key = (stage.name, condition, STEP_SIZES[int(steps["fed"][i]) > 1])
                    per_step.setdefault(key, []).append((steps["t_end"][i] - steps["t_start"][i]) / predicted[i])
    return TraceReading(per_sample, per_step, busy)


def pooled_stages(records: Sequence[Mapping], names: Sequence[str]) -> list[StageStats]:
    """Each stage's statistics pooled over samples (`analysis.rundir.stage_stats`: counts summed)."""
    stats = [stage_stats(r) for r in records]
    if any(len(s) != len(names) for s in stats):
        raise ResultsError(f"a sample's stage statistics do not hold the {len(names)} stages {list(names)}")
    return [pool(s[i] for s in stats) for i in range(len(names))]


def counts_of(pooled: Sequence[StageStats], names: Sequence[str]) -> list[tuple[str, str, float | None]]:
    """The timing-free counts of pooled stage statistics: per verifier (every stage after the first) its mean
    acceptance length, bonus included; the target's steps per generated token and its verification fraction
    (verifications over verifications and one-token steps)."""
    target = pooled[-1]
    return [*((ACCEPTANCE, names[i], pooled[i].mean_acceptance_length) for i in range(1, len(names))),
            (STEPS, names[-1], ratio(target.steps, target.output_tokens)), (VERIFY, names[-1], target.verify_fraction)]


def count_values(records: Sequence[Mapping], names: Sequence[str]) -> list[tuple[str, str, float | None]]:
    """The timing-free counts of samples, pooled (`counts_of`)."""
    return counts_of(pooled_stages(records, names), names)


def count_prompt_spreads(records: Sequence[Mapping], names: Sequence[str], seed: int = 0,
                         resamples: int = RESAMPLES) -> list[float | None]:  # fmt: skip
    """Per count (`count_values`' order), half its 95% interval over the sweep's prompts, relative to its value
    (as `prompts_floor` for a speedup): the prompts resampled, each prompt's samples pooled, the counts pooled
    over the draw; None with one prompt or where a count is undefined."""
    by_prompt: dict[str, list[Mapping]] = {}
    for record in records:
        by_prompt.setdefault(str(record["slot"]["prompt"]), []).append(record)
    per_prompt = [pooled_stages(group, names) for _, group in sorted(by_prompt.items())]
    centers = counts_of([pool(stages) for stages in zip(*per_prompt)], names)  # `count_values` of every sample
    if len(per_prompt) < 2:
        return [None] * len(centers)
    columns = [f.name for f in fields(StageStats)]
    table = np.array([[[getattr(stats, c) for c in columns] for stats in stages] for stages in per_prompt], float)
    picks = np.random.default_rng(seed).integers(0, len(per_prompt), size=(resamples, len(per_prompt)))
    weights = np.stack([np.bincount(row, minlength=len(per_prompt)) for row in picks])
    drawn = np.einsum("rp,psc->rsc", weights, table)  # per draw, per stage, the pooled fields
    values = [counts_of([StageStats(**dict(zip(columns, stage))) for stage in draw], names) for draw in drawn]
    spreads = []
    for i, (_, _, center) in enumerate(centers):
        found = np.array([v[i][2] for v in values if v[i][2] is not None], float)
        if center is None or center == 0 or len(found) < len(values):
            spreads.append(None)
            continue
        low, high = np.quantile(found, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
        spreads.append(relative_half_width((float(low), float(high)), center))
    return spreads


def predicted_counts(prediction: Prediction, paper: dict | None) -> list[tuple[float | None, float | None]]:
    """(ours, paper's) per count, in `count_values`' order; the paper's model has the target's alone."""
    middle = [(length, None) for length in prediction.acceptance_lengths[:-1]]
    paper = paper or {}
    steps = 1 / prediction.tokens_per_target_step if prediction.tokens_per_target_step else None
    return [*middle, (prediction.acceptance_lengths[-1], paper.get("mean_acceptance_length")),
            (steps, paper.get("target_steps_per_token")), (prediction.verify_fraction, paper.get("verify_fraction"))]


def count_checks(profile: Profile, run: Run, prediction: Prediction) -> tuple[CountCheck, ...]:
    """Every count of a configuration: measured over all its samples, predicted, and its repetition spread."""
    names = prediction.stages
    measured = count_values(run.samples, names)
    by_repetition: dict[int, list[dict]] = {}
    for record in run.samples:
        by_repetition.setdefault(int(record["slot"]["repetition"]), []).append(record)
    repeated = [count_values(group, names) for _, group in sorted(by_repetition.items())]
    spreads = count_prompt_spreads(run.samples, names)
    paper = paper_profile_counts(profile, prediction.stage_indices, prediction.strategy, prediction.lookahead,
                                 prediction.max_lead)  # fmt: skip
    return tuple(CountCheck(figure, stage, value, ours, theirs, relative_error(ours, value),
                            relative_error(theirs, value), repetition_spread([r[i][2] for r in repeated]), spreads[i])
                 for i, ((figure, stage, value), (ours, theirs)) in enumerate(zip(measured,
                                                                                  predicted_counts(prediction, paper))))


def tokens_per_s(records: Sequence[Mapping]) -> float:
    """Pooled tokens/s of samples: their tokens over their seconds."""
    return sum(r["new_tokens"] for r in records) / sum(r["time_s"] for r in records)


def check_configuration(profile: Profile, sweep: SweepRuns, name: str, greedy: Prediction, machine_speed: float,
                        reading: TraceReading, at_costs: Profile,
                        greedy_at_costs: Prediction) -> SweepRecord:  # fmt: skip
    """One configuration of the sweep against its prediction (`greedy`: the greedy run's prediction; the
    machine's speed: the greedy runs' median speed factor; `reading`: its run's traces, `speed_factors`;
    `at_costs`: the profile at the sweep's own stage costs, `sweep_costs`, and the greedy run's prediction on it)."""
    run, measured = sweep.runs[name], sweep.speedups[name]
    prediction = greedy if name == REFERENCE else predict_run(profile, run)
    costs_speedup = (greedy_at_costs if name == REFERENCE else predict_run(at_costs, run)).tokens_per_s / (
        greedy_at_costs.tokens_per_s)  # fmt: skip
    ours = prediction.tokens_per_s / greedy.tokens_per_s
    paper = prediction.paper_predicted_tokens_per_s / greedy.tokens_per_s
    interval = prediction.tokens_per_s_interval
    counts = () if name == REFERENCE else count_checks(profile, run, prediction)
    measured_rate = tokens_per_s(run.samples)
    at_speed = relative_error(prediction.tokens_per_s / machine_speed, measured_rate)
    steps = next((c for c in counts if c.figure == STEPS), None)
    # tokens/s = 1 / (steps per token x seconds per step): what the counts leave of the error at speed
    schedule = at_speed if steps is None else (None if steps.error is None else (1 + at_speed) * (1 + steps.error) - 1)
    by_repetition: dict[int, list[dict]] = {}
    for record in run.samples:
        by_repetition.setdefault(int(record["slot"]["repetition"]), []).append(record)
    own, by_condition, busy = reading
    return SweepRecord(
        configuration=name, strategy=run.strategy, lookahead=run.lookahead, max_lead=run.max_lead,
        stages=prediction.stages, prompts=measured.prompts, repetitions=measured.repetitions,
        measured_speedup=measured.speedup, measurement_interval=measured.measurement_interval,
        sampling_interval=measured.sampling_interval, predicted_speedup=ours,
        predicted_interval=None if interval is None else (interval[0] / greedy.tokens_per_s,
                                                          interval[1] / greedy.tokens_per_s),
        paper_speedup=paper, speedup_error=ours / measured.speedup - 1,
        paper_speedup_error=paper / measured.speedup - 1,
        counts=counts, measured_tokens_per_s=measured_rate, predicted_tokens_per_s=prediction.tokens_per_s,
        paper_predicted_tokens_per_s=prediction.paper_predicted_tokens_per_s, machine_speed=machine_speed,
        own_speed=statistics.median(own) if own else None, at_speed_error=at_speed,
        paper_at_speed_error=relative_error(prediction.paper_predicted_tokens_per_s / machine_speed, measured_rate),
        schedule_error=schedule,
        speedup_floor=relative_half_width(measured.measurement_interval, measured.speedup)
        if measured.repetitions > 1 and name != REFERENCE else None,
        tokens_per_s_floor=repetition_spread([tokens_per_s(group) for _, group in sorted(by_repetition.items())]),
        step_factors=tuple((*key, statistics.median(factors) / machine_speed, len(factors))
                           for key, factors in by_condition.items()),
        busy=tuple((stage, seconds / span, _busy_predicted(prediction, stage)) for stage, (seconds, span) in busy.items()
                   if span > 0),
        costs_speedup=costs_speedup,
    )  # fmt: skip


def _busy_predicted(prediction: Prediction, stage: str) -> float | None:
    """The simulation's busy share of a stage it ran (None: not among its stages)."""
    return prediction.busy_fraction[prediction.stages.index(stage)] if stage in prediction.stages else None


def check_sweep(profile: Profile, sweep: SweepRuns) -> SweepReport:
    """Every predictable configuration of the sweep against the profile, the rankings and the floors."""
    check_hierarchy(profile, sweep)
    greedy_run = sweep.runs[REFERENCE]
    greedy_reading = speed_factors(greedy_run, profile)
    factors = greedy_reading.per_sample
    if not factors:
        raise ResultsError(f"{sweep.path / REFERENCE}: its traces have no decode steps to gauge the machine's speed")
    greedy, machine_speed = predict_run(profile, greedy_run), statistics.median(factors)
    costs = sweep_costs(profile, sweep)
    at_costs = learned_costs(profile, costs)
    greedy_at_costs = predict_run(at_costs, greedy_run)
    records, notes = [], []
    for name in [REFERENCE, *(n for n in sweep.speedups if n != REFERENCE)]:  # then fastest measured first
        problem = why_not(sweep.runs[name])
        if problem:
            notes.append(f"{name}: cannot be predicted: {problem}")
            continue
        reading = greedy_reading if name == REFERENCE else speed_factors(sweep.runs[name], profile)
        records.append(check_configuration(profile, sweep, name, greedy, machine_speed, reading, at_costs,
                                           greedy_at_costs))  # fmt: skip
    measured = {r.configuration: r.measured_speedup for r in records}
    best = max(measured, key=measured.get)
    return SweepReport(
        profile=profile.path, sweep=str(sweep.path), prompts=tuple(sorted({s.prompt for s in sweep.samples})),
        seen=sweep_overlap(profile, sweep), records=tuple(records),
        ours=ranking({r.configuration: r.predicted_speedup for r in records}, measured),
        paper=ranking({r.configuration: r.paper_speedup for r in records}, measured), measured_best=best,
        repetition_spearman=repetition_agreement(sweep.samples, list(measured)),
        regret_floor=regret_floor([sweep.speedups[n] for n in measured]),
        warnings=tuple(run_warnings(profile, greedy_run)), notes=tuple(notes),
        stage_costs=stage_costs(profile, costs),
    )  # fmt: skip


def sweep_costs(profile: Profile, sweep: SweepRuns) -> Observed:
    """Every configuration's steps of the sweep, greedy's included, as a learning run would read them
    (`analysis.learn.Observed`, each step at its sample's context): what each model stage's speed and contention
    were during the sweep (`StepCosts.fitted`)."""
    observed = Observed()
    for run in sweep.runs.values():
        positions = run_stages(profile, run)
        for sample, traces in run.iter_traces():
            observed.add(profile, positions, traces, sample.get("prompt_tokens"))
    return observed


def stage_costs(profile: Profile, costs: Observed) -> tuple[tuple[str, float, float | None, float | None, float], ...]:
    """Per model stage the sweep stepped: (name, speed, contention or None, wake or None, the profile's contention)."""
    rows = []
    for i, stage in enumerate(profile.stages):
        fitted = costs.stage_costs(i)
        if fitted.speed is not None and not stage.model_free:
            rows.append((stage.name, *fitted, profile_contention(profile, i)))
    return tuple(rows)


# ---- the figures, their floors and the targets ------------------------------------------------------------


def _median_max(values: Iterable[float | None]) -> tuple[float | None, float | None]:
    values = [abs(v) for v in values if v is not None]
    return (statistics.median(values), max(values)) if values else (None, None)


def sweep_figures(records: Sequence[SweepRecord], rankings: Sequence[tuple[Ranking, Ranking]],
                  agreements: Sequence[float | None], regret_floors: Sequence[float | None]) -> dict:  # fmt: skip
    """The figures the targets are on, ours and the paper's, with the floor of each: over `records` (of one
    sweep or several), the speedups and counts pooled; the rankings per sweep (`rankings`: (ours, paper)),
    their worst (the least Spearman, the largest regret) over the sweeps."""
    speedups = [r for r in records if not r.is_reference]
    counts = [c for r in speedups for c in r.counts]
    figures = {}
    for key, ours, paper, floors, prompts in (
        ("speedup", [r.speedup_error for r in speedups], [r.paper_speedup_error for r in speedups],
         [r.speedup_floor for r in speedups], [prompts_floor(r) for r in speedups]),
        ("counts", [c.error for c in counts], [c.paper_error for c in counts], [c.floor for c in counts],
         [c.prompts for c in counts]),
    ):  # fmt: skip
        (ours_median, ours_max), (paper_median, paper_max), (floor_median, floor_max), (prompts_median, prompts_max) = (
            map(_median_max, (ours, paper, floors, prompts)))  # fmt: skip
        figures[f"{key}_median"] = _figure(ours_median, paper_median, floor_median, TARGETS[f"{key}_median"],
                                           prompts=prompts_median)  # fmt: skip
        figures[f"{key}_max"] = _figure(ours_max, paper_max, floor_max, TARGETS[f"{key}_max"], prompts=prompts_max)
    regret_floor = max((f for f in regret_floors if f is not None), default=None)
    figures["regret"] = _figure(max((o.regret for o, _ in rankings), default=None),
                                max((p.regret for _, p in rankings), default=None), regret_floor, TARGETS["regret"])
    least = [min((x for x in side if x is not None), default=None)
             for side in ([o.spearman for o, _ in rankings], [p.spearman for _, p in rankings], agreements)]
    figures["spearman"] = _figure(least[0], least[1], None if least[2] is None else 1 - least[2],
                                  TARGETS["spearman"], at_least=True)
    return figures


def _figure(ours: float | None, paper: float | None, floor: float | None, target: float,
            at_least: bool = False, prompts: float | None = None) -> dict:  # fmt: skip
    """One target's row: `floor` is the noise the sweep cannot see through (for a least value, Spearman, its
    shortfall from 1); `shown` False where the floor is above SHOWN_BELOW of the target (its shortfall).
    `prompts` (the speedups' and the counts'): how far the sweep's own prompts leave its figures from those of
    other prompts (`prompts_floor`, `count_prompt_spreads`), which a held-out prediction meets; `prompts_shown`
    as `shown` for it."""
    met = None if ours is None else (ours >= target if at_least else ours <= target)
    room = (1 - target) if at_least else target
    return {"ours": ours, "paper": paper, "floor": floor, "target": target, "at_least": at_least, "met": met,
            "shown": None if floor is None else floor <= SHOWN_BELOW * room, "prompts": prompts,
            "prompts_shown": None if prompts is None else prompts <= SHOWN_BELOW * room}  # fmt: skip


def prompts_floor(record: SweepRecord) -> float | None:
    """Half the width of a measured speedup's interval over the sweep's prompts (relative): how far its eight
    or so prompts may leave it from the same configuration's speedup on others; None with one prompt."""
    return relative_half_width(record.sampling_interval, record.measured_speedup) if record.prompts > 1 else None


def sampling_reach(record: SweepRecord) -> float | None:
    """How far prompt sampling alone may put a prediction from its measurement (|log(predicted / measured)|, 95%):
    the profile's prompts (half the prediction's interval) and the sweep's (half the measured speedup's interval
    over its prompts, `prompts_floor`'s), independent, combined; None without both intervals."""
    if record.predicted_interval is None or record.prompts < 2:
        return None
    (low, high), (measured_low, measured_high) = record.predicted_interval, record.sampling_interval
    return math.hypot(math.log(high / low) / 2, math.log(measured_high / measured_low) / 2)


def beyond_sampling(records: Sequence[SweepRecord]) -> dict:
    """Which configurations' speedup errors prompt sampling reaches (`sampling_reach`) and which it does not: an
    error beyond it is more than the prompts the profile and the sweep happened to draw explain (the model's, or
    prompts further apart than their intervals say; the in-sample decomposition tells which)."""
    reading = {"within": [], "beyond": []}
    for r in records:
        reach = None if r.is_reference else sampling_reach(r)
        if reach is not None:
            within = abs(math.log(r.predicted_speedup / r.measured_speedup)) <= reach
            reading["within" if within else "beyond"].append(r.configuration)
    return reading


def sampling_line(reading: dict) -> str | None:
    within, beyond = reading["within"], reading["beyond"]
    if not within and not beyond:
        return None
    line = (f"prompt sampling (the profile's and the sweep's 95% intervals, combined) reaches the speedup error of "
            f"{len(within)} of {len(within) + len(beyond)} configurations")
    return line + (f"; beyond it (more than the prompts drawn explain): {', '.join(beyond)}" if beyond else "")


def decomposition(records: Sequence[SweepRecord]) -> dict:
    """The three error kinds, median and largest |value| over `records`: the machine's speed (the greedy runs'
    speed factor - 1, once per sweep), the timing-free counts, and the schedule (seconds per target step at
    the machine's speed, given the measured counts); with tokens/s at the machine's speed (ours, the paper's)
    and its floor."""
    return {
        "machine_speed": _median_max(r.machine_speed - 1 for r in records if r.is_reference),
        "counts": _median_max(c.error for r in records for c in r.counts),
        "schedule": _median_max(r.schedule_error for r in records),
        "at_speed": _median_max(r.at_speed_error for r in records),
        "paper_at_speed": _median_max(r.paper_at_speed_error for r in records),
        "tokens_per_s_floor": _median_max(r.tokens_per_s_floor for r in records),
        "at_sweep_costs": _median_max(r.costs_speedup_error for r in records if not r.is_reference),
        "at_sweep_costs_of": (sum(r.costs_speedup is not None for r in records if not r.is_reference),
                              sum(not r.is_reference for r in records)),
    }  # fmt: skip


# ---- the report ---------------------------------------------------------------------------------------


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


USAGE = ("usage: python -m analysis.validate PROFILE SWEEP_DIR [--json]\n"
         "       python -m analysis.validate PROFILE RUN_DIRS... [--json | --costs | --repeats] [--greedy-speed]\n"
         "       python -m analysis.validate --summary VALIDATION_JSON...")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    flags = ("--json", "--costs", "--greedy-speed", "--repeats", "--summary")
    as_json, as_costs, speed, as_repeats, as_summary = (flag in argv for flag in flags)
    argv = [a for a in argv if a not in flags]
    if len(argv) < (1 if as_summary else 2):
        print(USAGE, file=sys.stderr)
        return 2
    try:
        if as_summary:
            records, sweeps = read_reports(argv)
            print(format_summary(records, argv, sweeps))
            return 0
        sweeps = [path for path in argv[1:] if is_sweep_dir(path)]
        if sweeps:
            return sweep_main(argv[0], argv[1:], as_json, as_costs or speed or as_repeats)
        return sequential_main(argv[0], argv[1:], as_json, as_costs, speed, as_repeats)
    except (ProfileError, ResultsError, ConfigError) as error:
        print(f"error: {str(error).splitlines()[0]}", file=sys.stderr)
        return 2


def sweep_main(profile_path: str, paths: Sequence[str], as_json: bool, sequential_flag: bool) -> int:
    """`python -m analysis.validate PROFILE SWEEP_DIR [--json]`: one sweep against the profile."""
    if len(paths) != 1:
        raise ConfigError(f"{paths[0] if is_sweep_dir(paths[0]) else paths[1]} is a paired sweep: validate it on "
                          "its own (python -m analysis.validate PROFILE SWEEP_DIR)")  # fmt: skip
    if sequential_flag:
        raise ConfigError("--costs, --repeats and --greedy-speed are for sequential runs: a sweep's report has "
                          "its own speed factors and noise floor")  # fmt: skip
    report = check_sweep(load_profile(profile_path), load_sweep(paths[0]))
    for note in report.notes:
        print(f"note: skipped {note}", file=sys.stderr)
    for warning in report.warnings:
        print(f"warning: {report.sweep}: {warning}", file=sys.stderr)
    if report.in_sample:
        print(f"note: {report.sweep} is in-sample: the profile measured acceptance on {len(report.seen)} of its "
              f"{len(report.prompts)} prompts", file=sys.stderr)  # fmt: skip
    print(json.dumps(sweep_report_json(report)) if as_json else format_sweep_report(report))
    return 0


def sequential_main(profile_path: str, paths: Sequence[str], as_json: bool, as_costs: bool, speed: bool,
                    as_repeats: bool) -> int:  # fmt: skip
    """`python -m analysis.validate PROFILE RUN_DIRS...`: runs measured one after another."""
    profile = load_profile(profile_path)
    runs = find_runs(paths)
    if as_costs:
        print(format_costs(profile, runs))
        return 0
    speed_from = None
    if speed:
        factor, speed_from = greedy_speed(profile, runs)
        profile = at_speed(profile, factor)
        print(f"note: step costs x {factor:.4f}, the speed of {speed_from}: every run is in-sample",
              file=sys.stderr)  # fmt: skip
    records, notes = validate(profile, runs)
    if speed_from is not None:
        records = [replace(r, in_sample=True, speed_from=speed_from) for r in records]
    for note in notes:
        print(f"note: skipped {note}", file=sys.stderr)
    for record in records:
        for warning in record.warnings:
            print(f"warning: {record.run}: {warning}", file=sys.stderr)
    if as_json:
        print(json.dumps([asdict(r) for r in records]))
    elif as_repeats:
        print(format_report(records) + "\n" + format_repeats(records))
    else:
        print(format_report(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
