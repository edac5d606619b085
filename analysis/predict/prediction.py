"""A `Hierarchy` played in the simulator (`predict`): per sample its start-up (prefill and dispatch,
`startup_s`) plus the mean of its simulated generations (`simulate_generation`; sd pays 2(k - 1) handoffs a
round, `sd_handoff_s`), pooled into one `Prediction` with the target's counts as a run's statistics pool
them and a 95% interval over the profile's prompts (`prompt_interval`). docs/prediction.md, "Predict" and
"Reading an interval".
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from analysis import simulate as sim
from analysis.predict.hierarchy import Hierarchy, SIDE_BY_SIDE
from pipespec.schedule import DEFAULT_MAX_LEAD


STRATEGIES = ("greedy", "sd", "pipespec")


@dataclass(frozen=True)
class Prediction:
    """Predicted time of a set of samples under one configuration, and what the simulation saw."""

    strategy: str
    lookahead: int
    max_lead: int
    stages: tuple[str, ...]  # the stages it runs, smallest first (greedy: the target)
    stage_indices: tuple[int, ...]  # their positions in the hierarchy they came from (a profile's)
    tokens: int  # output tokens, summed over samples
    seconds: float  # predicted time, summed over samples
    startup_s: float  # of which start-up (prefill, dispatch)
    tokens_per_target_step: float  # pooled over the simulated generations (greedy: 1)
    verify_fraction: float  # target: verifications / steps, pooled (greedy: 0)
    offered_per_verify: float | None  # target: drafts offered per verification, pooled (None: it never verified)
    mean_acceptance_length: float | None  # target: tokens per verification, bonus included, pooled (None: idem)
    busy_fraction: tuple[float, ...]  # per stage run: busy share, mean over the simulated generations
    paper_predicted_tokens_per_s: float | None = None  # the paper's model beside (`predict_profile`)
    # per verifier (every stage after the first): tokens per verification, bonus included, pooled over the
    # simulated generations as a run's stage statistics pool them (None: it never verified)
    acceptance_lengths: tuple[float | None, ...] = ()
    # the 95% interval of tokens_per_s over the prompts the acceptance was measured on (`prompt_interval`;
    # greedy: no acceptance, no width); None where the acceptance is not read off per-prompt continuations
    tokens_per_s_interval: tuple[float, float] | None = None
    speedup: float | None = None  # tokens_per_s over greedy's from the same profile (`predict_profile`)
    speedup_interval: tuple[float, float] | None = None  # tokens_per_s_interval over greedy's tokens_per_s
    tree_nodes: int = 0  # > 0: the model-free first stage proposes token trees of this size (`tree_acceptance`)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def predicted_tokens_per_s(self) -> float:
        """``tokens_per_s``, under the name of the profile tools' records."""
        return self.tokens_per_s

    @property
    def ms_per_token(self) -> float:
        return 1000 / self.tokens_per_s

    @property
    def target_busy(self) -> float:
        return self.busy_fraction[-1]

    @property
    def bottleneck(self) -> int:
        """Index of the busiest stage in the simulation (the one that sets the pace)."""
        return int(np.argmax(self.busy_fraction)) if self.busy_fraction else len(self.busy_fraction) - 1


def sd_handoff_s(hierarchy: Hierarchy, rounds: int) -> float:
    """The handoff latency of sd: per lockstep round the drafts travel down the chain and the commit
    cascades back up, 2(k - 1) message hops of ``handoff_s``."""
    return rounds * (2 * (len(hierarchy.stages) - 1)) * hierarchy.handoff_s


def _contention(hierarchy: Hierarchy) -> list[float | None] | None:
    """Per stage for the simulator; prompt lookup takes no core. None where no stage shares cores."""
    contention = [None if s.kind == "lookup" else s.contention for s in hierarchy.stages]
    return None if all(c is None for c in contention) else contention


