"""Statistics on hand-made numbers for a paired sweep's validation: relative errors, the spread over
repetitions and half-widths of intervals (the floors), Spearman's rank correlation, the top pick and its
regret, and how well a sweep ranks its own configurations again (docs/prediction.md, "Validate").
"""

from __future__ import annotations

import itertools
import math
import statistics
from typing import Mapping, Sequence

import numpy as np

from analysis.paired import PairedSpeedup, REFERENCE, Sample, log_ratios, overlapping
from analysis.validate.records import Ranking


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
