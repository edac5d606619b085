"""Our wall-clock predictor: tokens/s of greedy, sd and pipespec for any hierarchy (no torch).

    python -m analysis.predict PROFILE [strategy=pipespec] [lookahead=0] [max_lead=8] [tokens=128] [--json]
    python -m analysis.predict PROFILE --sweep [tokens=128] [--json]     # every configuration, best first

One input, a `Hierarchy`: per stage its step cost t(n), per-step overhead, prefill cost, CPU contention
and supply; per adjacent pair an acceptance model; the handoff latency of one message hop and the
dispatch time of a generate call. It is built from a machine profile before a run
(`Hierarchy.from_profile`), from the measurement of a run's traces (`Hierarchy.from_measurement`, an
in-sample decomposition) or from one of the authors' published logs (`Hierarchy.from_official`).
`predict` plays it in the discrete-event simulator (`analysis.simulate`, the engine's own schedule) and
returns one `Prediction`; `analysis.evaluate` sets it beside measured runs and the published logs.

The paper's model (`analysis.paper_model`) counts tokens per target step and prices every target step
the same. This predictor prices seconds and adds what the paper leaves out:

- per-stage step cost t_i(n) (a verification of n drafts costs more than a one-token step): a profile's
  measured table, or a run's fit t_i(n) = a_i + b_i n (`analysis.fit`) plus the stage's per-step overhead
  (message handling between its own steps); where the profile timed t(n) at two contexts, each step at its
  own context, the prompt plus the stage's cached tokens (`stage_cost`, `simulate.ContextCost`);
- CPU contention: a stage's step slows by (1 + s_i) per other stage computing at the same time, as
  processor sharing (the simulator's ``contention``); and a step after the stage waited costs (1 + w_i)
  (the simulator's ``wake``: 0 from a profile, whose t(n) is timed back to back; a run learns it);
- the rate at which each drafter can supply drafts (a model drafter: one token per t(1); prompt lookup:
  a drafter whose proposals cost ~0 and take no core, with a proposal after each commit with its
  supply probability), the waits of a verifier for its drafter (lookahead), the lead cap (max_lead) and
  discarded drafter steps: whichever stage is the bottleneck sets the pace;
- the handoff latency h of every message hop: the simulator's ``rollback_delay`` in pipespec; in sd
  2(k - 1) hops per lockstep round (`sd_handoff_s`), where a verifier's step follows a handoff whose
  latency holds its loop overhead, so only the first stage's drafting steps pay the per-step overhead;
- depth: every stage and pair enters, not only the last pair;
- acceptance read off a profile's continuations position by position (`simulate.AlongContinuations`),
  drawn from its rates by draft position (`simulate.ByPosition`), or in runs as fitted on a run
  (`TwoRateAcceptance`: a draft that starts a run is accepted with alpha_first, one that continues an
  agreeing run with alpha_next);
- start-up: the prompt prefill and the dispatch of a generate call, per sample (`Hierarchy.startup`);
- token trees (`tree_nodes`): a model-free first stage's trees cost its verifier t(uncached + nodes), and
  their accepted depth is read off the profile's tree measurements (`sim.TreeContinuations`); the sweep
  adds every measured tree size where the first stage is model-free.

Assumptions (each a known source of error): given its model, acceptance is independent of timing and
of which stage drafted the token; step costs and contention are measured averages, background load
included; a stage's prefill costs ``prefill_s_per_token`` x prompt tokens.

From a profile (`predict_profile`), the paper's model (Eq. 4 / Eq. 5, `analysis.fit.paper_tokens_per_s`)
is given beside, with alpha the mean of the last pair's per-position rates and gamma the lookahead (sd)
or max_lead (its counts: `paper_profile_counts`). A profile's prediction carries its speedup over greedy
and a 95% interval of both over the profile's prompts (`prompt_interval`: each simulated generation
follows one prompt's continuation, so the prompt-to-prompt spread of their times is the acceptance's
uncertainty carried through the schedule).

`--sweep` ranks greedy, sd windows `SD_WINDOWS` and pipespec `LOOKAHEADS` x `MAX_LEADS` on every subset
of the stages that keeps the target (e.g. skipping the middle stage of a k = 3 hierarchy); a subset
whose drafter/verifier pair the profile has no acceptance for (`skip_pairs`, older profiles) is left out
with a note. `draft_confidence` is refused: the simulator has no model of a drafter's own
confidence.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
import sys
from dataclasses import asdict, dataclass, replace
from typing import Sequence

import numpy as np

from analysis import fit
from analysis import simulate as sim
from analysis.fit import LOOKUP_COST_S, paper_tokens_per_s
from analysis.profile import PairProfile, Profile, ProfileError, StageProfile, load_profile, mismatches
from pipespec.errors import ConfigError
from pipespec.schedule import DEFAULT_MAX_LEAD, check_options

__all__ = [
    "TwoRateAcceptance",
    "StageModel",
    "Hierarchy",
    "Prediction",
    "fitted_cost",
    "simulate_generation",
    "sd_handoff_s",
    "startup_s",
    "predict",
    "predict_profile",
    "sweep",
    "main",
]

STRATEGIES = ("greedy", "sd", "pipespec")
SEEDS = 4  # simulated generations per profile prediction: the sampling noise of acceptance averages out
REPEAT_SEEDS = tuple(1000 * r for r in range(4))  # a measured run: four simulated repetitions of each sample
CRITICAL_PATH, SIDE_BY_SIDE = "critical path", "side by side"  # the start-up rules (`Hierarchy.startup`)
SD_WINDOWS = tuple(range(1, 9))  # the sweep's sd windows
LOOKAHEADS = (0, 1, 2, 4)  # the sweep's pipespec lookaheads ...
MAX_LEADS = (4, 8, 16)  # ... times these max_leads


# --------------------------------------------------------------------------- the input


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


# --------------------------------------------------------------------------- the prediction


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


# --------------------------------------------------------------------------- from a profile


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


def paper_alpha_gamma(profile: Profile, stages: Sequence[int], strategy: str, lookahead: int,
                      max_lead: int) -> tuple[float, int]:  # fmt: skip
    """The paper model's alpha (the mean of the last pair's per-position rates) and gamma (the lookahead in
    sd, max_lead in pipespec) for a configuration on the profile's `stages`."""
    alpha = statistics.mean(subset_pairs(profile, stages)[-1].acceptance_by_position)
    return alpha, lookahead if strategy == "sd" else max(max_lead, lookahead)


