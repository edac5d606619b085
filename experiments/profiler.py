"""Measure a machine profile of one hierarchy: what `analysis.predict` needs to predict a run before it.

- per model stage, t(n) for n = 1..max_fed tokens fed on a warm KV cache (medians of `repeats`), alone
  and while every other model stage of the hierarchy runs its own steady loop in another process
  (contention measured, not assumed; the target's loop feeds `verify_fed` tokens a step, one by default,
  more to emulate its verifications), the two conditions in alternating sweeps (the other
  stages paused between steps, then running) so that the machine's drift cannot pass for contention,
  half the sweeps before acceptance is measured and half after (a slow spell of the machine, minutes
  long here, falls on part of them), and the prefill cost per prompt token; and t(n) at a second, longer
  context (`context_extra` more tokens, at `CONTEXT_SIZES`, alternating with the first context in the same
  sweeps), so that a step's cost follows the context it attends to (prompts differ in length, and every
  generated token adds to it: an 8-token step of SmolLM2-135M int8 took 33.2 ms after 277 tokens of
  context and 40.7 ms after 661 on the development machine);
- per drafter/verifier pair (`experiments.profiler_acceptance`; adjacent pairs in `pairs`; every drafter with every later verifier
  in `skip_pairs`, for hierarchies that leave a stage out), along the target's greedy continuation of
  each prompt: at every position, how many drafts in a row the verifier keeps from there (`runs`; a model
  verifier's tokens and a model drafter's drafts from one pass of one-token steps, `teacher_forced`; a
  middle verifier keeps drafts that agree with its own tokens in the target's text, `kept`; a model-free
  drafter's proposal there and its length, `proposal_runs`; a model-free drafter's token trees at each
  of `TREE_SIZES` nodes too, `tree_runs`: how deep the branch along the continuation goes, the tree's
  nodes, and its most likely path's length and kept prefix). The simulator reads acceptance off
  these (`analysis.simulate.AlongContinuations`). From them, acceptance by draft position along the
  walk decoding takes: the next draft starts after the accepted prefix and the verifier's own token.
  Position p's rate is the share of drafts accepted there among those whose earlier positions were
  all accepted. Starting at fixed strides instead (profile version 1) over-estimates it: the token
  after a rejection is where a drafter, prompt lookup above all, is weakest. For a model-free
  drafter (prompt lookup, suffix), how often it has a proposal at those points and how long it is;
- the handoff latency of one message between stages, from a short real pipeline run's traces
  (`analysis.fit`'s estimate);
- the machine (CPU, vector extensions, threads per stage, library versions) and the sample ids used.

`analysis.profile` reads the file without torch. Wall time: the models' loading plus about
(2 * max_fed * (repeats + 2) steps per model stage) + prompts * continuation steps of each verifier
and of each model drafter per pair. `costs_from` reuses another profile's step costs, prefill
and handoff (same machine and stages) and measures only acceptance: acceptance depends on the
prompts, costs on the machine. The cost cache does the same without being asked (`measure_profile`'s
`cost_cache`, on in `python -m experiments.profile` and the short profile): one cost sweep per CPU,
libraries, stages (threads and kernels included) and cost options (`cost_key`), kept under
`pipespec.cache.cache_root() / "costs"`, so a profile of the same stages on other prompts spends its
time on acceptance (the short profile then on `SHORT_PROMPTS_WITH_COSTS` prompts instead of
`SHORT_PROMPTS`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from pipespec.errors import ConfigError
from experiments.machine import machine_facts, stage_identity
from experiments.profiler_acceptance import measure_acceptance
from pipespec.specs import MODEL_FREE_KINDS, StageSpec
from pipespec.timing import interleaved_step_times, medians
from analysis.fit import measure_traces
from analysis.profile import FORMAT, IDENTITY_KEYS, VERSION, stage_entry  # the reader's: one definition for both
from analysis.rundir import atomic_write_json
from pipespec.cache import cache_root
from pipespec.drafters import build_drafter
from pipespec.models import context_length

# torch and the modules that import it (pipespec.api, .exported, .kernels) are imported where used: importing
# this module stays cheap for the CLI, `experiments.auto` and the tests.

BACKGROUND_START_S = 300.0  # a background stage must have loaded its model and started within this
BACKGROUND_STEP_S = 30.0  # and pause within this (one step) when told to


@dataclass(frozen=True)
class ProfileOptions:
    max_fed: int = 32  # t(n) for n = 1..max_fed
    repeats: int = 5  # timed sweeps over n = 1..max_fed (medians per n), in two parts after an untimed one each
    continuation: int = 64  # tokens of each verifier's greedy continuation drafts are checked against
    draft_k: int = 8  # tokens drafted from each start (acceptance positions 1..draft_k)
    handoff_tokens: int = 16  # tokens of the short pipeline run that measures the handoff (0: skip)
    # tokens the target feeds a step while it runs in the background of the other stages' loaded t(n) (the
    # others feed one): 1 as in every committed profile; N > 1 emulates its verifications of N - 1 drafts
    verify_fed: int = 1
    # tokens added to the first prompt for t(n) at a longer context (`context_step_times`; 0: not measured)
    context_extra: int = 384

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            minimum = 0 if name in ("handoff_tokens", "context_extra") else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ConfigError(f"profile.{name} must be an integer >= {minimum}, got {value!r}")


# the short profile `auto` measures when it has none (experiments.auto): a minute at most for SmolLM2.
# Acceptance takes most of it (4 prompts x 32 tokens: 2 x 24 left some pairs with a dozen drafts); the
# handoff is not measured (a pipeline's start, about 10 s, for about 1 ms a hop here): predicted with none;
# nor is t(n) at a longer context (about 30 s for two SmolLM2 stages): its t(n) holds at every context.
SHORT_OPTIONS = ProfileOptions(max_fed=8, repeats=4, continuation=32, draft_k=6, handoff_tokens=0, context_extra=0)
SHORT_PROMPTS = 4
# with its step costs in the cost cache (`cached_costs`), the short profile spends the same minute on
# acceptance alone: twice the prompts (the cost sweep took about half of it)
SHORT_PROMPTS_WITH_COSTS = 8


# ---- step costs -------------------------------------------------------------------------------------


def _runner(spec: StageSpec):
    import torch

    from pipespec.exported import stage_runner

    torch.set_num_threads(spec.threads)
    runner = stage_runner(spec)[0]  # a compiled stage's package: the step the pipeline runs
    runner.start()
    return runner


def interleaved_step_costs(runners: dict, context: Sequence[int], max_fed: int, repeats: int,
                           before: Callable[[Any], None] | None = None,
                           clock: Callable[[], float] = time.perf_counter) -> dict:  # fmt: skip
    """Median seconds of a forward pass feeding n = 1..max_fed tokens after `context` on a warm cache, of
    several runners at once ({key: runner} -> {key: t(n) list}), their sweeps alternating
    (`pipespec.timing.interleaved_step_times`, the one t(n) sweep; `clock` e.g. `time.thread_time` for
    CPU time). Each repetition sweeps n = 1..max_fed once, so a slow spell of the machine spreads over
    every n instead of bending the curve at the n it hit."""
    times = interleaved_step_times(runners, context, max_fed, repeats, before, clock=clock)
    return {key: medians(per_n) for key, per_n in times.items()}


def loaded_step_times(runner, context: Sequence[int], max_fed: int, repeats: int, background: "Background",
                      others: Sequence[int], times: dict | None = None) -> dict:
    """`interleaved_step_times` of `runner` alone and while the background stages `others` run their steady
    loops ({"alone": ..., "loaded": ...}), the two conditions in alternating sweeps (the background paused,
    then running, then running, then paused...): contention is their ratio, so a slow spell of the machine
    must not fall on one condition only. The background is paused again at the end."""
    times = interleaved_step_times({"alone": runner, "loaded": runner}, context, max_fed, repeats, times=times,
                                   before=lambda key: background.run_only(others if key == "loaded" else ()))
    background.run_only(())
    return times


CONTEXT_SIZES = (1, 2, 4, 8, 16, 32)  # the step sizes t(n) is measured at at both contexts (up to max_fed)
MIN_CONTEXT_EXTRA = 32  # fewer further tokens than this fit the model's positions: the context is not measured


def longer_context(prompts: Sequence[Sequence[int]], extra: int, limit: int | None) -> list[int] | None:
    """The first prompt followed by `extra` more tokens of the others (cycled), so that a step after it attends
    to real text; fewer where the model's `limit` positions end first, None where under `MIN_CONTEXT_EXTRA` fit."""
    if limit is not None:
        extra = min(extra, limit - len(prompts[0]) - max(CONTEXT_SIZES))
    pool = [t for p in (prompts[1:] or prompts) for t in p]
    if extra < MIN_CONTEXT_EXTRA or not pool:
        return None
    return list(prompts[0]) + [pool[i % len(pool)] for i in range(extra)]


