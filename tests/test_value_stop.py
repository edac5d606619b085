"""`value_stop`: a model drafter stops extending its lead where another draft is worth less than it costs
(the chance it survives, from acceptance by position estimated online, against the target tokens its step
delays). Lossless: it only changes how far ahead the drafter runs."""

import pytest

from pipespec import schedule
from pipespec.errors import ConfigError

TINY = {"noise": [0.6, 0.05]}
MAX_NEW = 32


def _view(lead: int, value: float, cost: float, **extra) -> schedule.StageView:
    return schedule.StageView(generated=10 + lead, budget=100, lead=lead, finished=False, draft_value=value,
                              draft_cost=cost, **extra)  # fmt: skip


def test_a_drafter_stops_where_the_next_draft_is_worth_less_than_it_costs():
    first = schedule.roles("pipespec", 2, 0, 8, value_stop=0.1)[0]
    assert first.value_stop == 0.1 and schedule.roles("pipespec", 2, 0, 8)[0].value_stop == 0.0
    assert schedule.next_action(first, _view(3, 0.2, 0.1)).kind == schedule.STEP
    assert schedule.next_action(first, _view(3, 0.05, 0.1)).kind == schedule.IDLE
    assert schedule.next_action(first, _view(0, 0.05, 0.1)).kind == schedule.STEP  # no lead: keeps learning
    assert schedule.next_action(first, _view(3, 0.05, 0.1, model_free=True)).kind == schedule.PROPOSE  # free
    off = schedule.roles("pipespec", 2, 0, 8)[0]
    assert schedule.next_action(off, _view(3, 0.0, 1.0)).kind == schedule.STEP
    middle = schedule.roles("pipespec", 3, 0, 8, value_stop=0.1)[1]
    assert schedule.next_action(middle, _view(3, 0.05, 0.1)).kind == schedule.IDLE  # every drafter
    taker = schedule.roles("pipespec", 3, 0, 8, cascade=True, value_stop=0.1)[1]
    assert schedule.next_action(taker, _view(3, 0.05, 0.1, drafts=2)) == schedule.Action(schedule.TAKE, 2)  # free
    assert schedule.next_action(taker, _view(3, 0.05, 0.1)).kind == schedule.IDLE  # its own model step is not


def test_survival_and_cost():
    assert schedule.survival(0, (0.5,)) == 1.0
    assert schedule.survival(3, (0.8, 0.5)) == pytest.approx(0.8 * 0.5 * 0.5)  # beyond the list: its last rate
    assert schedule.survival(4, ()) == 1.0  # nothing learned yet
    assert schedule.expected_tokens(2, (0.8, 0.5)) == pytest.approx(1 + 0.8 + 0.4)
    assert schedule.draft_cost(0.1, 0.03, 0.06) == pytest.approx(0.05)
    assert schedule.draft_cost(0.1, 0.0, 0.06) == 0.0 and schedule.draft_cost(0.1, 0.03, 0.0) == 0.0


def test_the_online_estimates_count_what_the_next_stage_kept_by_position():
    history = schedule.VerifyHistory()
    for kept in (3, 1, 0):
        history.record_verification(4, kept)
    # position 1: 2 of 3 kept; position 2: 1 of 2; position 3: 1 of 1; position 4: 0 of 1 (prior 1/2 each)
    assert history.acceptance() == pytest.approx(((2 + 1) / 5, (1 + 1) / 4, (1 + 1) / 3, (0 + 1) / 3))
    for seconds in (0.03, 0.01, 0.02):
        history.record_step(1, seconds)
    assert history.step_time(1) == 0.02 and history.step_time(2) == 0.0


@pytest.mark.parametrize("bad", [-0.1, "high", True, 101])
def test_bad_value_stop_is_refused(bad):
    with pytest.raises(ConfigError, match="value_stop must be a number"):
        schedule.roles("pipespec", 2, 0, 8, value_stop=bad)


def test_auto_and_predict_refuse_it():
    from experiments.auto import check_auto_options

    with pytest.raises(ConfigError, match="strategy auto cannot honour value_stop"):
        check_auto_options(0.0, 0.1)


@pytest.mark.parametrize("strategy, lookahead", [("pipespec", 2), ("sd", 4)])
def test_a_value_stopping_pipeline_is_identical_to_greedy_and_drafts_less(tiny, strategy, lookahead):
    """A noisy drafter (few of its drafts survive) with a high slowdown: once it knows the target's pace
    (from its first value-stopping call on; the estimates carry over) it keeps one draft ahead, so the target, which waits
    for `lookahead` drafts without it, is offered one; the output is the target's greedy one either way.
    The count is what value_stop decides, not the rollbacks, whose number depends on how the two
    processes happen to be scheduled."""
    import torch

    from pipespec.api import Pipeline
    from pipespec.decoding import greedy_generate
    from pipespec.models import CausalLMRunner, load_model
    from pipespec.specs import StageSpec
    from experiments.tiny import random_prompts

    torch.set_num_threads(1)
    prompts = random_prompts(3, length=10, seed=5)
    runner = CausalLMRunner(load_model(StageSpec(model=tiny[-1])))
    reference = [greedy_generate(runner, p, MAX_NEW, [1]) for p in prompts]
    offered = {}  # value_stop -> per call, the drafts offered to each of the target's verifications
    with Pipeline([tiny[0], tiny[-1]], strategy=strategy, lookahead=lookahead, max_lead=8) as pipe:
        for stop in (0.0, 50.0):
            offered[stop] = []
            for prompt, expected in zip(prompts, reference):
                result = pipe.generate(prompt, MAX_NEW, value_stop=stop)
                assert result.tokens == expected
                steps = result.stage_traces[-1].steps
                offered[stop].append([n for kind, n in zip(steps["kind"], steps["offered"]) if kind == "verify"])
    assert max(max(call) for call in offered[0.0]) >= lookahead  # it waits for them (pipespec: or more)
    learned = [n for call in offered[50.0][1:] for n in call]  # its estimates carry over between calls
    assert learned and max(learned) == 1, offered[50.0]
