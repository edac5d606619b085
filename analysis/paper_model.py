"""Closed-form performance model of PipeSpec (paper section 3) and of speculative decoding.

Every function is pure and takes plain floats/ints. Notation follows the paper
(arXiv 2505.01572) and the project notes (docs/pipespec-paper-notes.md):

- ``alpha`` (a): probability that a draft token is accepted by the next stage,
- ``gamma`` (g): number of draft tokens offered per verification (window),
- ``rho``: probability that a step of a verifier is a verification (rather
  than a plain single-token step),
- ``speed_ratio`` (c): draft tokens produced per target step (Eq. 5),
- ``cost_ratio`` (c'): t_draft / t_target (Leviathan et al. 2023); c' = 1 / c.

At ``alpha == 1`` the geometric sum (1 - a^(g+1)) / (1 - a) is evaluated as its
limit g + 1. Invalid arguments raise ``ValueError`` naming the argument.
"""

from __future__ import annotations

import math
import numbers

__all__ = [
    "expected_tokens_per_verify",
    "expected_tokens_per_step",
    "rho_step",
    "iterate_rho",
    "steady_state_rho",
    "pipespec_tokens_per_step",
    "sync_sd_throughput",
    "pipespec_high_acceptance",
    "leviathan_expected_tokens",
    "leviathan_walltime_improvement",
    "leviathan_optimal_gamma",
]


# --------------------------------------------------------------------------- validation


def _check_probability(value: float, name: str) -> float:
    """Return ``value`` as float if it is a probability in [0, 1], else raise naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number in [0, 1], got {value!r}")
    value = float(value)
    if not (0.0 <= value <= 1.0):  # also rejects NaN
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")
    return value


def _check_window(value: float, name: str = "gamma") -> int:
    """Return ``value`` as int if it is a non-negative integer (4 or 4.0), else raise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    if not math.isfinite(float(value)) or float(value) != int(value) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


def _check_positive(value: float, name: str) -> float:
    """Return ``value`` as float if it is finite and > 0, else raise naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    value = float(value)
    if not (math.isfinite(value) and value > 0.0):
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return value


def _check_non_negative(value: float, name: str) -> float:
    """Return ``value`` as float if it is finite and >= 0, else raise naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a non-negative number, got {value!r}")
    value = float(value)
    if not (math.isfinite(value) and value >= 0.0):
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return value


# --------------------------------------------------------------------------- building block


def expected_tokens_per_verify(alpha: float, gamma: int) -> float:
    """Expected tokens emitted by one verification of ``gamma`` drafts: (1 - a^(g+1)) / (1 - a).

    This is the verification term of Eq. (1) and Leviathan et al. 2023's
    expected tokens per target call: the accepted prefix (truncated geometric)
    plus the verifier's own correction/bonus token. Equals g + 1 at a = 1.
    """
    a = _check_probability(alpha, "alpha")
    g = _check_window(gamma)
    if a == 1.0:
        return float(g + 1)  # limit of the geometric sum
    return (1.0 - a ** (g + 1)) / (1.0 - a)


# --------------------------------------------------------------------------- PipeSpec, Eq. (1)-(4), (6)


def expected_tokens_per_step(rho: float, alpha: float, gamma: int) -> float:
    """Eq. (1): E[N(M_i)] = (1 - rho) * 1 + rho * (1 - a^(g+1)) / (1 - a).

    Expected tokens produced per step of stage i, which verifies with
    probability ``rho`` and otherwise takes a single-token step.
    """
    r = _check_probability(rho, "rho")
    return (1.0 - r) + r * expected_tokens_per_verify(alpha, gamma)


def rho_step(rho_prev: float, alpha: float, gamma: int) -> float:
    """Eq. (2): one step of rho(t_j) = rho(t_{j-1}) * a^(g+1) + (1 - rho(t_{j-1})) * a.

    Two-state Markov chain: after a verification the next step verifies again
    only if all g drafts and the bonus position agreed (a^(g+1)); after a
    single-token step it verifies if that token agreed with the drafter (a).
    """
    r = _check_probability(rho_prev, "rho_prev")
    a = _check_probability(alpha, "alpha")
    g = _check_window(gamma)
    return r * a ** (g + 1) + (1.0 - r) * a


