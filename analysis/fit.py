"""Estimation from measurements, and the paper's model checked against them (no torch).

From stage traces (``pipespec.trace``; our runs) and from the authors' published
logs (``analysis.import_official``) this module estimates, per adjacent pair
(drafter i-1, verifier i) and per stage:

- ``alpha``: per-token acceptance probability. Maximum likelihood under a
  truncated geometric: every offered draft is accepted independently with
  probability alpha until the first rejection, so a verification that accepts
  j of n offered drafts has likelihood alpha^j (1 - alpha) if j < n, alpha^n if
  j = n. The MLE is S / (S + F), S = drafts accepted, F = verifications that
  ended in a rejection (``estimate_alpha`` with the offered counts as
  window); its standard error comes from the observed information.
- ``rho``: verifications / (verifications + single-token steps) of the verifier.
- ``gamma``: the effective window, mean drafts offered per verification.
- tokens per step: tokens the verifier appended / its steps (Eq. 1 / 4's quantity).
- step cost ``t_i(n) = (a_i + b_i * n) * (1 + s_i * m)``: least squares over
  the stage's decode steps (fed tokens n, seconds, m = other model stages
  computing during the step, time weighted); s_i is the CPU contention
  factor (stages share the cores), fitted only where the stage ran both alone
  and overlapped. The first model step of a sample (the prompt prefill) is
  kept apart as a cost per prompt token.
- ``alpha_first`` / ``alpha_next``: acceptance in runs, a draft that starts a
  run (after a rejection or a one-token step) against one that continues an
  agreeing run (``fit_two_rates``).
- ``supply`` of a prompt-lookup stage: the chance it has a proposal when the
  next stage commits (proposals / steps of the next stage).
- two system costs the paper leaves out: the per-step overhead of a stage
  (message handling between its own steps) and the handoff latency of one
  message hop between stages.

``paper_comparison`` then sets the paper's predictions (Eq. 3 rho, Eq. 1 and 4
tokens per step, Eq. 5 / 6 throughput) beside the measured values, with
residuals. The paper's real-valued gamma is handled by linear interpolation
between the integer windows on either side (``paper_model`` takes integers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import median
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from analysis import import_official as official
from analysis import paper_model as pm
from pipespec.stats import StageStats
from pipespec.trace import StageTrace

__all__ = [
    "AlphaFit",
    "CostFit",
    "StageFit",
    "PairStats",
    "Measurement",
    "Comparison",
    "OfficialMeasurement",
    "estimate_alpha",
    "fit_alpha",
    "fit_two_rates",
    "fit_step_cost",
    "measure_traces",
    "measure_run",
    "measure_official",
    "official_window",
    "at_real_gamma",
    "paper_tokens_per_s",
    "paper_comparison",
    "paper_t1",
    "paper_run_tokens_per_s",
    "stage_t1",
]

LOOKUP_COST_S = 1e-4  # a prompt-lookup proposal takes microseconds; a floor keeps speed ratios finite


# --------------------------------------------------------------------------- alpha


def estimate_alpha(counts: Iterable[int], window: int | Sequence[int] | None = None) -> float:
    """Per-token acceptance rate alpha estimated from logged accepted counts.

    Assumption: every draft token is accepted independently with probability
    alpha, and a logged count k (>= 1) is j + 1, where j = drafts accepted and
    the + 1 is the verifier's own token. So j is geometric, truncated at the
    number of drafts offered.

    - ``window`` given (drafts offered per verification; one int, or one value
      per count): a verification with j >= window accepted everything offered
      and shows no rejection (censored). The maximum-likelihood estimate is
      alpha = S / (S + F), S = sum of j (accepted trials), F = number of
      verifications with j < window (observed rejections).
    - ``window`` None (offered count unknown, as in the async logs): every
      verification is taken to end in a rejection, alpha = mean(j) / (mean(j) + 1).
      This is a LOWER bound: verifications that ran out of drafts are
      counted as rejections.
    """
    counts = [int(k) for k in counts]
    if not counts:
        raise ValueError("counts must not be empty")
    if any(k < 1 for k in counts):
        raise ValueError("counts must be >= 1 (they include the verifier's own token)")
    if window is None:
        windows = [math.inf] * len(counts)
    elif isinstance(window, (int, float)):
        windows = [window] * len(counts)
    else:
        windows = list(window)
        if len(windows) != len(counts):
            raise ValueError(f"window has {len(windows)} values for {len(counts)} counts")
    if any(w < 0 for w in windows):
        raise ValueError("window must be >= 0")
    accepted = sum(k - 1 for k in counts)
    rejections = sum(1 for k, w in zip(counts, windows) if k - 1 < w)
    if accepted + rejections == 0:
        raise ValueError("counts carry no information on alpha (window 0)")
    return accepted / (accepted + rejections)


@dataclass(frozen=True)
class AlphaFit:
    """Truncated-geometric MLE of the per-token acceptance rate of one pair."""

    alpha: float
    stderr: float  # from the observed information; nan where alpha is 0 or 1
    verifications: int
    offered: int
    accepted: int
    rejections: int  # verifications that accepted fewer than they were offered


def fit_alpha(accepted: Sequence[int], offered: Sequence[int]) -> AlphaFit:
    """MLE of alpha from per-verification (accepted drafts, offered drafts); rows with offered 0 are ignored.

    ``accepted`` excludes the verifier's own token (as in our traces). Raises
    ValueError when no row offers anything or a row accepts more than offered.
    """
    if len(accepted) != len(offered):
        raise ValueError(f"accepted has {len(accepted)} rows, offered {len(offered)}")
    rows = [(int(j), int(n)) for j, n in zip(accepted, offered) if int(n) > 0]
    if not rows:
        raise ValueError("no verification offered any draft")
    if any(j < 0 or j > n for j, n in rows):
        raise ValueError("accepted must lie in [0, offered] on every row")
    alpha = estimate_alpha([j + 1 for j, _ in rows], window=[n for _, n in rows])
    successes = sum(j for j, _ in rows)
    failures = sum(1 for j, n in rows if j < n)
    # observed information of S log a + F log(1 - a)
    information = (successes / alpha**2 if alpha > 0 else math.inf) + (
        failures / (1 - alpha) ** 2 if alpha < 1 else math.inf
    )
    stderr = 1 / math.sqrt(information) if 0 < alpha < 1 else math.nan
    return AlphaFit(alpha, stderr, len(rows), sum(n for _, n in rows), successes, failures)


def fit_two_rates(
    accepted: Sequence[int], offered: Sequence[int], fresh: Sequence[bool] | None = None
) -> tuple[float, float]:
    """MLE of (alpha_first, alpha_next) of a two-state chain over draft positions.

    Acceptance comes in runs (prompt lookup above all: a copied span is either
    wrong at once or right for a while), which one alpha cannot express. A
    draft that starts a new run (the first draft of a verification that
    follows a rejection or a one-token step: ``fresh``) is accepted with
    probability alpha_first; a draft that continues an agreeing run (after an
    accepted draft, or first after a fully accepted verification) with
    alpha_next. ``fresh`` None: every verification starts a run. nan where a
    rate has no trials.
    """
    if fresh is None:
        fresh = [True] * len(accepted)
    rows = [(int(j), int(n), bool(f)) for j, n, f in zip(accepted, offered, fresh) if int(n) > 0]
    if not rows:
        raise ValueError("no verification offered any draft")
    first_trials = sum(1 for _, _, f in rows if f)
    first_accepted = sum(1 for j, _, f in rows if f and j >= 1)
    # continuing trials: the first draft of a non-fresh verification, and every draft after an accepted one
    next_accepted = sum(1 for j, _, f in rows if not f and j >= 1) + sum(max(j - 1, 0) for j, _, _ in rows)
    next_rejected = sum(1 for j, _, f in rows if not f and j == 0) + sum(1 for j, n, _ in rows if 1 <= j < n)
    next_trials = next_accepted + next_rejected
    return (first_accepted / first_trials if first_trials else math.nan,
            next_accepted / next_trials if next_trials else math.nan)


# --------------------------------------------------------------------------- step cost


@dataclass(frozen=True)
class CostFit:
    """t(n) = (fixed + per_token * n) * (1 + contention * m) seconds, fitted by least squares.

    m is the number of other model stages computing during the step (time
    weighted, from the traces). Where m hardly varied, ``contention`` is 0 and
    t(n) is the cost under the contention the run had.
    """

    fixed: float
    per_token: float
    points: int
    min_fed: int
    max_fed: int
    residual_std: float  # seconds
    contention: float = 0.0  # relative slowdown per other busy stage

    def __call__(self, n_tokens: float) -> float:
        return self.fixed + self.per_token * n_tokens

    @property
    def identifiable(self) -> bool:
        """False when all steps fed the same n: then per_token is set to 0 and t(n) is flat."""
        return self.max_fed > self.min_fed


MIN_GAPS = 10  # free gaps needed to time a stage's own per-step overhead
MIN_REGIME_STEPS = 5  # steps needed both alone and overlapped before a contention factor is fitted


def _linear_fit(x: np.ndarray, y: np.ndarray, scale: np.ndarray) -> tuple[float, float]:
    """Least squares y = (a + b x) * scale with a, b >= 0; b = 0 when x does not vary.

    A negative slope or intercept is noise (a forward pass never gets cheaper
    with more tokens): that parameter is then held at 0 and the other refitted,
    which keeps the mean cost at the n the run actually fed.
    """
    only_a = float(np.sum(y * scale) / np.sum(scale * scale))
    if np.ptp(x) == 0:
        return only_a, 0.0
    design = np.column_stack([scale, x * scale])
    (a, b), *_ = np.linalg.lstsq(design, y, rcond=None)
    if b < 0:
        return only_a, 0.0
    if a < 0:
        return 0.0, float(np.sum(y * x * scale) / np.sum((x * scale) ** 2))
    return float(a), float(b)


def fit_step_cost(fed: Sequence[float], seconds: Sequence[float], others: Sequence[float] | None = None) -> CostFit:
    """Least-squares t(n) = (a + b n)(1 + s m) over (fed tokens n, step seconds, other stages busy m).

    Plain least squares (not a median fit) on purpose: throughput depends on
    the mean step time, slow outliers included. With a single distinct n the
    slope is not identifiable and is set to 0. The contention factor s is only
    fitted (alternating least squares, s >= 0) when ``others`` is given and at
    least 5 steps ran mostly alone and 5 mostly overlapped; else s = 0.
    """
    x = np.asarray(fed, dtype=float)
    y = np.asarray(seconds, dtype=float)
    if x.shape != y.shape or x.size == 0:
        raise ValueError("fed and seconds must be non-empty and of equal length")
    m = np.zeros_like(x) if others is None else np.asarray(others, dtype=float)
    if m.shape != x.shape:
        raise ValueError("others must have one value per step")
    identifiable = min(int(np.sum(m < 0.5)), int(np.sum(m >= 0.5))) >= MIN_REGIME_STEPS
    contention = 0.0
    fixed, per_token = _linear_fit(x, y, np.ones_like(x))
    if identifiable:
        for _ in range(50):  # alternate: (a, b) given s, then s given (a, b); converges in a few rounds
            fixed, per_token = _linear_fit(x, y, 1.0 + contention * m)
            base = fixed + per_token * x
            denominator = float(np.sum((base * m) ** 2))
            updated = max(float(np.sum(base * m * (y - base)) / denominator), 0.0) if denominator > 0 else 0.0
            if abs(updated - contention) < 1e-6:
                contention = updated
                break
            contention = updated
        fixed, per_token = _linear_fit(x, y, 1.0 + contention * m)
    residual = y - (fixed + per_token * x) * (1.0 + contention * m)
    return CostFit(fixed, per_token, int(x.size), int(x.min()), int(x.max()), float(residual.std()), contention)


# --------------------------------------------------------------------------- measurement


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


# --------------------------------------------------------------------------- official logs


@dataclass
class OfficialMeasurement:
    """What the authors' logs allow to measure for one log file (no offered counts for async logs)."""

    log: official.OfficialLog
    step_mean_s: list[float]  # per stage, mean logged step time
    alphas: list[float]  # per pair: censored MLE where the window is known, else the lower bound
    alpha_is_lower_bound: list[bool]
    windows: list[int | None]  # drafts offered per verification where known
    accepted_per_verify: list[float]  # per pair, mean logged count minus the verifier's own token
    tokens: int
    time_s: float

    @property
    def ms_per_token(self) -> float:
        return 1000 * self.time_s / self.tokens

    @property
    def target_tokens_per_step(self) -> float:
        return self.tokens / len(official.step_times(self.log, len(self.step_mean_s) - 1))


