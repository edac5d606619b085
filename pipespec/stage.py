"""The loop every strategy runs: one stage's buffer and decisions during one generate call.

Ranks: 0 is the driver (the user's process), stage i is rank i + 1; stage i
talks to stage i - 1 (upstream, its drafter) and stage i + 1 (downstream, its
verifier).

Messages are the typed dataclasses of `pipespec.protocol` (every one names the
request it belongs to): `Drafts` downstream (the stage's whole buffer, whether
more is coming, how many commits it has taken in, its distributions), `Commit`
upstream (the verifier's whole buffer: the drafter adopts it, a rollback where
they differ, a catch-up where the verifier is ahead, and forwards it upstream),
`Done` from the target to every active stage, and `Trace`, `Result` and `Failed`
to the driver (sent by the stage process around the loop, `pipespec.worker`).
What a stage does next is `pipespec.schedule.next_action`; the drafts it is
offered and how it follows a commit are `pipespec.buffers` (the simulator,
`analysis.simulate`, decides with the same functions).

Distributions (`pipespec.verify` says what they are and what one costs) are
sent once each, not with every buffer: `dists` is (floor, offset, list) and
says "your copy of my distributions at positions >= offset is replaced by this
list (buffer[offset:], None where I hold none); drop everything below floor".
A stage stores, beside its buffer, the distribution each of its own tokens
follows; a rollback drops those of the removed tokens and marks the positions
from there unsent, so the verifier's copy always mirrors the drafter's at the
last message. floor is the length of the verifier's last commit as the
drafter knows it: below it the drafter holds the verifier's own tokens, which
need no distribution, and both sides drop what they held there. A verifier
takes as drafts the run of the drafter's tokens beyond its buffer that come
with distributions; a token without one (in a stale buffer that happens to
match after a rollback, a token the drafter adopted from the verifier) ends
the run. A draft offered this way is always one the verifier has not checked
before: to see position j again its buffer must have been rolled back to a
prefix that differs from the one it checked j after.

Token trees. A model-free drafter with `tree_nodes` > 0 proposes a tree (`propose_tree`,
`pipespec.tree`) and appends its most likely path to its buffer, so the buffer, the lead and
the schedule stay what they are for a chain. Beside the buffer it holds the tree, rooted where the
tree's first proposal started (a later proposal from the path's end is grafted below it), and sends its
`tree_nodes` most likely nodes with every "drafts" message. A commit that the drafter's buffer extends
moves the root along the tree (its subtree there); any other commit drops the tree. A verifier whose
buffer ends exactly at the tree's root (and is the drafter's buffer up to there) verifies the tree
instead of the chain (`decoding.tree_step`), sized by `schedule.tree_size` where it sizes its
verifications; its commit is its buffer as after a chain, and the drafter adopts the accepted branch
whether it was the drafter's own path or not. A step's trace row counts every node in `fed` and the
tree's depth as `offered`.
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Any, Sequence

from pipespec import buffers, schedule
from pipespec.decoding import final_output, model_step, tree_step
from pipespec.drafters import common_prefix
from pipespec.protocol import Commit, Done, Drafts, Job
from pipespec.trace import StageTrace
from pipespec.tree import DraftTree
from pipespec.verify import TokenDist, VerifyRule, encode_dist, point_mass

DEBUG = bool(os.environ.get("PIPESPEC_DEBUG"))  # log every message and step to stderr


class StageFailure(RuntimeError):
    """A stage cannot go on (a broken link, a stall, a protocol breach); `kind` as in pipespec.errors."""

    def __init__(self, text: str, kind: str, waited_for: int | None = None):
        super().__init__(text)
        self.kind, self.waited_for = kind, waited_for


class StageRequest:
    """The state of one stage during one generate call, and its loop (`run`). `engine` is what the stage
    computes with (`pipespec.worker.StageEngine`): `runner` (a model) or `lookup` (a model-free drafter),
    and its measurements across requests (`history`, `kept`, `seconds_per_token`)."""

    def __init__(self, index: int, job: Job, engine, transport, stage_names: Sequence[str]):
        self.index = index
        self.job = job
        self.role = job.roles[index]
        self.engine = engine
        self.transport = transport
        self.rank = index + 1
        # a call may run a subset of the stages (`CallOptions.stages`): the role names the neighbours then
        self.upstream_index = None if not self.role.has_upstream else (
            index - 1 if self.role.upstream is None else self.role.upstream)  # fmt: skip
        self.downstream_index = None if self.role.is_target else (
            index + 1 if self.role.downstream is None else self.role.downstream)  # fmt: skip
        self.upstream_rank = None if self.upstream_index is None else self.upstream_index + 1
        self.downstream_rank = None if self.downstream_index is None else self.downstream_index + 1
        self.name = stage_names[index]
        checks = job.faults is None or job.faults.checks_drafts(index)  # tests: a wrong rule on purpose
        self.rule = VerifyRule(job.sampling, job.acceptance, index, check_drafts=checks)
        self.out: list[int] = []  # this stage's generated buffer (its O_i)
        self.dists: list[TokenDist | None] = []  # beside `out`: the distribution each own token follows
        self.confidence: list[float] = []  # beside `out`: this stage's own probability of each token (1: not its own)
        self.margins: list[float] = []  # target only, beside `out`: top-2 logit margin that decided each token
        self.dists_unsent_from = 0  # positions from here changed since the last "drafts" message
        self.dists_pruned = 0  # positions below are below the verifier's commit: dropped
        self.upstream_buffer: list[int] = []  # the drafter's buffer as last published
        self.upstream_dists: dict[int, TokenDist] = {}  # the drafter's distributions by position
        self.upstream_more = self.role.has_upstream
        self.tree: tuple[int, DraftTree] | None = None  # a tree-proposing drafter: (root, its tree)
        self.upstream_tree: tuple[int, DraftTree] | None = None  # the drafter's last published (root, tree)
        self.commits_sent = 0
        self.commits_received = 0
        self.downstream_committed = 0  # length of the next stage's buffer at its last commit
        self.first_commit: tuple[float, int] | None = None  # (time, length) of this request's first commit received
        self.last_published: tuple | None = None
        self.done = False
        self.fault_fired = False
        self.trace = StageTrace(index, self.name)

    # ---- loop -------------------------------------------------------------
    def run(self, receive) -> list[int] | None:
        """Run until done; return the final output if this is the target."""
        self.engine.start()
        self.trace.start_time = time.perf_counter()
        steps = 0
        while True:
            while (message := receive(0.0)) is not None:
                self.handle(message)
            self.maybe_inject_fault(None)  # an "at_token" fault can fire on adopted tokens too
            if self.done:
                break
            kind, payload = self.next_action()
            if kind == schedule.FINISH:
                break
            if kind in (schedule.IDLE, schedule.WAIT):
                self.wait(kind, receive)
                continue
            self.step(kind, payload)
            steps += 1
            self.maybe_inject_fault(steps)
            if not self.target_keeps_waiting():
                self.publish(more_coming=True)
            if schedule.commits_after_step(self.role, kind):
                self.commit_upstream()
        self.trace.end_time = time.perf_counter()
        if self.role.is_target:
            return final_output(self.out, self.job.max_new_tokens, self.job.eos_ids)
        return None

    def wait(self, kind: str, receive) -> None:
        """IDLE or WAIT: publish the buffer (more coming when waiting for drafts), then take the next message;
        silence past `stall_timeout_s` is a stall naming the neighbour waited for."""
        self.log("wait", kind)
        self.publish(more_coming=kind == schedule.WAIT)
        message = receive(self.job.stall_timeout_s)
        if message is None:
            neighbour = self.upstream_index if kind == schedule.WAIT else self.downstream_index  # drafts, or a commit
            raise StageFailure(
                f"stage {self.name} waited {self.job.stall_timeout_s:.0f} s for stage "
                f"{self.job.stage_names[neighbour]}: it stopped responding",
                "stalled",
                waited_for=neighbour,
            )
        self.handle(message)

    def next_action(self) -> tuple[str, Any]:
        """(schedule.STEP | PROPOSE | TAKE, payload) to act, (FINISH, None), or (IDLE | WAIT, None) to wait."""
        drafts, dists = self.available_drafts() if self.role.has_upstream else ([], None)
        action = schedule.next_action(self.role, self.view(len(drafts)))
        if action.kind == schedule.PROPOSE:  # a list of tokens, or a tree (its most likely path joins the buffer)
            proposal = self.proposal(action.n)
            return (schedule.PROPOSE, proposal) if len(proposal) else (schedule.IDLE, None)
        if action.kind == schedule.STEP and drafts and (tree := self.tree_to_verify()) is not None:
            return action.kind, (tree, None)  # the drafter's token tree instead of the chain
        if action.kind in (schedule.STEP, schedule.TAKE):  # a sizing verifier may check only the first action.n
            return action.kind, (drafts[: action.n], dists[: action.n] if dists is not None else None)
        return action.kind, None

    def step(self, kind: str, payload) -> None:
        """Act: append a model-free proposal (PROPOSE), pass the drafts on unverified (TAKE, the cascade), or
        run a model step over them (STEP)."""
        self.log("step", kind, payload if kind == schedule.PROPOSE else payload[0], "out", self.out)
        started = time.perf_counter()
        if kind == schedule.PROPOSE:
            tokens = self.proposed_tokens(payload)
            self.extend(tokens, self.point_masses(tokens))  # a deterministic proposal
            self.trace.record(started, time.perf_counter(), "draft", 0, 0, 0, len(tokens))
        elif kind == schedule.TAKE:  # a cascade passes its model-free drafter's proposal on: no forward pass
            drafts, draft_dists = payload
            self.extend(drafts, draft_dists)
            self.trace.record(started, time.perf_counter(), "draft", 0, 0, 0, len(drafts))
        else:
            self.verify(*payload, started)

    def verify(self, drafts: list[int] | DraftTree, draft_dists, started: float) -> None:
        """One model step over the drafts (a chain, or a token tree: `verify_tree`): append the drafts it keeps
        and its own token, and record the step."""
        sequence = self.job.prompt_ids + self.out
        if isinstance(drafts, DraftTree):
            step, kept, offered = self.verify_tree(sequence, drafts)
        else:
            step = model_step(self.engine.runner, sequence, drafts, draft_dists, self.rule, **self.step_options())
            kept, offered = drafts[: step.accepted], len(drafts)
        self.extend(kept + [step.token], step.probs, step.confidence)
        self.margins.extend(step.margins or [])
        self.engine.history.record_step(step.fed, time.perf_counter() - started)
        if offered:
            self.engine.history.record_verification(offered, step.accepted)
        step_kind = "verify" if offered else ("single" if self.role.has_upstream or self.role.is_target else "draft")
        self.trace.record(started, time.perf_counter(), step_kind, step.fed, offered, step.accepted, step.accepted + 1)

    def step_options(self) -> dict:
        """What a model step returns beside its tokens: its own confidence (draft_confidence), margins (target)."""
        return {"with_confidence": self.role.stop_below > 0, "with_margins": self.role.is_target}

    # ---- messages -------------------------------------------------------
    def log(self, *parts) -> None:
        if DEBUG:
            print(f"[{time.perf_counter():.4f} {self.name}]", *parts, file=sys.stderr, flush=True)

    def handle(self, message) -> None:
        self.log("got", message)
        if isinstance(message, Drafts):
            self.upstream_buffer = message.buffer
            self.upstream_tree = message.tree
            if message.dists is not None:
                self.take_dists(*message.dists)
            # a "not coming" sent before our latest commit arrived says nothing about now
            self.upstream_more = message.more_coming or message.commits_seen < self.commits_sent
        elif isinstance(message, Commit):
            self.commits_received += 1
            common = common_prefix(self.out, message.buffer)
            if self.role.value_stop > 0:
                self.learn_from_commit(message.buffer, common)
            self.adopt(message.buffer, common)
            if self.upstream_rank is not None:
                self.commit_upstream()
        elif isinstance(message, Done):
            self.done = True
            if self.engine.lookup is not None and message.tokens is not None:
                self.engine.lookup.observe_output(self.job.prompt_ids, message.tokens)  # a finished output only
        else:
            raise StageFailure(f"stage {self.name}: unexpected message {type(message).__name__}", "raised")

    def learn_from_commit(self, verifier_buffer: list[int], common: int) -> None:
        """value_stop's online estimates: how many of its drafts the commit decided and kept (by position
        beyond the previous commit; `common`: the length of the buffers' common prefix), and the pace of
        the next stage's commits."""
        start, decided = self.downstream_committed, min(len(self.out), len(verifier_buffer))
        if decided > start:
            self.engine.kept.record_verification(decided - start, max(common - start, 0))
        now = time.perf_counter()
        if self.first_commit is None:
            self.first_commit = (now, len(verifier_buffer))
        elif len(verifier_buffer) > self.first_commit[1]:
            since, length = self.first_commit
            self.engine.seconds_per_token = (now - since) / (len(verifier_buffer) - length)

    def adopt(self, verifier_buffer: list[int], common: int | None = None) -> None:
        """Follow the next stage's buffer: roll back where it differs, catch up where it is ahead
        (`common`: the length of the two buffers' common prefix, when known)."""
        if common is None:
            common = common_prefix(self.out, verifier_buffer)
        self.follow_tree(verifier_buffer, common)
        change = buffers.adopt(len(self.out), len(verifier_buffer), common)
        if change.rolled_back:
            self.trace.note_rollback(change.rolled_back)
        if change.replace_from is not None:
            self.replace_tail(change.replace_from, verifier_buffer)
        self.engine.truncate(len(self.job.prompt_ids) + common)
        self.downstream_committed = len(verifier_buffer)
        self.drop_dists_below(self.downstream_committed)

    def replace_tail(self, common: int, verifier_buffer: list[int]) -> None:
        """Take the verifier's tokens from `common` on; it needs no distribution for its own tokens."""
        self.out = list(verifier_buffer)
        self.dists = self.dists[:common] + [None] * (len(self.out) - common)
        self.confidence = self.confidence[:common] + [1.0] * (len(self.out) - common)
        self.dists_unsent_from = min(self.dists_unsent_from, common)
        self.dists_pruned = min(self.dists_pruned, common)  # own tokens drafted from here on are new

    def extend(self, tokens: list[int], probs, confidence: list[float] | None = None) -> None:
        """Append own tokens (`probs`: the distribution each follows, None where none is kept)."""
        self.out.extend(tokens)
        self.confidence.extend(confidence or [1.0] * len(tokens))
        self.keep_dists(tokens, probs)

    def commit_upstream(self) -> None:
        self.commits_sent += 1
        self.upstream_more = True  # the drafter answers every commit with fresh drafts or a "not coming"
        self.transport.send(self.upstream_rank, Commit(self.job.request, list(self.out)))

    def publish(self, more_coming: bool) -> None:
        """Send the buffer downstream (`Drafts`) when it, "more coming" or the commits taken in changed since
        the last message: with the distributions not yet sent and the token tree, where there are."""
        if self.downstream_rank is None:
            return
        tree = self.published_tree()
        state = (tuple(self.out), more_coming, self.commits_received, tree)
        if state != self.last_published:
            self.last_published = state
            message = Drafts(self.job.request, list(self.out), more_coming, self.commits_received,
                             self.dists_to_send(), tree)  # fmt: skip
            self.transport.send(self.downstream_rank, message)

    def target_keeps_waiting(self) -> bool:
        """The next stage is the target and would wait on whatever this stage drafted so far
        (`schedule.target_keeps_waiting`): this stage tells it when it stops or holds enough."""
        if self.downstream_index is None:
            return False
        target, generated = self.job.roles[self.downstream_index], len(self.out)
        lead = generated - self.downstream_committed
        return schedule.target_keeps_waiting(target, generated, lead, self.job.max_new_tokens)

    # ---- what the schedule decides with -------------------------------------
    def lead_confidence(self) -> float:
        """This stage's own probability that every token beyond the next stage's last commit survives."""
        return math.prod(self.confidence[self.downstream_committed :])

    def available_drafts(self) -> tuple[list[int], list[TokenDist] | None]:
        """The drafter's usable tokens beyond this stage's buffer (`buffers.offered_drafts`: cut at
        room - 1 and after an EOS, and where the rule needs distributions at the first token without one),
        and their distributions when the rule needs them."""
        n, job, upstream = len(self.out), self.job, self.upstream_buffer
        extends = upstream[:n] == self.out
        dists = self.upstream_dists_from(n) if self.rule.uses_dists and extends else None
        limit = None if dists is None else len(dists)
        drafts = buffers.offered_drafts(n, upstream, extends, job.max_new_tokens, job.eos_ids, limit)
        return drafts, dists[: len(drafts)] if dists is not None else None

    def view(self, drafts: int) -> schedule.StageView:
        """What this stage knows when it picks its next action (`schedule.stage_view`), offered `drafts`."""
        job = self.job
        return schedule.stage_view(
            self.role,
            len(self.out),
            self.downstream_committed,
            drafts,
            self.upstream_more,
            job.max_new_tokens,
            model_free=self.engine.lookup is not None,
            holds_eos=any(t in job.eos_ids for t in self.out),
            lead_confidence=self.lead_confidence() if self.role.stop_below > 0 else 1.0,
            **self.sizing(drafts),
            **self.worth(),
        )

    def worth(self) -> dict:
        """What value_stop decides with: the chance the next draft survives and the target tokens its step
        delays (`schedule.survival`, `schedule.draft_cost`), from this stage's online estimates."""
        if not self.role.value_stop > 0:
            return {}
        engine = self.engine
        return {
            "draft_value": schedule.survival(len(self.out) - self.downstream_committed + 1, engine.kept.acceptance()),
            "draft_cost": schedule.draft_cost(self.role.value_stop, engine.history.step_time(1), engine.seconds_per_token),
        }

    def sizing(self, drafts: int) -> dict:
        """What a sizing verifier decides with (`schedule.verify_size`): its own measured t(n) and its
        drafter's acceptance by position so far."""
        if not (self.role.size_verification and drafts):
            return {}
        history = self.engine.history
        return {"step_costs": history.step_costs(), "acceptance": history.acceptance()}

    # ---- token trees (the module docstring) -----------------------------------
    def proposal(self, limit: int) -> list[int] | DraftTree:
        """A model-free drafter's next tokens (at most `limit` deep): a chain, or a tree (`tree_nodes` > 0)."""
        sequence, lookup = self.job.prompt_ids + self.out, self.engine.lookup
        if not self.engine.tree_nodes:
            return lookup.propose(sequence, limit)
        return lookup.propose_tree(sequence, self.engine.tree_nodes, limit)

    def proposed_tokens(self, proposal: list[int] | DraftTree) -> list[int]:
        """The tokens a proposal appends to the buffer: a tree's most likely path (the tree is kept beside)."""
        if not isinstance(proposal, DraftTree):
            return proposal
        self.grow_tree(proposal)
        return proposal.path_tokens(proposal.best_path())

    def grow_tree(self, tree: DraftTree) -> None:
        """A tree proposed after the buffer's end: grafted below the leaf of the tree's most likely path
        where the buffer ends there, else the tree, rooted at the buffer's end."""
        if self.tree is not None:
            root, held = self.tree
            path = held.best_path()
            if path and root + len(path) == len(self.out):
                self.tree = (root, held.graft(path[-1], tree))
                return
        self.tree = (len(self.out), tree)

    def follow_tree(self, verifier_buffer: list[int], common: int) -> None:
        """Keep this drafter's token tree for the buffer it holds after a commit: where its buffer extends
        the commit, the tree rooted at the commit's end (its subtree there) once the commit passes the
        root; where the commit rolls it back or is ahead of it, no tree."""
        if self.tree is None:
            return
        root, tree = self.tree
        if common < len(verifier_buffer):
            self.tree = None
        elif len(verifier_buffer) > root:
            below = tree.subtree(verifier_buffer[root:])
            self.tree = (len(verifier_buffer), below) if below else None

    def published_tree(self) -> tuple[int, DraftTree] | None:
        """(root, its `tree_nodes` most likely nodes) of this drafter's tree, as a "drafts" message carries it."""
        if self.tree is None:
            return None
        return self.tree[0], self.tree[1].pruned(max_nodes=self.engine.tree_nodes)

    def tree_to_verify(self) -> DraftTree | list | None:
        """The drafter's token tree to verify instead of the chain (`available_tree`, sized by `sized_tree`;
        [] where sizing leaves a one-token step), or None: verify the chain."""
        tree = self.available_tree()
        if tree is None:
            return None
        sized = self.sized_tree(tree)
        return sized if sized is not None else []

    def available_tree(self) -> DraftTree | None:
        """The drafter's token tree when it is rooted exactly at this stage's buffer's end and the drafter's
        buffer is this stage's up to there; cut at room - 1 tokens deep and below an EOS (as
        `buffers.offered_drafts` cuts a chain). None: verify the chain."""
        if self.upstream_tree is None:
            return None
        root, tree = self.upstream_tree
        n = len(self.out)
        if root != n or self.upstream_buffer[:n] != self.out:
            return None
        tree = tree.pruned(max_depth=max(self.job.max_new_tokens - n - 1, 0), stop_tokens=self.job.eos_ids)
        return tree if len(tree) else None

    def sized_tree(self, tree: DraftTree) -> DraftTree | None:
        """A sizing verifier checks the tree's `schedule.tree_size` most likely nodes (None: a one-token
        step) once it has measured its t(n); otherwise the whole tree."""
        costs = self.engine.history.step_costs() if self.role.size_verification else ()
        if not costs:
            return tree
        n = schedule.tree_size(tree.probs, costs)
        return tree.pruned(max_nodes=n) if n else None

    def verify_tree(self, sequence: list[int], tree: DraftTree):
        """A model step over a token tree (`decoding.tree_step`): (the step, the accepted branch's tokens, the
        tree's depth, which the trace counts as offered)."""
        step = tree_step(self.engine.runner, sequence, tree, self.rule, **self.step_options())
        return step, step.kept, tree.depth

    # ---- distributions (sampling; the module docstring) ------------------------
    def point_masses(self, tokens: list[int]) -> list[TokenDist] | None:
        """A deterministic proposal's distributions, where the rule needs them: a point mass on each token."""
        return [point_mass(t) for t in tokens] if self.rule.uses_dists else None

    def keep_dists(self, tokens: list[int], probs) -> None:
        """Beside own tokens, the distribution each follows when a verifier downstream needs it."""
        if probs is None or self.downstream_rank is None:
            self.dists.extend([None] * len(tokens))
        else:
            self.dists.extend(p if isinstance(p, TokenDist) else encode_dist(p) for p in probs)

    def drop_dists_below(self, committed: int) -> None:
        """Forget the distributions below the verifier's commit: never offered again, free the memory."""
        for i in range(self.dists_pruned, min(committed, len(self.dists))):
            self.dists[i] = None
        self.dists_pruned = max(self.dists_pruned, committed)

    def dists_to_send(self) -> tuple | None:
        """A "drafts" message's (floor, offset, list): the distributions changed since the last message (None
        where the rule needs none)."""
        if not self.rule.uses_dists:
            return None
        offset = max(self.dists_unsent_from, self.downstream_committed)
        dists = (self.downstream_committed, offset, self.dists[offset:])
        self.dists_unsent_from = len(self.out)
        return dists

    def take_dists(self, floor: int, offset: int, dists: list) -> None:
        """Mirror the drafter's distributions: keep [floor, offset), replace the rest by `dists`."""
        kept = {i: d for i, d in self.upstream_dists.items() if floor <= i < offset}
        kept.update((offset + j, d) for j, d in enumerate(dists) if d is not None)
        self.upstream_dists = kept

    def upstream_dists_from(self, position: int) -> list[TokenDist]:
        """The drafter's distributions from `position` on, up to its first token without one."""
        dists = []
        for p in range(position, len(self.upstream_buffer)):
            if p not in self.upstream_dists:
                break  # not the drafter's own token: one it adopted from an earlier commit of ours
            dists.append(self.upstream_dists[p])
        return dists

    # ---- tests ----------------------------------------------------------------
    def maybe_inject_fault(self, steps: int | None) -> None:
        """Tests only: act on the job's FaultPlan (pipespec.faults) when it targets this stage now."""
        plan = self.job.faults
        if plan is not None and plan.fires(self.index, steps, len(self.out), self.fault_fired):
            self.fault_fired = True
            plan.act(self.index, steps, len(self.out))
