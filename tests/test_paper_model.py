"""Tests of the paper's closed-form model (analysis.paper_model) against hand-computed values."""

import math

import pytest

from analysis import paper_model as pm


def test_expected_tokens_per_verify_by_hand():
    # a = 0.8, g = 4: (1 - 0.8^5) / 0.2 = (1 - 0.32768) / 0.2 = 3.3616
    assert pm.expected_tokens_per_verify(0.8, 4) == pytest.approx(3.3616, abs=1e-12)
    # g = 0: only the verifier's own token
    assert pm.expected_tokens_per_verify(0.8, 0) == pytest.approx(1.0)
    # a = 0: every draft rejected, one token per call
    assert pm.expected_tokens_per_verify(0.0, 7) == pytest.approx(1.0)


def test_alpha_one_is_the_limit():
    assert pm.expected_tokens_per_verify(1.0, 4) == 5.0
    assert pm.expected_tokens_per_verify(1.0 - 1e-9, 4) == pytest.approx(5.0, rel=1e-6)
    assert pm.steady_state_rho(1.0, 4) == 1.0
    assert pm.pipespec_tokens_per_step(1.0, 4) == 5.0
    assert pm.sync_sd_throughput(1.0, 4, 4.0) == pytest.approx(5.0 / 2.0)


def test_eq1_expected_tokens_per_step():
    # rho = 0.5: 0.5 * 1 + 0.5 * 3.3616 = 2.1808
    assert pm.expected_tokens_per_step(0.5, 0.8, 4) == pytest.approx(2.1808)
    assert pm.expected_tokens_per_step(0.0, 0.8, 4) == pytest.approx(1.0)
    assert pm.expected_tokens_per_step(1.0, 0.8, 4) == pytest.approx(3.3616)


def test_eq2_one_step_by_hand():
    # rho' = 0.8 * 0.8^5 + 0.2 * 0.8 = 0.262144 + 0.16 = 0.422144
    assert pm.rho_step(0.8, 0.8, 4) == pytest.approx(0.422144)
    trajectory = pm.iterate_rho(0.8, 4, steps=2)
    assert trajectory[0] == 0.8  # rho(t_0) = a
    assert trajectory[1] == pytest.approx(0.422144)
    assert len(trajectory) == 3


def test_eq3_closed_form_by_hand():
    # 0.8 / (1 - 0.32768 + 0.8) = 0.8 / 1.47232
    assert round(pm.steady_state_rho(0.8, 4), 5) == 0.54336
    assert pm.steady_state_rho(0.0, 4) == 0.0
    assert pm.steady_state_rho(0.6, 0) == pytest.approx(0.6)  # g = 0: a / (1 - a + a)


@pytest.mark.parametrize("alpha,gamma", [(0.8, 4), (0.3, 1), (0.95, 8), (0.5, 20)])
def test_eq3_is_fixed_point_of_eq2(alpha, gamma):
    closed = pm.steady_state_rho(alpha, gamma)
    assert pm.rho_step(closed, alpha, gamma) == pytest.approx(closed, abs=1e-12)
    # the recursion contracts (|a^(g+1) - a| < 1), so iterating converges to it
    assert pm.iterate_rho(alpha, gamma, steps=400)[-1] == pytest.approx(closed, abs=1e-10)


def test_eq4_by_hand_and_notes_counterexample():
    # Eq.4 = 0.45664 + 0.54336 * 3.3616 = 2.2832; Eq.5 (c = 10) = 3.3616 / 1.4 = 2.4011
    eq4 = pm.pipespec_tokens_per_step(0.8, 4)
    eq5 = pm.sync_sd_throughput(0.8, 4, 10.0)
    assert round(eq4, 2) == 2.28
    assert round(eq5, 2) == 2.40
    assert eq4 < eq5  # the exact Eq.4 does not always beat SD; only the Eq.6 approximation does
    assert pm.pipespec_high_acceptance(0.8, 4) > eq5