def context_step_times(runner, contexts: Sequence[Sequence[int]], sizes: Sequence[int], repeats: int) -> dict:
    """t(n) at each of two `contexts` (the shorter first), in alternating sweeps (`interleaved_step_times`,
    the one t(n) sweep): the entry `analysis.profile.context_slopes` reads, {"tokens": the KV cache's length
    during the steps, "sizes", "seconds": medians per context and size}."""
    keys = ("short", "long")
    times = interleaved_step_times(dict.fromkeys(keys, runner), dict(zip(keys, contexts)), max(sizes), repeats,
                                   sizes=sizes)  # fmt: skip
    return {"tokens": [len(c) - 1 for c in contexts], "sizes": list(sizes),
            "seconds": [medians(times[k]) for k in keys]}  # fmt: skip


def measure_context_costs(specs: Sequence[StageSpec], stages: list[dict], runners: dict, measured: Sequence[int],
                          ids: Sequence[Sequence[int]], options: ProfileOptions, log=print) -> None:  # fmt: skip
    """Each `measured` stage's t(n) at the first prompt and at a longer context (`longer_context`), into its
    `stages` entry as ``context_costs``, alone (nothing else computing)."""
    if not options.context_extra:
        return
    sizes = [n for n in CONTEXT_SIZES if n <= options.max_fed]
    for i in measured:
        spec = specs[i]
        longer = longer_context(ids, options.context_extra, context_length(spec.model) if spec.model else None)
        if longer is None:
            log(f"profile: {stages[i]['name']}: too few positions for t(n) at a longer context; not measured")
            continue
        log(f"profile: {stages[i]['name']}: t(n) at {len(ids[0])} and {len(longer)} tokens of context")
        stages[i]["context_costs"] = context_step_times(runners[i], [ids[0], longer], sizes, options.repeats)


