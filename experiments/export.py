"""Runs written in other benchmarks' formats.

    python -m experiments.export specbench RUN_DIR... --out ANSWERS.jsonl
    python -m experiments.export specbench MULTIRUN_DIR --out ANSWER_DIR

specbench: Spec-Bench's answer files (github.com/hemingkx/Spec-Bench), one per method
(hierarchy + strategy: its `model_id`), the format its evaluation/speed.py reads; accept lengths
come from the target verifier's trace (`analysis.specbench`). A RUN_DIR is a run directory or a
directory holding runs. `--out FILE.jsonl` takes the runs of one method; a directory gets
`<model_id>.jsonl` per method, as Spec-Bench's model_answer folder holds them. Prints Spec-Bench's
figures per task (mean of per-question speeds) beside pipespec's pooled ones, with speedups against
a greedy run given among the RUN_DIRs. Nothing is written unless every run converts; each file
is written atomically.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from analysis.rundir import (
    ResultsError,
    acceptance_mode,
    atomic_write_text,
    find_run_dirs,
    has_trace,
    pick_reference,
    read_config,
    read_records,
    read_summary,
    read_trace,
    trace_path,
)
from analysis.specbench import answer_line, format_speed_report, model_id, sort_answers, speed_report
from experiments.data import DataError, load_dataset


class ExportError(ValueError):
    """The export cannot be made as asked (no runs, an --out that does not fit them); one line."""


class SpecBenchRun:
    """One run directory as the export reads it: config, summary, records, and its method's name."""

    def __init__(self, path: Path):
        self.path = path
        self.config = read_config(path)
        self.summary = read_summary(path)
        if acceptance_mode(self.config) != "exact":
            raise ResultsError(f"{path}: synthetic acceptance (not lossless): its accept lengths are made up")
        self.records, _ = read_records(path)
        if not self.records:
            raise ResultsError(f"{path}: no finished samples to export")
        self.model_id = model_id(self.config, self.summary)

    def answers(self, tstamp: float) -> list[dict[str, Any]]:
        """The run's Spec-Bench answer lines (every sample's trace must be there)."""
        label = question_labels(self.config, self.path)
        lines = []
        for record in self.records:
            where = f"{self.path} sample {record['sample_id']}"
            if not has_trace(self.path, record["index"]):
                raise ResultsError(f"{where}: no trace ({trace_path(self.path, record['index']).name}); "
                                   "the export needs the target's steps")  # fmt: skip
            question_id, category = label(record)
            trace = read_trace(self.path, record["index"])
            lines.append(answer_line(record, trace, question_id=question_id, category=category,
                                     model_id=self.model_id, tstamp=tstamp, where=where))  # fmt: skip
        return lines


def question_labels(config: Mapping[str, Any], run_dir: Path) -> Callable[[Mapping[str, Any]], tuple[Any, str]]:
    """(question_id, category) of a record: the record's own fields where it has them; for a Spec-Bench
    run, its question file's; otherwise the sample id and the dataset's name."""
    dataset = config["dataset"]
    by_id: dict[str, tuple[Any, str]] = {}
    if dataset.get("loader") == "spec_bench":
        try:
            by_id = {s.sample_id: (s.meta["question_id"], s.meta["category"]) for s in load_dataset(dataset)}
        except DataError as error:
            raise ResultsError(f"{run_dir}: cannot read its question file for the categories ({error})") from None

    def label(record: Mapping[str, Any]) -> tuple[Any, str]:
        question_id, category = by_id.get(record["sample_id"], (record["sample_id"], dataset["name"]))
        return record.get("question_id", question_id), record.get("category", category)

    return label


def export_specbench(run_dirs: list[str], tstamp: float | None = None) -> dict[str, dict[str, Any]]:
    """model_id -> {"answers": sorted answer lines, "runs": [paths], "report": speed_report rows,
    "baseline": the greedy model_id compared with (or None)} for the runs found under `run_dirs`."""
    if not run_dirs:
        raise ExportError("no run directories given")
    runs = [SpecBenchRun(path) for path in find_run_dirs(run_dirs)]
    tstamp = time.time() if tstamp is None else tstamp
    answers = {run.path: run.answers(tstamp) for run in runs}
    methods: dict[str, dict[str, Any]] = {}
    for run in runs:
        method = methods.setdefault(run.model_id, {"answers": [], "runs": [], "seen": {}})
        for line in answers[run.path]:
            if line["question_id"] in method["seen"]:
                raise ExportError(f"{run.model_id}: question {line['question_id']} is in both "
                                  f"{method['seen'][line['question_id']]} and {run.path}")  # fmt: skip
            method["seen"][line["question_id"]] = run.path
        method["answers"].extend(answers[run.path])
        method["runs"].append(run.path)
    candidates = [(run.path, run.config) for run in runs]
    for name, method in methods.items():
        references = [pick_reference(r.path, r.config, candidates) for r in runs if r.model_id == name]
        baseline_dirs = list(dict.fromkeys(ref[0] for ref in references if ref is not None))
        baseline = [line for path in baseline_dirs for line in answers[path]] or None
        method["baseline"] = next((r.model_id for r in runs if r.path in baseline_dirs), None)
        method["answers"] = sort_answers(method.pop("answers"))
        del method["seen"]
        method["report"] = speed_report(method["answers"], baseline)
    return methods


def output_paths(out: str, model_ids: list[str]) -> dict[str, Path]:
    """Where each method's answers go: `out` itself (a .jsonl file, one method) or `out`/<model_id>.jsonl."""
    target = Path(out)
    if target.suffix == ".jsonl":
        if len(model_ids) != 1:
            raise ExportError(f"--out {out} is one file but the runs hold {len(model_ids)} methods "
                              f"({', '.join(model_ids)}): give a directory")  # fmt: skip
        return {model_ids[0]: target}
    if target.exists() and not target.is_dir():
        raise ExportError(f"--out {out} is neither a .jsonl file name nor a directory")
    return {name: target / f"{name}.jsonl" for name in model_ids}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    formats = parser.add_subparsers(dest="format", required=True)
    specbench = formats.add_parser("specbench", help="Spec-Bench answer files (one per method)")
    specbench.add_argument("dirs", nargs="*", help="run directories, or directories holding runs")
    specbench.add_argument("--out", required=True, help="ANSWERS.jsonl (one method) or a directory")
    args = parser.parse_args(argv)
    try:
        methods = export_specbench(args.dirs)
        paths = output_paths(args.out, list(methods))
    except (ResultsError, ExportError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for name, method in methods.items():
        atomic_write_text(paths[name], "".join(json.dumps(line) + "\n" for line in method["answers"]))
        against = f", speedups against {method['baseline']}" if method["baseline"] else ", no greedy run given"
        print(f"{name}: {len(method['answers'])} answers from {len(method['runs'])} run(s) -> {paths[name]}{against}")
        print(format_speed_report(method["report"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
