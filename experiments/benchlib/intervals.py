"""Every bench ratio with its interval and its worst prompt: paired per prompt and repetition against the base.

A system's runs and the base's on the same (prompt, repetition) slot make one pair; the ratio is the geometric
mean over prompts of each prompt's mean log ratio (`analysis.paired`, the sweeps' statistic), its 95% interval
a bootstrap over prompts, and the worst prompt the one whose mean ratio is lowest.

    python -m experiments.benchlib.intervals RUN_DIR [--base hf_greedy]   # a committed bench's runs.json, re-read

(a committed bench keeps runs.json gzipped, as runs.json.gz: `read_runs` reads either).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
import zlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Mapping, Sequence

from analysis.paired import Sample, log_ratios, paired_speedups


def samples(systems: Sequence) -> list[Sample]:
    """One `Sample` per timed run of every system (its prompt index as the prompt's name)."""
    return [Sample(system.name, f"{index:06d}", rep, len(result.tokens), result.time_s)
            for system in systems for rep, index, result in system.runs]


def paired_ratio_fields(systems: Sequence, base: str | None, key: str = "hf_greedy") -> dict[str, dict[str, Any]]:
    """{system: {ratio_vs_KEY_paired, ratio_vs_KEY_low, ratio_vs_KEY_high, worst_prompt_vs_KEY,
    worst_prompt_index_vs_KEY}} against `base`'s runs; empty where the base did not run."""
    pool = samples(systems)
    if base is None or not any(s.configuration == base for s in pool):
        return {}
    speedups = {s.configuration: s for s in paired_speedups(pool, reference=base)}
    ratios = log_ratios(pool, base)
    out = {}
    for name, by_prompt in ratios.items():
        worst = min(by_prompt, key=lambda p: sum(by_prompt[p]) / len(by_prompt[p]))
        speedup = speedups[name]
        out[name] = {
            f"ratio_vs_{key}_paired": speedup.speedup,
            f"ratio_vs_{key}_low": speedup.sampling_interval[0],
            f"ratio_vs_{key}_high": speedup.sampling_interval[1],
            f"worst_prompt_vs_{key}": math.exp(sum(by_prompt[worst]) / len(by_prompt[worst])),
            f"worst_prompt_index_vs_{key}": int(worst),
        }
    return out


def add_paired_ratios(rows: list[dict[str, Any]], systems: Sequence, base: str | None) -> None:
    """Each row gains its paired ratio against `base`, the interval over prompts and the worst prompt."""
    fields = paired_ratio_fields(systems, base)
    for row in rows:
        row.update(fields.get(row["name"], {}))


def ratio_cell(row: Mapping[str, Any], key: str = "hf_greedy") -> str:
    """ "1.68 (1.52-1.83)": the paired ratio and its 95% interval over prompts; "-" where there is none."""
    value = row.get(f"ratio_vs_{key}_paired")
    if value is None:
        return "-"
    return f"{value:.2f} ({row[f'ratio_vs_{key}_low']:.2f}-{row[f'ratio_vs_{key}_high']:.2f})"


def worst_cell(row: Mapping[str, Any], key: str = "hf_greedy") -> str:
    """ "0.75 (prompt 3)": the lowest per-prompt ratio and which prompt."""
    value = row.get(f"worst_prompt_vs_{key}")
    return "-" if value is None else f"{value:.2f} (prompt {row[f'worst_prompt_index_vs_{key}']})"


def systems_from_runs(records: Sequence[Mapping[str, Any]]) -> list[SimpleNamespace]:
    """A committed bench's `runs.json` records as systems with `runs` [(repetition, prompt, result)]."""
    systems: dict[str, SimpleNamespace] = {}
    for record in records:
        system = systems.setdefault(record["system"], SimpleNamespace(name=record["system"], runs=[]))
        result = SimpleNamespace(tokens=record["tokens"], time_s=record["time_s"])
        system.runs.append((record["repetition"], record["prompt"], result))
    return list(systems.values())


def read_runs(run_dir: Path) -> list[dict] | None:
    """A bench folder's runs.json records, or those of its runs.json.gz (a committed bench's, gzipped by
    `python -m analysis.rundir.archive gzip-runs`); None where it holds neither."""
    for name in ("runs.json", "runs.json.gz"):
        path = Path(run_dir) / name
        if path.is_file():
            data = path.read_bytes()
            return json.loads(gzip.decompress(data) if name.endswith(".gz") else data)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.benchlib.intervals",
                                     description="Paired ratios, 95%% intervals over prompts and the worst prompt "
                                                 "of a bench run, read from its runs.json.")
    parser.add_argument("run_dir", type=Path, help="a bench output folder (holding runs.json and bench.json)")
    parser.add_argument("--base", default=None, help="the base system (default: the run's fastest HF greedy)")
    args = parser.parse_args(argv)
    runs, report = args.run_dir / "runs.json", args.run_dir / "bench.json"
    try:
        records = read_runs(args.run_dir)
    except (OSError, EOFError, zlib.error, ValueError) as error:  # ValueError: not JSON, not UTF-8
        print(f"error: {args.run_dir}: cannot read its runs ({str(error).splitlines()[0] if str(error) else 'empty'})",
              file=sys.stderr)  # fmt: skip
        return 2
    if records is None:
        print(f"error: {runs} not found (nor runs.json.gz): a bench folder written by python -m experiments.bench "
              "holds it", file=sys.stderr)  # fmt: skip
        return 2
    base = args.base or (json.loads(report.read_text()).get("hf_greedy_reference") if report.is_file() else None)
    fields = paired_ratio_fields(systems_from_runs(records), base or "hf_greedy")
    if not fields:
        print(f"error: the base system {base or 'hf_greedy'!r} has no runs in {runs} (--base names another)",
              file=sys.stderr)
        return 2
    print(f"| system | x {base or 'hf_greedy'}, paired (95% CI over prompts) | worst prompt |")
    print("|---|---|---|")
    for name, row in sorted(fields.items(), key=lambda item: -item[1]["ratio_vs_hf_greedy_paired"]):
        print(f"| {name} | {ratio_cell(row)} | {worst_cell(row)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
