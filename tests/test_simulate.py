"""Tests of the discrete-event simulator (analysis.simulate) against the closed-form model.

What is checked against the paper's model, and why:

- Synchronous SD with per-token cost 0 (b = 0): tokens per target step is the
  mean of a truncated geometric, (1 - a^(g+1)) / (1 - a), and tokens/s times
  the target step time is Eq. (5). Exact up to sampling error.
- PipeSpec with a drafter 100x faster than the target and a fixed window
  (``verify_window`` = g, ``max_lead`` large enough that the drafter always
  holds a token at the bonus position): here the paper's two-state chain is
  exactly what the simulator does (after a verification the next target step
  verifies iff all g drafts and the bonus position agreed, a^(g+1); after a
  single step iff that token agreed, a), so the measured rho must match
  Eq. (3) and tokens per target step Eq. (4), up to sampling error.
- Without a window cap the offered count is set by the lead cap; we compare
  measured rho / tokens per step with Eq. (3) / (4) evaluated at the
  simulator's mean offered window, and check that Eq. (6) (rho -> 1) is only
  an upper bound: the simulator follows Eq. (4), not Eq. (6).
- Where the paper's assumptions do not hold (a drafter only 3-5x faster, so
  the offered window varies and is often small) we do not ask for agreement
  with Eq. (4); we check the qualitative claim that PipeSpec's throughput
  beats synchronous SD, both at the paper's window 8 and at Leviathan's
  optimal window.
- The notes' counterexample (g = 4, a = 0.8, c = 10): the exact model says
  Eq. (4) = 2.28 < Eq. (5) = 2.40; the simulator reproduces that ordering.
"""

import math

import numpy as np
import pytest

from analysis import paper_model as pm
from analysis import simulate as sim


def _standard_error(values):
    values = np.asarray(values, dtype=float)
    return values.std(ddof=1) / math.sqrt(len(values))


# --------------------------------------------------------------------------- autoregressive


def test_autoregressive_is_exactly_one_over_t1():
    cost = sim.StageCost(0.05, 0.01)
    result = sim.simulate_autoregressive(cost, 123)
    assert result.tokens_per_second == pytest.approx(1.0 / 0.06, rel=1e-12)
    assert result.total_time == pytest.approx(123 * 0.06)
    assert result.tokens_generated == 123 and result.steps == (123,)


def test_a_context_cost_follows_the_context_each_step_attends_to():
    """t(n) measured at 100 tokens of context, each further token adding 1% of it per step fed (1% for one-token
    steps, 3% for three, interpolated between the sizes measured): the greedy run's steps each cost their own
    context's, and a pipeline after a longer prompt takes longer; without a prompt every step costs the
    table's."""
    table = sim.TableCost((0.10, 0.12, 0.13, 0.14))
    cost = sim.ContextCost(table, base_tokens=100, slope_sizes=(1, 3), slopes=(0.01, 0.03))
    assert cost(1) == 0.10 and cost.slope(2) == pytest.approx(0.02) and cost.slope(9) == pytest.approx(0.03)
    at_120 = cost.at_prompt(120)
    assert at_120(1) == pytest.approx(0.12) and at_120(2, generated=10) == pytest.approx(0.12 * (1 + 30 * 0.02))
    assert cost.at_prompt(0)(4) == pytest.approx(0.07)  # less context: cheaper, down to half the measured cost
    greedy = sim.simulate_autoregressive(at_120, 50)
    assert greedy.total_time == pytest.approx(sum(0.10 * (1 + 0.01 * (20 + g)) for g in range(50)))
    assert sim.simulate_autoregressive(cost, 50).total_time == pytest.approx(50 * 0.10)
    drafter = sim.ContextCost(sim.TableCost((0.01,)), 100, (1,), (0.01,))
    times = {prompt: sim.simulate_pipespec([drafter.at_prompt(prompt), cost.at_prompt(prompt)], [0.7], 64,
                                           seed=3).total_time for prompt in (100, 400)}  # fmt: skip
    plain = sim.simulate_pipespec([drafter, cost], [0.7], 64, seed=3).total_time
    assert times[100] > plain and times[400] > 1.5 * times[100]
    with pytest.raises(ValueError, match="slope_sizes"):
        sim.ContextCost(table, 100, (3, 1), (0.0, 0.0))


