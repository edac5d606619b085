"""HF `generate` vs pipespec on the same models, prompts and machine, in one invocation (issue 7).

    python -m experiments.bench                                   # conf/bench/default.yaml
    python -m experiments.bench samples=2 max_new_tokens=32 repetitions=1

Systems (config `systems`, run in that order, alternating per prompt within every
repetition: A B C A B C ...):

- `hf_greedy`: `target.generate(do_sample=False)` in this process (one torch thread)
- `hf_assisted`: the same with `assistant_model=` the k2 hierarchy's draft (the int8 SmolLM2)
- `hf_prompt_lookup`: the same with `prompt_lookup_num_tokens=` / `max_matching_ngram_size=`
  set from the prompt-lookup stage of the k3 hierarchy
- `greedy`, `sd` (at its best window), `pipespec_k2`: our pipeline of the k2 hierarchy
- `pipespec_k3`: our pipeline of the k3 hierarchy

`sd` runs at the window (and `draft_confidence`) that was fastest in a pre-pass over
`sd_windows` x `sd_draft_confidences` on the first `prepass_prompts` prompts; HF assisted
generation gets the same pre-pass over the `hf.assisted` settings (the first is
transformers' default, with its confidence stop). Both choices are recorded.

Outputs in the Hydra run directory: `bench.json` (the schema is in `write_outputs`),
`bench.md` (the tables, also printed) and `runs.json` (every run, with the stage
traces of our systems, for re-analysis).

Where the time goes (per stage, per generated token, pooled over a system's runs):
- compute: the sum of the stage's step durations (its forward passes);
- idle: trace wall time minus compute. For a verifier that is waiting for drafts, for
  a drafter waiting for a commit (it ran `max_lead` ahead), and for both the handling
  of control messages (pickling, gloo send/receive, adopting a commit, cache crops at
  rollbacks happen outside the timed steps). The traces time steps only, so waiting
  and message handling cannot be separated; `control_est` is an estimate: the number
  of gaps between steps times the 10th percentile of those gaps (a gap in which the
  stage did not wait at all is pure control work);
- rollback waste (drafters): tokens of this stage later removed by a rollback, times
  the stage's compute per produced token;
- rejected drafts (verifiers): drafts fed but rejected, times the marginal cost b of a
  fed token from the stage's fitted t(n);
- driver overhead: `generate`'s wall time minus the target's trace wall time (job
  dispatch, result and trace messages).

The ideal-pipeline bound of a run of one of our systems: no stage ever idles, and the
target verifies at every step as many drafts as the measured acceptance allows. With
the target's step cost fitted by least squares over its non-prefill steps,
t(n) = a + b n (n = tokens fed), m = mean drafts accepted per verification and f = mean
tokens fed per verification (both over non-prefill verify steps; m = 0 and f = the
mean fed when there are none), a run of T output tokens whose prefill step took t_0
and produced p tokens needs at least

    time_target = t_0 + (T - p) * t(f) / (m + 1)

of target compute, and each other stage i at least its measured compute busy_i. So

    bound = sum_runs T / sum_runs max(time_target, max_i busy_i)

and `binding_stage` names the stage whose total is largest. For `greedy` the bound is
the target's pure compute rate; for `sd` it is the pipeline its acceptance would allow.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean, median
from typing import Any, Callable, Mapping, Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import hydra  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from pipespec.errors import ConfigError  # noqa: E402
from pipespec.runner import cpu_info  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"
HF_SYSTEMS = ("hf_greedy", "hf_assisted", "hf_prompt_lookup")
OUR_SYSTEMS = ("greedy", "sd", "pipespec_k2", "pipespec_k3")
SYSTEMS = HF_SYSTEMS + OUR_SYSTEMS
TARGET_KEYS = (
    "greedy_vs_hf_greedy",
    "sd_vs_hf_assisted",
    "pipespec_k2_vs_hf_assisted",
    "pipespec_k2_vs_hf_greedy",
    "pipespec_k3_vs_hf_greedy",
    "pipespec_target_busy",
    "pipespec_vs_ideal",
)


class BenchConfigError(ConfigError):
    """A bench option is invalid; the message names it."""


# ---------------------------------------------------------------------------------------------
# configuration
# ---------------------------------------------------------------------------------------------
def _int(cfg: Mapping, key: str, low: int) -> int:
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise BenchConfigError(f"{key} must be an integer >= {low}, got {value!r}")
    return value


def check_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Validate the composed config (a plain dict); raise BenchConfigError with a one-line message."""
    from experiments.hf_baseline import assisted_settings

    cfg = dict(cfg)
    for key, low in (("samples", 1), ("max_new_tokens", 1), ("repetitions", 1), ("warmup_tokens", 0),
                     ("prepass_prompts", 1), ("random_prompt_length", 1)):
        _int(cfg, key, low)
    systems = cfg.get("systems")
    if not isinstance(systems, (list, tuple)) or not systems:
        raise BenchConfigError(f"systems must be a non-empty list of {list(SYSTEMS)}, got {systems!r}")
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        raise BenchConfigError(f"unknown system(s) {unknown} in systems; expected some of {list(SYSTEMS)}")
    if len(set(systems)) != len(systems):
        raise BenchConfigError(f"systems lists a system twice: {list(systems)}")
    windows = cfg.get("sd_windows")
    if "sd" in systems and (
        not isinstance(windows, (list, tuple)) or not windows
        or any(isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in windows)
    ):
        raise BenchConfigError(f"sd_windows must be a non-empty list of integers >= 1, got {windows!r}")
    stops = cfg.get("sd_draft_confidences", [0.0])
    if "sd" in systems and (
        not isinstance(stops, (list, tuple)) or not stops
        or any(isinstance(c, bool) or not isinstance(c, (int, float)) or not 0 <= c < 1 for c in stops)
    ):
        raise BenchConfigError(f"sd_draft_confidences must be a non-empty list of numbers in [0, 1), got {stops!r}")
    hierarchies = cfg.get("hierarchies") or {}
    for key in ("k2", "k3"):
        value = hierarchies.get(key)
        if not isinstance(value, (str, list, tuple)) or not value:
            raise BenchConfigError(
                f"hierarchies.{key} must be a hierarchy name in conf/models/ or a list of stages, got {value!r}"
            )
    if cfg.get("prompt_family") not in (None, "chat", "base"):
        raise BenchConfigError(f"prompt_family must be chat, base or null, got {cfg.get('prompt_family')!r}")
    dataset = cfg.get("dataset")
    if dataset != "random" and not (CONF / "dataset" / f"{dataset}.yaml").exists():
        names = sorted(p.stem for p in (CONF / "dataset").glob("*.yaml")) + ["random"]
        raise BenchConfigError(f"unknown dataset {dataset!r}; available: {names}")
    pipespec = cfg.get("pipespec") or {}
    if "lookahead" in pipespec:
        _int({"pipespec.lookahead": pipespec["lookahead"]}, "pipespec.lookahead", 0)
    if isinstance(pipespec.get("max_lead"), bool) or not isinstance(pipespec.get("max_lead"), int) or pipespec["max_lead"] < 1:
        raise BenchConfigError(f"pipespec.max_lead must be an integer >= 1, got {pipespec.get('max_lead')!r}")
    confidence = pipespec.get("draft_confidence", 0.0)
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0 <= confidence < 1:
        raise BenchConfigError(f"pipespec.draft_confidence must be a number in [0, 1) (0 = off), got {confidence!r}")
    hf = cfg.get("hf") or {}
    if isinstance(hf.get("threads"), bool) or not isinstance(hf.get("threads"), int) or hf["threads"] < 1:
        raise BenchConfigError(f"hf.threads must be an integer >= 1, got {hf.get('threads')!r}")
    assisted = hf.get("assisted")
    if isinstance(assisted, Mapping):
        assisted = [assisted]
    if "hf_assisted" in systems:
        if not isinstance(assisted, (list, tuple)) or not assisted:
            raise BenchConfigError("hf.assisted must be a non-empty list of assisted-generation settings")
        try:
            hf["assisted"] = [assisted_settings(a) for a in assisted]
        except ConfigError as error:
            raise BenchConfigError(f"hf.assisted: {error}") from None
    for key in ("prompt_lookup_num_tokens", "max_matching_ngram_size"):
        value = hf.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise BenchConfigError(f"hf.{key} must be null or an integer >= 1, got {value!r}")
    cfg["hf"] = hf
    targets = dict(cfg.get("targets") or {})
    bad = [k for k in targets if k not in TARGET_KEYS]
    if bad:
        raise BenchConfigError(f"unknown target(s) {bad}; expected some of {list(TARGET_KEYS)}")
    cfg["targets"] = targets
    return cfg


