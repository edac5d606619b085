"""Strategies as schedules of the one stage loop.

Every strategy runs the same loop in every stage process (`pipespec.stage`):
take the drafts the previous stage has published, verify them in one forward
pass with the shared rule, append the accepted prefix plus one own token,
publish downstream, and follow whatever the next stage commits. A strategy only
decides, per stage, when to step:

- `greedy`: only the target is active; it never has drafts, so every step is a
  one-token step.
- `sd` (synchronous chain; k = 2 is standard speculative decoding, k >= 3 the
  paper's tiered baseline): the first stage drafts `lookahead` tokens and stops;
  each verifier waits until its drafter has stopped, verifies the whole window
  and stops; only the target's commit, cascading upstream, releases the chain.
  At any moment exactly one stage computes.
- `pipespec` (asynchronous pipeline): every stage runs at once. Drafters keep
  drafting up to `max_lead` tokens beyond what the next stage has committed;
  a verifier takes whatever drafts are there, waiting only while fewer than
  `lookahead` are available and more are coming (0 = never wait), and takes a
  one-token step when there are none. Every verifier commits upstream after
  each step, so rejections cascade to the first stage.

`draft_confidence` (sd and pipespec; 0 = off) also stops a drafter early: once
the product of its own probabilities of the tokens it holds beyond the next
stage's last commit (the chance, by its own reckoning, that all of them
survive) falls below it. Drafts past that point are mostly rolled back, and on
a machine whose stages share memory bandwidth each one slows the target.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipespec.errors import ConfigError

STRATEGIES = ("greedy", "sd", "pipespec")


@dataclass(frozen=True)
class Role:
    """How one stage behaves in one request."""

    active: bool
    has_upstream: bool  # verifies drafts of the previous stage
    is_target: bool
    min_lead: int | None  # drafts to wait for while the drafter still produces; None: until it stops
    max_lead: int  # stop producing this many tokens ahead of the next stage's last commit
    commits_own_steps: bool  # tell the previous stage after each own step (else only forward commits)
    stop_below: float = 0.0  # stop drafting once the lead's own probability falls below this (0 = off)


def check_options(strategy: str, n_stages: int, lookahead: int, max_lead: int, draft_confidence: float = 0.0) -> None:
    if strategy not in STRATEGIES:
        raise ConfigError(f"strategy must be one of {list(STRATEGIES)}, got {strategy!r}")
    if strategy != "greedy" and n_stages < 2:
        raise ConfigError(f"strategy {strategy!r} needs at least 2 stages (drafters then the target), got {n_stages}")
    if not isinstance(lookahead, int) or lookahead < 0:
        raise ConfigError(f"lookahead must be an integer >= 0, got {lookahead!r}")
    if not isinstance(max_lead, int) or max_lead < 1:
        raise ConfigError(f"max_lead must be an integer >= 1, got {max_lead!r}")
    confidence = draft_confidence
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0 <= confidence < 1:
        raise ConfigError(f"draft_confidence must be a number with 0 <= draft_confidence < 1 (0 = off), got {confidence!r}")


def roles(strategy: str, n_stages: int, lookahead: int, max_lead: int, draft_confidence: float = 0.0) -> list[Role]:
    """One Role per stage, smallest first, target last."""
    check_options(strategy, n_stages, lookahead, max_lead, draft_confidence)
    stop = float(draft_confidence)
    last = n_stages - 1
    if strategy == "greedy":
        idle = Role(False, False, False, None, 0, False)
        return [idle] * last + [Role(True, False, True, None, 0, True)]
    if strategy == "sd":
        first = Role(True, False, False, None, lookahead, False, stop)
        middle = Role(True, True, False, None, 1, False)
        target = Role(True, True, True, None, 0, True)
    else:
        lead = max(max_lead, lookahead)  # a verifier waiting for `lookahead` drafts must be able to get them
        first = Role(True, False, False, None, lead, False, stop)
        middle = Role(True, True, False, lookahead, lead, True, stop)
        target = Role(True, True, True, lookahead, 0, True)
    return [first] + [middle] * (n_stages - 2) + [target]