def paper_profile_tokens_per_s(profile: Profile, hierarchy: Hierarchy, strategy: str, lookahead: int,
                               max_lead: int) -> float:  # fmt: skip
    """The paper's model for a profile's sd or pipespec configuration: alpha the mean of the last pair's
    per-position rates, gamma the lookahead (sd) or max_lead (pipespec), t(1) from the profile."""
    t_target = hierarchy.stages[-1].cost(1)
    alpha, gamma = paper_alpha_gamma(profile, hierarchy.stage_positions, strategy, lookahead, max_lead)
    if not gamma:
        return 1.0 / t_target
    return paper_tokens_per_s(strategy, t_target, alpha, gamma, hierarchy.stages[-2].cost(1))


def paper_profile_counts(profile: Profile, stages: Sequence[int], strategy: str, lookahead: int,
                         max_lead: int) -> dict[str, float] | None:  # fmt: skip
    """The paper model's timing-free counts of the target for an sd or pipespec configuration (alpha, gamma:
    `paper_alpha_gamma`): tokens per verification (Eq. 1's verification term), target steps per generated
    token (sd: every step a verification; pipespec: one over Eq. 4) and the verification fraction (sd 1,
    pipespec Eq. 3's rho). None for greedy or a window of 0."""
    from analysis import paper_model as pm

    if strategy == "greedy":
        return None
    alpha, gamma = paper_alpha_gamma(profile, stages, strategy, lookahead, max_lead)
    if not gamma:
        return None
    per_verify = pm.expected_tokens_per_verify(alpha, gamma)
    per_step = per_verify if strategy == "sd" else pm.pipespec_tokens_per_step(alpha, gamma)
    rho = 1.0 if strategy == "sd" else pm.steady_state_rho(alpha, gamma)
    return {"mean_acceptance_length": per_verify, "target_steps_per_token": 1 / per_step, "verify_fraction": rho}


