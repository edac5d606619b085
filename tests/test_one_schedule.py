"""One schedule: the stage loop (pipespec.stage) and the simulator (analysis.simulate) decide every
stage's next action with the same function, `pipespec.schedule.next_action`.

- Both modules call it (checked by identity and in their source), and for the same state both build
  the same `StageView` (`pipespec.schedule.stage_view`) and so take the same action (a grid of states,
  sd and pipespec, k = 2 and 3). The drafts a verifier is offered and how a stage follows a commit
  (`pipespec.buffers`), and when it commits upstream (`pipespec.schedule.commits_after_step`), are
  also one function each, called by both.
- Replaying a recorded run through the simulator gives the same sequence of target steps. The runs
  are chosen so that the schedule does not depend on timing: sd (every verifier waits until its
  drafter has stopped) and pipespec with lookahead = max_lead (a verifier waits for exactly the lead
  its drafter stops at). There the sequence of drafts offered per target step (0 = a single step) is
  a function of the accepted counts alone, so the comparison is exact: the simulator gets the
  recorded accepted counts (`simulate.Replay`) and step durations (`simulate.RecordedSteps`). With
  lookahead < max_lead a verifier takes whatever drafts happen to be there when it looks, which
  depends on microsecond timing of messages the simulator does not model: no exact comparison is
  possible there, and none is made.
- With free drafters and a constant step cost the simulator reproduces the paper's Eq. 4 within 2%.
"""

import inspect
import types

import pytest

import analysis.simulate as sim
from analysis import paper_model as pm
from pipespec import buffers, schedule
from experiments.tiny import random_prompts

TINY = {"noise": [0.3, 0.05], "eos_token_id": None}  # full-length outputs: no EOS (the simulator has none)
MAX_NEW = 24
PROMPTS = random_prompts(2, length=8, seed=5)


# --------------------------------------------------------------------------- the same function


def test_both_loops_call_schedule_next_action():
    import pipespec.stage as stage

    assert stage.schedule.next_action is schedule.next_action
    assert "schedule.next_action(self.role" in inspect.getsource(stage.StageRequest.next_action)
    assert sim.next_action is schedule.next_action and sim.roles is schedule.roles
    assert "next_action(self.role" in inspect.getsource(sim.SimulatedStage.next_action)
    assert inspect.signature(sim.simulate_pipespec).parameters["max_lead"].default == schedule.DEFAULT_MAX_LEAD


def test_both_loops_apply_the_same_buffer_rules():
    """The drafts a verifier is offered, how a stage follows a commit, what it knows and when it commits
    upstream: one function each (`pipespec.buffers`, `pipespec.schedule`), called by both loops."""
    import pipespec.stage as stage

    assert stage.buffers is buffers and sim.buffers is buffers
    assert sim.stage_view is schedule.stage_view and sim.commits_after_step is schedule.commits_after_step
    calls = {
        "buffers.offered_drafts(": (stage.StageRequest.available_drafts, sim.SimulatedStage.available_drafts),
        "buffers.adopt(": (stage.StageRequest.adopt, sim.SimulatedStage.adopt),
        "stage_view(": (stage.StageRequest.view, sim.SimulatedStage.view),
        "commits_after_step(self.role": (stage.StageRequest.run, sim.SimulatedStage.step),
    }
    for call, methods in calls.items():
        for method in methods:
            assert call in inspect.getsource(method), (call, method.__qualname__)


def test_buffer_rules():
    assert buffers.offered_drafts(2, [1, 2, 3, 4, 5], True, 10) == [3, 4, 5]
    assert buffers.offered_drafts(2, [1, 2, 3, 4, 5], False, 10) == []  # the drafter's buffer differs
    assert buffers.offered_drafts(2, [1, 2], True, 10) == []  # nothing beyond the verifier's buffer
    assert buffers.offered_drafts(2, [1, 2, 3, 4, 5], True, 5) == [3, 4]  # room - 1: its own token takes the last
    assert buffers.offered_drafts(2, [1, 2, 3, 4, 5], True, 10, eos_ids=[4]) == [3, 4]  # nothing after an EOS
    assert buffers.offered_drafts(2, [1, 2, 3, 4, 5], True, 10, limit=1) == [3]
    assert buffers.adopt(5, 3, 3) == buffers.Adoption(None, 0)  # the stage's buffer extends the commit
    assert buffers.adopt(5, 4, 2) == buffers.Adoption(2, 3)  # a rollback of three of its own tokens
    assert buffers.adopt(3, 6, 3) == buffers.Adoption(3, 0)  # a catch-up
    verifier, sd_middle = schedule.roles("pipespec", 3, 0, 4)[1], schedule.roles("sd", 3, 2, 4)[1]
    assert schedule.commits_after_step(verifier, schedule.STEP) and not schedule.commits_after_step(
        verifier, schedule.TAKE)
    assert not schedule.commits_after_step(sd_middle, schedule.STEP)  # only the target's commit releases sd
    first = schedule.roles("pipespec", 2, 0, 4)[0]
    assert not schedule.commits_after_step(first, schedule.PROPOSE)  # nothing upstream to tell


