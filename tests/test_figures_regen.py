"""`python -m analysis.figures` with its defaults regenerates exactly the committed paper_figures/.

Regenerates every figure from the committed results/ (the authors' logs in results/official and our
paired sweeps) into a temporary folder, then checks that the same figures are made (no committed figure
the command no longer makes, none missing), that the manifest (each figure's data source, run selection,
machine and caption), the captions README and each figure's data table (CSV) are identical to the
committed ones. Checks the committed files are fit for a paper (300 dpi, at most 7.2 in wide, an interval
beside every measured value, a caption per figure), and that a missing or partial input stops the
command with one line and exit status 2 before anything is written.
"""

import csv
import io
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from analysis import figures, style
from analysis.figures import output

# the official logs' predictions are remembered per process (analysis.evaluate): the tests that need them share
# one xdist worker (scripts/test.sh runs --dist loadgroup) and compute them once
pytestmark = pytest.mark.xdist_group("official_logs")
SLOW_FIXTURES = ('regenerated',)  # every figure regenerated: their tests are `slow` (conftest.py)

REPO_ROOT = Path(__file__).resolve().parents[1]
COMMITTED = REPO_ROOT / "paper_figures"
OFFICIAL = figures.DEFAULT_OFFICIAL
INCHES_PER_METRE = 39.3700787


@pytest.fixture(scope="session")  # not module: other modules' tests of its xdist group run between its tests
def regenerated(tmp_path_factory):
    assert OFFICIAL.is_dir(), f"the authors' logs are committed at {OFFICIAL}"
    out = tmp_path_factory.mktemp("paper_figures")
    written, notes = figures.make_figures(OFFICIAL, figures.DEFAULT_RESULTS, out)
    return out, written, notes


def _figure_files(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir() if p.suffix in {".png", ".pdf", ".csv"}}


def _manifest(folder: Path = COMMITTED) -> list[dict]:
    return list(csv.DictReader(io.StringIO((folder / figures.MANIFEST).read_text())))


def test_the_same_figures_from_the_same_sources(regenerated):
    out, _, notes = regenerated
    assert _figure_files(out) == _figure_files(COMMITTED), notes
    committed = (COMMITTED / figures.MANIFEST).read_text()
    assert (out / figures.MANIFEST).read_text() == committed
    assert (out / figures.README).read_text() == (COMMITTED / figures.README).read_text()
    rows = _manifest()
    listed = {name for row in rows for name in row["files"].split()} | {figures.MANIFEST}
    assert listed == _figure_files(COMMITTED), "a committed file that no figure lists, or the reverse"
    for row in rows:
        assert row["data"] and row["selection"] and row["caption"] and row["machine"], row["figure"]


def test_each_figure_data_table_is_identical(regenerated):
    out, _, _ = regenerated
    tables = sorted(p.name for p in COMMITTED.glob("*.csv"))
    assert len(tables) > 10
    for name in tables:
        assert (out / name).read_text() == (COMMITTED / name).read_text(), f"{name} differs on regeneration"


def test_synthetic_runs_only_in_their_own_figure(regenerated):
    out, _, _ = regenerated
    for path in out.glob("*.csv"):
        text = path.read_text()
        if path.name.startswith("synthetic_acceptance"):
            assert "synthetic_sweep" in text
        elif path.name != figures.MANIFEST:
            assert "synthetic_sweep" not in text, f"{path.name} draws synthetic-acceptance runs"
    manifest = {row["figure"]: row for row in _manifest(out)}
    assert figures.SYNTHETIC_LABEL in manifest["synthetic_acceptance_ours"]["selection"]
    for name, row in manifest.items():
        if name.endswith("_ours") and not name.startswith("synthetic"):
            assert "synthetic_sweep" not in row["data"] and row["selection"].startswith("exact (lossless)")


def test_files_carry_no_timestamps(regenerated):
    out, _, _ = regenerated
    for path in out.glob("*.pdf"):
        assert b"/CreationDate" not in path.read_bytes(), path.name
    for path in out.glob("*.png"):
        assert b"Software" not in path.read_bytes()[:4096], path.name


def test_ours_figures_come_from_the_paired_sweeps():
    """Both hierarchies (k=2 and k=3) and both datasets, the paired sweeps alone, plainly named."""
    for row in _manifest():
        if row["figure"].endswith("_ours") and not row["figure"].startswith("synthetic"):
            assert "cpu_sweep" not in row["data"], row["figure"]
            for path in figures.SWEEPS.values():
                assert str(path.relative_to(REPO_ROOT)) in row["data"], (row["figure"], path)
    table = (COMMITTED / "fig4_lookahead_ours.csv").read_text()
    for name in ("PipeSpec k=3 (lookup -> int8 -> fp32)", "SD k=2 (int8 -> fp32)", "news_lee (CNN/DM stand-in)",
                 "HumanEval"):
        assert name in table, name
    assert "smollm2_pld_int8_fp32 pipespec" not in table  # no config ids as labels


# --------------------------------------------------------------------------- fit for a paper


def png_size_inches(data: bytes) -> tuple[float, float, float]:
    """(dpi, width in, height in) of a PNG from its IHDR and pHYs chunks (pixels per metre)."""
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    width, height = struct.unpack(">II", data[16:24])
    at = data.find(b"pHYs")
    assert at > 0, "no pHYs chunk: no resolution recorded"
    per_x, per_y, unit = struct.unpack(">IIB", data[at + 4:at + 13])
    assert unit == 1 and per_x == per_y  # metres, square pixels
    dpi = per_x / INCHES_PER_METRE
    return dpi, width / dpi, height / dpi


