"""The model-vs-measurement report (python -m analysis.report): the extended closed forms against the paper's, trace
readings on hand-made steps, the residual tables and a planted misfit on a small copy of a committed paired
validation, the coverage arithmetic on hand-made intervals, and the bad-input line (exit 2, nothing written)."""

import gzip
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from analysis import closed_forms as cf
from analysis import paper_model as pm
from analysis import report, report_model, report_tables
from analysis.report_traces import PairReading, prompt_interval
from analysis.rundir.archive import copy_run

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "results" / "validation_paired" / "smollm2_int8_fp32" / "humaneval"
KEPT = ("greedy", "pipespec_L0_M8", "pipespec_L1_M8", "sd_L2")  # a small sweep: greedy, two pipespec, one sd
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def _call(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "analysis.report", *map(str, args)], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def _copy_validation(into: Path, configurations=KEPT) -> Path:
    """A paired validation with the committed profile and a few of the committed sweep's runs (their traces
    loose, wherever the committed sweep keeps them: `analysis.rundir.archive.copy_run`)."""
    (into / "profile").mkdir(parents=True)
    shutil.copy(SOURCE / "profile" / "profile.json", into / "profile" / "profile.json")
    for name in configurations:
        copy_run(SOURCE / "sweep" / name, into / "sweep" / name)
    return into


# ---- closed forms -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("alpha,gamma", [(0.8, 2), (0.5, 4), (0.95, 8)])
def test_extended_forms_reduce_to_the_papers_eq3_and_eq1(alpha, gamma):
    paper = pm.steady_state_rho(alpha, gamma)
    assert cf.chain_rho(alpha ** (gamma + 1), alpha) == pytest.approx(paper)
    assert cf.eq3_rho(alpha, gamma) == pytest.approx(paper)
    assert cf.lead_rho(alpha, {gamma: 5}) == pytest.approx(paper)  # a lead that is always gamma
    assert cf.position_rho([alpha] * 3, {gamma: 1}) == pytest.approx(paper)  # one rate at every position
    assert cf.tokens_per_verify([alpha], {gamma: 1}) == pytest.approx(pm.expected_tokens_per_verify(alpha, gamma))
    assert cf.tokens_per_step(paper, [alpha], {gamma: 1}) == pytest.approx(pm.pipespec_tokens_per_step(alpha, gamma))
    # supply: the paper's transitions are q_full = 1 after a full acceptance (bonus included), 0 after a rejection
    assert cf.supply_rho(alpha ** (gamma + 1), 1.0, 0.0, alpha) == pytest.approx(paper)
    assert cf.supply_rho(0.3, 1.0, 1.0, 1.0) == 1.0  # drafts always wait: every step verifies


def test_a_lead_distribution_moves_eq3_as_its_windows_do():
    alpha = 0.8
    mixed = cf.lead_rho(alpha, {1: 1, 7: 1})  # mean lead 4, not a fixed window of 4
    p_vv = (alpha ** 2 + alpha ** 8) / 2
    assert mixed == pytest.approx(alpha / (1 - p_vv + alpha))
    assert mixed != pytest.approx(cf.eq3_rho(alpha, 4))
    assert cf.all_accepted([0.5, 0.9], 2) == pytest.approx(0.5 * 0.9 * 0.9)  # the last rate holds on
    with pytest.raises(ValueError):
        cf.normalised({})


# ---- trace readings ------------------------------------------------------------------------------------------


def test_pair_reading_counts_leads_positions_and_transitions():
    reading = PairReading("0:d", "1:t")
    # prefill single, a full accept of 2, a rejection at draft 2 of 3, a single, a full accept of 1
    reading.add_steps("P0", ["single", "verify", "verify", "single", "verify", "draft"], [0, 2, 3, 0, 1, 0],
                      [0, 2, 1, 0, 1, 0], [1, 3, 2, 1, 2, 1])
    assert reading.rho == pytest.approx(3 / 5)
    assert reading.tokens_per_step == pytest.approx(9 / 5)
    assert dict(reading.leads) == {2: 1, 3: 1, 1: 1} and reading.gamma == pytest.approx(2)
    # position 1 tested by all three (kept 3), position 2 by the first two (kept 1: the second rejected it)
    assert reading.rates_by_position() == [1.0, 0.5]
    assert reading.kept_all == pytest.approx(2 / 3)
    assert reading.transition("single") == pytest.approx(1.0)  # both one-token steps were followed by a verify
    assert reading.transition("full") == pytest.approx(1.0) and reading.transition("reject") == 0.0
    assert math.isnan(PairReading("a", "b").transition("full"))


def test_prompt_interval_resamples_whole_prompts():
    counts = {"a": (1, 2), "b": (3, 4)}
    low, high = prompt_interval(list(counts), lambda p: counts[p])
    assert 0.5 <= low <= 4 / 6 <= high <= 0.75
    same = {"a": (1, 2), "b": (2, 4)}
    assert prompt_interval(list(same), lambda p: same[p]) == pytest.approx((0.5, 0.5))


