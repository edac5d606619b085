"""A run's summary.json: each stage's statistics pooled over its samples (`pipespec.stats.StageStats`), the
run's tokens/s and ms/token, and its quality figures (`summarize_run`). docs/concepts/metrics.md.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping, Sequence

from analysis.rundir.reference import acceptance_mode
from pipespec.gpu import pool_gpu_figures
from pipespec.stats import StageStats, pool, ratio


def stage_stats(record: Mapping[str, Any]) -> list[StageStats]:
    """Per-stage statistics of one sample record (records of earlier versions included)."""
    return [replace(StageStats.from_dict(s), output_tokens=record["new_tokens"]) for s in record["stages"]]


def pool_stages(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per-stage figures pooled over samples (sums of counts and times, not means of ratios)."""
    if not records:
        return []
    by_name: dict[str, list[StageStats]] = {}  # a sample may run a subset of the stages (auto that learns)
    for record in records:
        for stage, stats in zip(record["stages"], stage_stats(record)):
            by_name.setdefault(stage["name"], []).append(stats)
    return [pool(stats).as_dict(name) for name, stats in by_name.items()]


def summarize_run(config: Mapping[str, Any], records: Sequence[Mapping[str, Any]], complete: bool) -> dict[str, Any]:
    """summary.json: the run's pooled figures (ms/token = sum of time / sum of tokens, as in the paper)."""
    tokens = sum(r["new_tokens"] for r in records)
    total_time = sum(r["time_s"] for r in records)
    models, strategy, dataset = config["models"], config["strategy"], config["dataset"]
    stages = pool_stages(records)
    return {
        "strategy": strategy["name"],
        "models": models["name"],
        "stage_names": [s["name"] for s in stages],
        "dataset": dataset["name"],
        "dataset_label": dataset.get("label", dataset["name"]),
        "stand_in": bool(dataset.get("stand_in", False)),
        "n_samples": len(records),
        "new_tokens": tokens,
        "max_new_tokens": config["max_new_tokens"],
        "lookahead": strategy.get("lookahead"),
        "max_lead": strategy.get("max_lead"),
        "draft_confidence": strategy.get("draft_confidence", 0.0),
        "size_verification": strategy.get("size_verification", False),
        "cascade": strategy.get("cascade", False),
        "value_stop": strategy.get("value_stop", 0.0),
        "acceptance": acceptance_mode(config),
        "lossless": acceptance_mode(config) == "exact",
        "sampling": config.get("sampling"),
        "synthetic_rate": (config.get("acceptance") or {}).get("rate") if acceptance_mode(config) != "exact" else None,
        "total_time_s": total_time,
        "ms_per_token": ratio(1000 * total_time, tokens),
        "tokens_per_s": ratio(tokens, total_time),
        "truncated_prompts": sum(bool(r.get("truncated")) for r in records),
        "stages": stages,
        "quality": pool_quality(records),
        "gpu": pool_gpu_figures(records),  # per GPU: utilisation, peak memory, power, energy per token; None on CPU
        "identical_to_greedy": None,
        "identity": None,  # identical / near_tie / unexplained against the greedy reference (`classify_identity`)
        "speedup_vs_greedy": None,
        "reference_run": None,
        "complete": complete,
    }


def pool_quality(records: Sequence[Mapping[str, Any]]) -> dict[str, float] | None:
    """Mean of each per-sample quality figure (ROUGE F1, passed) over the samples that have it."""
    values: dict[str, list[float]] = {}
    for record in records:
        for key, value in (record.get("quality") or {}).items():
            if isinstance(value, (int, float)):
                values.setdefault(key, []).append(float(value))
    return {key: sum(v) / len(v) for key, v in values.items()} or None