# --------------------------------------------------------------------------- synchronous SD


@pytest.mark.parametrize("alpha,gamma", [(0.6, 3), (0.9, 5)])
def test_sync_sd_tokens_per_target_step_matches_leviathan(alpha, gamma):
    result = sim.simulate_sync_sd([sim.StageCost(0.01), sim.StageCost(1.0)], [alpha], gamma, 20000, seed=1)
    expected = pm.expected_tokens_per_verify(alpha, gamma)
    counts = result.accepted_counts[0]
    assert abs(result.tokens_per_target_step - expected) < 4 * _standard_error(counts)
    assert set(result.offered_counts[0]) == {gamma}
    assert result.verify_fraction == (1.0,)


def test_sync_sd_throughput_matches_eq5():
    alpha, gamma, speed_ratio = 0.8, 4, 10.0
    result = sim.simulate_sync_sd([sim.StageCost(1.0 / speed_ratio), sim.StageCost(1.0)], [alpha], gamma, 20000)
    # b = 0: a round costs g / c + 1 target-step units, so tokens/s (target step = 1 s) is Eq. 5
    assert result.tokens_per_second == pytest.approx(pm.sync_sd_throughput(alpha, gamma, speed_ratio), rel=0.02)


def test_sync_sd_three_stages_and_gamma_zero():
    costs = [sim.StageCost(0.01), sim.StageCost(0.1), sim.StageCost(1.0)]
    result = sim.simulate_sync_sd(costs, [0.7, 0.9], 6, 2000, seed=2)
    assert len(result.accepted_per_verify) == 2
    assert max(result.offered_counts[1]) <= 7  # the middle stage offers its accepted drafts plus its own token
    ar_like = sim.simulate_sync_sd(costs[1:], [0.9], 0, 100)
    assert ar_like.total_time == pytest.approx(100 * 1.0)  # no drafting: the target steps alone
    # three stages, window 0: as in the engine (pipespec.schedule's sd roles), the first stage never
    # drafts, the middle takes one-token steps and the target verifies each of them
    chain = sim.simulate_sync_sd(costs, [0.7, 0.9], 0, 100)
    assert chain.steps[0] == 0 and set(chain.offered_counts[1]) == {1}
    assert chain.total_time == pytest.approx(chain.target_steps * (0.1 + 1.0))


# --------------------------------------------------------------------------- PipeSpec vs the paper's model


def test_pipespec_fixed_window_matches_eq3_and_eq4():
    alpha, gamma = 0.8, 4
    result = sim.simulate_pipespec(
        [sim.StageCost(0.01), sim.StageCost(1.0)], [alpha], 30000, verify_window=gamma, max_lead=16, seed=0
    )
    assert set(result.offered_counts[0]) == {gamma}  # the drafter always filled the window
    # about 13,000 target steps: sampling error of rho ~0.005 (steps are correlated, so allow 0.02)
    assert result.verify_fraction[0] == pytest.approx(pm.steady_state_rho(alpha, gamma), abs=0.02)
    assert result.tokens_per_target_step == pytest.approx(pm.pipespec_tokens_per_step(alpha, gamma), abs=0.04)
    assert result.tokens_per_target_step > 1.0  # Theorem 1


