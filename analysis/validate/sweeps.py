"""A paired sweep (`python -m experiments.sweep`: greedy and every configuration of one hierarchy in the same
prompt slots, seconds apart; `analysis.paired`) read and checked against a profile (`check_sweep`): each
configuration predicted at its mean new tokens and prompt tokens (`runs.predict_run`), its paired speedup
over greedy and timing-free counts (`counts`), tokens/s at the machine's speed (the greedy runs' median
speed factor), each model stage's steps by what came before them and its busy share (`speed_factors`), the
stages' costs during the sweep (`sweep_costs`, `analysis.learn.StepCosts`) with every speedup predicted
again at them, and the rankings beside the sweep's own noise floor. A sweep without traces, greedy pairs,
or of another hierarchy than the profile's is one error. docs/prediction.md tells the story.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Mapping, NamedTuple, Sequence

from analysis.learn import Observed, learned_costs
from analysis.paired import (
    REFERENCE, decoding_busy, paired_speedups, profile_step_seconds, speed_factor, step_conditions, sweep_samples
)
from analysis.predict import Prediction, profile_contention, sample_cost
from analysis.profile import Profile
from analysis.rundir import CONFIG, is_run_dir, read_config
from analysis.runs import ResultsError, Run, load_run
from analysis.validate.counts import by_repetition, count_checks
from analysis.validate.records import STEPS, SweepRecord, SweepReport, SweepRuns
from analysis.validate.runs import _stage_name, predict_run, run_stages, run_warnings, why_not
from analysis.validate.stats import (
    ranking, regret_floor, relative_error, relative_half_width, repetition_agreement, repetition_spread
)
from pipespec.errors import ConfigError


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
        tokens_per_s_floor=repetition_spread([tokens_per_s(group) for group in by_repetition(run.samples)]),
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
