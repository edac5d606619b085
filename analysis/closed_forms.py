"""The paper's closed forms (Eq. 1, 3, 4) extended, one measured ingredient at a time (no torch).

The paper's Eq. 3 is the steady state of a two-state chain over a verifier's steps (verify V, one-token
step S): after a verification the next step verifies with probability p_VV = a^(g+1) (every draft of the
window g and the bonus position agreed), after a one-token step with p_SV = a. Its steady state is

    rho = p_SV / (1 - p_VV + p_SV)        (`chain_rho`; Eq. 3 at p_VV = a^(g+1), p_SV = a)

Each extension below keeps that chain and replaces one of the paper's assumptions by a measured
distribution; none replaces Eq. 3 (`analysis.paper_model` keeps the paper's forms as they are):

- `lead_rho`: the window is not a fixed g but the drafter's lead at verify time, a distribution P(w)
  (drafts offered per verification): p_VV = sum_w P(w) a^(w+1);
- `position_rho`: acceptance is not one i.i.d. rate: draft p is accepted with its own rate a_p (given the
  drafts before it were): p_VV = sum_w P(w) prod_{p <= w+1} a_p, p_SV = a_1;
- `supply_rho`: whether the next step verifies is not set by acceptance alone but by whether drafts are
  waiting for the verifier (a verifier with lookahead >= 1 waits for them; a fast drafter refills its
  lead during a verification): p_VV = A q_full + (1 - A) q_reject, p_SV = q_single, with A the chance a
  verification keeps every draft and q_* the chance that drafts wait after a full verification, after a
  rejection and after a one-token step.

`tokens_per_verify` and `tokens_per_step` extend Eq. 1 / 4 the same way: tokens per verification
sum_{k=0..w} prod_{p <= k} a_p averaged over P(w), and per step (1 - rho) + rho times that.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from analysis import paper_model as pm
from analysis.fit import at_real_gamma

__all__ = ["chain_rho", "eq3_rho", "eq4_tokens_per_step", "eq6_tokens_per_step", "eq5_speedup", "lead_rho",
           "position_rho", "supply_rho", "all_accepted", "tokens_per_verify", "tokens_per_step", "normalised"]


def chain_rho(p_vv: float, p_sv: float) -> float:
    """The two-state chain's share of verifications: p_SV / (1 - p_VV + p_SV); nan where it has none (a chain
    that never leaves the state it starts in)."""
    denominator = 1.0 - p_vv + p_sv
    return p_sv / denominator if denominator > 0 else math.nan


def eq3_rho(alpha: float, gamma: float) -> float:
    """The paper's Eq. 3 at a real window (linear between the integer windows on either side)."""
    return at_real_gamma(pm.steady_state_rho, alpha, gamma)


def eq4_tokens_per_step(alpha: float, gamma: float) -> float:
    """The paper's Eq. 4: tokens per target step at Eq. 3's rho."""
    return at_real_gamma(pm.pipespec_tokens_per_step, alpha, gamma)


def eq6_tokens_per_step(alpha: float, gamma: float) -> float:
    """The paper's Eq. 6: the high-acceptance limit of Eq. 4 (every step a verification)."""
    return at_real_gamma(pm.pipespec_high_acceptance, alpha, gamma)


def eq5_speedup(alpha: float, gamma: float, speed_ratio: float) -> float:
    """The paper's Eq. 5: synchronous SD tokens per target-step time, c = draft tokens per target step."""
    return at_real_gamma(pm.sync_sd_throughput, alpha, gamma, speed_ratio)


def normalised(counts: Mapping[int, float]) -> dict[int, float]:
    """A distribution over windows from counts (or weights); a ValueError for an empty or zero one."""
    total = sum(counts.values())
    if total <= 0 or any(v < 0 for v in counts.values()):
        raise ValueError("a lead distribution needs non-negative counts with a positive total")
    return {int(w): v / total for w, v in sorted(counts.items()) if v > 0}


def _rate(rates: Sequence[float], position: int) -> float:
    """a_p for p = 1, 2, ...: the last measured rate holds past the positions measured."""
    if not rates:
        raise ValueError("acceptance by position needs at least one rate")
    return rates[min(position, len(rates)) - 1]


def all_accepted(rates: Sequence[float], window: int) -> float:
    """The paper's a^(w+1) with a rate per position: prod_{p = 1..w+1} a_p."""
    return math.prod(_rate(rates, p) for p in range(1, window + 2))


def tokens_per_verify(rates: Sequence[float], leads: Mapping[int, float]) -> float:
    """Eq. 1's verification term over the lead distribution: sum_w P(w) sum_{k=0..w} prod_{p <= k} a_p (the
    paper's (1 - a^(g+1)) / (1 - a) at one rate and one window)."""
    total = 0.0
    for window, weight in normalised(leads).items():
        run, expected = 1.0, 1.0
        for p in range(1, window + 1):
            run *= _rate(rates, p)
            expected += run
        total += weight * expected
    return total


def tokens_per_step(rho: float, rates: Sequence[float], leads: Mapping[int, float]) -> float:
    """Eq. 1 extended: (1 - rho) + rho * `tokens_per_verify`."""
    return (1.0 - rho) + rho * tokens_per_verify(rates, leads)


def lead_rho(alpha: float, leads: Mapping[int, float]) -> float:
    """Eq. 3 with the measured lead distribution in place of a fixed window: p_VV = sum_w P(w) a^(w+1)."""
    return position_rho([alpha], leads)


def position_rho(rates: Sequence[float], leads: Mapping[int, float]) -> float:
    """Eq. 3 with the lead distribution and acceptance by position: p_VV = sum_w P(w) prod_{p <= w+1} a_p,
    p_SV = a_1."""
    p_vv = sum(weight * all_accepted(rates, window) for window, weight in normalised(leads).items())
    return chain_rho(p_vv, _rate(rates, 1))


def supply_rho(kept_all: float, q_full: float, q_reject: float, q_single: float) -> float:
    """Eq. 3 with the drafts' supply: the next step verifies when drafts wait for the verifier, p_VV = A q_full
    + (1 - A) q_reject, p_SV = q_single (A: the chance a verification keeps every draft offered)."""
    return chain_rho(kept_all * q_full + (1.0 - kept_all) * q_reject, q_single)
