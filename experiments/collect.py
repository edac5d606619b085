"""Gather run directories into one table with speedups against the matching greedy runs; paper tables of
paired sweeps; Table 2.

    python -m experiments.collect DIR... [--csv FILE] [--markdown FILE]
    python -m experiments.collect SWEEP_DIR... [--no-write]
    python -m experiments.collect --table2 [SWEEP_DIR...] [--out results/tables]

DIR is a run directory or any directory holding runs (e.g. a multirun). Prints the Markdown table; writes
CSV / Markdown files when asked (atomically).

SWEEP_DIR is a paired sweep (`python -m experiments.sweep`: its runs' records name their prompt slot): its
paper table (`analysis.tables.sweep_table`) is printed and written beside it as table.md and table.tex
(Markdown and booktabs LaTeX), unless --no-write. A sweep without paired.json is one error line naming the
command that makes it.

--table2 writes Table 2 for HumanEval (`analysis.tables.table2_humaneval`): the authors' LLaMA-3.1-70B rows
from their logs (results/official/humaneval) and, beside them, greedy and the fastest SD and PipeSpec
configuration of each sweep given (by default the committed paired HumanEval sweeps), as
table2_humaneval.md / .tex in --out.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from analysis.collect import collect, format_csv, format_markdown
from analysis.import_official import OfficialLogError
from analysis.rundir import ResultsError, atomic_write_text
from analysis.tables import TABLE2_SWEEPS, sweep_table, table2_humaneval, to_latex, to_markdown

TABLE2_OUT = "results/tables"


def is_sweep_dir(path: Path) -> bool:
    """A paired sweep's directory: it holds paired.json, or runs whose records name their prompt slot."""
    if (path / "paired.json").is_file():
        return True
    for samples in sorted(path.glob("*/samples.jsonl"))[:3]:
        with open(samples, encoding="utf-8", errors="replace") as handle:
            first = handle.readline()
        try:
            if isinstance(json.loads(first), dict) and "slot" in json.loads(first):
                return True
        except ValueError:
            continue
    return False


def write_tables(table, stem: Path, write: bool) -> None:
    """Print the table's Markdown; write STEM.md and STEM.tex (atomically) unless `write` is off."""
    markdown = to_markdown(table)
    print(markdown)
    if write:
        atomic_write_text(stem.with_suffix(".md"), markdown)
        atomic_write_text(stem.with_suffix(".tex"), to_latex(table))
        print(f"wrote {stem}.md and {stem}.tex", file=sys.stderr)


def table2(sweeps: list[str], out: str, write: bool) -> None:
    """Table 2 for HumanEval into OUT/table2_humaneval.md / .tex (by default the committed sweeps)."""
    command = "python -m experiments.collect --table2" + "".join(f" {s}" for s in sweeps)
    if out != TABLE2_OUT:
        command += f" --out {out}"
    table = table2_humaneval(sweeps or TABLE2_SWEEPS, command=command)
    if write:
        Path(out).mkdir(parents=True, exist_ok=True)
    write_tables(table, Path(out) / "table2_humaneval", write)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="*", help="run directories, directories holding runs, or paired sweeps")
    parser.add_argument("--csv", help="also write the runs table as CSV to this file")
    parser.add_argument("--markdown", help="also write the runs table's Markdown to this file")
    parser.add_argument("--table2", action="store_true", help="Table 2 (HumanEval): the authors' rows and ours")
    parser.add_argument("--out", default=TABLE2_OUT, help="folder of --table2's files (default %(default)s)")
    parser.add_argument("--no-write", action="store_true", help="print paper tables only, write no file")
    args = parser.parse_args(argv)
    if not args.dirs and not args.table2:
        parser.error("give run directories or sweeps, or --table2")
    try:
        if args.table2:
            table2(args.dirs, args.out, not args.no_write)
            return 0
        sweeps = [d for d in args.dirs if is_sweep_dir(Path(d))]
        for sweep in sweeps:
            write_tables(sweep_table(sweep), Path(sweep) / "table", not args.no_write)
        others = [d for d in args.dirs if d not in sweeps or args.csv or args.markdown]
        if others:
            runs_table(others, args.csv, args.markdown)
    except (ResultsError, OfficialLogError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


def runs_table(dirs: list[str], csv_path: str | None, markdown_path: str | None) -> None:
    """The runs table of `analysis.collect`: printed, and written where asked."""
    rows = collect(dirs)
    table = format_markdown(rows)
    print(table)
    if csv_path:
        atomic_write_text(csv_path, format_csv(rows))
    if markdown_path:
        atomic_write_text(markdown_path, table + "\n")


if __name__ == "__main__":
    sys.exit(main())
