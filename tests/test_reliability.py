"""Reliability of the pipeline under injected faults.

A stage that raises, exits or is killed at a seeded random point of a generation, a stage
that stops responding and a control message that is lost all end the call with a
StageError naming the stage within 10 s, leave no stage process behind, and the next call
on the same Pipeline (which starts fresh stage processes) returns greedy's tokens. A
delayed message changes nothing but the time. tests/test_engine.py holds the first
fixed-point fault tests (k = 3, after 2 steps); this file covers k = 2 and 3, both
lockstep and pipelined strategies, every position, random points and the message faults
of `pipespec.faults`.
"""

import os
import random
import time

import pytest
import torch

from experiments.reliability import processes_gone
from pipespec.decoding import greedy_generate
from pipespec.errors import StageError
from pipespec.faults import FaultPlan
from pipespec.models import CausalLMRunner, load_model
from pipespec.specs import StageSpec
from experiments.tiny import random_prompts

# Its tests wait seconds for stall timeouts with the CPU idle: they share one xdist worker with the other
# waiting tests (tests/test_engine.py), so that the other worker computes meanwhile, instead of both waiting
pytestmark = pytest.mark.xdist_group("stall_waits")
STALL_S = 3  # stall_timeout_s of every pipeline here
ERROR_WITHIN_S = 10  # the bound every fault is held to
MAX_NEW = 16
SEED = 9


TINY = {"noise": [0.3, 0.05]}
PIPELINE_OPTIONS = {"strategy": "pipespec", "stall_timeout_s": STALL_S}  # one Pipeline per depth for the whole
# module (`pipes`): after each fault the next call restarts its stages


@pytest.fixture(scope="module")
def cases(tiny):
    """Prompts whose greedy output runs the whole budget (no early EOS), with those outputs."""
    torch.set_num_threads(1)
    runner = CausalLMRunner(load_model(StageSpec(model=tiny[-1])))
    found = []
    for prompt in random_prompts(20, length=10, seed=SEED):
        expected = greedy_generate(runner, prompt, MAX_NEW, [1])
        if len(expected) == MAX_NEW:
            found.append((prompt, expected))
    assert len(found) >= 2
    return found[:2]


def fail_then_recover(pipe, cases, strategy, fault) -> tuple[str, float]:
    """Generate with `fault`: expect a StageError in time, no stage left, then a correct next call."""
    (prompt, _), (other, expected) = cases
    if not pipe.started:
        pipe.start()
    pids = list(pipe.pids)
    started = time.monotonic()
    with pytest.raises(StageError) as error:
        pipe.generate(prompt, MAX_NEW, strategy=strategy, lookahead=2, faults=FaultPlan(**fault))
    took = time.monotonic() - started
    assert took < ERROR_WITHIN_S, (fault, took)
    assert processes_gone(pids), f"stage processes left after {fault}"
    assert not pipe.started
    # the next call on the same pipeline starts fresh stages and is exact again
    assert pipe.generate(other, MAX_NEW, strategy=strategy, lookahead=2).tokens == expected
    return str(error.value), took


# ---- a stage raises, exits or is killed at a random point --------------------------------

MATRIX = [(k, strategy, stage) for k in (2, 3) for strategy in ("sd", "pipespec") for stage in range(k)]


