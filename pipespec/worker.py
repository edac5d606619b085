"""One stage process: it joins its pipeline's start, builds what the stage computes with, and serves
one request after another with the stage loop (`pipespec.stage.StageRequest`).

A local stage process is forked from the driver's fork server (`pipespec.driver`) and runs
`stage_process_main`; under torchrun a rank of the driver's own program becomes a stage
(`serve_stage_rank`); another launcher (srun, a job script) starts `python -m pipespec.worker` on ranks
1..k (`main`). Each then builds its `StageEngine` (a model runner, or a model-free drafter), sends the
driver `Ready`, and `serve`s: its `Inbox` waits for the next `Generate` (messages of a later request are
kept, those of an earlier one dropped), a `StageRequest` runs it, and the stage reports its `Trace`
(the target also its `Result` and `Done` to every other active stage). Any failure is reported to the
driver as `Failed` and ends the process.
"""

from __future__ import annotations

import os
import sys
import time
import traceback

from pipespec import schedule
from pipespec.drafters import build_drafter
from pipespec.errors import ConfigError
from pipespec.gpu import stage_sampler
from pipespec.launch import LaunchEnv, rank_device
from pipespec.protocol import Done, Failed, Generate, Job, LinkBroken, Ready, Result, Shutdown, Trace, REQUEST_MESSAGES
from pipespec.specs import StageSpec, trees_fed
from pipespec.stage import StageFailure, StageRequest

POLL_S = 0.5  # how often a waiting stage checks that its driver is still alive


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


def _describe(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def stage_process_main(
    index: int, spec: StageSpec, n_stages: int, host: str, port: int, timeout_s: float, start: int | None = None,
    tree_nodes_fed: int = 0, environ: dict[str, str] | None = None,
):
    """Entry point of a stage process (started by the driver, `pipespec.driver`, or a launcher's rank): joins
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
                "(torchrun --nproc_per_node=k+1 -m experiments.run ..., or your script); pipespec.worker "
                "serves ranks 1..k started by another launcher"
            )
    except (ConfigError, OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    serve_stage_rank(env, specs, args.timeout_s)  # does not return
    return 0


if __name__ == "__main__":
    sys.exit(main())
