"""A run's measurement from its traces (``measure_traces``, ``measure_run``): per pair the acceptance rate
(`alpha`), rho (verifications / (verifications + single-token steps) of the verifier), gamma (mean drafts
offered per verification) and tokens per step; per stage its step-cost fit (`cost`), its prefill per
prompt token (the first model step of a sample, kept apart), a prompt-lookup stage's supply (the chance it
has a proposal when the next stage commits) and its per-step overhead (message handling between its own
steps); the handoff latency of one message hop. docs/analysis.md, "Fits and models".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import median
from typing import Iterable, Mapping, Sequence

import numpy as np

from analysis.fit.alpha import AlphaFit, fit_alpha, fit_two_rates
from analysis.fit.cost import CostFit, fit_step_cost
from pipespec.stats import StageStats
from pipespec.trace import StageTrace


MIN_GAPS = 10  # free gaps needed to time a stage's own per-step overhead


@dataclass
class StageFit:
    """What one stage did, pooled over samples (`counts`), and the costs fitted to its steps."""

    name: str
    kind: str  # "model" or "lookup" (prompt lookup: never feeds the model, fed = 0)
    counts: StageStats  # pipespec.stats: the one pooled statistics type
    cost: CostFit | None  # decode steps; None for lookup stages or stages without decode steps
    prefill_s_per_token: float | None  # first model step of each sample: seconds / tokens fed
    prefill_s: float  # mean duration of that first step
    step_overhead_s: float  # median gap between own consecutive steps that no other stage's step ended in
    proposals: int  # lookup stages: proposals made (each a 'draft' row)
    single_steps: int = 0  # one-token steps (kind single, or a greedy step) after the prefill
    single_step_s: float = math.nan  # their mean duration
    supply: float | None = None  # lookup stages: proposals per step of the next stage (each step commits to it)

    @property
    def steps(self) -> int:
        return self.counts.steps

    @property
    def busy_s(self) -> float:
        return self.counts.busy_s

    @property
    def wall_s(self) -> float:
        return self.counts.wall_s

    @property
    def produced(self) -> int:
        return self.counts.produced

    @property
    def busy_fraction(self) -> float:
        value = self.counts.busy_fraction
        return math.nan if value is None else value

    @property
    def mean_proposal(self) -> float:
        return self.produced / self.proposals if self.proposals else math.nan


@dataclass
class PairStats:
    """One adjacent pair (drafter, verifier), pooled over samples."""

    drafter: str
    verifier: str
    alpha: AlphaFit | None  # None when no draft was ever offered
    rho: float  # measured verification fraction of the verifier
    gamma: float  # mean drafts offered per verification (nan without verifications)
    accepted_per_verify: float  # mean drafts accepted per verification (own token excluded)
    tokens_per_step: float  # tokens the verifier appended per step
    verify_steps: int
    single_steps: int
    accepted_counts: list[int] = field(default_factory=list, repr=False)  # per verification, own token excluded
    offered_counts: list[int] = field(default_factory=list, repr=False)
    alpha_first: float = math.nan  # fit_two_rates: acceptance of a draft that starts a run
    alpha_next: float = math.nan  # and of a draft that continues an agreeing run


@dataclass
class Measurement:
    """Everything measured from one set of traces (one run), stage order smallest first."""

    stages: list[StageFit]
    pairs: list[PairStats]
    tokens: int  # output tokens, summed over samples
    time_s: float  # generation time, summed over samples
    samples: int
    prompt_tokens: int  # summed over samples (0 where unknown)
    handoff_s: float  # median latency of one message hop between stages (0 where none was seen)
    dispatch_s: float  # mean per sample of generation time minus the target's own wall time (job and result)
    sample_tokens: list[int] = field(default_factory=list)
    sample_time_s: list[float] = field(default_factory=list)
    sample_prompt_tokens: list[int] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.time_s if self.time_s > 0 else math.nan

    @property
    def target(self) -> StageFit:
        return self.stages[-1]

    @property
    def target_tokens_per_step(self) -> float:
        return self.pairs[-1].tokens_per_step if self.pairs else self.target.produced / max(self.target.steps, 1)


def _durations(trace: StageTrace) -> list[float]:
    return [e - s for s, e in zip(trace.steps["t_start"], trace.steps["t_end"])]


def _is_lookup(trace: StageTrace) -> bool:
    # a prompt-lookup stage only writes draft rows that feed nothing to a model
    kinds, fed = trace.steps["kind"], trace.steps["fed"]
    return bool(kinds) and all(k == "draft" for k in kinds) and all(f == 0 for f in fed)


def _overlap(stage: int, traces: Sequence[StageTrace]) -> list[float]:
    """Per step of ``stage``: other model stages computing during it (time weighted, 0..k-1)."""
    others = [tr.steps for i, tr in enumerate(traces) if i != stage and not _is_lookup(tr) and tr.steps["kind"]]
    return overlap_with(traces[stage].steps, others)


def overlap_with(own: Mapping[str, Sequence[float]], others: Sequence[Mapping[str, Sequence[float]]]) -> list[float]:
    """Per step of `own` (trace columns): how many of the `others` (the other model stages' columns) computed
    during it, time weighted (0 .. len(others))."""
    intervals = [(np.asarray(steps["t_start"], dtype=float), np.asarray(steps["t_end"], dtype=float))
                 for steps in others]  # fmt: skip
    result = []
    for start, end in zip(own["t_start"], own["t_end"]):
        duration = end - start
        if duration <= 0 or not intervals:
            result.append(0.0)
            continue
        covered = 0.0
        for starts, ends in intervals:
            covered += float(np.sum(np.clip(np.minimum(ends, end) - np.maximum(starts, start), 0.0, None)))
        result.append(covered / duration)
    return result


def _free_gaps(stage: int, traces: Sequence[StageTrace]) -> list[float]:
    """Gaps between consecutive steps of ``stage`` during which no other stage finished a step.

    Such a gap cannot be a wait for a neighbour's message: it is the stage's own
    per-step overhead (publishing, reading messages, scheduling).
    """
    own = traces[stage].steps
    others = sorted(t for i, tr in enumerate(traces) if i != stage for t in tr.steps["t_end"])
    gaps = []
    for end, start in zip(own["t_end"][:-1], own["t_start"][1:]):
        position = np.searchsorted(others, end, side="right")
        if position < len(others) and others[position] < start:
            continue  # someone finished in between: possibly a wait
        gaps.append(max(start - end, 0.0))
    return gaps


def _handoffs(traces: Sequence[StageTrace]) -> list[float]:
    """Latencies of message hops: a stage that sat idle until a neighbour finished, from that end to its start."""
    latencies = []
    for i, trace in enumerate(traces):
        neighbours = [traces[j] for j in (i - 1, i + 1) if 0 <= j < len(traces)]
        ends = sorted(t for tr in neighbours for t in tr.steps["t_end"])
        if not ends:
            continue
        previous_end = trace.start_time
        for start, end in zip(trace.steps["t_start"], trace.steps["t_end"]):
            position = np.searchsorted(ends, start, side="right") - 1
            if position >= 0 and ends[position] > previous_end:
                # idle from its own last step until after a neighbour's step ended: it waited for that message
                latencies.append(start - ends[position])
            previous_end = end
    return latencies


@dataclass
class _StageSteps:
    """One stage's steps pooled over samples, as ``measure_traces`` collects them."""

    fed: list[int] = field(default_factory=list)  # decode steps after the prefill: tokens fed to the model
    sec: list[float] = field(default_factory=list)  # their durations
    others: list[float] = field(default_factory=list)  # other model stages computing during each (time weighted)
    single: list[float] = field(default_factory=list)  # durations of the one-token steps among them
    prefill_fed: list[int] = field(default_factory=list)  # per sample, the first model step
    prefill_sec: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)  # free gaps between own steps (``_free_gaps``)
    counts: StageStats = field(default_factory=StageStats)
    proposals: int = 0  # prompt lookup: proposals made
    lookup: bool = True  # every sample's trace so far was a prompt lookup's (or empty)
    kinds: list[str] = field(default_factory=list)  # every step: kind, offered, accepted, starts a run
    offered: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    fresh: list[bool] = field(default_factory=list)

    def add(self, stage: int, traces: Sequence[StageTrace], sample_new: int) -> None:
        """Add the steps of ``traces[stage]``, one sample's trace of this stage."""
        trace = traces[stage]
        steps = trace.steps
        durations = _durations(trace)
        self.counts += StageStats.from_trace(trace, sample_new)
        self.lookup = self.lookup and (_is_lookup(trace) or not steps["kind"])
        self.kinds.extend(steps["kind"])
        self.offered.extend(steps["offered"])
        self.accepted.extend(steps["accepted"])
        self.fresh.extend(_starts_run(steps))
        if _is_lookup(trace):
            self.proposals += len(durations)
        model_rows = [r for r, f in enumerate(steps["fed"]) if f > 0]
        if model_rows:
            overlap = _overlap(stage, traces)
            first = model_rows[0]  # the prompt prefill (plus any drafts verified with it)
            self.prefill_fed.append(steps["fed"][first])
            self.prefill_sec.append(durations[first])
            for r in model_rows[1:]:
                self.fed.append(steps["fed"][r])
                self.sec.append(durations[r])
                self.others.append(overlap[r])
                if steps["fed"][r] == 1 and steps["offered"][r] == 0 and steps["kind"][r] != "draft":
                    self.single.append(durations[r])
        self.gaps.extend(_free_gaps(stage, traces))

    def stage_fit(self, name: str, pooled_overhead: float) -> StageFit:
        """The pooled steps as a ``StageFit``: kind, t(n) fit, prefill cost, per-step overhead."""
        kind = "lookup" if self.lookup and self.counts.steps else "model"
        cost = fit_step_cost(self.fed, self.sec, self.others) if self.fed and kind == "model" else None
        prefill_tokens = sum(self.prefill_fed)
        return StageFit(
            name=name,
            kind=kind,
            counts=self.counts,
            cost=cost,
            prefill_s_per_token=sum(self.prefill_sec) / prefill_tokens if prefill_tokens else None,
            prefill_s=float(np.mean(self.prefill_sec)) if self.prefill_sec else 0.0,
            step_overhead_s=float(median(self.gaps)) if len(self.gaps) >= MIN_GAPS else pooled_overhead,
            proposals=self.proposals,
            single_steps=len(self.single),
            single_step_s=float(np.mean(self.single)) if self.single else math.nan,
        )


