"""The simulated engine: each stage a ``SimulatedStage`` running the engine's loop (the next action, the view
it is decided from and when a stage commits upstream: ``pipespec.schedule``; the drafts a verifier is
offered and how a stage follows a commit: ``pipespec.buffers``), driven by one event queue
(``Simulation``). Where stages share CPU cores, ``contention`` slows a step while others compute
(processor sharing); a model-free first stage (``supply``) proposes a whole run of drafts in one step, as
the engine's PROPOSE, and may find none when a commit reaches it. Not modelled: EOS, prefill, step times
beyond the cost model, communication other than ``rollback_delay``, verifier-side tie effects.
docs/concepts/strategies.md tells the schedules.
"""

from __future__ import annotations

import heapq
import math
from typing import Sequence

import numpy as np

from analysis.paired import BACK_TO_BACK_S
from analysis.simulate.acceptance import (
    AlongContinuations, Bernoulli, ByPosition, TreeContinuations, _TreeSampler, _as_acceptance
)
from analysis.simulate.costs import ContextCost, RecordedSteps, StageCost, _as_cost, _check_int
from analysis.simulate.result import SimResult, _mean
from analysis.simulate.tokens import _Tokens
from pipespec import buffers
from pipespec.protocol import Role
from pipespec.schedule import (
    Action, FINISH, IDLE, PROPOSE, STEP, StageView, TAKE, commits_after_step, next_action, roles, stage_view
)


UNBOUNDED = 2**62  # the budget of a steady-state simulation: no end in sight


def _check_supply(supply, n_stages: int) -> list[float | None]:
    if supply is None:
        return [None] * n_stages
    supply = [None if p is None else float(p) for p in supply]
    if len(supply) != n_stages or not all(p is None or 0.0 <= p <= 1.0 for p in supply):
        raise ValueError(f"supply needs one probability in [0, 1] or None per stage ({n_stages}), got {supply!r}")
    return supply


def _check_wake(wake: Sequence[float] | None, n_stages: int) -> list[float]:
    """Per stage, the extra cost of a step after a wait (`simulate_pipespec`): 0 each when None."""
    if wake is None:
        return [0.0] * n_stages
    wake = [float(w) for w in wake]
    if len(wake) != n_stages or not all(math.isfinite(w) and w >= 0 for w in wake):
        raise ValueError(f"wake needs one value >= 0 per stage ({n_stages}), got {wake!r}")
    return wake


def _step_clock(costs: Sequence[StageCost | RecordedSteps]):
    """duration(stage, tokens fed) for each new step, drawing recorded durations in order."""
    used = [0] * len(costs)

    def duration(i: int, fed: int, generated: int = 0) -> float:
        """``generated``: the stage's generated tokens already in its KV cache (a `ContextCost` counts them)."""
        cost = costs[i]
        if isinstance(cost, RecordedSteps):
            used[i] += 1
            return cost.durations[(used[i] - 1) % len(cost.durations)]
        if isinstance(cost, ContextCost):
            return cost(max(fed, 1), generated)
        return cost(max(fed, 1))  # every forward pass feeds at least one token

    return duration


SIZING_TABLE = 33  # t(n) entries a sizing verifier is given (n = 1..33: up to 32 drafts)
STEP_DONE = -2  # an event's payload when a step ends (with contention: minus the step's version); else a token


def _cost_table(cost) -> list[float]:
    if isinstance(cost, RecordedSteps):  # a replayed trace has no t(n): its median step for every n
        median = float(np.median(cost.durations))
        return [median] * SIZING_TABLE
    return [cost(n) for n in range(1, SIZING_TABLE + 1)]


def _rates(spec) -> tuple[float, ...]:
    if isinstance(spec, (ByPosition, AlongContinuations)):
        return spec.rates
    if isinstance(spec, Bernoulli):
        return (spec.alpha,)
    return (spec.agree_rate,)  # Replay: its per-token estimate


