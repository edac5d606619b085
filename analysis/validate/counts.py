"""The timing-free counts of a paired sweep's configuration (`CountCheck`): per verifier its mean acceptance
length (bonus included), the target's steps per generated token and verification fraction, measured from
the runs' pooled stage statistics (`analysis.rundir.stage_stats`), predicted from the `Prediction` and by
the paper's model, with their spread over repetitions and over the sweep's prompts (docs/prediction.md).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Mapping, Sequence

import numpy as np

from analysis.paired import LEVEL, RESAMPLES
from analysis.predict import Prediction, paper_profile_counts
from analysis.profile import Profile
from analysis.rundir import stage_stats
from analysis.runs import ResultsError, Run
from analysis.validate.records import ACCEPTANCE, CountCheck, STEPS, VERIFY
from analysis.validate.stats import relative_error, relative_half_width, repetition_spread
from pipespec.stats import StageStats, pool, ratio


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


def by_repetition(records: Sequence[Mapping]) -> list[list[Mapping]]:
    """A sweep run's samples grouped by the repetition of their slot, in repetition order."""
    groups: dict[int, list[Mapping]] = {}
    for record in records:
        groups.setdefault(int(record["slot"]["repetition"]), []).append(record)
    return [group for _, group in sorted(groups.items())]


def count_checks(profile: Profile, run: Run, prediction: Prediction) -> tuple[CountCheck, ...]:
    """Every count of a configuration: measured over all its samples, predicted, and its repetition spread."""
    names = prediction.stages
    measured = count_values(run.samples, names)
    repeated = [count_values(group, names) for group in by_repetition(run.samples)]
    spreads = count_prompt_spreads(run.samples, names)
    paper = paper_profile_counts(profile, prediction.stage_indices, prediction.strategy, prediction.lookahead,
                                 prediction.max_lead)  # fmt: skip
    return tuple(CountCheck(figure, stage, value, ours, theirs, relative_error(ours, value),
                            relative_error(theirs, value), repetition_spread([r[i][2] for r in repeated]), spreads[i])
                 for i, ((figure, stage, value), (ours, theirs)) in enumerate(zip(measured,
                                                                                  predicted_counts(prediction, paper))))
