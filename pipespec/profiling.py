"""Measure a machine profile of one hierarchy: what `analysis.predict` needs to predict a run before it.

- per model stage, t(n) for n = 1..max_fed tokens fed on a warm KV cache (medians of `repeats`), alone
  and while every other model stage of the hierarchy runs its own steady one-token loop in another
  process (contention measured, not assumed), and the prefill cost per prompt token;
- per drafter/verifier pair (adjacent pairs in `pairs`; every drafter with every later verifier
  in `skip_pairs`, for hierarchies that leave a stage out), acceptance by draft position: the
  drafter drafts `draft_k` tokens greedily along the verifier's own greedy continuation of each
  prompt, from the points where decoding would draft again: the next draft starts after the
  accepted prefix and the verifier's own token (a walk, as speculative decoding advances).
  Position p's rate is the share of drafts accepted there among those whose earlier positions
  were all accepted. Starting at fixed strides instead (profile version 1) over-estimates it: the
  token after a rejection is where a drafter, prompt lookup above all, is weakest. For a
  model-free drafter (prompt lookup, suffix), how often it has a proposal at those points and
  how long it is;
- the handoff latency of one message between stages, from a short real pipeline run's traces
  (`analysis.fit`'s estimate);
- the machine (CPU, vector extensions, threads per stage, library versions) and the sample ids used.

`analysis.profile` reads the file without torch. Wall time: the models' loading plus about
(2 * max_fed * (repeats + 1) steps per model stage) + (prompts * continuation / mean acceptance
length * draft_k drafter steps per pair). `costs_from` reuses another profile's step costs, prefill
and handoff (same machine and stages) and measures only acceptance: acceptance depends on the
prompts, costs on the machine.
"""

from __future__ import annotations

import multiprocessing
import os
import platform
import socket
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Sequence

from pipespec.errors import ConfigError
from pipespec.models import StageSpec

BACKGROUND_START_S = 300.0  # a background stage must have loaded its model and started within this


@dataclass(frozen=True)
class ProfileOptions:
    max_fed: int = 32  # t(n) for n = 1..max_fed
    repeats: int = 5  # timed sweeps over n = 1..max_fed (medians per n), after one untimed
    continuation: int = 64  # tokens of each verifier's greedy continuation drafts are checked against
    draft_k: int = 8  # tokens drafted from each start (acceptance positions 1..draft_k)
    handoff_tokens: int = 16  # tokens of the short pipeline run that measures the handoff (0: skip)

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            minimum = 0 if name == "handoff_tokens" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ConfigError(f"profile.{name} must be an integer >= {minimum}, got {value!r}")


# the short profile `auto` measures when it has none (pipespec.autoconf): a minute at most for SmolLM2
SHORT_OPTIONS = ProfileOptions(max_fed=8, repeats=2, continuation=24, draft_k=6, handoff_tokens=8)
SHORT_PROMPTS = 2


def machine_facts(specs: Sequence[StageSpec]) -> dict:
    import torch
    import transformers

    from pipespec.runner import cpu_info

    return {
        "cpu": cpu_info(),
        "cpu_count": os.cpu_count(),
        "hostname": socket.gethostname(),
        "threads_per_stage": [s.threads for s in specs],
        "libraries": {"python": platform.python_version(), "torch": torch.__version__,
                      "transformers": transformers.__version__},
    }  # fmt: skip


# ---- step costs -------------------------------------------------------------------------------------


def _runner(spec: StageSpec):
    import torch

    from pipespec.models import CausalLMRunner, load_model

    torch.set_num_threads(spec.threads)
    runner = CausalLMRunner(load_model(spec))
    runner.start()
    return runner


def step_costs(runner, context: Sequence[int], max_fed: int, repeats: int) -> list[float]:
    """Median seconds of a forward pass feeding n = 1..max_fed tokens after `context` (warm cache).

    Each repetition sweeps n = 1..max_fed once (after one untimed sweep), so a slow spell of the
    machine spreads over every n instead of bending the curve at the n it hit."""
    return interleaved_step_costs({None: runner}, context, max_fed, repeats)[None]


def interleaved_step_costs(runners: dict, context: Sequence[int], max_fed: int, repeats: int) -> dict:
    """`step_costs` of several runners at once ({key: runner} -> {key: t(n) list}), their sweeps alternating
    (in turn, then in reverse order) so that drift of the machine falls on all of them."""
    filler = [int(context[-1])] * max_fed
    times = {key: [[] for _ in range(max_fed)] for key in runners}
    for runner in runners.values():
        runner.start()
        runner.forward(list(context), [])  # the prompt in the cache, its last token fed again below
    for sweep in range(repeats + 1):  # the first is a warm-up
        for key in list(runners) if sweep % 2 == 0 else list(reversed(runners)):
            runner = runners[key]
            for n in range(1, max_fed + 1):
                runner.truncate(len(context) - 1)
                started = time.perf_counter()
                runner.forward(list(context), filler[: n - 1])
                if sweep:
                    times[key][n - 1].append(time.perf_counter() - started)
    return {key: [statistics.median(t) for t in per_n] for key, per_n in times.items()}


