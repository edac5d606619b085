"""Tests of analysis.figures and analysis.report on the tiny fixture runs and the published logs.

Figures must be written as PNG and PDF, skipped with a note where their data
is absent; the report must hold each run's measured tokens/s with both models'
predictions and errors, embed its figures in the HTML, and turn a foreign or
corrupted directory into a one-line error naming it. analysis/ must never
import torch.
"""

import base64
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from analysis import figures, report, wallclock
from analysis.results import find_runs

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURE = REPO_ROOT / "tests" / "fixtures" / "results_tiny"
OFFICIAL_DIR = REPO_ROOT.parent / "shared/reference/pipespec-official-results/humaneval"
FIGURES = ("fig3_accepted_histogram", "fig4_lookahead", "fig5_timeline", "rho_alpha", "predicted_measured",
           "speedup_depth")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _run(*args, timeout=180):
    return subprocess.run([sys.executable, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)


# --------------------------------------------------------------------------- figures


@pytest.mark.skipif(not OFFICIAL_DIR.is_dir(), reason=f"official logs absent: {OFFICIAL_DIR}")
def test_all_figures_from_logs_and_fixture(tmp_path):
    written, notes = figures.make_figures(OFFICIAL_DIR, FIXTURE, tmp_path)
    names = {p.name for p in written}
    for figure in FIGURES:
        for suffix in ("png", "pdf"):
            assert f"{figure}_official.{suffix}" in names, notes
    # the fixture has one lookahead per strategy: no lookahead curve, said in a note
    assert "fig4_lookahead_ours.png" not in names
    assert any("fig4_lookahead_ours" in note and "lookahead" in note for note in notes)
    for figure in ("fig3_accepted_histogram", "fig5_timeline", "rho_alpha", "predicted_measured", "speedup_depth"):
        assert f"{figure}_ours.png" in names, notes
    for path in written:
        data = path.read_bytes()
        assert data.startswith(PNG_MAGIC) if path.suffix == ".png" else data.startswith(b"%PDF")


def test_cli_skips_absent_sources_with_a_note(tmp_path):
    done = _run("-m", "analysis.figures", "--official", str(tmp_path / "no_logs"), "--results", str(FIXTURE),
                "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert "note: skipped the published logs" in done.stdout and "Traceback" not in done.stderr
    assert (tmp_path / "out" / "rho_alpha_ours.png").read_bytes().startswith(PNG_MAGIC)
    assert (tmp_path / "out" / "rho_alpha_ours.pdf").exists()
    assert not list((tmp_path / "out").glob("*_official.*"))


def test_speedup_figure_uses_the_greedy_run():
    runs = find_runs([FIXTURE])
    greedy = figures._greedy_for(runs[2], runs)
    assert greedy is runs[0]


# --------------------------------------------------------------------------- report


@pytest.fixture(scope="module")
def fixture_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    md_path, html_path = report.build_report([FIXTURE], out)
    return out, md_path.read_text(), html_path.read_text()


def test_report_holds_both_models_errors_per_run(fixture_report):
    out, md, page = fixture_report
    evaluations = wallclock.evaluate_runs(find_runs([FIXTURE]))
    assert "| ours error |" in md and "| paper error |" in md
    for evaluation in evaluations:
        row = next(line for line in md.splitlines() if line.startswith(f"| {evaluation.run.label} |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[5] == f"{evaluation.measured_tokens_per_s:.2f}"
        assert cells[6] == f"{evaluation.ours.tokens_per_s:.2f}"
        assert cells[7] == f"{100 * evaluation.ours_error:+.1f}%"
        assert cells[9] == f"{100 * evaluation.paper_error:+.1f}%"
        assert f"Run: {evaluation.run.label}" in md
    assert "rho (Eq. 3)" in md and "alpha (MLE +- se)" in md
    assert "3/3 runs within 15%" in md


def test_report_html_is_self_contained(fixture_report):
    out, md, page = fixture_report
    images = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", page)
    assert len(images) >= 4
    assert all(base64.b64decode(image).startswith(PNG_MAGIC) for image in images)
    assert not re.search(r"src='(?!data:)", page)  # nothing loaded from elsewhere
    linked = re.findall(r"\]\((figures/[^)]+\.png)\)", md)
    assert linked and all((out / path).is_file() for path in linked)


def test_report_rejects_foreign_and_corrupted_directories(tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "data.csv").write_text("a,b\n1,2\n")
    done = _run("-m", "analysis.report", str(foreign), "--out", str(tmp_path / "out"))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().count("\n") == 0 and str(foreign) in done.stderr
    broken = tmp_path / "broken"
    shutil.copytree(FIXTURE / "2_pipespec_L0", broken)
    (broken / "traces" / "00001.json.gz").write_bytes(b"\x1f\x8b truncated")
    done = _run("-m", "analysis.report", str(broken), "--out", str(tmp_path / "out"))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().count("\n") == 0 and "00001.json.gz" in done.stderr


def test_analysis_never_imports_torch():
    code = ("import sys, analysis.fit, analysis.wallclock, analysis.figures, analysis.report, analysis.results, "
            "analysis.simulate, analysis.import_official, analysis.paper_model; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert _run("-c", code).returncode == 0
