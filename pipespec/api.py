"""The Python API: build a pipeline from models (smallest first, target last), generate, close.

    from pipespec import Pipeline
    with Pipeline(["prompt_lookup", {"model": path, "quantize": "int8-dynamic"}, path],
                  strategy="pipespec") as pipe:
        result = pipe.generate("def fib(n):", max_new_tokens=64)
        print(result.text, result.summary())

The pipeline starts one process per stage (rank i + 1; this process is rank 0,
the driver: `pipespec.driver`) and keeps them for every `generate` call until it
is closed. Any failure of a stage ends the call with a `StageError` naming the
stage, and the pipeline shuts every stage process down.

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
import numbers
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from pipespec.driver import StageGroup, stop_stage_server, warm_stage_server
from pipespec.errors import ConfigError, StageError
from pipespec.hierarchy import CheckedHierarchy, check_hierarchy
from pipespec.launch import LaunchEnv, exit_if_bootstrapping_child, resolve_launch
from pipespec.models import assign_devices
from pipespec.options import CallOptions, CallPlan, check_timeout
from pipespec.protocol import Job
from pipespec.schedule import DEFAULT_MAX_LEAD
from pipespec.specs import StageSpec, check_tree_nodes
from pipespec.trace import StageTrace, format_summary, summarize

__all__ = ["GenerationResult", "Pipeline", "encode_prompt", "stop_stage_server", "warm_stage_server"]


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
        checked: CheckedHierarchy | None = None,
    ):
        """`checked`: the stages' checks made already (`pipespec.hierarchy.check_hierarchy` of these stages,
        or of a hierarchy they are part of); None: the pipeline checks them here."""
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
        # the defaults of every call, checked once (each call's own options are checked when it starts)
        self.defaults = CallOptions(
            strategy=strategy, lookahead=lookahead, max_lead=max_lead, draft_confidence=draft_confidence,
            size_verification=size_verification, cascade=cascade, value_stop=value_stop, temperature=temperature,
            top_k=top_k, top_p=top_p, seed=seed, acceptance=acceptance, synthetic_rates=synthetic_rates,
        )  # fmt: skip
        if checked is None or not checked.planned(self.defaults, self.specs):
            self.defaults.plan(self.stage_kinds, self.stage_labels, self.stage_trees)
        check_timeout("start_timeout_s", start_timeout_s)
        check_timeout("stall_timeout_s", stall_timeout_s)
        self.start_timeout_s, self.stall_timeout_s = start_timeout_s, stall_timeout_s
        started_server = warm_stage_server(launch)  # its imports run while the checks below load tokenizers
        try:
            self._check_models(checked)
        except BaseException:
            if started_server:
                stop_stage_server()
            raise
        self.names = self._stage_names()
        self.group = StageGroup(self.specs, self.names, launch, address, self.launch_env, start_timeout_s,
                                stall_timeout_s)  # fmt: skip
        self._request = 0
        self._calls = threading.RLock()  # one generate call at a time; close waits for the one in progress
        self._executor: ThreadPoolExecutor | None = None  # serves `submit`
        self._submit_lock = threading.Lock()
        self._call_owner: int | None = None  # the thread in a generate call
        if self.launch_env is not None and self.launch_env.rank >= 1:
            from pipespec.worker import serve_stage_rank

            serve_stage_rank(self.launch_env, self.specs, start_timeout_s)  # this rank is a stage: never returns

    def _check_models(self, checked: CheckedHierarchy | None) -> None:
        """What the model files must allow, before any stage process starts (`pipespec.hierarchy`): checked
        here unless handed the checks of these stages; the target's tokenizer, EOS ids and context length."""
        if checked is None:
            checked = check_hierarchy(self.specs)
        elif not checked.covers(self.specs):
            raise ConfigError(
                f"the hierarchy checks handed to this Pipeline were made for other stages "
                f"({[s.label for s in checked.stages]}, not {self.stage_labels}): pass "
                "checked=check_hierarchy(stages) of these stages, or none"
            )
        else:  # a stage's tree size may differ from the one checked (auto's choice): a check without files
            for spec in self.specs:
                check_tree_nodes(spec, checked.context_length)
        self.tokenizer = checked.tokenizer
        self.eos_ids = list(checked.eos_ids)
        self.context_length = checked.context_length

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

    # ---- lifecycle (the process group: `pipespec.driver.StageGroup`) --------
    def __enter__(self) -> "Pipeline":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def started(self) -> bool:
        return self.group.started

    @property
    def pids(self) -> list[int]:
        """The stage processes' ids, by stage index (the last start's)."""
        return self.group.pids

    @property
    def warm_up_s(self) -> list[float]:
        """By stage index: each compiled stage's warm-up at the last start (0: none)."""
        return self.group.warm_up_s

    def start(self) -> None:
        """Start the stage processes (launch "local") or meet the stage ranks (torchrun, external)."""
        exit_if_bootstrapping_child()
        with self._turn():
            self._start()

    def _start(self) -> None:
        if not self.started:
            self.group.start(in_call=lambda: self._call_owner is not None)

    def close(self) -> None:
        """Shut the stages down. From another thread: waits for the call in progress and cancels the
        calls queued by `submit`."""
        if self._call_owner != threading.get_ident() and self._executor is not None:
            executor, self._executor = self._executor, None
            executor.shutdown(wait=False, cancel_futures=True)
        with self._calls:
            self._submit_lock = threading.Lock()
            self.group.close()

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
            if self.group.terminating:  # the launcher stops the job: another rank failed
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
        output, margins, elapsed, traces = self.group.run(job, active, call.timeout_s)
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
