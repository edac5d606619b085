"""The bench's report: per-stage breakdown, the ideal-pipeline bound, the tables and the output files.

Counts and times per stage are pooled with `pipespec.stats.StageStats`; step costs
t(n) = a + b n are `analysis.fit.fit_step_cost`'s least-squares fit (the one fit).
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from statistics import mean, median
from typing import Any, Mapping, Sequence

from analysis.fit import fit_step_cost
from experiments.benchlib.config import FIXED_SYSTEMS, HF_GREEDY_SYSTEMS, is_sd, is_speculative
from experiments.benchlib.intervals import add_paired_ratios, ratio_cell, worst_cell
from pipespec.models import resolved_kernels
from experiments.machine import cpu_info
from pipespec.stats import StageStats, pool


def step_cost(fed: Sequence[float], seconds: Sequence[float]) -> tuple[float, float]:
    """(a, b) of t(n) = a + b n by `analysis.fit.fit_step_cost`; (0, 0) without steps."""
    if not fed:
        return 0.0, 0.0
    cost = fit_step_cost(fed, seconds)
    return cost.fixed, cost.per_token


def _durations(trace) -> list[float]:
    return [e - s for s, e in zip(trace.steps["t_start"], trace.steps["t_end"])]


def _decode_steps(traces) -> tuple[list[int], list[float]]:
    """(tokens fed, seconds) of every step after each trace's first (the prefill)."""
    steps = [(t.steps["fed"][j], t.steps["t_end"][j] - t.steps["t_start"][j]) for t in traces for j in range(1, t.n_steps)]
    return [f for f, _ in steps], [d for _, d in steps]


def stage_stats(runs: Sequence, stage: int) -> StageStats:
    """One stage's counts and times pooled over the runs (GenerationResults) of one system."""
    return pool(StageStats.from_trace(t, len(r.tokens)) for r in runs for t in r.stage_traces if t.stage == stage)


def ideal_bound(runs: Sequence, n_stages: int) -> dict[str, Any]:
    """The ideal-pipeline bound (bench.py's docstring): per-run stage times if no stage ever idled."""
    target = n_stages - 1
    traces = [t for r in runs for t in r.stage_traces if t.stage == target]
    a, b = step_cost(*_decode_steps(traces))
    later = [(t.steps["kind"][j], t.steps["accepted"][j], t.steps["fed"][j]) for t in traces for j in range(1, t.n_steps)]
    verify = [(acc, fed) for kind, acc, fed in later if kind == "verify"]
    m = mean(acc for acc, _ in verify) if verify else 0.0
    f = mean(fed for _, fed in verify) if verify else (mean(fed for _, _, fed in later) if later else 1.0)
    total, per_stage, driver = 0.0, {i: 0.0 for i in range(n_stages)}, 0.0
    for run in runs:
        times = {}
        for trace in run.stage_traces:
            durations = _durations(trace)
            if trace.stage == target:
                t0, p = (durations[0], trace.steps["produced"][0]) if trace.n_steps else (0.0, 0)
                times[trace.stage] = t0 + max(len(run.tokens) - p, 0) * (a + b * f) / (m + 1)
                driver += max(run.time_s - (trace.end_time - trace.start_time), 0.0)
            else:
                times[trace.stage] = sum(durations)
        for i, t in times.items():
            per_stage[i] += t
        total += max(times.values()) if times else run.time_s
    return {"total_s": total, "per_stage_s": per_stage, "driver_s": driver, "a": a, "b": b, "m": m, "f": f}