def _engine_request(role_list, index, budget):
    """A stage loop's request object without a model or a transport: only its scheduling state is used."""
    from pipespec.protocol import Job
    from pipespec.stage import StageRequest
    from pipespec.verify import Acceptance, Sampling

    job = Job(
        request=1, prompt_ids=[0, 0], max_new_tokens=budget, eos_ids=[], roles=role_list, stall_timeout_s=1.0,
        stage_names=[f"s{i}" for i in range(len(role_list))], sampling=Sampling(), acceptance=Acceptance(),
    )  # fmt: skip
    engine = types.SimpleNamespace(lookup=None, runner=None)
    return StageRequest(index, job, engine, transport=None, stage_names=job.stage_names)


def _states():
    for strategy in ("sd", "pipespec"):
        for k in (2, 3):
            for lookahead in (0, 2):
                role_list = schedule.roles(strategy, k, lookahead, 4)
                for index in range(k):
                    for generated in (0, 3, 9, 10):  # the budget is 10
                        for lead in (0, 1, 4):
                            for extra in (0, 1, 3, 6):
                                for more in (False, True):
                                    yield role_list, index, generated, max(generated - lead, 0), extra, more


def test_same_state_same_view_same_action():
    budget = 10
    checked = set()
    for role_list, index, generated, committed, extra, more in _states():
        role = role_list[index]
        request = _engine_request(role_list, index, budget)
        request.out = list(range(100, 100 + generated))
        request.confidence = [1.0] * generated
        request.downstream_committed = 0 if role.is_target else committed
        request.upstream_buffer = request.out + list(range(200, 200 + extra)) if role.has_upstream else []
        request.upstream_more = more
        drafts, _ = request.available_drafts() if role.has_upstream else ([], None)
        engine_view = request.view(len(drafts))
        usable = min(extra, max(budget - generated - 1, 0)) if role.has_upstream else 0  # the simulator's cut
        sim_view = sim.stage_view(role, generated, request.downstream_committed, usable, more, budget)
        assert sim_view == engine_view
        engine_kind = request.next_action()[0]
        assert schedule.next_action(role, sim_view).kind == engine_kind
        checked.add(engine_kind)
    assert checked == {schedule.STEP, schedule.WAIT, schedule.IDLE, schedule.FINISH}  # every branch was reached


@pytest.mark.parametrize("strategy, lookahead", [("sd", 1), ("sd", 4), ("pipespec", 0), ("pipespec", 3)])
def test_a_drafter_keeps_its_drafts_to_itself_only_while_the_target_would_wait_for_more(strategy, lookahead):
    """Whatever the target holds (its last commit, or more when a commit is still on its way to the drafter, up
    to its own token beyond the drafter's buffer), the drafts a drafter keeps to itself would leave it waiting,
    or offer it nothing: the message changes nothing. sd's drafter keeps them until it stops; pipespec's until
    it holds `lookahead` beyond the commit."""
    budget, target = 10, schedule.roles(strategy, 2, lookahead, 8)[-1]
    kept = []
    for generated in range(budget + 1):
        for committed in range(generated + 1):
            if not schedule.target_keeps_waiting(target, generated, generated - committed, budget):
                continue
            kept.append((generated, committed))
            for holds in range(committed, min(generated + 1, budget) + 1):  # what the target may hold by now
                offered = max(min(generated - holds, budget - holds - 1), 0)  # buffers.offered_drafts' cut
                view = schedule.stage_view(target, holds, 0, offered, True, budget)
                kind = schedule.next_action(target, view).kind
                assert kind == schedule.WAIT or offered == 0, (generated, committed, holds, kind)
    lead = lookahead if strategy == "pipespec" else budget - 1  # kept while the drafts are fewer than this
    assert kept == [(g, c) for g in range(budget - 1) for c in range(g + 1) if g - c < lead]


