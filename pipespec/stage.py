"""One stage process: its model, its buffer, and the loop every strategy runs.

Ranks: 0 is the driver (the user's process), stage i is rank i + 1; stage i
talks to stage i - 1 (upstream, its drafter) and stage i + 1 (downstream, its
verifier).

Messages (tuples; every one names the request it belongs to):
- driver -> stage: ("generate", job), ("shutdown",)
- downstream: ("drafts", request, buffer, more_coming, commits_seen, dists):
  the stage's whole generated buffer, whether it will produce more without
  hearing back, how many commits it has taken in (so a verifier can tell a
  stale "not coming" from a fresh one), and the distributions of its tokens
  (None at temperature 0 and under synthetic acceptance, where verifiers need
  none)
- upstream: ("commit", request, buffer): the verifier's whole generated buffer;
  the drafter adopts it (a rollback where they differ, a catch-up where the
  verifier is ahead) and, if it is a verifier itself, forwards it upstream
- target -> active stages: ("done", request); stage -> driver: ("trace", ...),
  ("result", ...) from the target, ("error", ...) from a stage that failed
Buffers are at most max_new_tokens ids, so sending them whole keeps the
protocol simple at a cost of microseconds.

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
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any, Sequence

from pipespec.decoding import final_output, is_finished, model_step
from pipespec.faults import for_request
from pipespec.models import CausalLMRunner, PromptLookup, StageSpec, load_model
from pipespec.schedule import Role
from pipespec.trace import StageTrace
from pipespec.verify import Acceptance, Sampling, TokenDist, VerifyRule, encode_dist, point_mass

POLL_S = 0.5  # how often a waiting stage checks that its driver is still alive
DEBUG = bool(os.environ.get("PIPESPEC_DEBUG"))  # log every message and step to stderr


class StageFailure(RuntimeError):
    """A stage cannot go on (a broken link, a stall); the message names the stage."""


@dataclass
class Job:
    request: int
    prompt_ids: list[int]
    max_new_tokens: int
    eos_ids: list[int]
    roles: list[Role]
    stall_timeout_s: float
    stage_names: list[str]
    # fault injection for tests: {"stage": i, "after_steps": n, "action": "raise"|"exit"|"kill"|"hang"}, or
    # {"stage": i, "action": "accept_drafts"}: that verifier keeps every draft unchecked (a wrong rule)
    # {"stage": i, "at_token": n, "action": ...}: fires once its buffer holds >= n tokens (steps or commits)
    # {"stage": i, "action": "drop"|"delay", "message": kind, ...}: lose or delay messages (pipespec.faults)
    fault: dict | None = None
    sampling: Sampling = Sampling()
    acceptance: Acceptance = Acceptance()


class StageEngine:
    """What a stage computes with: a causal LM runner, or a prompt-lookup drafter."""

    def __init__(self, spec: StageSpec):
        self.spec = spec
        if spec.kind == "prompt_lookup":
            self.lookup = PromptLookup(spec.ngram_size, spec.max_proposal)
            self.runner = None
        else:
            self.lookup = None
            self.runner = CausalLMRunner(load_model(spec))

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
        self.upstream_rank = self.rank - 1 if self.role.has_upstream else None
        self.downstream_rank = self.rank + 1 if not self.role.is_target else None
        self.name = stage_names[index]
        fault = job.fault or {}
        wrong_rule = fault.get("stage") == index and fault.get("action") == "accept_drafts"
        self.rule = VerifyRule(job.sampling, job.acceptance, index, check_drafts=not wrong_rule)
        self.out: list[int] = []  # this stage's generated buffer (its O_i)
        self.dists: list[TokenDist | None] = []  # beside `out`: the distribution each own token follows
        self.confidence: list[float] = []  # beside `out`: this stage's own probability of each token (1: not its own)
        self.dists_unsent_from = 0  # positions from here changed since the last "drafts" message
        self.dists_pruned = 0  # positions below are below the verifier's commit: dropped
        self.upstream_buffer: list[int] = []  # the drafter's buffer as last published
        self.upstream_dists: dict[int, TokenDist] = {}  # the drafter's distributions by position
        self.upstream_more = self.role.has_upstream
        self.commits_sent = 0
        self.commits_received = 0
        self.downstream_committed = 0  # length of the next stage's buffer at its last commit
        self.last_published: tuple | None = None
        self.done = False
        self.fault_fired = False
        self.trace = StageTrace(index, self.name)

    # ---- messages -------------------------------------------------------
    def log(self, *parts) -> None:
        if DEBUG:
            print(f"[{time.perf_counter():.4f} {self.name}]", *parts, file=sys.stderr, flush=True)

    def handle(self, message: tuple) -> None:
        self.log("got", message)
        kind = message[0]
        if kind == "drafts":
            _, _, buffer, more_coming, commits_seen, dists = message
            self.upstream_buffer = buffer
            if dists is not None:
                self.take_dists(*dists)
            # a "not coming" sent before our latest commit arrived says nothing about now
            self.upstream_more = more_coming or commits_seen < self.commits_sent
        elif kind == "commit":
            self.commits_received += 1
            self.adopt(message[2])
            if self.upstream_rank is not None:
                self.commit_upstream()
        elif kind == "done":
            self.done = True
        else:
            raise StageFailure(f"stage {self.name}: unexpected message {kind!r}")

    def adopt(self, verifier_buffer: list[int]) -> None:
        """Follow the next stage's buffer: roll back where it differs, catch up where it is ahead."""
        common = 0
        limit = min(len(self.out), len(verifier_buffer))
        while common < limit and self.out[common] == verifier_buffer[common]:
            common += 1
        if common < len(self.out) and common < len(verifier_buffer):
            self.trace.note_rollback(len(self.out) - common)
            self.replace_tail(common, verifier_buffer)
        elif len(verifier_buffer) > len(self.out):
            self.replace_tail(common, verifier_buffer)
        self.engine.truncate(len(self.job.prompt_ids) + common)
        self.downstream_committed = len(verifier_buffer)
        for i in range(self.dists_pruned, min(self.downstream_committed, len(self.dists))):
            self.dists[i] = None  # never offered again (see the module docstring): free the memory
        self.dists_pruned = max(self.dists_pruned, self.downstream_committed)

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
        self.transport.send(self.upstream_rank, ("commit", self.job.request, list(self.out)))

    def publish(self, more_coming: bool) -> None:
        if self.downstream_rank is None:
            return
        state = (tuple(self.out), more_coming, self.commits_received)
        if state != self.last_published:
            self.last_published = state
            dists = None
            if self.rule.uses_dists:
                offset = max(self.dists_unsent_from, self.downstream_committed)
                dists = (self.downstream_committed, offset, self.dists[offset:])
                self.dists_unsent_from = len(self.out)
            self.transport.send(
                self.downstream_rank,
                ("drafts", self.job.request, list(self.out), more_coming, self.commits_received, dists),
            )

    # ---- scheduling -------------------------------------------------------
    def lead_confidence(self) -> float:
        """This stage's own probability that every token beyond the next stage's last commit survives."""
        return math.prod(self.confidence[self.downstream_committed :])

    def available_drafts(self) -> tuple[list[int], list[TokenDist] | None]:
        """The drafter's tokens beyond this stage's buffer, and their distributions when the rule needs them."""
        n = len(self.out)
        if not (len(self.upstream_buffer) > n and self.upstream_buffer[:n] == self.out):
            return [], None
        drafts = self.upstream_buffer[n:]
        if not self.rule.uses_dists:
            return drafts, None
        dists = []
        for position in range(n, len(self.upstream_buffer)):
            if position not in self.upstream_dists:
                break  # not the drafter's own token: one it adopted from an earlier commit of ours
            dists.append(self.upstream_dists[position])
        return drafts[: len(dists)], dists

    def next_action(self) -> tuple[str, Any]:
        """("finish"|"propose"|"model", payload) to act, or ("wait", more_coming) to wait for a message."""
        job, role = self.job, self.role
        room = job.max_new_tokens - len(self.out)
        if role.is_target:
            if is_finished(self.out, job.max_new_tokens, job.eos_ids):
                return "finish", None
        elif (
            len(self.out) - self.downstream_committed >= role.max_lead
            or room <= 0
            or any(t in job.eos_ids for t in self.out)
            or (role.stop_below > 0 and self.lead_confidence() < role.stop_below)
        ):
            return "wait", False
        if self.engine.lookup is not None:
            limit = min(room, role.max_lead - (len(self.out) - self.downstream_committed))
            proposal = self.engine.lookup.propose(job.prompt_ids + self.out, limit)
            return ("propose", proposal) if proposal else ("wait", False)
        drafts, dists = self.available_drafts() if role.has_upstream else ([], None)
        drafts = drafts[: max(room - 1, 0)]
        for i, token in enumerate(drafts):
            if token in job.eos_ids:
                drafts = drafts[: i + 1]  # nothing after an EOS can be kept
                break
        if role.has_upstream and self.upstream_more:
            wanted = room - 1 if role.min_lead is None else min(role.min_lead, room - 1)
            if len(drafts) < wanted:
                return "wait", True
        return "model", (drafts, dists[: len(drafts)] if dists is not None else None)

    def step(self, kind: str, payload) -> None:
        self.log("step", kind, payload if kind == "propose" else payload[0], "out", self.out)
        started = time.perf_counter()
        if kind == "propose":
            # a deterministic proposal: each token's distribution is a point mass on it
            self.extend(payload, [point_mass(t) for t in payload] if self.rule.uses_dists else None)
            self.trace.record(started, time.perf_counter(), "draft", 0, 0, 0, len(payload))
            return
        drafts, draft_dists = payload
        sequence = self.job.prompt_ids + self.out
        step = model_step(
            self.engine.runner, sequence, drafts, draft_dists, self.rule, with_confidence=self.role.stop_below > 0
        )
        self.extend(drafts[: step.accepted] + [step.token], step.probs, step.confidence)
        step_kind = "verify" if drafts else ("single" if self.role.has_upstream or self.role.is_target else "draft")
        self.trace.record(
            started, time.perf_counter(), step_kind, step.fed, len(drafts), step.accepted, step.accepted + 1
        )

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
            if kind == "finish":
                break
            if kind == "wait":
                self.log("wait", "more_coming" if payload else "idle")
                self.publish(more_coming=payload)
                message = receive(self.job.stall_timeout_s)
                if message is None:
                    neighbour = self.index - 1 if payload else self.index + 1  # waiting for drafts, or for a commit
                    raise StageFailure(
                        f"stage {self.name} waited {self.job.stall_timeout_s:.0f} s for stage "
                        f"{self.job.stage_names[neighbour]}: it stopped responding"
                    )
                self.handle(message)
                continue
            self.step(kind, payload)
            steps += 1
            self.maybe_inject_fault(steps)
            self.publish(more_coming=True)
            if self.upstream_rank is not None and (self.role.is_target or self.role.commits_own_steps):
                self.commit_upstream()
        self.trace.end_time = time.perf_counter()
        if self.role.is_target:
            return final_output(self.out, self.job.max_new_tokens, self.job.eos_ids)
        return None

    def maybe_inject_fault(self, steps: int | None) -> None:
        fault = self.job.fault
        if not fault or fault.get("stage") != self.index or fault.get("action") in ("drop", "delay"):
            return
        if "at_token" in fault:  # a point of the generation: the first time the buffer reaches it
            if self.fault_fired or len(self.out) < fault["at_token"]:
                return
            self.fault_fired = True
        elif steps != fault.get("after_steps", 1):
            return
        action = fault.get("action", "raise")
        if action == "accept_drafts":
            return  # a rule change, set up when the request started
        if action == "raise":
            raise RuntimeError(f"injected fault in stage {self.index} after {steps} steps, at {len(self.out)} tokens")
        if action == "exit":
            os._exit(17)
        if action == "kill":  # as the OOM killer would
            os.kill(os.getpid(), signal.SIGKILL)
        if action == "hang":
            time.sleep(10_000)


