"""Learning while a run goes (analysis.learn): a run's traces revise the profile's acceptance and costs, and the
next configuration is the best predicted one only when its gain over the current one is beyond its interval."""

import itertools
from dataclasses import replace

import pytest

from analysis import learn, predict
from analysis.profile import FORMAT, VERSION, parse_profile


def profile(rate: float, drafter_s: float = 0.004, target_s: float = 0.02, runs=None) -> object:
    """A two-stage profile: a model drafter whose drafts the target keeps at `rate` at every position (along
    two continuations of the same `runs` unless given)."""
    runs = runs or [[2, 1, 0, 3, 2, 1, 0, 0, 1, 0] * 3 for _ in range(2)]
    stage = lambda name, t1: {"name": name, "kind": "hf", "step_s_alone": [t1 * (1 + 0.05 * n) for n in range(8)],  # noqa: E731
                              "step_s_loaded": [t1 * (1.1 + 0.05 * n) for n in range(8)], "prefill_s_per_token": 0.001}
    pair = {"drafter": "d", "verifier": "t", "acceptance_by_position": [rate] * 6, "proposal_rate": 1.0,
            "mean_proposal_length": 6.0, "runs": runs}  # fmt: skip
    data = {"format": FORMAT, "version": VERSION, "hierarchy": {"name": "h", "stages": ["d", "t"]},
            "stages": [stage("d", drafter_s), stage("t", target_s)], "pairs": [pair], "sample_ids": ["a", "b"],
            "prompt_tokens": [20, 20], "handoff_s": 0.0, "duration_s": 1.0}  # fmt: skip
    return parse_profile(data)


def verifier_steps(verifications: list[tuple[int, int]], seconds: float = 0.02) -> dict:
    """A target trace (its dict): a prefill step, then one verify step per (offered, kept)."""
    kinds = ["single"] + ["verify"] * len(verifications)
    offered = [0] + [o for o, _ in verifications]
    kept = [0] + [k for _, k in verifications]
    starts = [i * 1.0 for i in range(len(kinds))]
    return {"steps": {"kind": kinds, "offered": offered, "accepted": kept, "fed": [20] + [o + 1 for o in offered[1:]],
                      "t_start": starts, "t_end": [t + seconds for t in starts], "produced": [k + 1 for k in kept]}}


def drafter_steps(n: int, seconds: float) -> dict:
    starts = [i * 1.0 for i in range(n)]
    return {"steps": {"kind": ["draft"] * n, "offered": [0] * n, "accepted": [0] * n, "fed": [20] + [1] * (n - 1),
                      "t_start": starts, "t_end": [t + seconds for t in starts], "produced": [1] * n}}


def test_verifications_count_offered_and_kept_drafts_by_position():
    observed = learn.Observed()
    base = profile(0.5)
    observed.add(base, [0, 1], [drafter_steps(5, 0.004), verifier_steps([(4, 2), (4, 4), (3, 0)])])
    assert observed.offered[(0, 1)] == [3, 2, 2, 1]  # (4, 2): positions 0-2; (4, 4): 0-3; (3, 0): 0
    assert observed.accepted[(0, 1)] == [2, 2, 1, 1]
    assert observed.per_call == [{(0, 1): ([3, 2, 2, 1], [2, 2, 1, 1])}]
    assert observed.calls == 1 and observed.speed(0) == pytest.approx(0.004 / base.stages[0].step_s_alone[0])


def test_a_run_that_keeps_more_drafts_than_the_profile_raises_its_rates_and_costs_follow_the_run():
    base = profile(0.3)
    observed = learn.Observed()
    for _ in range(3):
        observed.add(base, [0, 1], [drafter_steps(30, 0.008), verifier_steps([(6, 6)] * 10, seconds=0.03)])
    learned = learn.learned_profile(base, observed)
    before, after = base.pairs[0].acceptance_by_position, learned.pairs[0].acceptance_by_position
    assert all(a > b for a, b in zip(after, before)) and learned.pairs[0].runs == ()
    assert learned.stages[0].step_s_alone[0] == pytest.approx(base.stages[0].step_s_alone[0] * observed.speed(0))
    few = learn.Observed()
    few.add(base, [0, 1], [drafter_steps(3, 0.004), verifier_steps([(2, 2)])])
    assert learn.learned_profile(base, few).pairs[0] == base.pairs[0]  # too few drafts to count