def predict_profile(profile: Profile, strategy: str = "pipespec", lookahead: int = 0,
                    max_lead: int = DEFAULT_MAX_LEAD, tokens: int = 128, stages: Sequence[int] | None = None,
                    draft_confidence: float = 0.0, prompt_tokens: int | None = None, size_verification: bool = False,
                    value_stop: float = 0.0, tree_nodes: int = 0) -> Prediction:  # fmt: skip
    """The predicted throughput of one configuration from a profile, prompt processing included
    (`prompt_tokens` per generation; None: the profile's mean prompt length); `stages`: a subset of the
    profile's (default all); `tree_nodes` > 0: its model-free first stage proposes token trees of that
    size (`tree_acceptance`). The paper's model is given beside (for chains)."""
    if draft_confidence or value_stop:
        check_options(strategy, len(profile.stages), lookahead, max_lead, draft_confidence, value_stop)
        what = "draft_confidence" if draft_confidence else "value_stop"
        raise ConfigError(f"{what} cannot be predicted: the simulator has no model of a drafter's own confidence "
                          f"or online estimates (leave it 0)")  # fmt: skip
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise ConfigError(f"tokens must be an integer >= 1, got {tokens!r}")
    if prompt_tokens is None:
        prompt_tokens = round(statistics.mean(profile.prompt_tokens)) if profile.prompt_tokens else 0
    if strategy == "greedy":  # the target alone: no contention
        check_options(strategy, len(profile.stages), lookahead, max_lead)
        stages = (len(profile.stages) - 1,)
    else:
        stages = check_stages(profile, stages)
        check_options(strategy, len(stages), lookahead, max_lead)
    tree_nodes = 0 if strategy == "greedy" else tree_nodes
    hierarchy = Hierarchy.from_profile(profile, stages, tree_nodes)
    prediction = predict(hierarchy, strategy, [tokens], [prompt_tokens], lookahead, max_lead,
                         size_verification=size_verification)  # fmt: skip
    paper = prediction.tokens_per_s if strategy == "greedy" else (
        paper_profile_tokens_per_s(profile, hierarchy, strategy, lookahead, max_lead))  # fmt: skip
    prediction = with_speedup(replace(prediction, paper_predicted_tokens_per_s=paper), profile, prompt_tokens)
    return replace(prediction, tree_nodes=tree_nodes)


def with_speedup(prediction: Prediction, profile: Profile, prompt_tokens: int) -> Prediction:
    """The prediction with its speedup over greedy (the target alone, the same tokens and prompt, from the
    same profile) and that speedup's interval."""
    greedy = prediction if prediction.strategy == "greedy" else predict(
        Hierarchy.from_profile(profile, (len(profile.stages) - 1,)), "greedy", [prediction.tokens], [prompt_tokens])
    base = greedy.tokens_per_s
    interval = prediction.tokens_per_s_interval
    return replace(prediction, speedup=prediction.tokens_per_s / base,
                   speedup_interval=None if interval is None else (interval[0] / base, interval[1] / base))


def stage_subsets(profile: Profile) -> tuple[list[tuple[int, ...]], list[str]]:
    """Every subset of >= 2 stages that keeps the target and can run (a model-free stage only first),
    and a note for each left out because the profile has no acceptance for one of its pairs."""
    last = len(profile.stages) - 1
    usable, notes = [], []
    for size in range(last, 0, -1):
        for drafters in itertools.combinations(range(last), size):
            stages = drafters + (last,)
            if any(profile.stages[i].model_free for i in stages[1:]):
                continue
            if subset_pairs(profile, stages) is None:
                names = " > ".join(profile.stages[i].name for i in stages)
                notes.append(f"left out {names}: the profile has no acceptance for one of its pairs "
                             "(measure it again to get skip_pairs)")  # fmt: skip
                continue
            usable.append(stages)
    return usable, notes


def configurations(profile: Profile) -> tuple[list[dict], list[str]]:
    """The sweep: greedy, then sd windows and pipespec lookahead x max_lead on every usable subset, each
    with chains and, where the subset's first stage is model-free and the profile measured its token
    trees, with every tree size measured (`tree_nodes`)."""
    subsets, notes = stage_subsets(profile)
    found = [{"strategy": "greedy", "lookahead": 0, "max_lead": DEFAULT_MAX_LEAD, "stages": None}]
    for stages in subsets:
        for trees in [0] + tree_sizes(profile, stages):
            tree = {"tree_nodes": trees} if trees else {}
            found += [{"strategy": "sd", "lookahead": w, "max_lead": DEFAULT_MAX_LEAD, "stages": stages, **tree}
                      for w in SD_WINDOWS]  # fmt: skip
            found += [{"strategy": "pipespec", "lookahead": la, "max_lead": lead, "stages": stages, **tree}
                      for la in LOOKAHEADS for lead in MAX_LEADS if lead >= la]  # fmt: skip
    return found, notes


def tree_sizes(profile: Profile, stages: Sequence[int]) -> list[int]:
    """The token-tree sizes the profile measured for the first pair of `stages` (none: its drafter is a model,
    or the profile has no tree measurements)."""
    if not profile.stages[stages[0]].model_free:
        return []
    return sorted(t.tree_nodes for t in subset_pairs(profile, stages)[0].tree_runs)