@dataclass
class Hierarchy:
    key: str
    stages: list  # StageSpec, smallest first
    family: str | None
    label: str


def resolve_hierarchy(key: str, value: str | Sequence) -> Hierarchy:
    from pipespec.hierarchies import read_hierarchy, resolve_stages

    if isinstance(value, str):
        data = read_hierarchy(value)
        stages, family, label = data["stages"], data.get("family"), value
    else:
        stages, family, label = list(value), None, f"{key}(explicit)"
    try:
        specs = resolve_stages(stages)
    except ConfigError as error:
        raise BenchConfigError(f"hierarchies.{key}: {error}") from None
    if len(specs) < 2:
        raise BenchConfigError(f"hierarchies.{key} needs at least 2 stages (drafters, then the target)")
    return Hierarchy(key, specs, family, label)


def same_target(a, b) -> bool:
    return (a.model, a.dtype, a.quantize, a.device) == (b.model, b.dtype, b.quantize, b.device)


def load_prompts(cfg: Mapping, tokenizer, context_length: int | None, family: str) -> list[list[int]]:
    """Prompt token ids: the first `samples` of the dataset, or random ids for `dataset=random`."""
    import yaml

    n, max_new = cfg["samples"], cfg["max_new_tokens"]
    if cfg["dataset"] == "random":
        from pipespec.tiny import random_prompts

        return random_prompts(n, length=cfg["random_prompt_length"], seed=0, vocab_size=len(tokenizer))
    from pipespec.data import build_prompt_ids, load_dataset

    data_cfg = yaml.safe_load((CONF / "dataset" / f"{cfg['dataset']}.yaml").read_text())
    data_cfg["n_samples"] = n
    dataset = load_dataset(data_cfg)
    context = context_length or 1_000_000
    prompts = [build_prompt_ids(s, data_cfg["prompt"], tokenizer, family, context, max_new)[0] for s in dataset.samples]
    if len(prompts) < n:
        raise BenchConfigError(f"dataset {cfg['dataset']!r} has only {len(prompts)} samples, samples={n}")
    return prompts


# ---------------------------------------------------------------------------------------------
# measurement helpers
# ---------------------------------------------------------------------------------------------
class PeakRSS:
    """Samples the RSS of the processes of the system now running; keeps the maximum per (system, pid)."""

    def __init__(self, interval_s: float = 0.05):
        self.interval_s = interval_s
        self.peaks: dict[tuple[str, int], int] = {}
        self._current: tuple[str, list[tuple[str, int]]] | None = None
        self._procs: dict[int, Any] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="bench-rss")

    def start(self) -> "PeakRSS":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(1.0)

    def set_current(self, system: str | None, processes: list[tuple[str, int]] | None = None) -> None:
        with self._lock:
            self._current = (system, list(processes or [])) if system else None
        self._sample()

    def _sample(self) -> None:
        import psutil

        with self._lock:
            current = self._current
        if current is None:
            return
        system, processes = current
        for _, pid in processes:
            try:
                proc = self._procs.get(pid) or self._procs.setdefault(pid, psutil.Process(pid))
                rss = proc.memory_info().rss
            except (psutil.Error, OSError):
                continue
            key = (system, pid)
            if rss > self.peaks.get(key, 0):
                self.peaks[key] = rss

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def report(self, system: str, processes: list[tuple[str, int]]) -> list[dict[str, Any]]:
        return [
            {"stage": label, "pid": pid, "peak_rss_mb": round(self.peaks.get((system, pid), 0) / 2**20, 1)}
            for label, pid in processes
        ]


