"""The one acceptance rule, shared by every strategy and every stage.

A verifier runs one forward pass over its last committed token followed by the
offered draft tokens; row j of its logits predicts the token after position j.
It keeps a prefix of the drafts and appends one token of its own: the
correction at the first rejected draft, or the bonus token when every draft was
kept. A stage with no drafts (a drafter, or a verifier taking a one-token step)
runs the same rule with zero drafts: its own token is the bonus token.

How drafts are kept (`VerifyRule.decide`):

- temperature 0 (the default): exact match. A draft is kept while it equals the
  verifier's argmax; the own token is the argmax. Every strategy then returns
  exactly what greedy decoding of the target returns.
- temperature > 0: speculative sampling (Leviathan et al. 2023; Chen et al.
  2023). p is the verifier's and q the drafter's distribution at the same
  position, after the same temperature / top-k / top-p transform
  (`sampling_probs`). Draft x is kept with probability min(1, p(x) / q(x)); at
  the first rejection the own token is drawn from max(0, p - q), normalised; if
  all are kept the bonus token is drawn from p. Every emitted token is then
  distributed exactly as p given the tokens before it, so the output follows
  the target's sampling distribution whatever the drafters are.
- a token tree (`VerifyRule.decide_tree`; a model-free drafter's several continuations, each a point
  mass, `pipespec.tree`): row 0 of the verifier's logits follows its pending tokens, row
  1 + j node j. From the root, the verifier's own token at the current row is its argmax (greedy) or a
  draw from p (sampling); if a child of the current node holds it, that child is accepted and the walk
  goes on from it, else the walk stops and that token is the own token. Greedy, this is exactly greedy
  decoding; sampling, every emitted token is a draw from p, so it follows p whatever the tree (for
  point-mass drafts this is speculative sampling: a single child x is kept with probability p(x)).
- acceptance "synthetic" (benchmarking only, not lossless): each offered draft
  is kept by a seeded coin with a fixed probability, whatever the tokens; the
  own token is the verifier's argmax (like vLLM's synthetic rejection sampler).

The distribution message. A verifier needs q for every draft it checks, so with
every token it emits a stage also emits the distribution that token follows:
its own transformed distribution p at that position (`Verdict.probs`), for an
accepted draft as for its own correction or bonus token. That is the right q
for the next stage: the next stage cannot tell an accepted draft from a
correction, and over both the token is distributed exactly as p (sending the
residual for corrections would be wrong). A prompt-lookup drafter proposes
deterministically, so its q is a point mass on the proposed token: acceptance
probability p(x), residual p without x. `encode_dist` stores a row sparsely,
(ids int32, probs float32) = 8 bytes per token of the support, when the support
is under half the vocabulary (top-k / top-p leave a few tokens: top_k = 50 is
400 bytes), else as the full float32 vector (4 bytes x vocabulary: 192 KiB for
SmolLM2's 49152). float32 and no re-quantisation: the drafter samples from
exactly the numbers it sends, so the ratio test is exact. `pipespec.stage`
sends each distribution once (see its docstring). At temperature 0 and under
synthetic acceptance nothing is sent.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import asdict, dataclass
from typing import NamedTuple, Sequence

import numpy as np
import torch

from pipespec.tree import DraftTree
from pipespec.errors import ConfigError

ACCEPTANCE_MODES = ("exact", "synthetic")


# ---- options -----------------------------------------------------------------


@dataclass(frozen=True)
class Sampling:
    """How every stage draws its tokens. temperature 0 is greedy (top_k / top_p then do not matter)."""

    temperature: float = 0.0
    top_k: int = 0  # keep the k most likely tokens; 0 = off
    top_p: float = 1.0  # keep the smallest set of most likely tokens with this much mass; 1 = off
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Acceptance:
    """How verifiers keep drafts: "exact" (lossless) or "synthetic" (a coin per draft, rates[i - 1] at stage i)."""

    mode: str = "exact"
    rates: tuple[float, ...] | None = None

    @property
    def lossless(self) -> bool:
        return self.mode == "exact"


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_sampling(temperature, top_k, top_p, seed) -> Sampling:
    """Validate the sampling options (ConfigError naming the option); `seed` must already be an int."""
    if not _is_number(temperature) or temperature < 0:
        raise ConfigError(f"temperature must be a number >= 0 (0 = greedy), got {temperature!r}")
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 0:
        raise ConfigError(f"top_k must be an integer >= 0 (0 = off), got {top_k!r}")
    if not _is_number(top_p) or not 0 < top_p <= 1:
        raise ConfigError(f"top_p must be a number with 0 < top_p <= 1 (1 = off), got {top_p!r}")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ConfigError(f"seed must be an integer >= 0 or None (a fresh seed per call), got {seed!r}")
    return Sampling(float(temperature), top_k, float(top_p), seed)


def check_acceptance(mode, rates, n_stages: int, sampling: Sampling) -> Acceptance:
    """Validate the acceptance options; `rates` is one float for every pair or a list of k - 1 floats."""
    if mode not in ACCEPTANCE_MODES:
        raise ConfigError(f"acceptance must be one of {list(ACCEPTANCE_MODES)}, got {mode!r}")
    pairs = max(n_stages - 1, 0)
    if rates is not None:
        values = [rates] * pairs if _is_number(rates) else rates
        if (
            not isinstance(values, (list, tuple))
            or len(values) != pairs
            or not all(_is_number(r) and 0 <= r <= 1 for r in values)
        ):
            raise ConfigError(
                f"synthetic_rates must be a number in [0, 1] or a list of {pairs} (one per drafter/verifier "
                f"pair) numbers in [0, 1], got {rates!r}"
            )
        rates = tuple(float(r) for r in values)
    if mode == "exact":
        return Acceptance("exact", rates)
    if rates is None:
        raise ConfigError("acceptance='synthetic' needs synthetic_rates (the probability a verifier keeps a draft)")
    if not sampling.greedy:
        raise ConfigError(
            f"acceptance='synthetic' draws every own token greedily: it needs temperature 0, got {sampling.temperature}"
        )
    return Acceptance("synthetic", rates)


def stage_seed(seed: int, stage: int, purpose: str) -> int:
    """A 63-bit seed for one stage and one use, well mixed so that nearby seeds give unrelated streams."""
    digest = hashlib.sha256(f"pipespec:{seed}:{stage}:{purpose}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


# ---- distributions -------------------------------------------------------------


def sampling_probs(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """Rows of float32 probabilities after temperature, then top-k, then top-p (each row sums to 1)."""
    scores = logits.float() / sampling.temperature
    vocab = scores.shape[-1]
    if 0 < sampling.top_k < vocab:
        kth = torch.topk(scores, sampling.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))  # ties with the k-th stay: same for p and q
    probs = torch.softmax(scores, dim=-1)
    if sampling.top_p < 1:
        ordered, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        mass_before = torch.cumsum(ordered, dim=-1) - ordered
        drop = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, mass_before >= sampling.top_p)
        probs = probs.masked_fill(drop, 0.0)  # the most likely token always stays (mass before it is 0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


@dataclass(frozen=True)
class TokenDist:
    """One emitted token's distribution as sent downstream: sparse (ids, probs) or the full vector (ids None)."""

    ids: np.ndarray | None
    probs: np.ndarray

    def prob(self, token: int) -> float:
        if self.ids is None:
            return float(self.probs[token]) if token < len(self.probs) else 0.0
        where = np.flatnonzero(self.ids == token)
        return float(self.probs[where[0]]) if len(where) else 0.0

    def dense(self, vocab: int) -> torch.Tensor:
        """The full float32 vector over a verifier's `vocab` (its logits width; padded ids beyond it dropped)."""
        out = torch.zeros(vocab, dtype=torch.float32)
        if self.ids is None:
            n = min(vocab, len(self.probs))
            out[:n] = torch.from_numpy(self.probs[:n])
        else:
            keep = self.ids < vocab
            out[torch.from_numpy(self.ids[keep].astype(np.int64))] = torch.from_numpy(self.probs[keep])
        return out


