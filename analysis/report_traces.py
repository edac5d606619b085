"""What a sweep run's traces say about each drafter/verifier pair, per prompt (no torch).

For `analysis.report`: per verifier stage of a run, read from its step traces (`pipespec.trace`),

- the verification fraction rho and tokens per step, each with a 95% interval over the sweep's prompts
  (`prompt_interval`: the prompts resampled, every repetition of a prompt kept together);
- the acceptance rate alpha (the truncated-geometric maximum likelihood of `analysis.fit.fit_alpha`), and
  the acceptance rate by draft position: P(draft p kept | the drafts before it kept);
- the lead at verify time: the distribution of drafts offered per verification, and its mean (the paper's
  gamma as `analysis.fit` reads it);
- the chain's transitions: after a verification that kept every draft, after one that rejected a draft and
  after a one-token step, the share of next steps that verified (the paper's p_VV = a^(g+1), p_SV = a);
- the target's step costs: mean seconds of its one-token steps and of its verifications, and its busy
  share (step seconds over the samples' time).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from analysis.fit import fit_alpha
from analysis.paired import LEVEL, RESAMPLES

VERIFY, SINGLE = "verify", "single"


@dataclass
class PairReading:
    """One pair (drafter, verifier) of one run, pooled over its samples, with per-prompt counts kept."""

    drafter: str
    verifier: str
    verify: Counter = field(default_factory=Counter)  # per prompt: verifications
    single: Counter = field(default_factory=Counter)  # per prompt: one-token steps
    produced: Counter = field(default_factory=Counter)  # per prompt: tokens the verifier appended
    leads: Counter = field(default_factory=Counter)  # drafts offered per verification -> verifications
    tested: Counter = field(default_factory=Counter)  # draft position (1..) -> verifications that reached it
    kept: Counter = field(default_factory=Counter)  # draft position -> verifications that kept it
    next_verify: Counter = field(default_factory=Counter)  # "full" / "reject" / "single" -> next steps verifying
    next_steps: Counter = field(default_factory=Counter)  # the same -> next steps
    accepted: list[int] = field(default_factory=list)  # per verification, own token excluded
    offered: list[int] = field(default_factory=list)

    @property
    def prompts(self) -> list[str]:
        return sorted(set(self.verify) | set(self.single))

    @property
    def rho(self) -> float:
        steps = sum(self.verify.values()) + sum(self.single.values())
        return sum(self.verify.values()) / steps if steps else math.nan

    @property
    def tokens_per_step(self) -> float:
        steps = sum(self.verify.values()) + sum(self.single.values())
        return sum(self.produced.values()) / steps if steps else math.nan

    @property
    def alpha(self) -> float:
        return fit_alpha(self.accepted, self.offered).alpha if sum(self.offered) else math.nan

    @property
    def gamma(self) -> float:
        return sum(self.offered) / len(self.offered) if self.offered else math.nan

    @property
    def kept_all(self) -> float:
        """The share of verifications that kept every draft offered."""
        full = sum(a == o for a, o in zip(self.accepted, self.offered))
        return full / len(self.offered) if self.offered else math.nan

    def rates_by_position(self, minimum: int = 1) -> list[float]:
        """P(draft p kept | drafts before it kept), p = 1.., up to the last position reached by `minimum`
        verifications."""
        rates = []
        for p in range(1, max(self.tested, default=0) + 1):
            if self.tested[p] < minimum:
                break
            rates.append(self.kept[p] / self.tested[p])
        return rates

    def transition(self, after: str) -> float:
        """The share of steps after a `after` step ("full", "reject", "single") that verified (nan: none)."""
        return self.next_verify[after] / self.next_steps[after] if self.next_steps[after] else math.nan

    def rho_interval(self, seed: int = 0) -> tuple[float, float]:
        return prompt_interval(self.prompts, lambda p: (self.verify[p], self.verify[p] + self.single[p]), seed)

    def tokens_per_step_interval(self, seed: int = 0) -> tuple[float, float]:
        return prompt_interval(self.prompts, lambda p: (self.produced[p], self.verify[p] + self.single[p]), seed)

    def add_steps(self, prompt: str, kinds: Sequence[str], offered: Sequence[int], accepted: Sequence[int],
                  produced: Sequence[int]) -> None:  # fmt: skip
        """One sample's steps of the verifier (draft steps, a middle stage's own proposals, are skipped)."""
        previous: str | None = None
        for kind, n, kept, made in zip(kinds, offered, accepted, produced):
            if kind not in (VERIFY, SINGLE):
                continue
            if previous is not None:
                self.next_steps[previous] += 1
                self.next_verify[previous] += kind == VERIFY
            self.produced[prompt] += made
            if kind == SINGLE:
                self.single[prompt] += 1
                previous = SINGLE
                continue
            self.verify[prompt] += 1
            self.leads[n] += 1
            self.offered.append(n)
            self.accepted.append(kept)
            for p in range(1, min(kept + 1, n) + 1):
                self.tested[p] += 1
                self.kept[p] += p <= kept
            previous = "full" if kept == n else "reject"


@dataclass
class TargetTiming:
    """The target's steps in one run: one-token and verification seconds, busy and total seconds, steps."""

    single_s: list[float] = field(default_factory=list)  # decode steps that fed one token
    verify_s: list[float] = field(default_factory=list)  # steps that fed two tokens or more (prefill excluded)
    busy_s: float = 0.0  # every decode step's seconds (prefill excluded)
    time_s: float = 0.0  # the samples' generation time
    steps: int = 0  # decode steps (prefill excluded)
    tokens: int = 0  # output tokens

    @property
    def mean_step_s(self) -> float:
        return self.busy_s / self.steps if self.steps else math.nan

    @property
    def busy_share(self) -> float:
        return self.busy_s / self.time_s if self.time_s else math.nan

    @property
    def tokens_per_step(self) -> float:
        return self.tokens / self.steps if self.steps else math.nan