def prefill_s_per_token(runner, prompts: Sequence[Sequence[int]]) -> float:
    """Median over prompts of the seconds of a cold prefill divided by the prompt's tokens."""
    rates = []
    for prompt in prompts:
        runner.start()
        started = time.perf_counter()
        runner.forward(list(prompt), [])
        rates.append((time.perf_counter() - started) / len(prompt))
    return statistics.median(rates)


def _steady_loop(spec: StageSpec, context: list[int], ready, stop) -> None:
    """A background stage: one-token steps on a growing sequence until told to stop."""
    runner = _runner(spec)
    sequence = list(context)
    while not stop.is_set():
        if runner.cache_length > len(context) + 256:
            runner.truncate(len(context) - 1)
            sequence = list(context)
        sequence.append(int(runner.forward(sequence, []).argmax()))
        ready.set()  # after its first step: loaded and computing


class Background:
    """The other model stages of the hierarchy running their own steady loops, in other processes."""

    def __init__(self, specs: Sequence[StageSpec], context: Sequence[int]):
        self.context = [int(t) for t in context]
        self.specs = list(specs)
        self.processes: list = []

    def __enter__(self) -> "Background":
        ctx = multiprocessing.get_context("spawn")
        self.stop = ctx.Event()
        readies = []
        for spec in self.specs:
            ready = ctx.Event()
            process = ctx.Process(target=_steady_loop, args=(spec, self.context, ready, self.stop), daemon=True)
            process.start()
            self.processes.append(process)
            readies.append(ready)
        for spec, ready, process in zip(self.specs, readies, self.processes):
            if not ready.wait(BACKGROUND_START_S):
                self.__exit__(None, None, None)
                raise RuntimeError(f"background stage {spec.name or spec.model} did not start within "
                                   f"{BACKGROUND_START_S:.0f} s (exit code {process.exitcode})")  # fmt: skip
        return self

    def check(self) -> None:
        """Every background stage was still computing (else the measurement was not under load)."""
        for spec, process in zip(self.specs, self.processes):
            if not process.is_alive():
                raise RuntimeError(f"background stage {spec.name or spec.model} ended early "
                                   f"(exit code {process.exitcode}): no contention was measured")  # fmt: skip

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for process in self.processes:
            process.join(10.0)
            if process.is_alive():
                process.kill()
                process.join(5.0)


# ---- acceptance by draft position -------------------------------------------------------------------


def greedy_continuation(runner, prompt: Sequence[int], tokens: int) -> list[int]:
    runner.start()
    sequence = list(prompt)
    for _ in range(tokens):
        sequence.append(int(runner.forward(sequence, []).argmax()))
    return sequence[len(prompt) :]


class ModelDrafter:
    """Greedy drafting with one model, reusing the KV cache of the longest prefix it already holds."""

    def __init__(self, runner):
        self.runner = runner
        runner.start()
        self.held: list[int] = []  # the tokens in the cache

    def __call__(self, sequence: Sequence[int], k: int) -> list[int]:
        sequence = list(sequence)
        common = 0
        while common < min(len(self.held), len(sequence) - 1) and self.held[common] == sequence[common]:
            common += 1
        self.runner.truncate(common)
        drafts: list[int] = []
        for _ in range(k):
            drafts.append(int(self.runner.forward(sequence + drafts, []).argmax()))
        self.held = (sequence + drafts)[: self.runner.cache_length]
        return drafts


def acceptance_by_position(drafter, prompts, continuations, options: ProfileOptions) -> dict:
    """`drafter(sequence, k) -> drafts`; per position: drafts offered there (all earlier ones accepted)
    and accepted. Also how often the drafter proposed anything and the mean proposal length.

    Drafts start where decoding would draft again: after the accepted prefix and the verifier's own
    token (the correction, or the bonus token), or one token on when the drafter had nothing."""
    offered = [0] * options.draft_k
    accepted = [0] * options.draft_k
    proposals = lengths = starts = 0
    for prompt, continuation in zip(prompts, continuations):
        start = 0
        while start < len(continuation) - 1:
            truth = continuation[start:]
            drafts = drafter(list(prompt) + continuation[:start], min(options.draft_k, len(truth)))
            starts += 1
            proposals += bool(drafts)
            lengths += len(drafts)
            run = 0
            for p, token in enumerate(drafts):
                offered[p] += 1
                if token != truth[p]:
                    break
                accepted[p] += 1
                run += 1
            start += run + 1
    rates = [a / o if o else None for a, o in zip(accepted, offered)]
    return {
        "acceptance_by_position": rates, "offered_by_position": offered, "accepted_by_position": accepted,
        "starts": starts, "proposal_rate": proposals / starts if starts else 0.0,
        "mean_proposal_length": lengths / proposals if proposals else 0.0,
    }  # fmt: skip


# ---- handoff -----------------------------------------------------------------------------------------


