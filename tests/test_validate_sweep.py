"""Validation on a paired sweep (analysis.validate PROFILE SWEEP_DIR): a tiny k = 2 profile and a tiny sweep of
held-out prompts, every figure of the report checked against a computation of its own here (from the sweep's
files, the profile and analysis.predict); in-sample labelling, the bad inputs, the ranking and noise-floor
statistics on hand-made numbers, and the acceptance's standard error and the prediction's interval on a
hand-made profile."""

import dataclasses
import gzip
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy.stats import spearmanr

from analysis import paired as pa
from analysis import predict as pr
from analysis import profile as pf
from analysis import validate as va
from analysis.paired import PairedSpeedup, Sample

# its module-scoped fixtures are built once: every test of the module on one xdist worker (--dist loadgroup),
# the worker of test_profile_predict.py, so that the session's measured tiny_k2 profile is measured once
pytestmark = pytest.mark.xdist_group("tiny_k2_profile")
SLOW_FIXTURES = ('tiny_profile', 'swept')  # a measured profile and a paired sweep: their tests are `slow` (conftest.py)


ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
CONFIGS = ("configurations=[{strategy: sd, lookahead: 2}, {strategy: sd, lookahead: 3}, "
           "{strategy: pipespec, lookahead: 0, max_lead: 4}]")  # fmt: skip


def _call(*args, timeout=300):
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def tiny_profile(tiny_k2_profile):
    """Acceptance on HumanEval/0 and 1: the sweep's prompts (2 and 3) are held out (conftest.py: measured
    once, shared with test_profile_predict.py)."""
    return tiny_k2_profile


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep")
    done = _call("-m", "experiments.sweep", "models=tiny_k2", "dataset=humaneval", "samples=2", "prompt_offset=2",
                 "repetitions=2", "max_new_tokens=8", "warmup_tokens=2", "progress=false", CONFIGS,
                 f"hydra.run.dir={out}")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def report(tiny_profile, swept):
    done = _call("-m", "analysis.validate", str(tiny_profile), str(swept), "--json", timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines() if line.strip()]


def _log_speedup(swept: Path, name: str, repetition: int | None = None) -> float:
    """The geometric-mean paired speedup by hand: per prompt the mean log ratio over its repetitions."""
    rate = {(r["slot"]["prompt"], r["slot"]["repetition"]): r["new_tokens"] / r["time_s"]
            for r in _records(swept / name)}  # fmt: skip
    base = {(r["slot"]["prompt"], r["slot"]["repetition"]): r["new_tokens"] / r["time_s"]
            for r in _records(swept / "greedy")}  # fmt: skip
    per_prompt: dict[str, list[float]] = {}
    for (prompt, rep), value in rate.items():
        if repetition is None or rep == repetition:
            per_prompt.setdefault(prompt, []).append(math.log(value / base[(prompt, rep)]))
    return statistics.mean(statistics.mean(v) for v in per_prompt.values())


def _prediction(profile, swept: Path, name: str):
    records = _records(swept / name)
    strategy = yaml.safe_load((swept / name / "config.yaml").read_text())["strategy"]
    tokens = round(sum(r["new_tokens"] for r in records) / len(records))
    prompt = round(statistics.mean(r["prompt_tokens"] for r in records))
    return pr.predict_profile(profile, strategy["name"], strategy.get("lookahead", 0), strategy.get("max_lead", 8),
                              tokens, prompt_tokens=prompt)  # fmt: skip


def _target_counts(records: list[dict]) -> tuple[float | None, float, float]:
    target = [r["stages"][-1] for r in records]
    verify, single = sum(t["verify_steps"] for t in target), sum(t["single_steps"] for t in target)
    length = (sum(t["accepted"] for t in target) + verify) / verify if verify else None
    return length, sum(t["steps"] for t in target) / sum(r["new_tokens"] for r in records), verify / (verify + single)


def _greedy_speed_factor(trace: dict, target: pf.StageProfile, prompt_tokens: int) -> float:
    """A greedy sample's target steps over the profile's t(1), each at its own context: the prompt and the i
    tokens generated before step i (each token beyond the first prompt's adds the context slope's share)."""
    steps = trace["stages"][-1]["steps"]
    rows = range(1, len(steps["fed"]))
    assert all(steps["fed"][i] == 1 for i in rows)
    t1, per_token = target.step_s_alone[0], dict(target.context_slopes)[1]
    profile = sum(t1 * max(1 + per_token * (prompt_tokens + i - target.context_tokens), 0.5) for i in rows)
    return sum(steps["t_end"][i] - steps["t_start"][i] for i in rows) / profile


