"""Strategies as schedules of the one stage loop.

Every strategy runs the same loop in every stage process (`pipespec.stage`):
take the drafts the previous stage has published, verify them in one forward
pass with the shared rule, append the accepted prefix plus one own token,
publish downstream, and follow whatever the next stage commits. A strategy only
decides, per stage, when to step:

- `greedy`: only the target is active; it never has drafts, so every step is a
  one-token step.
- `sd` (synchronous chain; k = 2 is standard speculative decoding, k >= 3 the
  paper's tiered baseline): the first stage drafts `lookahead` tokens and stops;
  each verifier waits until its drafter has stopped, verifies the whole window
  and stops; only the target's commit, cascading upstream, releases the chain.
  At any moment exactly one stage computes.
- `pipespec` (asynchronous pipeline): every stage runs at once. Drafters keep
  drafting up to `max_lead` tokens beyond what the next stage has committed;
  a verifier takes whatever drafts are there, waiting only while fewer than
  `lookahead` are available and more are coming (0 = never wait), and takes a
  one-token step when there are none. Every verifier commits upstream after
  each step, so rejections cascade to the first stage.

Token trees (a model-free first stage with `tree_nodes` > 0, sd and pipespec) change no decision here:
the drafter's buffer holds its tree's most likely path, so leads and waits count that chain, and a
verifier offered drafts verifies the tree rooted at its buffer's end instead (`tree_size` sizes it).

`cascade` (pipespec, a model-free first stage and at least three stages; after
CS Drafting's cascade): the stage behind the model-free drafter passes every
proposal on as its own drafts without a forward pass (TAKE), and drafts with its
model only where the model-free stage has nothing (it waits for that answer, one
message hop, while one is coming). The target still verifies every token, so
the output is unchanged; the model drafter's steps go only to the misses.

`draft_confidence` (sd and pipespec; 0 = off) also stops a drafter early: once
the product of its own probabilities of the tokens it holds beyond the next
stage's last commit (the chance, by its own reckoning, that all of them
survive) falls below it. Drafts past that point are mostly rolled back, and on
a machine whose stages share memory bandwidth each one slows the target.

`value_stop` (sd and pipespec; 0 = off) stops a model drafter where another draft
is worth less than it costs. Its value: the chance it survives, the product of
the acceptance rates by position up to its place in the lead (estimated online
from the next stage's commits), in tokens. Its cost: the target tokens its step
delays, `value_stop` x the drafter's step time / the pipeline's time per token,
where `value_stop` is the target's slowdown per second of drafter compute (the
contention a profile measures; 1 in sd, where the target waits for every draft).
A drafter with no lead always drafts, so its estimates keep learning.
"""

from __future__ import annotations

from typing import NamedTuple

from pipespec.errors import ConfigError
from pipespec.protocol import Role

STRATEGIES = ("greedy", "sd", "pipespec")
DEFAULT_MAX_LEAD = 8  # the engine's, the runner's and the simulator's default max_lead


def check_options(strategy: str, n_stages: int, lookahead: int, max_lead: int, draft_confidence: float = 0.0,
                  value_stop: float = 0.0) -> None:  # fmt: skip
    if strategy not in STRATEGIES:
        raise ConfigError(f"strategy must be one of {list(STRATEGIES)}, got {strategy!r}")
    if strategy != "greedy" and n_stages < 2:
        raise ConfigError(f"strategy {strategy!r} needs at least 2 stages (drafters then the target), got {n_stages}")
    if not isinstance(lookahead, int) or lookahead < 0:
        raise ConfigError(f"lookahead must be an integer >= 0, got {lookahead!r}")
    if not isinstance(max_lead, int) or max_lead < 1:
        raise ConfigError(f"max_lead must be an integer >= 1, got {max_lead!r}")
    confidence = draft_confidence
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0 <= confidence < 1:
        raise ConfigError(f"draft_confidence must be a number with 0 <= draft_confidence < 1 (0 = off), got {confidence!r}")
    if isinstance(value_stop, bool) or not isinstance(value_stop, (int, float)) or not 0 <= value_stop <= 100:
        raise ConfigError(f"value_stop must be a number with 0 <= value_stop <= 100 (the target's slowdown per second "
                          f"of drafter compute; 0 = off), got {value_stop!r}")  # fmt: skip


def check_flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be true or false, got {value!r}")
    return value


