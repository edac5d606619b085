"""`python -m analysis.figures` with its defaults regenerates exactly the committed paper_figures/.

Regenerates every figure from the committed results/ and the authors' logs into a
temporary folder, then checks that the same figures are made (no committed figure
the command no longer makes, none missing), that the manifest (each figure's data
source, run selection and caption) is identical, and that each figure's data
table (CSV) is identical to the committed one. Skips when the logs are absent.
"""

import csv
import io
from pathlib import Path

import pytest

from analysis import figures

# the official logs' predictions are remembered per process (analysis.evaluate): the tests that need them share
# one xdist worker (scripts/test.sh runs --dist loadgroup) and compute them once
pytestmark = pytest.mark.xdist_group("official_logs")
SLOW_FIXTURES = ('regenerated',)  # every figure regenerated: their tests are `slow` (conftest.py)

REPO_ROOT = Path(__file__).resolve().parents[1]
COMMITTED = REPO_ROOT / "paper_figures"
OFFICIAL = figures.DEFAULT_OFFICIAL


@pytest.fixture(scope="session")  # not module: other modules' tests of its xdist group run between its tests
def regenerated(tmp_path_factory):
    if not OFFICIAL.is_dir():
        pytest.skip(f"official logs absent: {OFFICIAL}")
    out = tmp_path_factory.mktemp("paper_figures")
    written, notes = figures.make_figures(OFFICIAL, figures.DEFAULT_RESULTS, out)
    return out, written, notes


def _figure_files(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir() if p.suffix in {".png", ".pdf", ".csv"}}


def test_the_same_figures_from_the_same_sources(regenerated):
    out, _, notes = regenerated
    assert _figure_files(out) == _figure_files(COMMITTED), notes
    committed = (COMMITTED / figures.MANIFEST).read_text()
    assert (out / figures.MANIFEST).read_text() == committed
    rows = list(csv.DictReader(io.StringIO(committed)))
    listed = {name for row in rows for name in row["files"].split()} | {figures.MANIFEST}
    assert listed == _figure_files(COMMITTED), "a committed file that no figure lists, or the reverse"
    for row in rows:
        assert row["data"] and row["selection"] and row["caption"], row["figure"]


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
    manifest = {row["figure"]: row for row in csv.DictReader(io.StringIO((out / figures.MANIFEST).read_text()))}
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