def _check_schedule_inputs(costs, acceptances, max_new_tokens, rollback_delay, contention, supply):
    """The inputs of a simulation, checked and normalised: (costs, acceptances, max_new_tokens,
    contention, supply)."""
    costs = [c if isinstance(c, RecordedSteps) else _as_cost(c) for c in costs]
    if len(costs) < 2:
        raise ValueError(f"costs needs at least two stages (drafter and target), got {len(costs)}")
    acceptances = [_as_acceptance(a) for a in acceptances]
    if len(acceptances) != len(costs) - 1:
        raise ValueError(f"acceptances needs one entry per adjacent pair ({len(costs) - 1}), got {len(acceptances)}")
    max_new_tokens = _check_int(max_new_tokens, "max_new_tokens", 1)
    if not (math.isfinite(rollback_delay) and rollback_delay >= 0):
        raise ValueError(f"rollback_delay must be a finite number >= 0, got {rollback_delay!r}")
    if contention is not None:
        contention = [None if c is None else float(c) for c in contention]
        if len(contention) != len(costs) or not all(c is None or (math.isfinite(c) and c >= 0) for c in contention):
            raise ValueError(f"contention needs one value >= 0 or None per stage ({len(costs)}), got {contention!r}")
    return costs, acceptances, max_new_tokens, contention, _check_supply(supply, len(costs))


