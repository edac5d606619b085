"""Sequential runs (no pairing), measured one after another: each run's configuration predicted from the
profile and set against its measured tokens/s (error = predicted / measured - 1). On a shared machine
identical runs minutes apart differ by a third, so these absolute figures mostly measure its drift.

A run whose prompts the profile measured acceptance on (same dataset, a shared sample id) is in-sample
and never enters the held-out summary; a run of another hierarchy, dataset or machine is predicted with a
warning; one that cannot be predicted (`why_not`) is skipped with a note. `format_costs` (`--costs`): the
profile's target t(n) beside the runs' own steps. `at_speed` (`--greedy-speed`, a decomposition): the
profile's costs at the greedy run's speed, every record then in-sample. `repeats` (`--repeats`): identical
configurations grouped, (max - min) / (max + min) the floor no one prediction per configuration beats.
docs/prediction.md tells the story.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Sequence

from analysis.predict import Prediction, predict_profile
from analysis.profile import Profile, mismatches
from analysis.runs import Run
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
