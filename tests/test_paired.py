"""Paired speed claims (analysis.paired): the rotation, the geometric-mean speedup and its two intervals."""

import math

import numpy as np
import pytest

from analysis.paired import (AFTER_WAIT, BESIDE, FOLLOWS, Sample, decoding_busy, overlapping, paired_speedups, rotation,
                             speed_factor, step_conditions)


def test_the_rotation_puts_every_item_in_every_position_equally_often():
    items = ["greedy", "a", "b", "c"]
    for repetition in range(3):
        orders = [rotation(items, prompt, repetition) for prompt in range(len(items))]
        for position in range(len(items)):
            assert sorted(order[position] for order in orders) == sorted(items)
        assert all(sorted(order) == sorted(items) for order in orders)
    assert rotation(items, 1, 0) != rotation(items, 0, 0) and rotation(items, 0, 1) == rotation(items, 1, 0)
    assert rotation([], 3, 2) == []


def _samples(ratios: dict[str, list[list[float]]], greedy_tps: list[list[float]]) -> list[Sample]:
    """Samples whose configurations run `ratio` x greedy's tokens/s, per prompt and repetition."""
    out = []
    for p, per_rep in enumerate(greedy_tps):
        for r, tps in enumerate(per_rep):
            out.append(Sample("greedy", f"p{p}", r, 100, 100 / tps))
            for name, table in ratios.items():
                out.append(Sample(name, f"p{p}", r, 100, 100 / (tps * table[p][r])))
    return out


def test_an_exact_ratio_is_found_whatever_the_machine_speed_and_greedy_is_one():
    drifting = [[10.0, 6.0, 14.0], [3.0, 9.0, 5.0]]  # the machine's speed moves by 4x between samples
    speedups = {s.configuration: s for s in paired_speedups(_samples({"x": [[1.5] * 3] * 2}, drifting))}
    assert speedups["x"].speedup == pytest.approx(1.5) and speedups["greedy"].speedup == pytest.approx(1.0)
    assert speedups["x"].measurement_interval == pytest.approx((1.5, 1.5))
    assert speedups["x"].sampling_interval == pytest.approx((1.5, 1.5))
    assert (speedups["x"].prompts, speedups["x"].repetitions, speedups["x"].pairs) == (2, 3, 6)


def test_intervals_cover_the_center_and_tell_apart_only_what_differs():
    rng = np.random.default_rng(1)
    greedy = [[10.0] * 4 for _ in range(8)]
    noisy = lambda center: [[center * math.exp(rng.normal(0, 0.05)) for _ in range(4)] for _ in range(8)]  # noqa: E731
    speedups = {s.configuration: s for s in paired_speedups(_samples(
        {"fast": noisy(1.6), "close": noisy(1.58), "slow": noisy(1.1)}, greedy))}  # fmt: skip
    for s in speedups.values():
        assert s.measurement_interval[0] <= s.speedup <= s.measurement_interval[1]
        assert s.sampling_interval[0] <= s.speedup <= s.sampling_interval[1]
    assert overlapping(speedups["fast"], speedups["close"])
    assert not overlapping(speedups["fast"], speedups["slow"])
    assert speedups["fast"].measurement_interval[1] - speedups["fast"].measurement_interval[0] < 0.1


def test_the_sampling_interval_widens_with_prompt_to_prompt_spread_and_the_measurement_one_does_not():
    greedy = [[10.0] * 3 for _ in range(10)]
    by_prompt = [[1.2 + 0.1 * (p % 5)] * 3 for p in range(10)]  # prompts differ, repetitions agree exactly
    (s,) = [x for x in paired_speedups(_samples({"x": by_prompt}, greedy)) if x.configuration == "x"]
    assert s.measurement_interval[1] - s.measurement_interval[0] == pytest.approx(0.0)
    assert s.sampling_interval[1] - s.sampling_interval[0] > 0.05


def test_a_missing_reference_is_an_error():
    with pytest.raises(ValueError, match="reference configuration 'greedy'"):
        paired_speedups([Sample("x", "p", 0, 10, 1.0)])


def test_the_speed_factor_compares_a_samples_steps_with_the_profiles_t_n():
    steps = {"t_start": [0.0, 1.0, 2.0, 3.0], "t_end": [0.9, 1.2, 2.4, 3.5], "fed": [30, 1, 2, 5]}
    profile = [0.1, 0.2, 0.3]  # t(5) extrapolated: 0.3 + 0.1 * 2 = 0.5
    assert speed_factor(steps, profile) == pytest.approx((0.2 + 0.4 + 0.5) / (0.1 + 0.2 + 0.5))
    assert speed_factor(steps, []) is None


def test_the_speed_factor_charges_each_step_its_own_context_where_the_cost_grows_with_it():
    """A cost of n and the generated tokens in the stage's cache: its tokens produced so far less those the
    rollbacks before the step removed (1 after the prefill, 4, then 6 less 2 rolled back)."""
    steps = {"t_start": [0.0, 1.0, 2.0, 3.0], "t_end": [0.9, 1.2, 2.4, 3.5], "fed": [30, 1, 2, 5],
             "produced": [1, 3, 2, 1], "rollback_tokens": [0, 0, 0, 2]}
    seen = []

    def cost(n, generated):
        seen.append((n, generated))
        return 0.1 * n + 0.01 * generated

    assert speed_factor(steps, cost) == pytest.approx((0.2 + 0.4 + 0.5) / (0.11 + 0.24 + 0.54))
    assert seen[-3:] == [(1, 1), (2, 4), (5, 4)]  # after the prefill's own row


def test_a_stage_s_busy_time_is_counted_while_the_target_decodes():
    """From the end of the target's prefill to the end of its last step: the stage's own prefill left out, a step
    that straddles either end counted for its part inside; a target without a decode step has no decoding."""
    target = {"t_start": [0.0, 2.0, 5.0], "t_end": [2.0, 4.0, 7.0]}  # decodes from 2.0 to 7.0
    # its prefill ends after the target's; then 0.4 + 1 + 0.5 inside
    drafter = {"t_start": [0.0, 2.5, 3.0, 6.5], "t_end": [2.5, 2.9, 4.0, 7.5]}
    assert decoding_busy(drafter, target) == pytest.approx((1.9, 5.0))
    assert decoding_busy(target, target) == pytest.approx((4.0, 5.0))
    assert decoding_busy(drafter, {"t_start": [0.0], "t_end": [2.0]}) == (0.0, 0.0)


def test_each_step_is_told_by_what_came_before_it():
    """After the prefill: a step that starts right after the stage's previous one follows it; one that starts
    later came after a wait; one that another stage's model steps ran through for more than half is beside
    it, whatever came before (a model-free stage's steps, fed 0, take no core)."""
    steps = {"t_start": [0.0, 1.0, 1.5005, 3.0, 4.0, 5.0], "t_end": [1.0, 1.5, 2.0, 3.5, 4.5, 5.5],
             "fed": [30, 1, 2, 2, 3, 1]}
    drafter = {"t_start": [2.1, 3.1, 4.0], "t_end": [2.9, 3.45, 4.2], "fed": [1, 1, 1]}
    lookup = {"t_start": [4.9], "t_end": [5.6], "fed": [0]}
    assert step_conditions(steps, [drafter, lookup]) == [None, FOLLOWS, FOLLOWS, BESIDE, AFTER_WAIT, AFTER_WAIT]
    assert step_conditions(steps, []) == [None, FOLLOWS, FOLLOWS, AFTER_WAIT, AFTER_WAIT, AFTER_WAIT]