# ---- a small paired validation -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    folder = _copy_validation(tmp_path_factory.mktemp("validation") / "int8" / "humaneval")
    return folder, report_model.analyse(folder / "profile" / "profile.json", folder / "sweep")


def _cells(table, first: dict) -> list[list[str]]:
    """The table's rows whose named columns hold the given texts."""
    index = {name: table.header.index(name) for name in first}
    return [row for row in table.rows if all(row[index[k]] == v for k, v in first.items())]


def test_rho_tables_hold_the_measured_rho_and_each_residual(small):
    folder, analysis = small
    assert not analysis.in_sample and {r.configuration for r in analysis.pairs} == {"pipespec_L0_M8", "pipespec_L1_M8"}
    for row in analysis.pairs:
        summary = json.loads((folder / "sweep" / row.configuration / "summary.json").read_text())
        target = summary["stages"][-1]
        assert row.rho == pytest.approx(target["verify_steps"] / (target["verify_steps"] + target["single_steps"]))
        assert row.rho_interval[0] <= row.rho <= row.rho_interval[1]
        profiled = json.loads((folder / "profile" / "profile.json").read_text())
        alpha = sum(row.profile_rates) / len(row.profile_rates)
        assert row.held_out["eq3"] == pytest.approx(pm.steady_state_rho(alpha, 8))  # gamma = max lead
        assert row.in_sample["eq3"] == pytest.approx(cf.eq3_rho(row.reading.alpha, row.reading.gamma))
        assert profiled["pairs"][0]["acceptance_by_position"][: len(row.profile_rates)] == pytest.approx(
            list(row.profile_rates))
    held = report_tables.rho_held_out([analysis])
    for row in analysis.pairs:
        (cells,) = _cells(held, {"configuration": report_tables.config(row.configuration)})
        assert cells[held.header.index("measured rho")] == f"{row.rho:.3f}"
        assert cells[7] == f"{100 * (row.held_out['eq3'] / row.rho - 1):+.1f}%"  # Eq. 3's residual
        assert cells[9] == f"{100 * (row.held_out['ours'] / row.rho - 1):+.1f}%"
    # lookahead 1 waits for drafts: measured rho ~1, Eq. 3 far below, the supply form at 1
    waits = next(r for r in analysis.pairs if r.configuration == "pipespec_L1_M8")
    assert waits.rho > 0.95 and waits.held_out["eq3"] < 0.6 and waits.held_out["supply"] == 1.0
    assert waits.reading.transition("reject") == pytest.approx(1.0)
    by_class = report_tables.residual_by_class([analysis])
    assert [row[:2] for row in by_class.rows] == [["model drafter, lookahead 0", "1"],
                                                   ["model drafter, lookahead >= 1 (the verifier waits)", "1"]]
    supply = abs(waits.held_out["supply"] / waits.rho - 1)
    assert by_class.rows[1][-1].startswith(f"{100 * supply:.1f}%")


def test_speedup_rows_are_the_validations_and_intervals_nest(small):
    _, analysis = small
    assert [r.record.configuration for r in analysis.rates] == [r.configuration for r in analysis.report.records
                                                                 if not r.is_reference]  # fmt: skip
    for row in analysis.rates:
        low, high = row.prediction_interval
        c_low, c_high = row.record.predicted_interval
        assert low < c_low <= row.record.predicted_speedup <= c_high < high  # the prediction interval is wider
    table = report_tables.speedups([analysis])
    assert all(cells[7] in ("yes", "no") for cells in table.rows)


def test_a_planted_lead_distribution_shows_in_the_lead_table(tmp_path):
    folder = _copy_validation(tmp_path / "planted", ("greedy", "pipespec_L0_M8"))
    traces = sorted((folder / "sweep" / "pipespec_L0_M8" / "traces").glob("*.json.gz"))
    for path in traces:  # every target verification offers 1 or 8 drafts, alternately, and keeps none
        data = json.loads(gzip.decompress(path.read_bytes()))
        steps = data["stages"][-1]["steps"]
        rows = [i for i, kind in enumerate(steps["kind"]) if kind == "verify"]
        for n, i in enumerate(rows):
            steps["offered"][i], steps["accepted"][i] = (1, 0) if n % 2 == 0 else (8, 0)
        path.write_bytes(gzip.compress(json.dumps(data).encode()))
    analysis = report_model.analyse(folder / "profile" / "profile.json", folder / "sweep")
    (row,) = analysis.pairs
    assert set(row.reading.leads) == {1, 8} and abs(row.reading.leads[1] - row.reading.leads[8]) <= len(traces)
    assert row.reading.rates_by_position() == [0.0] and row.reading.alpha == 0.0
    table = report_tables.leads([analysis])
    (cells,) = table.rows
    assert cells[table.header.index("range")] == "1-8"
    assert float(cells[table.header.index("share at max lead or more")]) == pytest.approx(0.5, abs=0.05)
    assert float(cells[table.header.index("mean lead")]) == pytest.approx(4.5, abs=0.3)