@pytest.mark.parametrize("k, strategy, stage", MATRIX, ids=[f"k{k}-{s}-stage{i}" for k, s, i in MATRIX])
def test_a_stage_failing_at_a_random_point_is_named(pipes, cases, k, strategy, stage):
    rng = random.Random(f"{SEED}-{k}-{strategy}-{stage}")
    action = rng.choice(["raise", "exit", "kill"])
    at_token = rng.randint(1, 2 * MAX_NEW // 3)  # a point of the generation: the stage's buffer length
    fault = {"stage": stage, "at_token": at_token, "action": action}
    message, _ = fail_then_recover(pipes[k], cases, strategy, fault)
    assert f"stage {stage}:" in message, (fault, message)
    expected = {"raise": "failed: RuntimeError: injected fault", "exit": "died (exit code 17)",
                "kill": "died (killed by signal 9)"}[action]  # fmt: skip
    assert expected in message, (fault, message)


# ---- a stage stops responding --------------------------------------------------------------


@pytest.mark.parametrize("strategy, stage", [("sd", 2), ("pipespec", 1)])
def test_a_stage_that_stops_responding_is_named(pipes, cases, strategy, stage):
    """k = 3: the hung stage's neighbours both stall; the error names the one they waited for."""
    at_token = random.Random(f"{SEED}-hang-{strategy}").randint(1, MAX_NEW // 2)
    fault = {"stage": stage, "at_token": at_token, "action": "hang"}
    message, took = fail_then_recover(pipes[3], cases, strategy, fault)
    assert f"for stage {stage}:" in message and "stopped responding" in message, message
    assert took >= STALL_S


# ---- control messages lost or late ----------------------------------------------------------


@pytest.mark.parametrize(
    "k, strategy, stage, kind",
    [
        (3, "sd", 2, "commit"),  # the target's verdict never reaches its drafter
        (2, "pipespec", 1, "result"),  # the driver never hears the output
        (2, "pipespec", 1, "done"),  # a drafter is never told the target finished
        (3, "pipespec", 1, "trace"),  # a stage's report never arrives
    ],
)
def test_a_lost_message_ends_the_call_within_the_stall_timeout(pipes, cases, k, strategy, stage, kind):
    nth = random.Random(f"{SEED}-drop-{kind}").randint(1, 2) if kind == "commit" else 1
    message, took = fail_then_recover(
        pipes[k], cases, strategy, {"stage": stage, "action": "drop", "message": kind, "nth": nth}
    )
    assert "stopped responding" in message and "stage " in message, message
    assert took >= STALL_S * 0.9


def test_a_lost_drafts_message_is_recovered_or_named(pipes, cases):
    """Drafts carry the drafter's whole buffer: the next one makes up for a lost one, or the stall is named."""
    (prompt, expected), _ = cases
    for nth in (1, 3):
        try:
            fault = {"stage": 0, "action": "drop", "message": "drafts", "nth": nth}
            result = pipes[3].generate(prompt, MAX_NEW, strategy="pipespec", faults=FaultPlan(**fault))
        except StageError as error:
            assert "stopped responding" in str(error)
        else:
            assert result.tokens == expected


@pytest.mark.parametrize(
    "k, strategy, fault",
    [
        (3, "pipespec", {"stage": 1, "message": "commit", "nth": 2, "count": 2}),
        (2, "sd", {"stage": 0, "message": "drafts", "nth": 1}),
        (3, "sd", {"stage": 2, "message": "result"}),
    ],
)
def test_delayed_messages_change_nothing_but_the_time(pipes, cases, k, strategy, fault):
    (prompt, expected), _ = cases
    result = pipes[k].generate(prompt, MAX_NEW, strategy=strategy, lookahead=2,
                               faults=FaultPlan(**{**fault, "action": "delay", "delay_s": 0.5}))  # fmt: skip
    assert result.tokens == expected
    if fault["message"] != "result":  # the result's delay falls after the timed part
        assert result.time_s >= 0.5


# ---- a neighbour's link breaking between requests ---------------------------------------------


class _Queued:
    """A transport whose receive hands out a fixed list of (sender rank, message)."""

    def __init__(self, items):
        self.items = list(items)

    def receive(self, timeout):
        return self.items.pop(0) if self.items else None


def test_a_neighbour_shut_down_first_is_no_failure_and_a_lost_neighbour_fails_the_next_request():
    """At shutdown the driver tells the stages in turn: a stage may see its neighbour's link break before its
    own Shutdown arrives (under torchrun a rank exiting 1 for that failed the whole launch). Between requests
    a broken link to another stage is then no failure by itself: Shutdown ends the stage cleanly, and a
    Generate it can no longer serve fails with the lost link; a lost link to the driver fails at once."""
    from pipespec.protocol import Generate, Job, LinkBroken, Shutdown
    from pipespec.schedule import roles
    from pipespec.stage import StageFailure
    from pipespec.worker import Inbox
    from pipespec.verify import Acceptance, Sampling

    job = Job(1, [3, 4], 8, [], roles("pipespec", 2, 0, 8), 1.0, ["d", "t"], Sampling(), Acceptance())
    closed = LinkBroken("Connection closed by peer")
    assert Inbox(_Queued([(1, closed), (0, Shutdown())]), os.getppid()).next_job() is None
    with pytest.raises(StageFailure, match="lost the link to stage 0") as failure:
        Inbox(_Queued([(1, closed), (0, Generate(job))]), os.getppid()).next_job()
    assert failure.value.kind == "lost_link" and failure.value.waited_for == 0
    with pytest.raises(StageFailure, match="lost the link to the driver"):
        Inbox(_Queued([(0, closed), (0, Shutdown())]), os.getppid()).next_job()
    assert Inbox(_Queued([(0, Generate(job))]), os.getppid()).next_job() == job