def test_the_speedups_are_the_paired_ones_and_the_predicted_ones_the_profiles(tiny_profile, swept, report):
    profile = pf.load_profile(tiny_profile)
    records = {r["configuration"]: r for r in report["records"]}
    assert set(records) == {"greedy", "sd_L2", "sd_L3", "pipespec_L0_M4"}
    assert report["records"][0]["configuration"] == "greedy"
    assert report["in_sample"] is False and report["seen"] == [] and report["prompts"] == ["HumanEval/2", "HumanEval/3"]
    greedy = _prediction(profile, swept, "greedy")
    for name, record in records.items():
        assert record["measured_speedup"] == pytest.approx(math.exp(_log_speedup(swept, name)))
        low, high = record["measurement_interval"]
        assert low <= record["measured_speedup"] <= high and record["prompts"] == 2 and record["repetitions"] == 2
        ours = _prediction(profile, swept, name)
        assert record["predicted_speedup"] == pytest.approx(ours.tokens_per_s / greedy.tokens_per_s)
        assert record["paper_speedup"] == pytest.approx(ours.paper_predicted_tokens_per_s / greedy.tokens_per_s)
        assert record["speedup_error"] == pytest.approx(record["predicted_speedup"] / record["measured_speedup"] - 1)
        if ours.tokens_per_s_interval is not None:
            assert record["predicted_interval"] == pytest.approx([t / greedy.tokens_per_s
                                                                  for t in ours.tokens_per_s_interval])  # fmt: skip
        floor = (high - low) / (2 * record["measured_speedup"])
        assert record["speedup_floor"] == (None if name == "greedy" else pytest.approx(floor))
    assert records["greedy"]["measured_speedup"] == pytest.approx(1.0) and records["greedy"]["counts"] == []


def test_the_counts_are_the_runs_pooled_stage_statistics(tiny_profile, swept, report):
    profile = pf.load_profile(tiny_profile)
    for record in report["records"][1:]:
        name = record["configuration"]
        samples = _records(swept / name)
        length, steps, verify = _target_counts(samples)
        counts = {c["figure"]: c for c in record["counts"]}
        assert [c["figure"] for c in record["counts"]] == [va.ACCEPTANCE, va.STEPS, va.VERIFY]
        assert counts[va.ACCEPTANCE]["stage"] == profile.stages[-1].name
        assert counts[va.ACCEPTANCE]["measured"] == (None if length is None else pytest.approx(length))
        assert counts[va.STEPS]["measured"] == pytest.approx(steps)
        assert counts[va.VERIFY]["measured"] == pytest.approx(verify)
        ours = _prediction(profile, swept, name)
        assert counts[va.ACCEPTANCE]["predicted"] == (None if ours.acceptance_lengths[-1] is None
                                                      else pytest.approx(ours.acceptance_lengths[-1]))  # fmt: skip
        assert counts[va.STEPS]["predicted"] == pytest.approx(1 / ours.tokens_per_target_step)
        assert counts[va.VERIFY]["predicted"] == pytest.approx(ours.verify_fraction)
        paper = pr.paper_profile_counts(profile, (0, 1), ours.strategy, ours.lookahead, ours.max_lead)
        assert counts[va.STEPS]["paper"] == pytest.approx(paper["target_steps_per_token"])
        for count in record["counts"]:
            if count["measured"] and count["predicted"] is not None:
                assert count["error"] == pytest.approx(count["predicted"] / count["measured"] - 1)
        by_repetition = [_target_counts([s for s in samples if s["slot"]["repetition"] == r])[1] for r in (0, 1)]
        spread = (max(by_repetition) - min(by_repetition)) / (max(by_repetition) + min(by_repetition))
        assert counts[va.STEPS]["floor"] == pytest.approx(spread)


def test_tokens_per_s_at_the_machines_speed_and_the_schedule(tiny_profile, swept, report):
    profile = pf.load_profile(tiny_profile)
    greedy_dir = swept / "greedy"
    prompts = {r["index"]: r["prompt_tokens"] for r in _records(greedy_dir)}
    traces = [json.loads(gzip.decompress(path.read_bytes()))
              for path in sorted((greedy_dir / "traces").glob("*.json.gz"))]  # fmt: skip
    factors = [_greedy_speed_factor(trace, profile.stages[-1], prompts[trace["index"]]) for trace in traces]
    machine = statistics.median(factors)
    for record in report["records"]:
        samples = _records(swept / record["configuration"])
        measured = sum(r["new_tokens"] for r in samples) / sum(r["time_s"] for r in samples)
        ours = _prediction(profile, swept, record["configuration"])
        assert record["machine_speed"] == pytest.approx(machine)
        assert record["measured_tokens_per_s"] == pytest.approx(measured)
        assert record["at_speed_error"] == pytest.approx(ours.tokens_per_s / machine / measured - 1)
        steps = next((c for c in record["counts"] if c["figure"] == va.STEPS), None)
        expected = record["at_speed_error"] if steps is None else (1 + record["at_speed_error"]) * (
            steps["predicted"] / steps["measured"]) - 1  # fmt: skip
        assert record["schedule_error"] == pytest.approx(expected)
        rates = [sum(r["new_tokens"] for r in samples if r["slot"]["repetition"] == rep)
                 / sum(r["time_s"] for r in samples if r["slot"]["repetition"] == rep) for rep in (0, 1)]  # fmt: skip
        assert record["tokens_per_s_floor"] == pytest.approx((max(rates) - min(rates)) / (max(rates) + min(rates)))
    assert report["error_kinds"]["machine_speed"][0] == pytest.approx(abs(machine - 1))