def lifetime_peak_rss_mb(pid: int) -> float | None:
    """VmHWM: the process's peak resident set over its whole life (Linux), in MiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def fit_step_cost(fed: Sequence[float], seconds: Sequence[float]) -> tuple[float, float]:
    """Least-squares t(n) = a + b n over (tokens fed, step seconds); b = 0 when n never varies."""
    n = len(fed)
    if n == 0:
        return 0.0, 0.0
    mx, my = sum(fed) / n, sum(seconds) / n
    sxx = sum((x - mx) ** 2 for x in fed)
    if sxx <= 0:
        return my, 0.0
    b = sum((x - mx) * (y - my) for x, y in zip(fed, seconds)) / sxx
    if b < 0:  # noise on a narrow range of n: a flat cost is the honest fit
        return my, 0.0
    return my - b * mx, b


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    k = min(int(q * (len(ordered) - 1) + 0.5), len(ordered) - 1)
    return ordered[k]


def _durations(trace) -> list[float]:
    return [e - s for s, e in zip(trace.steps["t_start"], trace.steps["t_end"])]


def analyse_pipeline_runs(runs: Sequence, n_stages: int, names: Sequence[str]) -> dict[str, Any]:
    """Breakdown per stage and the ideal-pipeline bound over the runs (GenerationResults) of one system."""
    total_tokens = sum(len(r.tokens) for r in runs)
    per_token = (lambda seconds: 1000.0 * seconds / total_tokens) if total_tokens else (lambda seconds: None)
    target_index = n_stages - 1
    stage_rows: dict[int, dict[str, Any]] = {}
    # target fit and acceptance over non-prefill steps
    fit_fed, fit_dur, v_acc, v_fed, other_fed = [], [], [], [], []
    for run in runs:
        for trace in run.stage_traces:
            if trace.stage != target_index:
                continue
            st = trace.steps
            for j in range(1, trace.n_steps):
                fit_fed.append(st["fed"][j])
                fit_dur.append(st["t_end"][j] - st["t_start"][j])
                if st["kind"][j] == "verify":
                    v_acc.append(st["accepted"][j])
                    v_fed.append(st["fed"][j])
                else:
                    other_fed.append(st["fed"][j])
    a, b = fit_step_cost(fit_fed, fit_dur)
    m = mean(v_acc) if v_acc else 0.0
    f = mean(v_fed) if v_fed else (mean(other_fed) if other_fed else 1.0)
    t_step = a + b * f
    ideal_total, stage_ideal = 0.0, {i: 0.0 for i in range(n_stages)}
    driver_overhead = 0.0
    for run in runs:
        T = len(run.tokens)
        run_times = {}
        for trace in run.stage_traces:
            durations = _durations(trace)
            if trace.stage == target_index:
                if trace.n_steps:
                    t0, p = durations[0], trace.steps["produced"][0]
                else:
                    t0, p = 0.0, 0
                run_times[trace.stage] = t0 + max(T - p, 0) * t_step / (m + 1)
                driver_overhead += max(run.time_s - (trace.end_time - trace.start_time), 0.0)
            else:
                run_times[trace.stage] = sum(durations)
        for i, t in run_times.items():
            stage_ideal[i] += t
        ideal_total += max(run_times.values()) if run_times else run.time_s
    # breakdown per stage
    for i in range(n_stages):
        traces = [t for r in runs for t in r.stage_traces if t.stage == i]
        if not traces:
            continue
        busy = sum(sum(_durations(t)) for t in traces)
        wall = sum(t.end_time - t.start_time for t in traces)
        steps = sum(t.n_steps for t in traces)
        produced = sum(sum(t.steps["produced"]) for t in traces)
        rb_tokens = sum(sum(t.steps["rollback_tokens"]) + t.pending_rollback_tokens for t in traces)
        rollbacks = sum(sum(t.steps["rollbacks"]) + t.pending_rollbacks for t in traces)
        gaps = [
            t.steps["t_start"][j + 1] - t.steps["t_end"][j] for t in traces for j in range(t.n_steps - 1)
        ]
        idle = max(wall - busy, 0.0)
        control = min(len(gaps) * _percentile(gaps, 0.10), idle) if gaps else 0.0
        offered = sum(o for t in traces for o, k in zip(t.steps["offered"], t.steps["kind"]) if k == "verify")
        accepted = sum(a_ for t in traces for a_, k in zip(t.steps["accepted"], t.steps["kind"]) if k == "verify")
        verify_steps = sum(t.steps["kind"].count("verify") for t in traces)
        is_model = any(x > 0 for t in traces for x in t.steps["fed"])
        if i == target_index:
            sa, sb = a, b
        elif is_model:
            sa, sb = fit_step_cost(
                [t.steps["fed"][j] for t in traces for j in range(1, t.n_steps)],
                [t.steps["t_end"][j] - t.steps["t_start"][j] for t in traces for j in range(1, t.n_steps)],
            )
        else:
            sa, sb = None, None
        stage_rows[i] = {
            "stage": names[i] if i < len(names) else str(i),
            "steps": steps,
            "verify_steps": verify_steps,
            "produced": produced,
            "compute_ms_per_token": per_token(busy),
            "idle_ms_per_token": per_token(idle),
            "control_est_ms_per_token": per_token(control),
            "waiting_est_ms_per_token": per_token(idle - control),
            "rollbacks": rollbacks,
            "rollback_tokens": rb_tokens,
            "rollback_waste_ms_per_token": per_token(rb_tokens * busy / produced) if produced else None,
            "rejected_drafts": offered - accepted,
            "rejected_draft_ms_per_token": per_token((offered - accepted) * sb) if sb is not None else None,
            "busy_fraction": busy / wall if wall > 0 else None,
            "mean_accepted_per_verify": accepted / verify_steps if verify_steps else None,
            "step_cost_ms": {"a": 1000 * sa, "b": 1000 * sb} if sa is not None else None,
            "ideal_limit_tokens_per_s": total_tokens / stage_ideal[i] if stage_ideal[i] > 0 else None,
        }
    binding = max(stage_ideal, key=lambda i: stage_ideal[i]) if stage_ideal else target_index
    return {
        "stages": [stage_rows[i] for i in sorted(stage_rows)],
        "driver_overhead_ms_per_token": per_token(driver_overhead),
        "ideal": {
            "tokens_per_s": total_tokens / ideal_total if ideal_total > 0 else None,
            "binding_stage": names[binding] if binding < len(names) else str(binding),
            "target_step_cost_ms": {"a": 1000 * a, "b": 1000 * b},
            "accepted_per_verify": m,
            "fed_per_verify": f,
        },
    }


def analyse_hf_runs(runs: Sequence) -> dict[str, Any]:
    total_tokens = sum(len(r.tokens) for r in runs)
    per_token = (lambda seconds: 1000.0 * seconds / total_tokens) if total_tokens else (lambda seconds: None)
    target = sum(r.target_time_s for r in runs)
    draft = sum(r.draft_time_s for r in runs)
    wall = sum(r.time_s for r in runs)
    return {
        "stages": [
            {"stage": "driver: HF target forwards", "compute_ms_per_token": per_token(target),
             "steps": sum(r.target_calls for r in runs)},
            {"stage": "driver: HF assistant forwards", "compute_ms_per_token": per_token(draft),
             "steps": sum(r.draft_calls for r in runs)},
        ],
        "generate_overhead_ms_per_token": per_token(max(wall - target - draft, 0.0)),
    }


# ---------------------------------------------------------------------------------------------
# systems
# ---------------------------------------------------------------------------------------------
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


def _prepass(label: str, candidates: list, run_one: Callable, prompts: list[list[int]], max_new: int) -> tuple[int, list]:
    """Time each candidate on the pre-pass prompts; return (index of the fastest, [tokens/s per candidate])."""
    rates = []
    for candidate in candidates:
        tokens = seconds = 0.0
        for prompt in prompts:
            result = run_one(candidate, prompt, max_new)
            tokens += len(result.tokens)
            seconds += result.time_s
        rates.append(tokens / seconds if seconds > 0 else 0.0)
        print(f"[bench] pre-pass {label} {candidate}: {rates[-1]:.1f} tok/s", file=sys.stderr, flush=True)
    best = max(range(len(candidates)), key=lambda i: (rates[i], -i))
    return best, rates


def run_bench(cfg: Mapping[str, Any], out_dir: Path) -> dict[str, Any]:
    """Run the whole benchmark; write bench.json, bench.md and runs.json into out_dir; return the report."""
    import torch
    from tqdm import tqdm

    from pipespec.api import Pipeline
    from experiments.hf_baseline import HFBaseline
    from pipespec.models import context_length, load_tokenizer

    cfg = check_config(cfg)
    systems_wanted = list(cfg["systems"])
    k2 = resolve_hierarchy("k2", cfg["hierarchies"]["k2"])
    need_k3 = "pipespec_k3" in systems_wanted or "hf_prompt_lookup" in systems_wanted
    k3 = resolve_hierarchy("k3", cfg["hierarchies"]["k3"]) if need_k3 else None
    target_spec = k2.stages[-1]
    if k3 is not None and not same_target(k3.stages[-1], target_spec):
        raise BenchConfigError(
            f"hierarchies.k2 and hierarchies.k3 must end in the same target: {target_spec.label} vs {k3.stages[-1].label}"
        )
    draft_spec = k2.stages[0]
    if "hf_assisted" in systems_wanted and draft_spec.kind != "hf":
        raise BenchConfigError("hf_assisted needs a model as the first stage of hierarchies.k2 (the assistant)")
    lookup_spec = None
    for h in (k3, k2):
        if h is not None and lookup_spec is None:
            lookup_spec = next((s for s in h.stages if s.kind == "prompt_lookup"), None)
    if "hf_prompt_lookup" in systems_wanted and lookup_spec is None:
        raise BenchConfigError("hf_prompt_lookup needs a prompt_lookup stage in hierarchies.k3 (or k2)")

    tokenizer = load_tokenizer(target_spec.model)
    ctx = context_length(target_spec.model)
    family = cfg.get("prompt_family") or k2.family or "chat"
    prompts = load_prompts(cfg, tokenizer, ctx, family)
    max_new = cfg["max_new_tokens"]
    hf_cfg = cfg["hf"]
    torch.set_num_threads(hf_cfg["threads"])

    pipes: dict[str, Any] = {}
    hf = None
    rss = PeakRSS().start()
    try:
        # ---- set-up: pipelines (stage processes load in parallel) and the in-process HF models
        pipe_kwargs = dict(strategy="pipespec", lookahead=cfg["pipespec"].get("lookahead", 0),
                           max_lead=cfg["pipespec"]["max_lead"], stall_timeout_s=cfg["stall_timeout_s"])
        if any(s in systems_wanted for s in ("greedy", "sd", "pipespec_k2")):
            pipes["k2"] = Pipeline(k2.stages, **pipe_kwargs)
        if "pipespec_k3" in systems_wanted:
            pipes["k3"] = Pipeline(k3.stages, **pipe_kwargs)
        for pipe in pipes.values():
            pipe.start()
        if any(s in HF_SYSTEMS for s in systems_wanted):
            hf = HFBaseline(target_spec, draft_spec if "hf_assisted" in systems_wanted else None, hf_cfg["threads"])
        driver = [("driver (HF target" + (" + assistant)" if hf is not None and hf.draft is not None else ")"), os.getpid())]

        def pipe_processes(key):
            return lambda: list(zip(pipes[key].names, pipes[key].pids))

        pld = {
            "prompt_lookup_num_tokens": hf_cfg.get("prompt_lookup_num_tokens")
            or (lookup_spec.max_proposal if lookup_spec else 10),
            "max_matching_ngram_size": hf_cfg.get("max_matching_ngram_size")
            or (lookup_spec.ngram_size if lookup_spec else 2),
        }
        # chosen by the pre-passes below; the systems read them at every call
        state: dict[str, Any] = {"sd_window": (cfg.get("sd_windows") or [4])[0],
                                 "sd_draft_confidence": (cfg.get("sd_draft_confidences") or [0.0])[0],
                                 "assisted": (hf_cfg.get("assisted") or [None])[0]}
        look, lead = cfg["pipespec"].get("lookahead", 0), cfg["pipespec"]["max_lead"]
        confidence = cfg["pipespec"].get("draft_confidence", 0.0)
        pipespec_settings = {"strategy": "pipespec", "lookahead": look, "max_lead": lead, "draft_confidence": confidence}

        def hf_system(name, mode, settings, hierarchy, stages, **kwargs):
            def run(p, n):
                if mode == "assisted":
                    kwargs["assisted"] = state["assisted"]
                return hf.generate(p, n, mode, **kwargs)

            return System(name, run, lambda: driver, settings, hierarchy, stages, "hf")

        def our_system(name, key, strategy, settings, hierarchy):
            def run(p, n):
                if strategy == "sd":
                    return pipes[key].generate(p, n, strategy="sd", lookahead=state["sd_window"], max_lead=lead,
                                               draft_confidence=state["sd_draft_confidence"])
                return pipes[key].generate(p, n, strategy=strategy, lookahead=look, max_lead=lead,
                                           draft_confidence=confidence)

            return System(name, run, pipe_processes(key), settings, hierarchy.label, list(pipes[key].names))

        builders = {
            "hf_greedy": lambda: hf_system("hf_greedy", "greedy", {"do_sample": False}, k2.label, [target_spec.label]),
            "hf_assisted": lambda: hf_system("hf_assisted", "assisted", {}, k2.label,
                                             [draft_spec.label, target_spec.label]),
            "hf_prompt_lookup": lambda: hf_system("hf_prompt_lookup", "prompt_lookup", dict(pld), (k3 or k2).label,
                                                  [lookup_spec.label, target_spec.label], **pld),
            "greedy": lambda: our_system("greedy", "k2", "greedy", {"strategy": "greedy"}, k2),
            "sd": lambda: our_system("sd", "k2", "sd", {}, k2),
            "pipespec_k2": lambda: our_system("pipespec_k2", "k2", "pipespec", dict(pipespec_settings), k2),
            "pipespec_k3": lambda: our_system("pipespec_k3", "k3", "pipespec", dict(pipespec_settings), k3),
        }
        systems = [builders[name]() for name in systems_wanted]

        # ---- warm-up: one short untimed generation per system (first-call allocations)
        if cfg["warmup_tokens"] > 0:
            for system in systems:
                system.run(prompts[0], cfg["warmup_tokens"])

        # ---- pre-passes: sd window, HF assisted settings
        pre = prompts[: cfg["prepass_prompts"]]
        prepass: dict[str, Any] = {"prompts": len(pre)}
        if "sd" in systems_wanted:
            # (window, draft_confidence): HF assisted's candidates include its confidence stop, so sd's do too
            candidates = [(w, c) for c in cfg.get("sd_draft_confidences", [0.0]) for w in cfg["sd_windows"]]
            if len(candidates) > 1:
                best, rates = _prepass(
                    "sd (window, draft_confidence)", candidates,
                    lambda wc, p, n: pipes["k2"].generate(p, n, strategy="sd", lookahead=wc[0], draft_confidence=wc[1]),
                    pre, max_new,
                )
                prepass["sd"] = [{"window": w, "draft_confidence": c, "tokens_per_s": r}
                                 for (w, c), r in zip(candidates, rates)]
            else:
                best = 0
            state["sd_window"], state["sd_draft_confidence"] = candidates[best]
        if "hf_assisted" in systems_wanted:
            candidates = list(hf_cfg["assisted"])
            if len(candidates) > 1:
                best, rates = _prepass("HF assisted", candidates,
                                       lambda c, p, n: hf.generate(p, n, "assisted", assisted=c), pre, max_new)
                prepass["hf_assisted"] = [{"settings": c, "tokens_per_s": r} for c, r in zip(candidates, rates)]
            else:
                best = 0
            state["assisted"] = candidates[best]
        for system in systems:
            if system.name == "sd":
                system.settings = {"strategy": "sd", "window": state["sd_window"],
                                   "draft_confidence": state["sd_draft_confidence"],
                                   "chosen_from": list(cfg["sd_windows"]),
                                   "draft_confidences_tried": list(cfg.get("sd_draft_confidences", [0.0]))}
            if system.name == "hf_assisted":
                system.settings = dict(state["assisted"])

        # ---- timed repetitions: systems alternate per prompt
        bar = tqdm(total=cfg["repetitions"] * len(prompts) * len(systems), desc="bench", unit="run",
                   file=sys.stderr, disable=not cfg.get("progress", True))
        for rep in range(cfg["repetitions"]):
            for index, prompt in enumerate(prompts):
                for system in systems:
                    bar.set_postfix_str(f"rep {rep + 1} {system.name}", refresh=False)
                    rss.set_current(system.name, system.processes())
                    result = system.run(prompt, max_new)
                    rss.set_current(None)
                    system.runs.append((rep, index, result))
                    bar.update(1)
        bar.close()
        processes = []
        for key, pipe in pipes.items():
            processes += [{"hierarchy": key, "stage": name, "pid": pid, "lifetime_peak_rss_mb": lifetime_peak_rss_mb(pid)}
                          for name, pid in zip(pipe.names, pipe.pids)]
        processes.append({"hierarchy": None, "stage": "driver", "pid": os.getpid(),
                          "lifetime_peak_rss_mb": lifetime_peak_rss_mb(os.getpid())})
        report = summarize(cfg, systems, prompts, rss, prepass, k2, k3, family)
        report["processes"] = processes
    finally:
        rss.stop()
        for pipe in pipes.values():
            pipe.close()
        if hf is not None:
            hf.close()
    write_outputs(report, systems, out_dir)
    return report


# ---------------------------------------------------------------------------------------------
# summary
# ---------------------------------------------------------------------------------------------
def _machine_line(machine: Mapping[str, Any]) -> str:
    cpu = machine.get("cpu") or {}
    extensions = ", ".join(cpu.get("vector_extensions") or []) or "none listed"
    return (f"machine: {cpu.get('name', '?')} (family {cpu.get('family', '?')}, model {cpu.get('model', '?')}; "
            f"{extensions}), {machine.get('cpus')} CPUs, torch {machine.get('torch')}")


def _rate(results) -> float:
    seconds = sum(r.time_s for r in results)
    return sum(len(r.tokens) for r in results) / seconds if seconds > 0 else 0.0


def summarize(cfg, systems: list[System], prompts, rss: PeakRSS, prepass, k2, k3, family) -> dict[str, Any]:
    import torch
    import transformers

    by_name = {s.name: s for s in systems}
    reference_name = "hf_greedy" if "hf_greedy" in by_name else ("greedy" if "greedy" in by_name else None)
    reference = {}
    if reference_name:
        for rep, index, result in by_name[reference_name].runs:
            reference.setdefault(index, result.tokens)
    rows = []
    for system in systems:
        per_rep = [
            _rate([r for rep_, _, r in system.runs if rep_ == rep]) for rep in range(cfg["repetitions"])
        ]
        results = [r for _, _, r in system.runs]
        identical = sum(r.tokens == reference.get(i) for _, i, r in system.runs) if reference else None
        row: dict[str, Any] = {
            "name": system.name,
            "kind": system.kind,
            "hierarchy": system.hierarchy,
            "stages": list(system.stages),
            "settings": system.settings,
            "tokens_per_s_median": median(per_rep),
            "tokens_per_s_min": min(per_rep),
            "tokens_per_s_max": max(per_rep),
            "tokens_per_s_per_repetition": per_rep,
            "tokens_per_s_pooled": _rate(results),
            "runs": len(results),
            "tokens": sum(len(r.tokens) for r in results),
            "identical_to_greedy": f"{identical}/{len(results)}" if identical is not None else None,
            "identical_to_greedy_count": identical,
            "peak_rss_mb": rss.report(system.name, system.processes()),
        }
        if system.kind == "hf":
            stats = [r.verify_stats() for r in results]
            verifies = sum(s["verify_calls"] for s in stats)
            calls = sum(s["target_calls"] for s in stats)
            target_time = sum(r.target_time_s for r in results)
            wall = sum(r.time_s for r in results)
            row.update({
                "mean_accepted_per_verify": sum(s["accepted"] for s in stats) / verifies if verifies else None,
                "tokens_per_target_step": row["tokens"] / calls if calls else None,
                "target_busy_fraction": target_time / wall if wall > 0 else None,
                "ideal_bound_tokens_per_s": None,
                "fraction_of_bound": None,
                "breakdown": analyse_hf_runs(results),
            })
        else:
            n_stages = len(system.stages)
            breakdown = analyse_pipeline_runs(results, n_stages, system.stages)
            target_traces = [t for r in results for t in r.stage_traces if t.stage == n_stages - 1]
            verify = sum(t.steps["kind"].count("verify") for t in target_traces)
            accepted = sum(a for t in target_traces for a, k in zip(t.steps["accepted"], t.steps["kind"]) if k == "verify")
            busy = sum(sum(_durations(t)) for t in target_traces)
            wall = sum(t.end_time - t.start_time for t in target_traces)
            steps = sum(t.n_steps for t in target_traces)
            bound = breakdown["ideal"]["tokens_per_s"]
            row.update({
                "mean_accepted_per_verify": accepted / verify if verify else None,
                "tokens_per_target_step": row["tokens"] / steps if steps else None,
                "target_busy_fraction": busy / wall if wall > 0 else None,
                "ideal_bound_tokens_per_s": bound,
                "fraction_of_bound": row["tokens_per_s_pooled"] / bound if bound else None,
                "breakdown": breakdown,
            })
            if system.name == "pipespec_k3" or n_stages > 2:
                row["pairs"] = [
                    {"stage": s["stage"], "mean_accepted_per_verify": s["mean_accepted_per_verify"]}
                    for s in breakdown["stages"] if s["verify_steps"]
                ]
        rows.append(row)
    medians = {r["name"]: r["tokens_per_s_median"] for r in rows}
    for row in rows:
        for base in ("hf_greedy", "hf_assisted"):
            row[f"ratio_vs_{base}"] = row["tokens_per_s_median"] / medians[base] if medians.get(base) else None
    notes = [
        "tokens/s per repetition = output tokens / generate wall time over all prompts of that repetition; "
        "median, min and max over repetitions.",
        f"identical_to_greedy compares every run's tokens with {reference_name} on the same prompt (first repetition)."
        if reference_name else "identical_to_greedy: no greedy system ran, nothing to compare with.",
        "Our traces time forward passes only: idle time (wall - compute) mixes waiting for drafts / commits with "
        "control-message handling; control_est is an estimate (gaps between steps x their 10th percentile).",
        "HF systems run in the driver process: their peak RSS is the driver's, with every model it holds.",
        "HF prompt lookup continues the first (leftmost) n-gram match; our prompt-lookup stage the latest one.",
    ]
    assisted = by_name["hf_assisted"].settings if "hf_assisted" in by_name else {}
    if assisted.get("assistant_confidence_threshold"):
        try:
            import sklearn  # noqa: F401

            adaptive = True
        except ImportError:
            adaptive = False
        notes.append(
            "HF assisted: the assistant stops drafting below confidence "
            f"{assisted['assistant_confidence_threshold']}"
            + (" (adapted during generation: scikit-learn is installed)." if adaptive
               else " (fixed: transformers adapts it only when scikit-learn is installed, and it is not).")
        )
    if cfg["repetitions"] < 3:
        notes.append(f"only {cfg['repetitions']} repetition(s): min-max spread is not meaningful (issue asks >= 3).")
    report = {
        "config": {k: v for k, v in cfg.items() if k != "hydra"},
        "machine": {
            "cpu": cpu_info(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "torch_threads_driver": torch.get_num_threads(),
        },
        "hierarchies": {
            "k2": {"name": k2.label, "stages": [s.label for s in k2.stages]},
            "k3": {"name": k3.label, "stages": [s.label for s in k3.stages]} if k3 else None,
        },
        "prompts": {"n": len(prompts), "dataset": cfg["dataset"], "family": family,
                    "lengths": [len(p) for p in prompts]},
        "max_new_tokens": cfg["max_new_tokens"],
        "repetitions": cfg["repetitions"],
        "reference": reference_name,
        "prepass": prepass,
        "sd_best_window": by_name["sd"].settings.get("window") if "sd" in by_name else None,
        "sd_best_draft_confidence": by_name["sd"].settings.get("draft_confidence") if "sd" in by_name else None,
        "hf_assisted_settings": by_name["hf_assisted"].settings if "hf_assisted" in by_name else None,
        "systems": rows,
        "notes": notes,
    }
    report["targets"] = check_targets(rows, cfg["targets"])
    return report


def _fmt(value, spec=".1f", none="-"):
    return none if value is None else format(value, spec)


def explain(row: Mapping[str, Any] | None) -> str:
    """One line from a system's breakdown: where its time per token goes."""
    if row is None:
        return "system not run"
    ms = 1000.0 / row["tokens_per_s_pooled"] if row.get("tokens_per_s_pooled") else None
    parts = [f"{row['name']}: {_fmt(ms)} ms/token"]
    bd = row.get("breakdown") or {}
    if row["kind"] == "hf":
        st = bd.get("stages", [])
        parts.append(f"target fwd {_fmt(st[0]['compute_ms_per_token'])}")
        if st[1]["steps"]:
            parts.append(f"assistant fwd {_fmt(st[1]['compute_ms_per_token'])}")
        parts.append(f"generate overhead {_fmt(bd.get('generate_overhead_ms_per_token'))}")
    else:
        target = bd["stages"][-1]
        parts.append(f"target compute {_fmt(target['compute_ms_per_token'])}, idle {_fmt(target['idle_ms_per_token'])} "
                     f"(control est {_fmt(target['control_est_ms_per_token'])})")
        if target.get("rejected_draft_ms_per_token"):
            parts.append(f"rejected drafts {_fmt(target['rejected_draft_ms_per_token'])}")
        for s in bd["stages"][:-1]:
            parts.append(f"{s['stage']} compute {_fmt(s['compute_ms_per_token'])} idle {_fmt(s['idle_ms_per_token'])}"
                         f" rollback waste {_fmt(s['rollback_waste_ms_per_token'])}")
        parts.append(f"driver {_fmt(bd.get('driver_overhead_ms_per_token'))}")
        ideal = bd["ideal"]
        parts.append(f"bound {_fmt(ideal['tokens_per_s'])} tok/s (binding {ideal['binding_stage']})")
    parts.append(f"accepted/verify {_fmt(row.get('mean_accepted_per_verify'), '.2f')}")
    parts.append(f"target busy {_fmt(row.get('target_busy_fraction'), '.0%')}")
    return "; ".join(parts)