def side_by_side_call(slowdown: float, alone: int, beside: int) -> list[dict]:
    """One call's traces (drafter, target): the target's first step reads the prompt, then `alone` verifications
    while the drafter waits, then `beside` ones while a drafter step runs all along, each `slowdown` times its
    profile t(n) (4 drafts offered: t(5), `profile`'s t1 x 1.2); the drafter's steps as fast as its profile's."""
    seconds = [0.02 * 1.2] * alone + [0.02 * 1.2 * slowdown] * beside
    target = verifier_steps([(4, 2)] * (alone + beside))["steps"]
    target["t_end"] = [target["t_start"][0] + 0.02] + [t + s for t, s in zip(target["t_start"][1:], seconds)]
    # sixteen drafter steps at its profile's t(1) after each target step, or spanning it
    starts = [s + 0.004 * j for s in [1.5 + i for i in range(alone)] + [1.0 + alone + i for i in range(beside)]
              for j in range(16)]  # fmt: skip
    drafter = {"kind": ["draft"] * len(starts), "offered": [0] * len(starts), "accepted": [0] * len(starts),
               "fed": [1] * len(starts), "t_start": starts, "t_end": [t + 0.004 for t in starts],
               "produced": [1] * len(starts)}  # fmt: skip
    return [{"steps": drafter}, {"steps": target}]


def test_a_run_learns_how_much_its_stages_slow_each_other_when_it_shows_both():
    """Target steps 30% slower beside the drafter than alone: the run's contention is 0.3 at the profile's speed,
    the learned target costs that much more loaded (not its loaded t(n) scaled by a pooled ratio), so sd and
    greedy, whose target steps run alone, are no longer charged it, and pipespec, side by side as the run was,
    is priced about as the pooled ratio priced it."""
    base = profile(0.5)
    observed = learn.Observed()
    observed.add(base, [0, 1], side_by_side_call(1.3, alone=6, beside=10))
    assert observed.stage_costs(1) == (pytest.approx(1.0), pytest.approx(0.3), None)  # every step after a wait
    learned = learn.learned_profile(base, observed)
    assert learned.stages[1].step_s_alone == pytest.approx(base.stages[1].step_s_alone)
    assert learned.stages[1].cost_fit(1).contention == pytest.approx(0.3, abs=1e-4)
    pooled = learn.Observed()  # the same steps, too few alone to tell contention from speed
    pooled.add(base, [0, 1], side_by_side_call(1.3, alone=4, beside=10))
    speed, contention, wake = pooled.stage_costs(1)
    assert contention is None is wake and speed == pytest.approx((4 + 13) / 14) == pooled.speed(1)
    kept = learn.learned_profile(base, pooled).stages[1]
    assert kept.step_s_loaded == pytest.approx(tuple(t * speed for t in base.stages[1].step_s_loaded))

    def rate(learned_profile, strategy: str, lookahead: int) -> float:
        return predict.predict_profile(learned_profile, strategy, lookahead, 8, 64).predicted_tokens_per_s

    as_pooled = learn.learned_profile(base, pooled)
    for strategy, lookahead in (("sd", 4), ("greedy", 0)):  # the target alone: not charged the contention
        assert rate(learned, strategy, lookahead) > 1.1 * rate(as_pooled, strategy, lookahead)
    assert rate(learned, "pipespec", 1) == pytest.approx(rate(as_pooled, "pipespec", 1), rel=0.1)  # side by side
    assert learn.StepCosts().fitted() == (None, None, None)


def test_a_drifting_machine_is_not_taken_for_contention():
    """One call ran every target step beside the drafter at 1.3 times its profile's t(n), the next every step
    alone at 1.0: the machine may have slowed, nothing tells contention from it, so none is fitted. Two calls
    that each show both regimes, the second on a machine 1.5 times slower, give the contention back (0.3, as
    each call ran it) and the speed between theirs."""
    base = profile(0.5)
    drifted = learn.Observed()
    drifted.add(base, [0, 1], side_by_side_call(1.3, alone=0, beside=10))
    drifted.add(base, [0, 1], side_by_side_call(1.0, alone=10, beside=0))
    assert drifted.stage_costs(1) == (pytest.approx(1.15), None, None)
    both = learn.Observed()
    both.add(base, [0, 1], side_by_side_call(1.3, alone=8, beside=8))
    slower = side_by_side_call(1.3, alone=8, beside=8)
    target = slower[1]["steps"]
    target["t_end"] = [a + 1.5 * (b - a) for a, b in zip(target["t_start"], target["t_end"])]
    both.add(base, [0, 1], slower)
    speed, contention, wake = both.stage_costs(1)
    assert 1.0 < speed < 1.5 and contention == pytest.approx(0.3, rel=0.02) and wake is None