def prefill_s_per_token(runner, prompts: Sequence[Sequence[int]]) -> float:
    """Median over prompts of the seconds of a cold prefill divided by the prompt's tokens."""
    rates = []
    for prompt in prompts:
        runner.start()
        started = time.perf_counter()
        runner.forward(list(prompt), [])
        rates.append((time.perf_counter() - started) / len(prompt))
    return statistics.median(rates)


def _steady_loop(spec: StageSpec, context: list[int], ready, stop, run, paused, steps, fed: int = 1) -> None:
    """A background stage: steps feeding `fed` tokens (its next token and `fed` - 1 candidates, dropped
    again as if rejected) on a growing sequence while `run` is set, until told to stop; `paused` is set
    whenever it is between steps with `run` clear; `steps` counts its steps."""
    runner = _runner(spec)
    sequence = list(context)
    while not stop.is_set():
        if not run.is_set() and ready.is_set():
            paused.set()
            run.wait(0.05)  # wakes at once when set; polls so that `stop` is seen
            continue
        if runner.cache_length > len(context) + 256:
            runner.truncate(len(context) - 1)
            sequence = list(context)
        logits = runner.forward(sequence, sequence[-1:] * (fed - 1))
        runner.truncate(len(sequence))
        sequence.append(int(logits[0].argmax()))
        steps.value += 1
        ready.set()  # after its first step: loaded and computing