def test_pipespec_fast_drafter_uses_mean_offered_window():
    alpha = 0.9
    result = sim.simulate_pipespec([sim.StageCost(0.01), sim.StageCost(1.0)], [alpha], 20000, max_lead=32, seed=0)
    window = round(result.offered_per_verify[0])  # what to plug into Eq. 3 for an asynchronous run
    eq3 = pm.steady_state_rho(alpha, window)
    eq4 = pm.pipespec_tokens_per_step(alpha, window)
    eq6 = pm.pipespec_high_acceptance(alpha, window)
    print(f"rho sim={result.verify_fraction[0]:.3f} eq3={eq3:.3f}; tokens/step sim="
          f"{result.tokens_per_target_step:.3f} eq4={eq4:.3f} eq6={eq6:.3f} (window {window})")
    assert result.verify_fraction[0] == pytest.approx(eq3, abs=0.03)
    assert result.tokens_per_target_step == pytest.approx(eq4, rel=0.05)
    # Eq. 6 assumes rho -> 1; with a rejection costing a single-token step the simulator stays well below it
    assert result.tokens_per_target_step < 0.7 * eq6


def test_counterexample_exact_eq4_below_eq5():
    alpha, gamma, speed_ratio = 0.8, 4, 10.0
    costs = [sim.StageCost(1.0 / speed_ratio), sim.StageCost(1.0)]
    pipespec = sim.simulate_pipespec(costs, [alpha], 30000, verify_window=gamma, max_lead=16, seed=0)
    sync = sim.simulate_sync_sd(costs, [alpha], gamma, 30000, seed=0)
    assert pipespec.tokens_per_second == pytest.approx(2.28, abs=0.05)
    assert sync.tokens_per_second == pytest.approx(2.40, abs=0.05)
    assert pipespec.tokens_per_second < sync.tokens_per_second


@pytest.mark.parametrize("alpha,speed_ratio", [(0.8, 5.0), (0.9, 3.0)])
def test_pipespec_beats_sync_sd_with_moderately_fast_drafter(alpha, speed_ratio):
    costs = [sim.StageCost(1.0 / speed_ratio), sim.StageCost(1.0)]
    pipespec = sim.simulate_pipespec(costs, [alpha], 10000, max_lead=32, seed=0)
    best_gamma = pm.leviathan_optimal_gamma(alpha, 1.0 / speed_ratio)
    for gamma in {best_gamma, 8}:
        sync = sim.simulate_sync_sd(costs, [alpha], gamma, 10000, seed=0)
        assert pipespec.tokens_per_second > sync.tokens_per_second


# --------------------------------------------------------------------------- mechanics


def _token_accounting_holds(result):
    # every applied target step commits its accepted count, or one token if it was a single step
    verifications = len(result.accepted_counts[-1])
    singles = result.target_steps - verifications
    return sum(result.accepted_counts[-1]) + singles == result.committed_tokens


def test_three_stage_pipeline_with_delay_and_costs():
    costs = [sim.StageCost(0.012, 1e-4), sim.StageCost(0.025, 1e-3), sim.StageCost(0.12, 1e-2)]
    for delay in (0.0, 0.01):
        result = sim.simulate_pipespec(costs, [0.75, 0.85], 2000, rollback_delay=delay, seed=3)
        assert result.tokens_generated == 2000 and result.committed_tokens >= 2000
        assert all(0.0 <= f <= 1.0 for f in result.busy_fraction)
        assert all(0.0 <= r <= 1.0 for r in result.verify_fraction)
        assert result.discarded_steps[0] > 0  # rollbacks hit the drafter mid-step
        assert result.discarded_steps[-1] == 0  # nobody rolls the target back
        assert _token_accounting_holds(result)
        ar = sim.simulate_autoregressive(costs[-1], 2000)
        assert result.tokens_per_second > ar.tokens_per_second


def test_commit_during_a_step_is_adopted_after_it_as_the_engine_does():
    # a drafter slower than its target: each of the target's one-token commits arrives while the drafter
    # is still computing that position. The engine finishes the step and keeps it where the tokens agree
    # (StageRequest.adopt): with agreement certain no drafter step is wasted, with none every one is.
    costs = [sim.StageCost(0.15), sim.StageCost(0.1)]
    agree = sim.simulate_pipespec(costs, [1.0], 300, seed=0)
    assert agree.steps[0] > 150 and agree.discarded_steps == (0, 0)
    disagree = sim.simulate_pipespec(costs, [0.0], 300, seed=0)
    assert disagree.discarded_steps[0] == disagree.steps[0]