def official_window(log: official.OfficialLog, pair: int) -> int | None:
    """Drafts offered per verification in a log, where the logs fix it.

    Synchronous ``chain`` logs: pair 0 is offered lookahead - 1 drafts
    (``import_official.sync_window``); a deeper verifier is offered a full
    window of ``lookahead`` tokens, because the reference's middle stage keeps
    generating until its output fills the window (its logged step time grows
    as its own acceptance falls, and no count exceeds lookahead + 1).
    Asynchronous logs: unknown (None).
    """
    if log.strategy != "chain":
        return None
    return official.sync_window(log, pair) if pair == 0 else log.lookahead


def measure_official(log: official.OfficialLog) -> OfficialMeasurement:
    n_stages = 1 if log.strategy == "greedy" else len(log.model_paths)
    alphas, lower, windows, accepted = [], [], [], []
    for pair in range(log.num_pairs):
        counts = official.accepted_counts(log, pair)
        window = official_window(log, pair)
        try:
            alphas.append(estimate_alpha(counts, window))
        except ValueError:  # a window of 0 drafts says nothing about alpha
            alphas.append(math.nan)
        lower.append(window is None)
        windows.append(window)
        accepted.append(float(np.mean(counts)) - 1.0)
    return OfficialMeasurement(
        log=log,
        step_mean_s=[float(np.mean(official.step_times(log, s))) for s in range(n_stages)],
        alphas=alphas,
        alpha_is_lower_bound=lower,
        windows=windows,
        accepted_per_verify=accepted,
        tokens=sum(s.tokens_generated for s in log.samples),
        time_s=sum(s.total_time for s in log.samples),
    )


