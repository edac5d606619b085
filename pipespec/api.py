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

import multiprocessing
import re
import secrets
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from pipespec.errors import ConfigError, StageError
from pipespec.models import (
    StageSpec,
    check_shared_vocabulary,
    context_length,
    eos_token_ids,
)
from pipespec.schedule import check_options, roles
from pipespec.trace import StageTrace, format_summary, summarize
from pipespec.verify import check_acceptance, check_sampling

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

    def summary(self) -> list[dict[str, Any]]:
        return summarize(self.stage_traces, len(self.tokens))

    def format_summary(self) -> str:
        return format_summary(self.summary())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _context():
    # a fork server imports torch and transformers once; stage processes are forked from it. transformers
    # imports its model code lazily (about 3 CPU-s per process): preload the LLaMA family's (all ours use it)
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["pipespec.stage", "transformers.models.llama.modeling_llama"])
    return ctx


_WAITED_FOR = re.compile(r" waited \S+ s for stage (\d+):")  # a stall report of pipespec.stage


def _end_of_wait_chain(causes: list[tuple]) -> tuple:
    """The report to blame: after a hang, stage A reports it waited for B, B that it waited for C...;
    the stage that stopped responding is the first one in that chain that reported nothing."""
    waits = {}
    for cause in causes:
        if (match := _WAITED_FOR.search(cause[2])) is not None:
            waits.setdefault(cause[1], (int(match.group(1)), cause))
    index, seen = causes[0][1], set()
    while index in waits and index not in seen:
        seen.add(index)
        waited_for, cause = waits[index]
        if waited_for not in waits:
            return cause
        index = waited_for
    return causes[0]  # not a stall, or a cycle (a lost message: each waits for the other)


