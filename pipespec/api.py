"""The Python API: build a pipeline from models (smallest first, target last), generate, close.

    from pipespec import Pipeline
    with Pipeline(["prompt_lookup", {"model": path, "quantize": "int8-dynamic"}, path],
                  strategy="pipespec") as pipe:
        result = pipe.generate("def fib(n):", max_new_tokens=64)
        print(result.text, result.summary())

The pipeline starts one process per stage (rank i + 1; this process is rank 0,
the driver) and keeps them for every `generate` call until it is closed. Any
failure of a stage ends the call with a `StageError` naming the stage, and the
pipeline shuts every stage process down.

Sampling (`temperature`, `top_k`, `top_p`, `seed`; defaults on the Pipeline,
overrides per call) works in every strategy and is lossless: temperature 0 is
greedy (token-identical to greedy decoding of the target), temperature > 0
samples from the target's transformed distribution by speculative sampling
(`pipespec.verify`). A call draws with seeds derived from (seed, stage), so for
a fixed seed greedy and sd return the same tokens every time; pipespec returns
tokens with the same distribution but not the same tokens, since which drafts a
verifier sees, and so which random draws decide what, depends on timing. With
seed None each call takes a fresh seed, recorded in `result.sampling`.

`acceptance="synthetic"` (benchmarking only, never the default) makes each
verifier keep each draft by a seeded coin with probability `synthetic_rates`
(one rate, or one per drafter/verifier pair) instead of checking it; its
results say `acceptance="synthetic"` and `lossless=False`.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import numbers
import os
import signal
import socket
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from pipespec.errors import ConfigError, StageError
from pipespec.launch import (
    UNGUARDED_MAIN_EXIT,
    LaunchEnv,
    bootstrapping_child,
    exit_if_bootstrapping_child,
    resolve_launch,
    unguarded_main_message,
)
from pipespec.models import (
    assign_devices,
    check_compilers,
    check_shared_vocabulary,
    context_length,
    eos_token_ids,
    resolved_kernels,
)
from pipespec.compiled import START_ALLOWANCE_S
from pipespec.specs import StageSpec, check_tree_nodes, trees_fed
from pipespec.protocol import Failed, Generate, Job, LinkBroken, Ready, Result, Shutdown, Trace
from pipespec.options import CallOptions, CallPlan, check_timeout
from pipespec.schedule import DEFAULT_MAX_LEAD
from pipespec.trace import StageTrace, format_summary, summarize

HOST = "127.0.0.1"


@dataclass
class GenerationResult:
    tokens: list[int]
    text: str
    time_s: float
    strategy: str
    lookahead: int
    stage_traces: list[StageTrace] = field(default_factory=list)
    sampling: dict[str, Any] = field(default_factory=dict)  # temperature, top_k, top_p, seed of this call
    acceptance: str = "exact"  # "exact" (the verify rule) or "synthetic" (seeded coins, for benchmarking)
    synthetic_rates: list[float] | None = None  # per drafter/verifier pair, under synthetic acceptance
    lossless: bool = True  # False: the tokens do not follow the target's (greedy or sampling) distribution
    margins: list[float] | None = None  # the target's top-2 logit margin at each token (analysis.rundir classifies)
    stages: list[int] | None = None  # the stages the call ran (positions in the pipeline; greedy: the target)

    def summary(self) -> list[dict[str, Any]]:
        return summarize(self.stage_traces, len(self.tokens))

    def format_summary(self) -> str:
        return format_summary(self.summary())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _prompt_ids(prompt: Any) -> list[int]:
    """A prompt given as token ids: a list, tuple or range of ints (or an array / tensor of them)."""
    if hasattr(prompt, "tolist") and not isinstance(prompt, (str, bytes)):
        prompt = prompt.tolist()  # numpy arrays and torch tensors
    expected = "prompt must be a string or a sequence of token ids (ints)"
    if not isinstance(prompt, (list, tuple, range)):
        raise ConfigError(f"{expected}, got {type(prompt).__name__}: {prompt!r:.60}")
    bad = next((t for t in prompt if isinstance(t, bool) or not isinstance(t, numbers.Integral)), None)
    if bad is not None:
        raise ConfigError(f"{expected}; this {type(prompt).__name__} holds a {type(bad).__name__}: {bad!r:.60}")
    return [int(t) for t in prompt]


def encode_prompt(tokenizer, prompt: str | Sequence[int]) -> list[int]:
    """A prompt's token ids: a string encoded without special tokens, or token ids checked against the
    vocabulary."""
    if isinstance(prompt, str):
        return list(tokenizer.encode(prompt, add_special_tokens=False))
    ids = _prompt_ids(prompt)
    vocab = len(tokenizer)
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise ConfigError(f"prompt ids {bad[:5]} are outside the vocabulary (size {vocab})")
    return ids


def _context():
    # a fork server imports torch and transformers once; stage processes are forked from it. transformers
    # imports its model code lazily (about 3 CPU-s per process): preload the LLaMA family's (all ours use it)
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["pipespec.stage", "transformers.models.llama.modeling_llama"])
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


class Pipeline:
    def __init__(
        self,
        stages: Sequence[StageSpec | str | Mapping[str, Any]],
        strategy: str = "pipespec",
        lookahead: int = 0,
        max_lead: int = DEFAULT_MAX_LEAD,
        *,
        draft_confidence: float = 0.0,
        size_verification: bool = False,
        cascade: bool = False,
        value_stop: float = 0.0,
        start_timeout_s: float = 600.0,
        stall_timeout_s: float = 30.0,
        launch: str | None = None,
        address: str | None = None,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        acceptance: str = "exact",
        synthetic_rates: float | Sequence[float] | None = None,
    ):
        exit_if_bootstrapping_child()  # a stage process re-running an unguarded main module: say so and end
        launch = resolve_launch(launch)
        if launch == "external" and (not address or ":" not in address):
            raise ConfigError("launch='external' needs address='HOST:PORT' (where this driver, rank 0, listens)")
        self.launch, self.address = launch, address
        self.specs = [StageSpec.from_any(s) for s in stages]
        if launch == "local":  # `device: auto`: one whole free GPU per stage, chosen here for every stage at once
            self.specs = assign_devices(self.specs)
        self.launch_env = LaunchEnv.from_environ() if launch == "torchrun" else None
        if self.launch_env is not None:
            self.launch_env.check_world(len(self.specs))
        if strategy == "auto":
            raise ConfigError("strategy 'auto' is a tool on top of the engine: experiments.auto.AutoPipeline(stages, "
                              "profile=...) makes a Pipeline at the configuration a machine profile predicts fastest")
        # the defaults of every call, checked once here (each call's own options are checked when it starts)
        self.defaults = CallOptions(
            strategy=strategy, lookahead=lookahead, max_lead=max_lead, draft_confidence=draft_confidence,
            size_verification=size_verification, cascade=cascade, value_stop=value_stop, temperature=temperature,
            top_k=top_k, top_p=top_p, seed=seed, acceptance=acceptance, synthetic_rates=synthetic_rates,
        )  # fmt: skip
        self.defaults.plan(self.stage_kinds, self.stage_labels, self.stage_trees)
        check_timeout("start_timeout_s", start_timeout_s)
        check_timeout("stall_timeout_s", stall_timeout_s)
        self.start_timeout_s, self.stall_timeout_s = start_timeout_s, stall_timeout_s
        started_server = warm_stage_server(launch)  # its imports run while the checks below load tokenizers
        try:
            self._check_models()
        except BaseException:
            if started_server:
                stop_stage_server()
            raise
        self.names = self._stage_names()
        self.processes: list = []
        self.transport = None
        self.pids: list[int] = []
        self.warm_up_s: list[float] = []  # by stage index: each compiled stage's warm-up at the last start (0: none)
        self._request = 0
        self._calls = threading.RLock()  # one generate call at a time; close waits for the one in progress
        self._executor: ThreadPoolExecutor | None = None  # serves `submit`
        self._ranks_ended = False  # torchrun: the stage ranks served their one start and exited
        self._terminating = False  # torchrun: the launcher sent SIGTERM (another rank failed)
        self._previous_sigterm = None
        self._submit_lock = threading.Lock()
        self._call_owner: int | None = None  # the thread in a generate call
        self._store = None  # the store of the current start (kept alive as long as the transport)
        if self.launch_env is not None and self.launch_env.rank >= 1:
            from pipespec.stage import serve_stage_rank

            serve_stage_rank(self.launch_env, self.specs, start_timeout_s)  # this rank is a stage: never returns

    def _check_models(self) -> None:
        """What the model files must allow, before any stage process starts: a shared vocabulary, a working
        compiler where a stage compiles, tree sizes within the target's context."""
        self.tokenizer = check_shared_vocabulary(self.specs)
        check_compilers(self.specs)
        self.eos_ids = eos_token_ids(self.specs[-1].model)
        self.context_length = context_length(self.specs[-1].model)
        for spec in self.specs:
            check_tree_nodes(spec, self.context_length)

    @property
    def stage_kinds(self) -> list[str]:
        return [s.kind for s in self.specs]

    @property
    def stage_labels(self) -> list[str]:
        return [s.label for s in self.specs]

    @property
    def stage_trees(self) -> list[int]:
        """Each stage's `tree_nodes` (a model-free stage proposing token trees: > 0)."""
        return [s.tree_nodes for s in self.specs]

    @property
    def strategy(self) -> str:
        """The default strategy of this pipeline's calls."""
        return self.defaults.strategy

    def _stage_names(self) -> list[str]:
        labels = [s.label for s in self.specs]
        return [f"{i}:{label}" for i, label in enumerate(labels)]

    # ---- lifecycle --------------------------------------------------------
    def __enter__(self) -> "Pipeline":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def started(self) -> bool:
        return self.transport is not None

    def start(self) -> None:
        """Start the stage processes (launch "local") or meet the stage ranks (torchrun, external)."""
        exit_if_bootstrapping_child()
        with self._turn():
            self._start()

    def _rendezvous_address(self) -> tuple[str, int, bool]:
        """(host, port, whether this driver serves the store there) of this pipeline's launch."""
        if self.launch == "external":
            host, port = self.address.rsplit(":", 1)
            return host, int(port), True
        if self.launch == "torchrun":  # torchrun's agent serves it already, unless told otherwise
            env = self.launch_env
            return env.master_addr, env.master_port, not env.agent_store
        return HOST, _free_port(), True

    def _start(self) -> None:
        from pipespec.stage import stage_process_main
        from pipespec.transport import GlooTransport, client_store, new_start, serve_store

        if self.started:
            return
        if self._ranks_ended:
            raise StageError(
                "under torchrun the stage ranks serve one pipeline start, and theirs has ended: launch again",
                kind="start",
            )
        n = len(self.specs)
        if self.launch == "local":  # a kernel choice not yet measured here is measured now, before any stage loads
            for spec in self.specs:
                resolved_kernels(spec)
        host, port, serve = self._rendezvous_address()
        try:
            base = (serve_store if serve else client_store)(host, port, self.start_timeout_s)
        except Exception as error:  # a port in use, an unreachable launcher store
            raise StageError(f"could not {'serve' if serve else 'reach'} the store at {host}:{port}: {error}",
                             kind="start") from None  # fmt: skip
        start, store = new_start(base)
        self._store = base
        self.processes = []
        if self.launch == "local":
            ctx, environ = _context(), dict(os.environ)  # the stages' environment: this one, now
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
        elif self.launch == "torchrun":
            self._ranks_ended = True  # they join this start and exit when it ends
            self._watch_launcher()
        # the group's rendezvous blocks until every stage joins: do it aside and watch the processes
        box: dict[str, Any] = {}

        def connect():
            try:
                box["transport"] = GlooTransport(0, n + 1, store, range(1, n + 1))
            except Exception as error:
                box["error"] = error

        thread = threading.Thread(target=connect, daemon=True)
        thread.start()
        deadline = time.monotonic() + self.start_timeout_s
        while thread.is_alive():
            thread.join(0.1)
            if any(p.exitcode is not None for p in self.processes):
                self._kill()
                if any(p.exitcode == UNGUARDED_MAIN_EXIT for p in self.processes):
                    raise ConfigError(unguarded_main_message())
                codes = {self.names[i]: p.exitcode for i, p in enumerate(self.processes) if p.exitcode is not None}
                raise StageError(f"stage processes exited while starting: {codes}", kind="start")
            if time.monotonic() > deadline:
                self._kill()
                raise StageError(f"stage processes did not connect within {self.start_timeout_s:.0f} s", kind="start")
        if "error" in box:
            self._kill()
            raise StageError(f"could not connect to the stage processes: {box['error']}", kind="start")
        self.transport = box["transport"]
        ready: dict[int, Ready] = {}
        if any(spec.compile for spec in self.specs):  # compiling before Ready: pipespec.compiled
            deadline += START_ALLOWANCE_S
        try:
            while len(ready) < n:
                message = self._receive(deadline, "starting")
                if isinstance(message, Ready):
                    ready[message.stage] = message
            self.pids = [ready[i].pid for i in range(n)]  # by stage index
            self.warm_up_s = [ready[i].warm_up_s for i in range(n)]
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Shut the stages down. From another thread: waits for the call in progress and cancels the
        calls queued by `submit`."""
        if self._call_owner != threading.get_ident() and self._executor is not None:
            executor, self._executor = self._executor, None
            executor.shutdown(wait=False, cancel_futures=True)
        with self._calls:
            self._close()
        self._store = None

    def _watch_launcher(self) -> None:
        """torchrun stops every rank with SIGTERM when one fails: during a call, let the call finish its
        diagnosis (it names the failed stage) instead of dying silently; outside one, exit."""
        if threading.current_thread() is not threading.main_thread():
            return

        def on_sigterm(signum, frame):
            self._terminating = True
            if self._call_owner is None:
                raise SystemExit(128 + signum)

        self._previous_sigterm = signal.signal(signal.SIGTERM, on_sigterm)

    def _close(self) -> None:
        if self._previous_sigterm is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None
        self._submit_lock = threading.Lock()
        if self.transport is not None:
            for rank in range(1, len(self.specs) + 1):
                try:
                    self.transport.send(rank, Shutdown())
                except Exception:
                    pass
        deadline = time.monotonic() + 2.0  # then kill: a stuck stage must not hold up the error
        for process in self.processes:
            process.join(max(deadline - time.monotonic(), 0.0))
        self._kill()
        if self.transport is not None:
            self.transport.close()
        self.transport = None

    def _kill(self) -> None:
        for process in self.processes:
            if process.is_alive():
                process.kill()
        for process in self.processes:
            process.join(2.0)

    # ---- failures ---------------------------------------------------------
    def _check_processes(self) -> None:
        if any(p.exitcode is not None for p in self.processes):
            self._diagnose_and_fail([])

    def _diagnose_and_fail(self, errors: list[Failed]) -> None:
        """Find the root cause among stage reports and process deaths, shut down, raise StageError."""
        # a failing stage takes its neighbours' links down too: let their reports arrive, then choose;
        # after a stall, longer: every stage waiting in the chain reports, and the last one names the culprit
        started = time.monotonic()
        while self.transport is not None:
            stalled = any(e.kind == "stalled" for e in errors)
            if time.monotonic() >= started + (1.0 if stalled else 0.5):
                break
            item = self.transport.receive(0.05)
            if item is not None and (failure := _as_failure(*item)) is not None:
                errors.append(failure)
        for process in self.processes:
            process.join(0.3)  # a stage that lost a link exits within POLL_S; its exit code tells the story
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
            error = StageError(
                f"stage {self.names[cause.stage]} failed: {cause.text}",
                stage=cause.stage, kind=cause.kind, waited_for=cause.waited_for, detail=cause.detail,
            )  # fmt: skip
        elif silent_deaths:
            index = silent_deaths[0]
            code = self.processes[index].exitcode if self.processes else None
            how = "its link broke" if code is None else f"killed by signal {-code}" if code < 0 else f"exit code {code}"
            error = StageError(f"stage {self.names[index]} died ({how})", stage=index, kind="died")
        else:
            index = next(i for i, p in enumerate(self.processes) if p.exitcode is not None)
            code = self.processes[index].exitcode
            error = StageError(f"stage {self.names[index]} exited unexpectedly (exit code {code})", stage=index,
                               kind="died")  # fmt: skip
        self.close()
        raise error

    def _receive(self, deadline: float, doing: str, waiting_for=lambda: "the stages"):
        """The next message for the driver; stage errors, deaths and the deadline raise StageError."""
        while True:
            item = self.transport.receive(0.1)
            if item is None:
                self._check_processes()
                if time.monotonic() > deadline:
                    self.close()
                    raise StageError(f"no answer from {waiting_for()} while {doing}: stopped responding",
                                     kind="no_answer")  # fmt: skip
                continue
            failure = _as_failure(*item)
            if failure is not None:
                self._diagnose_and_fail([failure])
            return item[1]

    # ---- generation -------------------------------------------------------
    def encode(self, prompt: str | Sequence[int]) -> list[int]:
        return encode_prompt(self.tokenizer, prompt)

    @contextlib.contextmanager
    def _turn(self, timeout_s: float | None = None):
        """Hold the pipeline for one call (or a start); other threads wait for their turn."""
        if not self._calls.acquire(timeout=-1 if timeout_s is None else timeout_s):
            raise StageError(f"no turn within timeout_s={timeout_s}: other calls held the pipeline", kind="no_answer")
        owner, self._call_owner = self._call_owner, threading.get_ident()
        try:
            yield
        finally:
            self._call_owner = owner
            self._calls.release()

    def generate(self, prompt: str | Sequence[int], max_new_tokens: int = 128, **options) -> GenerationResult:
        """Generate up to `max_new_tokens` after `prompt`; `options` (`pipespec.options.CallOptions`: strategy,
        lookahead, max_lead, draft_confidence, size_verification, cascade, value_stop, timeout_s, sampling,
        acceptance, forget_outputs) left None take the pipeline's defaults.

        Safe from several threads: calls are served one at a time, each exactly as if it were alone
        (`timeout_s` also bounds the wait for its turn). `submit` queues calls instead."""
        call = self.defaults.merged(**options)
        plan = call.plan(self.stage_kinds, self.stage_labels, self.stage_trees)  # checked before the call waits
        with self._turn(call.timeout_s):
            result = self._generate(prompt, max_new_tokens, call, plan)
            if self._terminating:  # the launcher stops the job: another rank failed
                raise StageError("the launcher (torchrun) is stopping this job: another rank failed", kind="died")
            return result

    def submit(self, prompt: str | Sequence[int], max_new_tokens: int = 128, **options) -> Future:
        """Queue a `generate` call; one worker thread serves the queue in submission order. The returned
        `concurrent.futures.Future` holds the GenerationResult, or the call's exception. `close()` cancels
        the calls still queued."""
        with self._submit_lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pipespec-submit")
            return self._executor.submit(self.generate, prompt, max_new_tokens, **options)

    def _generate(self, prompt: str | Sequence[int], max_new_tokens: int, call: CallOptions,
                  plan: CallPlan) -> GenerationResult:  # fmt: skip
        """One call with checked options (`generate`): encode, send the job, gather result and traces."""
        if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens <= 0:
            raise ConfigError(f"max_new_tokens must be an integer > 0, got {max_new_tokens!r}")
        prompt_ids = self.encode(prompt)
        if not prompt_ids:
            raise ConfigError("the prompt is empty")
        if self.context_length and len(prompt_ids) + max_new_tokens > self.context_length:
            raise ConfigError(
                f"prompt of {len(prompt_ids)} tokens + max_new_tokens {max_new_tokens} exceeds the target's "
                f"context of {self.context_length} tokens"
            )
        if not self.started:
            self.start()
        self._request += 1
        job = Job(
            request=self._request, prompt_ids=prompt_ids, max_new_tokens=max_new_tokens, eos_ids=self.eos_ids,
            roles=plan.roles, stall_timeout_s=self.stall_timeout_s, stage_names=self.names, sampling=plan.sampling,
            acceptance=plan.acceptance, forget_outputs=call.forget_outputs, faults=call.faults,
        )  # fmt: skip
        active = [i for i, role in enumerate(plan.roles) if role.active]
        started = time.perf_counter()
        self._check_processes()
        for i in active:
            try:
                self.transport.send(i + 1, Generate(job))
            except ConnectionError as error:
                self._diagnose_and_fail([Failed(i, "lost_link", str(error))])
        deadline = time.monotonic() + (call.timeout_s or float("inf"))
        traces: dict[int, StageTrace] = {}
        output, margins = None, None
        target = len(self.specs) - 1
        while output is None or len(traces) < len(active):
            message = self._receive(
                deadline,
                f"generating (request {job.request})",
                lambda: ", ".join(
                    f"stage {self.names[i]}" for i in active if i not in traces or (i == target and output is None)
                ),
            )
            if isinstance(message, Result) and message.request == job.request:
                output = message.tokens
                margins = message.margins
                elapsed = time.perf_counter() - started
                # every stage reports at once when told the target is done; one that does not is stuck
                deadline = min(deadline, time.monotonic() + self.stall_timeout_s)
            elif isinstance(message, Trace) and message.request == job.request:
                traces[message.stage] = StageTrace.from_dict(message.trace)
                if message.stage == target and output is None:  # its result follows at once: a lost one must not hang
                    deadline = min(deadline, time.monotonic() + self.stall_timeout_s)
        return GenerationResult(
            tokens=output,
            text=self.tokenizer.decode(output, skip_special_tokens=True),
            time_s=elapsed,
            strategy=call.strategy,
            lookahead=call.lookahead,
            stage_traces=[traces[i] for i in sorted(traces)],
            stages=sorted(active),
            sampling=plan.sampling.as_dict(),
            acceptance=plan.acceptance.mode,
            synthetic_rates=list(plan.acceptance.rates) if plan.acceptance.mode == "synthetic" else None,
            # a test's deliberately wrong rule is not lossless either
            lossless=plan.acceptance.lossless and (call.faults is None or call.faults.lossless),
            margins=margins,
        )
