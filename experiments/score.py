"""Score finished runs' outputs post hoc: the quality of each record's `output_text`, written into the run.

    python -m experiments.score RUN_OR_SWEEP_DIR... [--timeout-s 10]

Each run directory below the arguments (a run, a multirun, a paired sweep) is scored as its dataset says
(`experiments.data.quality.quality_setup` of its config's dataset section): pass@1 for HumanEval (each
completion run against its tests, in a child process under resource limits and the timeout per problem, with
a warning: running this tool is the opt-in), the metric's figures against the reference where the dataset
has references (ROUGE-1/2/L F-measures), nothing where it has none (the news_lee stand-in: the tool says
so and writes nothing). Each scored record gets its `quality`; summary.json gets `quality` (pooled over the
records, as a run writes it) and `quality_metric`. Nothing measured changes: every other field of every
record and of the summary is kept as it was (checked before the files are replaced), and a line that is not
a record is kept as it is. Scoring again replaces the earlier scores.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any, Mapping, Sequence

from experiments.hub import default_offline  # noqa: E402
default_offline()  # offline unless the user set HF_HUB_OFFLINE & co. or the run names a hub id

from analysis.rundir import (  # noqa: E402
    SAMPLES,
    SUMMARY,
    ResultsError,
    atomic_write_json,
    atomic_write_text,
    find_run_dirs,
    pool_quality,
    read_config,
    summary_lock,
)
from experiments.data import DataError, load_dataset  # noqa: E402
from experiments.data.quality import DEFAULT_TIMEOUT_S, CodeExecutionWarning, QualitySetup, quality_setup  # noqa: E402

QUALITY_FIELDS = ("quality", "quality_metric")  # what scoring writes; every other field is left as it was


class ScoreError(RuntimeError):
    """A run cannot be scored; the message names the run directory and what to change."""


def prompt_id(record: Mapping[str, Any]) -> str:
    """The dataset sample a record answers: its sweep slot's prompt (sample ids there are `ID@rN`), else its id."""
    slot = record.get("slot")
    return str(slot["prompt"]) if isinstance(slot, Mapping) and "prompt" in slot else str(record["sample_id"])


def dataset_samples(dataset: Mapping[str, Any]) -> dict[str, Any]:
    """Every sample of the run's dataset by id (the whole file: a run's selection is a subset of it)."""
    return {s.sample_id: s for s in load_dataset({**dataset, "n_samples": None, "seed": None, "ids": None})}


def score_lines(lines: Sequence[str], setup: QualitySetup, samples: Mapping[str, Any], family: str,
                where: Path) -> tuple[list[str], list[dict]]:  # fmt: skip
    """The samples.jsonl lines with each record's `quality` set, and the records; other lines unchanged."""
    out, records = [], []
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if not isinstance(record, dict) or "output_text" not in record or "sample_id" not in record:
            out.append(line)  # not a record (a torn line of a killed run): kept as it is
            continue
        sample = samples.get(prompt_id(record))
        if sample is None:
            raise ScoreError(f"{where}: record {record['sample_id']!r} answers {prompt_id(record)!r}, which the "
                             "dataset in its config.yaml does not hold (check dataset.path)")  # fmt: skip
        record["quality"] = setup.score(sample, record["output_text"], family)
        out.append(json.dumps(record) + "\n")
        records.append(record)
    return out, records


def check_unchanged(before: Sequence[str], after: Sequence[str], where: Path) -> None:
    """Every line equal to its old self but for the quality fields: nothing measured was touched."""
    def bare(line: str) -> Any:
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            return line
        return {k: v for k, v in value.items() if k not in QUALITY_FIELDS} if isinstance(value, dict) else value

    if len(before) != len(after) or any(bare(a) != bare(b) for a, b in zip(before, after)):
        raise ScoreError(f"{where}: scoring would change more than the quality fields: nothing written")


def score_run(run_dir: Path, timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, Any] | None:
    """Score one run directory in place: its summary's new `quality`, or None where its dataset has nothing
    to score against (no metric, or no references)."""
    config = read_config(run_dir)
    dataset = config["dataset"]
    setup = quality_setup(dataset, execute_code=True)
    setup = QualitySetup(setup.metric, True, timeout_s)
    samples = dataset_samples(dataset)
    if setup.metric is None or (setup.metric != "pass@1" and all(s.reference is None for s in samples.values())):
        return None
    path = run_dir / SAMPLES
    before = path.read_text(encoding="utf-8").splitlines(keepends=True)
    with warnings.catch_warnings():  # one warning for the run, not one per completion
        warnings.simplefilter("once", CodeExecutionWarning)
        after, records = score_lines(before, setup, samples, config["models"].get("family", "base"), run_dir)
    check_unchanged(before, after, path)
    atomic_write_text(path, "".join(after))
    quality = pool_quality(records)
    summary_path = run_dir / SUMMARY
    if summary_path.is_file():
        with summary_lock(run_dir):
            summary = json.loads(summary_path.read_text(encoding="utf-8"))
            atomic_write_json(summary_path, {**summary, "quality": quality, "quality_metric": setup.metric})
    return quality


def describe(run_dir: Path, quality: Mapping[str, Any] | None, dataset: Mapping[str, Any]) -> str:
    """One line per run: its new quality, or why it has none."""
    if quality is None:
        why = "no reference" if dataset.get("metric") is not None or dataset.get("stand_in") else "no metric"
        stand_in = ", a stand-in" if dataset.get("stand_in") else ""
        return f"{run_dir}: nothing to score ({why}{stand_in}): nothing written"
    if "passed" in quality:
        return f"{run_dir}: pass@1 {quality['passed']:.3f}"
    return f"{run_dir}: " + ", ".join(f"{k} {v:.3f}" for k, v in quality.items())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.score", description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", help="run directories, or directories holding runs (sweeps, multiruns)")
    parser.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S,
                        help="wall-clock seconds one HumanEval check may run (default %(default)s)")
    args = parser.parse_args(argv)
    if not args.timeout_s > 0:
        print("error: --timeout-s must be > 0", file=sys.stderr)
        return 2
    try:
        runs = find_run_dirs(args.dirs)
        if not runs:
            raise ResultsError(f"no run directories in {' '.join(args.dirs)}")
        for run_dir in runs:
            quality = score_run(run_dir, args.timeout_s)
            print(describe(run_dir, quality, read_config(run_dir)["dataset"]), flush=True)
    except (ResultsError, DataError, ScoreError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
