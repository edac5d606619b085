"""`python -m analysis.validate` (the usage lines: `analysis.validate`): a sweep or sequential runs against a
profile, or `--summary` over `--json` reports; an error is one `error:` line (exit 2).
"""

from __future__ import annotations

import json
import sys
from dataclasses import MISSING, asdict, replace
from pathlib import Path
from typing import Sequence

from analysis.profile import ProfileError, load_profile
from analysis.runs import ResultsError, find_runs
from analysis.validate.records import SWEEP_FORMAT, SweepReport
from analysis.validate.report import format_sweep_report, format_sweep_summary, read_sweep_report, sweep_report_json
from analysis.validate.runs import (
    SEQUENTIAL, Validation, _figures, at_speed, format_costs, format_repeats, format_report, greedy_speed, summary,
    validate
)
from analysis.validate.sweeps import check_sweep, is_sweep_dir, load_sweep
from pipespec.errors import ConfigError


def read_reports(paths: Sequence[str]) -> tuple[list[Validation], list[SweepReport]]:
    """The records of `--json` reports of sequential runs (a list), and the reports of sweeps (an object)."""
    fields = set(Validation.__dataclass_fields__)
    required = {name for name, f in Validation.__dataclass_fields__.items()
                if f.default is MISSING and f.default_factory is MISSING}  # fmt: skip
    records, sweeps = [], []
    for path in paths:
        try:
            raw = json.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as error:
            raise ConfigError(f"{path}: cannot read: {error.strerror or error}") from None
        except json.JSONDecodeError as error:
            raise ConfigError(f"{path}: not JSON ({error.msg}, line {error.lineno})") from None
        if isinstance(raw, dict) and raw.get("format") == SWEEP_FORMAT:
            sweeps.append(read_sweep_report(raw, path))
            continue
        if not isinstance(raw, list) or not all(isinstance(r, dict) and required <= set(r) for r in raw):
            raise ConfigError(f"{path}: not a validation report (python -m analysis.validate ... --json)")
        records += [Validation(**{k: v for k, v in r.items() if k in fields}) for r in raw]
    return records, sweeps


def format_summary(records: Sequence[Validation], paths: Sequence[str],
                   sweeps: Sequence[SweepReport] = ()) -> str:  # fmt: skip
    lines = format_sweep_summary(sweeps)
    if records:
        lines.append(SEQUENTIAL)
    for title, subset in (("held-out runs", [r for r in records if not r.in_sample]),
                          ("in-sample runs (a decomposition, not a prediction)", [r for r in records if r.in_sample])):
        if subset:
            figures = summary(subset)
            lines += [f"{title}, {len(paths)} report(s):",
                      *(f"  {model}: {_figures(figures[model])}" for model in ("ours", "paper"))]
    return "\n".join(lines) if lines else f"no record in {len(paths)} report(s)"


USAGE = ("usage: python -m analysis.validate PROFILE SWEEP_DIR [--json]\n"
         "       python -m analysis.validate PROFILE RUN_DIRS... [--json | --costs | --repeats] [--greedy-speed]\n"
         "       python -m analysis.validate --summary VALIDATION_JSON...")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    flags = ("--json", "--costs", "--greedy-speed", "--repeats", "--summary")
    as_json, as_costs, speed, as_repeats, as_summary = (flag in argv for flag in flags)
    argv = [a for a in argv if a not in flags]
    if len(argv) < (1 if as_summary else 2):
        print(USAGE, file=sys.stderr)
        return 2
    try:
        if as_summary:
            records, sweeps = read_reports(argv)
            print(format_summary(records, argv, sweeps))
            return 0
        sweeps = [path for path in argv[1:] if is_sweep_dir(path)]
        if sweeps:
            return sweep_main(argv[0], argv[1:], as_json, as_costs or speed or as_repeats)
        return sequential_main(argv[0], argv[1:], as_json, as_costs, speed, as_repeats)
    except (ProfileError, ResultsError, ConfigError) as error:
        print(f"error: {str(error).splitlines()[0]}", file=sys.stderr)
        return 2


def sweep_main(profile_path: str, paths: Sequence[str], as_json: bool, sequential_flag: bool) -> int:
    """`python -m analysis.validate PROFILE SWEEP_DIR [--json]`: one sweep against the profile."""
    if len(paths) != 1:
        raise ConfigError(f"{paths[0] if is_sweep_dir(paths[0]) else paths[1]} is a paired sweep: validate it on "
                          "its own (python -m analysis.validate PROFILE SWEEP_DIR)")  # fmt: skip
    if sequential_flag:
        raise ConfigError("--costs, --repeats and --greedy-speed are for sequential runs: a sweep's report has "
                          "its own speed factors and noise floor")  # fmt: skip
    report = check_sweep(load_profile(profile_path), load_sweep(paths[0]))
    for note in report.notes:
        print(f"note: skipped {note}", file=sys.stderr)
    for warning in report.warnings:
        print(f"warning: {report.sweep}: {warning}", file=sys.stderr)
    if report.in_sample:
        print(f"note: {report.sweep} is in-sample: the profile measured acceptance on {len(report.seen)} of its "
              f"{len(report.prompts)} prompts", file=sys.stderr)  # fmt: skip
    print(json.dumps(sweep_report_json(report)) if as_json else format_sweep_report(report))
    return 0


def sequential_main(profile_path: str, paths: Sequence[str], as_json: bool, as_costs: bool, speed: bool,
                    as_repeats: bool) -> int:  # fmt: skip
    """`python -m analysis.validate PROFILE RUN_DIRS...`: runs measured one after another."""
    profile = load_profile(profile_path)
    runs = find_runs(paths)
    if as_costs:
        print(format_costs(profile, runs))
        return 0
    speed_from = None
    if speed:
        factor, speed_from = greedy_speed(profile, runs)
        profile = at_speed(profile, factor)
        print(f"note: step costs x {factor:.4f}, the speed of {speed_from}: every run is in-sample",
              file=sys.stderr)  # fmt: skip
    records, notes = validate(profile, runs)
    if speed_from is not None:
        records = [replace(r, in_sample=True, speed_from=speed_from) for r in records]
    for note in notes:
        print(f"note: skipped {note}", file=sys.stderr)
    for record in records:
        for warning in record.warnings:
            print(f"warning: {record.run}: {warning}", file=sys.stderr)
    if as_json:
        print(json.dumps([asdict(r) for r in records]))
    elif as_repeats:
        print(format_report(records) + "\n" + format_repeats(records))
    else:
        print(format_report(records))
    return 0