def check_cascade(strategy: str, n_stages: int, cascade) -> bool:
    if check_flag("cascade", cascade) and (strategy != "pipespec" or n_stages < 3):
        raise ConfigError(f"cascade needs strategy pipespec and at least 3 stages (a model-free drafter, a model "
                          f"drafter, the target), got strategy {strategy!r} with {n_stages} stage(s)")  # fmt: skip
    return cascade


def roles(strategy: str, n_stages: int, lookahead: int, max_lead: int, draft_confidence: float = 0.0,
          size_verification: bool = False, cascade: bool = False, value_stop: float = 0.0) -> list[Role]:  # fmt: skip
    """One Role per stage, smallest first, target last. `size_verification`: every verifier checks
    only as many of the offered drafts as pay for their step cost (`verify_size`). `cascade`: the
    second stage takes the first (model-free) stage's proposals unverified and drafts only on misses
    (the caller checks that the first stage is model-free). `value_stop`: every drafter stops where a
    draft is worth less than it costs (the module docstring)."""
    check_options(strategy, n_stages, lookahead, max_lead, draft_confidence, value_stop)
    stop, worth = float(draft_confidence), float(value_stop)
    sized = check_flag("size_verification", size_verification)
    check_cascade(strategy, n_stages, cascade)
    last = n_stages - 1
    if strategy == "greedy":
        return [Role()] * last + [Role(active=True, is_target=True, commits_own_steps=True)]
    if strategy == "sd":
        first = Role(active=True, max_lead=lookahead, stop_below=stop, value_stop=worth)
        middle = Role(active=True, has_upstream=True, max_lead=1, size_verification=sized)
        target = Role(active=True, has_upstream=True, is_target=True, commits_own_steps=True, size_verification=sized)
    else:
        lead = max(max_lead, lookahead)  # a verifier waiting for `lookahead` drafts must be able to get them
        first = Role(active=True, max_lead=lead, stop_below=stop, value_stop=worth)
        middle = Role(active=True, has_upstream=True, min_lead=lookahead, max_lead=lead, commits_own_steps=True,
                      stop_below=stop, size_verification=sized, value_stop=worth)  # fmt: skip
        target = Role(active=True, has_upstream=True, is_target=True, min_lead=lookahead, commits_own_steps=True,
                      size_verification=sized)  # fmt: skip
    middles = [middle] * (n_stages - 2)
    if cascade:  # waits for the model-free answer (min_lead None) and passes proposals on (TAKE)
        middles[0] = Role(active=True, has_upstream=True, max_lead=lead, commits_own_steps=True, stop_below=stop,
                          takes_drafts=True, value_stop=worth)  # fmt: skip
    return [first] + middles + [target]


# ---- the one schedule decision (the stage loop and the simulator both call it) ----------------

FINISH, IDLE, WAIT, PROPOSE, STEP, TAKE = "finish", "idle", "wait", "propose", "step", "take"


class StageView(NamedTuple):
    """What a stage knows when it picks its next action; counts are tokens. (An immutable named tuple: the
    engine and the simulator build one per decision, millions in a simulation.)"""

    generated: int  # its buffer
    budget: int  # max_new_tokens
    lead: int  # generated minus the next stage's last commit (0 for the target)
    finished: bool  # the target: its output is complete; a drafter: it holds an EOS
    drafts: int = 0  # usable drafts of the previous stage beyond its buffer (cut at room - 1 and at an EOS)
    upstream_more: bool = False  # the previous stage will produce more without hearing back
    lead_confidence: float = 1.0  # its own probability that its whole lead survives
    model_free: bool = False  # proposes without a model (prompt lookup, suffix)
    step_costs: tuple[float, ...] = ()  # a verifier sizing its verifications: t(n), n = 1.. tokens fed
    acceptance: tuple[float, ...] = ()  # ... and its drafter's acceptance by draft position
    draft_value: float = 1.0  # a drafter: the chance its next draft survives (value_stop)
    draft_cost: float = 0.0  # ... and the target tokens that draft's step delays

    @property
    def room(self) -> int:
        return self.budget - self.generated


class Action(NamedTuple):
    kind: str  # FINISH | IDLE (wait for a commit) | WAIT (for drafts) | PROPOSE (up to `n`) | STEP (verify `n`)
    #            | TAKE (append the first `n` drafts unverified: a cascade's pass-through)
    n: int = 0


def drafts_wanted(role: Role, room: int) -> int:
    """How many drafts a verifier waits for while its drafter is still producing."""
    return room - 1 if role.min_lead is None else min(role.min_lead, room - 1)