def test_each_stage_s_steps_by_what_came_before_them(tiny_profile, swept, report):
    """Greedy's target steps (one token each, nothing beside them) against the profile's t(1) at their context,
    told apart by the gap before them, over the machine's speed; every stage of sd's and pipespec's runs."""
    profile = pf.load_profile(tiny_profile)
    target = profile.stages[-1]
    t1, per_token = target.step_s_alone[0], dict(target.context_slopes)[1]
    greedy_dir = swept / "greedy"
    prompts = {r["index"]: r["prompt_tokens"] for r in _records(greedy_dir)}
    by_gap: dict[str, list[float]] = {}
    for path in sorted((greedy_dir / "traces").glob("*.json.gz")):
        trace = json.loads(gzip.decompress(path.read_bytes()))
        steps = trace["stages"][-1]["steps"]
        for i in range(1, len(steps["fed"])):
            cost = t1 * max(1 + per_token * (prompts[trace["index"]] + i - target.context_tokens), 0.5)
            kind = "after a wait" if steps["t_start"][i] - steps["t_end"][i - 1] > 0.002 else "follows its own step"
            by_gap.setdefault(kind, []).append((steps["t_end"][i] - steps["t_start"][i]) / cost)
    records = {r["configuration"]: r for r in report["records"]}
    greedy = records["greedy"]
    expected = {(target.name, kind, "n = 1"): (statistics.median(f) / greedy["machine_speed"], len(f))
                for kind, f in by_gap.items()}
    assert {tuple(row[:3]): (pytest.approx(row[3]), row[4]) for row in greedy["step_factors"]} == expected
    for name, record in records.items():
        if name != "greedy":
            assert {row[0] for row in record["step_factors"]} == {s.name for s in profile.stages}, name
            assert all(row[1] in pa.STEP_CONDITIONS and row[2] in va.STEP_SIZES for row in record["step_factors"])


def test_each_stage_s_busy_share_while_the_target_decodes_beside_the_simulation_s(tiny_profile, swept, report):
    """Per configuration and stage: its steps' seconds after its prefill, within the target's decoding (from the
    end of the target's prefill to the end of its last step), over that time, pooled over the samples; beside
    it the prediction's busy share of that stage."""
    profile = pf.load_profile(tiny_profile)
    names = [s.name for s in profile.stages]
    for record in report["records"]:
        name = record["configuration"]
        busy, span = {}, 0.0
        for path in sorted((swept / name / "traces").glob("*.json.gz")):
            stages = json.loads(gzip.decompress(path.read_bytes()))["stages"]
            start, end = stages[-1]["steps"]["t_end"][0], stages[-1]["steps"]["t_end"][-1]
            span += end - start
            for stage in stages:
                steps = stage["steps"]
                busy[names[stage["stage"]]] = busy.get(names[stage["stage"]], 0.0) + sum(
                    max(0.0, min(b, end) - max(a, start)) for a, b in zip(steps["t_start"][1:], steps["t_end"][1:]))
        ours = _prediction(profile, swept, name)
        expected = {stage: (pytest.approx(seconds / span), pytest.approx(ours.busy_fraction[ours.stages.index(stage)]))
                    for stage, seconds in busy.items()}  # fmt: skip
        assert {stage: (measured, predicted) for stage, measured, predicted in record["busy"]} == expected, name
        assert all(0 < measured <= 1.0 + 1e-9 for _, measured, _ in record["busy"])
    assert {row[0] for row in report["records"][0]["busy"]} == {names[-1]}  # greedy: the target alone


def _every_step(profile, swept: Path) -> dict[str, list[tuple[float, float, float, bool, str]]]:
    """Per stage, every decode step of every configuration: (seconds, the profile's t(n) at its context, other
    stages computing during it (time weighted), whether it came more than 2 ms after the stage's previous step,
    its sample)."""
    rows: dict[str, list[tuple[float, float, float, bool, str]]] = {}
    for name in sorted(p.name for p in swept.iterdir() if (p / "traces").is_dir()):
        prompts = {r["index"]: r["prompt_tokens"] for r in _records(swept / name)}
        for path in sorted((swept / name / "traces").glob("*.json.gz")):
            trace = json.loads(gzip.decompress(path.read_bytes()))
            stages = trace["stages"]
            for stage in stages:
                steps, own = stage["steps"], profile.stages[stage["stage"]]
                cost = pa.profile_step_seconds(steps, pr.sample_cost(own, prompts[trace["index"]]))
                others = [o["steps"] for o in stages if o is not stage and o["steps"]["kind"]]
                for i in range(1, len(steps["fed"])):
                    a, b = steps["t_start"][i], steps["t_end"][i]
                    beside = sum(max(0.0, min(b, e) - max(a, s)) for o in others
                                 for s, e in zip(o["t_start"], o["t_end"])) / (b - a)  # fmt: skip
                    waited = a - steps["t_end"][i - 1] > 0.002
                    rows.setdefault(own.name, []).append((b - a, cost[i], beside, waited, f"{name}/{path.name}"))
    return rows