@pytest.mark.parametrize("alpha", [0.01, 0.2, 0.5, 0.8, 0.99])
@pytest.mark.parametrize("gamma", [1, 2, 5, 16])
def test_theorem1_pipespec_beats_one_token_per_step(alpha, gamma):
    assert pm.pipespec_tokens_per_step(alpha, gamma) > 1.0


def test_theorem1_boundaries_give_exactly_one():
    assert pm.pipespec_tokens_per_step(0.0, 4) == 1.0
    assert pm.pipespec_tokens_per_step(0.7, 0) == pytest.approx(1.0)


def test_eq6_bounds_eq4_from_above():
    for alpha in (0.5, 0.9, 0.99):
        assert pm.pipespec_high_acceptance(alpha, 8) >= pm.pipespec_tokens_per_step(alpha, 8)


def test_eq5_by_hand():
    # a = 0.5, g = 2, c = 2: (1 - 0.125) / 0.5 / (1 + 1) = 0.875
    assert pm.sync_sd_throughput(0.5, 2, 2.0) == pytest.approx(0.875)


def test_leviathan_formulas():
    assert pm.leviathan_expected_tokens(0.8, 4) == pytest.approx(3.3616)
    # c' = 0.1: 3.3616 / (0.4 + 1)
    assert pm.leviathan_walltime_improvement(0.8, 4, 0.1) == pytest.approx(3.3616 / 1.4)
    # walltime improvement with c' = 1/c equals Eq. 5
    assert pm.leviathan_walltime_improvement(0.8, 4, 0.1) == pytest.approx(pm.sync_sd_throughput(0.8, 4, 10.0))


def test_leviathan_optimal_gamma():
    # a = 0.8, c' = 0.05: 1.0, 1.714, 2.218, 2.567, 2.801, 2.951, 3.040, 3.082, 3.092 (g=8), 3.078, ...
    assert pm.leviathan_optimal_gamma(0.8, 0.05) == 8
    values = {g: pm.leviathan_walltime_improvement(0.8, g, 0.05) for g in range(0, 40)}
    best = max(values, key=values.get)
    assert pm.leviathan_optimal_gamma(0.8, 0.05) == best
    assert pm.leviathan_optimal_gamma(0.0, 0.1) == 0  # nothing is ever accepted: do not draft
    assert pm.leviathan_optimal_gamma(0.99, 0.0, max_gamma=10) == 10  # free drafter: longest window
    # a = 0.8, c' = 0.1: optimum at g = 6 (local maximum check)
    g = pm.leviathan_optimal_gamma(0.8, 0.1)
    assert g == 6
    assert pm.leviathan_walltime_improvement(0.8, g, 0.1) >= pm.leviathan_walltime_improvement(0.8, g + 1, 0.1)
    assert pm.leviathan_walltime_improvement(0.8, g, 0.1) >= pm.leviathan_walltime_improvement(0.8, max(g - 1, 0), 0.1)


@pytest.mark.parametrize(
    "call,name",
    [
        (lambda: pm.steady_state_rho(1.5, 4), "alpha"),
        (lambda: pm.steady_state_rho(-0.1, 4), "alpha"),
        (lambda: pm.steady_state_rho(float("nan"), 4), "alpha"),
        (lambda: pm.steady_state_rho(0.5, -1), "gamma"),
        (lambda: pm.steady_state_rho(0.5, 2.5), "gamma"),
        (lambda: pm.steady_state_rho(0.5, "4"), "gamma"),
        (lambda: pm.expected_tokens_per_step(1.2, 0.5, 4), "rho"),
        (lambda: pm.sync_sd_throughput(0.5, 4, 0.0), "speed_ratio"),
        (lambda: pm.sync_sd_throughput(0.5, 4, -2.0), "speed_ratio"),
        (lambda: pm.leviathan_walltime_improvement(0.5, 4, -0.1), "cost_ratio"),
        (lambda: pm.iterate_rho(0.5, 4, steps=-1), "steps"),
    ],
)
def test_invalid_arguments_raise_value_error_naming_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_integer_like_gamma_accepted():
    assert pm.steady_state_rho(0.8, 4.0) == pm.steady_state_rho(0.8, 4)
    assert math.isfinite(pm.pipespec_tokens_per_step(0.8, 4.0))
