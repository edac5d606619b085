"""Tests of analysis.figures and analysis.report on the tiny fixture runs and the published logs.

Figures must be written as PNG and PDF, skipped with a note where their data
is absent; the report must hold each run's measured tokens/s with both models'
predictions and errors, embed its figures in the HTML, and turn a foreign or
corrupted directory into a one-line error naming it. analysis/ must never
import torch.
"""

import base64
import copy
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from analysis import evaluate, figures, report
from analysis import import_official as official
from analysis.runs import find_runs, greedy_reference, select_runs

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURE = REPO_ROOT / "tests" / "fixtures" / "results_tiny"
OFFICIAL_DIR = official.DEFAULT_DIR  # results/official/humaneval, committed with its licence
OFFICIAL_FIGURES = ("fig3_accepted_histogram", "fig4_lookahead", "fig5_gpu_utilisation", "rho_alpha",
                    "model_measured", "speedup_depth")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _run(*args, timeout=180):
    return subprocess.run([sys.executable, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)


# --------------------------------------------------------------------------- figures


@pytest.mark.skipif(not OFFICIAL_DIR.is_dir(), reason=f"official logs absent: {OFFICIAL_DIR}")
@pytest.mark.xdist_group("official_logs")  # with the other tests of the published logs' predictions
@pytest.mark.slow  # every figure, from the published logs' predictions
def test_all_figures_from_logs_and_fixture(tmp_path):
    written, notes = figures.make_figures(OFFICIAL_DIR, FIXTURE, tmp_path)
    names = {p.name for p in written}
    for figure in OFFICIAL_FIGURES:
        for suffix in ("png", "pdf", "csv"):
            assert f"{figure}_official.{suffix}" in names, notes
    # the fixture has one lookahead per strategy: no lookahead curve, said in a note
    assert "fig4_lookahead_ours.png" not in names
    assert any("fig4_lookahead_ours" in note and "lookahead" in note for note in notes)
    for figure in ("fig3_accepted_histogram", "fig5_timeline", "rho_alpha", "model_measured", "speedup_depth"):
        assert f"{figure}_ours.png" in names, notes
    for path in written:
        data = path.read_bytes()
        if path.suffix == ".png":
            assert data.startswith(PNG_MAGIC)
        elif path.suffix == ".pdf":
            assert data.startswith(b"%PDF")
    assert "figures.csv" in names


def test_cli_skips_absent_sources_with_a_note(tmp_path):
    """A source left out on request (--only) is skipped with a note; an absent one stops the command (exit status
    2, one line naming it) before anything is written."""
    done = _run("-m", "analysis.figures", "--only", "ours", "--results", str(FIXTURE), "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert "note: skipped the published logs" in done.stdout and "Traceback" not in done.stderr
    assert (tmp_path / "out" / "rho_alpha_ours.png").read_bytes().startswith(PNG_MAGIC)
    assert (tmp_path / "out" / "rho_alpha_ours.pdf").exists()
    assert not list((tmp_path / "out").glob("*_official.*"))
    done = _run("-m", "analysis.figures", "--official", str(tmp_path / "no_logs"), "--results", str(FIXTURE),
                "--out", str(tmp_path / "out2"))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().count("\n") == 0 and str(tmp_path / "no_logs") in done.stderr
    assert not (tmp_path / "out2").exists()


def test_speedup_figure_uses_the_greedy_run():
    runs = find_runs([FIXTURE])
    assert greedy_reference(runs[2], runs) is runs[0]


def test_runs_are_selected_by_what_they_are(tmp_path):
    """A synthetic-acceptance run or one of another budget never joins the exact runs' figures, and a
    sampled run never meets a greedy-decoded reference."""
    runs = find_runs([FIXTURE])
    synthetic = copy.deepcopy(runs[2])
    synthetic.summary.update(acceptance="synthetic", lossless=False, synthetic_rate=0.5)
    other_budget = copy.deepcopy(runs[0])
    other_budget.summary["n_samples"] = runs[0].n_samples + 1
    sampled = copy.deepcopy(runs[1])
    sampled.summary["sampling"] = {"temperature": 0.7}
    pool = runs + [synthetic, other_budget, sampled]
    assert select_runs(pool, lossless=False) == [synthetic]
    assert greedy_reference(sampled, pool) is None  # only greedy-decoded AR runs here
    assert greedy_reference(synthetic, pool) is runs[0]
    sets = figures.exact_run_sets(pool)
    assert list(sets.values()) == [runs]  # the other budget holds only a greedy run: no figure of its own
    assert set(figures.synthetic_figures(pool)) == {"synthetic_acceptance"}


@pytest.mark.skipif(not OFFICIAL_DIR.is_dir(), reason=f"official logs absent: {OFFICIAL_DIR}")
def test_official_gpu_figure_averages_active_gpus_only():
    logs = official.load_dir(OFFICIAL_DIR)
    drawn = figures.official_figures(logs, OFFICIAL_DIR)["fig5_gpu_utilisation"]()
    greedy = next(g for g in official.largest_target_logs(logs) if g.strategy == "greedy")
    raw = json.loads(greedy.path.read_text())
    devices = [int(d.split(":")[1]) for c in raw["metadata"]["model_configs"] for d in c["devices"]]
    stats = raw["results"][0]["gpustats"]
    expected = sum(s["gpu_utilizations"][g] for s in stats for g in devices) / (len(stats) * len(devices))
    everything = sum(sum(s["gpu_utilizations"]) for s in stats) / (len(stats) * len(stats[0]["gpu_utilizations"]))
    row = drawn.rows[0]
    assert row["panel"].startswith("greedy") and row["mean_utilisation_percent_per_active_gpu"] == pytest.approx(expected)
    assert expected > everything  # the idle GPUs would have diluted it
    assert row["energy_j_per_token_per_active_gpu"] > 0
    assert "70B (GPU" in row["active_gpus"] or "70B" in row["active_gpus"]


@pytest.mark.skipif(not OFFICIAL_DIR.is_dir(), reason=f"official logs absent: {OFFICIAL_DIR}")
def test_rho_alpha_has_a_colour_bar_and_says_lower_bound():
    logs = official.load_dir(OFFICIAL_DIR)
    drawn = figures.official_figures(logs, OFFICIAL_DIR)["rho_alpha"]()
    main_axis, bar = drawn.fig.axes[:2]
    assert "lower bound" in main_axis.get_xlabel() and "MLE" not in main_axis.get_xlabel()
    assert "gamma" in bar.get_ylabel()


# --------------------------------------------------------------------------- report


@pytest.fixture(scope="module")
def fixture_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    md_path, html_path = report.build_report([FIXTURE], out)
    return out, md_path.read_text(), html_path.read_text()


def test_report_holds_both_models_errors_per_run(fixture_report):
    out, md, page = fixture_report
    evaluations = evaluate.evaluate_runs(find_runs([FIXTURE]))
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
    # every number is labelled: the wall-clock model is an in-sample decomposition, no held-out prediction
    assert "| ours tok/s (in-sample) |" in md and "| in-sample decomposition |" in md
    assert md.count("| held-out prediction | none |") == len(evaluations)


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
    code = ("import sys, analysis.fit, analysis.evaluate, analysis.predict, analysis.figures, analysis.report, analysis.runs, "
            "analysis.simulate, analysis.import_official, analysis.paper_model; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert _run("-c", code).returncode == 0