def test_lookahead_is_a_minimum_offer():
    result = sim.simulate_pipespec([0.02, 0.1], [0.8], 2000, lookahead=3, max_lead=8, seed=5)
    assert min(result.offered_counts[0]) >= 3
    assert result.verify_fraction[0] == 1.0  # a verifier that waits never takes single steps


def test_replay_of_logged_counts():
    # count 3 = two drafts accepted + own token; with >= 2 drafts always offered it replays exactly
    result = sim.simulate_pipespec([0.01, 1.0], [[3]], 3000, max_lead=16, verify_window=10, seed=0)
    assert set(result.accepted_counts[0]) == {3}
    assert _token_accounting_holds(result)
    sync = sim.simulate_sync_sd([0.01, 1.0], [sim.Replay((1, 4, 9))], 5, 300)
    assert sync.accepted_counts[0][:3] == (1, 4, 6)  # 9 truncated to 5 offered drafts + own token


def test_deterministic_under_seed():
    args = ([sim.StageCost(0.02, 1e-3), sim.StageCost(0.1, 1e-2)], [0.7], 1500)
    assert sim.simulate_pipespec(*args, seed=11) == sim.simulate_pipespec(*args, seed=11)
    assert sim.simulate_pipespec(*args, seed=11) != sim.simulate_pipespec(*args, seed=12)
    assert sim.simulate_sync_sd(args[0], args[1], 4, 1500, seed=11) == sim.simulate_sync_sd(
        args[0], args[1], 4, 1500, seed=11
    )


def test_alpha_extremes():
    costs = [sim.StageCost(0.01), sim.StageCost(1.0)]
    perfect = sim.simulate_pipespec(costs, [1.0], 1000, max_lead=16, verify_window=4, seed=0)
    assert set(perfect.accepted_counts[0]) == {5} and perfect.rejections == (0,)
    useless = sim.simulate_pipespec(costs, [0.0], 200, seed=0)
    assert useless.tokens_per_target_step == 1.0
    assert sim.simulate_sync_sd(costs, [0.0], 4, 200).tokens_per_target_step == 1.0