def encode_dist(row: torch.Tensor) -> TokenDist:
    """Sparse when the support is under half the vocabulary (8 bytes a token vs 4 a vocabulary entry)."""
    row = row.detach().float().cpu()
    support = torch.nonzero(row, as_tuple=True)[0]
    if 2 * len(support) < len(row):
        return TokenDist(support.numpy().astype(np.int32), row[support].numpy())
    return TokenDist(None, row.numpy().copy())


def point_mass(token: int) -> TokenDist:
    """The distribution of a deterministic proposal (prompt lookup)."""
    return TokenDist(np.array([token], dtype=np.int32), np.array([1.0], dtype=np.float32))


# ---- the rule ------------------------------------------------------------------


class Verdict(NamedTuple):
    accepted: int  # drafts kept
    token: int  # the verifier's own next token (correction or bonus)
    probs: torch.Tensor | None  # accepted + 1 rows: the distribution each emitted token follows; None unless sampling


def greedy_verify(draft_tokens: Sequence[int], verifier_logits: torch.Tensor) -> tuple[int, int]:
    """Return (number of drafts accepted, the verifier's own next token).

    `verifier_logits` has one row per fed position: len(draft_tokens) + 1 rows,
    row 0 being the prediction after the last committed token.
    """
    _check_rows(draft_tokens, verifier_logits)
    predictions = verifier_logits.argmax(dim=-1).tolist()
    accepted = 0
    while accepted < len(draft_tokens) and draft_tokens[accepted] == predictions[accepted]:
        accepted += 1
    return accepted, predictions[accepted]