# --------------------------------------------------------------------------- verification sized by t(n)


def test_verify_size_skips_sizes_that_cost_more_than_they_return():
    jump = (1.0, 3.0, 3.1, 3.2, 3.3)  # t(n): one row is cheap, two or more cost three times as much
    assert schedule.verify_size(1, (0.5,), jump) == 0  # 1 token / 1.0 beats 1.5 tokens / 3.0
    assert schedule.verify_size(3, (0.95,), jump) == 3  # 3.71 tokens / 3.2 beats 1 / 1.0
    assert schedule.verify_size(4, (0.9, 0.0), jump) == 0  # nothing past the first draft is ever accepted
    assert schedule.verify_size(4, (0.9,), (1.0, 1.0, 1.0, 1.0, 1.0)) == 4  # a flat t(n): verify everything
    assert schedule.expected_tokens(2, (0.5, 0.5)) == 1.75 and schedule.step_cost((1.0, 2.0), 4) == 4.0
    history = schedule.VerifyHistory()
    assert history.step_costs() == () and history.acceptance() == ()
    for fed, seconds in ((1, 1.0), (1, 1.2), (1, 0.9), (4, 2.5)):
        history.record_step(fed, seconds)
    assert history.step_costs() == (1.0, 1.5, 2.0, 2.5)  # medians, sizes not seen interpolated
    history.record_verification(3, 1)  # first accepted, second rejected, third never looked at
    assert history.acceptance() == (2 / 3, 1 / 3)  # with one accepted and one rejected as a prior


def test_a_sizing_verifier_takes_the_same_action_in_the_engine_and_the_simulator():
    role_list = schedule.roles("pipespec", 2, 0, 8, size_verification=True)
    request = _engine_request(role_list, 1, 20)
    request.engine.history = schedule.VerifyHistory()
    for fed, seconds in ((1, 0.05), (2, 0.15), (3, 0.16), (4, 0.17)):
        request.engine.history.record_step(fed, seconds)
    for _ in range(8):
        request.engine.history.record_verification(3, 0)  # this drafter is always wrong
    request.out = [100, 101]
    request.upstream_buffer = request.out + [200, 201, 202]
    request.upstream_more = False
    kind, (drafts, _) = request.next_action()
    assert kind == schedule.STEP and drafts == []  # a one-token step: the drafts do not pay for themselves
    history = request.engine.history
    sim_view = sim.stage_view(role_list[1], 2, 0, 3, False, 20, step_costs=history.step_costs(),
                              acceptance=history.acceptance())  # fmt: skip
    assert sim_view == request.view(3) and schedule.next_action(role_list[1], sim_view) == schedule.Action(
        schedule.STEP, 0)
    for _ in range(200):
        request.engine.history.record_verification(3, 3)  # now it is nearly always right
    assert request.next_action()[1][0] == [200, 201, 202]


def test_the_simulator_sizes_verifications_by_the_cost_table():
    costs = [sim.StageCost(0.001), sim.TableCost((0.05, 0.15, 0.16, 0.17, 0.18))]
    plain = sim.simulate_pipespec(costs, [sim.ByPosition([0.4, 0.9])], 400, max_lead=4, seed=1)
    sized = sim.simulate_pipespec(costs, [sim.ByPosition([0.4, 0.9])], 400, max_lead=4, seed=1,
                                  size_verification=True)  # fmt: skip
    # 3 drafts return 2.08 tokens for 0.17 s, a one-token step 1 for 0.05 s: the sized target never verifies
    assert 3 in plain.step_offers[0] and set(sized.step_offers[0]) == {0}
    assert sized.tokens_per_second > plain.tokens_per_second
    good = sim.simulate_pipespec(costs, [0.95], 400, max_lead=4, seed=1, size_verification=True)
    assert set(good.step_offers[0]) - {0, 3, 4} == set() and 3 in good.step_offers[0]  # 1 or 2 drafts never pay