def test_a_run_learns_what_a_step_after_a_wait_costs():
    """Target steps right after its own previous step at its profile's t(n), those after a wait 20% slower and
    nothing beside them: wake 0.2, no contention shown; sd, whose target waits for every window, is then
    predicted slower, pipespec at lookahead 0 (its target steps back to back) about as before."""
    base = profile(0.5)
    steps = verifier_steps([(4, 2)] * 16)["steps"]
    starts, ends, clock = [0.0], [0.02], 0.02
    for i in range(16):
        waited = i % 2 == 0
        clock += 0.5 if waited else 0.001
        starts.append(clock)
        clock += 0.024 * (1.2 if waited else 1.0)
        ends.append(clock)
    steps["t_start"], steps["t_end"] = starts, ends
    observed = learn.Observed()
    observed.add(base, [0, 1], [drafter_steps(1, 0.004), {"steps": steps}])
    assert observed.stage_costs(1) == (pytest.approx(1.0), None, pytest.approx(0.2))
    learned = learn.learned_profile(base, observed)
    assert learned.stages[1].wake == pytest.approx(0.2) and base.stages[1].wake == 0.0
    without = replace(learned, stages=(learned.stages[0], replace(learned.stages[1], wake=0.0)))

    def rate(p, strategy: str, lookahead: int) -> float:
        return predict.predict_profile(p, strategy, lookahead, 8, 64).predicted_tokens_per_s

    assert rate(learned, "sd", 4) < 0.95 * rate(without, "sd", 4)
    assert rate(learned, "pipespec", 0) == pytest.approx(rate(without, "pipespec", 0), rel=0.02)


def model_free_profile() -> object:
    """A two-stage profile whose first stage is model-free: along each of three continuations it proposed
    two drafts at some positions and nothing at the others (`proposed`), and kept `runs` of them; its rates
    by position are the walk's with those proposals (`experiments.profiler_acceptance.acceptance_by_position`)."""
    from experiments.profiler_acceptance import acceptance_by_position

    proposed = [[2, 0, 0, 2, 2, 0, 2, 0, 0, 2] * 3, [0, 2, 2, 0, 0, 2, 0, 2, 0, 0] * 3, [2] * 30]
    runs = [[min(p, r) for p, r in zip(along, [1, 0, 2, 2, 0, 1, 2, 0, 1, 2] * 3)] for along in proposed]
    walk = acceptance_by_position(runs, proposed, 6)
    base = profile(0.5)
    target = {"name": "t", "kind": "hf", "step_s_alone": list(base.stages[1].step_s_alone),
              "step_s_loaded": list(base.stages[1].step_s_loaded), "prefill_s_per_token": 0.001}
    pair = {"drafter": "d", "verifier": "t", "acceptance_by_position": walk["acceptance_by_position"],
            "proposal_rate": walk["proposal_rate"], "mean_proposal_length": walk["mean_proposal_length"],
            "runs": runs, "proposed": proposed}  # fmt: skip
    data = {"format": FORMAT, "version": VERSION, "hierarchy": {"name": "h", "stages": ["d", "t"]},
            "stages": [{"name": "d", "kind": "suffix"}, target], "pairs": [pair], "sample_ids": ["a", "b", "c"],
            "prompt_tokens": [20, 20, 20], "handoff_s": 0.0, "duration_s": 1.0}  # fmt: skip
    return parse_profile(data)