def target_keeps_waiting(target: Role, generated: int, lead: int, budget: int) -> bool:
    """Whether the target, the next stage of a drafter that holds `generated` tokens, `lead` of them beyond the
    target's last commit, still waits for drafts (`next_action`'s WAIT) once it hears of them, or is offered
    none: then the drafter drafts on without telling it (a message the target would only wake up for, sd's
    lookahead times a round). The target never rolls back and commits every step, so it holds at least the
    committed tokens: it is offered at most `lead` drafts, and fewer than `drafts_wanted` (its room - 1) while
    `generated` < budget - 1; holding its own token beyond them, it is offered none."""
    if not target.is_target or target.takes_drafts or generated >= budget - 1:
        return False
    return target.min_lead is None or lead < target.min_lead


def not_worth_a_step(role: Role, view: StageView) -> bool:
    """value_stop: a model drafter's next draft is worth less than its step costs (it keeps one in lead)."""
    return role.value_stop > 0 and view.lead > 0 and not view.model_free and view.draft_value < view.draft_cost


def next_action(role: Role, view: StageView) -> Action:
    """A stage's next action from its role and what it knows: the schedule of every strategy."""
    if role.is_target:
        if view.finished:
            return Action(FINISH)
    elif (
        view.lead >= role.max_lead
        or view.room <= 1  # the target verifies at most room - 1 drafts: its own token takes the last place
        or view.finished
        or (role.stop_below > 0 and view.lead_confidence < role.stop_below)
        or (not_worth_a_step(role, view) and not (role.takes_drafts and view.drafts))  # taking costs nothing
    ):
        return Action(IDLE)
    if view.model_free:
        return Action(PROPOSE, min(view.room - 1, role.max_lead - view.lead))
    if role.takes_drafts and view.drafts:
        return Action(TAKE, min(view.drafts, role.max_lead - view.lead))
    if role.has_upstream and view.upstream_more and view.drafts < drafts_wanted(role, view.room):
        return Action(WAIT)
    if role.size_verification and view.drafts and view.step_costs and view.acceptance:
        return Action(STEP, verify_size(view.drafts, view.acceptance, view.step_costs))
    return Action(STEP, view.drafts)


def stage_view(
    role: Role,
    generated: int,
    downstream_committed: int,
    drafts: int,
    upstream_more: bool,
    budget: int,
    model_free: bool = False,
    step_costs: tuple[float, ...] = (),
    acceptance: tuple[float, ...] = (),
    holds_eos: bool = False,
    lead_confidence: float = 1.0,
    draft_value: float = 1.0,
    draft_cost: float = 0.0,
) -> StageView:
    """What a stage knows, from its state: its buffer length (`generated`), the length of the next stage's
    last commit it has received, the usable drafts of its drafter and whether that drafter will produce
    more without hearing back. The target is finished at its budget or at an EOS (`holds_eos`), a
    drafter at an EOS; the rest (its own confidence, a sizing verifier's t(n) and acceptance, value_stop's
    worth of a draft) is passed on as the stage measured it."""
    return StageView(
        generated=generated,
        budget=budget,
        lead=generated - downstream_committed,
        finished=(role.is_target and generated >= budget) or holds_eos,
        drafts=drafts,
        upstream_more=role.has_upstream and upstream_more,
        lead_confidence=lead_confidence,
        model_free=model_free,
        step_costs=step_costs,
        acceptance=acceptance,
        draft_value=draft_value,
        draft_cost=draft_cost,
    )


def commits_after_step(role: Role, kind: str) -> bool:
    """Whether a stage sends its buffer upstream after a step of `kind`: a verifier commits each of its
    steps when its role says so (the target always), except a taken proposal (TAKE): that is the
    drafter's own, nothing to tell it."""
    return role.has_upstream and kind != TAKE and (role.is_target or role.commits_own_steps)


def survival(n: int, acceptance) -> float:
    """The chance that the first n drafts of a verification are all accepted (`acceptance` as below)."""
    chance = 1.0
    for p in range(n if acceptance else 0):  # nothing known yet: every draft is worth drafting
        chance *= acceptance[min(p, len(acceptance) - 1)]
    return chance


def draft_cost(value_stop: float, step_s: float, seconds_per_token: float) -> float:
    """The target tokens one draft step of `step_s` seconds delays: the target's slowdown per second of
    drafter compute x that time, over the pipeline's time per token (0 until both are known)."""
    return value_stop * step_s / seconds_per_token if step_s > 0 and seconds_per_token > 0 else 0.0


def expected_tokens(n: int, acceptance) -> float:
    """Tokens one verification of n drafts yields on average: the accepted prefix plus the own token.
    `acceptance[p]`: P(draft p + 1 accepted | the drafts before it were); beyond the list, its last rate."""
    return 1.0 + sum(survival(p, acceptance) for p in range(1, n + 1))