def check_targets(rows: list[dict], thresholds: Mapping[str, float]) -> list[dict[str, Any]]:
    by = {r["name"]: r for r in rows}

    def ratio(a, b):
        if a in by and b in by and by[b]["tokens_per_s_median"]:
            return by[a]["tokens_per_s_median"] / by[b]["tokens_per_s_median"]
        return None

    checks = []
    specs = [
        ("greedy_vs_hf_greedy", "our greedy / HF greedy", lambda: ratio("greedy", "hf_greedy"), ["greedy", "hf_greedy"]),
        ("sd_vs_hf_assisted", "our sd / HF assisted", lambda: ratio("sd", "hf_assisted"), ["sd", "hf_assisted"]),
        ("pipespec_k2_vs_hf_assisted", "pipespec k=2 / HF assisted", lambda: ratio("pipespec_k2", "hf_assisted"),
         ["pipespec_k2", "hf_assisted"]),
        ("pipespec_k2_vs_hf_greedy", "pipespec k=2 / HF greedy", lambda: ratio("pipespec_k2", "hf_greedy"),
         ["pipespec_k2", "hf_greedy"]),
        ("pipespec_k3_vs_hf_greedy", "pipespec k=3 / HF greedy", lambda: ratio("pipespec_k3", "hf_greedy"),
         ["pipespec_k3", "hf_greedy"]),
    ]
    for key, label, value, involved in specs:
        if key in thresholds:
            checks.append((key, label, value(), thresholds[key], involved))
    for name in ("pipespec_k2", "pipespec_k3"):
        if name in by:
            if "pipespec_target_busy" in thresholds:
                checks.append(("pipespec_target_busy", f"{name} target busy fraction",
                               by[name]["target_busy_fraction"], thresholds["pipespec_target_busy"], [name]))
            if "pipespec_vs_ideal" in thresholds:
                checks.append(("pipespec_vs_ideal", f"{name} measured / ideal-pipeline bound",
                               by[name]["fraction_of_bound"], thresholds["pipespec_vs_ideal"], [name]))
    out = []
    for key, label, value, threshold, involved in checks:
        met = None if value is None else value >= threshold
        out.append({
            "target": key,
            "label": label,
            "value": value,
            "threshold": threshold,
            "met": met,
            "why": None if met else " | ".join(explain(by.get(n)) for n in involved),
        })
    return out


