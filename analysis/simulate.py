"""Discrete-event simulator of PipeSpec, synchronous (tiered) chain SD and autoregressive decoding.

Pure Python + numpy, deterministic under a seed. Tokens are abstract: every
token is a unique integer id created once, by one stage, at one position, on
one context. Copies (a verifier accepting a draft, a stage rolling back to a
later stage's output) keep the id, so two buffers that hold the same id at
position q agree on all positions <= q. Prefix checks are therefore O(1) and a
rollback only touches the tokens that differ.

Time model
----------
Stage i (0 = smallest drafter, K = target) spends ``t_i(n) = fixed + per_token * n``
seconds on a forward pass over n input tokens (``StageCost``; ``TableCost``: a measured
table). The input of a step is the stage's own tokens not yet in its KV cache (at least
one; usually its last own token) plus the drafts it verifies, so a plain one-token step
costs t_i(1) and verifying n drafts costs t_i(n + 1). A ``ContextCost`` adds the cost of
the context the step attends to: the prompt plus the stage's cached tokens. Prefill is
not modelled.

Acceptance model (i.i.d. assumption)
------------------------------------
For the pair (i-1, i), every draft token stage i is offered is accepted
independently with probability alpha_i (``Bernoulli``), regardless of where
the token came from: a token that stage i-1 accepted from stage i-2 is
accepted by stage i with probability alpha_i, independent of what happened
before. A verification of n drafts therefore accepts a geometric prefix
j <= n, and the verifier appends its own token (the correction at the first
mismatch, or the bonus token if all n matched). When a stage appends an own
token at a position where its drafter already holds a (consistent) token,
the two agree with probability alpha_i (the drafter's token would have been
accepted); otherwise the drafter is rolled back. ``Replay`` instead replays a
logged sequence of accepted counts (own token included) verification by
verification: count k accepts min(k - 1, n) of the n offered drafts. ``AlongContinuations`` reads
acceptance off a profile's continuations; ``TreeContinuations`` does for a verifier of a model-free
drafter's token trees, whose step feeds the tree's nodes (its cost is t(uncached + nodes)) where its
buffer ends at the drafter's tree root, and the chain the drafter holds where it does not.

Strategies
----------
- ``simulate_autoregressive``: the target alone, one t(1) step per token.
- ``simulate_sync_sd``: lockstep rounds. Stage 0 drafts ``gamma`` tokens one
  step at a time, then stages 1..K verify in turn (each takes everything its
  predecessor holds beyond the committed output), then every stage rolls back
  to the target's output. Rounds never overlap.
- ``simulate_pipespec``: all stages run concurrently. Stage 0 drafts one token
  per step, continuously, while its lead over stage 1 is below ``max_lead``.
  A verifier takes all drafts beyond its committed output (at most
  ``verify_window`` if set); if fewer than ``lookahead`` are available and its
  drafter is still producing it waits; with nothing available it takes a
  single-token step (never blocks when ``lookahead`` is 0). Non-target stages
  also stop at ``max_lead`` tokens ahead of their successor. After every step
  a stage sends its output upstream; a stage whose buffer disagrees rolls back
  to it (KV cache cropped, in-flight step discarded when it completes) and
  forwards the rollback further upstream. Each hop takes ``rollback_delay``
  seconds (0: immediate, the whole cascade at once).

Both schedules run the engine's own rules, each stage a ``SimulatedStage``: the next action,
the view it is decided from and when a stage commits upstream (``pipespec.schedule``), the drafts
a verifier is offered and how a stage follows a commit (``pipespec.buffers``).

Optional, for machines where stages share CPU cores and drafters that may
have nothing to propose (``analysis.evaluate`` uses both): ``contention``
slows a stage's step while others compute (processor sharing), and
``supply`` marks the first stage as model-free (prompt lookup, suffix): like
the engine's PROPOSE it puts a whole run of drafts (up to its lead limit) in
one step, and it may find no proposal when a commit reaches it, so its
verifier takes a one-token step (in sd: the round has no window). Where its
verifier's acceptance holds the proposals measured by position
(``AlongContinuations.proposed``), it proposes at a position what it proposed
there; else whether it proposes is drawn from the supply probability. Acceptance specs may also be subclasses of ``Bernoulli`` with their
own sampler (e.g. acceptance in runs).

What the simulator does not model: EOS, prefill, variable step times beyond
the linear cost, communication time other than ``rollback_delay``, and
verifier-side tie effects (acceptance is purely the draws above).
"""

from __future__ import annotations

import heapq
import math
import numbers
from dataclasses import dataclass, field, replace
from typing import Sequence, Union

import numpy as np

from analysis.fit import estimate_alpha
from analysis.paired import BACK_TO_BACK_S
from pipespec import buffers
from pipespec.protocol import Role
from pipespec.schedule import (
    DEFAULT_MAX_LEAD, FINISH, IDLE, PROPOSE, STEP, TAKE, Action, StageView, commits_after_step, next_action, roles,
    stage_view, step_cost,
)  # fmt: skip

__all__ = [
    "StageCost",
    "TableCost",
    "ContextCost",
    "Sampler",
    "Bernoulli",
    "Replay",
    "ByPosition",
    "TreeContinuations",
    "RecordedSteps",
    "SimResult",
    "stage_view",
    "simulate_autoregressive",
    "simulate_sync_sd",
    "simulate_pipespec",
]

ROOT = -1  # parent id of the first generated token (the prompt)
UNBOUNDED = 2**62  # the budget of a steady-state simulation: no end in sight


# --------------------------------------------------------------------------- inputs


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


class Sampler:
    """An acceptance's sampler, one per simulated generation and pair (``AcceptanceSpec.sampler``): ``verify(offered,
    start)`` -> drafts accepted of ``offered`` at output position ``start``; ``agrees(position)`` -> whether the
    verifier's own token equals its drafter's there; ``proposal(position)`` below. Samplers subclass it."""

    def proposal(self, position: int) -> int | None:
        """The drafts a model-free drafter proposes at output `position` (0: none); None: not known here."""
        return None


@dataclass(frozen=True)
class Bernoulli:
    """Each offered draft token is accepted independently with probability ``alpha``."""

    alpha: float

    def __post_init__(self) -> None:
        if not (0.0 <= self.alpha <= 1.0):
            raise ValueError(f"alpha must be in [0, 1], got {self.alpha!r}")

    def sampler(self, rng: np.random.Generator, seed: int = 0) -> "_BernoulliSampler":
        return _BernoulliSampler(self.alpha, rng)