def test_each_stage_s_costs_during_the_sweep_and_the_speedups_at_them(tiny_profile, swept, report):
    """Every model stage's steps of every configuration (greedy's too) against the profile's t(n) at their context:
    seconds = speed_sample x t(n) x (1 + contention x other model stages computing + wake x after a wait), each
    sample (a call) at its own speed, least squares with contention and wake >= 0 (checked: no worse than a
    general solver's fit of every speed and term at once, a minimum in each term, the speed the pooled one; with
    neither term, the stage's seconds over the profile's), a term only where samples showing both of its regimes
    hold at least 5 steps of each; every speedup predicted again on the profile with those costs (its acceptance
    kept)."""
    from scipy.optimize import least_squares

    profile = pf.load_profile(tiny_profile)
    names = [s.name for s in profile.stages]
    rows = _every_step(profile, swept)
    reported = {row[0]: row[1:4] for row in report["stage_costs"]}
    assert list(reported) == names
    for name in names:
        y, t, m, waited = (np.array(column, dtype=float) for column in list(zip(*rows[name]))[:4])
        calls = np.unique([row[4] for row in rows[name]], return_inverse=True)[1]

        def both_sides(regime):
            on, off = np.bincount(calls, regime), np.bincount(calls, ~regime)
            return min(on[(on > 0) & (off > 0)].sum(), off[(on > 0) & (off > 0)].sum()) >= 5

        speed, contention, wake = reported[name]
        assert (contention is not None, wake is not None) == (both_sides(m >= 0.5), both_sides(waited > 0)), name

        def loss(c, w):  # each sample at its best speed given the terms
            cost = t * (1 + c * m + w * waited)
            return np.sum((y - (np.bincount(calls, y * cost) / np.bincount(calls, cost * cost))[calls] * cost) ** 2)

        c, w = contention or 0.0, wake or 0.0
        shown = [k for k, value in enumerate((contention, wake)) if value is not None]
        count = calls.max() + 1
        general = least_squares(  # every sample's speed and the shown terms at once
            lambda x: x[:count][calls] * t * (1 + sum(x[count + j] * (m, waited)[k] for j, k in enumerate(shown))) - y,
            np.r_[np.ones(count), np.zeros(len(shown))], bounds=(0.0, np.inf))  # fmt: skip
        best = [0.0, 0.0]
        for j, k in enumerate(shown):
            best[k] = general.x[count + j]
        assert loss(c, w) <= loss(*best) * (1 + 1e-6), name
        for k in shown:  # a local minimum over each term (>= 0)
            for step in (-1e-3, 1e-3):
                moved = [c, w]
                moved[k] = max(moved[k] + step, 0.0)
                assert loss(*moved) >= loss(c, w), (name, k, step)
        cost = t * (1 + c * m + w * waited)
        pooled = (y * cost).sum() / (cost * cost).sum() if shown else y.sum() / t.sum()  # neither term: the ratio
        assert speed == pytest.approx(pooled), name
    assert [row[4] for row in report["stage_costs"]] == pytest.approx([pr.profile_contention(profile, i)
                                                                        for i in range(len(names))])  # fmt: skip
    others = len(names) - 1
    stages = tuple(dataclasses.replace(stage, step_s_alone=tuple(x * v for x in stage.step_s_alone),
                                       step_s_loaded=tuple(x * v for x in stage.step_s_loaded) if c is None else
                                       tuple(x * v * (1 + c * others) for x in stage.step_s_alone),
                                       wake=0.0 if w is None else w)
                   for stage, (v, c, w) in zip(profile.stages, reported.values()))  # fmt: skip
    at_costs = dataclasses.replace(profile, stages=stages)
    greedy = _prediction(at_costs, swept, "greedy").predicted_tokens_per_s
    for record in report["records"]:
        if record["configuration"] != "greedy":
            ours = _prediction(at_costs, swept, record["configuration"]).predicted_tokens_per_s / greedy
            assert record["costs_speedup"] == pytest.approx(ours, rel=1e-9), record["configuration"]
    errors = [r["costs_speedup"] / r["measured_speedup"] - 1
              for r in report["records"] if r["configuration"] != "greedy"]
    assert report["error_kinds"]["at_sweep_costs"][1] == pytest.approx(max(map(abs, errors)))


def test_the_ranking_and_the_targets(report, swept):
    records = report["records"]
    names = [r["configuration"] for r in records]
    predicted = np.array([r["predicted_speedup"] for r in records])
    measured = np.array([r["measured_speedup"] for r in records])
    # Spearman by scipy (average ranks for ties: two configurations can be predicted or measured alike)
    assert report["ours"]["spearman"] == pytest.approx(spearmanr(predicted, measured).statistic)
    pick = names[int(np.argmax(predicted))]
    assert report["ours"]["top_pick"] == pick and report["measured_best"] == names[int(np.argmax(measured))]
    assert report["ours"]["regret"] == pytest.approx(1 - measured[names.index(pick)] / measured.max())
    by_repetition = [[math.exp(_log_speedup(swept, n, rep)) for n in names] for rep in (0, 1)]
    assert report["repetition_spearman"] == pytest.approx(spearmanr(*by_repetition).statistic)
    figures = report["figures"]
    errors = [abs(r["speedup_error"]) for r in records[1:]]
    assert figures["speedup_median"]["ours"] == pytest.approx(statistics.median(errors))
    assert figures["speedup_max"]["ours"] == pytest.approx(max(errors))
    assert figures["speedup_max"]["floor"] == pytest.approx(max(r["speedup_floor"] for r in records[1:]))
    counts = [abs(c["error"]) for r in records for c in r["counts"] if c["error"] is not None]
    assert figures["counts_max"]["ours"] == pytest.approx(max(counts))
    assert figures["spearman"]["floor"] == pytest.approx(1 - report["repetition_spearman"])
    # the sweep's prompts: half each speedup's interval over them, relative, beside the speedup figures alone
    prompts = [(r["sampling_interval"][1] - r["sampling_interval"][0]) / (2 * r["measured_speedup"]) for r in records[1:]]
    assert figures["speedup_median"]["prompts"] == pytest.approx(statistics.median(prompts))
    assert figures["speedup_max"]["prompts"] == pytest.approx(max(prompts))
    assert figures["speedup_max"]["prompts_shown"] == (max(prompts) <= 0.15 / 3)
    assert all(figures[k]["prompts"] is None for k in ("regret", "spearman"))
    # each count's: half its interval over the prompts (count_prompt_spreads, checked on hand-made records below)
    spreads = [c["prompts"] for r in records for c in r["counts"] if c["prompts"] is not None]
    assert spreads and figures["counts_max"]["prompts"] == pytest.approx(max(spreads))
    assert figures["counts_median"]["prompts"] == pytest.approx(statistics.median(spreads))
    assert {k: f["target"] for k, f in figures.items()} == va.TARGETS
    for f in figures.values():
        room = 1 - f["target"] if f["at_least"] else f["target"]
        assert f["shown"] == (None if f["floor"] is None else f["floor"] <= room / 3)