def test_every_committed_png_is_300_dpi_and_fits_a_page():
    pngs = sorted(COMMITTED.glob("*.png"))
    assert len(pngs) >= 13
    for path in pngs:
        dpi, width, height = png_size_inches(path.read_bytes())
        assert round(dpi) == style.DPI, (path.name, dpi)
        assert width <= style.MAX_WIDTH, (path.name, width)
        assert 1.0 < height < 9.0, (path.name, height)
        assert path.with_suffix(".pdf").read_bytes().startswith(b"%PDF"), path.name
    fonts = {key: size for key, size in style.RC.items() if key == "font.size" or key.endswith(
        ("labelsize", "titlesize", "fontsize"))}
    assert len(fonts) == 6 and min(fonts.values()) >= 8, f"fonts below 8 pt: {fonts}"


def _measured_columns(header: list[str]) -> list[str]:
    return [c for c in header if f"{c}_low" in header and f"{c}_high" in header]


def test_every_measured_value_has_an_interval():
    """Every "ours" data table, and every official one that shows a mean of samples, carries its 95% intervals
    (`X`, `X_low`, `X_high`), each interval around its value."""
    checked = 0
    for path in sorted(COMMITTED.glob("*.csv")):
        if path.name == figures.MANIFEST or path.name == "rho_alpha_official.csv":  # pooled estimates: no mean
            continue
        rows = list(csv.DictReader(io.StringIO(path.read_text())))
        measured = _measured_columns(list(rows[0]))
        assert measured, f"{path.name}: no interval columns"
        for column in measured:
            for row in rows:
                if row[column] and row[f"{column}_low"] and not column.startswith("measured_tokens"):
                    low, value, high = (float(row[f"{column}_low"]), float(row[column]), float(row[f"{column}_high"]))
                    assert low <= value * (1 + 1e-6) + 1e-9 and value <= high * (1 + 1e-6) + 1e-9, (path.name, column)
        checked += 1
    assert checked >= 12


def test_a_caption_per_figure_in_the_readme():
    readme = (COMMITTED / figures.README).read_text()
    rows = _manifest()
    assert len(rows) >= 13
    for row in rows:
        name = row["figure"]
        section = readme.split(f"### `{name}`\n", 1)
        assert len(section) == 2, f"no caption section for {name}"
        body = section[1].split("\n### ", 1)[0]
        assert row["caption"] in body and f"({name}.png)" in body and "Machine: " in body, name
        assert figures.COMMAND in body
    assert "shared/reference" not in readme and "results/official/humaneval" in readme


def test_renders_are_deterministic():
    """The same figure rendered twice gives the same PNG and PDF bytes (no dates, a fixed hash salt)."""
    from analysis import import_official as official

    logs = official.load_dir(OFFICIAL)
    build = figures.official_figures(logs, OFFICIAL)["fig4_lookahead"]
    first, second = ([output.rendered(d) for _, d, _ in output.drawn_figures({"f": build})][0] for _ in range(2))
    assert first["png"] == second["png"] and first["pdf"] == second["pdf"]


# --------------------------------------------------------------------------- missing or partial inputs


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "analysis.figures", *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=300)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


@pytest.fixture()
def out_folder(tmp_path):
    """An output folder holding a committed-like figure set: the manifest, the README and one figure."""
    out = tmp_path / "out"
    out.mkdir()
    for name in (figures.MANIFEST, figures.README, "fig4_lookahead_official.png", "fig4_lookahead_official.csv"):
        shutil.copy(COMMITTED / name, out / name)
    return out


def _stops(done: subprocess.CompletedProcess, out: Path, before: dict, *named: str) -> None:
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and done.stderr.strip().count("\n") == 0, done.stderr
    assert done.stdout == ""
    for text in named:
        assert text in done.stderr, (text, done.stderr)
    assert _snapshot(out) == before, "the output folder changed"


def test_missing_official_logs_stop_with_one_line_and_change_nothing(tmp_path, out_folder):
    before = _snapshot(out_folder)
    missing = tmp_path / "no_logs"
    _stops(_cli("--official", str(missing), "--out", str(out_folder)), out_folder, before, str(missing),
           "git checkout -- results/official")


def test_a_missing_sweep_stops_with_its_command(tmp_path, out_folder):
    before = _snapshot(out_folder)
    missing = tmp_path / "no_sweep"
    _stops(_cli("--only", "ours", "--results", str(missing), "--out", str(out_folder)), out_folder, before,
           str(missing.name))
    # a default sweep's message names the script that makes it
    sweep = next(iter(figures.SWEEPS.values()))
    message = output._makes(sweep)
    assert "bash scripts/validation_paired.sh" in message and "HIERARCHIES=" in message


def test_an_unfinished_run_stops_before_anything_is_written(tmp_path, out_folder):
    partial = tmp_path / "sweep"
    shutil.copytree(REPO_ROOT / "tests" / "fixtures" / "results_tiny", partial)
    (partial / "3_sd_L4").mkdir()
    shutil.copy(partial / "1_sd_L2" / "config.yaml", partial / "3_sd_L4" / "config.yaml")  # killed before its summary
    before = _snapshot(out_folder)
    _stops(_cli("--only", "ours", "--results", str(partial), "--out", str(out_folder)), out_folder, before,
           "3_sd_L4", "unfinished")
    # a speculative run without its greedy run is partial too
    shutil.rmtree(partial / "3_sd_L4")
    shutil.rmtree(partial / "0_greedy")
    _stops(_cli("--only", "ours", "--results", str(partial), "--out", str(out_folder)), out_folder, before,
           "no greedy run")