class Background:
    """Other model stages of the hierarchy running their own steady loops, each in a process of its own,
    all loading at once, stage i feeding `fed[i]` tokens a step (default one each). They run from the
    start; `run_only(indices)` pauses the others."""

    def __init__(self, specs: Sequence[StageSpec], context: Sequence[int], fed: Sequence[int] | None = None):
        self.context = [int(t) for t in context]
        self.specs = list(specs)
        self.fed = [1] * len(self.specs) if fed is None else [int(n) for n in fed]
        self.processes: list = []
        self.runs: list = []
        self.pauses: list = []
        self.steps: list = []  # per stage, a shared count of the steps it took

    def __enter__(self) -> "Background":
        ctx = multiprocessing.get_context("spawn")
        self.stop = ctx.Event()
        readies = []
        for spec, fed in zip(self.specs, self.fed):
            ready, run, paused, steps = ctx.Event(), ctx.Event(), ctx.Event(), ctx.Value("q", 0, lock=False)
            run.set()
            process = ctx.Process(target=_steady_loop, daemon=True,
                                  args=(spec, self.context, ready, self.stop, run, paused, steps, fed))  # fmt: skip
            process.start()
            self.processes.append(process)
            readies.append(ready)
            self.runs.append(run)
            self.pauses.append(paused)
            self.steps.append(steps)
        deadline = time.monotonic() + BACKGROUND_START_S
        for spec, ready, process in zip(self.specs, readies, self.processes):
            while not ready.wait(0.2):
                if not process.is_alive() or time.monotonic() > deadline:
                    self.__exit__(None, None, None)
                    why = (f"ended with exit code {process.exitcode}" if not process.is_alive()
                           else f"did not start within {BACKGROUND_START_S:.0f} s")  # fmt: skip
                    raise RuntimeError(f"background stage {spec.name or spec.model} {why}")
        return self

    def run_only(self, indices: Sequence[int]) -> None:
        """Let the stages at `indices` (positions in `specs`) step and pause the others, returning once
        every paused one has finished its step."""
        pausing = []
        for i, (run, paused) in enumerate(zip(self.runs, self.pauses)):
            if i in indices:
                run.set()
            elif run.is_set():
                paused.clear()
                run.clear()
                pausing.append(i)
        for i in pausing:
            if not self.pauses[i].wait(BACKGROUND_STEP_S):
                raise RuntimeError(f"background stage {self.specs[i].name or self.specs[i].model} did not pause "
                                   f"within {BACKGROUND_STEP_S:.0f} s (exit code {self.processes[i].exitcode})")
        self.check(indices)

    def check(self, indices: Sequence[int] | None = None) -> None:
        """Every background stage (of `indices`) was still computing (else the measurement was not under load)."""
        for i, (spec, process) in enumerate(zip(self.specs, self.processes)):
            if (indices is None or i in indices) and not process.is_alive():
                raise RuntimeError(f"background stage {spec.name or spec.model} ended early "
                                   f"(exit code {process.exitcode}): no contention was measured")  # fmt: skip

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for run in self.runs:
            run.set()
        for process in self.processes:
            process.join(10.0)
            if process.is_alive():
                process.kill()
                process.join(5.0)


# ---- handoff -----------------------------------------------------------------------------------------


