"""The figures a paired sweep's validation is judged on, each beside its floor (the sweep's own noise) and the
spread of its prompts: speedup and count errors, the regret of the top pick and Spearman against `TARGETS`
(`sweep_figures`); how far prompt sampling alone reaches (`beyond_sampling`); and the error kinds, the
machine's speed, the counts and the schedule (`decomposition`). docs/prediction.md, "The kinds of error".
"""

from __future__ import annotations

import math
import statistics
from typing import Iterable, Sequence

from analysis.validate.records import Ranking, SHOWN_BELOW, SweepRecord, TARGETS
from analysis.validate.stats import relative_half_width


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
