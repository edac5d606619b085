"""The outcome of one simulated generation (`SimResult`): time, steps and discarded steps per stage, busy
and verification fractions, and per pair the accepted and offered counts of every verification.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class SimResult:
    """Outcome of one simulated generation.

    Per-stage tuples have one entry per stage (0 = first drafter, last =
    target); per-pair tuples one entry per adjacent pair (drafter i-1,
    verifier i), i.e. per verifier stage 1..K.
    """

    strategy: str
    total_time: float  # seconds until the target holds max_new_tokens tokens
    tokens_generated: int  # = max_new_tokens (output truncated to the budget)
    committed_tokens: int  # tokens the target committed, including the last step's overshoot
    steps: tuple[int, ...]  # completed steps per stage, discarded ones included
    discarded_steps: tuple[int, ...]  # steps whose result was dropped because of a rollback
    busy_fraction: tuple[float, ...]  # time computing / total_time
    verify_fraction: tuple[float, ...]  # rho per verifier: verifications / applied steps
    accepted_per_verify: tuple[float, ...]  # per pair: mean accepted drafts + 1 (as the logs count)
    offered_per_verify: tuple[float, ...]  # per pair: mean drafts offered per verification
    rejections: tuple[int, ...]  # per pair: verifications that ended at a mismatch
    accepted_counts: tuple[tuple[int, ...], ...]  # per pair: every accepted count (own token included)
    offered_counts: tuple[tuple[int, ...], ...]  # per pair: drafts offered, same order as accepted_counts
    step_offers: tuple[tuple[int, ...], ...] = ()  # per verifier: drafts offered per applied step (0: single)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens_generated / self.total_time

    @property
    def target_steps(self) -> int:
        return self.steps[-1] - self.discarded_steps[-1]

    @property
    def tokens_per_target_step(self) -> float:
        """Committed tokens per applied target step (the paper's Eq. 4 quantity)."""
        return self.committed_tokens / self.target_steps


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan
