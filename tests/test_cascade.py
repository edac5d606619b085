"""The cascade (`cascade: true`): the stage behind a model-free drafter passes its proposals on unverified
(schedule TAKE) and drafts with its model only where there are none. Lossless: the target verifies all."""

import pytest

from pipespec import schedule
from pipespec.errors import ConfigError
from pipespec.specs import StageSpec
from pipespec.protocol import Role

TINY = {"noise": [0.05]}
MAX_NEW = 24


def _middle() -> Role:
    return schedule.roles("pipespec", 3, 0, 8, cascade=True)[1]


def test_the_cascade_stage_takes_proposals_waits_for_an_answer_and_steps_only_on_a_miss():
    middle = _middle()
    assert middle.takes_drafts and not schedule.roles("pipespec", 3, 0, 8)[1].takes_drafts
    view = schedule.StageView(generated=10, budget=100, lead=2, finished=False, drafts=5, upstream_more=True)
    assert schedule.next_action(middle, view) == schedule.Action(schedule.TAKE, 5)
    capped = schedule.StageView(generated=10, budget=100, lead=6, finished=False, drafts=5)
    assert schedule.next_action(middle, capped) == schedule.Action(schedule.TAKE, 2)  # max_lead 8
    coming = schedule.StageView(generated=10, budget=100, lead=2, finished=False, drafts=0, upstream_more=True)
    assert schedule.next_action(middle, coming).kind == schedule.WAIT  # the model-free answer is a hop away
    miss = schedule.StageView(generated=10, budget=100, lead=2, finished=False, drafts=0, upstream_more=False)
    assert schedule.next_action(middle, miss) == schedule.Action(schedule.STEP, 0)  # its own draft


@pytest.mark.parametrize("strategy, n_stages", [("sd", 3), ("greedy", 3), ("pipespec", 2)])
def test_cascade_needs_pipespec_and_three_stages(strategy, n_stages):
    with pytest.raises(ConfigError, match="cascade needs strategy pipespec and at least 3 stages"):
        schedule.roles(strategy, n_stages, 0, 8, cascade=True)
    with pytest.raises(ConfigError, match="cascade must be true or false"):
        schedule.roles("pipespec", 3, 0, 8, cascade="yes")


def test_the_simulator_follows_the_cascade():
    from analysis import simulate as sim

    costs = [sim.StageCost(0.0002), sim.StageCost(0.03), sim.StageCost(0.07)]
    runs = {c: sim.simulate_pipespec(costs, [0.6, 0.85], 400, seed=1, supply=[0.7, None, None], cascade=c)
            for c in (False, True)}  # fmt: skip
    # the middle stage's model steps go only to the misses: far fewer than when it verifies every proposal
    assert runs[True].steps[1] < 0.6 * runs[False].steps[1]
    assert runs[True].committed_tokens >= 400


def test_a_cascade_is_identical_to_greedy_and_takes_the_suffix_proposals(tiny):
    import torch

    from pipespec.api import Pipeline
    from pipespec.decoding import greedy_generate
    from pipespec.models import CausalLMRunner, load_model
    from experiments.tiny import random_prompts

    torch.set_num_threads(1)
    prompts = random_prompts(4, length=10, seed=3)
    runner = CausalLMRunner(load_model(StageSpec(model=tiny[-1])))
    reference = [greedy_generate(runner, p, MAX_NEW, [1]) for p in prompts]
    repeat = max(range(len(prompts)), key=lambda i: len(reference[i]))
    stages = [{"kind": "suffix", "max_proposal": 8, "name": "suffix"}] + list(tiny[-2:])
    steps = {}
    for cascade in (False, True):
        with Pipeline(stages, strategy="pipespec", cascade=cascade) as pipe:
            for prompt, expected in zip(prompts, reference):
                assert pipe.generate(prompt, MAX_NEW).tokens == expected
            again = pipe.generate(prompts[repeat], MAX_NEW)  # the suffix index holds its output: proposed
            assert again.tokens == reference[repeat]
            middle = again.summary()[1]
            steps[cascade] = middle["verify_steps"] + middle["single_steps"]  # its model's forward passes
            if cascade:
                assert middle["draft_steps"] > 0 and middle["verify_steps"] == 0  # it never verifies a proposal
                # per call; lookahead 1: the middle stage waits for the suffix's proposal instead of racing it
                # with a step of its own (at 0 a loaded machine can deliver every proposal too late)
                off = pipe.generate(prompts[0], MAX_NEW, cascade=False, lookahead=1)
                assert off.tokens == reference[0] and off.summary()[1]["verify_steps"] > 0
    assert steps[True] < steps[False]


def test_cascade_is_refused_without_a_model_free_first_stage(tiny):
    from pipespec.api import Pipeline

    with pytest.raises(ConfigError, match="cascade needs a model-free first stage"):
        Pipeline([tiny[0]] + list(tiny), strategy="pipespec", cascade=True)
    with pytest.raises(ConfigError, match="cascade needs strategy pipespec"):
        Pipeline([{"kind": "prompt_lookup"}] + list(tiny[-2:]), strategy="sd", lookahead=2, cascade=True)


@pytest.mark.slow  # a statistical test over thousands of pipeline tokens
def test_a_sampled_cascade_follows_the_target_distribution(tiny_models, one_thread):
    """The taken proposals travel with their point-mass distributions, so the target's rule sees the
    draft's true q: the same calibration test as every sampled pipeline (tests/test_sampling.py)."""
    from test_sampling import (CALLS, LENGTH, MIN_POWER, PASS_P, SHIFT, TOP_K, calibration_test, draw_outputs,
                               target_checks, target_conditionals)  # fmt: skip
    from test_sampling import TINY as SAMPLED

    from pipespec.api import Pipeline
    from pipespec.models import load_model

    models = tiny_models(**SAMPLED)
    calls = CALLS
    with Pipeline([{"kind": "prompt_lookup", "ngram_size": 2, "max_proposal": 4}] + list(models[-2:]),
                  strategy="pipespec", cascade=True) as pipe:  # fmt: skip
        results = draw_outputs(pipe, "pipespec", 2, TOP_K, calls)
    assert all(len(r.tokens) == LENGTH for r in results)
    assert sum(r.summary()[1]["draft_steps"] for r in results) > calls  # proposals were passed on
    offered, acceptance = target_checks(results)
    assert offered >= calls * LENGTH / 4 and 0.1 < acceptance < 0.95
    check = calibration_test(*target_conditionals(load_model(StageSpec(model=models[-1])), results, TOP_K))
    assert check.power >= MIN_POWER, f"{check.positions} positions catch a {SHIFT:.0%} shift with power {check.power:.2f}"
    assert check.pvalue > PASS_P, check