# --------------------------------------------------------------------------- replaying a recorded run


def _target_offers(trace) -> list[int]:
    return [offered if kind == "verify" else 0 for kind, offered in zip(trace.steps["kind"], trace.steps["offered"])]


def _replay(result, strategy, lookahead, max_lead):
    traces = result.stage_traces
    durations = [[e - s for s, e in zip(t.steps["t_start"], t.steps["t_end"])] for t in traces]
    costs = [sim.RecordedSteps(d) if d else sim.StageCost(1.0) for d in durations]  # a stage that never stepped
    counts = []
    for trace in traces[1:]:
        accepted = [a + 1 for kind, a in zip(trace.steps["kind"], trace.steps["accepted"]) if kind == "verify"]
        counts.append(sim.Replay(accepted or [1]))
    tokens = len(result.tokens)
    if strategy == "sd":
        return sim.simulate_sync_sd(costs, counts, lookahead, tokens, end_at_budget=True)
    return sim.simulate_pipespec(costs, counts, tokens, lookahead=lookahead, max_lead=max_lead, end_at_budget=True)


@pytest.mark.parametrize(
    "k,strategy,lookahead,max_lead",
    [(2, "sd", 3, 8), (3, "sd", 3, 8), (3, "sd", 0, 8), (2, "pipespec", 3, 3), (3, "pipespec", 2, 2)],
)
def test_replayed_trace_gives_the_same_target_steps(pipes, k, strategy, lookahead, max_lead):
    varied = set()
    for prompt in PROMPTS:
        result = pipes[k].generate(prompt, MAX_NEW, strategy=strategy, lookahead=lookahead, max_lead=max_lead)
        assert len(result.tokens) == MAX_NEW
        replayed = _replay(result, strategy, lookahead, max_lead)
        for stage in range(1, k):  # every verifier, the target last
            recorded = _target_offers(result.stage_traces[stage])
            assert list(replayed.step_offers[stage - 1]) == recorded, f"stage {stage}"
            varied.update(recorded)
        assert replayed.committed_tokens == MAX_NEW  # the engine's budget: no overshoot
    assert len(varied) > 1  # not a constant sequence: the replay had something to get wrong


# --------------------------------------------------------------------------- the paper's Eq. 4


@pytest.mark.parametrize("alpha,gamma", [(0.6, 3), (0.8, 4), (0.9, 6)])
def test_free_drafters_constant_cost_reproduce_eq4(alpha, gamma):
    """Drafters 10^6 times faster than the target, every target step 1 s, a fixed window gamma. Eq. 3-4
    assume a full window is ready at every target step: the drafter, capped at max_lead tokens beyond the
    target's last commit, must still hold gamma drafts after a commit of gamma + 1 tokens, so max_lead
    >= 2 gamma + 1. (With the engine's default 8 and gamma = 4 the simulator offers 3 drafts after a full
    acceptance, and gives 2.22 tokens per step instead of Eq. 4's 2.28, as the engine would.)"""
    result = sim.simulate_pipespec(
        [sim.StageCost(1e-6), sim.StageCost(1.0)], [alpha], 40000, verify_window=gamma, max_lead=2 * gamma + 1,
        seed=1,
    )
    eq4 = pm.pipespec_tokens_per_step(alpha, gamma)
    assert result.tokens_per_target_step == pytest.approx(eq4, rel=0.02)
    assert result.tokens_per_second == pytest.approx(eq4, rel=0.02)  # target step = 1 s: tokens/s = tokens/step


@pytest.mark.slow
def test_sizing_ab_times_both_variants_on_one_pipeline(capsys):
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    command = [sys.executable, "-m", "experiments.sizing_ab", "models=tiny_k2", "dataset=humaneval",
               "dataset.n_samples=2", "max_new_tokens=12", "strategy=pipespec", "strategy.lookahead=1"]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads(done.stdout)
    assert record["identical"] == "2/2" and record["prompts"] == 2 and record["lookahead"] == 1
    assert record["sized_tokens_per_s"] > 0 and record["all_drafts_tokens_per_s"] > 0
    from experiments.sizing_ab import main  # refused before anything runs: in this process

    capsys.readouterr()
    assert main(["models=no_such_hierarchy"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error:")
