"""How far a bench's systems are from a speedup target, and what stops them: the step and the tokens per step.

A system's speed over HF greedy is (tokens per target step) x (HF greedy's time per token) / (the target's time
per step), less what the pipeline loses around the steps. This reads a committed bench's `bench.json` and gives,
per system: the measured ratio, the ratio of its ideal-pipeline bound (no overhead, the measured acceptance and
step costs), the tokens per target step it would need at its measured step time to reach the target, and the
ratio it would reach at the memory-bandwidth floor (the target's weights read once per step at the bandwidth
measured here, `--bandwidth`). The docs' page: docs/performance.md.

    python -m experiments.benchlib.ceiling RUN_DIR [--target 2.0 --target-news 1.75] [--bandwidth | --bandwidth-gbs X]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Mapping

from analysis.names import bench_system_name
from experiments.prepare import smollm2_dir

# torch is imported where the read bandwidth is measured (`--bandwidth`): reading a bench's reports imports none.

BANDWIDTH_MIB = 512  # the tensor read to measure bandwidth: far larger than the caches


def read_bandwidth_gbs(threads: int, repeats: int = 5) -> float:
    """Read bandwidth in GB/s: the best of `repeats` sums over a BANDWIDTH_MIB fp32 tensor on `threads` threads."""
    import torch

    torch.set_num_threads(threads)
    data = torch.ones(BANDWIDTH_MIB * 2**20 // 4)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - started)
    return data.numel() * 4 / best / 1e9


def target_weight_bytes(model_dir: Path) -> int:
    """Bytes one step of the target reads at least: its safetensors files (tied embeddings counted once)."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise SystemExit(f"error: {model_dir}: no *.safetensors files: run `python -m experiments.prepare`")
    return sum(f.stat().st_size for f in files)


def _target_stage(row: Mapping[str, Any]) -> Mapping[str, Any] | None:
    stages = row.get("breakdown", {}).get("stages") or []
    return stages[-1] if row.get("kind") != "hf" else (stages[0] if stages else None)


def system_rows(report: Mapping[str, Any], target: float, floor_ms: float | None) -> list[dict[str, Any]]:
    """Per system of one dataset's report: ratio, bound ratio, tokens per target step (measured and needed for
    `target`), the target's ms per step, and the ratio at the bandwidth floor."""
    rows = {r["name"]: r for r in report["systems"]}
    base = rows[report["hf_greedy_reference"]]
    base_ms = 1000.0 / base["tokens_per_s_median"]
    out = []
    for row in report["systems"]:
        tau = row.get("tokens_per_target_step")
        stage = _target_stage(row)
        per_token = stage.get("compute_ms_per_token") if stage else None
        step_ms = per_token * tau if per_token is not None and tau else None
        bound = row.get("ideal_bound_tokens_per_s")
        out.append({
            "system": row["name"],
            "label": bench_system_name(row["name"], row.get("settings", {}).get("strategy"), row.get("stages")),
            "ratio": row["tokens_per_s_median"] / base["tokens_per_s_median"],
            "bound_ratio": bound / base["tokens_per_s_median"] if bound else None,
            "tokens_per_target_step": tau,
            "target_step_ms": step_ms,
            "tokens_per_step_needed": target * step_ms / base_ms if step_ms else None,
            "ratio_at_floor": tau * base_ms / floor_ms if floor_ms and tau else None,
        })
    return out


def _fmt(value, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def markdown(dataset: str, rows: list[dict[str, Any]], target: float, base_ms: float) -> str:
    lines = [f"### {dataset}: target {target:.2f}x HF greedy ({base_ms:.1f} ms per token)", "",
             "| system | x HF greedy | ideal bound x HF greedy | tokens / target step | target ms / step "
             "| tokens / step needed | x HF greedy at the bandwidth floor |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in sorted(rows, key=lambda r: -r["ratio"]):
        lines.append(f"| {r['label']} | {r['ratio']:.2f} | {_fmt(r['bound_ratio'])} "
                     f"| {_fmt(r['tokens_per_target_step'])} | {_fmt(r['target_step_ms'], '.1f')} "
                     f"| {_fmt(r['tokens_per_step_needed'])} | {_fmt(r['ratio_at_floor'])} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.benchlib.ceiling", description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path, help="a bench's run directory (RUN_DIR/DATASET/bench.json)")
    parser.add_argument("--target", type=float, default=2.0, help="the speedup target on HumanEval")
    parser.add_argument("--target-news", type=float, default=1.75, help="the speedup target on news_lee")
    parser.add_argument("--bandwidth", action="store_true", help="measure this machine's read bandwidth (1, 2 threads)")
    parser.add_argument("--bandwidth-gbs", type=float, help="a read bandwidth measured before (GB/s), e.g. on a quiet machine")
    args = parser.parse_args(argv)
    reports = sorted(args.run_dir.glob("*/bench.json")) or sorted(args.run_dir.glob("bench.json"))
    if not reports:
        print(f"error: {args.run_dir}: no bench.json (a `python -m experiments.bench` run directory)", file=sys.stderr)
        return 2
    floor_ms = None
    if args.bandwidth or args.bandwidth_gbs:
        weights = target_weight_bytes(smollm2_dir())
        rates = {f"{t} thread(s)": read_bandwidth_gbs(t) for t in (1, 2)} if args.bandwidth else {"given": args.bandwidth_gbs}
        floor_ms = weights / (max(rates.values()) * 1e9) * 1000
        print(f"read bandwidth: {', '.join(f'{r:.1f} GB/s ({t})' for t, r in rates.items())}; target weights "
              f"{weights / 1e6:.0f} MB: floor {floor_ms:.1f} ms per step\n")  # fmt: skip
    for path in reports:
        report = json.loads(path.read_text())
        dataset = path.parent.name if path.parent != args.run_dir else "bench"
        target = args.target_news if dataset.startswith("news") else args.target
        base = {r["name"]: r for r in report["systems"]}[report["hf_greedy_reference"]]
        print(markdown(dataset, system_rows(report, target, floor_ms), target, 1000.0 / base["tokens_per_s_median"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
