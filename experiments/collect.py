"""Gather run directories into one table with speedups against the matching greedy runs.

    python -m experiments.collect DIR... [--csv FILE] [--markdown FILE]

DIR is a run directory or any directory holding runs (e.g. a multirun). Prints
the Markdown table; writes CSV / Markdown files when asked (atomically).
"""

from __future__ import annotations

import argparse
import sys

from analysis.collect import collect, format_csv, format_markdown
from analysis.rundir import ResultsError, atomic_write_text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", help="run directories, or directories holding runs")
    parser.add_argument("--csv", help="also write the table as CSV to this file")
    parser.add_argument("--markdown", help="also write the Markdown table to this file")
    args = parser.parse_args(argv)
    try:
        rows = collect(args.dirs)
    except ResultsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    table = format_markdown(rows)
    print(table)
    if args.csv:
        atomic_write_text(args.csv, format_csv(rows))
    if args.markdown:
        atomic_write_text(args.markdown, table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