class SimulatedStage:
    """One stage of a simulation, running the engine's loop (`pipespec.stage.StageRequest`; the methods of
    the same names decide with the same functions): its buffer of abstract tokens, the length of the next
    stage's last commit it has received, the step in flight, and what it counted."""

    def __init__(self, index: int, role: Role, simulation: "Simulation", acceptance) -> None:
        self.index = index
        self.role = role
        self.simulation = simulation
        self.tokens = simulation.tokens  # the simulation's token ids
        self.sizing = simulation.sizing[index]  # a sizing verifier's t(n) and acceptance by position, or ((), ())
        self.acceptance = acceptance  # the sampler of its verifications of its drafter's tokens (first stage: None)
        self.upstream: SimulatedStage | None = None  # its drafter
        self.downstream: SimulatedStage | None = None  # its verifier (None: the target)
        self.model_free = index == 0 and simulation.supply[0] is not None  # proposes whole runs (PROPOSE)
        self.buffer: list[int] = []  # O_i: the tokens this stage currently believes
        self.cached = 0  # tokens of buffer in the KV cache
        self.downstream_committed = 0  # length of the next stage's last commit it has received
        self.in_flight = 0  # commits on their way to it (rollback_delay > 0)
        self.dry = False  # a drafter with nothing to propose until the next commit reaches it
        # a model-free drafter's drafts still to propose since the last commit, as measured along the continuation
        # at that position (`Sampler.proposal`); None: its proposals are not measured, it proposes while not dry
        self.proposal_left: int | None = None
        self.pending: int | None = None  # the latest commit that arrived during the step in flight
        self.busy = False
        # the step in flight
        self.step_kind = STEP
        self.step_start = 0.0
        self.step_end = 0.0
        self.step_drafts: list[int] = []
        self.step_tree = False  # the step verifies its drafter's token tree (else the chain it is offered)
        self.step_proposal = 1  # tokens the first stage's step appends (a model-free proposal: several)
        self.last_end: float | None = None  # when its previous step ended (None: none yet)
        # with contention: seconds of solo computing left in its step, the speed it progresses at now, and
        # a version bumped when the step is rescheduled (older completion events are ignored)
        self.work_left = 0.0
        self.rate = 0.0
        self.version = 0
        # what it counted
        self.busy_time = 0.0
        self.steps = 0
        self.discarded = 0  # steps whose result was dropped because of a rollback
        self.verifications = 0
        self.accepted: list[int] = []  # accepted count (+ own token) per verification
        self.offered: list[int] = []
        self.rejections = 0
        self.kinds: list[int] = []  # drafts offered per applied step of a verifier (0: a single step)

    # ---- scheduling ------------------------------------------------------------------
    def available_drafts(self) -> list[int]:
        """The drafter's tokens beyond this stage's buffer (`pipespec.buffers.offered_drafts`), at most
        ``verify_window`` of them."""
        if self.upstream is None:
            return []
        upstream, generated, simulation = self.upstream.buffer, len(self.buffer), self.simulation
        extends = self.tokens.agree_through(upstream, self.buffer, generated)
        return buffers.offered_drafts(generated, upstream, extends, simulation.budget, limit=simulation.verify_window)

    def more_coming(self) -> bool:
        """This stage will produce more drafts without hearing back (what its last message says)."""
        return self.in_flight > 0 or self.busy or self.next_action()[0].kind not in (IDLE, FINISH)

    def view(self, drafts: int) -> StageView:
        """What it knows, in the engine's terms (`pipespec.schedule.stage_view`). There is no EOS and no
        confidence model here: a drafter is never finished and its lead is always confident."""
        more = self.upstream is not None and self.upstream.more_coming()
        step_costs, acceptance = self.sizing
        return stage_view(self.role, len(self.buffer), self.downstream_committed, drafts, more,
                          self.simulation.budget, model_free=self.model_free, step_costs=step_costs,
                          acceptance=acceptance)  # fmt: skip

    def next_action(self) -> tuple[Action, list[int]]:
        """Its next action (`pipespec.schedule.next_action`) and the drafts it is offered."""
        drafts = self.available_drafts()
        if self.dry:
            return Action(IDLE), drafts  # prompt lookup without a proposal
        action = next_action(self.role, self.view(len(drafts)))
        if action.kind == PROPOSE and self.proposal_left is not None:
            action = Action(PROPOSE, min(action.n, self.proposal_left))  # the proposal it made there
        return action, drafts

    def try_start(self, now: float) -> None:
        """Act on its next action if it is idle: start a step, or pass a proposal on (TAKE, at no cost)."""
        if self.busy:
            return
        action, drafts = self.next_action()
        if action.kind == TAKE:  # a cascade passes the proposal on at no cost, then decides again
            self.buffer.extend(drafts[: action.n])
            self.simulation.took = True
            self.try_start(now)
            return
        if action.kind in (STEP, PROPOSE):
            self.start_step(action, drafts[: action.n], now)

    def start_step(self, action: Action, drafts: list[int], now: float) -> None:
        """A step feeds its uncached tokens plus the drafts it verifies."""
        simulation = self.simulation
        self.step_kind = action.kind
        self.step_proposal = action.n if action.kind == PROPOSE else 1
        self.busy = True
        self.step_start = now
        sampler = self.acceptance
        # a tree where its buffer ends at the drafter's tree root (the last commit the drafter adopted), else the
        # chain the drafter holds (`pipespec.stage`)
        self.step_tree = (bool(drafts) and isinstance(sampler, _TreeSampler)
                          and self.upstream.downstream_committed == len(self.buffer))  # fmt: skip
        fed = len(drafts)
        if self.step_tree:
            depth, fed = sampler.tree_span(len(drafts), len(self.buffer))
            drafts = drafts[:depth]
        seconds = simulation.step_time(self.index, len(self.buffer) - self.cached + fed, self.cached)
        if self.last_end is not None and now - self.last_end > BACK_TO_BACK_S:  # after a wait
            seconds *= 1.0 + simulation.wake[self.index]
        self.step_end = now + seconds
        self.step_drafts = drafts
        if simulation.contention is not None:
            self.work_left = self.step_end - now  # scheduled by share_cores once everyone's state is known
            self.rate = 0.0
            return
        simulation.schedule(self.step_end, self.index, STEP_DONE)

    # ---- steps -------------------------------------------------------------------------
    def step(self, now: float) -> bool:
        """Apply its completed step, commit it upstream where its role says so, then adopt a commit that
        arrived during the step; True when the target reached the token budget."""
        self.busy = False
        self.steps += 1
        self.busy_time += now - self.step_start
        self.last_end = now
        produced_from = len(self.buffer)
        if self.upstream is None:  # a model drafts one token a step; a model-free drafter a run of them at once
            self.cached = len(self.buffer)
            for _ in range(self.step_proposal):
                self.buffer.append(self.tokens.new(self.buffer))
            if self.proposal_left is not None:  # a measured proposal, proposed: the next from its buffer's end
                self.proposal_left -= self.step_proposal
                if self.proposal_left <= 0:
                    self.proposal_left = self.downstream.acceptance.proposal(len(self.buffer))
                self.dry = self.proposal_left <= 0
        else:
            self.verify()
        if commits_after_step(self.role, self.step_kind):
            self.commit_upstream(self.buffer[-1], now)
        if self.pending is not None:
            token, self.pending = self.pending, None
            self.adopt(token, now, produced_from)
        return self.downstream is None and len(self.buffer) >= self.simulation.max_new_tokens

    def verify(self) -> None:
        """A verifier's step ends: the accepted drafts and its own token join its buffer."""
        tokens, sampler, drafts = self.tokens, self.acceptance, self.step_drafts
        verify = sampler.verify_tree if self.step_tree else sampler.verify
        accepted = verify(len(drafts), len(self.buffer)) if drafts else 0
        self.buffer.extend(drafts[:accepted])
        self.cached = len(self.buffer)  # own uncached tokens and accepted drafts are now cached
        own = None
        upstream = self.upstream.buffer
        position = len(self.buffer)
        if accepted == len(drafts):
            # bonus or single-token step: the drafter may already hold a token at this position
            if (len(upstream) > position and tokens.agree_through(upstream, self.buffer, position)
                    and sampler.agrees(position)):  # fmt: skip
                own = upstream[position]  # same token: the drafter keeps its continuation
        unseen = accepted == len(drafts) and len(upstream) <= position
        self.buffer.append(own if own is not None else tokens.new(self.buffer, unseen))
        if drafts:
            self.verifications += 1
            self.accepted.append(accepted + 1)
            self.offered.append(len(drafts))
            self.rejections += accepted < len(drafts)
        self.kinds.append(len(drafts))

    # ---- commits -----------------------------------------------------------------------
    def commit_upstream(self, token: int, now: float) -> None:
        """Tell its drafter that the buffer it follows now ends in ``token``, ``rollback_delay`` later."""
        if self.upstream is None:
            return
        simulation = self.simulation
        if simulation.rollback_delay > 0:
            self.upstream.in_flight += 1
            simulation.schedule(now + simulation.rollback_delay, self.upstream.index, token)
        else:
            self.upstream.handle_commit(token, now)

    def handle_commit(self, token: int, now: float) -> None:
        """A commit reaches it. Like the engine, a stage reads its messages between steps: one arriving
        during a step waits for the step's end (the latest commit carries the whole buffer)."""
        if self.busy:
            self.pending = token
        else:
            self.adopt(token, now)

    def adopt(self, token: int, now: float, produced_from: int | None = None) -> None:
        """Follow the commit ending in ``token`` (`pipespec.buffers.adopt`: roll back where the buffers
        differ, catch up where the commit is ahead) and forward it upstream, as the engine does.
        ``produced_from``: where the step that just ended started appending, if one did."""
        tokens = self.tokens
        self.downstream_committed = tokens.position[token] + 1
        self.match_own_tokens(token)
        missing = tokens.diverging(self.buffer, token)
        change = buffers.adopt(len(self.buffer), self.downstream_committed, self.downstream_committed - len(missing))
        if change.replace_from is not None:
            self.replace_tail(change.replace_from, missing)
        self.look_again()  # a commit arrived: a prompt lookup looks for a match again
        if change.replace_from is not None:
            self.cached = min(self.cached, change.replace_from)
            if produced_from is not None and change.replace_from <= produced_from:
                self.discarded += 1  # nothing the step produced survives
        self.commit_upstream(token, now)  # the engine forwards every commit it receives

    def match_own_tokens(self, token: int) -> None:
        """The verifier's own tokens in the commit ending in ``token`` that it made before this stage's token
        at their position existed: equal or not by the pair's agreement (the engine compares token ids);
        a rejection's replacement always differs."""
        tokens = self.tokens
        for theirs in tokens.diverging(self.buffer, token):
            position = tokens.position[theirs]
            if (position >= len(self.buffer) or theirs not in tokens.unseen
                    or not self.downstream.acceptance.agrees(position)):  # fmt: skip
                break
            tokens.merge(self.buffer[position], theirs)

    def replace_tail(self, common: int, tokens_from_common: list[int]) -> None:
        """Take the commit's tokens from ``common`` on."""
        del self.buffer[common:]
        self.buffer.extend(tokens_from_common)

    def look_again(self) -> None:
        """A drafter with a finite supply, back at its successor's output, has a proposal or not: the one it
        made at that output position along the continuation where that was measured (its verifier's
        sampler knows), else one drawn from its proposal rate. Still ahead of its successor, a measured
        proposal goes on where it stopped."""
        supply, downstream = self.simulation.supply[self.index], self.downstream
        if supply is None or downstream is None or len(self.buffer) > len(downstream.buffer):
            if self.proposal_left is None:
                self.dry = False
            return
        self.proposal_left = downstream.acceptance.proposal(len(downstream.buffer))
        if self.proposal_left is None:
            self.dry = bool(self.simulation.rng.random() >= supply)
        else:
            self.dry = self.proposal_left == 0