@dataclass(frozen=True)
class Replay:
    """Replay logged accepted counts (each >= 1, own token included), cycling when exhausted.

    ``agree_prob`` is the chance that an own token matches the drafter's token
    at the same position (see module docstring); by default the geometric
    estimate of alpha from the counts (``estimate_alpha`` without window).
    """

    counts: tuple[int, ...]
    agree_prob: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "counts", tuple(int(k) for k in self.counts))
        if not self.counts or min(self.counts) < 1:
            raise ValueError("counts must be a non-empty sequence of integers >= 1")
        if self.agree_prob is not None and not (0.0 <= self.agree_prob <= 1.0):
            raise ValueError(f"agree_prob must be in [0, 1], got {self.agree_prob!r}")

    @property
    def agree_rate(self) -> float:
        return estimate_alpha(self.counts) if self.agree_prob is None else self.agree_prob

    def sampler(self, rng: np.random.Generator, seed: int = 0) -> "_ReplaySampler":
        return _ReplaySampler(self.counts, self.agree_rate, rng)


@dataclass(frozen=True)
class ByPosition:
    """Draft p of a verification is accepted with probability ``rates[p]`` given that drafts 0..p-1 were
    (a profile's acceptance by draft position); positions beyond the list use its last rate.

    ``proposed[c][j]`` (optional, a model-free drafter's, as in ``AlongContinuations``): how many drafts it
    proposed at position j of continuation c (generation s follows continuation s mod len(proposed)), so it
    proposes where and as much as it did there while its drafts are accepted by position (acceptance learned
    from a run's counts keeps the drafter's proposals; without them it proposes up to its lead cap)."""

    rates: tuple[float, ...]
    proposed: tuple[tuple[int, ...], ...] = field(default=(), kw_only=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "rates", tuple(float(r) for r in self.rates))
        object.__setattr__(self, "proposed", tuple(tuple(int(n) for n in along) for along in self.proposed))
        if not self.rates or not all(0.0 <= r <= 1.0 for r in self.rates):
            raise ValueError(f"rates must be a non-empty sequence of probabilities, got {self.rates!r}")
        if self.proposed and not all(along and min(along) >= 0 for along in self.proposed):
            raise ValueError("proposed needs non-empty sequences of proposal lengths >= 0, one per continuation")

    def sampler(self, rng: np.random.Generator, seed: int = 0) -> "_ByPositionSampler":
        proposed = self.proposed[seed % len(self.proposed)] if self.proposed else None
        return _ByPositionSampler(self.rates, rng, proposed)


class _ByPositionSampler(Sampler):
    def __init__(self, rates: tuple[float, ...], rng: np.random.Generator,
                 proposed: tuple[int, ...] | None = None) -> None:  # fmt: skip
        self.rates = rates
        self.rng = rng
        self.proposed = proposed

    def proposal(self, position: int) -> int | None:
        return None if self.proposed is None else self.proposed[position % len(self.proposed)]

    def verify(self, offered: int, start: int = 0) -> int:
        accepted = 0
        while accepted < offered and self.rng.random() < self.rates[min(accepted, len(self.rates) - 1)]:
            accepted += 1
        return accepted

    def agrees(self, position: int = 0) -> bool:
        return bool(self.rng.random() < self.rates[0])  # the drafter's token at the first open position


@dataclass(frozen=True)
class AlongContinuations:
    """Acceptance read off real continuations instead of drawn: ``runs[c][j]`` is how many drafts in a row
    the drafter gets right from output position j of continuation c (`experiments.profiling`: its greedy
    drafts along the verifier's greedy continuation of a profile prompt). A verification of ``offered``
    drafts starting at position j accepts min(offered, runs[c][j]), so easy and hard stretches of a text
    come as they came (drawing each verification independently from the rates by position spreads
    them evenly, which under-predicts a pipeline whose drafter runs ahead through an easy stretch).
    Generation s follows continuation s mod len(runs), the same one for every pair of a chain;
    positions beyond a continuation wrap around to its start.

    ``proposed[c][j]`` (optional, a model-free drafter's): how many drafts the drafter proposed at position j
    of continuation c, 0 where it had no proposal. A model-free drafter then proposes where and as much as
    it did along the continuation, so its proposals and their acceptance come together (drawing whether it
    proposes from its overall rate pairs proposals with positions it had none at)."""

    runs: tuple[tuple[int, ...], ...]
    rates: tuple[float, ...]  # the same pair's acceptance by position (a verifier sizing its verifications)
    proposed: tuple[tuple[int, ...], ...] = field(default=(), kw_only=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "runs", tuple(tuple(int(r) for r in runs) for runs in self.runs))
        object.__setattr__(self, "rates", tuple(float(r) for r in self.rates))
        object.__setattr__(self, "proposed", tuple(tuple(int(n) for n in along) for along in self.proposed))
        if not self.runs or not all(self.runs) or any(r < 0 for runs in self.runs for r in runs):
            raise ValueError("runs must be non-empty sequences of counts >= 0, one per continuation")
        if self.proposed and ([len(p) for p in self.proposed] != [len(r) for r in self.runs] or any(
            n < r for runs, along in zip(self.runs, self.proposed) for r, n in zip(runs, along)
        )):  # fmt: skip
            raise ValueError("proposed needs one proposal length >= its run per position of every continuation")

    def sampler(self, rng: np.random.Generator, seed: int = 0) -> "_AlongSampler":
        index = seed % len(self.runs)
        return _AlongSampler(self.runs[index], self.proposed[index] if self.proposed else None)