def _describe(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def stage_process_main(index: int, spec: StageSpec, n_stages: int, host: str, port: int, timeout_s: float):
    """Entry point of a stage process started by `pipespec.api.Pipeline`."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    torch.set_num_threads(spec.threads)
    from pipespec.transport import LINK_BROKEN, GlooTransport

    rank = index + 1
    peers = [r for r in range(n_stages + 1) if r != rank]  # neighbours, the driver, and the target's "done"
    transport = None
    parent = os.getppid()
    exit_code = 0
    try:
        transport = GlooTransport(rank, n_stages + 1, host, port, peers, timeout_s)
        engine = StageEngine(spec)
        transport.send(0, ("ready", index, os.getpid()))
        future: list[tuple[int, tuple]] = []  # messages of a request not started yet

        def receive_any(timeout: float):
            """The next (sender, message), checking every POLL_S that the driver is alive."""
            deadline = time.monotonic() + timeout
            while True:
                item = transport.receive(min(POLL_S, max(deadline - time.monotonic(), 0.0)))
                if item is not None:
                    sender, message = item
                    if message[0] == LINK_BROKEN:
                        who = "the driver" if sender == 0 else f"stage {sender - 1}"
                        raise StageFailure(f"lost the link to {who}: {message[1]}")
                    return item
                if os.getppid() != parent:
                    raise SystemExit(0)  # the driver is gone: nothing to report to
                if time.monotonic() >= deadline:
                    return None

        while True:
            sender, message = receive_any(float("inf"))
            if message[0] == "shutdown":
                break
            if message[0] != "generate":
                future.append((sender, message))
                continue
            job: Job = message[1]
            future = [(s, m) for s, m in future if m[1] >= job.request]
            link = for_request(transport, job.fault, index)  # test-only message drop / delay (pipespec.faults)
            request = StageRequest(index, job, engine, link, job.stage_names)

            def receive(timeout: float, request=request, job=job):
                nonlocal future
                deadline = time.monotonic() + timeout
                while True:
                    for i, (s, m) in enumerate(future):
                        if m[1] == job.request:
                            del future[i]
                            return m
                    item = receive_any(max(deadline - time.monotonic(), 0.0))
                    if item is None:
                        return None
                    s, m = item
                    if m[0] in ("shutdown", "generate"):
                        raise StageFailure(f"got {m[0]!r} in the middle of request {job.request}")
                    if m[1] == job.request:
                        return m
                    if m[1] > job.request:
                        future.append((s, m))
                    # else: a stale message of an earlier request: dropped

            output = request.run(receive)
            request.log("finished", output)
            link.send(0, ("trace", index, job.request, request.trace.to_dict()))
            if output is not None:
                for other in range(n_stages - 1):
                    if job.roles[other].active:
                        link.send(other + 1, ("done", job.request))
                link.send(0, ("result", index, job.request, output))
            request.log("reported")
    except SystemExit:
        pass
    except BaseException as error:  # report, then exit: the stage's state is unknown
        exit_code = 1
        print(f"pipespec stage {index} failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        if transport is not None:
            try:
                transport.send(0, ("error", index, _describe(error), traceback.format_exc()))
            except Exception:
                pass
    finally:
        if transport is not None:
            transport.close(wait_s=0.0)  # os._exit follows: nothing to wait for
        os._exit(exit_code)


def main(argv: list[str] | None = None) -> int:
    """Run one stage rank started by an external launcher (torchrun, a job script, another machine).

    Reads RANK (1..k; rank 0 is the driver: `Pipeline(..., launch="external", address=...)`),
    WORLD_SIZE (k + 1), MASTER_ADDR and MASTER_PORT (the driver's address), and the stage
    list as JSON: the same list given to the driver's Pipeline.
    """
    import argparse
    import json

    parser = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    parser.add_argument("--stages", required=True, help="JSON file: the list of stages, smallest first")
    parser.add_argument("--timeout-s", type=float, default=600.0)
    args = parser.parse_args(argv)
    rank, world = int(os.environ.get("RANK", -1)), int(os.environ.get("WORLD_SIZE", -1))
    with open(args.stages) as f:
        specs = [StageSpec.from_any(s) for s in json.load(f)]
    if world != len(specs) + 1 or not 1 <= rank <= len(specs):
        print(
            f"error: need WORLD_SIZE={len(specs) + 1} (driver + {len(specs)} stages) and RANK in 1..{len(specs)}; "
            f"got RANK={rank} WORLD_SIZE={world}",
            file=sys.stderr,
        )
        return 2
    stage_process_main(
        rank - 1, specs[rank - 1], len(specs), os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), args.timeout_s
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
