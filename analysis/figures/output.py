"""Making the figure set: inputs checked first (a missing or partial one stops with one line, exit status 2, and
nothing written), every figure drawn and rendered in memory, then its PNG (300 dpi), PDF, CSV, the manifest
``figures.csv`` and the captions ``README.md`` written; nothing else in the output folder is touched."""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from typing import Callable, Iterator, Sequence

import matplotlib.pyplot as plt

from analysis import evaluate, style
from analysis import import_official as official
from analysis.figures.common import (COMMAND, MAKES, MANIFEST, MANIFEST_COLUMNS, README, SUFFIXES, Drawn, fmt,
                                     shown)
from analysis.figures.logs import official_figures
from analysis.figures.ours import ours_figures
from analysis.figures.synthetic import synthetic_figures
from analysis.rundir import CONFIG, SUMMARY
from analysis.runs import ResultsError, Run, find_runs, greedy_reference, select_runs


class InputError(Exception):
    """A missing or partial input of the figures (message: one line naming it and the command that makes it)."""


def _makes(path: Path) -> str:
    """The command that makes ``path`` (one of the defaults), or how to point at another."""
    for known, command in MAKES.items():
        if Path(path).resolve() == known.resolve():
            return f"make it with `{command}`"
    return f"name an existing folder (the defaults: {COMMAND} --help)"


def check_official(directory: Path) -> list[official.OfficialLog]:
    """The authors' logs of ``directory`` (or its one subfolder of logs), or an InputError naming it."""
    try:
        return official.load_dir(directory)
    except official.OfficialLogError as error:
        raise InputError(f"the authors' published logs are missing or unreadable ({error}); they are committed "
                         f"at {shown(official.DEFAULT_DIR)}: restore them with `git checkout -- results/official` "
                         "or name them with --official DIR") from None


def check_results(paths: Sequence[Path]) -> list[Run]:
    """Every run of ``paths``, or an InputError: a folder missing, a run left unfinished (config.yaml without
    summary.json) or unreadable, or a speculative exact run without its greedy run."""
    runs: list[Run] = []
    for path in map(Path, paths):
        if not path.is_dir():
            raise InputError(f"{shown(path)}: no such folder (our runs); {_makes(path)}")
        unfinished = sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith(".")
                            and (p / CONFIG).is_file()
                            and not (p / SUMMARY).is_file())
        if unfinished:
            raise InputError(f"{shown(unfinished[0])}: an unfinished run ({CONFIG} without {SUMMARY}); "
                             f"{_makes(path)} (a sweep resumes where it stopped)")
        try:
            runs += find_runs([path])
        except ResultsError as error:
            raise InputError(f"{error}; {_makes(path)}") from None
    for run in select_runs(runs, lossless=True, sampled=False):
        if run.strategy != "greedy" and greedy_reference(run, runs) is None:
            raise InputError(f"{shown(run.path)}: no greedy run of the same target, dataset and budget beside it; "
                             f"{_makes(run.path.parent)}")
    return runs


def drawn_figures(builders: dict[str, Callable[[], Drawn]]
                  ) -> Iterator[tuple[str, Drawn | None, Exception | None]]:
    """Each figure built in the paper style, one at a time and in order, as (name, figure, None), or as
    (name, None, why) when its data is missing; the caller saves it (within the style as well)."""
    for name, build in builders.items():
        try:
            with style.paper():
                drawn, reason = build(), None
        except (LookupError, ValueError, ResultsError, official.OfficialLogError) as error:
            drawn, reason = None, error
        yield name, drawn, reason


def png_bytes(fig, dpi: int = 110) -> bytes:
    """A figure as PNG bytes for a report page (screen resolution; the paper files are ``style.DPI``)."""
    buffer = io.BytesIO()
    with style.paper():
        fig.savefig(buffer, format="png", dpi=dpi, metadata=style.PNG_METADATA)
    plt.close(fig)
    return buffer.getvalue()


def rows_csv(rows: Sequence[dict]) -> str:
    columns: list[str] = []
    for row in rows:
        columns += [c for c in row if c not in columns]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows({c: fmt(row.get(c)) for c in columns} for row in rows)
    return buffer.getvalue()


def rendered(drawn: Drawn) -> dict[str, bytes]:
    """A figure's files: PNG at 300 dpi and PDF (no dates or versions in their metadata), and its data as CSV."""
    files = {}
    with style.paper():
        for suffix, metadata in (("png", style.PNG_METADATA), ("pdf", style.PDF_METADATA)):
            buffer = io.BytesIO()
            drawn.fig.savefig(buffer, format=suffix, dpi=style.DPI, metadata=metadata)
            files[suffix] = buffer.getvalue()
    plt.close(drawn.fig)
    files["csv"] = rows_csv(drawn.rows).encode()
    return files


def render(builders: dict[str, Callable[[], Drawn]], source: str, notes: list[str], manifest: list[dict],
           files: dict[str, bytes]) -> None:
    """Build and render each figure into ``files`` (name -> bytes); a figure whose data is missing becomes a note."""
    for name, drawn, reason in drawn_figures(builders):
        full = f"{name}_{source}"
        if drawn is None:
            notes.append(f"skipped {full}: {reason}")
            continue
        for suffix, data in rendered(drawn).items():
            files[f"{full}.{suffix}"] = data
        manifest.append({"figure": full, "files": " ".join(f"{full}.{s}" for s in SUFFIXES),
                         "data": "; ".join(drawn.sources), "selection": drawn.selection, "machine": drawn.machine,
                         "caption": drawn.caption})


def _write(out: Path, files: dict[str, bytes]) -> list[Path]:
    """Each file written whole (a temporary name, then renamed over the old one)."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, data in files.items():
        path = out / name
        partial = out / f".{name}.part"
        partial.write_bytes(data)
        os.replace(partial, path)
        written.append(path)
    return written


def make_figures(official_dir: Path | None, results: Path | Sequence[Path] | None, out: Path
                 ) -> tuple[list[Path], list[str]]:
    """Every figure of both sources, ``figures.csv`` and ``README.md`` in ``out``; returns (files written, notes).
    ``official_dir`` / ``results`` None: that source is skipped (a note says so). A missing or partial input
    raises ``InputError`` before anything is written."""
    from analysis.figures.readme import readme

    notes: list[str] = []
    logs = check_official(Path(official_dir)) if official_dir is not None else None
    if isinstance(results, (str, Path)):
        results = [results]
    runs = check_results([Path(p) for p in results]) if results is not None else None
    manifest: list[dict] = []
    files: dict[str, bytes] = {}
    predictions = None
    if logs is None:
        notes.append("skipped the published logs (no --official)")
    else:
        render(official_figures(logs, Path(official_dir)), "official", notes, manifest, files)
        predictions = evaluate.official_predictions(official.log_dir(official_dir))
    if runs is None:
        notes.append("skipped our runs (no --results)")
    else:
        render({**ours_figures(runs), **synthetic_figures(runs)}, "ours", notes, manifest, files)
        sampled = select_runs(runs, sampled=True)
        if sampled:
            notes.append(f"{len(sampled)} sampled runs: no figure draws sampled runs yet "
                         "(never against greedy references)")
    if not manifest:
        return [], notes + ["no figure made: nothing written"]
    files[MANIFEST] = rows_csv([{c: row[c] for c in MANIFEST_COLUMNS} for row in manifest]).encode()
    files[README] = readme(manifest, predictions, official_dir).encode()
    return _write(Path(out), files), notes
