"""What the predictor plays (`Hierarchy`): per stage (`StageModel`) its step cost t(n), a profile's measured
table (`stage_cost`, growing with the context where measured, `simulate.ContextCost`) or a run's fit plus
its per-step overhead (`fitted_cost`), its prefill, CPU contention (a slowdown per other stage computing),
the cost of a step after a wait and a model-free drafter's supply; per adjacent pair an acceptance model
(read off a profile's continuations, `acceptance` and `tree_acceptance` for token trees, or acceptance in
runs, `TwoRateAcceptance`); the handoff latency of a message hop and a generate call's dispatch.
Built from a profile (`Hierarchy.from_profile`), a run's measurement (`from_measurement`, in-sample) or a
published log (`from_official`). docs/prediction.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from analysis import fit
from analysis import simulate as sim
from analysis.fit import LOOKUP_COST_S
from analysis.profile import PairProfile, Profile, StageProfile
from pipespec.errors import ConfigError


SEEDS = 4  # simulated generations per profile prediction: the sampling noise of acceptance averages out
REPEAT_SEEDS = tuple(1000 * r for r in range(4))  # a measured run: four simulated repetitions of each sample
CRITICAL_PATH, SIDE_BY_SIDE = "critical path", "side by side"  # the start-up rules (`Hierarchy.startup`)


@dataclass(frozen=True)
class TwoRateAcceptance(sim.Bernoulli):
    """Acceptance in runs, for the simulator: a two-state chain over draft positions, as estimated by
    ``fit.fit_two_rates``. A draft that starts a run (the first of a verification after a rejection
    or a one-token step) is accepted with probability ``first``; one that continues an agreeing run
    (after an accepted draft, or first after a fully accepted verification) with ``alpha``. A
    verifier's own token agrees with the drafter's token at its position with ``alpha`` at the bonus
    position of a fully accepted verification, with ``first`` after a one-token step.
    With first == alpha this is the simulator's i.i.d. ``Bernoulli``."""

    first: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.first <= 1.0:
            raise ValueError(f"first must be in [0, 1], got {self.first!r}")

    def sampler(self, rng: np.random.Generator, seed: int = 0) -> "_TwoRateSampler":
        return _TwoRateSampler(self.first, self.alpha, rng)


class _TwoRateSampler(sim.Sampler):
    """The state follows ``fit.fit_two_rates``: a verification continues a run only right after a
    fully accepted one; after a rejection or a one-token step the next draft starts a run."""

    def __init__(self, first: float, later: float, rng: np.random.Generator) -> None:
        self.first, self.later, self.rng = first, later, rng
        self.fresh = True  # the next verification's first draft starts a run
        self.bonus_next = False  # the next agrees() is the bonus position of a fully accepted verification

    def verify(self, offered: int, start: int = 0) -> int:
        accepted, probability = 0, self.first if self.fresh else self.later
        while accepted < offered and self.rng.random() < probability:
            accepted += 1
            probability = self.later
        self.fresh = accepted < offered
        self.bonus_next = not self.fresh
        return accepted

    def agrees(self, position: int = 0) -> bool:
        if self.bonus_next:  # the run goes on through the bonus position, or breaks there
            agreed = bool(self.rng.random() < self.later)
            self.fresh = not agreed
        else:  # a one-token step: the drafts after it start a new run
            agreed = bool(self.rng.random() < self.first)
            self.fresh = True
        self.bonus_next = False
        return agreed


@dataclass(frozen=True)
class StageModel:
    """One stage as the predictor plays it: decode step cost, kind, prefill cost, contention, supply, overhead."""

    name: str
    cost: sim.StageCost | sim.TableCost | sim.ContextCost  # t(n): one decode step feeding n tokens, computing alone
    kind: str = "model"  # "model", or "lookup" (prompt lookup: proposals cost ~0 and take no core)
    prefill_s_per_token: float = 0.0
    contention: float | None = 0.0  # slowdown per other model stage computing meanwhile; None: shares no core
    supply: float | None = None  # lookup: chance of a proposal after each commit (None: always)
    overhead_s: float = 0.0  # between two of its own steps: publishing, reading messages
    wake: float = 0.0  # the share a step costs more after the stage waited (`simulate.simulate_pipespec`)

    def step_cost(self, with_overhead: bool = True) -> sim.StageCost | sim.TableCost | sim.ContextCost:
        """t(n) of one step, the per-step overhead included unless ``with_overhead`` is False."""
        if not with_overhead or not self.overhead_s:
            return self.cost
        return _plus(self.cost, self.overhead_s)