@dataclass
class _SampleTotals:
    """Per-sample figures and latencies, as ``measure_traces`` collects them."""

    tokens: int = 0
    time_s: float = 0.0
    prompt_tokens: int = 0
    sample_tokens: list[int] = field(default_factory=list)
    sample_times: list[float] = field(default_factory=list)
    sample_prompts: list[int] = field(default_factory=list)
    handoffs: list[float] = field(default_factory=list)
    dispatch: list[float] = field(default_factory=list)

    def add(self, row: dict | None, traces: Sequence[StageTrace], sample_new: int) -> None:
        target = traces[-1]
        self.handoffs.extend(_handoffs(traces))
        sample_time = float(row["time_s"]) if row and "time_s" in row else target.end_time - target.start_time
        sample_prompt = int(row.get("prompt_tokens") or 0) if row else 0
        self.dispatch.append(max(sample_time - (target.end_time - target.start_time), 0.0))
        self.tokens += sample_new
        self.time_s += sample_time
        self.prompt_tokens += sample_prompt
        self.sample_tokens.append(sample_new)
        self.sample_times.append(sample_time)
        self.sample_prompts.append(sample_prompt)


def _sample_new_tokens(row: dict | None, traces: Sequence[StageTrace]) -> int:
    """Output tokens of one sample: its row's new_tokens, else the tokens the target appended."""
    return int(row["new_tokens"]) if row and "new_tokens" in row else sum(traces[-1].steps["produced"])