@pytest.mark.parametrize(
    "call,name",
    [
        (lambda: sim.StageCost(-1.0), "fixed"),
        (lambda: sim.StageCost(0.0, 0.0), "positive time"),
        (lambda: sim.Bernoulli(1.5), "alpha"),
        (lambda: sim.Replay(()), "counts"),
        (lambda: sim.simulate_pipespec([1.0], [], 10), "costs"),
        (lambda: sim.simulate_pipespec([0.1, 1.0], [0.5, 0.5], 10), "acceptances"),
        (lambda: sim.simulate_pipespec([0.1, 1.0], [0.5], 0), "max_new_tokens"),
        (lambda: sim.simulate_pipespec([0.1, 1.0], [0.5], 10, lookahead=5, max_lead=4), "max_lead"),
        (lambda: sim.simulate_pipespec([0.1, 1.0], [0.5], 10, lookahead=3, verify_window=2), "verify_window"),
        (lambda: sim.simulate_pipespec([0.1, 1.0], [0.5], 10, rollback_delay=-1.0), "rollback_delay"),
        (lambda: sim.simulate_sync_sd([0.1, 1.0], [0.5], -1, 10), "gamma"),
    ],
)
def test_invalid_inputs(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_acceptance_along_continuations_is_read_off_them_by_position():
    """A verification starting at output position j accepts min(offered, runs[j]): easy and hard stretches
    come where the profile's continuation had them (positions past its end wrap to its start)."""
    pattern = (2, 1, 0, 5, 4, 3, 2, 1, 0)
    result = sim.simulate_sync_sd([0.01, 0.05], [sim.AlongContinuations([pattern], (0.5,))], 3, 30, seed=0)
    # starts 0 (run 2), 3 (run 5, 3 offered), 7 (run 1), 9 = 0 again ...: accepted + the target's own token
    assert result.accepted_counts[0] == (3, 4, 2) * 3 + (3,)
    # generation s follows continuation s mod 2: the second is never right
    never = sim.AlongContinuations([pattern, (0,) * 9], (0.5,))
    assert sim.simulate_sync_sd([0.01, 0.05], [never], 3, 30, seed=1).accepted_counts[0] == (1,) * 30
    with pytest.raises(ValueError, match="runs"):
        sim.AlongContinuations([()], (0.5,))


@pytest.mark.parametrize("schedule", ["sd", "pipespec"])
def test_a_model_free_drafter_proposes_where_and_as_much_as_it_did_along_the_continuation(schedule):
    """With the proposal lengths measured along the continuation (`proposed`), a model-free drafter proposes at
    output position j exactly proposed[j] drafts (at most its window), none where it had no proposal: its
    proposals and their acceptance come together, whatever its overall proposal rate (`supply`)."""
    runs = (0, 0, 3, 2, 1, 0, 0, 0)
    proposed = (0, 0, 4, 3, 2, 2, 0, 0)
    along = sim.AlongContinuations([runs], (0.9,), proposed=[proposed])
    if schedule == "sd":
        result = sim.simulate_sync_sd([0.001, 0.05], [along], 6, 32, seed=0, supply=[0.01, None], end_at_budget=True)
    else:
        result = sim.simulate_pipespec([0.001, 0.05], [along], 32, lookahead=1, max_lead=6, seed=0,
                                       supply=[0.01, None], end_at_budget=True)  # fmt: skip
    # positions 0, 1: one-token steps; 2: 4 offered, 3 accepted + own token -> 6: none ... every 8 tokens
    assert result.offered_counts[0] == (4,) * 4 and result.accepted_counts[0] == (4,) * 4
    assert result.target_steps == 4 * 5  # per 8 tokens: steps at 0, 1, 2 (4 tokens), 6, 7
    # the overall rate alone: proposals drawn at random positions, mostly where nothing is right
    drawn = sim.AlongContinuations([runs], (0.9,))
    unmeasured = sim.simulate_sync_sd([0.001, 0.05], [drawn], 6, 32, seed=0, supply=[1.0, None], end_at_budget=True)
    assert unmeasured.offered_counts[0] != result.offered_counts[0]
    with pytest.raises(ValueError, match="proposed"):
        sim.AlongContinuations([runs], (0.9,), proposed=[(1,) * 8])  # a run longer than its proposal


def test_a_model_free_drafter_proposes_on_from_the_end_of_its_proposal():
    """Like the engine's, a model-free drafter whose lead allows proposes again from its buffer's end: what
    it proposed at that position along the continuation. Where its first proposal was right to its end,
    the verification reads on into the second (their drafts are what it would have proposed there)."""
    runs = (3, 2, 1, 2, 1, 0, 0, 0)
    proposed = (3, 2, 1, 4, 3, 2, 0, 0)
    along = sim.AlongContinuations([runs], (0.9,), proposed=[proposed])
    result = sim.simulate_sync_sd([0.001, 0.05], [along], 8, 8, seed=0, supply=[0.01, None], end_at_budget=True)
    # 3 at position 0, then 4 from position 3 (position 7: none): 3 kept, then 2 of the second, + own token
    assert result.offered_counts[0][0] == 7 and result.accepted_counts[0][0] == 6
    sampler = along.sampler(np.random.default_rng(0))
    assert [sampler.verify(7, 0), sampler.verify(2, 0), sampler.verify(7, 1), sampler.verify(7, 3)] == [5, 2, 4, 2]
    model = sim.AlongContinuations([runs], (0.9,)).sampler(np.random.default_rng(0))  # a model's runs are whole
    assert model.verify(7, 0) == 3