# ---- coverage ---------------------------------------------------------------------------------------------------


def _rate(measured, predicted, interval, prediction_interval):
    record = SimpleNamespace(measured_speedup=measured, predicted_speedup=predicted, predicted_interval=interval)
    return SimpleNamespace(record=record, prediction_interval=prediction_interval)


def test_coverage_counts_and_the_leave_one_sweep_out_width():
    rates = [_rate(1.5, 1.4, (1.35, 1.45), (1.3, 1.6)), _rate(1.2, 1.4, (1.35, 1.45), (1.3, 1.5)),
             _rate(1.0, 1.0, None, None)]
    assert report_tables.coverage_counts(rates) == (1, 2, 0, 2)
    a = SimpleNamespace(rates=rates[:2], in_sample=False)
    b = SimpleNamespace(rates=[_rate(2.0, 1.0, (0.9, 1.1), (0.8, 1.2))], in_sample=False)
    sigma_b = report_tables.model_error(b.rates)
    assert sigma_b == pytest.approx(math.log(2.0))
    widened = report_tables.with_model_error(rates[1], sigma_b)
    assert widened[0] < 1.2 < widened[1]  # b's error of a factor 2 widens a's interval past its miss
    assert report_tables.calibrated_counts([a, b])[0] == (2, 2)


def test_prediction_interval_adds_the_sweeps_prompts_and_repetitions():
    record = SimpleNamespace(predicted_interval=(1.0 / math.exp(0.1), math.exp(0.1)), predicted_speedup=1.0,
                             prompts=8, measurement_interval=(math.exp(-0.05), math.exp(0.05)))
    low, high = report_model.prediction_interval(record, 10)
    expected = math.sqrt((0.1 * math.sqrt(1 + 10 / 8)) ** 2 + 0.05 ** 2)
    assert math.log(high) == pytest.approx(expected) and math.log(low) == pytest.approx(-expected)
    assert report_model.prediction_interval(SimpleNamespace(predicted_interval=None), 10) is None


# ---- the command ------------------------------------------------------------------------------------------------


def test_the_command_writes_the_report_whole(tmp_path, small):
    folder, _ = small
    assert report.classify([folder / "sweep"]) == ([(folder / "profile" / "profile.json", folder / "sweep")], [])
    out = tmp_path / "out"
    done = _call(folder.parent, "--out", out)
    assert done.returncode == 0, done.stderr[-3000:]
    text = (out / "report.md").read_text()
    for heading in ("## Headline (held out)", "rho, held out", "rho, in sample",
                    "Coverage of ours' 95% intervals, held out",
                    "Misfit 1: the lead at verify time", "Misfit 4: a step is not one time unit (in sample)"):
        assert heading in text
    for name in report.report_figures.FIGURES:
        assert (out / "figures" / f"{name}.png").stat().st_size > 0 and (out / "figures" / f"{name}.pdf").is_file()
        assert f"](figures/{name}.png)" in text
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging folder left


def _one_error_line(done, *words):
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.startswith("error: ") and done.stderr.strip().count("\n") == 0, done.stderr
    assert all(word in done.stderr for word in words), done.stderr


def test_bad_inputs_are_one_line_with_the_command_that_makes_them(tmp_path):
    out = tmp_path / "out"
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "data.csv").write_text("a,b\n1,2\n")
    _one_error_line(_call(foreign, "--out", out), str(foreign), "scripts/validation_paired.sh", "summary.json")
    traceless = _copy_validation(tmp_path / "traceless", ("greedy", "sd_L2"))
    shutil.rmtree(traceless / "sweep" / "sd_L2" / "traces")
    _one_error_line(_call(traceless, "--out", out), "no traces", "python -m experiments.sweep")
    (traceless / "profile" / "profile.json").unlink()
    _one_error_line(_call(traceless, "--out", out), "profile.json", "python -m experiments.profile")
    _one_error_line(_call(traceless / "sweep", "--out", out), "profile.json", "python -m experiments.profile")
    _one_error_line(_call("--pair", foreign / "profile.json", foreign, "--out", out), "profile.json",
                    "python -m experiments.profile")
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_an_existing_folder_that_is_no_report_is_left_alone(tmp_path, small):
    folder, _ = small
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "notes.txt").write_text("mine")
    _one_error_line(_call(folder.parent, "--out", keep), str(keep), "report.md")
    assert (keep / "notes.txt").read_text() == "mine"