def test_the_text_report_puts_the_floor_beside_the_errors(tiny_profile, swept):
    done = _call("-m", "analysis.validate", str(tiny_profile), str(swept), timeout=120)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "held out: none of its 2 prompts" in text and "IN-SAMPLE" not in text
    for part in ("speedup over greedy", "timing-free counts", "tokens/s at the machine's speed", "ranking over",
                 "targets (held out", "speedup, median |error|", "Spearman (predicted vs measured speedups)",
                 "error kinds, median / largest |error|: machine speed",
                 "each model stage's steps by what came before them",
                 "each model stage's busy share while the target decodes"):
        assert part in text, part
    assert ("floor above a third of its target (this sweep cannot show it)" in text
            or "every known floor is below a third of its target" in text)  # fmt: skip
    assert "prompt sampling (the profile's and the sweep's 95% intervals, combined) reaches the speedup error" in text
    assert "sequential runs" not in text


def test_a_sweep_on_the_profiles_own_prompts_is_labelled_in_sample(tiny_profile, swept, tmp_path):
    raw = json.loads(tiny_profile.read_text())
    raw["sample_ids"] = ["HumanEval/3", "HumanEval/9"]
    seen = tmp_path / "seen.json"
    seen.write_text(json.dumps(raw))
    done = _call("-m", "analysis.validate", str(seen), str(swept), "--json", timeout=120)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["in_sample"] is True and found["seen"] == ["HumanEval/3"]
    assert "in-sample" in done.stderr
    text = _call("-m", "analysis.validate", str(seen), str(swept), timeout=120).stdout
    assert "IN-SAMPLE: the profile measured acceptance on 1 of its 2 prompts" in text
    assert "targets (in-sample: a decomposition, not a validation" in text
    report = tmp_path / "seen_report.json"
    report.write_text(done.stdout)
    summed = _call("-m", "analysis.validate", "--summary", str(report), timeout=120)
    assert summed.returncode == 0 and "in-sample sweeps" in summed.stdout and "held-out sweeps" not in summed.stdout


def test_summary_over_sweep_reports_and_sequential_ones(tiny_profile, swept, report, tmp_path):
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(report))
    sequential = _call("-m", "analysis.validate", str(tiny_profile), str(swept / "greedy"), "--json", timeout=120)
    assert sequential.returncode == 0, sequential.stderr
    old = tmp_path / "sequential.json"
    old.write_text(sequential.stdout)
    done = _call("-m", "analysis.validate", "--summary", str(path), str(path), str(old), timeout=120)
    assert done.returncode == 0, done.stderr
    sweeps, _, runs = done.stdout.partition("sequential runs (no pairing)")
    assert "paired held-out sweeps: 2 sweep(s), 6 configurations besides greedy" in sweeps
    figure = report["figures"]["speedup_median"]["ours"]
    assert f"{100 * figure:.1f}%" in sweeps.split("speedup, median |error|")[1].split("\n")[0]  # the report twice
    assert "held-out runs" in runs and "over 1 runs" in runs
    text = _call("-m", "analysis.validate", str(tiny_profile), str(swept / "greedy"), timeout=120).stdout
    assert text.startswith("sequential runs (no pairing)")
    largest = max(abs(r["costs_speedup"] / r["measured_speedup"] - 1) for r in report["records"][1:])
    assert "speedup at the sweep's own stage costs" in sweeps and f"/ {100 * largest:.1f}%\n" in sweeps
    older = tmp_path / "older.json"  # a report written before the costs block: it has none to pool
    older.write_text(json.dumps({**report, "stage_costs": [], "records": [
        {k: v for k, v in r.items() if k != "costs_speedup"} for r in report["records"]]}))  # fmt: skip
    mixed = _call("-m", "analysis.validate", "--summary", str(path), str(older), timeout=120).stdout
    assert "(3 of 6 configurations: reports written before it have none)" in mixed


def _copy(swept: Path, tmp_path: Path, name: str) -> Path:
    copy = tmp_path / name
    shutil.copytree(swept, copy)
    return copy