class Pipeline:
    def __init__(
        self,
        stages: Sequence[StageSpec | str | Mapping[str, Any]],
        strategy: str = "pipespec",
        lookahead: int = 0,
        max_lead: int = 8,
        *,
        draft_confidence: float = 0.0,
        start_timeout_s: float = 600.0,
        stall_timeout_s: float = 30.0,
        launch: str = "local",
        address: str | None = None,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        acceptance: str = "exact",
        synthetic_rates: float | Sequence[float] | None = None,
    ):
        if launch not in ("local", "external"):
            raise ConfigError(f"launch must be 'local' or 'external', got {launch!r}")
        if launch == "external" and (not address or ":" not in address):
            raise ConfigError("launch='external' needs address='HOST:PORT' (where this driver, rank 0, listens)")
        self.launch, self.address = launch, address
        self.specs = [StageSpec.from_any(s) for s in stages]
        check_options(strategy, len(self.specs), lookahead, max_lead, draft_confidence)
        self.strategy, self.lookahead, self.max_lead = strategy, lookahead, max_lead
        self.draft_confidence = draft_confidence
        sampling = check_sampling(temperature, top_k, top_p, 0 if seed is None else seed)
        check_acceptance(acceptance, synthetic_rates, len(self.specs), sampling)
        self.temperature, self.top_k, self.top_p, self.seed = temperature, top_k, top_p, seed
        self.acceptance, self.synthetic_rates = acceptance, synthetic_rates
        self.start_timeout_s, self.stall_timeout_s = start_timeout_s, stall_timeout_s
        # refuse mismatched vocabularies before any stage process starts
        self.tokenizer = check_shared_vocabulary(self.specs)
        self.eos_ids = eos_token_ids(self.specs[-1].model)
        self.context_length = context_length(self.specs[-1].model)
        self.names = self._stage_names()
        self.processes: list = []
        self.transport = None
        self.pids: list[int] = []
        self._request = 0

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
        from pipespec.stage import stage_process_main
        from pipespec.transport import GlooTransport

        if self.started:
            return
        n = len(self.specs)
        if self.launch == "external":
            # stage ranks 1..k are started elsewhere (`python -m pipespec.stage`, e.g. under torchrun)
            host, port = self.address.rsplit(":", 1)
            port = int(port)
            self.processes = []
        else:
            host, port = HOST, _free_port()
            ctx = _context()
            self.processes = [
                ctx.Process(
                    target=stage_process_main,
                    args=(i, spec, n, host, port, self.start_timeout_s),
                    name=f"pipespec-stage-{i}",
                    daemon=True,
                )
                for i, spec in enumerate(self.specs)
            ]
            for process in self.processes:
                process.start()
        # the group's rendezvous blocks until every stage joins: do it aside and watch the processes
        box: dict[str, Any] = {}

        def connect():
            try:
                box["transport"] = GlooTransport(0, n + 1, host, port, range(1, n + 1), self.start_timeout_s)
            except Exception as error:
                box["error"] = error

        thread = threading.Thread(target=connect, daemon=True)
        thread.start()
        deadline = time.monotonic() + self.start_timeout_s
        while thread.is_alive():
            thread.join(0.1)
            if any(p.exitcode is not None for p in self.processes):
                self._kill()
                codes = {self.names[i]: p.exitcode for i, p in enumerate(self.processes) if p.exitcode is not None}
                raise StageError(f"stage processes exited while starting: {codes}")
            if time.monotonic() > deadline:
                self._kill()
                raise StageError(f"stage processes did not connect within {self.start_timeout_s:.0f} s")
        if "error" in box:
            self._kill()
            raise StageError(f"could not connect to the stage processes: {box['error']}")
        self.transport = box["transport"]
        ready: set[int] = set()
        pids: dict[int, int] = {}
        try:
            while len(ready) < n:
                sender, message = self._receive(deadline, "starting")
                if message[0] == "ready":
                    ready.add(message[1])
                    pids[message[1]] = message[2]
            self.pids = [pids[i] for i in range(n)]  # by stage index
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.transport is not None:
            for rank in range(1, len(self.specs) + 1):
                try:
                    self.transport.send(rank, ("shutdown",))
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

    def _diagnose_and_fail(self, errors: list[tuple]) -> None:
        """Find the root cause among stage reports and process deaths, shut down, raise StageError."""
        # a failing stage takes its neighbours' links down too: let their reports arrive, then choose;
        # after a stall, longer: every stage waiting in the chain reports, and the last one names the culprit
        started = time.monotonic()
        while self.transport is not None:
            stalled = any(_WAITED_FOR.search(e[2]) for e in errors)
            if time.monotonic() >= started + (1.0 if stalled else 0.5):
                break
            item = self.transport.receive(0.05)
            if item is not None and item[1][0] == "error":
                errors.append(item[1])
        for process in self.processes:
            process.join(0.3)  # a stage that lost a link exits within POLL_S; its exit code tells the story
        causes = [e for e in errors if "lost the link" not in e[2]]
        reported = {e[1] for e in causes}  # a stage's lost link to one that died says less than the death
        until = time.monotonic() + 2.0  # only lost links: a death is the likely cause, and its exit code may lag
        while not causes and self.processes and time.monotonic() < until:
            if any(p.exitcode not in (None, 0, 1) for p in self.processes):
                break
            time.sleep(0.05)
        # a stage that reports its error exits with 1; any other exit code is a death without a report
        silent_deaths = [
            i for i, p in enumerate(self.processes) if p.exitcode not in (None, 0, 1) and i not in reported
        ]
        if causes:
            _, index, text, detail = _end_of_wait_chain(causes)
            reason, detail = f"stage {self.names[index]} failed: {text}", detail
        elif silent_deaths:
            index = silent_deaths[0]
            code = self.processes[index].exitcode
            how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
            reason, detail = f"stage {self.names[index]} died ({how})", None
        elif errors:
            _, index, text, detail = errors[0]
            reason = f"stage {self.names[index]} failed: {text}"
        else:
            index = next(i for i, p in enumerate(self.processes) if p.exitcode is not None)
            reason, detail = f"stage {self.names[index]} exited unexpectedly (exit code {self.processes[index].exitcode})", None
        self.close()
        error = StageError(reason)
        error.detail = detail
        raise error

    def _receive(self, deadline: float, doing: str, waiting_for=lambda: "the stages") -> tuple[int, tuple]:
        """The next message for the driver; stage errors, deaths and the deadline raise StageError."""
        from pipespec.transport import LINK_BROKEN

        while True:
            item = self.transport.receive(0.1)
            if item is None:
                self._check_processes()
                if time.monotonic() > deadline:
                    self.close()
                    raise StageError(f"no answer from {waiting_for()} while {doing}: stopped responding")
                continue
            sender, message = item
            if message[0] == "error":
                self._diagnose_and_fail([message])
            if message[0] == LINK_BROKEN:
                self._diagnose_and_fail([("error", sender - 1, f"lost the link: {message[1]}", None)])
            return sender, message

    # ---- generation -------------------------------------------------------
    def encode(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            return list(self.tokenizer.encode(prompt, add_special_tokens=False))
        ids = [int(t) for t in prompt]
        vocab = len(self.tokenizer)
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ConfigError(f"prompt ids {bad[:5]} are outside the vocabulary (size {vocab})")
        return ids

    def generate(
        self,
        prompt: str | Sequence[int],
        max_new_tokens: int = 128,
        *,
        strategy: str | None = None,
        lookahead: int | None = None,
        max_lead: int | None = None,
        draft_confidence: float | None = None,
        timeout_s: float | None = None,
        fault: dict | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        acceptance: str | None = None,
        synthetic_rates: float | Sequence[float] | None = None,
    ) -> GenerationResult:
        """Generate up to `max_new_tokens` after `prompt`; options left None take the pipeline's defaults."""
        from pipespec.stage import Job

        def pick(value, default):
            return default if value is None else value

        strategy = strategy or self.strategy
        lookahead = pick(lookahead, self.lookahead)
        max_lead = pick(max_lead, self.max_lead)
        stage_roles = roles(
            strategy, len(self.specs), lookahead, max_lead, pick(draft_confidence, self.draft_confidence)
        )
        seed = pick(seed, self.seed)
        sampling = check_sampling(
            pick(temperature, self.temperature),
            pick(top_k, self.top_k),
            pick(top_p, self.top_p),
            secrets.randbits(63) if seed is None else seed,  # recorded in the result: the call can be replayed
        )
        acceptance = check_acceptance(
            pick(acceptance, self.acceptance), pick(synthetic_rates, self.synthetic_rates), len(self.specs), sampling
        )
        if not isinstance(max_new_tokens, int) or max_new_tokens <= 0:
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
            self._request, prompt_ids, max_new_tokens, self.eos_ids, stage_roles, self.stall_timeout_s,
            self.names, fault, sampling=sampling, acceptance=acceptance,
        )
        active = [i for i, role in enumerate(stage_roles) if role.active]
        started = time.perf_counter()
        self._check_processes()
        for i in active:
            try:
                self.transport.send(i + 1, ("generate", job))
            except ConnectionError as error:
                self._diagnose_and_fail([("error", i, str(error), None)])
        deadline = time.monotonic() + (timeout_s or float("inf"))
        traces: dict[int, StageTrace] = {}
        output = None
        target = len(self.specs) - 1
        while output is None or len(traces) < len(active):
            _, message = self._receive(
                deadline,
                f"generating (request {job.request})",
                lambda: ", ".join(
                    f"stage {self.names[i]}" for i in active if i not in traces or (i == target and output is None)
                ),
            )
            if message[0] == "result" and message[2] == job.request:
                output = message[3]
                elapsed = time.perf_counter() - started
                # every stage reports at once when told the target is done; one that does not is stuck
                deadline = min(deadline, time.monotonic() + self.stall_timeout_s)
            elif message[0] == "trace" and message[2] == job.request:
                traces[message[1]] = StageTrace.from_dict(message[3])
                if message[1] == target and output is None:  # its result follows at once: a lost one must not hang
                    deadline = min(deadline, time.monotonic() + self.stall_timeout_s)
        return GenerationResult(
            tokens=output,
            text=self.tokenizer.decode(output, skip_special_tokens=True),
            time_s=elapsed,
            strategy=strategy,
            lookahead=lookahead,
            stage_traces=[traces[i] for i in sorted(traces)],
            sampling=sampling.as_dict(),
            acceptance=acceptance.mode,
            synthetic_rates=list(acceptance.rates) if acceptance.mode == "synthetic" else None,
            # a test's deliberately wrong rule is not lossless either
            lossless=acceptance.lossless and (fault or {}).get("action") != "accept_drafts",
        )
