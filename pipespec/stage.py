"""One stage process: its model, its buffer, and the loop every strategy runs.

Ranks: 0 is the driver (the user's process), stage i is rank i + 1; stage i
talks to stage i - 1 (upstream, its drafter) and stage i + 1 (downstream, its
verifier).

Messages are the typed dataclasses of `pipespec.protocol` (every one names the
request it belongs to): `Drafts` downstream (the stage's whole buffer, whether
more is coming, how many commits it has taken in, its distributions), `Commit`
upstream (the verifier's whole buffer: the drafter adopts it, a rollback where
they differ, a catch-up where the verifier is ahead, and forwards it upstream),
`Done` from the target to every active stage, and `Trace`, `Result` and `Failed`
to the driver. What a stage does next is `pipespec.schedule.next_action`; the drafts it is
offered and how it follows a commit are `pipespec.buffers` (the simulator, `analysis.simulate`,
decides with the same functions).

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
`pipespec.drafters.tree`) and appends its most likely path to its buffer, so the buffer, the lead and
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
import traceback
from typing import Any, Sequence

from pipespec import buffers, schedule
from pipespec.decoding import final_output, model_step, tree_step
from pipespec.drafters import DraftTree, build_drafter, common_prefix
from pipespec.gpu import stage_sampler
from pipespec.specs import StageSpec, trees_fed
from pipespec.protocol import (
    Commit, Done, Drafts, Failed, Generate, Job, LinkBroken, Ready, Result, Shutdown, Trace, REQUEST_MESSAGES,
)  # fmt: skip
from pipespec.trace import StageTrace
from pipespec.verify import TokenDist, VerifyRule, encode_dist, point_mass

POLL_S = 0.5  # how often a waiting stage checks that its driver is still alive
DEBUG = bool(os.environ.get("PIPESPEC_DEBUG"))  # log every message and step to stderr


class StageFailure(RuntimeError):
    """A stage cannot go on (a broken link, a stall, a protocol breach); `kind` as in pipespec.errors."""

    def __init__(self, text: str, kind: str, waited_for: int | None = None):
        super().__init__(text)
        self.kind, self.waited_for = kind, waited_for


class StageEngine:
    """What a stage computes with: a causal LM runner, or a model-free drafter (pipespec.drafters)."""

    def __init__(self, spec: StageSpec, tree_nodes_fed: int = 0):
        self.spec = spec
        self.lookup = build_drafter(spec)  # a model-free drafter (pipespec.drafters), or None
        self.runner, self.warm_up_s = None, 0.0  # a compiled stage's warm-up: building or loading it, first calls
        if self.lookup is None:
            from pipespec.exported import stage_runner

            self.runner, self.warm_up_s = stage_runner(spec, tree_nodes_fed)
        self.tree_nodes = spec.tree_nodes if self.lookup is not None else 0  # > 0: proposes token trees
        self.gpu = stage_sampler(spec.devices) if self.runner is not None else None  # NVML samples; None on CPU
        self.history = schedule.VerifyHistory()  # its t(n) and its drafter's acceptance, across requests
        self.kept = schedule.VerifyHistory()  # a drafter: how many of its drafts the next stage kept, by position
        self.seconds_per_token = 0.0  # a drafter: the pace of the next stage's commits (the last request's)

    def start(self) -> None:
        if self.runner is not None:
            self.runner.start()

    def truncate(self, valid_tokens: int) -> None:
        if self.runner is not None:
            self.runner.truncate(valid_tokens)


class StageRequest:
    """The state of one stage during one generate call, and its loop."""

    def __init__(self, index: int, job: Job, engine: StageEngine, transport, stage_names: Sequence[str]):
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
        for i in range(self.dists_pruned, min(self.downstream_committed, len(self.dists))):
            self.dists[i] = None  # never offered again (see the module docstring): free the memory
        self.dists_pruned = max(self.dists_pruned, self.downstream_committed)

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

    def replace_tail(self, common: int, verifier_buffer: list[int]) -> None:
        """Take the verifier's tokens from `common` on; it needs no distribution for its own tokens."""
        self.out = list(verifier_buffer)
        self.dists = self.dists[:common] + [None] * (len(self.out) - common)
        self.confidence = self.confidence[:common] + [1.0] * (len(self.out) - common)
        self.dists_unsent_from = min(self.dists_unsent_from, common)
        self.dists_pruned = min(self.dists_pruned, common)  # own tokens drafted from here on are new

    def take_dists(self, floor: int, offset: int, dists: list) -> None:
        """Mirror the drafter's distributions: keep [floor, offset), replace the rest by `dists`."""
        kept = {i: d for i, d in self.upstream_dists.items() if floor <= i < offset}
        kept.update((offset + j, d) for j, d in enumerate(dists) if d is not None)
        self.upstream_dists = kept

    def extend(self, tokens: list[int], probs, confidence: list[float] | None = None) -> None:
        """Append own tokens; keep the distribution each follows when a verifier downstream needs it."""
        self.out.extend(tokens)
        self.confidence.extend(confidence or [1.0] * len(tokens))
        if probs is None or self.downstream_rank is None:
            self.dists.extend([None] * len(tokens))
        else:
            self.dists.extend(p if isinstance(p, TokenDist) else encode_dist(p) for p in probs)

    def commit_upstream(self) -> None:
        self.commits_sent += 1
        self.upstream_more = True  # the drafter answers every commit with fresh drafts or a "not coming"
        self.transport.send(self.upstream_rank, Commit(self.job.request, list(self.out)))

    def publish(self, more_coming: bool) -> None:
        if self.downstream_rank is None:
            return
        tree = None if self.tree is None else (self.tree[0], self.tree[1].pruned(max_nodes=self.engine.tree_nodes))
        state = (tuple(self.out), more_coming, self.commits_received, tree)
        if state != self.last_published:
            self.last_published = state
            dists = None
            if self.rule.uses_dists:
                offset = max(self.dists_unsent_from, self.downstream_committed)
                dists = (self.downstream_committed, offset, self.dists[offset:])
                self.dists_unsent_from = len(self.out)
            message = Drafts(self.job.request, list(self.out), more_coming, self.commits_received, dists, tree)
            self.transport.send(self.downstream_rank, message)

    def target_keeps_waiting(self) -> bool:
        """The next stage is the target and would wait on whatever this stage drafted so far
        (`schedule.target_keeps_waiting`): this stage tells it when it stops or holds enough."""
        if self.downstream_index is None:
            return False
        target, generated = self.job.roles[self.downstream_index], len(self.out)
        lead = generated - self.downstream_committed
        return schedule.target_keeps_waiting(target, generated, lead, self.job.max_new_tokens)

    # ---- scheduling -------------------------------------------------------
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

    def upstream_dists_from(self, position: int) -> list[TokenDist]:
        """The drafter's distributions from `position` on, up to its first token without one."""
        dists = []
        for p in range(position, len(self.upstream_buffer)):
            if p not in self.upstream_dists:
                break  # not the drafter's own token: one it adopted from an earlier commit of ours
            dists.append(self.upstream_dists[p])
        return dists

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

    def next_action(self) -> tuple[str, Any]:
        """(schedule.STEP | PROPOSE, payload) to act, (FINISH, None), or (IDLE | WAIT, None) to wait."""
        drafts, dists = self.available_drafts() if self.role.has_upstream else ([], None)
        action = schedule.next_action(self.role, self.view(len(drafts)))
        if action.kind == schedule.PROPOSE:  # a list of tokens, or a tree (its most likely path joins the buffer)
            proposal = self.proposal(action.n)
            return (schedule.PROPOSE, proposal) if len(proposal) else (schedule.IDLE, None)
        if action.kind == schedule.STEP and drafts and (tree := self.available_tree()) is not None:
            tree = self.sized_tree(tree)  # the tree instead of the chain (None: a one-token step)
            return action.kind, (tree if tree is not None else [], None)
        if action.kind in (schedule.STEP, schedule.TAKE):  # a sizing verifier may check only the first action.n
            return action.kind, (drafts[: action.n], dists[: action.n] if dists is not None else None)
        return action.kind, None

    def proposal(self, limit: int) -> list[int] | DraftTree:
        """A model-free drafter's next tokens (at most `limit` deep): a chain, or a tree (`tree_nodes` > 0)."""
        sequence, lookup = self.job.prompt_ids + self.out, self.engine.lookup
        if not self.engine.tree_nodes:
            return lookup.propose(sequence, limit)
        return lookup.propose_tree(sequence, self.engine.tree_nodes, limit)

    def step(self, kind: str, payload) -> None:
        self.log("step", kind, payload if kind == schedule.PROPOSE else payload[0], "out", self.out)
        started = time.perf_counter()
        if kind == schedule.PROPOSE:
            proposal = payload
            if isinstance(payload, DraftTree):
                self.grow_tree(payload)
                proposal = payload.path_tokens(payload.best_path())
            # a deterministic proposal: each token's distribution is a point mass on it
            self.extend(proposal, [point_mass(t) for t in proposal] if self.rule.uses_dists else None)
            self.trace.record(started, time.perf_counter(), "draft", 0, 0, 0, len(proposal))
            return
        drafts, draft_dists = payload  # a chain, or a token tree
        if kind == schedule.TAKE:  # a cascade passes its model-free drafter's proposal on: no forward pass
            self.extend(drafts, draft_dists)
            self.trace.record(started, time.perf_counter(), "draft", 0, 0, 0, len(drafts))
            return
        sequence, options = self.job.prompt_ids + self.out, self.step_options()
        if isinstance(drafts, DraftTree):
            step = tree_step(self.engine.runner, sequence, drafts, self.rule, **options)
            kept, offered = step.kept, drafts.depth
        else:
            step = model_step(self.engine.runner, sequence, drafts, draft_dists, self.rule, **options)
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

    def maybe_inject_fault(self, steps: int | None) -> None:
        """Tests only: act on the job's FaultPlan (pipespec.faults) when it targets this stage now."""
        plan = self.job.faults
        if plan is not None and plan.fires(self.index, steps, len(self.out), self.fault_fired):
            self.fault_fired = True
            plan.act(self.index, steps, len(self.out))


