"""The paper's figures, from the authors' published logs and from our paired sweeps (no torch).

    python -m analysis.figures [--official DIR] [--results DIR...] [--only official|ours] [--out paper_figures]

With its defaults it regenerates exactly the committed ``paper_figures/`` set from the repository alone: each
figure ``<figure>_<source>`` as a 300 dpi PNG, a vector PDF and a CSV of the values it plots (with their 95%
intervals and the log or run each came from), ``figures.csv`` (the manifest: each figure's data, runs, machine
and caption) and ``README.md`` (one caption per figure). Sources:

- ``official``: the authors' HumanEval logs (``--official``, default ``results/official/humaneval``);
- ``ours``: exact (lossless), greedy-decoded runs under ``--results`` (default: the paired sweeps of int8 -> fp32
  and lookup -> int8 -> fp32 on HumanEval and news_lee, ``results/validation_paired/*/*/sweep``), drawn together
  where they share dataset, budget and decoding, each against the greedy run it was paired with;
- ``synthetic``: runs with synthetic acceptance (not lossless, ``results/synthetic_sweep``), only in the figure
  made for them.

A missing or partial input stops the command with one line (exit status 2) naming it and the command that makes
it, before anything is written; a file the command does not make is never touched.

Figures: ``fig3_accepted_histogram``, ``fig4_lookahead``, ``fig5_gpu_utilisation`` (official) /
``fig5_timeline`` (ours), ``rho_alpha``, ``model_measured``, ``speedup_depth``, ``synthetic_acceptance``.
``official_figures`` / ``ours_figures`` / ``synthetic_figures`` return thunks that build a ``Drawn`` (figure,
data rows, sources, caption), so ``analysis.report`` reuses them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from analysis import import_official as _official
from analysis.figures.common import (BINS, COMMAND, DEFAULT_OUT, DEFAULT_RESULTS, IN_SAMPLE, MANIFEST,
                                     MANIFEST_COLUMNS, NO_ENERGY, README, SUFFIXES, SYNTHETIC, SWEEPS,
                                     SYNTHETIC_LABEL, Drawn, bin_label, binned_shares)
from analysis.figures.logs import OFFICIAL_FIGURES, gpu_panel_data, official_figures
from analysis.figures.ours import OURS_FIGURES, exact_run_sets, ours_figures
from analysis.figures.output import InputError, drawn_figures, make_figures, png_bytes, rows_csv
from analysis.figures.synthetic import synthetic_figures

DEFAULT_OFFICIAL = _official.DEFAULT_DIR

__all__ = ["BINS", "COMMAND", "DEFAULT_OFFICIAL", "DEFAULT_OUT", "DEFAULT_RESULTS", "Drawn", "IN_SAMPLE",
           "InputError", "MANIFEST", "MANIFEST_COLUMNS", "NO_ENERGY", "OFFICIAL_FIGURES", "OURS_FIGURES", "README",
           "SUFFIXES", "SWEEPS", "SYNTHETIC", "SYNTHETIC_LABEL", "bin_label", "binned_shares", "drawn_figures",
           "exact_run_sets", "gpu_panel_data", "main", "make_figures", "official_figures", "ours_figures",
           "png_bytes", "rows_csv", "synthetic_figures"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    parser.add_argument("--official", type=Path, default=DEFAULT_OFFICIAL,
                        help="the authors' logs, or the folder holding their humaneval/ subfolder "
                             f"(default {DEFAULT_OFFICIAL})")
    parser.add_argument("--results", type=Path, nargs="+", default=list(DEFAULT_RESULTS),
                        help="run directories or folders holding them (default: the paired sweeps "
                             f"{', '.join(str(p) for p in SWEEPS.values())} and {SYNTHETIC})")
    parser.add_argument("--only", choices=("official", "ours"),
                        help="draw one source alone (into another --out: the manifest lists only what is made)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    try:
        written, notes = make_figures(None if args.only == "ours" else args.official,
                                      None if args.only == "official" else args.results, args.out)
    except InputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"note: {note}")
    for path in written:
        print(f"wrote {path}")
    return 0