def handoff_s(specs: Sequence[StageSpec], prompt: Sequence[int], tokens: int) -> float:
    """Median latency of one message hop between stages in a short sd run (`analysis.fit`)."""
    from analysis.fit import measure_traces
    from pipespec.api import Pipeline

    with Pipeline(list(specs), strategy="sd", lookahead=2) as pipe:
        pipe.generate(list(prompt), max(tokens // 2, 2))  # warm-up
        result = pipe.generate(list(prompt), tokens)
    return measure_traces([(None, result.stage_traces)]).handoff_s


# ---- the whole profile --------------------------------------------------------------------------------


COST_KEYS = ("step_s_alone", "step_s_loaded", "prefill_s_per_token")  # what `costs_from` reuses per stage


def reused_costs(costs_from: dict, entries: Sequence[dict], machine: dict) -> tuple[list[dict], float | None]:
    """Per stage, the cost fields of `costs_from` (a profile's JSON) and its handoff; a `ConfigError`
    unless it was measured on this machine with these libraries, for the same stages."""
    from analysis.profile import FORMAT, IDENTITY_KEYS, stage_entry

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


def measure_profile(
    specs: Sequence[StageSpec],
    hierarchy: str,
    prompts: Sequence[tuple[str, Sequence[int]]],
    options: ProfileOptions = ProfileOptions(),
    dataset: str | None = None,
    log=print,
    costs_from: dict | None = None,
) -> dict:
    """The profile (a JSON-ready dict) of `specs`, smallest first, on `prompts` = [(sample id, ids)].
    `costs_from`: another profile's JSON (with its "path"), whose step costs, prefill and handoff are
    reused (`reused_costs`); only acceptance is measured then."""
    from analysis.profile import FORMAT, VERSION  # the reader's: one definition for both
    from pipespec.autoconf import stage_identity
    from pipespec.drafters import build_drafter

    if not prompts:
        raise ConfigError("a profile needs at least one prompt")
    started = time.perf_counter()
    ids = [list(map(int, p)) for _, p in prompts]
    context = ids[0]
    machine = machine_facts(specs)
    drafters = [build_drafter(spec) for spec in specs]  # None for a model stage
    model_stages = [i for i, d in enumerate(drafters) if d is None]
    stages = [{"name": spec.label, **stage_identity(spec)} for spec in specs]
    reused, handoff = reused_costs(costs_from, stages, machine) if costs_from is not None else (None, None)
    runners = {i: _runner(specs[i]) for i in model_stages}
    for i, entry in enumerate(stages):
        if i not in runners:
            continue
        if reused is not None:
            entry.update(reused[i])
            continue
        log(f"profile: {entry['name']}: t(n) alone")
        entry["step_s_alone"] = step_costs(runners[i], context, options.max_fed, options.repeats)
        entry["prefill_s_per_token"] = prefill_s_per_token(runners[i], ids)
        others = [specs[j] for j in model_stages if j != i]
        if others:
            log(f"profile: {entry['name']}: t(n) while {len(others)} other stage(s) run")
            with Background(others, context) as background:
                entry["step_s_loaded"] = step_costs(runners[i], context, options.max_fed, options.repeats)
                background.check()
        else:
            entry["step_s_loaded"] = list(entry["step_s_alone"])
    pairs, skip_pairs = [], []
    for v in range(1, len(specs)):
        if v not in runners:
            raise ConfigError(f"stage {v} ({stages[v]['name']}) verifies drafts: it must be a model")
        log(f"profile: {stages[v]['name']}: greedy continuations")
        continuation = [greedy_continuation(runners[v], p, options.continuation) for p in ids]
        for d in range(v - 1, -1, -1):  # the adjacent drafter, then every earlier one (subsets skip stages)
            draft = drafters[d].propose if drafters[d] is not None else ModelDrafter(runners[d])
            log(f"profile: acceptance {stages[d]['name']} -> {stages[v]['name']}")
            pair = {"drafter": stages[d]["name"], "verifier": stages[v]["name"], "drafter_index": d,
                    "verifier_index": v, **acceptance_by_position(draft, ids, continuation, options)}  # fmt: skip
            (pairs if d == v - 1 else skip_pairs).append(pair)
    del runners
    if reused is None and options.handoff_tokens and len(specs) >= 2:
        log("profile: handoff latency (a short sd run)")
        handoff = handoff_s(specs, context, options.handoff_tokens)
    return {
        "format": FORMAT,
        "version": VERSION,
        "hierarchy": {"name": hierarchy, "stages": [s["name"] for s in stages]},
        "machine": machine,
        "dataset": dataset,
        "sample_ids": [sample_id for sample_id, _ in prompts],
        "prompt_tokens": [len(p) for p in ids],
        "options": asdict(options),
        "costs_from": None if costs_from is None else costs_from.get("path"),
        "stages": stages,
        "pairs": pairs,
        "skip_pairs": skip_pairs,
        "handoff_s": handoff,
        "duration_s": time.perf_counter() - started,
    }