@pytest.mark.parametrize("damage, message", [
    ("traces", "no traces"),
    ("greedy", "no greedy configuration"),
    ("unpaired", "no configuration shares a prompt and repetition with greedy"),
    ("hierarchy", "validate a sweep with a profile of its own hierarchy"),
    ("mixed", "is a paired sweep: validate it on its own"),
])  # fmt: skip
def test_bad_input_is_one_error_line(tiny_profile, swept, tmp_path, damage, message):
    sweep, profile, extra = _copy(swept, tmp_path, "bad"), tiny_profile, []
    if damage == "traces":
        shutil.rmtree(sweep / "sd_L2" / "traces")
    elif damage == "greedy":
        shutil.rmtree(sweep / "greedy")
    elif damage == "unpaired":
        lines = (sweep / "greedy" / "samples.jsonl").read_text().replace('"prompt": "HumanEval/', '"prompt": "X/')
        (sweep / "greedy" / "samples.jsonl").write_text(lines)
    elif damage == "hierarchy":
        raw = json.loads(tiny_profile.read_text())
        raw["hierarchy"]["name"] = "tiny_k3"
        profile = tmp_path / "k3.json"
        profile.write_text(json.dumps(raw))
    else:
        extra = [str(swept / "greedy")]
    done = _call("-m", "analysis.validate", str(profile), str(sweep), *extra, timeout=120)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines


def test_a_configuration_on_some_of_the_profile_s_stages_is_validated_and_other_stages_are_refused():
    """A sweep entry with `stages` ran some of the hierarchy's stages, ending with its target: validated (its
    prediction runs on those stages); stages in another order, not ending with the target or not the profile's are
    one error, and greedy runs the target alone."""
    from types import SimpleNamespace as Namespace

    from pipespec.errors import ConfigError

    profile = Namespace(stages=[Namespace(name=n) for n in ("a", "b", "c")], hierarchy="h", path="profile.json")

    def sweep(**runs):
        return Namespace(path=Path("sweep"), runs={name: Namespace(hierarchy="h", stage_names=used, strategy=(
            "greedy" if name == "greedy" else "sd")) for name, used in runs.items()})  # fmt: skip

    va.check_hierarchy(profile, sweep(greedy=["2:c"], every=["0:a", "1:b", "2:c"], skip=["0:a", "2:c"], last=["1:b", "2:c"]))
    for used in (["0:a", "1:b"], ["2:c", "0:a"], ["0:a", "2:x"], []):
        with pytest.raises(ConfigError, match="own hierarchy"):
            va.check_hierarchy(profile, sweep(greedy=["2:c"], bad=used))
    with pytest.raises(ConfigError, match="own hierarchy"):
        va.check_hierarchy(profile, sweep(greedy=["0:a", "2:c"]))


# ---- the statistics on hand-made numbers -----------------------------------------------------------------


def test_spearman_with_and_without_ties():
    assert va.spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(1 - 6 * 2 / (4 * 15))
    assert va.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert va.average_ranks([5.0, 1.0, 5.0, 3.0]) == [3.5, 1.0, 3.5, 2.0]
    # ties: Pearson's correlation of the average ranks, by hand
    x, y = [3.5, 1.0, 3.5, 2.0], [4.0, 1.0, 3.0, 2.0]
    mx, my = sum(x) / 4, sum(y) / 4
    expected = sum((a - mx) * (b - my) for a, b in zip(x, y)) / math.sqrt(
        sum((a - mx) ** 2 for a in x) * sum((b - my) ** 2 for b in y))  # fmt: skip
    assert va.spearman([5.0, 1.0, 5.0, 3.0], [9.0, 1.0, 7.0, 2.0]) == pytest.approx(expected)
    assert va.spearman([1, 2], [2, 1]) is None and va.spearman([1, 1, 1], [1, 2, 3]) is None


def test_the_top_pick_and_its_regret():
    predicted = {"greedy": 1.0, "sd": 1.30, "pipespec": 1.20}
    measured = {"greedy": 1.0, "sd": 1.10, "pipespec": 1.25}
    assert va.top_pick(predicted, measured) == ("sd", 1.10, pytest.approx(1 - 1.10 / 1.25))
    rank = va.ranking(predicted, measured)
    assert rank.top_pick == "sd" and rank.spearman == pytest.approx(0.5)
    assert va.top_pick({"a": 2.0, "b": 2.0}, {"a": 1.0, "b": 2.0})[0] == "a"  # a tie: the first
    assert va.top_pick(measured, measured)[2] == 0.0