def simulate_generation(hierarchy: Hierarchy, strategy: str, tokens: int, lookahead: int = 0,
                        max_lead: int = DEFAULT_MAX_LEAD, seed: int = 0,
                        size_verification: bool = False) -> tuple[float, sim.SimResult | None]:  # fmt: skip
    """Seconds to decode ``tokens`` in one simulated generation, and the simulator's result (None for
    greedy: the target alone, t(1) per token)."""
    if strategy == "greedy":
        return sim.simulate_autoregressive(hierarchy.target.step_cost(), tokens).total_time, None
    costs = [s.step_cost(with_overhead=strategy != "sd" or i == 0) for i, s in enumerate(hierarchy.stages)]
    acceptance, supply = list(hierarchy.acceptance), [s.supply for s in hierarchy.stages]
    wake = [s.wake for s in hierarchy.stages]
    if strategy == "sd":
        result = sim.simulate_sync_sd(costs, acceptance, lookahead, tokens, seed=seed, supply=supply,
                                      end_at_budget=hierarchy.end_at_budget, size_verification=size_verification,
                                      wake=wake)  # fmt: skip
        return result.total_time + sd_handoff_s(hierarchy, result.target_steps), result
    if strategy == "pipespec":
        result = sim.simulate_pipespec(
            costs, acceptance, tokens, lookahead=lookahead, max_lead=max(max_lead, lookahead, 1),
            rollback_delay=hierarchy.handoff_s, seed=seed, contention=_contention(hierarchy), supply=supply,
            end_at_budget=hierarchy.end_at_budget, size_verification=size_verification, wake=wake,
        )  # fmt: skip
        return result.total_time, result
    raise ValueError(f"unknown strategy {strategy!r}")


def startup_s(hierarchy: Hierarchy, strategy: str, lookahead: int, prompt_tokens: int) -> float:
    """Start-up of one sample: prefill as ``hierarchy.startup`` counts it, plus the dispatch."""
    models = [s for s in hierarchy.stages if s.kind == "model"]
    if hierarchy.startup == SIDE_BY_SIDE:
        reading = hierarchy.stages[-1:] if strategy == "greedy" else models
        prefill = [prompt_tokens * s.prefill_s_per_token for s in reading]
        return (max(prefill) if strategy == "pipespec" else sum(prefill)) + hierarchy.dispatch_s
    critical = hierarchy.stages[-1:] if strategy == "greedy" or (strategy == "pipespec" and lookahead == 0) else models
    extra = 0.0
    for stage in critical:
        extra += max(stage.prefill_s_per_token * prompt_tokens - stage.step_cost()(1), 0.0)
    return extra + hierarchy.dispatch_s


def _samples(new_tokens: Sequence[int], prompt_tokens: Sequence[int] | None) -> tuple[list[int], list[int]]:
    new_tokens = [int(n) for n in new_tokens]
    if not new_tokens or min(new_tokens) < 1:
        raise ValueError("new_tokens must be a non-empty list of positive token counts")
    prompts = [0] * len(new_tokens) if prompt_tokens is None else [int(p) for p in prompt_tokens]
    if len(prompts) != len(new_tokens):
        raise ValueError("prompt_tokens needs one value per sample")
    return new_tokens, prompts


def predict(hierarchy: Hierarchy, strategy: str, new_tokens: Sequence[int], prompt_tokens: Sequence[int] | None = None,
            lookahead: int = 0, max_lead: int = DEFAULT_MAX_LEAD, seed: int = 0,
            size_verification: bool = False) -> Prediction:  # fmt: skip
    """Predicted pooled time of samples with ``new_tokens`` output tokens each (and their prompt lengths):
    per sample its start-up plus the mean of its simulated generations. greedy runs only the target; sd
    and pipespec need at least two stages."""
    new_tokens, prompts = _samples(new_tokens, prompt_tokens)
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}")
    if strategy != "greedy" and len(hierarchy.stages) < 2:
        raise ValueError(f"{strategy} needs at least two stages")
    seconds = startup = 0.0
    results: list[sim.SimResult] = []
    per_seed: list[list[float]] = []  # per sample: the seconds of each of its simulated generations
    for index, (tokens, prompt) in enumerate(zip(new_tokens, prompts)):
        start = startup_s(hierarchy, strategy, lookahead, prompt)
        seeds = hierarchy.seeds[:1] if strategy == "greedy" else hierarchy.seeds  # greedy: no sampling
        played = hierarchy.at_prompt(None if prompt_tokens is None else prompt)
        runs = [simulate_generation(played, strategy, tokens, lookahead, max_lead, seed + s + index,
                                    size_verification) for s in seeds]  # fmt: skip
        per_seed.append([time_s + start for time_s, _ in runs])
        seconds += statistics.mean(per_seed[-1])
        startup += start
        results += [result for _, result in runs if result is not None]
    prediction = _prediction(hierarchy, strategy, lookahead, max_lead, sum(new_tokens), seconds, startup, results)
    interval = (prediction.tokens_per_s,) * 2 if strategy == "greedy" else prompt_interval(hierarchy, seed, per_seed,
                                                                                          prediction)  # fmt: skip
    return replace(prediction, tokens_per_s_interval=interval)