def _collect(
    samples: Iterable[tuple[dict | None, Sequence[StageTrace]]],
) -> tuple[list[str], list[_StageSteps], _SampleTotals]:
    """Pool the samples' traces per stage: (stage names, per-stage steps, per-sample totals)."""
    names: list[str] = []
    per_stage: list[_StageSteps] | None = None
    totals = _SampleTotals()
    for row, traces in samples:
        traces = list(traces)
        if per_stage is None:
            per_stage = [_StageSteps() for _ in traces]
            names = [t.name for t in traces]
        if len(traces) != len(per_stage):
            raise ValueError(f"a sample has {len(traces)} stage traces, an earlier one {len(per_stage)}")
        sample_new = _sample_new_tokens(row, traces)
        for i, steps in enumerate(per_stage):
            steps.add(i, traces, sample_new)
        totals.add(row, traces, sample_new)
    if per_stage is None:
        raise ValueError("no samples")
    return names, per_stage, totals


def _set_supply(stages: Sequence[StageFit]) -> None:
    """A lookup stage's supply: every step of the next stage commits to it, and it then proposes if it finds a match."""
    for stage, successor in zip(stages, stages[1:]):
        if stage.kind == "lookup" and successor.steps:
            stage.supply = min(stage.proposals / successor.steps, 1.0)