def format_markdown(report: Mapping[str, Any]) -> str:
    rows = report["systems"]
    lines = [
        f"# Bench: {report['prompts']['n']} {report['prompts']['dataset']} prompts, "
        f"{report['max_new_tokens']} new tokens, {report['repetitions']} repetition(s)",
        "",
        f"k2 = {report['hierarchies']['k2']['name']} ({' -> '.join(report['hierarchies']['k2']['stages'])})"
        + (f"; k3 = {report['hierarchies']['k3']['name']} ({' -> '.join(report['hierarchies']['k3']['stages'])})"
           if report["hierarchies"]["k3"] else ""),
        f"sd window: {report['sd_best_window']} (draft_confidence {report.get('sd_best_draft_confidence', 0.0)}); "
        f"HF assisted: {report['hf_assisted_settings']}",
        _machine_line(report["machine"]),
        "",
        "| system | tok/s median | min-max | x HF greedy | x HF assisted | accepted/verify | tokens/target step "
        "| target busy | ideal bound tok/s | of bound | identical | peak RSS MB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        rss = ", ".join(f"{_fmt(p['peak_rss_mb'], '.0f')}" for p in r["peak_rss_mb"])
        lines.append(
            f"| {r['name']} | {r['tokens_per_s_median']:.1f} | {r['tokens_per_s_min']:.1f}-{r['tokens_per_s_max']:.1f} "
            f"| {_fmt(r['ratio_vs_hf_greedy'], '.2f')} | {_fmt(r['ratio_vs_hf_assisted'], '.2f')} "
            f"| {_fmt(r['mean_accepted_per_verify'], '.2f')} | {_fmt(r['tokens_per_target_step'], '.2f')} "
            f"| {_fmt(r['target_busy_fraction'], '.0%')} | {_fmt(r['ideal_bound_tokens_per_s'])} "
            f"| {_fmt(r['fraction_of_bound'], '.0%')} | {r['identical_to_greedy'] or '-'} | {rss} |"
        )
    lines += [
        "",
        "## Where the time goes (ms per generated token)",
        "",
        "| system | stage | compute | idle | of which control (est.) | rollback waste | rejected drafts "
        "| steps | rollbacks | t(n) = a + b n, ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        bd = r["breakdown"]
        for s in bd["stages"]:
            cost = s.get("step_cost_ms")
            lines.append(
                f"| {r['name']} | {s['stage']} | {_fmt(s.get('compute_ms_per_token'))} | {_fmt(s.get('idle_ms_per_token'))} "
                f"| {_fmt(s.get('control_est_ms_per_token'))} | {_fmt(s.get('rollback_waste_ms_per_token'))} "
                f"| {_fmt(s.get('rejected_draft_ms_per_token'))} | {s.get('steps', '-')} | {s.get('rollbacks', '-')} "
                f"| {(_fmt(cost['a']) + ' + ' + _fmt(cost['b'], '.2f') + ' n') if cost else '-'} |"
            )
        extra = bd.get("driver_overhead_ms_per_token", bd.get("generate_overhead_ms_per_token"))
        what = "driver / messages" if r["kind"] != "hf" else "generate() outside forwards"
        lines.append(f"| {r['name']} | {what} | {_fmt(extra)} | | | | | | | |")
    if report.get("targets"):
        lines += ["", "## Targets", "", "| target | value | needed | met | why (when missed) |", "|---|---|---|---|---|"]
        for t in report["targets"]:
            met = "-" if t["met"] is None else ("yes" if t["met"] else "NO")
            lines.append(f"| {t['label']} | {_fmt(t['value'], '.2f')} | {t['threshold']:.2f} | {met} | {t['why'] or ''} |")
    lines += ["", "## Notes", ""] + [f"- {n}" for n in report["notes"]]
    return "\n".join(lines) + "\n"


def _result_record(system: System, rep: int, index: int, result) -> dict[str, Any]:
    record = {"system": system.name, "repetition": rep, "prompt": index, "tokens": result.tokens, "time_s": result.time_s}
    if system.kind == "hf":
        record.update({"target_fed": result.target_fed, "target_time_s": result.target_time_s,
                       "draft_calls": result.draft_calls, "draft_time_s": result.draft_time_s})
    else:
        record["stage_traces"] = [t.to_dict() for t in result.stage_traces]
    return record


def write_outputs(report: Mapping[str, Any], systems: list[System], out_dir: Path) -> None:
    """bench.json: {config, machine, hierarchies, prompts, max_new_tokens, repetitions, reference, prepass,
    sd_best_window, hf_assisted_settings, systems: [{name, tokens_per_s_median/min/max, identical_to_greedy,
    ratio_vs_hf_greedy, ratio_vs_hf_assisted, mean_accepted_per_verify, target_busy_fraction,
    ideal_bound_tokens_per_s, fraction_of_bound, peak_rss_mb: [...], breakdown: {...}, ...}], targets, notes,
    processes}; bench.md: the tables; runs.json: every run."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench.json").write_text(json.dumps(report, indent=2, default=str))
    (out_dir / "bench.md").write_text(format_markdown(report))
    runs = [_result_record(s, rep, i, r) for s in systems for rep, i, r in s.runs]
    (out_dir / "runs.json").write_text(json.dumps(runs, default=str))


@hydra.main(version_base="1.3", config_path="../conf/bench", config_name="default")
def main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    from pipespec.errors import StageError
    from pipespec.data import DataError

    out_dir = Path(HydraConfig.get().runtime.output_dir)
    plain = OmegaConf.to_container(cfg, resolve=True)
    try:
        report = run_bench(plain, out_dir)
    except (ConfigError, StageError, DataError) as error:
        print(f"error: {str(error).splitlines()[0] if str(error) else type(error).__name__}", file=sys.stderr)
        sys.exit(2)
    print(format_markdown(report))
    print(f"[bench] wrote {out_dir / 'bench.json'}, {out_dir / 'bench.md'}", file=sys.stderr)


if __name__ == "__main__":
    main()