def speculative_verify(
    draft_tokens: Sequence[int],
    draft_dists: Sequence[TokenDist],
    verifier_logits: torch.Tensor,
    sampling: Sampling,
    generator: torch.Generator,
    check_drafts: bool = True,
) -> Verdict:
    """Speculative sampling over a run of drafts; `check_drafts=False` keeps every draft (a wrong rule, for tests)."""
    _check_rows(draft_tokens, verifier_logits)
    if len(draft_dists) != len(draft_tokens):
        raise ValueError(f"{len(draft_tokens)} drafts but {len(draft_dists)} draft distributions")
    probs = sampling_probs(verifier_logits.detach().cpu(), sampling)
    vocab = probs.shape[-1]
    for i, (token, dist) in enumerate(zip(draft_tokens, draft_dists)):
        if not check_drafts:
            continue
        q_x = dist.prob(token)
        if q_x <= 0:
            raise ValueError(f"draft {i} (token {token}) has probability 0 under the distribution sent with it")
        u = float(torch.rand((), generator=generator))
        if u * q_x < float(probs[i, token]):  # u < p(x) / q(x): kept with probability min(1, p(x) / q(x))
            continue
        residual = (probs[i] - dist.dense(vocab)).clamp_min(0.0)
        if residual.sum() <= 0:  # p == q up to rounding: a rejection has probability ~0; p is then exact
            residual = probs[i]
        return Verdict(i, _draw(residual, generator), probs[: i + 1])
    n = len(draft_tokens)
    return Verdict(n, _draw(probs[n], generator), probs[: n + 1])


class TreeVerdict(NamedTuple):
    path: list[int]  # the accepted nodes, root to leaf
    token: int  # the verifier's own next token
    probs: torch.Tensor | None  # len(path) + 1 rows: the distribution each emitted token follows; None unless sampling

    @property
    def accepted(self) -> int:
        return len(self.path)

    @property
    def rows(self) -> list[int]:
        """The logits rows that decided each emitted token: the root's, then each accepted node's."""
        return [0] + [node + 1 for node in self.path]