class _AlongSampler(Sampler):
    def __init__(self, runs: tuple[int, ...], proposed: tuple[int, ...] | None = None) -> None:
        self.runs = runs
        self.proposed = proposed

    def verify(self, offered: int, start: int = 0) -> int:
        """min(offered, runs[start]); for a model-free drafter whose proposal at ``start`` was right to its
        end, the drafts beyond it are the proposal it makes from there (`pipespec.stage`: it proposes
        again from its buffer's end while its lead allows), read on at that position."""
        return self.read_on(offered, start, self.chain_run)

    def read_on(self, offered: int, start: int, last_run) -> int:
        """The drafts kept from ``start``: each proposal kept whole (`chain_run`) and then the next one's, up
        to ``offered``; where one is not kept whole, or the drafts end, ``last_run(position)`` of it."""
        accepted, position = 0, start
        while True:
            proposal = self.proposal(position)
            if not proposal or self.chain_run(position) < proposal or accepted + proposal >= offered:
                return min(offered, accepted + last_run(position))
            accepted, position = accepted + proposal, position + proposal

    def branch_run(self, position: int) -> int:
        """How many of the drafts offered from ``position`` the verifier keeps (``runs``)."""
        return self.runs[position % len(self.runs)]

    def chain_run(self, position: int) -> int:
        """How many of the drafter's chain of drafts from ``position`` are kept (its proposal there)."""
        return self.branch_run(position)

    def agrees(self, position: int = 0) -> bool:
        return self.branch_run(position) >= 1

    def proposal(self, position: int) -> int | None:
        return None if self.proposed is None else self.proposed[position % len(self.proposed)]


@dataclass(frozen=True)
class TreeContinuations(AlongContinuations):
    """A verifier checking a model-free drafter's token trees (`tree_nodes` > 0), read off real
    continuations like ``AlongContinuations``: ``runs[c][j]`` is how deep the branch along continuation c
    goes in the tree the drafter proposes at its position j (the drafts a tree verification keeps there),
    ``nodes[c][j]`` how many nodes that tree holds (`experiments.profiling.tree_runs`). A tree verification
    at position j (the verifier's buffer ends at the drafter's tree root) keeps min(offered, runs[c][j]) and
    feeds the tree's nodes[c][j] nodes (a chain's ``offered`` where the measured tree was empty), so it costs
    t(uncached + nodes). The node counts are those measured at the profile's proposal depth; a verifier
    sizing its verifications checks the whole tree here.

    ``path_runs[c][j]`` (optional, with ``proposed`` the tree's most likely path, which the drafter appends
    to its buffer and proposes on from): how many of the path's tokens are kept. A verifier whose buffer is
    not at the drafter's tree root (the commit that moves the root has not reached the drafter yet) checks
    the chain the drafter holds instead (`pipespec.stage`), kept path by path (`verify`); without
    ``path_runs``, with the tree's branch for the path's kept prefix. ``budget`` (the drafter's
    `tree_nodes`; 0: the first tree alone): the nodes a drafts message carries, the tree at the root and,
    while they fit, the trees the drafter proposed on from its path's end, grafted below it; a verification
    reads on into a graft where the path above it was kept whole."""

    nodes: tuple[tuple[int, ...], ...] = ()
    path_runs: tuple[tuple[int, ...], ...] = ()
    budget: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "nodes", tuple(tuple(int(n) for n in nodes) for nodes in self.nodes))
        object.__setattr__(self, "path_runs", tuple(tuple(int(n) for n in along) for along in self.path_runs))
        if [len(r) for r in self.runs] != [len(n) for n in self.nodes] or any(
            n < r for runs, nodes in zip(self.runs, self.nodes) for r, n in zip(runs, nodes)
        ):  # fmt: skip
            raise ValueError("nodes needs one count >= its run per position of every continuation")
        if self.path_runs and (not self.proposed or any(
            not 0 <= k <= r for kept, runs in zip(self.path_runs, self.runs) for k, r in zip(kept, runs)
        ) or [len(k) for k in self.path_runs] != [len(r) for r in self.runs]):  # fmt: skip
            raise ValueError("path_runs needs the proposals and one count 0 <= count <= its run per position")

    def sampler(self, rng: np.random.Generator, seed: int = 0) -> "_TreeSampler":
        index = seed % len(self.runs)
        return _TreeSampler(self.runs[index], self.nodes[index], self.proposed[index] if self.proposed else None,
                            self.path_runs[index] if self.path_runs else None, self.budget)  # fmt: skip


class _TreeSampler(_AlongSampler):
    def __init__(self, runs: tuple[int, ...], nodes: tuple[int, ...], proposed: tuple[int, ...] | None,
                 path_runs: tuple[int, ...] | None = None, budget: int = 0) -> None:  # fmt: skip
        super().__init__(runs, proposed)
        self.tree_nodes = nodes
        self.path_runs = path_runs
        self.budget = budget

    def tree_span(self, offered: int, start: int = 0) -> tuple[int, int]:
        """(drafts, nodes) of the verification of the tree rooted at ``start`` when the drafter holds
        ``offered`` drafts: its tree, and the trees grafted below its paths while their nodes fit the
        budget; (offered, offered) where the drafter had no tree there (a chain)."""
        if self.proposed is None:  # its proposals not measured: the tree at the root alone
            return offered, self.tree_nodes[start % len(self.tree_nodes)] or offered
        depth, fed, position = 0, 0, start
        while depth < offered:
            path, size = self.proposal(position), self.tree_nodes[position % len(self.tree_nodes)]
            if not path or not size or (fed and fed + size > self.budget):
                break
            depth, fed, position = depth + path, fed + size, position + path
        return (min(depth, offered), fed) if depth else (offered, offered)

    def verify_tree(self, offered: int, start: int = 0) -> int:
        """The drafts a verification of the tree rooted at ``start`` (``offered``: its `tree_span`) keeps: the
        branch along the text, on into a graft where the path above it was kept whole."""
        return self.read_on(offered, start, self.branch_run)

    def chain_run(self, position: int) -> int:
        """A chain verification keeps the most likely path's kept prefix (unknown: the tree's branch)."""
        runs = self.runs if self.path_runs is None else self.path_runs
        return runs[position % len(runs)]


AcceptanceSpec = Union[float, Bernoulli, Replay, ByPosition, AlongContinuations, Sequence[int]]


class _BernoulliSampler(Sampler):
    def __init__(self, alpha: float, rng: np.random.Generator) -> None:
        self.alpha = alpha
        self.rng = rng

    def verify(self, offered: int, start: int = 0) -> int:
        """Accepted prefix length of ``offered`` i.i.d. drafts (truncated geometric)."""
        if self.alpha >= 1.0:
            return offered
        if self.alpha <= 0.0:
            return 0
        # trials up to and including the first rejection, minus that rejection
        return min(int(self.rng.geometric(1.0 - self.alpha)) - 1, offered)

    def agrees(self, position: int = 0) -> bool:
        return bool(self.rng.random() < self.alpha)


