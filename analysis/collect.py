"""Any set of run directories -> one table, with speedups against the matching greedy runs.

A run's greedy reference is chosen among the collected runs by the one rule of
`analysis.rundir.pick_reference` (same target, dataset, budget and decoding; the one in the
same multirun first); identical counts
and speedups are computed over the samples both runs hold; a sampled run (temperature > 0)
gets no identical count, as in its summary. The target's columns are computed from its counts
(`pipespec.stats.StageStats`): `target_draft_acceptance_rate` = accepted / offered drafts,
`target_mean_acceptance_length` = tokens appended per verification (accepted + 1).
Pure Python (no torch).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any, Iterable

from analysis.rundir import (
    SUMMARY,
    ResultsError,
    compare_with_reference,
    find_run_dirs,
    is_greedy_reference,
    pick_reference,
    read_config,
    read_records,
    read_summary,
    summarize_run,
)
from pipespec.stats import StageStats, ratio

COLUMNS = (
    "run", "models", "strategy", "lookahead", "dataset", "n_samples", "new_tokens", "ms_per_token",
    "tokens_per_s", "speedup_vs_greedy", "identical_to_greedy", "target_draft_acceptance_rate",
    "target_mean_acceptance_length", "target_accepted_per_verify", "target_busy", "complete",
)  # fmt: skip


def _load(run_dir: Path) -> dict[str, Any]:
    config = read_config(run_dir)
    records, _ = read_records(run_dir)
    # a run killed before its summary still counts with the samples it finished
    summary = read_summary(run_dir) if (run_dir / SUMMARY).exists() else summarize_run(config, records, False)
    return {"dir": run_dir, "config": config, "records": records, "summary": summary}


def _reference_for(run: dict, greedy_runs: list[dict]) -> dict | None:
    by_dir = {g["dir"]: g for g in greedy_runs}
    found = pick_reference(run["dir"], run["config"], [(g["dir"], g["config"]) for g in greedy_runs])
    return by_dir[found[0]] if found else None


def collect(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    runs = [_load(d) for d in find_run_dirs(paths)]
    if not runs:
        raise ResultsError("no runs found")
    greedy_runs = [r for r in runs if is_greedy_reference(r["config"])]
    rows = []
    for run in runs:
        summary = run["summary"]
        reference = _reference_for(run, greedy_runs) if not is_greedy_reference(run["config"]) else None
        comparison = (
            compare_with_reference(run["records"], reference["records"])
            if reference
            else {"identical_to_greedy": summary.get("identical_to_greedy"), "speedup_vs_greedy": None}
        )
        if (run["config"].get("sampling") or {}).get("temperature", 0):
            comparison["identical_to_greedy"] = None  # as refresh_reference: sampled outputs match in distribution only
        if is_greedy_reference(run["config"]):
            comparison = {"identical_to_greedy": "(reference)", "speedup_vs_greedy": 1.0}
        target_dict = summary["stages"][-1] if summary["stages"] else {}
        target = StageStats.from_dict(target_dict)  # old summaries too: their counts are there
        rows.append(
            {
                "run": str(run["dir"]),
                "models": summary["models"],
                "strategy": _auto_label(summary) + summary["strategy"] + _acceptance_label(summary),
                "lookahead": summary.get("lookahead"),
                "dataset": summary["dataset"] + (" (stand-in)" if summary.get("stand_in") else ""),
                "n_samples": summary["n_samples"],
                "new_tokens": summary["new_tokens"],
                "ms_per_token": summary["ms_per_token"],
                "tokens_per_s": summary["tokens_per_s"],
                "speedup_vs_greedy": comparison["speedup_vs_greedy"],
                "identical_to_greedy": comparison["identical_to_greedy"],
                "target_draft_acceptance_rate": target.draft_acceptance_rate,  # accepted / offered drafts
                "target_mean_acceptance_length": target.mean_acceptance_length,  # accepted per verification + 1
                "target_accepted_per_verify": ratio(target.accepted, target.verify_steps),
                # summaries written before StageStats hold the fraction but not its times
                "target_busy": target.busy_fraction if target.wall_s else target_dict.get("busy_fraction"),
                "complete": summary.get("complete"),
            }
        )
    return rows


def _auto_label(summary: dict) -> str:
    """`auto` runs the configuration it chose: the row says so ("auto (stages [0, 2]): sd", positions in the
    hierarchy)."""
    if not summary.get("auto"):
        return ""
    return f"auto (stages {summary['auto']['chosen']['stages']}): "


def _acceptance_label(summary: dict) -> str:
    if summary.get("lossless", True):
        return ""
    return f" [synthetic {summary.get('synthetic_rate')}, not lossless]"


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def format_markdown(rows: list[dict[str, Any]]) -> str:
    shown = [c for c in COLUMNS if c != "run"]
    lines = ["| " + " | ".join(shown) + " |", "|" + "---|" * len(shown)]
    lines += ["| " + " | ".join(_cell(row[c]) for c in shown) + " |" for row in rows]
    return "\n".join(lines)


def format_csv(rows: list[dict[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS)
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()