def test_the_noise_floors():
    assert va.repetition_spread([6.0, 9.0]) == pytest.approx(0.2) and va.repetition_spread([1.0]) is None
    assert va.repetition_spread([2.0, None, 3.0]) == pytest.approx(0.2)
    assert va.relative_half_width((0.9, 1.1), 1.0) == pytest.approx(0.1)
    assert va.relative_error(1.2, 1.0) == pytest.approx(0.2) and va.relative_error(0.0, 0.0) == 0.0
    assert va.relative_error(0.1, 0.0) is None and va.relative_error(None, 1.0) is None

    def speedup(name, center, low, high, repetitions=3):
        return PairedSpeedup(name, center, (low, high), (low, high), 4, repetitions, 4 * repetitions)

    best, close, apart = speedup("a", 1.30, 1.25, 1.35), speedup("b", 1.27, 1.22, 1.31), speedup("c", 1.0, 0.95, 1.1)
    assert va.regret_floor([best, close, apart]) == pytest.approx(1 - 1.27 / 1.30)  # b is not told apart from a
    assert va.regret_floor([best, apart]) == 0.0
    assert va.regret_floor([speedup("a", 1.3, 1.3, 1.3, 1), speedup("b", 1.0, 1.0, 1.0, 1)]) is None
    # two repetitions of three configurations: greedy at 10 tokens/s, a and b swap places in the second
    samples = [Sample(name, prompt, rep, 10, 10 / rate) for prompt in ("p", "q") for rep, rates in
               enumerate([{"greedy": 10, "a": 12, "b": 14}, {"greedy": 10, "a": 15, "b": 13}])
               for name, rate in rates.items()]  # fmt: skip
    assert va.repetition_speedups(samples, 1) == pytest.approx({"greedy": 1.0, "a": 1.5, "b": 1.3})
    assert va.repetition_agreement(samples, ["greedy", "a", "b"]) == pytest.approx(0.5)
    assert va.repetition_agreement([s for s in samples if s.repetition == 0], ["greedy", "a", "b"]) is None
    shown = va._figure(0.04, 0.5, 0.03, 0.06)
    assert shown["met"] is True and shown["shown"] is False  # 3% is above a third of 6%
    assert va._figure(0.9, 0.2, 0.05, 0.8, at_least=True)["shown"] is True  # 1 - rho 0.05 <= 0.2 / 3


def test_a_count_s_spread_over_the_sweep_s_prompts():
    """Two prompts, two repetitions each. Prompt a: the target keeps 20 drafts in 10 verifications and 10
    one-token steps (20 steps, 50 tokens); b: none in 10 verifications and 30 one-token steps (40 steps, 50
    tokens). A draw of prompts pools a, b or both: mean acceptance length 3, 1 or 2, steps per token 0.4, 0.8 or
    0.6, verification fraction 1/2, 1/4 or 1/3; with two prompts a quarter of the draws take one prompt twice,
    so the 95% interval runs from one prompt's value to the other's: half of it over the pooled value."""
    def record(prompt, accepted, single):
        target = {"steps": 10 + single, "verify_steps": 10, "single_steps": single, "accepted": accepted,
                  "offered": 40}  # fmt: skip
        return {"slot": {"prompt": prompt}, "new_tokens": 50, "stages": [{"steps": 60, "draft_steps": 60}, target]}

    records = [record("a", 20, 10), record("b", 0, 30)] * 2
    names = ["draft", "target"]
    assert [v for _, _, v in va.count_values(records, names)] == pytest.approx([2.0, 0.6, 1 / 3])
    spreads = va.count_prompt_spreads(records, names)
    assert spreads == pytest.approx([(3 - 1) / 2 / 2, (0.8 - 0.4) / 2 / 0.6, (1 / 2 - 1 / 4) / 2 / (1 / 3)])
    assert va.count_prompt_spreads([r for r in records if r["slot"]["prompt"] == "a"], names) == [None] * 3


def test_prompt_sampling_reaches_an_error_within_both_prompt_intervals_combined(report):
    """Measured 1.2 with 1.1-1.3 over the sweep's prompts, predicted with 1.0-1.2 over the profile's: prompt
    sampling reaches |log error| sqrt((ln(1.3/1.1)/2)^2 + (ln 1.2/2)^2) = 0.1236; greedy and a prediction without
    an interval are read neither way."""
    sweep = va.read_sweep_report(report, "report.json")
    greedy, record = sweep.records[0], sweep.records[1]
    assert greedy.is_reference
    reach = math.hypot(math.log(1.3 / 1.1) / 2, math.log(1.2) / 2)

    def made(name, predicted, interval=(1.0, 1.2)):
        return dataclasses.replace(record, configuration=name, measured_speedup=1.2, sampling_interval=(1.1, 1.3),
                                   predicted_speedup=predicted, predicted_interval=interval)  # fmt: skip

    inside, outside, low = made("in", 1.2 * math.exp(reach - 0.002)), made("out", 1.2 * math.exp(reach + 0.002)), (
        made("low", 1.2 * math.exp(-reach - 0.002)))  # fmt: skip
    assert va.sampling_reach(inside) == pytest.approx(reach)
    assert va.sampling_reach(made("none", 1.2, None)) is None
    assert va.sampling_reach(dataclasses.replace(inside, prompts=1)) is None  # one prompt: no interval over them
    reading = va.beyond_sampling([greedy, inside, outside, low, made("none", 2.0, None)])
    assert reading == {"within": ["in"], "beyond": ["out", "low"]}
    assert va.sampling_line(reading).endswith("reaches the speedup error of 1 of 3 configurations; beyond it (more "
                                              "than the prompts drawn explain): out, low")  # fmt: skip
    assert va.sampling_line({"within": [], "beyond": []}) is None
    # the sweep's own report reads every configuration with both intervals
    readable = [r["configuration"] for r in report["records"][1:] if r["predicted_interval"] and r["prompts"] > 1]
    assert sorted(report["sampling"]["within"] + report["sampling"]["beyond"]) == sorted(readable)


# ---- the acceptance's standard error and the prediction's interval -------------------------------------------


