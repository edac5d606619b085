"""The one step-cost fit: ``t_i(n) = (a_i + b_i * n) * (1 + s_i * m)``, least squares over a stage's decode
steps (fed tokens n, seconds, m = other model stages computing during the step, time weighted); s_i, the
CPU contention factor, is fitted only where the stage ran both alone and overlapped (``MIN_REGIME_STEPS``
each). docs/analysis.md, "Fits and models".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


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