def tree_verify(tree: DraftTree, verifier_logits: torch.Tensor, draw=None, check_drafts: bool = True) -> TreeVerdict:
    """Walk `tree` from the root (`VerifyRule.decide_tree`): at each node the own token is `draw(row)` (None:
    the argmax of its logits row); the child holding it is accepted, else the walk ends with that token.
    `check_drafts=False` follows the most likely child without looking (a wrong rule, for tests)."""
    if verifier_logits.shape[0] != len(tree) + 1:
        raise ValueError(f"verifier_logits has {verifier_logits.shape[0]} rows, expected {len(tree) + 1}")
    children = tree.children()
    predictions = None if draw is not None else verifier_logits.argmax(dim=-1).tolist()
    path: list[int] = []
    while True:
        row = path[-1] + 1 if path else 0
        here = children[row]
        if not check_drafts and here:
            path.append(here[0])
            continue
        token = predictions[row] if draw is None else draw(row)
        child = next((c for c in here if tree.tokens[c] == token), None)
        if child is None:
            return TreeVerdict(path, token, None)
        path.append(child)


def synthetic_verify(
    draft_tokens: Sequence[int], verifier_logits: torch.Tensor, rate: float, coins: random.Random
) -> Verdict:
    """Keep each draft by a coin of probability `rate` until the first tails; own token = argmax (not lossless)."""
    _check_rows(draft_tokens, verifier_logits)
    accepted = 0
    while accepted < len(draft_tokens) and coins.random() < rate:
        accepted += 1
    return Verdict(accepted, int(verifier_logits[accepted].argmax()), None)


def _draw(weights: torch.Tensor, generator: torch.Generator) -> int:
    return int(torch.multinomial(weights, 1, generator=generator))


def _check_rows(draft_tokens: Sequence[int], verifier_logits: torch.Tensor) -> None:
    if verifier_logits.shape[0] != len(draft_tokens) + 1:
        raise ValueError(
            f"verifier_logits has {verifier_logits.shape[0]} rows, expected {len(draft_tokens) + 1}"
        )


@dataclass
class VerifyRule:
    """The rule one stage applies in one request, with its own seeded randomness."""

    sampling: Sampling = Sampling()
    acceptance: Acceptance = Acceptance()
    stage: int = 0
    check_drafts: bool = True  # False: keep every draft unchecked (a deliberately wrong rule, for tests)

    def __post_init__(self):
        self.generator = torch.Generator().manual_seed(stage_seed(self.sampling.seed, self.stage, "sampling"))
        self.coins = random.Random(stage_seed(self.sampling.seed, self.stage, "synthetic"))

    @property
    def uses_dists(self) -> bool:
        """Whether verifiers check drafts against the distribution each was drawn from (sampling, exact)."""
        return self.acceptance.mode == "exact" and not self.sampling.greedy

    def decide(
        self, draft_tokens: Sequence[int], draft_dists: Sequence[TokenDist] | None, verifier_logits: torch.Tensor
    ) -> Verdict:
        if self.acceptance.mode == "synthetic" and draft_tokens:
            return synthetic_verify(draft_tokens, verifier_logits, self.acceptance.rates[self.stage - 1], self.coins)
        if not self.uses_dists:  # greedy (also every own token under synthetic acceptance)
            if not self.check_drafts:
                return Verdict(len(draft_tokens), int(verifier_logits[len(draft_tokens)].argmax()), None)
            accepted, token = greedy_verify(draft_tokens, verifier_logits)
            return Verdict(accepted, token, None)
        return speculative_verify(
            draft_tokens, draft_dists or [], verifier_logits, self.sampling, self.generator, self.check_drafts
        )

    def decide_tree(self, tree: DraftTree, verifier_logits: torch.Tensor) -> TreeVerdict:
        """The rule over a model-free drafter's token tree (the module docstring); synthetic acceptance has
        no tree rule (`pipespec.options.CallOptions.plan` refuses trees with it)."""
        if self.acceptance.mode == "synthetic":
            raise ConfigError("acceptance 'synthetic' has no rule for token trees (tree_nodes > 0)")
        if not self.uses_dists:
            return tree_verify(tree, verifier_logits, check_drafts=self.check_drafts)
        probs = sampling_probs(verifier_logits.detach().cpu(), self.sampling)
        verdict = tree_verify(tree, verifier_logits, lambda row: _draw(probs[row], self.generator), self.check_drafts)
        return verdict._replace(probs=probs[verdict.rows])
