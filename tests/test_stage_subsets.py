"""A call may run a subset of the pipeline's stages (`generate(..., stages=[...])`): the skipped stages idle,
the chosen ones link past them, and the output is still greedy decoding of the target."""

import pytest

from pipespec.decoding import greedy_generate
from pipespec.errors import ConfigError
from pipespec.models import CausalLMRunner, load_model
from pipespec.options import CallOptions
from pipespec.specs import StageSpec
from experiments.tiny import random_prompts

TINY = {"noise": [0.3, 0.05], "eos_token_id": None}
MAX_NEW = 16


@pytest.fixture(scope="module")
def reference(tiny):
    runner = CausalLMRunner(load_model(StageSpec(model=tiny[-1])))
    prompts = random_prompts(3, length=8, seed=11)
    return prompts, [greedy_generate(runner, p, MAX_NEW, []) for p in prompts]


@pytest.mark.parametrize("strategy, lookahead", [("sd", 3), ("pipespec", 0), ("pipespec", 2)])
def test_skipping_the_middle_stage_is_still_greedy_and_runs_only_the_chosen_stages(pipes, reference, strategy,
                                                                                  lookahead):  # fmt: skip
    prompts, expected = reference
    for prompt, tokens in zip(prompts, expected):
        result = pipes[3].generate(prompt, MAX_NEW, strategy=strategy, lookahead=lookahead, stages=[0, 2])
        assert result.tokens == tokens and result.stages == [0, 2]
        assert [t.stage for t in result.stage_traces] == [0, 2]
        verifies = [k for k in result.stage_traces[-1].steps["kind"] if k == "verify"]
        # a target that waits for drafts (lookahead > 0) verifies the first stage's, across the skipped one;
        # at lookahead 0 tiny models step as fast as their drafter and may never wait
        assert verifies or lookahead == 0, "no verification of the first stage's drafts"
    whole = pipes[3].generate(prompts[0], MAX_NEW, strategy=strategy, lookahead=lookahead)  # the same processes
    assert whole.tokens == expected[0] and whole.stages == [0, 1, 2]


def test_greedy_runs_the_target_alone_whatever_stages_say(pipes, reference):
    prompts, expected = reference
    result = pipes[3].generate(prompts[1], MAX_NEW, strategy="greedy", stages=[0, 2])
    assert result.tokens == expected[1] and result.stages == [2]


@pytest.mark.parametrize("stages, message", [
    ([0, 1], r"ending with the target \(2\)"),
    ([1, 0, 2], "increasing stage positions"),
    ([], "increasing stage positions"),
    ("0,2", "increasing stage positions"),
])  # fmt: skip
def test_bad_stages_are_one_config_error(pipes, reference, stages, message):
    with pytest.raises(ConfigError, match=message):
        pipes[3].generate(reference[0][0], 4, strategy="sd", stages=stages)


def test_a_model_free_stage_cannot_verify_and_synthetic_acceptance_runs_every_stage():
    kinds = ["hf", "prompt_lookup", "hf"]
    with pytest.raises(ConfigError, match="model-free stage lookup can only be the first"):
        CallOptions(strategy="sd", stages=[0, 1, 2]).plan(kinds, ["draft", "lookup", "target"])
    plan = CallOptions(strategy="sd", stages=[1, 2]).plan(kinds, ["draft", "lookup", "target"])
    assert [r.active for r in plan.roles] == [False, True, True] and plan.roles[2].upstream == 1
    with pytest.raises(ConfigError, match="acceptance='synthetic' runs every stage"):
        CallOptions(strategy="sd", stages=[0, 2], acceptance="synthetic", synthetic_rates=0.5).plan(["hf"] * 3)