def analyse_pipeline_runs(runs: Sequence, n_stages: int, names: Sequence[str]) -> dict[str, Any]:
    """Breakdown per stage and the ideal-pipeline bound over the runs (GenerationResults) of one system."""
    total_tokens = sum(len(r.tokens) for r in runs)
    per_token = (lambda seconds: 1000.0 * seconds / total_tokens) if total_tokens else (lambda seconds: None)
    ideal = ideal_bound(runs, n_stages)
    rows = []
    for i in range(n_stages):
        traces = [t for r in runs for t in r.stage_traces if t.stage == i]
        if not traces:
            continue
        stats = stage_stats(runs, i)
        gaps = [t.steps["t_start"][j + 1] - t.steps["t_end"][j] for t in traces for j in range(t.n_steps - 1)]
        idle = max(stats.wall_s - stats.busy_s, 0.0)
        control = min(len(gaps) * _percentile(gaps, 0.10), idle) if gaps else 0.0
        if i == n_stages - 1:
            cost = (ideal["a"], ideal["b"])
        elif any(x > 0 for t in traces for x in t.steps["fed"]):
            cost = step_cost(*_decode_steps(traces))
        else:
            cost = None  # prompt lookup: no forward passes
        rejected = stats.offered - stats.accepted
        limit = ideal["per_stage_s"][i]
        rows.append({
            "stage": names[i] if i < len(names) else str(i),
            "steps": stats.steps,
            "verify_steps": stats.verify_steps,
            "produced": stats.produced,
            "compute_ms_per_token": per_token(stats.busy_s),
            "idle_ms_per_token": per_token(idle),
            "control_est_ms_per_token": per_token(control),
            "waiting_est_ms_per_token": per_token(idle - control),
            "rollbacks": stats.rollbacks,
            "rollback_tokens": stats.rollback_tokens,
            "rollback_waste_ms_per_token": per_token(stats.rollback_tokens * stats.busy_s / stats.produced)
            if stats.produced else None,
            "rejected_drafts": rejected,
            "rejected_draft_ms_per_token": per_token(rejected * cost[1]) if cost is not None else None,
            "busy_fraction": stats.busy_fraction,
            "mean_acceptance_length": stats.mean_acceptance_length,
            "draft_acceptance_rate": stats.draft_acceptance_rate,
            "step_cost_ms": {"a": 1000 * cost[0], "b": 1000 * cost[1]} if cost is not None else None,
            "ideal_limit_tokens_per_s": total_tokens / limit if limit > 0 else None,
        })  # fmt: skip
    per_stage = ideal["per_stage_s"]
    binding = max(per_stage, key=lambda i: per_stage[i]) if per_stage else n_stages - 1
    return {
        "stages": rows,
        "target": stage_stats(runs, n_stages - 1),
        "driver_overhead_ms_per_token": per_token(ideal["driver_s"]),
        "ideal": {
            "tokens_per_s": total_tokens / ideal["total_s"] if ideal["total_s"] > 0 else None,
            "binding_stage": names[binding] if binding < len(names) else str(binding),
            "target_step_cost_ms": {"a": 1000 * ideal["a"], "b": 1000 * ideal["b"]},
            "accepted_per_verify": ideal["m"],
            "fed_per_verify": ideal["f"],
        },
    }


def analyse_hf_runs(runs: Sequence, engine: str = "HF") -> dict[str, Any]:
    """The breakdown of runs made in the driver process by `engine` (HF generate, or llama.cpp)."""
    total_tokens = sum(len(r.tokens) for r in runs)
    per_token = (lambda seconds: 1000.0 * seconds / total_tokens) if total_tokens else (lambda seconds: None)
    target = pool(r.target_stats() for r in runs)
    draft = sum(r.draft_time_s for r in runs)
    return {
        "stages": [
            {"stage": f"driver: {engine} target forwards", "compute_ms_per_token": per_token(target.busy_s),
             "steps": target.steps},
            {"stage": f"driver: {engine} draft forwards", "compute_ms_per_token": per_token(draft),
             "steps": sum(r.draft_calls for r in runs)},
        ],
        "target": target,
        "generate_overhead_ms_per_token": per_token(max(target.wall_s - target.busy_s - draft, 0.0)),
    }


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    k = min(int(q * (len(ordered) - 1) + 0.5), len(ordered) - 1)
    return ordered[k]


def _machine_line(machine: Mapping[str, Any]) -> str:
    cpu = machine.get("cpu") or {}
    extensions = ", ".join(cpu.get("vector_extensions") or []) or "none listed"
    return (f"machine: {cpu.get('name', '?')} (family {cpu.get('family', '?')}, model {cpu.get('model', '?')}; "
            f"{extensions}), {machine.get('cpus')} CPUs, torch {machine.get('torch')}")


def prompt_source(cfg: Mapping[str, Any]) -> str:
    return "random" if cfg.get("random_prompt_length") else cfg["dataset"]["name"]


def _rate(results) -> float:
    seconds = sum(r.time_s for r in results)
    return sum(len(r.tokens) for r in results) / seconds if seconds > 0 else 0.0


