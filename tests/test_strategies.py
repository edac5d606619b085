"""What makes the strategies different, read from their traces (identity with greedy cannot tell).

- sd runs in lockstep: at any moment at most one stage computes, so no two stages' steps overlap.
- pipespec runs every stage at once: drafters compute while the target computes, and the target's
  verifications check drafts that were produced while it was busy with its previous step (drafts
  it did not wait for).

Each check is also run on a deliberately broken schedule (pipespec's roles given to sd, sd's given
to pipespec: the driver sends the roles with every request), where it must fail.
"""

import pytest

import pipespec.options
from pipespec import schedule
from experiments.tiny import random_prompts

TINY = {"noise": [0.3, 0.05], "eos_token_id": None}  # drafter, middle, target; full-length outputs
MAX_NEW = 32
PROMPTS = random_prompts(4, length=8, seed=3)


def intervals(trace) -> list[tuple[float, float]]:
    return list(zip(trace.steps["t_start"], trace.steps["t_end"]))


def overlap_s(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Total time during which a step of `a` and a step of `b` both run (each list is time-ordered)."""
    total, j = 0.0, 0
    for start, end in a:
        while j < len(b) and b[j][1] <= start:
            j += 1
        k = j
        while k < len(b) and b[k][0] < end:
            total += max(0.0, min(end, b[k][1]) - max(start, b[k][0]))
            k += 1
    return total


def stage_overlap_s(result) -> float:
    """Time during which two stages computed at once, summed over every pair of stages."""
    traces = result.stage_traces
    return sum(overlap_s(intervals(a), intervals(b)) for i, a in enumerate(traces) for b in traces[i + 1 :])


def unwaited_verifications(result) -> int:
    """Target verifications that checked a draft the drafter finished while the target was computing its
    previous step: drafts that were ready when the target turned to them, without waiting."""
    drafter, target = result.stage_traces[-2], result.stage_traces[-1]
    drafter_ends = drafter.steps["t_end"]
    steps = list(zip(target.steps["kind"], target.steps["t_start"], target.steps["t_end"]))
    count = 0
    for (_, previous_start, previous_end), (kind, _, _) in zip(steps, steps[1:]):
        if kind == "verify" and any(previous_start < t <= previous_end for t in drafter_ends):
            count += 1
    return count


def run(pipe, strategy, lookahead):
    return [pipe.generate(p, MAX_NEW, strategy=strategy, lookahead=lookahead) for p in PROMPTS]


def lockstep(results) -> bool:
    """sd's defining behaviour: no two stages ever compute at once."""
    return max(stage_overlap_s(r) for r in results) == 0.0


def pipelined(results) -> bool:
    """pipespec's: stages compute at once for a good share of the target's busy time (measured 18-58% on
    tiny models under load; 0 in lockstep)."""
    target_busy = sum(r.summary()[-1]["busy_s"] for r in results)
    return sum(stage_overlap_s(r) for r in results) > 0.1 * target_busy


def verifies_unwaited_drafts(results) -> bool:
    """pipespec's: the target often verifies drafts finished while it was busy (k=2: 13-33 of 74-86
    verifications measured; 0 in lockstep)."""
    return sum(unwaited_verifications(r) for r in results) >= len(results)


@pytest.fixture
def broken_roles(monkeypatch):
    """Give a strategy another strategy's roles (the driver computes them for every request)."""

    def use(strategy, instead):
        real = schedule.roles
        monkeypatch.setattr(
            pipespec.options, "roles", lambda name, *args: real(instead if name == strategy else name, *args)
        )

    return use


def test_overlap_arithmetic():
    assert overlap_s([(0, 2), (3, 4)], [(1, 3.5)]) == pytest.approx(1.5)
    assert overlap_s([(0, 1)], [(1, 2)]) == 0.0
    assert overlap_s([], [(0, 1)]) == 0.0


@pytest.mark.parametrize("k", [2, 3])
def test_sd_steps_never_overlap(pipes, k):
    results = run(pipes[k], "sd", 4)
    assert all(r.summary()[-1]["verify_steps"] > 0 for r in results)  # it did speculate
    assert lockstep(results)


@pytest.mark.parametrize("k", [2, 3])
def test_pipespec_stages_compute_at_once(pipes, k):
    assert pipelined(run(pipes[k], "pipespec", 1))


def test_pipespec_verifies_drafts_it_did_not_wait_for(pipes):
    # k=2: in the tiny k=3 chain the middle runs as fast as the target, so the target mostly waits for it
    assert verifies_unwaited_drafts(run(pipes[2], "pipespec", 1))


def test_the_sd_check_fails_on_a_pipelined_sd(pipes, broken_roles):
    broken_roles("sd", "pipespec")
    assert not lockstep(run(pipes[2], "sd", 1))


def test_the_pipespec_checks_fail_on_a_lockstep_pipespec(pipes, broken_roles):
    broken_roles("pipespec", "sd")
    results = run(pipes[2], "pipespec", 4)
    assert not pipelined(results) and not verifies_unwaited_drafts(results)