# --------------------------------------------------------------------------- the paper's predictions


def at_real_gamma(function: Callable[..., float], alpha: float, gamma: float, *args: float) -> float:
    """``function(alpha, g, *args)`` at a real window g: linear interpolation between floor(g) and ceil(g)."""
    if not math.isfinite(gamma) or gamma < 0:
        raise ValueError(f"gamma must be a finite number >= 0, got {gamma!r}")
    low = math.floor(gamma)
    weight = gamma - low
    value = function(alpha, low, *args)
    if weight > 0:
        value = (1 - weight) * value + weight * function(alpha, low + 1, *args)
    return value


def paper_tokens_per_s(
    strategy: str, t_target_1: float, alpha: float | None = None, gamma: float | None = None,
    t_drafter_1: float | None = None, high_acceptance: bool = False,
) -> float:
    """The paper's throughput in tokens/s: its per-target-step figure divided by one target step t_K(1).

    greedy: 1 / t_K(1). sd: Eq. 5 with c = t_K(1) / t_{K-1}(1). pipespec: Eq. 4
    (Eq. 6 with ``high_acceptance``). Depth enters only through the last pair's
    alpha and gamma, as in the paper.
    """
    if strategy == "greedy":
        return 1.0 / t_target_1
    if alpha is None or gamma is None:
        raise ValueError(f"{strategy} needs alpha and gamma")
    if strategy == "sd":
        speed_ratio = t_target_1 / max(t_drafter_1 or LOOKUP_COST_S, LOOKUP_COST_S)
        return at_real_gamma(pm.sync_sd_throughput, alpha, gamma, speed_ratio) / t_target_1
    if strategy == "pipespec":
        per_step = pm.pipespec_high_acceptance if high_acceptance else pm.pipespec_tokens_per_step
        return at_real_gamma(per_step, alpha, gamma) / t_target_1
    raise ValueError(f"unknown strategy {strategy!r}")