def _hierarchy_entry(hierarchy) -> dict[str, Any]:
    """A hierarchy as the report records it: its name, stage labels and the kernels each stage runs."""
    return {"name": hierarchy.label, "stages": [s.label for s in hierarchy.stages],
            "kernels": [resolved_kernels(s) for s in hierarchy.stages]}  # fmt: skip


def _settings(by_name: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    """The settings system `name` ran with; None when it did not run."""
    return by_name[name].settings if name in by_name else None


def _reference(by_name: Mapping[str, Any]) -> tuple[str | None, dict[int, list[int]]]:
    """The system every output is compared with (HF greedy, else our greedy, else None) and its first
    output per prompt index."""
    name = "hf_greedy" if "hf_greedy" in by_name else ("greedy" if "greedy" in by_name else None)
    tokens: dict[int, list[int]] = {}
    if name:
        for _, index, result in by_name[name].runs:
            tokens.setdefault(index, result.tokens)
    return name, tokens


def _rate_fields(system, repetitions: int, reference: Mapping[int, list[int]], rss) -> dict[str, Any]:
    """The first fields of a system's row: its rates per repetition and pooled, counts, agreement with the
    reference and peak RSS per process."""
    per_rep = [_rate([r for rep_, _, r in system.runs if rep_ == rep]) for rep in range(repetitions)]
    results = [r for _, _, r in system.runs]
    identical = sum(r.tokens == reference.get(i) for _, i, r in system.runs) if reference else None
    return {
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


def _breakdown_fields(system, tokens: int, pooled_rate: float) -> dict[str, Any]:
    """The rest of a system's row: the target's acceptance and busy fraction, the ideal-pipeline bound, the
    per-stage breakdown and (pipelines of 3 or more stages) each verifying stage's acceptance."""
    results = [r for _, _, r in system.runs]
    if system.kind == "hf":
        breakdown, bound = analyse_hf_runs(results, "llama.cpp" if system.hierarchy == "llama.cpp" else "HF"), None
    else:
        breakdown = analyse_pipeline_runs(results, len(system.stages), system.stages)
        bound = breakdown["ideal"]["tokens_per_s"]
    target: StageStats = breakdown.pop("target")
    fields = {
        "mean_acceptance_length": target.mean_acceptance_length,
        "draft_acceptance_rate": target.draft_acceptance_rate,
        "tokens_per_target_step": tokens / target.steps if target.steps else None,
        "target_busy_fraction": target.busy_fraction,
        "ideal_bound_tokens_per_s": bound,
        "fraction_of_bound": pooled_rate / bound if bound else None,
        "breakdown": breakdown,
    }
    if system.kind != "hf" and len(system.stages) > 2:
        fields["pairs"] = [
            {key: s[key] for key in ("stage", "mean_acceptance_length", "draft_acceptance_rate")}
            for s in breakdown["stages"] if s["verify_steps"]
        ]
    return fields


def system_row(system, repetitions: int, reference: Mapping[int, list[int]], rss) -> dict[str, Any]:
    """A system's row of the report (its `ratio_vs_*` fields come from `_add_ratios`, over all rows)."""
    row = _rate_fields(system, repetitions, reference, rss)
    row.update(_breakdown_fields(system, row["tokens"], row["tokens_per_s_pooled"]))
    return row


def fastest_hf_greedy(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """The faster (median tokens/s) of HF greedy and HF's compiled greedy that ran: every headline ratio's base."""
    found = [r for r in rows if r["name"] in HF_GREEDY_SYSTEMS and r.get("tokens_per_s_median")]
    return max(found, key=lambda r: r["tokens_per_s_median"])["name"] if found else None


def _add_ratios(rows: list[dict[str, Any]]) -> None:
    """Each row's median rate over the fastest HF greedy's (`fastest_hf_greedy`, named in the report) and HF
    assisted's (None where that system did not run)."""
    medians = {r["name"]: r["tokens_per_s_median"] for r in rows}
    bases = {"hf_greedy": fastest_hf_greedy(rows), "hf_assisted": "hf_assisted"}
    for row in rows:
        for key, base in bases.items():
            row[f"ratio_vs_{key}"] = row["tokens_per_s_median"] / medians[base] if medians.get(base) else None


def _assisted_note(threshold: float) -> str:
    """What HF assisted does with its confidence threshold here (transformers adapts it with scikit-learn only)."""
    try:
        import sklearn  # noqa: F401

        adaptive = True
    except ImportError:
        adaptive = False
    return ("HF assisted: the assistant stops drafting below confidence "
            f"{threshold}"
            + (" (adapted during generation: scikit-learn is installed)." if adaptive
               else " (fixed: transformers adapts it only when scikit-learn is installed, and it is not)."))


def _notes(repetitions: int, by_name: Mapping[str, Any], reference_name: str | None) -> list[str]:
    """The report's notes: how its numbers are made, and what this run's settings mean for them."""
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
    assisted = _settings(by_name, "hf_assisted") or {}
    if assisted.get("assistant_confidence_threshold"):
        notes.append(_assisted_note(assisted["assistant_confidence_threshold"]))
    if repetitions < 3:
        notes.append(f"only {repetitions} repetition(s): min-max spread is not meaningful (3 or more give one).")
    return notes


def _machine() -> dict[str, Any]:
    """The driver's machine: CPU, core count, platform and the versions of Python, torch and transformers."""
    import torch
    import transformers

    return {
        "cpu": cpu_info(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch_threads_driver": torch.get_num_threads(),
    }


def summarize(cfg, systems: list, prompts, rss, prepass, k2, k3, family, more=None) -> dict[str, Any]:
    """The report: a row per system (rates over repetitions, identical counts, acceptance, bound), targets, notes."""
    by_name = {s.name: s for s in systems}
    reference_name, reference = _reference(by_name)
    rows = [system_row(system, cfg["repetitions"], reference, rss) for system in systems]
    _add_ratios(rows)
    add_paired_ratios(rows, systems, fastest_hf_greedy(rows))
    sd = _settings(by_name, "sd") or {}
    return {
        "config": {k: v for k, v in cfg.items() if k != "hydra"},
        "machine": _machine(),
        "hierarchies": {"k2": _hierarchy_entry(k2), "k3": _hierarchy_entry(k3) if k3 else None,
                        **{name: _hierarchy_entry(h) for name, h in (more or {}).items()}},
        "hf_kernels": cfg["hf"]["kernels"],
        "prompts": {"n": len(prompts), "dataset": prompt_source(cfg), "family": family,
                    "offset": cfg.get("prompt_offset") or 0, "lengths": [len(p) for p in prompts]},
        "max_new_tokens": cfg["max_new_tokens"],
        "repetitions": cfg["repetitions"],
        "reference": reference_name,
        "hf_greedy_reference": fastest_hf_greedy(rows),  # the base of every "x HF greedy" ratio
        "prepass": prepass,
        "sd_best_window": sd.get("window"),
        "sd_best_draft_confidence": sd.get("draft_confidence"),
        "hf_assisted_settings": _settings(by_name, "hf_assisted"),
        "auto": _settings(by_name, "auto"),
        "systems": rows,
        "notes": _notes(cfg["repetitions"], by_name, reference_name),
        "targets": check_targets(rows, cfg["targets"]),
    }


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
    parts.append(f"acceptance length {_fmt(row.get('mean_acceptance_length'), '.2f')}")
    parts.append(f"target busy {_fmt(row.get('target_busy_fraction'), '.0%')}")
    return "; ".join(parts)


def check_targets(rows: list[dict], thresholds: Mapping[str, float]) -> list[dict[str, Any]]:
    """Each target's ratio; "HF greedy" is the fastest HF greedy of the run (`fastest_hf_greedy`), named."""
    fastest = fastest_hf_greedy(rows)
    by = {r["name"]: r for r in rows}
    if fastest is not None:  # every "vs hf_greedy" target is against the fastest HF greedy: named in its label
        by = {**by, "hf_greedy": by[fastest]}

    def ratio(a, b):
        if a in by and b in by and by[b]["tokens_per_s_median"]:
            return by[a]["tokens_per_s_median"] / by[b]["tokens_per_s_median"]
        return None

    checks = []
    specs = [
        ("greedy_vs_hf_greedy", f"our greedy / fastest HF greedy ({fastest})", lambda: ratio("greedy", "hf_greedy"),
         ["greedy", "hf_greedy"]),
        ("sd_vs_hf_assisted", "our sd / HF assisted", lambda: ratio("sd", "hf_assisted"), ["sd", "hf_assisted"]),
        ("pipespec_k2_vs_hf_assisted", "pipespec k=2 / HF assisted", lambda: ratio("pipespec_k2", "hf_assisted"),
         ["pipespec_k2", "hf_assisted"]),
        ("pipespec_k2_vs_hf_greedy", f"pipespec k=2 / fastest HF greedy ({fastest})", lambda: ratio("pipespec_k2", "hf_greedy"),
         ["pipespec_k2", "hf_greedy"]),
        ("pipespec_k3_vs_hf_greedy", f"pipespec k=3 / fastest HF greedy ({fastest})", lambda: ratio("pipespec_k3", "hf_greedy"),
         ["pipespec_k3", "hf_greedy"]),
    ]
    for key, label, value, involved in specs:
        if key in thresholds:
            checks.append((key, label, value(), thresholds[key], involved))
    speculative = [n for n in by if is_speculative(n)]
    if speculative:
        best = max(speculative, key=lambda n: by[n]["tokens_per_s_median"])
        if "best_speculative_vs_hf_greedy" in thresholds and "hf_greedy" in by:
            checks.append(("best_speculative_vs_hf_greedy", f"best speculative ({best}) / fastest HF greedy ({fastest})",
                           ratio(best, "hf_greedy"), thresholds["best_speculative_vs_hf_greedy"], [best, "hf_greedy"]))
        hf_spec = [n for n in ("hf_assisted", "hf_prompt_lookup") if n in by]
        if "best_speculative_vs_best_hf_speculative" in thresholds and hf_spec:
            best_hf = max(hf_spec, key=lambda n: by[n]["tokens_per_s_median"])
            checks.append(("best_speculative_vs_best_hf_speculative", f"best speculative ({best}) / best HF "
                           f"speculative ({best_hf})", ratio(best, best_hf),
                           thresholds["best_speculative_vs_best_hf_speculative"], [best, best_hf]))  # fmt: skip
        sds = [n for n in speculative if is_sd(n)]
        pipespecs = [n for n in speculative if not is_sd(n)]
        if "best_pipespec_vs_best_sd" in thresholds and sds and pipespecs:
            best_sd = max(sds, key=lambda n: by[n]["tokens_per_s_median"])
            best_pipe = max(pipespecs, key=lambda n: by[n]["tokens_per_s_median"])
            checks.append(("best_pipespec_vs_best_sd", f"best pipespec ({best_pipe}) / best sd ({best_sd})",
                           ratio(best_pipe, best_sd), thresholds["best_pipespec_vs_best_sd"], [best_pipe, best_sd]))
    fixed = [n for n in FIXED_SYSTEMS if n in by]
    if "auto" in by and fixed:
        best = max(fixed, key=lambda n: by[n]["tokens_per_s_median"])
        if "auto_vs_best_fixed" in thresholds:
            checks.append(("auto_vs_best_fixed", f"auto / best fixed configuration ({best})", ratio("auto", best),
                           thresholds["auto_vs_best_fixed"], ["auto", best]))  # fmt: skip
        if "auto_vs_greedy" in thresholds and "greedy" in by:
            checks.append(("auto_vs_greedy", "auto / our greedy", ratio("auto", "greedy"), thresholds["auto_vs_greedy"],
                           ["auto", "greedy"]))  # fmt: skip
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


def auto_line(auto: Mapping[str, Any]) -> str:
    """What `auto` chose, from what it predicted (before the timed runs)."""
    chosen = auto["chosen"]
    what = chosen["strategy"] + ("" if chosen["strategy"] == "greedy" else
                                 f" lookahead {chosen['lookahead']} max_lead {chosen['max_lead']}")  # fmt: skip
    return f"auto: {what} on stages {chosen['stages']}: {auto['reason']} (profile {auto['profile']})"


def kernels_line(report: Mapping[str, Any]) -> str:
    """Which linear kernels each side ran (`pipespec.kernels`): our stages', and HF generate's."""
    ours = {h["name"]: "/".join(k or "model-free" for k in h.get("kernels") or ["?"])
            for h in report["hierarchies"].values() if h}  # fmt: skip
    return ("kernels: " + "; ".join(f"{name} {k}" for name, k in ours.items())
            + f"; HF systems {report.get('hf_kernels', 'torch')}")


def format_markdown(report: Mapping[str, Any]) -> str:
    rows = report["systems"]
    lines = [
        f"# Bench: {report['prompts']['n']} {report['prompts']['dataset']} prompts"
        + (f" (after the first {report['prompts']['offset']})" if report["prompts"].get("offset") else "") + ", "
        f"{report['max_new_tokens']} new tokens, {report['repetitions']} repetition(s)",
        "",
        f"k2 = {report['hierarchies']['k2']['name']} ({' -> '.join(report['hierarchies']['k2']['stages'])})"
        + (f"; k3 = {report['hierarchies']['k3']['name']} ({' -> '.join(report['hierarchies']['k3']['stages'])})"
           if report["hierarchies"]["k3"] else ""),
        f"sd window: {report['sd_best_window']} (draft_confidence {report.get('sd_best_draft_confidence', 0.0)}); "
        f"HF assisted: {report['hf_assisted_settings']}",
        *([auto_line(report["auto"])] if report.get("auto") else []),
        _machine_line(report["machine"]),
        kernels_line(report),
        "",
        f"x HF greedy: against the fastest HF greedy of the run ({report.get('hf_greedy_reference')}); HF systems "
        f"and our greedy at their pre-pass's thread count (settings)",
        "",
        "x HF greedy, paired: the geometric mean over prompts of the per-prompt ratio against the same prompt and "
        "repetition's HF greedy run, its 95% interval a bootstrap over prompts; worst prompt: the lowest per-prompt "
        "ratio",
        "",
        "| system | tok/s median | min-max | x HF greedy | x HF greedy, paired (95% CI) | worst prompt "
        "| x HF assisted | mean acceptance length "
        "| draft acceptance rate | tokens/target step | target busy | ideal bound tok/s | of bound | identical "
        "| peak RSS MB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        rss = ", ".join(f"{_fmt(p['peak_rss_mb'], '.0f')}" for p in r["peak_rss_mb"])
        lines.append(
            f"| {r['name']} | {r['tokens_per_s_median']:.1f} | {r['tokens_per_s_min']:.1f}-{r['tokens_per_s_max']:.1f} "
            f"| {_fmt(r['ratio_vs_hf_greedy'], '.2f')} | {ratio_cell(r)} | {worst_cell(r)} "
            f"| {_fmt(r['ratio_vs_hf_assisted'], '.2f')} "
            f"| {_fmt(r['mean_acceptance_length'], '.2f')} | {_fmt(r['draft_acceptance_rate'], '.0%')} "
            f"| {_fmt(r['tokens_per_target_step'], '.2f')} "
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


def _result_record(system, rep: int, index: int, result) -> dict[str, Any]:
    record = {"system": system.name, "repetition": rep, "prompt": index, "tokens": result.tokens, "time_s": result.time_s}
    if system.kind == "hf":
        record.update({"target_fed": result.target_fed, "target_time_s": result.target_time_s,
                       "draft_calls": result.draft_calls, "draft_time_s": result.draft_time_s})
    else:
        record["stage_traces"] = [t.to_dict() for t in result.stage_traces]
    return record


def write_outputs(report: Mapping[str, Any], systems: list, out_dir: Path) -> None:
    """bench.json: {config, machine, hierarchies, prompts, max_new_tokens, repetitions, reference, prepass,
    sd_best_window, hf_assisted_settings, systems: [{name, tokens_per_s_median/min/max, identical_to_greedy,
    ratio_vs_hf_greedy, ratio_vs_hf_assisted, mean_acceptance_length, draft_acceptance_rate, target_busy_fraction,
    ideal_bound_tokens_per_s, fraction_of_bound, peak_rss_mb: [...], breakdown: {...}, ...}], targets, notes,
    processes}; bench.md: the tables; runs.json: every run."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench.json").write_text(json.dumps(report, indent=2, default=str))
    (out_dir / "bench.md").write_text(format_markdown(report))
    runs = [_result_record(s, rep, i, r) for s in systems for rep, i, r in s.runs]
    (out_dir / "runs.json").write_text(json.dumps(runs, default=str))