def iterate_rho(alpha: float, gamma: int, steps: int, rho0: float | None = None) -> list[float]:
    """Eq. (2) iterated: [rho(t_0), rho(t_1), ..., rho(t_steps)], with rho(t_0) = a by default."""
    a = _check_probability(alpha, "alpha")
    n = _check_window(steps, "steps")
    r = a if rho0 is None else _check_probability(rho0, "rho0")
    trajectory = [r]
    for _ in range(n):
        r = rho_step(r, a, gamma)
        trajectory.append(r)
    return trajectory


def steady_state_rho(alpha: float, gamma: int) -> float:
    """Eq. (3): steady-state verification probability rho = a / (1 - a^(g+1) + a).

    The fixed point of Eq. (2); the denominator is >= 1 for a in [0, 1].
    """
    a = _check_probability(alpha, "alpha")
    g = _check_window(gamma)
    return a / (1.0 - a ** (g + 1) + a)


def pipespec_tokens_per_step(alpha: float, gamma: int) -> float:
    """Eq. (4): PipeSpec tokens per target step = (1 - rho) + rho * (1 - a^(g+1)) / (1 - a).

    Eq. (1) evaluated at the steady state rho of Eq. (3). Theorem 1: > 1 for
    0 < a < 1 and g > 0. Assumes every target step (verification or single
    token) costs the same time.
    """
    return expected_tokens_per_step(steady_state_rho(alpha, gamma), alpha, gamma)


def pipespec_high_acceptance(alpha: float, gamma: int) -> float:
    """Eq. (6): PipeSpec ~ (1 - a^(g+1)) / (1 - a), the rho -> 1 (high-acceptance) limit of Eq. (4)."""
    return expected_tokens_per_verify(alpha, gamma)


def sync_sd_throughput(alpha: float, gamma: int, speed_ratio: float) -> float:
    """Eq. (5): synchronous SD tokens per target-step time, (1 - a^(g+1)) / ((1 - a)(g / c + 1)).

    ``speed_ratio`` c = draft tokens produced per target step, so drafting a
    window of g tokens costs g / c target-step units.
    """
    c = _check_positive(speed_ratio, "speed_ratio")
    g = _check_window(gamma)
    return expected_tokens_per_verify(alpha, g) / (g / c + 1.0)


# --------------------------------------------------------------------------- Leviathan et al. 2023


def leviathan_expected_tokens(alpha: float, gamma: int) -> float:
    """Leviathan et al. 2023: expected tokens per target call, (1 - a^(g+1)) / (1 - a)."""
    return expected_tokens_per_verify(alpha, gamma)


def leviathan_walltime_improvement(alpha: float, gamma: int, cost_ratio: float) -> float:
    """Leviathan et al. 2023: walltime improvement (1 - a^(g+1)) / ((1 - a)(g * c' + 1)).

    ``cost_ratio`` c' = t_draft / t_target (time of one draft step relative to
    one target step); 0 means drafting is free.
    """
    cp = _check_non_negative(cost_ratio, "cost_ratio")
    g = _check_window(gamma)
    return expected_tokens_per_verify(alpha, g) / (g * cp + 1.0)


def leviathan_optimal_gamma(alpha: float, cost_ratio: float, max_gamma: int = 64) -> int:
    """Integer window in [0, max_gamma] maximising ``leviathan_walltime_improvement``.

    Exhaustive search (the improvement is unimodal but cheap to scan); ties go
    to the smallest window. With a = 1 or c' = 0 the optimum is ``max_gamma``
    if the improvement keeps growing.
    """
    _check_probability(alpha, "alpha")
    _check_non_negative(cost_ratio, "cost_ratio")
    upper = _check_window(max_gamma, "max_gamma")
    best_gamma, best_value = 0, -math.inf
    for g in range(upper + 1):
        value = leviathan_walltime_improvement(alpha, g, cost_ratio)
        if value > best_value * (1.0 + 1e-12):  # strict improvement only, so ties keep the smaller g
            best_gamma, best_value = g, value
    return best_gamma
