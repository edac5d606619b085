"""The three decodings the simulator plays (docs/concepts/strategies.md):

- ``simulate_autoregressive``: the target alone, one t(1) step per token;
- ``simulate_sync_sd``: lockstep rounds, stage 0 drafts ``gamma`` tokens one step at a time, then stages
  1..K verify in turn and every stage follows the target's commit; rounds never overlap;
- ``simulate_pipespec``: every stage at once; stage 0 drafts while its lead is below ``max_lead``, a
  verifier takes every draft beyond its committed output (waiting for ``lookahead`` while its drafter
  still produces), and a stage whose buffer disagrees with a commit rolls back and forwards it upstream,
  ``rollback_delay`` seconds a hop.
"""

from __future__ import annotations

import math
from typing import Sequence

from analysis.simulate.acceptance import AcceptanceSpec
from analysis.simulate.costs import ContextCost, StageCost, TableCost, _as_cost, _check_int
from analysis.simulate.engine import Simulation
from analysis.simulate.result import SimResult
from pipespec.schedule import DEFAULT_MAX_LEAD


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
