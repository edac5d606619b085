"""Model vs measurement: the paper's closed forms and our engine-schedule model against held-out sweeps (no torch).

    python -m analysis.report                              # the committed paired validations -> results/report/
    python -m analysis.report DIR... [--out DIR]           # DIR: a paired validation, or a folder of them
    python -m analysis.report --pair PROFILE SWEEP [--pair PROFILE SWEEP ...] [--out DIR]
    python -m analysis.report RUN_DIRS... --out DIR [--official DIR]   # the per-run report (analysis.report_runs)

A paired validation is a folder holding `profile/profile.json` (a machine profile measured on prompts 0-9,
`python -m experiments.profile`) and `sweep/` (a paired sweep on prompts 20-27 with traces, `python -m
experiments.sweep`), as `scripts/validation_paired.sh` makes them. For each one it writes into
`DIR/report.md` (and `DIR/figures/`, PNG + PDF), per configuration and drafter/verifier pair:

- the verification fraction rho and tokens per step: measured, with 95% intervals over the sweep's prompts;
  the paper's Eq. 3 / 4 and our engine-schedule model, held out (from the profile); the extended closed
  forms of `analysis.closed_forms` beside the paper's, held out and in sample; each with its residual;
- the speedup: measured (paired, 95% over prompts), ours with a 95% prediction interval that includes the
  sweep's prompt sampling (`analysis.report_model.prediction_interval`), the paper's Eq. 4 / 5 and Eq. 6;
  the coverage of ours' intervals per hierarchy and dataset;
- for each class of misfit the assumption that fails, from the traces: the lead at verify time, acceptance
  by draft position, the chain's transitions, the target's step costs and busy share.

Every table says whether it is held out (the profile's prompts predicting the sweep's) or in sample.

Given run directories (a run, or a folder of runs) instead, it writes the per-run in-sample report of
`analysis.report_runs` (report.md and report.html). Bad input (a folder that is neither, a sweep without
traces or without a profile, a torn file) is one `error:` line naming what is missing and the command that
makes it, exit 2. The report is written into a temporary folder beside DIR and moved into place whole.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Callable, Sequence

from analysis import report_figures, report_tables, validate
from analysis.profile import ProfileError
from analysis.report_model import SweepAnalysis, analyse
from analysis.report_runs import Table, build_report  # noqa: F401  (the per-run report, importable from here)
from analysis.rundir import find_run_dirs
from analysis.runs import ResultsError
from pipespec.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_VALIDATIONS = ROOT / "results" / "validation_paired"
DEFAULT_HIERARCHIES = ("smollm2_int8_fp32", "smollm2_pld_int8_fp32", "smollm2_suffix_fp32")
DEFAULT_DATASETS = ("humaneval", "news_lee_cnndm")
DEFAULT_OUT = ROOT / "results" / "report"
PROFILE, SWEEP = Path("profile") / "profile.json", Path("sweep")
MAKE_VALIDATION = "HIERARCHIES=H DATASETS=D bash scripts/validation_paired.sh"
MAKE_PROFILE = ("python -m experiments.profile models=H dataset=D dataset.n_samples=10 profile.continuation=96 "
                "hydra.run.dir=DIR/profile")
MAKE_SWEEP = ("python -m experiments.sweep models=H dataset=D samples=8 prompt_offset=20 repetitions=3 "
              "max_new_tokens=96 profile=DIR/profile/profile.json hydra.run.dir=DIR/sweep")
TITLE = "pipespec: the paper's model and ours against measurement"


class ReportError(Exception):
    """Bad input to the report: the message is the one line to print."""


# ---- inputs ----------------------------------------------------------------------------------------------------


def default_validations() -> list[tuple[Path, Path]]:
    return [(DEFAULT_VALIDATIONS / h / d / PROFILE, DEFAULT_VALIDATIONS / h / d / SWEEP)
            for h in DEFAULT_HIERARCHIES for d in DEFAULT_DATASETS]  # fmt: skip


def validations_in(path: Path, depth: int = 2) -> list[tuple[Path, Path]]:
    """The paired validations at or below ``path`` (a folder holding profile/profile.json and sweep/)."""
    if (path / PROFILE).is_file() and (path / SWEEP).is_dir():
        return [(path / PROFILE, path / SWEEP)]
    if depth <= 0 or not path.is_dir():
        return []
    return [found for child in sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))
            for found in validations_in(child, depth - 1)]  # fmt: skip


def _not_validation(path: Path) -> str:
    """The line for a folder that holds no paired validation: what is missing, and what makes it."""
    if not path.exists():
        return f"{path}: no such directory"
    if (path / SWEEP).is_dir() or validate.is_sweep_dir(path):
        folder = path if (path / SWEEP).is_dir() else path.parent
        return (f"{folder / PROFILE}: missing (a sweep is predicted from the profile beside it); make it with "
                f"{MAKE_PROFILE.replace('DIR', str(folder))}")
    if (path / PROFILE).is_file():
        return f"{path / SWEEP}: missing; make it with {MAKE_SWEEP.replace('DIR', str(path))}"
    return (f"{path}: neither a paired validation (profile/profile.json beside sweep/; make one with "
            f"{MAKE_VALIDATION}) nor a run directory (no summary.json here or below; make one with "
            f"python -m experiments.run)")


def classify(paths: Sequence[Path]) -> tuple[list[tuple[Path, Path]], list[Path]]:
    """(paired validations, run directories) named by ``paths``; a ReportError for a path that is neither,
    or for a mix of both."""
    pairs: list[tuple[Path, Path]] = []
    runs: list[Path] = []
    for path in paths:
        found = validations_in(path)
        if found:
            pairs += found
            continue
        if validate.is_sweep_dir(path) and (path.parent / PROFILE).is_file():  # a sweep named beside its profile
            pairs.append((path.parent / PROFILE, path))
            continue
        if validate.is_sweep_dir(path) or (path / PROFILE).is_file() or (path / SWEEP).is_dir():
            raise ReportError(_not_validation(path))
        try:
            runs += find_run_dirs([path])
        except ResultsError:
            raise ReportError(_not_validation(path)) from None
    if pairs and runs:
        raise ReportError(f"{runs[0]}: a run directory among paired validations: give either paired validations "
                          "or run directories")  # fmt: skip
    return pairs, runs


def _missing(profile: Path, sweep: Path) -> str | None:
    """The line for a pair whose profile or sweep is absent (None: both there)."""
    folder = profile.parent.parent
    if not profile.is_file():
        return f"{profile}: no profile; make it with {MAKE_PROFILE.replace('DIR', str(folder))}"
    if not sweep.is_dir():
        return f"{sweep}: no sweep; make it with {MAKE_SWEEP.replace('DIR', str(folder))}"
    return None


def read_validations(pairs: Sequence[tuple[Path, Path]]) -> list[SweepAnalysis]:
    """Every pair analysed; the first bad one is a ReportError naming it and the command that makes it."""
    analyses = []
    for profile, sweep in pairs:
        line = _missing(profile, sweep)
        if line:
            raise ReportError(line)
        folder = profile.parent.parent
        try:
            analyses.append(analyse(profile, sweep))
        except ProfileError as error:
            raise ReportError(f"{profile}: {error}; make it again with "
                              f"{MAKE_PROFILE.replace('DIR', str(folder))}") from None
        except (ResultsError, ConfigError) as error:
            raise ReportError(f"{error}; make the sweep with {MAKE_SWEEP.replace('DIR', str(folder))}") from None
    return analyses


# ---- writing -----------------------------------------------------------------------------------------------------


def write_atomically(out: Path, fill: Callable[[Path], None]) -> None:
    """``fill`` a temporary folder beside ``out``, then move it into place whole (an older ``out`` is replaced
    only once the new one is complete); nothing is left behind on failure."""
    out = Path(out)
    if out.exists() and not (out.is_dir() and (not any(out.iterdir()) or (out / "report.md").is_file())):
        raise ReportError(f"{out}: exists and is not a report folder (no report.md): give --out a new folder "
                          "or a report's")  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        fill(staging)
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
            os.replace(out, old / out.name)
            os.replace(staging, out)
            shutil.rmtree(old)
        else:
            os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _sections(analyses: Sequence[SweepAnalysis]) -> list[tuple[str, list]]:
    """The report's sections: (heading, blocks), a block being a paragraph or a Table."""
    from analysis import report_text as text

    t = report_tables
    return [
        ("Headline (held out)", [text.HEADLINE, t.headline(analyses), text.headline_numbers(analyses)]),
        ("What is compared", [text.COMPARED]),
        ("Verification fraction rho, held out", [text.RHO_HELD_OUT, t.rho_held_out(analyses)]),
        ("Verification fraction rho, in sample", [text.RHO_IN_SAMPLE, t.rho_in_sample(analyses)]),
        ("How much of rho's residual each ingredient removes", [text.REMOVED, t.residual_removed(analyses),
                                                                text.BY_CLASS, t.residual_by_class(analyses)]),
        ("Misfit 1: the lead at verify time is not a fixed gamma (in sample)", [text.LEADS, t.leads(analyses)]),
        ("Misfit 2: acceptance depends on the draft position", [text.POSITION, t.by_position(analyses)]),
        ("Misfit 3: a verification follows whenever drafts wait (in sample)",
         [text.TRANSITIONS, t.transitions(analyses)]),
        ("Tokens per step, held out (Eq. 1 / 4)", [text.TOKENS, t.tokens_per_step(analyses)]),
        ("Speedup, held out (Eq. 4 / 5 / 6 and ours)", [text.SPEEDUP, t.speedups(analyses)]),
        ("Misfit 4: a step is not one time unit (in sample)", [text.TIMING, t.timing(analyses)]),
        ("Coverage of ours' 95% intervals, held out", [text.COVERAGE, t.coverage(analyses)]),
    ]