@dataclass(frozen=True)
class Comparison:
    """One predicted-vs-measured figure."""

    quantity: str  # e.g. "rho (Eq. 3)"
    scope: str  # e.g. the pair "0:draft -> 1:target", or "run"
    predicted: float
    measured: float

    @property
    def residual(self) -> float:
        return self.predicted - self.measured

    @property
    def relative_error(self) -> float:
        return self.residual / self.measured if self.measured else math.nan


def paper_comparison(measurement: Measurement, strategy: str, t_target_1: float | None = None) -> list[Comparison]:
    """The paper's Eq. 3 rho, Eq. 1 / 4 tokens per step and Eq. 5 / 6 tokens/s beside the measured values.

    alpha: the pair's MLE; gamma: the measured mean offered per verification;
    t_K(1): ``t_target_1`` if given, else ``paper_t1`` of the run.
    """
    rows: list[Comparison] = []
    for pair in measurement.pairs:
        if pair.alpha is None or not pair.verify_steps:
            continue
        scope = f"{pair.drafter} -> {pair.verifier}"
        a, g = pair.alpha.alpha, pair.gamma
        rows.append(Comparison("rho (Eq. 3)", scope, at_real_gamma(pm.steady_state_rho, a, g), pair.rho))
        rows.append(Comparison("tokens/step (Eq. 1, measured rho)", scope,
                               at_real_gamma(lambda al, gg: pm.expected_tokens_per_step(pair.rho, al, gg), a, g),
                               pair.tokens_per_step))
        rows.append(Comparison("tokens/step (Eq. 4)", scope, at_real_gamma(pm.pipespec_tokens_per_step, a, g),
                               pair.tokens_per_step))
    predicted = paper_run_tokens_per_s(measurement, strategy, t_target_1=t_target_1)
    if predicted is not None:
        rows.append(Comparison(f"tokens/s ({PAPER_EQUATION[strategy]})", "run", predicted, measurement.tokens_per_s))
    if strategy == "pipespec":
        limit = paper_run_tokens_per_s(measurement, strategy, high_acceptance=True, t_target_1=t_target_1)
        if limit is not None:
            rows.append(Comparison("tokens/s (Eq. 6)", "run", limit, measurement.tokens_per_s))
    return rows