def _plus(cost: sim.StageCost | sim.TableCost | sim.ContextCost, seconds: float):
    """The cost with ``seconds`` added to every step."""
    if isinstance(cost, sim.ContextCost):
        return replace(cost, cost=_plus(cost.cost, seconds))
    if isinstance(cost, sim.TableCost):
        return sim.TableCost(tuple(t + seconds for t in cost.seconds))
    return sim.StageCost(cost.fixed + seconds, cost.per_token)


@dataclass(frozen=True)
class Hierarchy:
    """What the predictor plays: the stages smallest first (target last), one acceptance model per adjacent
    pair (drafter i, verifier i + 1), and the system's latencies.

    ``seeds``: the simulated repetitions of each sample (sample i of a prediction plays seed + s + i).
    ``startup``: how a sample's start-up is counted, besides ``dispatch_s``:
    - ``"critical path"`` (a measured run): a prefill is its stage's first step, so only its excess over
      one ordinary step t(1) is extra time, for the stages whose prefill delays the target's first step:
      the target for greedy and pipespec with lookahead 0, every model stage where each waits for its
      drafter (sd, pipespec with lookahead > 0);
    - ``"side by side"`` (a profile): every model stage reads the prompt before its decode steps, one
      after another in sd (their sum), side by side in pipespec (the longest); greedy: the target's.
    ``end_at_budget``: a simulated generation stops at exactly its token budget (as the engine does),
    rather than after the verification that crosses it.
    """

    stages: tuple[StageModel, ...]
    acceptance: tuple[sim.AcceptanceSpec, ...]  # sim.Bernoulli, TwoRateAcceptance, sim.ByPosition, ...
    handoff_s: float = 0.0  # one message hop between neighbouring stages
    dispatch_s: float = 0.0  # per generate call: sending the job, collecting the result
    seeds: tuple[int, ...] = REPEAT_SEEDS
    startup: str = CRITICAL_PATH
    end_at_budget: bool = False
    positions: tuple[int, ...] | None = None  # the stages' positions where they came from (None: 0, 1, ...)

    def __post_init__(self) -> None:
        if not self.stages:
            raise ValueError("a hierarchy needs at least one stage")
        if len(self.acceptance) != len(self.stages) - 1:
            raise ValueError(f"acceptance needs one model per adjacent pair ({len(self.stages) - 1}), "
                             f"got {len(self.acceptance)}")  # fmt: skip
        if not self.seeds:
            raise ValueError("seeds must not be empty")
        if self.startup not in (CRITICAL_PATH, SIDE_BY_SIDE):
            raise ValueError(f"startup must be {CRITICAL_PATH!r} or {SIDE_BY_SIDE!r}, got {self.startup!r}")
        if self.positions is not None and len(self.positions) != len(self.stages):
            raise ValueError("positions needs one value per stage")

    @property
    def target(self) -> StageModel:
        return self.stages[-1]

    def at_prompt(self, prompt_tokens: int | None) -> Hierarchy:
        """The hierarchy for generations after ``prompt_tokens`` tokens of prompt: each step of a stage whose cost
        grows with its context (`sim.ContextCost`) costs what that context costs (None: the measured one)."""
        stages = tuple(replace(s, cost=s.cost.at_prompt(prompt_tokens)) if isinstance(s.cost, sim.ContextCost) else s
                       for s in self.stages)  # fmt: skip
        return replace(self, stages=stages)

    @property
    def stage_positions(self) -> tuple[int, ...]:
        return self.positions if self.positions is not None else tuple(range(len(self.stages)))

    @classmethod
    def from_profile(cls, profile: Profile, stages: Sequence[int] | None = None, tree_nodes: int = 0) -> Hierarchy:
        """A profile's hierarchy (or the subset `stages` of it): each model stage's measured t(n) alone and
        the contention of its one t(n) fit; acceptance along the profile's continuations (`tree_nodes` > 0:
        the first, model-free stage proposes token trees of that size, `tree_acceptance`)."""
        stages = check_stages(profile, stages)
        pairs = subset_pairs(profile, stages)
        played = []
        for position, i in enumerate(stages):
            stage = profile.stages[i]
            if stage.model_free:  # takes no core; proposes after a commit with its measured rate
                played.append(StageModel(stage.name, sim.StageCost(LOOKUP_COST_S), "lookup", 0.0, None,
                                         pairs[position].proposal_rate))  # fmt: skip
                continue
            # measured t(n): not smooth on every CPU; and where measured, how it grows with the context
            played.append(StageModel(stage.name, stage_cost(stage), "model", stage.prefill_s_per_token,
                                     _fit(profile, i).contention, wake=stage.wake))  # fmt: skip
        accepting = [acceptance(p) for p in pairs]
        if tree_nodes:
            accepting[0] = tree_acceptance(profile, stages, tree_nodes)
        return cls(tuple(played), tuple(accepting), profile.handoff_s,
                   seeds=tuple(range(_seeds(pairs))), startup=SIDE_BY_SIDE, end_at_budget=True,
                   positions=stages)  # fmt: skip

    @classmethod
    def from_measurement(cls, measurement: fit.Measurement, two_rate: bool = True) -> Hierarchy:
        """Costs, acceptance and latencies of a measured run (``analysis.fit.measure_run``).

        A model stage's decode cost is its fitted t(n), its per-step overhead kept apart; a stage
        without a decode fit (it only prefilled) costs its mean prefill time per step. A pair that
        never verified a draft gets alpha 0. ``two_rate``: acceptance in runs (``fit.fit_two_rates``),
        else the i.i.d. MLE alpha.
        """
        return cls(tuple(_measured_stage(stage) for stage in measurement.stages),
                   tuple(_measured_acceptance(pair, two_rate) for pair in measurement.pairs),
                   measurement.handoff_s, measurement.dispatch_s)  # fmt: skip

    @classmethod
    def from_official(cls, measured: fit.OfficialMeasurement, acceptance: Sequence[sim.AcceptanceSpec],
                      seeds: Sequence[int] = (0,)) -> Hierarchy:  # fmt: skip
        """A published log's hierarchy: each model's mean logged step time as its step cost, each model on its
        own GPUs (no contention), no handoff, prefill or dispatch; ``acceptance`` per pair."""
        names = measured.log.model_names[-len(measured.step_mean_s):]
        stages = tuple(StageModel(name, sim.StageCost(t), contention=None)
                       for name, t in zip(names, measured.step_mean_s))  # fmt: skip
        return cls(stages, tuple(acceptance), seeds=tuple(seeds))