INTERVAL_Z = 1.96  # a 95% interval: the estimate +- 1.96 standard errors (normal approximation)


def prompt_interval(hierarchy: Hierarchy, seed: int, per_seed: Sequence[Sequence[float]],
                    prediction: Prediction) -> tuple[float, float] | None:  # fmt: skip
    """The 95% interval of a prediction's tokens/s over the prompts its acceptance was measured on: each
    simulated generation follows one prompt's continuation (`sim.AlongContinuations`: generation seed g
    follows continuation g mod C), so the predicted seconds are a mean over the C prompts, and their
    prompt-to-prompt spread gives its standard error, sd / sqrt(C) (the acceptance's standard errors by
    position, `analysis.profile.acceptance_standard_errors`, carried through the schedule). None unless
    every pair reads C >= 2 continuations and every sample's generations met each of them."""
    counts = {len(a.runs) if isinstance(a, sim.AlongContinuations) else 0 for a in hierarchy.acceptance}
    if len(counts) != 1 or min(counts) < 2:
        return None
    continuations = counts.pop()
    totals = [0.0] * continuations  # per prompt: the summed seconds of every sample following it
    for index, times in enumerate(per_seed):
        groups: dict[int, list[float]] = {}
        for s, time_s in zip(hierarchy.seeds, times):
            groups.setdefault((seed + s + index) % continuations, []).append(time_s)
        if len(groups) < continuations:
            return None
        for c, values in groups.items():
            totals[c] += statistics.mean(values)
    half = INTERVAL_Z * statistics.stdev(totals) / math.sqrt(continuations)
    return prediction.tokens / (prediction.seconds + half), prediction.tokens / max(prediction.seconds - half, 1e-12)


def _prediction(hierarchy: Hierarchy, strategy: str, lookahead: int, max_lead: int, tokens: int, seconds: float,
                startup: float, results: Sequence[sim.SimResult]) -> Prediction:  # fmt: skip
    """What the simulated generations saw of the target, pooled over them as a run's stage statistics pool its
    samples (every step and verification counts once; a mean of per-generation ratios would weigh a short
    generation's few steps as much as a long one's many); the stages' busy shares averaged."""
    names, positions = tuple(s.name for s in hierarchy.stages), hierarchy.stage_positions
    if strategy == "greedy":
        return Prediction(strategy, lookahead, max_lead, names[-1:], positions[-1:], tokens, seconds, startup,
                          1.0, 0.0, None, None, (1.0,))  # fmt: skip
    steps = sum(r.target_steps for r in results)
    verifications = sum(len(r.offered_counts[-1]) for r in results)
    offered = sum(sum(r.offered_counts[-1]) for r in results)
    lengths = tuple(_pooled_length([r.accepted_counts[pair] for r in results])
                    for pair in range(len(hierarchy.stages) - 1))  # fmt: skip
    return Prediction(
        strategy, lookahead, max_lead, names, positions, tokens, seconds, startup,
        sum(r.committed_tokens for r in results) / steps if steps else math.nan,
        verifications / steps if steps else math.nan,
        offered / verifications if verifications else None,
        lengths[-1],  # None: the target never verified
        tuple(statistics.mean(column) for column in zip(*(r.busy_fraction for r in results))),
        acceptance_lengths=lengths,
    )  # fmt: skip


def _pooled_length(counts: Sequence[Sequence[int]]) -> float | None:
    """Tokens per verification (own token included) over every verification of the generations."""
    verifications = sum(len(c) for c in counts)
    return sum(sum(c) for c in counts) / verifications if verifications else None
