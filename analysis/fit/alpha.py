"""Acceptance rates. ``alpha``: maximum likelihood under a truncated geometric, every offered draft accepted
independently until the first rejection, so a verification that accepts j of n offered drafts has
likelihood alpha^j (1 - alpha) if j < n, alpha^n if j = n; the MLE is S / (S + F), S drafts accepted, F
verifications that ended in a rejection (``estimate_alpha`` with the offered counts as window), its
standard error from the observed information (``fit_alpha``). ``alpha_first`` / ``alpha_next``:
acceptance in runs, a draft that starts a run against one that continues an agreeing run
(``fit_two_rates``). docs/concepts/metrics.md, "Acceptance".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence


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
