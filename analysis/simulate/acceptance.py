"""The simulator's acceptance, one spec per adjacent pair (drafter i-1, verifier i), each giving a sampler per
simulated generation (``Sampler``). ``Bernoulli`` (i.i.d.): every offered draft is accepted independently
with probability alpha, wherever it came from, so a verification of n drafts accepts a geometric prefix
j <= n and the verifier appends its own token; where a stage appends an own token at a position its
drafter already holds, the two agree with probability alpha (else the drafter rolls back). ``Replay``:
logged accepted counts verification by verification (count k accepts min(k - 1, n) of n). ``ByPosition``:
a rate per draft position. ``AlongContinuations``: read off a profile's continuations, easy and hard
stretches as they came; ``TreeContinuations``: the same for a model-free drafter's token trees, whose
verification feeds the tree's nodes. A model-free drafter proposes what it proposed there where measured
(``proposed``). docs/concepts/strategies.md ("Token trees") and docs/prediction.md.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Sequence, Union

import numpy as np

from analysis.fit import estimate_alpha


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
    the drafter gets right from output position j of continuation c (`experiments.profiler_acceptance`: its greedy
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
    ``nodes[c][j]`` how many nodes that tree holds (`experiments.profiler_acceptance.tree_runs`). A tree verification
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
