"""The stage protocol: what a request is, how each stage behaves in it, and every message.

Pure Python (no torch). Every message is one small frozen dataclass; the
receiver dispatches on its type, never on a position in a tuple or on text.
Ranks: 0 is the driver (the user's process), stage i is rank i + 1.

driver -> stage:   Generate(job), Shutdown()
stage -> driver:   Ready(stage, pid), Trace(stage, request, trace), Result(stage, request, tokens),
                   Failed(stage, kind, text, detail, waited_for)
stage -> stage:    Drafts (downstream, with a token tree where the drafter proposes trees), Commit
                   (upstream), Done (target -> every active stage)
transport -> self: LinkBroken(text), put in the inbox when the link to a peer breaks

`Drafts` and `Commit` carry a stage's whole generated buffer (at most
max_new_tokens ids): sending it whole keeps the protocol simple at a cost of
microseconds. `pipespec.stage` says how distributions travel with drafts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # this module stays torch-free: the simulator and analysis import it
    from pipespec.verify import Acceptance, Sampling


@dataclass(frozen=True)
class Role:
    """How one stage behaves in one request (`pipespec.schedule.roles` builds them)."""

    active: bool = False
    has_upstream: bool = False  # verifies drafts of the previous stage
    is_target: bool = False
    min_lead: int | None = None  # drafts to wait for while the drafter still produces; None: until it stops
    max_lead: int = 0  # stop producing this many tokens ahead of the next stage's last commit
    commits_own_steps: bool = False  # tell the previous stage after each own step (else only forward commits)
    stop_below: float = 0.0  # stop drafting once the lead's own probability falls below this (0 = off)
    size_verification: bool = False  # a verifier checks only as many drafts as pay for their step cost
    takes_drafts: bool = False  # cascade: passes its model-free drafter's proposals on unverified, steps on misses
    value_stop: float = 0.0  # > 0: stop drafting where a draft is worth less than it costs (the target's slowdown
    #                          per second of this stage's compute; pipespec.schedule); 0 = off
    upstream: int | None = None  # the stage whose drafts it verifies (None: the one before it)
    downstream: int | None = None  # the stage that verifies its drafts (None: the one after it)


@dataclass
class Job:
    """One generate call, as every active stage receives it."""

    request: int
    prompt_ids: list[int]
    max_new_tokens: int
    eos_ids: list[int]
    roles: list[Role]
    stall_timeout_s: float
    stage_names: list[str]
    sampling: "Sampling"
    acceptance: "Acceptance"
    forget_outputs: bool = False  # model-free drafters drop earlier outputs before this request (suffix)
    faults: Any = None  # tests only: a `pipespec.faults.FaultPlan`; production code never sets it


# ---- driver <-> stage ---------------------------------------------------------


@dataclass(frozen=True)
class Generate:
    job: Job


@dataclass(frozen=True)
class Shutdown:
    pass


@dataclass(frozen=True)
class Ready:
    stage: int
    pid: int
    warm_up_s: float = 0.0  # a compiled stage's warm-up before it served (pipespec.compiled)


@dataclass(frozen=True)
class Trace:
    stage: int
    request: int
    trace: dict  # `pipespec.trace.StageTrace.to_dict()`


@dataclass(frozen=True)
class Result:
    stage: int
    request: int
    tokens: list[int]
    margins: list[float] | None = None  # the target's top-2 logit margin at each token (identity classification)


@dataclass(frozen=True)
class Failed:
    """A stage cannot go on. `kind` is one of `pipespec.errors.FAILURE_KINDS`."""

    stage: int
    kind: str
    text: str
    detail: str | None = None  # the traceback, when there is one
    waited_for: int | None = None  # kind "stalled": the stage it waited for


# ---- stage <-> stage ------------------------------------------------------------


@dataclass(frozen=True)
class Drafts:
    """Downstream: the sender's whole buffer, whether it will produce more without hearing back, how
    many commits it has taken in (so a verifier can tell a stale "not coming" from a fresh one), and
    its distributions (None at temperature 0 and under synthetic acceptance): (floor, offset, list).
    `tree`: a model-free drafter proposing token trees (`tree_nodes` > 0) sends (root, DraftTree), its
    tree rooted after the first `root` tokens of `buffer` (which holds the tree's most likely path);
    a verifier whose buffer ends exactly there verifies the tree instead of the chain."""

    request: int
    buffer: list[int]
    more_coming: bool
    commits_seen: int
    dists: tuple | None = None
    tree: tuple | None = None  # (root, pipespec.tree.DraftTree), or None


@dataclass(frozen=True)
class Commit:
    """Upstream: the verifier's whole buffer; the drafter adopts it (a rollback where they differ)."""

    request: int
    buffer: list[int]


@dataclass(frozen=True)
class Done:
    request: int
    tokens: list[int] | None = None  # the target's final output (a suffix drafter indexes it)


@dataclass(frozen=True)
class LinkBroken:
    """Put in a receiver's own inbox by the transport when the link to a peer breaks."""

    text: str


REQUEST_MESSAGES = (Drafts, Commit, Done, Trace, Result)  # the messages that belong to one request