def _describe(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def stage_process_main(
    index: int, spec: StageSpec, n_stages: int, host: str, port: int, timeout_s: float, start: int | None = None,
    tree_nodes_fed: int = 0, environ: dict[str, str] | None = None,
):
    """Entry point of a stage process (started by `pipespec.api.Pipeline`, or a launcher's rank): joins
    pipeline start `start` (None: the driver's latest) at the store served at HOST:PORT. `tree_nodes_fed`:
    the nodes of the token trees its drafter proposes (`specs.trees_fed`), which a compiled stage warms up for.
    `environ`: the driver's environment at the start, which a local stage takes as its own: it is forked
    from a fork server that keeps the environment of its own start (PIPESPEC_CACHE, PIPESPEC_KERNELS and
    HF_HUB_OFFLINE set by a script after its first pipeline would otherwise not reach the next one's stages)."""
    if environ is not None:
        os.environ.clear()
        os.environ.update(environ)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    torch.set_num_threads(spec.threads)
    from pipespec.transport import GlooTransport, client_store, join_start

    rank = index + 1
    peers = [r for r in range(n_stages + 1) if r != rank]  # neighbours, the driver, and the target's "done"
    transport = None
    exit_code = 0
    try:
        store = join_start(client_store(host, port, timeout_s), timeout_s, start)
        transport = GlooTransport(rank, n_stages + 1, store, peers)
        engine = StageEngine(spec, tree_nodes_fed)
        transport.send(0, Ready(index, os.getpid(), engine.warm_up_s))
        serve(index, n_stages, engine, Inbox(transport, os.getppid()))
    except SystemExit:
        pass
    except BaseException as error:  # report, then exit: the stage's state is unknown
        exit_code = 1
        print(f"pipespec stage {index} failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        if transport is not None:
            kind, waited_for = getattr(error, "kind", "raised"), getattr(error, "waited_for", None)
            try:
                transport.send(0, Failed(index, kind, _describe(error), traceback.format_exc(), waited_for))
            except Exception:
                pass
    finally:
        if transport is not None:
            transport.close(wait_s=0.0)  # os._exit follows: nothing to wait for
        os._exit(exit_code)


class Inbox:
    """A stage's incoming messages: checks the driver is alive while waiting, keeps messages of a
    request not started yet, and drops stale ones of earlier requests."""

    def __init__(self, transport, parent_pid: int):
        self.transport = transport
        self.parent_pid = parent_pid
        self.future: list = []  # messages of a request not started yet

    def next(self, timeout: float):
        """The next message, or None after `timeout`, checking every POLL_S that the driver is alive."""
        deadline = time.monotonic() + timeout
        while True:
            item = self.transport.receive(min(POLL_S, max(deadline - time.monotonic(), 0.0)))
            if item is not None:
                sender, message = item
                if isinstance(message, LinkBroken):
                    who = "the driver" if sender == 0 else f"stage {sender - 1}"
                    peer = sender - 1 if sender > 0 else None
                    raise StageFailure(f"lost the link to {who}: {message.text}", "lost_link", waited_for=peer)
                return message
            if os.getppid() != self.parent_pid:
                raise SystemExit(0)  # the driver is gone: nothing to report to
            if time.monotonic() >= deadline:
                return None

    def next_job(self) -> Job | None:
        """Wait for the next Generate (None: shut down); messages for later requests are kept. A link to
        another stage that breaks meanwhile is that stage shut down before this one (the driver tells them
        in turn) or dead: the driver's next message says which, Shutdown or a Generate this stage cannot
        serve (the lost link is then its failure). A lost link to the driver fails at once."""
        lost = None
        while True:
            try:
                message = self.next(float("inf"))
            except StageFailure as failure:
                if failure.waited_for is None:
                    raise
                lost = failure
                continue
            if isinstance(message, Shutdown):
                return None
            if isinstance(message, Generate):
                if lost is not None:
                    raise lost
                self.future = [m for m in self.future if m.request >= message.job.request]
                return message.job
            self.future.append(message)

    def for_request(self, request: int):
        """receive(timeout) for one request's loop."""

        def receive(timeout: float):
            for i, message in enumerate(self.future):
                if message.request == request:
                    return self.future.pop(i)
            deadline = time.monotonic() + timeout
            while True:
                message = self.next(max(deadline - time.monotonic(), 0.0))
                if message is None:
                    return None
                if not isinstance(message, REQUEST_MESSAGES):
                    name = type(message).__name__
                    raise StageFailure(f"got {name} in the middle of request {request}", "raised")
                if message.request == request:
                    return message
                if message.request > request:
                    self.future.append(message)
                # else: a stale message of an earlier request: dropped

        return receive


def serve(index: int, n_stages: int, engine: StageEngine, inbox: Inbox) -> None:
    """Run requests until the driver says shut down."""
    while (job := inbox.next_job()) is not None:
        link = inbox.transport if job.faults is None else job.faults.wrap(inbox.transport, index)
        if job.forget_outputs and engine.lookup is not None:
            engine.lookup.forget_outputs()
        request = StageRequest(index, job, engine, link, job.stage_names)
        output = request.run(inbox.for_request(job.request))
        request.log("finished", output)
        if engine.gpu is not None:
            request.trace.gpu = engine.gpu.window(request.trace.start_time, request.trace.end_time)
        link.send(0, Trace(index, job.request, request.trace.to_dict()))
        if output is not None:
            for other in range(n_stages - 1):
                if job.roles[other].active:
                    link.send(other + 1, Done(job.request, output))
            link.send(0, Result(index, job.request, output, margins=request.margins[: len(output)]))
        request.log("reported")


def serve_stage_rank(env: LaunchEnv, specs: list, timeout_s: float) -> None:
    """Serve stage RANK - 1 of `specs` in this process, for the driver's latest pipeline start at
    MASTER_ADDR:MASTER_PORT, and end the process when the driver shuts the stage down."""
    import dataclasses

    import torch

    from pipespec.launch import rank_device

    index = env.rank - 1
    spec = specs[index]
    spec = dataclasses.replace(spec, device=rank_device(spec.device, env.local_rank, torch.cuda.device_count()))
    sys.stdout.flush()
    sys.stderr.flush()
    stage_process_main(index, spec, len(specs), env.master_addr, env.master_port, timeout_s,
                       tree_nodes_fed=trees_fed(specs, index))  # exits the process


def main(argv: list[str] | None = None) -> int:
    """Run one stage rank started by an external launcher (srun, a job script, another machine).

    Reads RANK (1..k; rank 0 is the driver: `Pipeline(..., launch="external", address=...)`),
    WORLD_SIZE (k + 1), MASTER_ADDR and MASTER_PORT (the driver's address), LOCAL_RANK (for
    `device: auto`), and the stage list as JSON: the same list given to the driver's Pipeline.
    Under torchrun no separate stage program is needed: every rank runs the driver's program.
    """
    import argparse
    import json

    from pipespec.errors import ConfigError
    from pipespec.launch import LaunchEnv

    parser = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    parser.add_argument("--stages", required=True, help="JSON file: the list of stages, smallest first")
    parser.add_argument("--timeout-s", type=float, default=600.0)
    args = parser.parse_args(argv)
    try:
        with open(args.stages) as f:
            specs = [StageSpec.from_any(s) for s in json.load(f)]
        env = LaunchEnv.from_environ()
        env.check_world(len(specs))
        if env.rank == 0:
            raise ConfigError(
                "RANK=0 is the driver, not a stage: under torchrun run the driver's program on every rank "
                "(torchrun --nproc_per_node=k+1 -m experiments.run ..., or your script); pipespec.stage "
                "serves ranks 1..k started by another launcher"
            )
    except (ConfigError, OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    serve_stage_rank(env, specs, args.timeout_s)  # does not return
    return 0


if __name__ == "__main__":
    sys.exit(main())