def stage_cost(stage: StageProfile) -> sim.TableCost | sim.ContextCost:
    """A profiled model stage's t(n): its measured table, with the growth per context token where the profile
    measured t(n) at a second context (`StageProfile.context_slopes`)."""
    table = sim.TableCost(stage.step_s_alone)
    if not stage.context_slopes:
        return table
    sizes, slopes = zip(*stage.context_slopes)
    return sim.ContextCost(table, stage.context_tokens, tuple(sizes), tuple(slopes))


def sample_cost(stage: StageProfile, prompt_tokens: int | None) -> tuple[float, ...] | sim.ContextCost:
    """What a sample's steps cost by the profile (`analysis.paired.speed_factor`): the stage's t(n) table, or
    where the profile measured how it grows with the context, its cost after `prompt_tokens` of prompt."""
    cost = stage_cost(stage)
    if isinstance(cost, sim.ContextCost) and prompt_tokens is not None:
        return cost.at_prompt(int(prompt_tokens))
    return stage.step_s_alone


def fitted_cost(cost: fit.CostFit, extra_fixed: float = 0.0) -> sim.StageCost:
    """The simulator's StageCost of a fitted t(n), with ``extra_fixed`` seconds added to every step.

    A negative intercept (possible with noisy data) is moved into the slope so that t(1) is kept and
    t(n) stays >= 0.
    """
    fixed, per_token = cost.fixed + extra_fixed, cost.per_token
    if fixed < 0:
        per_token, fixed = per_token + fixed, 0.0
    if per_token < 0:  # t decreasing in n is noise: keep the mean one-token cost
        fixed, per_token = fixed + per_token, 0.0
    if fixed + per_token <= 0:
        fixed = LOOKUP_COST_S
    return sim.StageCost(fixed, per_token)


def _measured_stage(stage: fit.StageFit) -> StageModel:
    if stage.kind == "lookup":
        return StageModel(stage.name, sim.StageCost(LOOKUP_COST_S), "lookup", 0.0, None, supply=stage.supply)
    if stage.cost is None:  # it only prefilled
        return StageModel(stage.name, sim.StageCost(max(stage.prefill_s, LOOKUP_COST_S)), "model",
                          stage.prefill_s_per_token or 0.0, 0.0, overhead_s=stage.step_overhead_s)  # fmt: skip
    return StageModel(stage.name, fitted_cost(stage.cost), "model", stage.prefill_s_per_token or 0.0,
                      stage.cost.contention, overhead_s=stage.step_overhead_s)  # fmt: skip


def _measured_acceptance(pair: fit.PairStats, two_rate: bool) -> sim.Bernoulli:
    single = pair.alpha.alpha if pair.alpha is not None else 0.0
    if not two_rate:
        return sim.Bernoulli(single)
    later = pair.alpha_next if math.isfinite(pair.alpha_next) else single
    first = pair.alpha_first if math.isfinite(pair.alpha_first) else single
    return TwoRateAcceptance(later, first)


