"""``paper_figures/README.md``, written by ``python -m analysis.figures``: how the set is made, then one caption per
figure (what it shows, its data, runs, machine and files), then both models on the published 70B logs."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from analysis import import_official as official
from analysis.figures.common import COMMAND, DEFAULT_RESULTS, MANIFEST, SUFFIXES, shown

INTRO = """# paper_figures/

<!-- Written by `{command}` (analysis/figures/readme.py): regenerate, do not edit. -->

The paper's figures and our model checks, from the authors' published HumanEval logs
(`*_official.*`, `results/official/humaneval/`) and from our paired sweeps (`*_ours.*`). Every figure
is a PNG (300 dpi), a vector PDF (no dates in either) and a CSV of the values it plots, one row per
point or bar, with their 95% intervals (`*_low`, `*_high`) and the log or run each came from;
`{manifest}` lists each figure with its data, run selection, machine and caption. Regenerate all of
them, exactly as committed, with

    .venv/bin/python -m analysis.figures

Defaults: `--official {official}`, `--out paper_figures` and `--results`:

{results}

A missing or partial input (the logs, a sweep, a run without its summary or its greedy run) stops the command with one line
naming it and the command that makes it, exit status 2, before anything is written; files the command
does not make are never touched. `tests/test_figures_regen.py` checks that the figures, the manifest,
this README and every CSV come out identical.

Intervals: a speedup is the paired speedup of `python -m analysis.paired` (per prompt and repetition
against greedy run seconds apart, geometric mean over prompts) with its 95% interval with prompts
resampled; any other value of our runs is the mean over prompts of each prompt's mean over its
repetitions, with its 95% interval from the same bootstrap. The published logs' means of samples
carry their interval over the samples (a log's samples are HumanEval problems in the same order in
every log, so their speedups are paired problem by problem too). `news_lee` is a stand-in for CNN/DM
(news articles of the Lee corpus with the CNN/DM prompt, no reference summaries), labelled so in
every figure.
"""


def _caption(row: dict) -> str:
    name = row["figure"]
    files = ", ".join(f"[`{name}.{s}`]({name}.{s})" for s in SUFFIXES)
    return "\n".join([
        f"### `{name}`", "", f"![{name}]({name}.png)", "", row["caption"], "",
        f"- Data: {row['data']}.", f"- Runs: {row['selection']}.", f"- Machine: {row['machine']}.",
        f"- Files: {files}.", f"- Made by: `{COMMAND}`.", ""])


def _models_table(predictions) -> str:
    lines = ["## The two models on the published 70B logs", "",
             "`.venv/bin/python -m analysis.evaluate --official results/official/humaneval --tolerance 0.15` "
             "(ms/token; also checked by `tests/test_wallclock.py`):", "",
             "| log | measured | ours | error | paper | error | alphas (source) |", "|---|---|---|---|---|---|---|"]
    for row in predictions:
        paper = "-" if row.paper_ms is None else f"{row.paper_ms:.2f}"
        paper_error = "-" if row.paper_error is None else f"{100 * row.paper_error:+.1f}%"
        alphas = "/".join(f"{a:.3f}" for a in row.alphas) or "-"
        lines.append(f"| {row.file} | {row.measured_ms:.2f} | {row.ours_ms:.2f} | {100 * row.ours_error:+.1f}% | "
                     f"{paper} | {paper_error} | {alphas} ({row.alpha_source}) |")
    lines += ["", "Ours is the discrete-event simulator (`analysis.simulate`) with each log's mean step time per "
              "stage, an in-sample decomposition. SD replays the logged accepted counts (window: lookahead - 1 "
              "drafts). The async logs never recorded how many drafts were offered, so per pair an alpha is "
              "calibrated until the simulated mean accepted per verification equals the logged one. The paper's "
              "model prices a 70B verification like a one-token step (its time unit), hence its large errors.", ""]
    return "\n".join(lines)


def readme(manifest: Sequence[dict], predictions, official_dir: Path | None) -> str:
    """The README text of a figure set (``manifest``: its rows; ``predictions``: both models on the logs)."""
    results = "\n".join(f"- `{shown(p)}`" for p in DEFAULT_RESULTS)
    text = INTRO.format(command=COMMAND, manifest=MANIFEST, official=shown(official.DEFAULT_DIR), results=results)
    parts = [text, "## Figures", ""] + [_caption(row) for row in manifest]
    if predictions:
        parts.append(_models_table(predictions))
    return "\n".join(parts).rstrip("\n") + "\n"