def test_a_model_free_drafter_learns_from_its_own_walk_and_keeps_proposing_as_it_did():
    """The profile's own counts of a model-free drafter are its walk with its proposals (where it proposed
    nothing, nothing was offered), so a run that keeps drafts as the profile did leaves its rates as they
    were; the learned pair is drawn by position and still proposes where and as much as it did along the
    continuations (two drafts a proposal here, proposing on from its buffer's end while the lead cap allows),
    over as many simulated generations as the profile has continuations."""
    base = model_free_profile()
    pair = base.pairs[0]
    offered, accepted = learn.prior_counts(pair, len(pair.acceptance_by_position))
    assert [a / o for o, a in zip(offered, accepted) if o] == pytest.approx(
        [r for r in pair.acceptance_by_position if r is not None][: sum(1 for o in offered if o)])
    observed = learn.Observed()
    observed._add_call({(0, 1): (list(offered), list(accepted))})
    learned = learn.learned_profile(base, observed)
    assert learned.pairs[0].acceptance_by_position == pytest.approx(pair.acceptance_by_position)
    assert learned.pairs[0].runs == () and learned.pairs[0].proposed == pair.proposed
    hierarchy = predict.Hierarchy.from_profile(learned)
    assert isinstance(hierarchy.acceptance[0], predict.sim.ByPosition) and len(hierarchy.seeds) >= 3
    offered = {2: [], 8: []}  # two drafts a proposal: at most two offered at a lead cap of 2; more, proposing on
    for seed, cap in itertools.product(range(3), offered):
        _, result = predict.simulate_generation(hierarchy, "pipespec", 40, lookahead=1, max_lead=cap, seed=seed)
        assert result.offered_counts[0]
        offered[cap] += result.offered_counts[0]
    assert max(offered[2]) <= 2 < max(offered[8]) <= 8


GREEDY = {"strategy": "greedy", "lookahead": 0, "max_lead": 8, "stages": [1]}


def test_the_next_configuration_switches_only_beyond_the_interval():
    low, high = profile(0.05, drafter_s=0.015), profile(0.95, drafter_s=0.001)
    nothing = learn.Observed()
    stay = learn.next_configuration(low, nothing, GREEDY, tokens=64)
    assert stay.configuration["strategy"] == "greedy" and not stay.switched and stay.gain is None
    move = learn.next_configuration(high, nothing, GREEDY, tokens=64)
    assert move.switched and move.configuration["strategy"] != "greedy" and move.reason
    assert move.gain_interval[0] > 1.0 and move.predicted_tokens_per_s == pytest.approx(move.current_tokens_per_s * move.gain)
    again = learn.next_configuration(high, nothing, move.configuration, tokens=64)
    assert not again.switched and again.configuration == move.configuration
    only_greedy = learn.next_configuration(high, nothing, GREEDY, tokens=64, allowed=lambda c: c["strategy"] == "greedy")
    assert not only_greedy.switched


def test_a_gain_within_its_interval_stays_and_the_run_s_calls_narrow_the_interval():
    """Two prompts whose continuations differ (one the drafter gets right, one it gets wrong): the second-best
    configuration's gap to the best is within the interval drawn from them, and calls that keep drafts at
    the pooled rate narrow it."""
    spread = profile(0.5, runs=[[4, 3, 2, 1, 0] * 6, [0, 0, 1, 0, 0] * 6])
    ranked, _ = predict.sweep(spread, 64)
    second = learn.configuration_of(ranked[1])
    nothing = learn.Observed()
    stay = learn.next_configuration(spread, nothing, second, tokens=64)
    assert stay.gain > 1.0 and stay.gain_interval[0] <= 1.0 <= stay.gain_interval[1] and not stay.switched
    assert "not beyond it" in stay.reason
    assert stay == learn.next_configuration(spread, nothing, second, tokens=64)  # seeded: reproducible
    many = learn.Observed()
    for _ in range(12):
        many.add(spread, [0, 1], [drafter_steps(30, 0.004), verifier_steps([(4, 1), (4, 0), (2, 2)] * 4)])
    narrower = learn.gain_interval(spread, many, learn.configuration_of(ranked[0]), second, 64, 1.0)
    assert narrower[1] - narrower[0] < (stay.gain_interval[1] - stay.gain_interval[0]) / stay.gain


def test_the_model_error_of_a_gain_is_that_of_the_committed_validations():
    """`MODEL_GAIN_ERROR` is the root mean square of log(predicted gain / measured gain) over every pair of
    configurations of each committed paired validation (a new validation changes it: update the constant)."""
    import json
    import math
    from pathlib import Path

    errors = []
    for path in sorted((Path(__file__).resolve().parents[1] / "results" / "validation_paired").glob("*/*/validation.json")):
        records = [r for r in json.loads(path.read_text())["records"] if r["configuration"] != "greedy"]
        logs = [math.log(r["predicted_speedup"] / r["measured_speedup"]) for r in records]
        errors += [a - b for a, b in itertools.combinations(logs, 2)]
    assert len(errors) >= 100
    assert math.sqrt(sum(e * e for e in errors) / len(errors)) == pytest.approx(learn.MODEL_GAIN_ERROR, abs=5e-4)