PAPER_EQUATION = {"greedy": "1/t_K(1)", "sd": "Eq. 5", "pipespec": "Eq. 4"}


def stage_t1(stage: StageFit) -> float | None:
    """t(1) of a stage: its fitted decode cost at n = 1; lookup stages cost ~0; None when unknown."""
    if stage.kind == "lookup":
        return LOOKUP_COST_S
    if stage.cost is None:
        return None
    return max(stage.cost(1), LOOKUP_COST_S)


MIN_SINGLE_STEPS = 5  # one-token steps needed to time t_K(1) directly


def paper_t1(measurement: Measurement) -> float | None:
    """The paper's time unit, one target step t_K(1): the mean of the run's own one-token target steps
    where it took at least 5, else the fitted cost at n = 1 (None when neither exists)."""
    target = measurement.target
    if target.single_steps >= MIN_SINGLE_STEPS:
        return target.single_step_s
    return stage_t1(target)


def paper_run_tokens_per_s(
    measurement: Measurement, strategy: str, high_acceptance: bool = False, t_target_1: float | None = None
) -> float | None:
    """The paper model's tokens/s for a measured run (None where its inputs are missing).

    ``t_target_1`` overrides the time unit (e.g. with a greedy run's one-token step).
    """
    t_target = t_target_1 if t_target_1 is not None else paper_t1(measurement)
    if t_target is None:
        return None
    if strategy == "greedy":
        return paper_tokens_per_s("greedy", t_target)
    last = measurement.pairs[-1] if measurement.pairs else None
    if last is None or last.alpha is None or not math.isfinite(last.gamma):
        return None
    t_drafter = stage_t1(measurement.stages[-2])
    return paper_tokens_per_s(strategy, t_target, last.alpha.alpha, last.gamma, t_drafter, high_acceptance)
