"""The simulator's step costs: stage i (0 = smallest drafter, K = target) spends ``t_i(n)`` seconds on a
forward pass over n input tokens, the stage's own tokens not yet in its KV cache (at least one) plus the
drafts it verifies, so a one-token step costs t_i(1) and verifying n drafts t_i(n + 1). ``StageCost``:
t(n) = fixed + per_token * n; ``TableCost``: a measured table; ``ContextCost``: either, grown with the
context the step attends to (the prompt plus the stage's cached tokens); ``RecordedSteps``: a recorded
trace's durations replayed in order. Prefill is not modelled. docs/analysis.md, "Fits and models".
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace

import numpy as np

from pipespec.schedule import step_cost


@dataclass(frozen=True)
class StageCost:
    """Step cost of one stage: t(n) = fixed + per_token * n seconds for n input tokens."""

    fixed: float
    per_token: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.fixed) and self.fixed >= 0):
            raise ValueError(f"fixed must be a finite number >= 0, got {self.fixed!r}")
        if not (math.isfinite(self.per_token) and self.per_token >= 0):
            raise ValueError(f"per_token must be a finite number >= 0, got {self.per_token!r}")
        if self.fixed + self.per_token <= 0:
            raise ValueError("a one-token step must take positive time (fixed + per_token > 0)")

    def __call__(self, n_tokens: int) -> float:
        return self.fixed + self.per_token * n_tokens


@dataclass(frozen=True)
class TableCost:
    """Step cost from a measured table, for CPUs whose t(n) is not smooth (a linear fit misses the jump
    from one row to two): t(n) = seconds[n - 1] up to the table's length, beyond it the last entry
    plus the table's mean slope."""

    seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.seconds or not all(math.isfinite(t) and t > 0 for t in self.seconds):
            raise ValueError(f"a cost table needs positive finite step times, got {self.seconds!r}")

    def __call__(self, n_tokens: int) -> float:
        return step_cost(self.seconds, max(int(round(n_tokens)), 1))


MIN_CONTEXT_SHARE = 0.5  # a step with less context than its cost was measured at costs at least this share of it


@dataclass(frozen=True)
class ContextCost:
    """A step cost that grows with the context the step attends to: ``cost(n)`` was measured with
    ``base_tokens`` tokens in the KV cache; each token of context beyond them adds the share ``slope(n)`` of
    it (fewer take it off, down to ``MIN_CONTEXT_SHARE`` of the cost). A share, not seconds, so that it holds
    at whatever speed the machine runs. ``slopes`` were measured at ``slope_sizes`` (ascending) and are
    interpolated linearly in n, the end values beyond them. ``prompt_tokens``: the context of a generation's
    first decode step (a step after g cached generated tokens attends to prompt_tokens + g); None: every step
    costs ``cost(n)``."""

    cost: StageCost | TableCost
    base_tokens: int
    slope_sizes: tuple[int, ...]
    slopes: tuple[float, ...]
    prompt_tokens: int | None = None

    def __post_init__(self) -> None:
        sizes, slopes = self.slope_sizes, self.slopes
        if not sizes or len(sizes) != len(slopes) or list(sizes) != sorted(set(sizes)) or min(sizes) < 1:
            raise ValueError(f"slope_sizes must be ascending sizes >= 1, one per slope, got {sizes!r} / {slopes!r}")
        if not all(math.isfinite(s) for s in slopes) or self.base_tokens < 0:
            raise ValueError(f"slopes must be finite and base_tokens >= 0, got {slopes!r} / {self.base_tokens!r}")

    def slope(self, n_tokens: int) -> float:
        """The share of its cost each token of context adds to a step feeding ``n_tokens``."""
        return float(np.interp(n_tokens, self.slope_sizes, self.slopes))

    def at_prompt(self, prompt_tokens: int | None) -> "ContextCost":
        return replace(self, prompt_tokens=prompt_tokens)

    def __call__(self, n_tokens: int, generated: int = 0) -> float:
        base = self.cost(n_tokens)
        if self.prompt_tokens is None:
            return base
        share = self.slope(n_tokens) * (self.prompt_tokens + generated - self.base_tokens)
        return base * max(1.0 + share, MIN_CONTEXT_SHARE)


def _as_cost(spec: StageCost | TableCost | ContextCost | float | tuple[float, float]
             ) -> StageCost | TableCost | ContextCost:
    if isinstance(spec, (StageCost, TableCost, ContextCost)):
        return spec
    if isinstance(spec, numbers.Real):
        return StageCost(float(spec))  # a plain number is a fixed step time
    return StageCost(*spec)


def _check_int(value: int, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or int(value) != value or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class RecordedSteps:
    """Step durations (seconds) replayed in order, cycling when exhausted: a stage's cost in place of
    ``StageCost`` when replaying a recorded trace (whatever the step feeds)."""

    durations: tuple[float, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "durations", tuple(float(d) for d in self.durations))
        if not self.durations or not all(math.isfinite(d) and d > 0 for d in self.durations):
            raise ValueError("durations must be a non-empty sequence of positive seconds")