@dataclass
class RunReading:
    """A run's pairs and its target's timing."""

    pairs: list[PairReading]
    timing: TargetTiming


def _prompt(row: dict) -> str:
    slot = row.get("slot") or {}
    return str(slot.get("prompt") or row.get("sample_id", "?")).split("@")[0]


def add_timing(timing: TargetTiming, row: dict, trace) -> None:
    """The target's decode steps of one sample (its first model step, the prompt prefill, left out)."""
    steps = trace.steps
    model_rows = [r for r, fed in enumerate(steps["fed"]) if fed > 0][1:]
    for r in model_rows:
        seconds = steps["t_end"][r] - steps["t_start"][r]
        timing.busy_s += seconds
        (timing.single_s if steps["fed"][r] == 1 else timing.verify_s).append(seconds)
    timing.steps += len(model_rows)
    timing.tokens += int(row.get("new_tokens") or sum(steps["produced"]))
    timing.time_s += float(row.get("time_s") or (trace.end_time - trace.start_time))


def read_run(samples) -> RunReading:
    """``samples``: (row, stage traces) per sample, as `analysis.runs.Run.iter_traces` yields them."""
    pairs: list[PairReading] | None = None
    timing = TargetTiming()
    for row, traces in samples:
        traces = list(traces)
        if pairs is None:
            pairs = [PairReading(traces[i - 1].name, traces[i].name) for i in range(1, len(traces))]
        prompt = _prompt(row)
        for pair, trace in zip(pairs, traces[1:]):
            s = trace.steps
            pair.add_steps(prompt, s["kind"], s["offered"], s["accepted"], s["produced"])
        add_timing(timing, row, traces[-1])
    return RunReading(pairs or [], timing)


def prompt_interval(prompts: Sequence[str], counts: Callable[[str], tuple[float, float]], seed: int = 0,
                    resamples: int = RESAMPLES) -> tuple[float, float]:  # fmt: skip
    """The 95% interval of a pooled ratio sum(num) / sum(den) over prompts, the prompts resampled with
    replacement (every step of a prompt, all its repetitions, kept together); (nan, nan) without prompts."""
    if not prompts:
        return math.nan, math.nan
    pairs = np.array([counts(p) for p in prompts], dtype=float)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(prompts), size=(resamples, len(prompts)))
    num, den = pairs[picks, 0].sum(axis=1), pairs[picks, 1].sum(axis=1)
    ratios = num[den > 0] / den[den > 0]
    tail = (1 - LEVEL) / 2
    return float(np.quantile(ratios, tail)), float(np.quantile(ratios, 1 - tail))