def measure_traces(samples: Iterable[tuple[dict | None, Sequence[StageTrace]]]) -> Measurement:
    """Pool per-sample stage traces into a ``Measurement``.

    ``samples`` yields (sample row or None, stage traces); the row supplies
    new_tokens, time_s and prompt_tokens where present, else they come from the
    traces (tokens appended by the target, the target's wall time).
    """
    names, per_stage, totals = _collect(samples)
    # a stage with few free gaps (a verifier that mostly waits) borrows the pooled median: it is a machine constant
    pooled_gaps = [g for steps in per_stage for g in steps.gaps]
    pooled_overhead = float(median(pooled_gaps)) if pooled_gaps else 0.0
    stages = [steps.stage_fit(name, pooled_overhead) for name, steps in zip(names, per_stage)]
    _set_supply(stages)
    return Measurement(
        stages=stages,
        pairs=[_pair_stats(names[i - 1], names[i], per_stage[i]) for i in range(1, len(per_stage))],
        tokens=totals.tokens,
        time_s=totals.time_s,
        samples=len(totals.sample_tokens),
        prompt_tokens=totals.prompt_tokens,
        handoff_s=float(median(totals.handoffs)) if totals.handoffs else 0.0,
        dispatch_s=float(np.mean(totals.dispatch)) if totals.dispatch else 0.0,
        sample_tokens=totals.sample_tokens,
        sample_time_s=totals.sample_times,
        sample_prompt_tokens=totals.sample_prompts,
    )


def _starts_run(steps: dict) -> list[bool]:
    """Per step: does its first offered draft start a new run? Only after a fully accepted verification
    does the drafter continue an agreeing run; after a rejection or a one-token step it starts afresh."""
    fresh, previous_full = [], False
    for kind, offered, accepted in zip(steps["kind"], steps["offered"], steps["accepted"]):
        fresh.append(not previous_full)
        previous_full = kind == "verify" and accepted == offered
    return fresh


def _pair_stats(drafter: str, verifier: str, verifier_steps: _StageSteps) -> PairStats:
    counts = verifier_steps.counts
    rows = [r for r, k in enumerate(verifier_steps.kinds) if k == "verify"]
    accepted = [verifier_steps.accepted[r] for r in rows]
    offered = [verifier_steps.offered[r] for r in rows]
    steps = counts.verify_steps + counts.single_steps
    fresh = [verifier_steps.fresh[r] for r in rows]
    first, later = fit_two_rates(accepted, offered, fresh) if sum(offered) > 0 else (math.nan, math.nan)

    def nan_if_none(value):
        return math.nan if value is None else value

    return PairStats(
        drafter=drafter,
        verifier=verifier,
        alpha=fit_alpha(accepted, offered) if sum(offered) > 0 else None,
        rho=nan_if_none(counts.verify_fraction) if steps else math.nan,
        gamma=nan_if_none(counts.mean_offered_per_verify),
        accepted_per_verify=nan_if_none(counts.mean_acceptance_length) - 1 if rows else math.nan,
        tokens_per_step=counts.produced / counts.steps if counts.steps else math.nan,
        verify_steps=counts.verify_steps,
        single_steps=counts.single_steps,
        accepted_counts=accepted,
        offered_counts=offered,
        alpha_first=first,
        alpha_next=later,
    )


def measure_run(run) -> Measurement:
    """``measure_traces`` over every sample of an ``analysis.runs.Run``."""
    return measure_traces(run.iter_traces())