def _hand_made_profile(runs: list[list[int]]) -> dict:
    rates = [3 / 8, 1 / 3]  # what the walk over the runs below gives (checked in the test)
    stage = {"kind": "hf", "step_s_alone": [0.01, 0.012, 0.014], "step_s_loaded": [0.011, 0.013, 0.015],
             "prefill_s_per_token": 0.001}  # fmt: skip
    return {"format": pf.FORMAT, "version": pf.VERSION, "hierarchy": {"name": "hand"}, "sample_ids": ["a", "b", "c"],
            "dataset": "made", "prompt_tokens": [10, 10, 10], "handoff_s": 0.0,
            "stages": [{"name": "draft", **stage, "step_s_alone": [0.002, 0.0025, 0.003]}, {"name": "target", **stage}],
            "pairs": [{"drafter": "draft", "verifier": "target", "acceptance_by_position": rates, "proposal_rate": 1.0,
                       "mean_proposal_length": 2.0, "runs": runs, "proposed": None}]}  # fmt: skip


def test_acceptance_standard_error_from_the_prompt_to_prompt_spread():
    """Three continuations, two draft positions. The walk offers (offered, accepted) at position 1: (2, 1),
    (4, 0), (2, 2); at position 2: (1, 1), -, (2, 0). The ratio estimator's cluster standard error is
    sqrt(C / (C - 1) * sum (a - r o)^2) / sum o."""
    from experiments.profiler_acceptance import acceptance_by_position

    runs = [[2, 0, 1, 0, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]]
    walk = [pf.walk_counts(r, None, 2) for r in runs]
    assert [(w.offered, w.accepted) for w in walk] == [((2, 1), (1, 1)), ((4, 0), (0, 0)), ((2, 2), (2, 0))]
    assert acceptance_by_position(runs, None, 2)["acceptance_by_position"] == [3 / 8, 1 / 3]
    pair = pf.parse_profile(_hand_made_profile(runs)).pairs[0]
    first = math.sqrt(3 / 2 * ((1 - 0.75) ** 2 + (0 - 1.5) ** 2 + (2 - 0.75) ** 2)) / 8
    second = math.sqrt(2 / 1 * ((1 - 1 / 3) ** 2 + (0 - 2 / 3) ** 2)) / 3
    assert pair.acceptance_se_by_position == pytest.approx((first, second)) and pair.continuations == 3
    assert "0.38+-0.30 0.33+-0.44 (standard errors over 3 prompts)" == pf.format_rates(pair)
    single = pf.parse_profile({**_hand_made_profile(runs[:1]), "sample_ids": ["a"]}).pairs[0]
    assert single.acceptance_se_by_position == (None, None)  # one prompt: no spread
    with pytest.raises(pf.ProfileError, match="proposed"):
        pf.parse_profile({**_hand_made_profile(runs), "pairs": [{**_hand_made_profile(runs)["pairs"][0],
                                                                 "proposed": [[1]]}]})  # fmt: skip


def test_the_prediction_carries_an_interval_over_the_profiles_prompts():
    """sd reads each continuation alone: the interval is the prediction's seconds +- 1.96 standard errors of
    the per-prompt seconds, each computed here from a profile holding that prompt's continuation only."""
    runs = [[2, 0, 1, 0, 0, 2, 2, 1], [0, 0, 0, 0, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1]]
    profile = pf.parse_profile(_hand_made_profile(runs))
    prediction = pr.predict_profile(profile, "sd", 2, tokens=16, prompt_tokens=10)
    alone = [pr.predict_profile(pf.parse_profile(_hand_made_profile([r])), "sd", 2, tokens=16, prompt_tokens=10)
             for r in runs]  # fmt: skip
    half = 1.96 * statistics.stdev(p.seconds for p in alone) / math.sqrt(3)
    expected = (16 / (prediction.seconds + half), 16 / (prediction.seconds - half))
    assert prediction.tokens_per_s_interval == pytest.approx(expected)
    low, high = prediction.tokens_per_s_interval
    assert low < prediction.tokens_per_s < high
    greedy = pr.predict_profile(profile, "greedy", tokens=16, prompt_tokens=10)
    assert greedy.tokens_per_s_interval == (greedy.tokens_per_s, greedy.tokens_per_s) and greedy.speedup == 1.0
    assert prediction.speedup == pytest.approx(prediction.tokens_per_s / greedy.tokens_per_s)
    assert prediction.speedup_interval == pytest.approx((low / greedy.tokens_per_s, high / greedy.tokens_per_s))
    # the prediction itself is what it was: the same seconds as the simulation's mean
    assert pr.predict_profile(profile, "sd", 2, tokens=16, prompt_tokens=10).seconds == prediction.seconds
    single = pr.predict_profile(pf.parse_profile(_hand_made_profile(runs[:1])), "sd", 2, tokens=16, prompt_tokens=10)
    assert single.tokens_per_s_interval is None  # one prompt: no spread to carry


def test_a_run_longer_than_the_profiles_continuations_is_warned_about():
    """Acceptance changes along a generation (a model-free drafter copies the prompt early on): a run that
    generates more tokens than the profile's continuations is predicted from their start again, and told so."""
    from analysis.runs import Run

    profile = pf.parse_profile(_hand_made_profile([[1] * 8, [0] * 6]))
    assert profile.continuation_tokens == 6

    def run(tokens):
        return Run(Path("run"), {"models": "hand", "dataset": "made"}, {"max_new_tokens": tokens}, {})

    assert va.run_warnings(profile, run(6)) == []
    warned = va.run_warnings(profile, run(16))
    assert len(warned) == 1 and "along 6 tokens, the run generates 16" in warned[0]
    assert "profile.continuation=16" in warned[0]
