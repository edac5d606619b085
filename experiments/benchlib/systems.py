"""The systems the bench compares, on the same target and prompts.

- `hf_greedy`, `hf_compiled`, `hf_assisted`, `hf_prompt_lookup`: Hugging Face `generate` in the
  driver process (`experiments.benchlib.hf`), each at the faster of `hf.threads` (the pre-pass);
  `hf_compiled` is HF greedy on transformers' fast path (static cache, compiled decoding), compiled
  before anything is timed, and left out with its reason where it cannot compile; the assistant is
  k2's draft, prompt lookup takes its settings from the prompt-lookup stage of k3 (or k2)
- `greedy`: our k2 target alone, at the faster of `greedy_threads` (a target-only pipeline per other
  thread count); `sd` (at the window the pre-pass chose), `pipespec_k2`: our pipeline of k2
- `pipespec_k3`: our pipeline of k3
- `auto`: our pipeline of `auto.hierarchy` (k3 by default) at the configuration its machine
  profile predicts fastest (`experiments.auto`; greedy and subsets of the stages included);
  `auto.profile` null: the cached short profile of this machine, measured first if there is none
- `llamacpp_greedy`, `llamacpp_q4`, `llamacpp_prompt_lookup`: llama.cpp in the driver process
  (`experiments.benchlib.llamacpp`, optional), at the faster of `llamacpp.threads`; left out with the reason
  (`skipped`, the report's notes) where llama-cpp-python is missing or the target has no GGUF
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

from pipespec.errors import ConfigError

from experiments.benchlib.config import (HF_SYSTEMS, LLAMACPP_SYSTEMS, BenchConfigError, Hierarchy, is_pipespec,
                                         is_sd, per_hierarchy, resolve_hierarchy, sd_candidates)  # fmt: skip
from experiments.benchlib.timer import lifetime_peak_rss_mb, prepass
from experiments.hierarchies import read_hierarchy

# torch and the modules that import it (pipespec.api, experiments.auto, experiments.benchlib.hf), and
# experiments.benchlib.llamacpp (numpy), are imported where the systems start (`Systems`): resolving a bench's
# hierarchies (`resolve_setup`) imports none of them.


def sd_settings(chosen: dict[str, Any], candidates: list[tuple], before: dict[str, Any]) -> dict[str, Any]:
    """An sd system's settings after its pre-pass: the (window, draft_confidence) chosen among `candidates`,
    what was tried, and the warm-up of compiled stages (`warm_up_s`) from its settings `before`."""
    return {"strategy": "sd", "window": chosen["lookahead"], "draft_confidence": chosen["draft_confidence"],
            "chosen_from": list(dict.fromkeys(w for w, _ in candidates)),
            "draft_confidences_tried": list(dict.fromkeys(c for _, c in candidates)),
            **{k: v for k, v in before.items() if k == "warm_up_s"}}  # fmt: skip


@dataclass
class System:
    name: str
    run: Callable[[list[int], int], Any]  # (prompt ids, max new tokens) -> result
    processes: Callable[[], list[tuple[str, int]]]
    settings: dict[str, Any] = field(default_factory=dict)
    hierarchy: str = ""
    stages: list[str] = field(default_factory=list)
    kind: str = "pipespec"  # or "hf"
    runs: list[tuple[int, int, Any]] = field(default_factory=list)  # (repetition, prompt index, result)
    forget_next: bool = False  # set at each repetition's start: a suffix stage drops the outputs it indexed


def same_target(a, b) -> bool:
    return (a.model, a.dtype, a.quantize, a.device) == (b.model, b.dtype, b.quantize, b.device)


@dataclass
class Setup:
    """The hierarchies and the stages the HF systems borrow from them."""

    k2: Hierarchy
    k3: Hierarchy | None
    lookup: Any  # the prompt-lookup StageSpec, or None
    more: dict[str, Hierarchy] = field(default_factory=dict)  # the hierarchies of "STRATEGY@NAME" systems

    def hierarchy_of(self, system: str) -> Hierarchy:
        where = per_hierarchy(system)
        if where is not None:
            return self.more[where[1]]
        return self.k3 if system == "pipespec_k3" else self.k2

    @property
    def target(self):
        return self.k2.stages[-1]

    @property
    def draft(self):
        return self.k2.stages[0]


def resolve_setup(cfg: Mapping[str, Any]) -> Setup:
    wanted = cfg["systems"]
    k2 = resolve_hierarchy("k2", cfg["k2"])
    uses_k3 = ({"pipespec_k3", "hf_prompt_lookup", "llamacpp_prompt_lookup"} & set(wanted)
               or ("auto" in wanted and cfg["auto"]["hierarchy"] == "k3"))  # fmt: skip
    k3 = resolve_hierarchy("k3", cfg["k3"]) if uses_k3 else None
    if k3 is not None and not same_target(k3.stages[-1], k2.stages[-1]):
        raise BenchConfigError(f"k2 and k3 must end in the same target: {k2.stages[-1].label} vs {k3.stages[-1].label}")
    if "hf_assisted" in wanted and k2.stages[0].kind != "hf":
        raise BenchConfigError("hf_assisted needs a model as the first stage of k2 (the assistant)")
    for h in (k2, k3):
        if h is not None and any(s.kind == "suffix" for s in h.stages):
            raise BenchConfigError(f"{h.key} ({h.label}) has a suffix stage: list it under `hierarchies` instead, "
                                   "where each system runs its own pipeline (a suffix stage indexes every output "
                                   "of its pipeline, so a system sharing it would draft another's output of the "
                                   "same prompt)")  # fmt: skip
    lookup = next((s for h in (k3, k2) if h is not None for s in h.stages if s.kind == "prompt_lookup"), None)
    if "hf_prompt_lookup" in wanted and lookup is None:
        raise BenchConfigError("hf_prompt_lookup needs a prompt_lookup stage in k3 (or k2)")
    more = {}
    for name in dict.fromkeys(where[1] for where in map(per_hierarchy, wanted) if where is not None):
        try:
            more[name] = resolve_hierarchy(name, read_hierarchy(name))
        except ConfigError as error:
            raise BenchConfigError(f"hierarchies: {error}") from None
        if not same_target(more[name].stages[-1], k2.stages[-1]):
            raise BenchConfigError(f"hierarchy {name} must end in k2's target {k2.stages[-1].label}, "
                                   f"not {more[name].stages[-1].label}")  # fmt: skip
    return Setup(k2, k3, lookup, more)


class Systems:
    """Starts what the wanted systems need (pipelines load in parallel, HF models in this process) and
    builds them; `close()` shuts everything down. The sd window and HF assisted settings are chosen by
    `choose_settings` (the pre-passes) and read by the systems at every call."""

    def __init__(self, cfg: Mapping[str, Any], setup: Setup, profile_prompts: list | None = None):
        from experiments.benchlib.hf import HFBaseline
        from experiments.auto import AutoPipeline
        from pipespec.api import Pipeline

        self.cfg, self.setup, self.wanted = cfg, setup, list(cfg["systems"])
        self.pipes: dict[str, Any] = {}
        self.hf = None
        self.llama = None  # benchlib.llamacpp.LlamaCppSystems, when a llama.cpp system is wanted
        pipespec = cfg["pipespec"]
        self.pipespec = {"strategy": "pipespec", "lookahead": pipespec["lookahead"], "max_lead": pipespec["max_lead"],
                         "draft_confidence": pipespec["draft_confidence"],
                         "size_verification": pipespec.get("size_verification", False),
                         "cascade": pipespec.get("cascade", False),
                         "value_stop": pipespec.get("value_stop", 0.0)}  # fmt: skip
        window, confidence = sd_candidates(cfg)[0]
        sd = {"strategy": "sd", "lookahead": window, "max_lead": cfg["sd"]["max_lead"], "draft_confidence": confidence}
        self.sd = {name: dict(sd) for name in self.wanted if is_sd(name)}  # per sd system: its pre-pass's choice
        self.assisted = (cfg["hf"].get("assisted") or [None])[0]
        self.threads: dict[str, int] = {}  # per HF system and our greedy: the thread count its pre-pass chose
        self.skipped: dict[str, str] = {}  # systems left out, and why (hf_compiled where it cannot compile)
        self.compile_s: float | None = None
        self.graphs_before_timing: int | None = None  # dynamo's graphs once hf_compiled is compiled
        try:
            self._start_pipelines(Pipeline, AutoPipeline, profile_prompts)
            if set(HF_SYSTEMS) & set(self.wanted):
                draft = setup.draft if "hf_assisted" in self.wanted else None
                kernels = cfg["hf"]["kernels"]  # HF generate as a user runs it: torch's, by default
                self.hf = HFBaseline(*(None if s is None else replace(s, kernels=kernels) for s in (setup.target, draft)),
                                     cfg["hf"]["threads"][0], cfg["hf"]["static_cache_len"])  # fmt: skip
            if set(LLAMACPP_SYSTEMS) & set(self.wanted):  # in this process; left out with the reason where it cannot
                from experiments.benchlib.llamacpp import LlamaCppSystems

                self.llama = LlamaCppSystems(cfg, setup.target, self.skipped, self.prompt_lookup_settings(),
                                             lambda: self.hf.target if self.hf is not None else None)  # fmt: skip
        except BaseException:
            self.close()
            raise

    def _start_pipelines(self, Pipeline, AutoPipeline, profile_prompts) -> None:  # noqa: N803 (the classes)
        cfg, setup, pipespec = self.cfg, self.setup, self.cfg["pipespec"]
        options = dict(strategy="pipespec", lookahead=pipespec["lookahead"], max_lead=pipespec["max_lead"],
                       stall_timeout_s=cfg["stall_timeout_s"])  # fmt: skip
        if {"greedy", "sd", "pipespec_k2"} & set(self.wanted):
            self.pipes["k2"] = Pipeline(setup.k2.stages, **options)
        if "greedy" in self.wanted:  # our greedy at every thread count the pre-pass times: the target alone
            for threads in self.greedy_thread_counts()[1:]:
                self.pipes[f"greedy_t{threads}"] = Pipeline([replace(setup.target, threads=threads)], strategy="greedy",
                                                            stall_timeout_s=cfg["stall_timeout_s"])  # fmt: skip
        if "pipespec_k3" in self.wanted:
            self.pipes["k3"] = Pipeline(setup.k3.stages, **options)
        for name in self.wanted:  # a pipeline of its own per STRATEGY@HIERARCHY system
            if per_hierarchy(name) is not None:  # its own cascade is checked against its stages here
                cascade = self.options_of(name).get("cascade", False) if is_pipespec(name) else False
                self.pipes[name] = Pipeline(setup.hierarchy_of(name).stages, **options, cascade=cascade)
        if "auto" in self.wanted:
            self.auto_hierarchy = setup.k3 if cfg["auto"]["hierarchy"] == "k3" else setup.k2
            self.pipes["auto"] = AutoPipeline(self.auto_hierarchy.stages, profile=cfg["auto"].get("profile"),
                                              profile_prompts=profile_prompts,
                                              stall_timeout_s=cfg["stall_timeout_s"])  # fmt: skip
        for pipe in self.pipes.values():
            pipe.start()

    def greedy_thread_counts(self) -> list[int]:
        """Our greedy's thread counts to time: the k2 target's own first (it runs in the k2 pipeline)."""
        own = self.setup.target.threads
        return [own] + [t for t in self.cfg["greedy_threads"] if t != own]

    def greedy_pipe(self, threads: int):
        return self.pipes["k2"] if threads == self.setup.target.threads else self.pipes[f"greedy_t{threads}"]

    def close(self) -> None:
        for pipe in self.pipes.values():
            pipe.close()
        if self.hf is not None:
            self.hf.close()
        if self.llama is not None:
            self.llama.close()

    # ---- the systems ------------------------------------------------------------------------
    def _driver(self) -> list[tuple[str, int]]:
        held = "HF target + assistant" if self.hf is not None and self.hf.draft is not None else "HF target"
        return [(f"driver ({held})", os.getpid())]

    def prompt_lookup_settings(self) -> dict[str, int]:
        hf, lookup = self.cfg["hf"], self.setup.lookup
        return {
            "prompt_lookup_num_tokens": hf.get("prompt_lookup_num_tokens") or (lookup.max_proposal if lookup else 10),
            "max_matching_ngram_size": hf.get("max_matching_ngram_size") or (lookup.ngram_size if lookup else 2),
        }

    def _hf(self, name: str, mode: str, settings: dict, hierarchy: Hierarchy, stages: list) -> System:
        def run(prompt, n, threads=None):
            threads = threads or self.threads.get(name)
            if mode == "assisted":
                return self.hf.generate(prompt, n, mode, assisted=self.assisted, threads=threads)
            return self.hf.generate(prompt, n, mode, threads=threads, **(settings if mode == "prompt_lookup" else {}))

        return System(name, run, self._driver, settings, hierarchy.label, [s.label for s in stages], "hf")

    def options_of(self, name: str) -> dict[str, Any]:
        """A pipespec system's settings: `pipespec`'s, with its own `system_options` on top."""
        return {**self.pipespec, **self.cfg["system_options"].get(name, {})}

    def _ours(self, name: str, key: str, strategy: str) -> System:
        pipe = self.pipes[key]
        pipespec = self.options_of(name)

        def run(prompt, n, threads=None):
            if strategy == "greedy":  # the target alone, at the thread count its pre-pass chose
                chosen = threads or self.threads.get(name, self.setup.target.threads)
                return self.greedy_pipe(chosen).generate(prompt, n, strategy="greedy")
            options = self.sd[name] if strategy == "sd" else dict(pipespec, strategy=strategy)
            forget, system.forget_next = system.forget_next, False
            return pipe.generate(prompt, n, forget_outputs=forget, **options)

        def processes():
            running = self.greedy_pipe(self.threads.get(name, self.setup.target.threads)) if strategy == "greedy" else pipe
            return list(zip(running.names, running.pids))

        settings = {"strategy": "greedy"} if strategy == "greedy" else dict(pipespec) if strategy == "pipespec" else {}
        if any(pipe.warm_up_s):  # compiled stages: their warm-up at start, before anything was timed
            settings["warm_up_s"] = [round(seconds, 1) for seconds in pipe.warm_up_s]
        label = self.setup.hierarchy_of(name).label
        system = System(name, run, processes, settings, label, list(pipe.names))
        return system

    def _auto(self) -> System:
        """The pipeline runs the configuration auto chose (its defaults): generate with no options."""
        pipe = self.pipes["auto"]
        return System("auto", lambda prompt, n: pipe.generate(prompt, n), lambda: list(zip(pipe.names, pipe.pids)),
                      {"strategy": "auto", **pipe.auto.record()}, self.auto_hierarchy.label,
                      list(pipe.names))  # fmt: skip

    def build(self) -> list[System]:
        k2, k3, target = self.setup.k2, self.setup.k3, self.setup.target
        builders = {
            "hf_greedy": lambda: self._hf("hf_greedy", "greedy", {"do_sample": False}, k2, [target]),
            "hf_compiled": lambda: self._hf("hf_compiled", "compiled", {"do_sample": False, "cache": "static",
                                                                         "compiled": "decoding"}, k2, [target]),
            "hf_assisted": lambda: self._hf("hf_assisted", "assisted", {}, k2, [self.setup.draft, target]),
            "hf_prompt_lookup": lambda: self._hf("hf_prompt_lookup", "prompt_lookup", self.prompt_lookup_settings(),
                                                 k3 or k2, [self.setup.lookup, target]),  # fmt: skip
            "greedy": lambda: self._ours("greedy", "k2", "greedy"),
            "sd": lambda: self._ours("sd", "k2", "sd"),
            "pipespec_k2": lambda: self._ours("pipespec_k2", "k2", "pipespec"),
            "pipespec_k3": lambda: self._ours("pipespec_k3", "k3", "pipespec"),
            "auto": self._auto,
        }
        for name in self.wanted:
            if per_hierarchy(name) is not None:
                builders[name] = lambda name=name: self._ours(name, name, per_hierarchy(name)[0])
        for name in (self.llama.models if self.llama is not None else {}):
            builders[name] = lambda name=name: self.llama.make(name, System)
        systems = [builders[name]() for name in self.wanted if name not in self.skipped]
        if self.llama is not None:  # their outputs against HF greedy's, per prompt (settings["vs_reference"])
            self.llama.watch(systems, self.cfg["max_new_tokens"])
        return systems

    # ---- pre-passes ---------------------------------------------------------------------------
    def choose_settings(self, systems: list[System], prompts: list[list[int]], max_new: int) -> dict[str, Any]:
        """sd's (window, draft_confidence) and HF assisted's settings: the fastest on `prompts` (one candidate:
        no pre-pass). HF assisted's candidates include its confidence stop, so sd's do too."""
        out: dict[str, Any] = {"prompts": len(prompts)}
        for name, sd in self.sd.items():
            candidates = sd_candidates(self.cfg)
            best = 0
            if len(candidates) > 1:
                pipe, lead = self.pipes["k2" if name == "sd" else name], sd["max_lead"]
                best, rates = prepass(f"{name} (window, draft_confidence)", candidates,
                                      lambda wc, p, n: pipe.generate(p, n, strategy="sd", lookahead=wc[0], max_lead=lead,
                                                                     draft_confidence=wc[1], forget_outputs=True),
                                      prompts, max_new)  # fmt: skip
                out[name] = [{"window": w, "draft_confidence": c, "tokens_per_s": r}
                             for (w, c), r in zip(candidates, rates)]  # fmt: skip
            sd["lookahead"], sd["draft_confidence"] = candidates[best]
        if "hf_assisted" in self.wanted:
            candidates = list(self.cfg["hf"]["assisted"])
            best = 0
            if len(candidates) > 1:
                best, rates = prepass("HF assisted", candidates,
                                      lambda c, p, n: self.hf.generate(p, n, "assisted", assisted=c), prompts, max_new)
                out["hf_assisted"] = [{"settings": c, "tokens_per_s": r} for c, r in zip(candidates, rates)]
            self.assisted = candidates[best]
        for system in systems:
            if system.name in self.sd:
                system.settings = sd_settings(self.sd[system.name], sd_candidates(self.cfg), system.settings)
            if system.name == "hf_assisted":
                system.settings = dict(self.assisted)
        self.choose_threads(systems, prompts, max_new, out)
        return out

    def thread_candidates(self, name: str) -> list[int]:
        """The thread counts a system's pre-pass times: HF's `hf.threads`, our greedy's `greedy_threads`,
        llama.cpp's `llamacpp.threads`."""
        if name == "greedy":
            return self.greedy_thread_counts()
        if name in LLAMACPP_SYSTEMS:
            return list(self.cfg["llamacpp"]["threads"])
        return list(self.cfg["hf"]["threads"]) if name in HF_SYSTEMS else []

    def choose_threads(self, systems: list[System], prompts: list[list[int]], max_new: int, out: dict) -> None:
        """HF's systems and our greedy at the faster of their thread counts (after their other settings are
        chosen), timed interleaved on the pre-pass prompts; the choice is in each system's settings."""
        for system in systems:
            candidates = self.thread_candidates(system.name)
            best = 0
            if len(candidates) > 1:  # one candidate: it runs at that count (the report's machine line says which)
                best, rates = prepass(f"{system.name} threads", candidates,
                                      lambda t, p, n: system.run(p, n, threads=t), prompts, max_new)  # fmt: skip
                out[f"{system.name}_threads"] = [{"threads": t, "tokens_per_s": r} for t, r in zip(candidates, rates)]
                self.threads[system.name] = candidates[best]
                system.settings = {**system.settings, "threads": candidates[best]}
                if system.name == "greedy":  # it runs on the pipeline of that thread count: its stages' names
                    system.stages = list(self.greedy_pipe(candidates[best]).names)

    def compile_hf(self, systems: list[System], prompt: list[int], max_new: int) -> list[System]:
        """Compile hf_compiled's decoding step at every thread count its pre-pass times, before anything is timed
        (a changed thread count compiles again: timed, it would charge the compile to the call); the seconds per
        thread count and the graphs compiled are recorded. Where this machine cannot compile, the system is left
        out and `skipped` says why. The systems that go on."""
        from experiments.benchlib.hf import CompileUnavailable, compiled_graphs

        if not any(s.name == "hf_compiled" for s in systems):
            return systems
        seconds = {}
        try:
            for threads in self.thread_candidates("hf_compiled") or [None]:
                seconds[threads] = self.hf.compile_warmup(prompt, max_new, threads=threads)
        except CompileUnavailable as error:
            self.skipped["hf_compiled"] = f"cannot compile here: {error}"
            return [s for s in systems if s.name != "hf_compiled"]
        self.compile_s = sum(seconds.values())
        self.graphs_before_timing = compiled_graphs()
        by_threads = {str(t): round(s, 1) for t, s in seconds.items() if t is not None}
        for system in systems:
            if system.name == "hf_compiled":
                system.settings = {**system.settings, "compile_s": round(self.compile_s, 1),
                                   **({"compile_s_by_threads": by_threads} if by_threads else {})}  # fmt: skip
        return systems

    def recompiles(self) -> dict[str, int] | None:
        """hf_compiled's graphs: compiled before timing, and compiled again during the pre-pass and the timed
        passes (recompiles: zero expected); None without hf_compiled."""
        from experiments.benchlib.hf import compiled_graphs

        before = self.graphs_before_timing
        if before is None:
            return None
        return {"graphs_before_timing": before, "graphs_compiled_while_timed": compiled_graphs() - before}

    def processes(self) -> list[dict[str, Any]]:
        """Every process with its lifetime peak resident set."""
        out = [{"hierarchy": key, "stage": name, "pid": pid, "lifetime_peak_rss_mb": lifetime_peak_rss_mb(pid)}
               for key, pipe in self.pipes.items() for name, pid in zip(pipe.names, pipe.pids)]  # fmt: skip
        out.append({"hierarchy": None, "stage": "driver", "pid": os.getpid(),
                    "lifetime_peak_rss_mb": lifetime_peak_rss_mb(os.getpid())})  # fmt: skip
        return out