class Simulation:
    """Every stage runs the engine's loop (`SimulatedStage`): after each event, each idle stage asks
    ``pipespec.schedule.next_action`` (its role from ``pipespec.schedule.roles``) what to do next.

    A step feeds the stage's uncached tokens plus the drafts it verifies. After a step a stage whose
    role commits its own steps (and the target) sends its buffer upstream; a stage receiving a commit
    adopts it between steps, as the engine does: one that arrives during a step is adopted when the
    step ends, after the step's tokens joined the buffer, so the step survives where the commit agrees
    with it (a rollback where they differ: its KV cache is cropped). It records the commit's length
    as the next stage's last commit and forwards it upstream, each hop taking ``rollback_delay`` seconds.
    """

    def __init__(self, strategy: str, costs, acceptances, max_new_tokens: int, lookahead: int, max_lead: int,
                 verify_window: int | None = None, rollback_delay: float = 0.0, seed: int = 0,
                 contention: Sequence[float | None] | None = None, supply: Sequence[float | None] | None = None,
                 end_at_budget: bool = False, size_verification: bool = False, cascade: bool = False,
                 wake: Sequence[float] | None = None) -> None:  # fmt: skip
        costs, acceptances, max_new_tokens, contention, supply = _check_schedule_inputs(
            costs, acceptances, max_new_tokens, rollback_delay, contention, supply
        )
        self.wake = _check_wake(wake, len(costs))
        self.strategy = strategy
        self.max_new_tokens = max_new_tokens
        self.budget = max_new_tokens if end_at_budget else UNBOUNDED
        self.verify_window = verify_window
        self.rollback_delay = rollback_delay
        self.contention = contention
        self.supply = supply
        stage_roles = roles(strategy, len(costs), lookahead, max_lead, size_verification=size_verification,
                            cascade=cascade)  # fmt: skip
        # what a sizing verifier knows: its t(n) and its drafter's acceptance by position (here, the true ones);
        # a verifier of token trees checks the whole tree (`TreeContinuations`)
        self.sizing = [((), ())] + [
            (tuple(_cost_table(costs[i])), _rates(acceptances[i - 1]))
            if size_verification and not isinstance(acceptances[i - 1], TreeContinuations) else ((), ())
            for i in range(1, len(costs))
        ]  # fmt: skip
        self.step_time = _step_clock(costs)
        self.clock = 0.0  # with contention: when the stages' work_left was last brought up to date
        self.took = False  # a cascade passed drafts on during this pass of start_all
        self.rng = np.random.default_rng(seed)
        samplers = [None] + [spec.sampler(self.rng, seed) for spec in acceptances]
        self.tokens = _Tokens()
        self.stages = [SimulatedStage(i, role, self, samplers[i]) for i, role in enumerate(stage_roles)]
        for drafter, verifier in zip(self.stages, self.stages[1:]):
            drafter.downstream, verifier.upstream = verifier, drafter
        self.events: list[tuple[float, int, int, int]] = []  # (time, sequence, stage, token or STEP_DONE)
        self.sequence = 0
        self.max_events = 1000 * max_new_tokens * len(self.stages) + 10_000  # guard against a modelling bug looping

    def schedule(self, time: float, stage_index: int, payload: int) -> None:
        heapq.heappush(self.events, (time, self.sequence, stage_index, payload))
        self.sequence += 1

    def start_all(self, now: float) -> None:
        """Every idle stage acts on its next action, downstream first: verifiers read their drafter's
        state as of now."""
        self.took = True
        while self.took:  # again after a pass-through: the stages downstream of it have new drafts
            self.took = False
            for stage in reversed(self.stages):
                stage.try_start(now)
        if self.contention is not None:
            self.share_cores(now)

    def advance(self, now: float) -> None:
        """Processor sharing: bring every busy stage's remaining work up to ``now``."""
        for stage in self.stages:
            if stage.busy:
                stage.work_left = max(stage.work_left - (now - self.clock) * stage.rate, 0.0)
        self.clock = now

    def share_cores(self, now: float) -> None:
        """Processor sharing: new speeds for the current set of busy stages; reschedule whose speed changed."""
        contention = self.contention
        busy = [j for j, stage in enumerate(self.stages) if stage.busy and contention[j] is not None]
        for j, stage in enumerate(self.stages):
            if not stage.busy:
                continue
            others = sum(1 for k in busy if k != j) if contention[j] is not None else 0
            speed = 1.0 / (1.0 + (contention[j] or 0.0) * others)
            if speed != stage.rate:
                stage.rate = speed
                stage.version += 1
                stage.step_end = now + stage.work_left / speed
                self.schedule(stage.step_end, j, STEP_DONE - stage.version)

    def run(self) -> SimResult:
        """Play events until the target holds ``max_new_tokens`` tokens."""
        for stage in self.stages:
            stage.look_again()
        self.start_all(0.0)
        now = 0.0
        handled = 0
        while True:
            if not self.events:
                raise RuntimeError("simulation stalled: no stage can make progress")
            handled += 1
            if handled > self.max_events:
                raise RuntimeError("simulation exceeded its event budget")
            now, _, i, payload = heapq.heappop(self.events)
            stage = self.stages[i]
            if self.contention is not None:
                if payload <= STEP_DONE and payload != STEP_DONE - stage.version:
                    continue  # a completion time made stale by a change of speed
                self.advance(now)
                if payload <= STEP_DONE:
                    payload = STEP_DONE
            if payload == STEP_DONE:
                if stage.step(now):
                    break
            else:
                stage.in_flight -= 1
                stage.handle_commit(payload, now)
            self.start_all(now)
        for stage in self.stages:  # count the part of in-flight steps that ran before the end
            if stage.busy:
                stage.busy_time += now - stage.step_start
        return _result("sync_sd" if self.strategy == "sd" else self.strategy, self.stages, now, self.max_new_tokens)


def _result(strategy: str, stages: list[SimulatedStage], total_time: float, max_new_tokens: int) -> SimResult:
    verifiers = stages[1:]
    return SimResult(
        strategy=strategy,
        total_time=total_time,
        tokens_generated=max_new_tokens,
        committed_tokens=len(stages[-1].buffer),
        steps=tuple(s.steps for s in stages),
        discarded_steps=tuple(s.discarded for s in stages),
        busy_fraction=tuple(min(s.busy_time / total_time, 1.0) for s in stages),
        verify_fraction=tuple(
            s.verifications / (s.steps - s.discarded) if s.steps > s.discarded else math.nan for s in verifiers
        ),
        accepted_per_verify=tuple(_mean(s.accepted) for s in verifiers),
        offered_per_verify=tuple(_mean(s.offered) for s in verifiers),
        rejections=tuple(s.rejections for s in verifiers),
        accepted_counts=tuple(tuple(s.accepted) for s in verifiers),
        offered_counts=tuple(tuple(s.offered) for s in verifiers),
        step_offers=tuple(tuple(s.kinds) for s in verifiers),
    )
