"""The driver's side of a pipeline's process group: starting the stages, talking to them, and their end.

`pipespec.api.Pipeline` holds one `StageGroup`. It starts the stage processes (launch "local": forked from
a fork server that has imported torch, transformers and the stage process, `pipespec.worker`) or meets
the stage ranks another launcher started (torchrun, external) at a rendezvous store
(`pipespec.transport`), waits for every stage's `Ready`, sends each call's job and gathers its result
and traces (`run`). Any failure (a stage's report, a broken link, a process's death, silence past a
deadline) goes to `diagnose_and_fail`, which finds the root cause, shuts every stage down and raises a
`StageError` naming the stage. Under torchrun, the launcher's SIGTERM (another rank failed) lets a call
in progress finish its diagnosis (`watch_launcher`).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import socket
import threading
import time
from typing import Any, Callable, Sequence

from pipespec.compiled import START_ALLOWANCE_S
from pipespec.errors import ConfigError, StageError
from pipespec.launch import UNGUARDED_MAIN_EXIT, LaunchEnv, bootstrapping_child, resolve_launch, unguarded_main_message
from pipespec.models import resolved_kernels
from pipespec.protocol import Failed, Generate, Job, LinkBroken, Ready, Result, Shutdown, Trace
from pipespec.specs import StageSpec, trees_fed
from pipespec.trace import StageTrace

HOST = "127.0.0.1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _context():
    # a fork server imports torch and transformers once; stage processes are forked from it. transformers
    # imports its model code lazily (about 3 CPU-s per process): preload the LLaMA family's (all ours use it)
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["pipespec.worker", "transformers.models.llama.modeling_llama"])
    return ctx


def warm_stage_server(launch: str | None = None) -> bool:
    """Start, without waiting for it, the fork server local stage processes are forked from, so that its
    imports (torch, transformers, the stage loop: seconds of CPU) overlap the caller's own work before
    `Pipeline.start` (loading tokenizers, reading a dataset). True when this call started it; nothing
    under torchrun or an external launch, whose stages are processes of their own."""
    if resolve_launch(launch) != "local" or bootstrapping_child():
        return False
    from multiprocessing import forkserver

    _context()
    running = getattr(forkserver._forkserver, "_forkserver_pid", None) is not None
    forkserver.ensure_running()
    return not running


def stop_stage_server() -> None:
    """End the fork server now. For a caller that started it (`warm_stage_server` returned True) and failed
    before any stage was forked from it: left alone, it would go on importing torch for seconds after the
    caller has exited."""
    from multiprocessing import forkserver

    server = forkserver._forkserver
    pid = getattr(server, "_forkserver_pid", None)
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    server._stop()  # reaps it and forgets it: the next start starts a fresh one


def _as_failure(sender: int, message) -> Failed | None:
    """A stage's report, or the driver's own broken link to a stage (`waited_for` None), as a Failed."""
    if isinstance(message, LinkBroken):
        return Failed(sender - 1, "lost_link", f"lost the link: {message.text}")
    return message if isinstance(message, Failed) else None


def _end_of_wait_chain(causes: list[Failed]) -> Failed:
    """The report to blame: after a hang, stage A reports it waited for B, B that it waited for C...;
    the stage that stopped responding is the first one in that chain that reported nothing."""
    waits = {}
    for cause in causes:
        if cause.kind == "stalled":
            waits.setdefault(cause.stage, cause)
    index, seen = causes[0].stage, set()
    while index in waits and index not in seen:
        seen.add(index)
        cause = waits[index]
        if cause.waited_for not in waits:
            return cause
        index = cause.waited_for
    return causes[0]  # not a stall, or a cycle (a lost message: each waits for the other)


class StageGroup:
    """The stage processes (or ranks) of one pipeline and the driver's links to them, rank 0 of the group."""

    def __init__(self, specs: Sequence[StageSpec], names: Sequence[str], launch: str, address: str | None,
                 launch_env: LaunchEnv | None, start_timeout_s: float, stall_timeout_s: float):  # fmt: skip
        self.specs, self.names = list(specs), list(names)
        self.launch, self.address, self.launch_env = launch, address, launch_env
        self.start_timeout_s, self.stall_timeout_s = start_timeout_s, stall_timeout_s
        self.processes: list = []
        self.transport = None
        self.pids: list[int] = []
        self.warm_up_s: list[float] = []  # by stage index: each compiled stage's warm-up at the last start (0: none)
        self.store = None  # the store of the current start (kept alive as long as the transport)
        self.ranks_ended = False  # torchrun: the stage ranks served their one start and exited
        self.terminating = False  # torchrun: the launcher sent SIGTERM (another rank failed)
        self._previous_sigterm = None

    @property
    def started(self) -> bool:
        return self.transport is not None

    # ---- start --------------------------------------------------------------
    def start(self, in_call: Callable[[], bool]) -> None:
        """Start the stage processes (launch "local") or meet the stage ranks (torchrun, external), and wait
        for every stage's Ready. `in_call`: whether a call holds the pipeline (torchrun's SIGTERM)."""
        from pipespec.transport import new_start

        if self.ranks_ended:
            raise StageError(
                "under torchrun the stage ranks serve one pipeline start, and theirs has ended: launch again",
                kind="start",
            )
        if self.launch == "local":  # a kernel choice not yet measured here is measured now, before any stage loads
            for spec in self.specs:
                resolved_kernels(spec)
        host, port, base = self._open_store()
        start, store = new_start(base)
        self.store = base
        self.processes = []
        if self.launch == "local":
            self._spawn(host, port, start)
        elif self.launch == "torchrun":
            self.ranks_ended = True  # they join this start and exit when it ends
            self.watch_launcher(in_call)
        deadline = time.monotonic() + self.start_timeout_s
        self.transport = self._connect(store, deadline)
        if any(spec.compile for spec in self.specs):  # compiling before Ready: pipespec.compiled
            deadline += START_ALLOWANCE_S
        try:
            self._await_ready(deadline)
        except BaseException:
            self.close()
            raise

    def rendezvous_address(self) -> tuple[str, int, bool]:
        """(host, port, whether this driver serves the store there) of this pipeline's launch."""
        if self.launch == "external":
            host, port = self.address.rsplit(":", 1)
            return host, int(port), True
        if self.launch == "torchrun":  # torchrun's agent serves it already, unless told otherwise
            env = self.launch_env
            return env.master_addr, env.master_port, not env.agent_store
        return HOST, _free_port(), True

    def _open_store(self):
        from pipespec.transport import client_store, serve_store

        host, port, serve = self.rendezvous_address()
        try:
            return host, port, (serve_store if serve else client_store)(host, port, self.start_timeout_s)
        except Exception as error:  # a port in use, an unreachable launcher store
            raise StageError(f"could not {'serve' if serve else 'reach'} the store at {host}:{port}: {error}",
                             kind="start") from None  # fmt: skip

    def _spawn(self, host: str, port: int, start: int) -> None:
        """Launch "local": one process per stage, forked from the fork server, in this environment as it is now."""
        from pipespec.worker import stage_process_main

        ctx, environ, n = _context(), dict(os.environ), len(self.specs)
        self.processes = [
            ctx.Process(
                target=stage_process_main,
                args=(i, spec, n, host, port, self.start_timeout_s, start, trees_fed(self.specs, i), environ),
                name=f"pipespec-stage-{i}",
                daemon=True,
            )
            for i, spec in enumerate(self.specs)
        ]
        for process in self.processes:
            process.start()

    def _connect(self, store, deadline: float):
        """Join the group (its rendezvous blocks until every stage joins: done aside, watching the processes)."""
        from pipespec.transport import GlooTransport

        n = len(self.specs)
        box: dict[str, Any] = {}

        def connect():
            try:
                box["transport"] = GlooTransport(0, n + 1, store, range(1, n + 1))
            except Exception as error:
                box["error"] = error

        thread = threading.Thread(target=connect, daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(0.1)
            if any(p.exitcode is not None for p in self.processes):
                self.kill()
                if any(p.exitcode == UNGUARDED_MAIN_EXIT for p in self.processes):
                    raise ConfigError(unguarded_main_message())
                codes = {self.names[i]: p.exitcode for i, p in enumerate(self.processes) if p.exitcode is not None}
                raise StageError(f"stage processes exited while starting: {codes}", kind="start")
            if time.monotonic() > deadline:
                self.kill()
                raise StageError(f"stage processes did not connect within {self.start_timeout_s:.0f} s", kind="start")
        if "error" in box:
            self.kill()
            raise StageError(f"could not connect to the stage processes: {box['error']}", kind="start")
        return box["transport"]

    def _await_ready(self, deadline: float) -> None:
        n = len(self.specs)
        ready: dict[int, Ready] = {}
        while len(ready) < n:
            message = self.receive(deadline, "starting")
            if isinstance(message, Ready):
                ready[message.stage] = message
        self.pids = [ready[i].pid for i in range(n)]  # by stage index
        self.warm_up_s = [ready[i].warm_up_s for i in range(n)]

    def watch_launcher(self, in_call: Callable[[], bool]) -> None:
        """torchrun stops every rank with SIGTERM when one fails: during a call, let the call finish its
        diagnosis (it names the failed stage) instead of dying silently; outside one, exit."""
        if threading.current_thread() is not threading.main_thread():
            return

        def on_sigterm(signum, frame):
            self.terminating = True
            if not in_call():
                raise SystemExit(128 + signum)

        self._previous_sigterm = signal.signal(signal.SIGTERM, on_sigterm)

    # ---- one call -----------------------------------------------------------
    def run(self, job: Job, active: Sequence[int], timeout_s: float | None):
        """Send `job` to the `active` stages and gather the target's Result and every active stage's Trace:
        (tokens, the target's margins, seconds until the result, the traces by stage)."""
        started = time.perf_counter()
        self.check_processes()
        for i in active:
            try:
                self.transport.send(i + 1, Generate(job))
            except ConnectionError as error:
                self.diagnose_and_fail([Failed(i, "lost_link", str(error))])
        deadline = time.monotonic() + (timeout_s or float("inf"))
        traces: dict[int, StageTrace] = {}
        output, margins, elapsed = None, None, 0.0
        target = len(self.specs) - 1
        while output is None or len(traces) < len(active):
            message = self.receive(
                deadline,
                f"generating (request {job.request})",
                lambda: ", ".join(
                    f"stage {self.names[i]}" for i in active if i not in traces or (i == target and output is None)
                ),
            )
            if isinstance(message, Result) and message.request == job.request:
                output, margins = message.tokens, message.margins
                elapsed = time.perf_counter() - started
                # every stage reports at once when told the target is done; one that does not is stuck
                deadline = min(deadline, time.monotonic() + self.stall_timeout_s)
            elif isinstance(message, Trace) and message.request == job.request:
                traces[message.stage] = StageTrace.from_dict(message.trace)
                if message.stage == target and output is None:  # its result follows at once: a lost one must not hang
                    deadline = min(deadline, time.monotonic() + self.stall_timeout_s)
        return output, margins, elapsed, traces

    def receive(self, deadline: float, doing: str, waiting_for=lambda: "the stages"):
        """The next message for the driver; stage errors, deaths and the deadline raise StageError."""
        while True:
            item = self.transport.receive(0.1)
            if item is None:
                self.check_processes()
                if time.monotonic() > deadline:
                    self.close()
                    raise StageError(f"no answer from {waiting_for()} while {doing}: stopped responding",
                                     kind="no_answer")  # fmt: skip
                continue
            failure = _as_failure(*item)
            if failure is not None:
                self.diagnose_and_fail([failure])
            return item[1]

    # ---- end ----------------------------------------------------------------
    def close(self) -> None:
        """Shut the stages down: tell each, wait briefly, kill what is left, close the links."""
        if self._previous_sigterm is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None
        if self.transport is not None:
            for rank in range(1, len(self.specs) + 1):
                try:
                    self.transport.send(rank, Shutdown())
                except Exception:
                    pass
        deadline = time.monotonic() + 2.0  # then kill: a stuck stage must not hold up the error
        for process in self.processes:
            process.join(max(deadline - time.monotonic(), 0.0))
        self.kill()
        if self.transport is not None:
            self.transport.close()
        self.transport = None
        self.store = None

    def kill(self) -> None:
        for process in self.processes:
            if process.is_alive():
                process.kill()
        for process in self.processes:
            process.join(2.0)

    # ---- failures -------------------------------------------------------------
    def check_processes(self) -> None:
        if any(p.exitcode is not None for p in self.processes):
            self.diagnose_and_fail([])

    def diagnose_and_fail(self, errors: list[Failed]) -> None:
        """Find the root cause among stage reports and process deaths, shut down, raise StageError."""
        self._gather_reports(errors)
        error = self._blame(errors)
        self.close()
        raise error

    def _gather_reports(self, errors: list[Failed]) -> None:
        """A failing stage takes its neighbours' links down too: let their reports arrive (into `errors`);
        after a stall, longer: every stage waiting in the chain reports, and the last one names the culprit."""
        started = time.monotonic()
        while self.transport is not None:
            stalled = any(e.kind == "stalled" for e in errors)
            if time.monotonic() >= started + (1.0 if stalled else 0.5):
                break
            item = self.transport.receive(0.05)
            if item is not None and (failure := _as_failure(*item)) is not None:
                errors.append(failure)
        for process in self.processes:
            process.join(0.3)  # a stage that lost a link exits within worker.POLL_S; its exit code tells the story

    def _blame(self, errors: list[Failed]) -> StageError:
        """The StageError of the root cause among `errors` and the processes' exit codes."""
        causes = [e for e in errors if e.kind != "lost_link"]
        reported = {e.stage for e in causes}  # a stage's lost link to one that died says less than the death
        until = time.monotonic() + 2.0  # only lost links: a death is the likely cause, and its exit code may lag
        while not causes and self.processes and time.monotonic() < until:
            if any(p.exitcode not in (None, 0, 1) for p in self.processes):
                break
            time.sleep(0.05)
        # a stage that reports its error exits with 1; any other exit code is a death without a report
        silent_deaths = [
            i for i, p in enumerate(self.processes) if p.exitcode not in (None, 0, 1) and i not in reported
        ]
        if not causes and not silent_deaths:
            # only lost links (and no process of ours to ask, under a launcher): the stage to blame is one
            # whose link to the driver broke (`waited_for` None: the driver's own report) and that said nothing
            reporters = {e.stage for e in errors if e.waited_for is not None}
            silent_deaths = [e.stage for e in errors if e.waited_for is None and e.stage not in reporters][:1]
        if causes or (errors and not silent_deaths):
            cause = _end_of_wait_chain(causes) if causes else errors[0]
            return StageError(
                f"stage {self.names[cause.stage]} failed: {cause.text}",
                stage=cause.stage, kind=cause.kind, waited_for=cause.waited_for, detail=cause.detail,
            )  # fmt: skip
        if silent_deaths:
            index = silent_deaths[0]
            code = self.processes[index].exitcode if self.processes else None
            how = "its link broke" if code is None else f"killed by signal {-code}" if code < 0 else f"exit code {code}"
            return StageError(f"stage {self.names[index]} died ({how})", stage=index, kind="died")
        index = next(i for i, p in enumerate(self.processes) if p.exitcode is not None)
        code = self.processes[index].exitcode
        return StageError(f"stage {self.names[index]} exited unexpectedly (exit code {code})", stage=index,
                          kind="died")  # fmt: skip