def markdown(analyses: Sequence[SweepAnalysis], figures: Sequence[tuple[str, str]], command: str) -> str:
    from analysis import report_text as text

    lines = [f"# {TITLE}", "", text.intro(analyses, command), ""]
    for heading, blocks in _sections(analyses):
        lines += [f"## {heading}", ""]
        for block in blocks:
            lines += [block.markdown() if isinstance(block, Table) else block, ""]
    lines += ["## Figures", ""]
    for name, caption in figures:
        lines += [f"![{caption}](figures/{name}.png)", "", f"{caption} (`figures/{name}.png`, `.pdf`)", ""]
    return "\n".join(lines).rstrip() + "\n"


def build_model_report(pairs: Sequence[tuple[Path, Path]], out: Path, command: str) -> Path:
    """Analyse every paired validation, then write out/report.md and out/figures/ whole; ReportError on bad input."""
    analyses = read_validations(pairs)

    def fill(folder: Path) -> None:
        drawn = report_figures.draw(analyses, folder / "figures")
        (folder / "report.md").write_text(markdown(analyses, drawn, command))

    write_atomically(out, fill)
    return out / "report.md"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m analysis.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", type=Path,
                        help="paired validations (or folders of them); or run directories for the per-run report")
    parser.add_argument("--pair", nargs=2, action="append", type=Path, metavar=("PROFILE", "SWEEP"), default=[],
                        help="a profile.json and the sweep it predicts (repeatable)")
    parser.add_argument("--out", type=Path, default=None, help=f"output folder (default {DEFAULT_OUT})")
    parser.add_argument("--official", type=Path, default=None,
                        help="per-run report only: also compare both models on the authors' logs in this folder")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        pairs, runs = classify(args.paths)
        pairs += [(Path(p), Path(s)) for p, s in args.pair]
        if runs:
            return _run_report(runs, args.out or Path("report"), args.official)
        pairs = pairs or default_validations()
        command = " ".join(["python -m analysis.report", *(sys.argv[1:] if argv is None else argv)])
        path = build_model_report(pairs, args.out or DEFAULT_OUT, command)
    except ReportError as error:
        print(f"error: {error}", file=sys.stderr)  # one line, no traceback
        return 2
    print(f"wrote {path}")
    return 0


def _run_report(runs: Sequence[Path], out: Path, official: Path | None) -> int:
    """The per-run in-sample report (`analysis.report_runs`), written whole."""
    written: list[str] = []

    def fill(folder: Path) -> None:
        md_path, html_path = build_report(runs, folder, official)
        written.extend([md_path.name, html_path.name])

    try:
        write_atomically(out, fill)
    except (ResultsError, ReportError) as error:
        print(f"error: {error}", file=sys.stderr)  # one line, no traceback
        return 2
    for name in written:
        print(f"wrote {out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
