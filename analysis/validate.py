"""Measured against predicted: a machine profile's predictions checked on run directories (no torch).

    python -m analysis.validate PROFILE RUN_DIRS... [--json]
    python -m analysis.validate PROFILE RUN_DIRS... --costs     # the profile's t(n) beside the runs' own
    python -m analysis.validate PROFILE RUN_DIRS... --greedy-speed   # costs at the greedy run's speed
    python -m analysis.validate PROFILE RUN_DIRS... --repeats   # identical runs: their spread, the floor
    python -m analysis.validate --summary VALIDATION_JSON...    # held-out figures over several reports

For each run (`analysis.runs`), the configuration it ran (strategy, lookahead, max_lead, the stages it
used, its mean new tokens per sample) is predicted from the profile (`analysis.predict.predict_profile`,
and the paper's model beside it) and set against the run's measured tokens/s. error = predicted / measured - 1.

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
together, held-out and in-sample apart: median and largest |error| per model, how many within 10% and 20%.
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import MISSING, asdict, dataclass, replace
from pathlib import Path
from typing import Sequence

from analysis.predict import predict_profile
from analysis.profile import Profile, ProfileError, load_profile, mismatches
from analysis.runs import ResultsError, Run, find_runs
from pipespec.errors import ConfigError
from pipespec.schedule import DEFAULT_MAX_LEAD


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
    return bool({str(s["sample_id"]) for s in run.samples} & set(profile.sample_ids))


def run_warnings(profile: Profile, run: Run) -> list[str]:
    env = run.env or {}
    here = {"cpu": env.get("cpu"), "torch": env.get("torch"), "transformers": env.get("transformers")}
    found = mismatches(profile, hierarchy=run.hierarchy, here=here)
    if profile.dataset is not None and run.dataset != profile.dataset:
        found.append(f"dataset: profile {profile.dataset!r}, run {run.dataset!r}")
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


def validate_run(profile: Profile, run: Run) -> Validation:
    problem = why_not(run)
    if problem:
        raise ConfigError(f"{run.path}: cannot be predicted: {problem}")
    stages = run_stages(profile, run)
    if stages is None and run.strategy != "greedy":
        raise ConfigError(f"{run.path}: its stages {run.stage_names} are not all in the profile "
                          f"{[s.name for s in profile.stages]}")  # fmt: skip
    tokens = max(round(run.summary["new_tokens"] / max(run.n_samples, 1)), 1)
    prompt = round(statistics.mean(int(r.get("prompt_tokens") or 0) for r in run.samples)) if run.samples else 0
    max_lead = run.max_lead if run.max_lead is not None else DEFAULT_MAX_LEAD
    prediction = predict_profile(profile, run.strategy, run.lookahead, max_lead, tokens,
                                 stages=None if run.strategy == "greedy" else stages, prompt_tokens=prompt,
                                 size_verification=bool(run.summary.get("size_verification", False)))  # fmt: skip
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


def format_report(records: Sequence[Validation]) -> str:
    lines = []
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


def read_reports(paths: Sequence[str]) -> list[Validation]:
    """The records of `--json` reports."""
    fields = set(Validation.__dataclass_fields__)
    required = {name for name, f in Validation.__dataclass_fields__.items()
                if f.default is MISSING and f.default_factory is MISSING}  # fmt: skip
    records = []
    for path in paths:
        try:
            raw = json.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as error:
            raise ConfigError(f"{path}: cannot read: {error.strerror or error}") from None
        except json.JSONDecodeError as error:
            raise ConfigError(f"{path}: not JSON ({error.msg}, line {error.lineno})") from None
        if not isinstance(raw, list) or not all(isinstance(r, dict) and required <= set(r) for r in raw):
            raise ConfigError(f"{path}: not a validation report (python -m analysis.validate ... --json)")
        records += [Validation(**{k: v for k, v in r.items() if k in fields}) for r in raw]
    return records


def format_summary(records: Sequence[Validation], paths: Sequence[str]) -> str:
    lines = []
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


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    flags = ("--json", "--costs", "--greedy-speed", "--repeats", "--summary")
    as_json, as_costs, speed, as_repeats, as_summary = (flag in argv for flag in flags)
    argv = [a for a in argv if a not in flags]
    if len(argv) < (1 if as_summary else 2):
        print("usage: python -m analysis.validate PROFILE RUN_DIRS... [--json | --costs | --repeats] "
              "[--greedy-speed]\n       python -m analysis.validate --summary VALIDATION_JSON...",
              file=sys.stderr)  # fmt: skip
        return 2
    if as_summary:
        try:
            print(format_summary(read_reports(argv), argv))
        except ConfigError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        return 0
    try:
        profile = load_profile(argv[0])
        runs = find_runs(argv[1:])
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
    except (ProfileError, ResultsError, ConfigError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"note: skipped {note}", file=sys.stderr)
    for record in records:
        for warning in record.warnings:
            print(f"warning: {record.run}: profile from elsewhere: {warning}", file=sys.stderr)
    if as_json:
        print(json.dumps([asdict(r) for r in records]))
    elif as_repeats:
        print(format_report(records) + "\n" + format_repeats(records))
    else:
        print(format_report(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