def sweep(profile: Profile, tokens: int = 128) -> tuple[list[Prediction], list[str]]:
    """Every configuration's prediction, best predicted tokens/s first (ties: the simpler one first)."""
    options, notes = configurations(profile)
    predictions = [predict_profile(profile, tokens=tokens, **o) for o in options]
    order = sorted(range(len(predictions)), key=lambda i: (-predictions[i].predicted_tokens_per_s, i))
    return [predictions[i] for i in order], notes


# --------------------------------------------------------------------------- command line


def _flag(value: str) -> bool:
    if value.lower() not in ("true", "false"):
        raise ValueError(value)
    return value.lower() == "true"


_flag.__name__ = "true or false"
OPTIONS = {"strategy": str, "lookahead": int, "max_lead": int, "tokens": int, "draft_confidence": float,
           "size_verification": _flag, "value_stop": float, "tree_nodes": int}  # fmt: skip


def parse_options(items: Sequence[str]) -> dict:
    options = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key not in OPTIONS:
            raise ConfigError(f"expected KEY=VALUE with KEY one of {list(OPTIONS)}, got {item!r}")
        try:
            options[key] = OPTIONS[key](value)
        except ValueError:
            raise ConfigError(f"{key} must be {OPTIONS[key].__name__}, got {value!r}") from None
    return options


def prediction_record(p: Prediction) -> dict:
    """A prediction as the `--json` record: the configuration and throughput first, then the details."""
    record = asdict(p)
    if not record["tree_nodes"]:  # chains: the record as before trees
        del record["tree_nodes"]
    head = ("strategy", "lookahead", "max_lead", "stages", "stage_indices", "tokens")
    return {**{key: record.pop(key) for key in head}, "predicted_tokens_per_s": p.predicted_tokens_per_s,
            "ms_per_token": p.ms_per_token, "mean_acceptance_length": record.pop("mean_acceptance_length"),
            "verify_fraction": record.pop("verify_fraction"), "target_busy": p.target_busy,
            "paper_predicted_tokens_per_s": record.pop("paper_predicted_tokens_per_s"), **record}  # fmt: skip


def _interval_text(p: Prediction) -> str:
    """' (95% 15.2-18.9 over the profile's prompts)' where the prediction has a width, else ''."""
    low, high = p.tokens_per_s_interval or (0.0, 0.0)
    return f" (95% {low:.1f}-{high:.1f} over the profile's prompts)" if high > low else ""


def format_prediction(p: Prediction) -> str:
    length = "-" if p.mean_acceptance_length is None else f"{p.mean_acceptance_length:.2f}"
    verify = "-" if p.verify_fraction is None else f"{p.verify_fraction:.2f}"
    tree = f" tree_nodes {p.tree_nodes}" if p.tree_nodes else ""
    return (f"{p.strategy} lookahead {p.lookahead} max_lead {p.max_lead}{tree} ({' > '.join(p.stages)}): "
            f"predicted {p.predicted_tokens_per_s:.1f} tokens/s{_interval_text(p)} ({p.ms_per_token:.1f} ms/token), "
            f"mean acceptance length {length}, verification fraction {verify}, target busy {p.target_busy:.0%}; "
            f"paper model {p.paper_predicted_tokens_per_s:.1f} tokens/s")  # fmt: skip


USAGE = ("usage: python -m analysis.predict PROFILE [strategy=...] [lookahead=N] [max_lead=N] [tokens=N] [--json]\n"
         "       python -m analysis.predict PROFILE --sweep [tokens=N] [--json]")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    as_json, as_sweep = "--json" in argv, "--sweep" in argv
    argv = [a for a in argv if a not in ("--json", "--sweep")]
    if not argv:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        profile = load_profile(argv[0])
        options = parse_options(argv[1:])
        if as_sweep and set(options) - {"tokens"}:
            raise ConfigError(f"--sweep takes only tokens=N, got {sorted(set(options) - {'tokens'})}")
        predictions, notes = sweep(profile, **options) if as_sweep else ([predict_profile(profile, **options)], [])
    except (ProfileError, ConfigError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for problem in mismatches(profile):
        print(f"warning: profile from elsewhere: {problem}", file=sys.stderr)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if as_json:
        records = [prediction_record(p) for p in predictions]
        print(json.dumps(records if as_sweep else records[0]))
    else:
        print("\n".join(f"{rank}. " * as_sweep + format_prediction(p) for rank, p in enumerate(predictions, 1)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