class _ReplaySampler(Sampler):
    def __init__(self, counts: tuple[int, ...], agree_prob: float, rng: np.random.Generator) -> None:
        self.counts = counts
        self.agree_prob = agree_prob
        self.rng = rng
        self.next_index = 0

    def verify(self, offered: int, start: int = 0) -> int:
        count = self.counts[self.next_index % len(self.counts)]
        self.next_index += 1
        return min(count - 1, offered)

    def agrees(self, position: int = 0) -> bool:
        return bool(self.rng.random() < self.agree_prob)


def _as_acceptance(spec: AcceptanceSpec) -> Bernoulli | Replay | ByPosition | AlongContinuations:
    if isinstance(spec, (Bernoulli, Replay, ByPosition, AlongContinuations)):
        return spec
    if isinstance(spec, numbers.Real) and not isinstance(spec, bool):
        return Bernoulli(float(spec))  # a plain number is an i.i.d. acceptance probability
    return Replay(tuple(spec))  # a sequence is a log of accepted counts


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


def _check_supply(supply, n_stages: int) -> list[float | None]:
    if supply is None:
        return [None] * n_stages
    supply = [None if p is None else float(p) for p in supply]
    if len(supply) != n_stages or not all(p is None or 0.0 <= p <= 1.0 for p in supply):
        raise ValueError(f"supply needs one probability in [0, 1] or None per stage ({n_stages}), got {supply!r}")
    return supply


def _check_wake(wake: Sequence[float] | None, n_stages: int) -> list[float]:
    """Per stage, the extra cost of a step after a wait (`simulate_pipespec`): 0 each when None."""
    if wake is None:
        return [0.0] * n_stages
    wake = [float(w) for w in wake]
    if len(wake) != n_stages or not all(math.isfinite(w) and w >= 0 for w in wake):
        raise ValueError(f"wake needs one value >= 0 per stage ({n_stages}), got {wake!r}")
    return wake