def subset_pairs(profile: Profile, stages: Sequence[int]) -> list[PairProfile] | None:
    """The drafter/verifier pairs of the hierarchy made of `stages`; None where the profile lacks one."""
    pairs = [profile.pair(d, v) for d, v in zip(stages, stages[1:])]
    return None if any(p is None for p in pairs) else pairs


def check_stages(profile: Profile, stages: Sequence[int] | None) -> tuple[int, ...]:
    """Stage positions of a subset of the profile's hierarchy (default: all), smallest first, target last."""
    last = len(profile.stages) - 1
    if stages is None:
        return tuple(range(last + 1))
    stages = tuple(stages)
    if not stages or list(stages) != sorted(set(stages)) or stages[0] < 0 or stages[-1] != last:
        raise ConfigError(f"stages must be increasing positions in 0..{last} ending with the target ({last}), "
                          f"got {list(stages)}")  # fmt: skip
    if any(profile.stages[i].model_free for i in stages[1:]):
        raise ConfigError(f"stages {list(stages)}: a model-free stage can only be the first (it cannot verify)")
    if subset_pairs(profile, stages) is None:
        raise ConfigError(f"stages {list(stages)}: the profile has no acceptance for a pair of them (measure a "
                          "profile with skip_pairs: python -m experiments.profile)")  # fmt: skip
    return stages


def profile_contention(profile: Profile, stage: int) -> float:
    """The profile's contention of a model stage: its slowdown per other model stage computing (`_fit`)."""
    return _fit(profile, stage).contention


def _fit(profile: Profile, stage: int) -> fit.CostFit:
    """The stage's t(n) fit; its loaded points were measured with every other model stage of the profile
    running, and the simulator applies the contention per stage computing at the time."""
    return profile.stages[stage].cost_fit(sum(not s.model_free for s in profile.stages) - 1)


def acceptance(pair: PairProfile) -> sim.AlongContinuations | sim.ByPosition:
    """The simulator's acceptance for a pair: read off the profile's continuations where it has them
    (`sim.AlongContinuations`), else drawn from its rates by position."""
    if pair.runs:
        return sim.AlongContinuations(pair.runs, pair.acceptance_by_position, proposed=pair.proposed)
    return sim.ByPosition(pair.acceptance_by_position, proposed=pair.proposed)


def tree_acceptance(profile: Profile, stages: Sequence[int], tree_nodes: int) -> sim.TreeContinuations:
    """The simulator's acceptance for a first, model-free stage proposing token trees of `tree_nodes` nodes:
    the profile's tree measurement of that size (`analysis.profile.TreeRuns`), a `ConfigError` where the
    first stage is a model or the profile did not measure that size."""
    if isinstance(tree_nodes, bool) or not isinstance(tree_nodes, int) or tree_nodes < 0:
        raise ConfigError(f"tree_nodes must be an integer >= 0 (0 = a chain), got {tree_nodes!r}")
    first = profile.stages[stages[0]]
    if not first.model_free:
        raise ConfigError(f"tree_nodes is for a model-free first stage; {first.name} is a model")
    pair = subset_pairs(profile, stages)[0]
    measured = pair.tree(tree_nodes)
    if measured is None:
        sizes = [t.tree_nodes for t in pair.tree_runs]
        raise ConfigError(f"the profile has no token trees of {tree_nodes} nodes for {pair.drafter} -> "
                          f"{pair.verifier} (measured: {sizes or 'none'}; measure a profile again: "
                          "python -m experiments.profile)")  # fmt: skip
    if measured.paths:  # the drafter appends the tree's most likely path, and proposes on from its end
        return sim.TreeContinuations(measured.runs, pair.acceptance_by_position, measured.nodes,
                                     proposed=tree_proposals(measured.paths, measured.runs),
                                     path_runs=measured.path_runs, budget=tree_nodes)  # fmt: skip
    return sim.TreeContinuations(measured.runs, pair.acceptance_by_position, measured.nodes,
                                 proposed=tree_proposals(pair.proposed, measured.runs))  # fmt: skip


def tree_proposals(proposed: Sequence[Sequence[int]], runs: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], ...]:
    """What a drafter of token trees offers at each position of each continuation: its proposal (the tree's
    most likely path; in profiles measured without it, its chain's), or the depth of the tree's branch along
    the continuation where that is deeper (another branch: prompt lookup's several matches), so a
    verification keeps the whole branch. () where the proposals were not measured."""
    return tuple(tuple(max(p, r) for p, r in zip(chain, tree)) for chain, tree in zip(proposed, runs))


def _seeds(pairs: Sequence[PairProfile]) -> int:
    """Simulated generations: SEEDS, or one per profile continuation when there are more (its runs, or a
    model-free drafter's proposals along it where acceptance was learned by position)."""
    return max([SEEDS, *(max(len(p.runs), len(p.proposed)) for p in pairs)])