def handoff_s(specs: Sequence[StageSpec], prompt: Sequence[int], tokens: int) -> float:
    """Median latency of one message hop between stages in a short sd run (`analysis.fit`)."""
    from pipespec.api import Pipeline

    with Pipeline(list(specs), strategy="sd", lookahead=2) as pipe:
        pipe.generate(list(prompt), max(tokens // 2, 2))  # warm-up
        result = pipe.generate(list(prompt), tokens)
    return measure_traces([(None, result.stage_traces)]).handoff_s


# ---- the whole profile --------------------------------------------------------------------------------


COST_KEYS = ("step_s_alone", "step_s_loaded", "prefill_s_per_token", "context_costs")  # what `costs_from` reuses


def reused_costs(costs_from: dict, entries: Sequence[dict], machine: dict) -> tuple[list[dict], float | None]:
    """Per stage, the cost fields of `costs_from` (a profile's JSON) and its handoff; a `ConfigError`
    unless it was measured on this machine with these libraries, for the same stages."""
    where = costs_from.get("path", "costs_from")
    if costs_from.get("format") != FORMAT or not isinstance(costs_from.get("stages"), list):
        raise ConfigError(f"{where} is not a pipespec profile")
    theirs = costs_from["machine"] if isinstance(costs_from.get("machine"), dict) else {}
    for key in ("cpu", "libraries"):
        if theirs.get(key) != machine.get(key):
            raise ConfigError(f"costs_from {where} was measured with another {key}: {theirs.get(key)!r}, "
                              f"here {machine.get(key)!r}; measure the costs again")  # fmt: skip
    stages = costs_from["stages"]
    if len(stages) != len(entries):
        raise ConfigError(f"costs_from {where} has {len(stages)} stages, this hierarchy {len(entries)}")
    reused = []
    for i, (old, new) in enumerate(zip(stages, entries)):
        differ = [f"{k} ({stage_entry(old, k)} there, {new.get(k)} here)" for k in IDENTITY_KEYS
                  if stage_entry(old, k) != new.get(k)]  # fmt: skip
        if differ:
            raise ConfigError(f"costs_from {where}: stage {i} differs in {', '.join(differ)}")
        reused.append({k: old[k] for k in COST_KEYS if k in old})
    return reused, costs_from.get("handoff_s")


# ---- the cost cache: one step-cost sweep per machine, libraries, stages and cost options ---------------------


COSTS_FORMAT = "pipespec-step-costs"
COST_OPTIONS = ("max_fed", "repeats", "verify_fed", "context_extra")  # the options a cost sweep is measured with


def cost_key(specs: Sequence[StageSpec], options: ProfileOptions) -> dict:
    """What a profile's step costs depend on, as the kernel choice's key (`pipespec.kernels.choice_key`): the
    CPU, the libraries, every stage (what a profile records of it, threads and resolved kernels included,
    and a model stage's model directory and config), the cost sweep's options, and whether the handoff was
    measured."""
    from pipespec.kernels import choice_key

    machine = machine_facts(specs)
    stages = [{**stage_identity(spec), **({} if spec.kind in MODEL_FREE_KINDS else
               {key: choice_key(spec)[key] for key in ("model", "config")})} for spec in specs]  # fmt: skip
    return {"cpu": machine["cpu"], "libraries": machine["libraries"], "stages": stages,
            "options": {name: getattr(options, name) for name in COST_OPTIONS},
            "handoff": bool(options.handoff_tokens) and len(specs) >= 2}  # fmt: skip


def cost_cache_path(key: dict) -> Path:
    """Where the step costs of `key` (`cost_key`) are cached: `pipespec.cache.cache_root() / "costs"`."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]
    return cache_root() / "costs" / f"{digest}.json"


def cached_costs(specs: Sequence[StageSpec], options: ProfileOptions) -> dict | None:
    """The cached step costs of these stages on this machine with these cost options, as a profile's JSON
    that `reused_costs` takes (with its "path" and "measured_at"); None when there are none."""
    key = cost_key(specs, options)
    path = cost_cache_path(key)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not (isinstance(record, dict) and record.get("format") == COSTS_FORMAT and record.get("key") == key):
        return None
    return {"format": FORMAT, "path": str(path), "machine": record.get("machine"), "stages": record.get("stages"),
            "handoff_s": record.get("handoff_s"), "measured_at": record.get("measured_at")}  # fmt: skip


def store_costs(specs: Sequence[StageSpec], options: ProfileOptions, profile: dict) -> str:
    """Cache the step costs, prefill and handoff of a freshly measured `profile` (its JSON); the file's path."""
    key = cost_key(specs, options)
    path = cost_cache_path(key)
    atomic_write_json(path, {"format": COSTS_FORMAT, "key": key, "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"),
                             "machine": profile["machine"], "stages": profile["stages"],
                             "handoff_s": profile["handoff_s"]})  # fmt: skip
    return str(path)


def short_profile_prompts(specs: Sequence[StageSpec]) -> int:
    """How many prompts the short profile (`SHORT_OPTIONS`) of these stages measures acceptance on here:
    `SHORT_PROMPTS_WITH_COSTS` when its step costs are cached, else `SHORT_PROMPTS`."""
    return SHORT_PROMPTS_WITH_COSTS if cached_costs(specs, SHORT_OPTIONS) is not None else SHORT_PROMPTS



def sweep_stages(runners: dict, names: dict, context: Sequence[int], max_fed: int, repeats: int,
                 background: "Background | None", times: dict, log=print) -> None:  # fmt: skip
    """`repeats` more timed sweeps of t(n) of each stage in `runners` ({stage index: runner}) into `times`
    ({stage index: times per condition}): alone, or with a `background` (the same stages' steady loops, in
    the order of `runners`) alone and while every other one runs (`loaded_step_times`)."""
    measured = list(runners)
    for position, i in enumerate(measured):
        if background is None:
            log(f"profile: {names[i]}: t(n)")
            times[i] = interleaved_step_times({"alone": runners[i]}, context, max_fed, repeats, times=times.get(i))
        else:
            log(f"profile: {names[i]}: t(n) alone and while {len(measured) - 1} other stage(s) run")
            others = [p for p in range(len(measured)) if p != position]
            times[i] = loaded_step_times(runners[i], context, max_fed, repeats, background, others,
                                         times=times.get(i))  # fmt: skip


def start_background(stack: contextlib.ExitStack, specs: Sequence[StageSpec], measured: Sequence[int],
                     context: Sequence[int], verify_fed: int, log=print) -> "Background | None":  # fmt: skip
    """With more than one stage to time, all of them running their steady loops (the target feeding
    `verify_fed` tokens a step, the others one), entered on `stack`; else None (nothing to contend with)."""
    if len(measured) <= 1:
        return None
    log(f"profile: starting {len(measured)} background stages")
    fed = [verify_fed if i == len(specs) - 1 else 1 for i in measured]
    return stack.enter_context(Background([specs[i] for i in measured], context, fed))


def step_cost_entry(times: dict, loaded: bool) -> dict:
    """A stage's `step_s_alone` and `step_s_loaded` (t(n) medians; without a background, loaded = alone)."""
    alone = medians(times["alone"])
    return {"step_s_alone": alone, "step_s_loaded": medians(times["loaded"]) if loaded else list(alone)}


def measure_with_models(specs: Sequence[StageSpec], stages: list[dict], drafters: Sequence, runners: dict,
                        measured: Sequence[int], ids: Sequence[Sequence[int]], options: ProfileOptions,
                        log=print) -> tuple[list[dict], list[dict]]:  # fmt: skip
    """What needs the stages' models: t(n) and prefill of the `measured` stages (into their `stages`
    entries) and every pair's acceptance (`measure_acceptance`, returned). Half the t(n) sweeps come
    before acceptance is measured and half after, a minute or more apart: a slow spell of the machine
    (they last minutes here) then falls on part of them rather than on all."""
    context, timed = ids[0], {i: runners[i] for i in measured}
    names = {i: stages[i]["name"] for i in measured}
    times: dict = {}
    with contextlib.ExitStack() as stack:
        background = start_background(stack, specs, measured, context, options.verify_fed, log)
        sweep_stages(timed, names, context, options.max_fed, options.repeats - options.repeats // 2, background,
                     times, log)  # fmt: skip
        for i in measured:
            stages[i]["prefill_s_per_token"] = prefill_s_per_token(runners[i], ids)
        pairs, skip_pairs = measure_acceptance(stages, drafters, runners, ids, options.continuation, options.draft_k,
                                              log)  # fmt: skip
        if options.repeats // 2:
            sweep_stages(timed, names, context, options.max_fed, options.repeats // 2, background, times, log)
        measure_context_costs(specs, stages, runners, measured, ids, options, log)
    for i in measured:
        stages[i].update(step_cost_entry(times[i], background is not None))
    return pairs, skip_pairs


def measure_profile(
    specs: Sequence[StageSpec],
    hierarchy: str,
    prompts: Sequence[tuple[str, Sequence[int]]],
    options: ProfileOptions = ProfileOptions(),
    dataset: str | None = None,
    log=print,
    costs_from: dict | None = None,
    cost_cache: bool = False,
) -> dict:
    """The profile (a JSON-ready dict) of `specs`, smallest first, on `prompts` = [(sample id, ids)].
    `costs_from`: another profile's JSON (with its "path"), whose step costs, prefill and handoff are
    reused (`reused_costs`); only acceptance is measured then. `cost_cache`: without `costs_from`, reuse
    the cached cost sweep of these stages on this machine (`cached_costs`) where there is one, and cache
    freshly measured costs (`store_costs`)."""
    if not prompts:
        raise ConfigError("a profile needs at least one prompt")
    started = time.perf_counter()
    ids = [list(map(int, p)) for _, p in prompts]
    if costs_from is None and cost_cache:
        costs_from = cached_costs(specs, options)
        if costs_from is not None:
            log(f"profile: step costs, prefill and handoff from the cost cache {costs_from['path']} (measured "
                f"{costs_from['measured_at']}; cost_cache=false measures them again)")  # fmt: skip
    machine = machine_facts(specs)
    drafters = [build_drafter(spec) for spec in specs]  # None for a model stage
    model_stages = [i for i, d in enumerate(drafters) if d is None]
    stages = [{"name": spec.label, **stage_identity(spec)} for spec in specs]
    reused, handoff = reused_costs(costs_from, stages, machine) if costs_from is not None else (None, None)
    if reused is not None:
        for i in model_stages:
            stages[i].update(reused[i])
    runners = {i: _runner(specs[i]) for i in model_stages}
    measured = model_stages if reused is None else []  # the stages whose costs are measured here
    pairs, skip_pairs = measure_with_models(specs, stages, drafters, runners, measured, ids, options, log)
    del runners  # the models' memory back before the handoff's pipeline loads them again
    if reused is None and options.handoff_tokens and len(specs) >= 2:
        log("profile: handoff latency (a short sd run)")
        handoff = handoff_s(specs, ids[0], options.handoff_tokens)
    profile = {
        "format": FORMAT, "version": VERSION, "hierarchy": {"name": hierarchy, "stages": [s["name"] for s in stages]},
        "machine": machine, "dataset": dataset, "sample_ids": [sample_id for sample_id, _ in prompts],
        "prompt_tokens": [len(p) for p in ids], "options": asdict(options),
        "costs_from": None if costs_from is None else costs_from.get("path"), "stages": stages, "pairs": pairs,
        "skip_pairs": skip_pairs, "handoff_s": handoff, "duration_s": time.perf_counter() - started,
    }  # fmt: skip
    if cost_cache and reused is None:
        log(f"profile: step costs cached in {store_costs(specs, options, profile)}")
    return profile