def _check_int(value: int, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or int(value) != value or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


# --------------------------------------------------------------------------- result


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


# --------------------------------------------------------------------------- token bookkeeping


class _Tokens:
    """Creates token ids; remembers each id's parent id and position, and which ids stand for the
    same token (two stages that produced the same token at the same position without seeing each
    other's: found equal when a commit reaches the stage that produced the other)."""

    def __init__(self) -> None:
        self.parent: list[int] = []
        self.position: list[int] = []
        self.unseen: set[int] = set()  # a verifier's own token made where its drafter had none yet
        self.alias: dict[int, int] = {}

    def new(self, buffer: list[int], unseen: bool = False) -> int:
        """A fresh token to be appended to ``buffer``."""
        self.parent.append(buffer[-1] if buffer else ROOT)
        self.position.append(len(buffer))
        token = len(self.parent) - 1
        if unseen:
            self.unseen.add(token)
        return token

    def find(self, token: int) -> int:
        while token in self.alias:
            token = self.alias[token]
        return token

    def same(self, a: int, b: int) -> bool:
        return self.find(a) == self.find(b)

    def merge(self, a: int, b: int) -> None:
        """Tokens ``a`` and ``b`` (same position, same prefix) turned out to be the same token."""
        a, b = self.find(a), self.find(b)
        if a != b:
            self.alias[b] = a

    def holds(self, buffer: list[int], token: int) -> bool:
        """True if ``buffer`` contains ``token`` at its position (hence agrees on the prefix)."""
        if token == ROOT:
            return True
        pos = self.position[token]
        return pos < len(buffer) and self.same(buffer[pos], token)

    def diverging(self, buffer: list[int], last: int) -> list[int]:
        """The tokens of the sequence ending in ``last`` that ``buffer`` lacks, in order of position."""
        missing = []
        token = last
        while not self.holds(buffer, token):  # walk back to the common prefix
            missing.append(token)
            token = self.parent[token]
        return missing[::-1]

    def agree_through(self, a: list[int], b: list[int], length: int) -> bool:
        """True if buffers ``a`` and ``b`` agree on their first ``length`` tokens."""
        return length == 0 or (len(a) >= length and len(b) >= length and self.same(a[length - 1], b[length - 1]))


# --------------------------------------------------------------------------- autoregressive


def simulate_autoregressive(cost: StageCost | TableCost | ContextCost | float, max_new_tokens: int) -> SimResult:
    """Plain greedy decoding by one model: max_new_tokens steps of t(1) each (exactly 1 / t(1) tokens/s; a
    `ContextCost`'s steps each at their own context)."""
    cost = _as_cost(cost)
    n = _check_int(max_new_tokens, "max_new_tokens", 1)
    total = math.fsum(cost(1, g) for g in range(n)) if isinstance(cost, ContextCost) else n * cost(1)
    return SimResult(
        strategy="autoregressive",
        total_time=total,
        tokens_generated=n,
        committed_tokens=n,
        steps=(n,),
        discarded_steps=(0,),
        busy_fraction=(1.0,),
        verify_fraction=(),
        accepted_per_verify=(),
        offered_per_verify=(),
        rejections=(),
        accepted_counts=(),
        offered_counts=(),
    )


# --------------------------------------------------------------------------- the one schedule


@dataclass(frozen=True)
class RecordedSteps:
    """Step durations (seconds) replayed in order, cycling when exhausted: a stage's cost in place of
    ``StageCost`` when replaying a recorded trace (whatever the step feeds)."""

    durations: tuple[float, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "durations", tuple(float(d) for d in self.durations))
        if not self.durations or not all(math.isfinite(d) and d > 0 for d in self.durations):
            raise ValueError("durations must be a non-empty sequence of positive seconds")


def _step_clock(costs: Sequence[StageCost | RecordedSteps]):
    """duration(stage, tokens fed) for each new step, drawing recorded durations in order."""
    used = [0] * len(costs)

    def duration(i: int, fed: int, generated: int = 0) -> float:
        """``generated``: the stage's generated tokens already in its KV cache (a `ContextCost` counts them)."""
        cost = costs[i]
        if isinstance(cost, RecordedSteps):
            used[i] += 1
            return cost.durations[(used[i] - 1) % len(cost.durations)]
        if isinstance(cost, ContextCost):
            return cost(max(fed, 1), generated)
        return cost(max(fed, 1))  # every forward pass feeds at least one token

    return duration


def simulate_sync_sd(
    costs: Sequence[StageCost | float],
    acceptances: Sequence[AcceptanceSpec],
    gamma: int,
    max_new_tokens: int,
    seed: int = 0,
    supply: Sequence[float | None] | None = None,
    end_at_budget: bool = False,
    size_verification: bool = False,
    wake: Sequence[float] | None = None,
) -> SimResult:
    """Synchronous (tiered) chain speculative decoding: the engine's ``sd`` roles with window ``gamma``.

    Stage 0 drafts ``gamma`` tokens (one step each) and stops; each verifier waits until its drafter
    has stopped, verifies everything it holds beyond its own buffer, appends its own token and stops;
    the target commits and the commit cascades upstream, releasing the chain. At any moment exactly
    one stage computes. ``gamma`` = 0: stage 0 never drafts; with two stages the target steps alone,
    with three the middle stage takes one-token steps that the target verifies (as the engine does).
    ``costs``: one ``StageCost`` (or fixed seconds, or ``RecordedSteps``) per stage, target last;
    ``acceptances``: one alpha / ``Bernoulli`` / ``Replay`` / count list per pair. ``supply``: optional,
    per stage; ``supply[0]`` is the probability that the first stage has a window to propose when a
    commit reaches it (prompt lookup finds no match otherwise: the round is a one-token step).
    ``end_at_budget``, ``wake``: see ``simulate_pipespec``.
    """
    gamma = _check_int(gamma, "gamma", 0)
    return Simulation(
        "sd", costs, acceptances, max_new_tokens, lookahead=gamma, max_lead=max(gamma, 1), seed=seed,
        supply=supply, end_at_budget=end_at_budget, size_verification=size_verification, wake=wake,
    ).run()  # fmt: skip


def simulate_pipespec(
    costs: Sequence[StageCost | float],
    acceptances: Sequence[AcceptanceSpec],
    max_new_tokens: int,
    lookahead: int = 0,
    max_lead: int = DEFAULT_MAX_LEAD,
    verify_window: int | None = None,
    rollback_delay: float = 0.0,
    seed: int = 0,
    contention: Sequence[float | None] | None = None,
    supply: Sequence[float | None] | None = None,
    end_at_budget: bool = False,
    size_verification: bool = False,
    cascade: bool = False,
    wake: Sequence[float] | None = None,
) -> SimResult:
    """Asynchronous k-stage PipeSpec pipeline: the engine's ``pipespec`` roles.

    ``lookahead``: minimum drafts a verifier waits for while its drafter is
    still producing (0 = never wait). ``max_lead``: a non-target stage does not
    start a step while it is this many tokens ahead of the next stage's last
    commit it has received (default: the engine's). ``verify_window``: optional cap on drafts per
    verification (None = all available, as in the engine; the paper's fixed window otherwise).
    ``rollback_delay``: seconds per upstream hop of a commit (0: immediate, the whole cascade at once).
    ``contention``: optional, per stage, the relative slowdown per other stage
    computing at the same time (stages sharing CPU cores), as processor
    sharing: while ``m`` other stages compute, stage i's step progresses at
    rate 1 / (1 + contention[i] * m), so a step of cost t_i(n) alone takes
    t_i(n) * (1 + contention[i] * m) if m stays constant. A None entry marks a
    stage that takes no core (e.g. prompt lookup): neither slowed nor counted.
    None (default): stages never slow each other.
    ``supply``: optional, per stage, the probability that a drafter has
    anything to propose when a commit reaches it back at its successor's output
    (prompt lookup finds no match otherwise); a drafter without a proposal
    idles until the next commit reaches it, and a verifier does not wait for
    it. A first stage with a supply is model-free: one step proposes its whole
    run of drafts (the engine's PROPOSE). None entries (default): always, one draft a step.
    ``end_at_budget``: False (default) measures the first ``max_new_tokens`` tokens of an endless
    generation (steady state; the last step may overshoot). True stops like the engine at a budget of
    ``max_new_tokens``: verifiers take at most room - 1 drafts, drafters stop one token short of it.
    ``wake``: optional, per stage, the relative extra cost of a step that starts more than `BACK_TO_BACK_S`
    after the stage's previous step ended (it waited: the engine's step after a wait); None: none.
    """
    lookahead = _check_int(lookahead, "lookahead", 0)
    max_lead = _check_int(max_lead, "max_lead", max(lookahead, 1))
    if verify_window is not None:
        verify_window = _check_int(verify_window, "verify_window", max(lookahead, 1))
    return Simulation(
        "pipespec", costs, acceptances, max_new_tokens, lookahead=lookahead, max_lead=max_lead,
        verify_window=verify_window, rollback_delay=rollback_delay, seed=seed, contention=contention,
        supply=supply, end_at_budget=end_at_budget, size_verification=size_verification, cascade=cascade,
        wake=wake,
    ).run()  # fmt: skip


SIZING_TABLE = 33  # t(n) entries a sizing verifier is given (n = 1..33: up to 32 drafts)
STEP_DONE = -2  # an event's payload when a step ends (with contention: minus the step's version); else a token


def _cost_table(cost) -> list[float]:
    if isinstance(cost, RecordedSteps):  # a replayed trace has no t(n): its median step for every n
        median = float(np.median(cost.durations))
        return [median] * SIZING_TABLE
    return [cost(n) for n in range(1, SIZING_TABLE + 1)]


def _rates(spec) -> tuple[float, ...]:
    if isinstance(spec, (ByPosition, AlongContinuations)):
        return spec.rates
    if isinstance(spec, Bernoulli):
        return (spec.alpha,)
    return (spec.agree_rate,)  # Replay: its per-token estimate


def _check_schedule_inputs(costs, acceptances, max_new_tokens, rollback_delay, contention, supply):
    """The inputs of a simulation, checked and normalised: (costs, acceptances, max_new_tokens,
    contention, supply)."""
    costs = [c if isinstance(c, RecordedSteps) else _as_cost(c) for c in costs]
    if len(costs) < 2:
        raise ValueError(f"costs needs at least two stages (drafter and target), got {len(costs)}")
    acceptances = [_as_acceptance(a) for a in acceptances]
    if len(acceptances) != len(costs) - 1:
        raise ValueError(f"acceptances needs one entry per adjacent pair ({len(costs) - 1}), got {len(acceptances)}")
    max_new_tokens = _check_int(max_new_tokens, "max_new_tokens", 1)
    if not (math.isfinite(rollback_delay) and rollback_delay >= 0):
        raise ValueError(f"rollback_delay must be a finite number >= 0, got {rollback_delay!r}")
    if contention is not None:
        contention = [None if c is None else float(c) for c in contention]
        if len(contention) != len(costs) or not all(c is None or (math.isfinite(c) and c >= 0) for c in contention):
            raise ValueError(f"contention needs one value >= 0 or None per stage ({len(costs)}), got {contention!r}")
    return costs, acceptances, max_new_tokens, contention, _check_supply(supply, len(costs))


class SimulatedStage:
    """One stage of a simulation, running the engine's loop (`pipespec.stage.StageRequest`; the methods of
    the same names decide with the same functions): its buffer of abstract tokens, the length of the next
    stage's last commit it has received, the step in flight, and what it counted."""

    def __init__(self, index: int, role: Role, simulation: "Simulation", acceptance) -> None:
        self.index = index
        self.role = role
        self.simulation = simulation
        self.tokens = simulation.tokens  # the simulation's token ids
        self.sizing = simulation.sizing[index]  # a sizing verifier's t(n) and acceptance by position, or ((), ())
        self.acceptance = acceptance  # the sampler of its verifications of its drafter's tokens (first stage: None)
        self.upstream: SimulatedStage | None = None  # its drafter
        self.downstream: SimulatedStage | None = None  # its verifier (None: the target)
        self.model_free = index == 0 and simulation.supply[0] is not None  # proposes whole runs (PROPOSE)
        self.buffer: list[int] = []  # O_i: the tokens this stage currently believes
        self.cached = 0  # tokens of buffer in the KV cache
        self.downstream_committed = 0  # length of the next stage's last commit it has received
        self.in_flight = 0  # commits on their way to it (rollback_delay > 0)
        self.dry = False  # a drafter with nothing to propose until the next commit reaches it
        # a model-free drafter's drafts still to propose since the last commit, as measured along the continuation
        # at that position (`Sampler.proposal`); None: its proposals are not measured, it proposes while not dry
        self.proposal_left: int | None = None
        self.pending: int | None = None  # the latest commit that arrived during the step in flight
        self.busy = False
        # the step in flight
        self.step_kind = STEP
        self.step_start = 0.0
        self.step_end = 0.0
        self.step_drafts: list[int] = []
        self.step_tree = False  # the step verifies its drafter's token tree (else the chain it is offered)
        self.step_proposal = 1  # tokens the first stage's step appends (a model-free proposal: several)
        self.last_end: float | None = None  # when its previous step ended (None: none yet)
        # with contention: seconds of solo computing left in its step, the speed it progresses at now, and
        # a version bumped when the step is rescheduled (older completion events are ignored)
        self.work_left = 0.0
        self.rate = 0.0
        self.version = 0
        # what it counted
        self.busy_time = 0.0
        self.steps = 0
        self.discarded = 0  # steps whose result was dropped because of a rollback
        self.verifications = 0
        self.accepted: list[int] = []  # accepted count (+ own token) per verification
        self.offered: list[int] = []
        self.rejections = 0
        self.kinds: list[int] = []  # drafts offered per applied step of a verifier (0: a single step)

    # ---- scheduling ------------------------------------------------------------------
    def available_drafts(self) -> list[int]:
        """The drafter's tokens beyond this stage's buffer (`pipespec.buffers.offered_drafts`), at most
        ``verify_window`` of them."""
        if self.upstream is None:
            return []
        upstream, generated, simulation = self.upstream.buffer, len(self.buffer), self.simulation
        extends = self.tokens.agree_through(upstream, self.buffer, generated)
        return buffers.offered_drafts(generated, upstream, extends, simulation.budget, limit=simulation.verify_window)

    def more_coming(self) -> bool:
        """This stage will produce more drafts without hearing back (what its last message says)."""
        return self.in_flight > 0 or self.busy or self.next_action()[0].kind not in (IDLE, FINISH)

    def view(self, drafts: int) -> StageView:
        """What it knows, in the engine's terms (`pipespec.schedule.stage_view`). There is no EOS and no
        confidence model here: a drafter is never finished and its lead is always confident."""
        more = self.upstream is not None and self.upstream.more_coming()
        step_costs, acceptance = self.sizing
        return stage_view(self.role, len(self.buffer), self.downstream_committed, drafts, more,
                          self.simulation.budget, model_free=self.model_free, step_costs=step_costs,
                          acceptance=acceptance)  # fmt: skip

    def next_action(self) -> tuple[Action, list[int]]:
        """Its next action (`pipespec.schedule.next_action`) and the drafts it is offered."""
        drafts = self.available_drafts()
        if self.dry:
            return Action(IDLE), drafts  # prompt lookup without a proposal
        action = next_action(self.role, self.view(len(drafts)))
        if action.kind == PROPOSE and self.proposal_left is not None:
            action = Action(PROPOSE, min(action.n, self.proposal_left))  # the proposal it made there
        return action, drafts

    def try_start(self, now: float) -> None:
        """Act on its next action if it is idle: start a step, or pass a proposal on (TAKE, at no cost)."""
        if self.busy:
            return
        action, drafts = self.next_action()
        if action.kind == TAKE:  # a cascade passes the proposal on at no cost, then decides again
            self.buffer.extend(drafts[: action.n])
            self.simulation.took = True
            self.try_start(now)
            return
        if action.kind in (STEP, PROPOSE):
            self.start_step(action, drafts[: action.n], now)

    def start_step(self, action: Action, drafts: list[int], now: float) -> None:
        """A step feeds its uncached tokens plus the drafts it verifies."""
        simulation = self.simulation
        self.step_kind = action.kind
        self.step_proposal = action.n if action.kind == PROPOSE else 1
        self.busy = True
        self.step_start = now
        sampler = self.acceptance
        # a tree where its buffer ends at the drafter's tree root (the last commit the drafter adopted), else the
        # chain the drafter holds (`pipespec.stage`)
        self.step_tree = (bool(drafts) and isinstance(sampler, _TreeSampler)
                          and self.upstream.downstream_committed == len(self.buffer))  # fmt: skip
        fed = len(drafts)
        if self.step_tree:
            depth, fed = sampler.tree_span(len(drafts), len(self.buffer))
            drafts = drafts[:depth]
        seconds = simulation.step_time(self.index, len(self.buffer) - self.cached + fed, self.cached)
        if self.last_end is not None and now - self.last_end > BACK_TO_BACK_S:  # after a wait
            seconds *= 1.0 + simulation.wake[self.index]
        self.step_end = now + seconds
        self.step_drafts = drafts
        if simulation.contention is not None:
            self.work_left = self.step_end - now  # scheduled by share_cores once everyone's state is known
            self.rate = 0.0
            return
        simulation.schedule(self.step_end, self.index, STEP_DONE)

    # ---- steps -------------------------------------------------------------------------
    def step(self, now: float) -> bool:
        """Apply its completed step, commit it upstream where its role says so, then adopt a commit that
        arrived during the step; True when the target reached the token budget."""
        self.busy = False
        self.steps += 1
        self.busy_time += now - self.step_start
        self.last_end = now
        produced_from = len(self.buffer)
        if self.upstream is None:  # a model drafts one token a step; a model-free drafter a run of them at once
            self.cached = len(self.buffer)
            for _ in range(self.step_proposal):
                self.buffer.append(self.tokens.new(self.buffer))
            if self.proposal_left is not None:  # a measured proposal, proposed: the next from its buffer's end
                self.proposal_left -= self.step_proposal
                if self.proposal_left <= 0:
                    self.proposal_left = self.downstream.acceptance.proposal(len(self.buffer))
                self.dry = self.proposal_left <= 0
        else:
            self.verify()
        if commits_after_step(self.role, self.step_kind):
            self.commit_upstream(self.buffer[-1], now)
        if self.pending is not None:
            token, self.pending = self.pending, None
            self.adopt(token, now, produced_from)
        return self.downstream is None and len(self.buffer) >= self.simulation.max_new_tokens

    def verify(self) -> None:
        """A verifier's step ends: the accepted drafts and its own token join its buffer."""
        tokens, sampler, drafts = self.tokens, self.acceptance, self.step_drafts
        verify = sampler.verify_tree if self.step_tree else sampler.verify
        accepted = verify(len(drafts), len(self.buffer)) if drafts else 0
        self.buffer.extend(drafts[:accepted])
        self.cached = len(self.buffer)  # own uncached tokens and accepted drafts are now cached
        own = None
        upstream = self.upstream.buffer
        position = len(self.buffer)
        if accepted == len(drafts):
            # bonus or single-token step: the drafter may already hold a token at this position
            if (len(upstream) > position and tokens.agree_through(upstream, self.buffer, position)
                    and sampler.agrees(position)):  # fmt: skip
                own = upstream[position]  # same token: the drafter keeps its continuation
        unseen = accepted == len(drafts) and len(upstream) <= position
        self.buffer.append(own if own is not None else tokens.new(self.buffer, unseen))
        if drafts:
            self.verifications += 1
            self.accepted.append(accepted + 1)
            self.offered.append(len(drafts))
            self.rejections += accepted < len(drafts)
        self.kinds.append(len(drafts))

    # ---- commits -----------------------------------------------------------------------
    def commit_upstream(self, token: int, now: float) -> None:
        """Tell its drafter that the buffer it follows now ends in ``token``, ``rollback_delay`` later."""
        if self.upstream is None:
            return
        simulation = self.simulation
        if simulation.rollback_delay > 0:
            self.upstream.in_flight += 1
            simulation.schedule(now + simulation.rollback_delay, self.upstream.index, token)
        else:
            self.upstream.handle_commit(token, now)

    def handle_commit(self, token: int, now: float) -> None:
        """A commit reaches it. Like the engine, a stage reads its messages between steps: one arriving
        during a step waits for the step's end (the latest commit carries the whole buffer)."""
        if self.busy:
            self.pending = token
        else:
            self.adopt(token, now)

    def adopt(self, token: int, now: float, produced_from: int | None = None) -> None:
        """Follow the commit ending in ``token`` (`pipespec.buffers.adopt`: roll back where the buffers
        differ, catch up where the commit is ahead) and forward it upstream, as the engine does.
        ``produced_from``: where the step that just ended started appending, if one did."""
        tokens = self.tokens
        self.downstream_committed = tokens.position[token] + 1
        self.match_own_tokens(token)
        missing = tokens.diverging(self.buffer, token)
        change = buffers.adopt(len(self.buffer), self.downstream_committed, self.downstream_committed - len(missing))
        if change.replace_from is not None:
            self.replace_tail(change.replace_from, missing)
        self.look_again()  # a commit arrived: a prompt lookup looks for a match again
        if change.replace_from is not None:
            self.cached = min(self.cached, change.replace_from)
            if produced_from is not None and change.replace_from <= produced_from:
                self.discarded += 1  # nothing the step produced survives
        self.commit_upstream(token, now)  # the engine forwards every commit it receives

    def match_own_tokens(self, token: int) -> None:
        """The verifier's own tokens in the commit ending in ``token`` that it made before this stage's token
        at their position existed: equal or not by the pair's agreement (the engine compares token ids);
        a rejection's replacement always differs."""
        tokens = self.tokens
        for theirs in tokens.diverging(self.buffer, token):
            position = tokens.position[theirs]
            if (position >= len(self.buffer) or theirs not in tokens.unseen
                    or not self.downstream.acceptance.agrees(position)):  # fmt: skip
                break
            tokens.merge(self.buffer[position], theirs)

    def replace_tail(self, common: int, tokens_from_common: list[int]) -> None:
        """Take the commit's tokens from ``common`` on."""
        del self.buffer[common:]
        self.buffer.extend(tokens_from_common)

    def look_again(self) -> None:
        """A drafter with a finite supply, back at its successor's output, has a proposal or not: the one it
        made at that output position along the continuation where that was measured (its verifier's
        sampler knows), else one drawn from its proposal rate. Still ahead of its successor, a measured
        proposal goes on where it stopped."""
        supply, downstream = self.simulation.supply[self.index], self.downstream
        if supply is None or downstream is None or len(self.buffer) > len(downstream.buffer):
            if self.proposal_left is None:
                self.dry = False
            return
        self.proposal_left = downstream.acceptance.proposal(len(downstream.buffer))
        if self.proposal_left is None:
            self.dry = bool(self.simulation.rng.random() >= supply)
        else:
            self.dry = self.proposal_left == 0


class Simulation:
    """Every stage runs the engine's loop (`SimulatedStage`): after each event, each idle stage asks
    ``pipespec.schedule.next_action`` (its role from ``pipespec.schedule.roles``) what to do next.

    A step feeds the stage's uncached tokens plus the drafts it verifies. After a step a stage whose
    role commits its own steps (and the target) sends its buffer upstream; a stage receiving a commit
    adopts it between steps, as the engine does: one that arrives during a step is adopted when the
    step ends, after the step's tokens joined the buffer, so the step survives where the commit agrees
    with it (a rollback where they differ: its KV cache is cropped). It records the commit's length
    as the next stage's last commit and forwards it upstream, each hop taking ``rollback_delay`` seconds.
    """

    def __init__(self, strategy: str, costs, acceptances, max_new_tokens: int, lookahead: int, max_lead: int,
                 verify_window: int | None = None, rollback_delay: float = 0.0, seed: int = 0,
                 contention: Sequence[float | None] | None = None, supply: Sequence[float | None] | None = None,
                 end_at_budget: bool = False, size_verification: bool = False, cascade: bool = False,
                 wake: Sequence[float] | None = None) -> None:  # fmt: skip
        costs, acceptances, max_new_tokens, contention, supply = _check_schedule_inputs(
            costs, acceptances, max_new_tokens, rollback_delay, contention, supply
        )
        self.wake = _check_wake(wake, len(costs))
        self.strategy = strategy
        self.max_new_tokens = max_new_tokens
        self.budget = max_new_tokens if end_at_budget else UNBOUNDED
        self.verify_window = verify_window
        self.rollback_delay = rollback_delay
        self.contention = contention
        self.supply = supply
        stage_roles = roles(strategy, len(costs), lookahead, max_lead, size_verification=size_verification,
                            cascade=cascade)  # fmt: skip
        # what a sizing verifier knows: its t(n) and its drafter's acceptance by position (here, the true ones);
        # a verifier of token trees checks the whole tree (`TreeContinuations`)
        self.sizing = [((), ())] + [
            (tuple(_cost_table(costs[i])), _rates(acceptances[i - 1]))
            if size_verification and not isinstance(acceptances[i - 1], TreeContinuations) else ((), ())
            for i in range(1, len(costs))
        ]  # fmt: skip
        self.step_time = _step_clock(costs)
        self.clock = 0.0  # with contention: when the stages' work_left was last brought up to date
        self.took = False  # a cascade passed drafts on during this pass of start_all
        self.rng = np.random.default_rng(seed)
        samplers = [None] + [spec.sampler(self.rng, seed) for spec in acceptances]
        self.tokens = _Tokens()
        self.stages = [SimulatedStage(i, role, self, samplers[i]) for i, role in enumerate(stage_roles)]
        for drafter, verifier in zip(self.stages, self.stages[1:]):
            drafter.downstream, verifier.upstream = verifier, drafter
        self.events: list[tuple[float, int, int, int]] = []  # (time, sequence, stage, token or STEP_DONE)
        self.sequence = 0
        self.max_events = 1000 * max_new_tokens * len(self.stages) + 10_000  # guard against a modelling bug looping

    def schedule(self, time: float, stage_index: int, payload: int) -> None:
        heapq.heappush(self.events, (time, self.sequence, stage_index, payload))
        self.sequence += 1

    def start_all(self, now: float) -> None:
        """Every idle stage acts on its next action, downstream first: verifiers read their drafter's
        state as of now."""
        self.took = True
        while self.took:  # again after a pass-through: the stages downstream of it have new drafts
            self.took = False
            for stage in reversed(self.stages):
                stage.try_start(now)
        if self.contention is not None:
            self.share_cores(now)

    def advance(self, now: float) -> None:
        """Processor sharing: bring every busy stage's remaining work up to ``now``."""
        for stage in self.stages:
            if stage.busy:
                stage.work_left = max(stage.work_left - (now - self.clock) * stage.rate, 0.0)
        self.clock = now

    def share_cores(self, now: float) -> None:
        """Processor sharing: new speeds for the current set of busy stages; reschedule whose speed changed."""
        contention = self.contention
        busy = [j for j, stage in enumerate(self.stages) if stage.busy and contention[j] is not None]
        for j, stage in enumerate(self.stages):
            if not stage.busy:
                continue
            others = sum(1 for k in busy if k != j) if contention[j] is not None else 0
            speed = 1.0 / (1.0 + (contention[j] or 0.0) * others)
            if speed != stage.rate:
                stage.rate = speed
                stage.version += 1
                stage.step_end = now + stage.work_left / speed
                self.schedule(stage.step_end, j, STEP_DONE - stage.version)

    def run(self) -> SimResult:
        """Play events until the target holds ``max_new_tokens`` tokens."""
        for stage in self.stages:
            stage.look_again()
        self.start_all(0.0)
        now = 0.0
        handled = 0
        while True:
            if not self.events:
                raise RuntimeError("simulation stalled: no stage can make progress")
            handled += 1
            if handled > self.max_events:
                raise RuntimeError("simulation exceeded its event budget")
            now, _, i, payload = heapq.heappop(self.events)
            stage = self.stages[i]
            if self.contention is not None:
                if payload <= STEP_DONE and payload != STEP_DONE - stage.version:
                    continue  # a completion time made stale by a change of speed
                self.advance(now)
                if payload <= STEP_DONE:
                    payload = STEP_DONE
            if payload == STEP_DONE:
                if stage.step(now):
                    break
            else:
                stage.in_flight -= 1
                stage.handle_commit(payload, now)
            self.start_all(now)
        for stage in self.stages:  # count the part of in-flight steps that ran before the end
            if stage.busy:
                stage.busy_time += now - stage.step_start
        return _result("sync_sd" if self.strategy == "sd" else self.strategy, self.stages, now, self.max_new_tokens)


def _result(strategy: str, stages: list[SimulatedStage], total_time: float, max_new_tokens: int) -> SimResult:
    verifiers = stages[1:]
    return SimResult(
        strategy=strategy,
        total_time=total_time,
        tokens_generated=max_new_tokens,
        committed_tokens=len(stages[-1].buffer),
        steps=tuple(s.steps for s in stages),
        discarded_steps=tuple(s.discarded for s in stages),
        busy_fraction=tuple(min(s.busy_time / total_time, 1.0) for s in stages),
        verify_fraction=tuple(
            s.verifications / (s.steps - s.discarded) if s.steps > s.discarded else math.nan for s in verifiers
        ),
        accepted_per_verify=tuple(_mean(s.accepted) for s in verifiers),
        offered_per_verify=tuple(_mean(s.offered) for s in verifiers),
        rejections=tuple(s.rejections for s in verifiers),
        accepted_counts=tuple(tuple(s.accepted) for s in verifiers),
        offered_counts=tuple(tuple(s.offered) for s in verifiers),
        step_offers=tuple(tuple(s.kinds) for s in verifiers),
    )