def step_cost(costs, fed: int) -> float:
    """t(fed) from a measured table of t(1), t(2), ...; beyond it, its last entry plus its mean slope."""
    if fed <= len(costs):
        return costs[fed - 1]
    slope = max((costs[-1] - costs[0]) / (len(costs) - 1), 0.0) if len(costs) > 1 else 0.0
    return costs[-1] + slope * (fed - len(costs))


def verify_size(drafts: int, acceptance, costs, uncached: int = 1) -> int:
    """How many of the `drafts` offered to verify in one pass (0: a one-token step): the most expected
    tokens per second of the verifier's own step cost t(uncached + n). Where t(n) is not smooth (CPU
    kernels change with the row count) a verifier skips sizes that cost more than they can return.
    Ties go to the larger size; verifying any prefix of the drafts is lossless."""
    best, best_rate = drafts, -1.0
    for n in range(drafts, -1, -1):
        rate = expected_tokens(n, acceptance) / step_cost(costs, uncached + n)
        if rate > best_rate * (1 + 1e-9):
            best, best_rate = n, rate
    return best


def tree_size(probs, costs, uncached: int = 1) -> int:
    """How many of a token tree's nodes to verify in one pass, its most likely first (0: a one-token step):
    `verify_size`'s rule over a tree. Each node adds its chance of lying on the verifier's path, its
    estimated probability `probs` (the drafter's continuation shares), to the expected tokens
    1 + sum(kept probs); the size with the most of them per second of t(uncached + n) wins (ties: the
    larger). The most likely nodes of a tree form a tree (a node is never likelier than its parent)."""
    ranked = sorted(probs, reverse=True)
    expected = 1.0 + sum(ranked)
    best, best_rate = len(ranked), -1.0
    for n in range(len(ranked), -1, -1):
        rate = expected / step_cost(costs, uncached + n)
        if rate > best_rate * (1 + 1e-9):
            best, best_rate = n, rate
        if n:
            expected -= ranked[n - 1]
    return best


class VerifyHistory:
    """What a sizing verifier has seen, kept by its stage across requests: its step time per number of
    tokens fed (median of the last `window` steps of each size) and its drafter's acceptance by draft
    position (with one accepted and one rejected draft as a prior at each position)."""

    def __init__(self, max_fed: int = 33, window: int = 9):
        self.max_fed = max_fed
        self.window = window
        self.times: list[list[float]] = [[] for _ in range(max_fed)]
        self.offered = [0] * (max_fed - 1)
        self.accepted = [0] * (max_fed - 1)

    def record_step(self, fed: int, seconds: float) -> None:
        if 1 <= fed <= self.max_fed:
            recent = self.times[fed - 1]
            recent.append(seconds)
            del recent[: -self.window]

    def record_verification(self, offered: int, accepted: int) -> None:
        for p in range(min(offered, len(self.offered))):
            self.offered[p] += 1
            if p >= accepted:
                break
            self.accepted[p] += 1

    def step_time(self, fed: int = 1) -> float:
        """The median of its recent steps feeding `fed` tokens (0: none seen yet)."""
        recent = sorted(self.times[fed - 1]) if 1 <= fed <= self.max_fed else []
        return recent[len(recent) // 2] if recent else 0.0

    def step_costs(self) -> tuple[float, ...]:
        """t(1), t(2), ... up to the largest size seen; sizes not seen yet interpolated between the sizes
        seen around them. () until two sizes have been seen (a verifier then checks every draft)."""
        seen = [(n + 1, sorted(t)[len(t) // 2]) for n, t in enumerate(self.times) if t]
        if len(seen) < 2:
            return ()
        table = []
        for fed in range(1, seen[-1][0] + 1):
            below = max((s for s in seen if s[0] <= fed), default=seen[0], key=lambda s: s[0])
            above = min((s for s in seen if s[0] >= fed), default=seen[-1], key=lambda s: s[0])
            if above[0] == below[0]:
                table.append(below[1])
            else:
                share = (fed - below[0]) / (above[0] - below[0])
                table.append(below[1] + share * (above[1] - below[1]))
        return tuple(table)

    def acceptance(self) -> tuple[float, ...]:
        """P(draft p accepted | the earlier ones were), p = 1.. up to the last position ever offered."""
        last = max((p for p, o in enumerate(self.offered) if o), default=-1)
        return tuple((self.accepted[p] + 1) / (self.offered[p] + 2) for p in range(last + 1))
