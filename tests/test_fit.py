"""Tests of analysis.fit (estimation from traces and logs) and analysis.runs (the run reader).

Synthetic data with known parameters must be recovered: the truncated-geometric
MLE finds alpha, least squares finds t(n) = a + b n and the contention factor,
and hand-built traces give the rho, gamma, tokens per step, prefill, overhead
and handoff they were built with.
"""

import gzip
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from analysis import fit
from analysis import import_official as official
from analysis import paper_model as pm
from analysis import predict
from analysis.runs import ResultsError, find_runs, load_run
from pipespec.trace import StageTrace

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "results_tiny"
OFFICIAL_DIR = official.DEFAULT_DIR  # results/official/humaneval, committed with its licence
needs_official = pytest.mark.skipif(not OFFICIAL_DIR.is_dir(), reason=f"official logs absent: {OFFICIAL_DIR}")


# --------------------------------------------------------------------------- alpha


def _truncated_geometric(alpha, offered, rng):
    """Accepted prefix of each verification: i.i.d. acceptance until the first rejection, at most offered."""
    return [min(int(rng.geometric(1 - alpha)) - 1, n) for n in offered]


@pytest.mark.parametrize("alpha", [0.3, 0.7, 0.92])
def test_mle_recovers_alpha_from_truncated_geometric(alpha):
    rng = np.random.default_rng(1)
    offered = rng.integers(1, 9, size=20000).tolist()
    accepted = _truncated_geometric(alpha, offered, rng)
    result = fit.fit_alpha(accepted, offered)
    assert result.alpha == pytest.approx(alpha, abs=0.01)
    assert abs(result.alpha - alpha) < 4 * result.stderr
    assert result.verifications == 20000 and result.offered == sum(offered)
    # the naive accepted/offered ratio is biased low by the truncation; the MLE is not
    assert sum(accepted) / sum(offered) < alpha - 0.02


def test_mle_standard_error_matches_spread():
    rng = np.random.default_rng(2)
    estimates, errors = [], []
    for _ in range(200):
        offered = rng.integers(1, 6, size=300).tolist()
        result = fit.fit_alpha(_truncated_geometric(0.6, offered, rng), offered)
        estimates.append(result.alpha)
        errors.append(result.stderr)
    assert np.std(estimates) == pytest.approx(np.mean(errors), rel=0.15)


def test_two_rates_equal_alpha_on_iid_data():
    rng = np.random.default_rng(5)
    offered = rng.integers(1, 9, size=20000).tolist()
    first, later = fit.fit_two_rates(_truncated_geometric(0.75, offered, rng), offered)
    assert first == pytest.approx(0.75, abs=0.01) and later == pytest.approx(0.75, abs=0.01)
    assert math.isnan(fit.fit_two_rates([0, 0], [3, 1])[1])  # never a draft accepted with more to go


def test_mle_edge_cases():
    assert fit.fit_alpha([2, 0, 3], [2, 0, 3]).alpha == 1.0  # no rejection; the offered-0 row is ignored
    assert math.isnan(fit.fit_alpha([2, 3], [2, 3]).stderr)
    assert fit.fit_alpha([0, 0], [4, 1]).alpha == 0.0
    with pytest.raises(ValueError):
        fit.fit_alpha([3], [2])
    with pytest.raises(ValueError):
        fit.fit_alpha([0], [0])


def test_estimate_alpha_by_hand():
    # counts 3, 1, 2 -> accepted drafts 2, 0, 1 (S = 3); no window: 3 rejections -> 3 / 6
    assert fit.estimate_alpha([3, 1, 2]) == pytest.approx(0.5)
    # window 2: the count 3 (2 drafts accepted of 2 offered) shows no rejection -> 3 / (3 + 2)
    assert fit.estimate_alpha([3, 1, 2], window=2) == pytest.approx(0.6)
    # per-verification windows
    assert fit.estimate_alpha([3, 1, 2], window=[2, 5, 1]) == pytest.approx(3 / 4)
    assert fit.estimate_alpha([5, 5], window=4) == 1.0
    with pytest.raises(ValueError, match="counts"):
        fit.estimate_alpha([])
    with pytest.raises(ValueError, match="counts"):
        fit.estimate_alpha([0, 2])


def test_estimate_alpha_recovers_truncated_geometric():
    rng = np.random.default_rng(0)
    alpha, window = 0.7, 6
    accepted = np.minimum(rng.geometric(1 - alpha, size=20000) - 1, window)
    assert fit.estimate_alpha(accepted + 1, window=window) == pytest.approx(alpha, abs=0.01)
    # ignoring the truncation biases the estimate downwards (the documented lower bound)
    assert fit.estimate_alpha(accepted + 1) < alpha - 0.02


# --------------------------------------------------------------------------- step cost


def test_cost_fit_recovers_a_and_b():
    rng = np.random.default_rng(3)
    n = rng.integers(1, 17, size=400)
    seconds = 0.055 + 0.004 * n + rng.normal(0, 0.002, size=n.size)
    cost = fit.fit_step_cost(n, seconds)
    assert cost.fixed == pytest.approx(0.055, abs=0.001)
    assert cost.per_token == pytest.approx(0.004, abs=0.0002)
    assert cost(10) == pytest.approx(0.095, abs=0.001)
    assert cost.identifiable and cost.contention == 0.0
    assert cost.residual_std == pytest.approx(0.002, rel=0.2)


def test_cost_fit_recovers_contention():
    rng = np.random.default_rng(4)
    n = rng.integers(1, 6, size=600)
    others = rng.choice([0.0, 1.0], size=n.size)
    seconds = (0.030 + 0.002 * n) * (1 + 0.6 * others) * rng.normal(1, 0.02, size=n.size)
    cost = fit.fit_step_cost(n, seconds, others)
    assert cost.contention == pytest.approx(0.6, abs=0.05)
    assert cost.fixed == pytest.approx(0.030, abs=0.002)
    assert cost.per_token == pytest.approx(0.002, abs=0.0005)
    # without regime variation the factor is not identifiable: folded into a and b
    flat = fit.fit_step_cost(n, seconds, np.ones(n.size))
    assert flat.contention == 0.0 and flat.fixed == pytest.approx(0.030 * 1.3, abs=0.003)


def test_cost_fit_single_n_and_stage_cost():
    cost = fit.fit_step_cost([1, 1, 1], [0.1, 0.12, 0.11])
    assert cost.per_token == 0.0 and cost.fixed == pytest.approx(0.11)
    assert not cost.identifiable
    negative = fit.CostFit(fixed=-0.01, per_token=0.05, points=3, min_fed=2, max_fed=5, residual_std=0.0)
    stage = predict.fitted_cost(negative, extra_fixed=0.002)
    assert stage(1) == pytest.approx(negative(1) + 0.002) and stage.fixed >= 0


# --------------------------------------------------------------------------- traces


def _trace(stage, name, rows, start=0.0, end=None):
    trace = StageTrace(stage, name, start_time=start)
    for t_start, t_end, kind, fed, offered, accepted, produced, rollbacks in rows:
        trace.pending_rollbacks = rollbacks
        trace.record(t_start, t_end, kind, fed, offered, accepted, produced)
    trace.end_time = end if end is not None else rows[-1][1]
    return trace


def _pipeline_sample():
    """A 2-stage sample: drafter 10 ms/step; target prefill then verify / single steps."""
    drafter = _trace(0, "0:draft", [
        (0.000, 0.050, "draft", 100, 0, 0, 1, 0),  # prefill
        (0.051, 0.061, "draft", 1, 0, 0, 1, 0),
        (0.062, 0.072, "draft", 1, 0, 0, 1, 0),
        (0.073, 0.083, "draft", 1, 0, 0, 1, 0),
        (0.205, 0.215, "draft", 1, 0, 0, 1, 1),  # after a rollback, waited for the commit at 0.200
    ])
    target = _trace(1, "1:target", [
        (0.000, 0.100, "single", 100, 0, 0, 1, 0),  # prefill
        (0.102, 0.140, "verify", 4, 3, 3, 4, 0),
        (0.142, 0.170, "verify", 3, 2, 1, 2, 0),
        (0.172, 0.200, "single", 1, 0, 0, 1, 0),
    ])
    return drafter, target


def test_measure_traces_on_hand_built_sample():
    drafter, target = _pipeline_sample()
    m = fit.measure_traces([({"new_tokens": 8, "time_s": 0.25, "prompt_tokens": 100}, [drafter, target])])
    pair = m.pairs[0]
    assert pair.verify_steps == 2 and pair.single_steps == 2  # the prefill row counts as a one-token step
    assert pair.rho == pytest.approx(0.5)
    assert pair.gamma == pytest.approx(2.5)
    assert pair.accepted_per_verify == pytest.approx(2.0)
    assert pair.tokens_per_step == pytest.approx(8 / 4)
    assert pair.alpha.alpha == pytest.approx(4 / (4 + 1))  # 4 accepted, 1 rejection
    target_stats = m.stages[1]
    assert target_stats.prefill_s_per_token == pytest.approx(0.100 / 100)
    assert target_stats.cost.points == 3  # decode steps only
    assert target_stats.single_steps == 1 and target_stats.single_step_s == pytest.approx(0.028)
    assert m.stages[0].kind == "model" and m.tokens_per_s == pytest.approx(8 / 0.25)
    # free gaps: the drafter's 1 ms and the target's 2 ms ones (0.083 -> 0.205 holds target step
    # ends: a wait, not overhead); under 10 per stage, both take the pooled median
    assert m.stages[0].step_overhead_s == m.stages[1].step_overhead_s == pytest.approx(0.0015)
    # the drafter sat idle until the target's step ended at 0.200 and started 5 ms later
    assert m.handoff_s == pytest.approx(0.005)
    assert m.dispatch_s == pytest.approx(0.05)


def test_lookup_stage_is_detected():
    lookup = _trace(0, "0:lookup", [(0.0, 0.0001, "draft", 0, 0, 0, 3, 0), (0.1, 0.1001, "draft", 0, 0, 0, 2, 0)])
    target = _trace(1, "1:target", [(0.0, 0.09, "single", 50, 0, 0, 1, 0), (0.0901, 0.15, "verify", 4, 3, 1, 2, 0)])
    m = fit.measure_traces([(None, [lookup, target])])
    assert m.stages[0].kind == "lookup" and m.stages[0].cost is None
    assert m.stages[0].proposals == 2 and m.stages[0].mean_proposal == pytest.approx(2.5)
    assert fit.stage_t1(m.stages[0]) == fit.LOOKUP_COST_S


# --------------------------------------------------------------------------- the paper's predictions


def test_at_real_gamma_interpolates_paper_formulas():
    assert fit.at_real_gamma(pm.steady_state_rho, 0.8, 4) == pm.steady_state_rho(0.8, 4)
    middle = fit.at_real_gamma(pm.pipespec_tokens_per_step, 0.8, 4.5)
    assert middle == pytest.approx((pm.pipespec_tokens_per_step(0.8, 4) + pm.pipespec_tokens_per_step(0.8, 5)) / 2)
    with pytest.raises(ValueError):
        fit.at_real_gamma(pm.steady_state_rho, 0.8, -1)


def test_paper_tokens_per_s():
    assert fit.paper_tokens_per_s("greedy", 0.05) == pytest.approx(20.0)
    sd = fit.paper_tokens_per_s("sd", 0.05, 0.8, 4, 0.01)
    assert sd == pytest.approx(pm.sync_sd_throughput(0.8, 4, 5.0) / 0.05)
    ps = fit.paper_tokens_per_s("pipespec", 0.05, 0.8, 4)
    assert ps == pytest.approx(pm.pipespec_tokens_per_step(0.8, 4) / 0.05)


def test_paper_comparison_has_residuals():
    drafter, target = _pipeline_sample()
    m = fit.measure_traces([({"new_tokens": 8, "time_s": 0.25}, [drafter, target])])
    rows = {c.quantity: c for c in fit.paper_comparison(m, "pipespec")}
    rho = rows["rho (Eq. 3)"]
    assert rho.predicted == pytest.approx(fit.at_real_gamma(pm.steady_state_rho, 0.8, 2.5))
    assert rho.measured == pytest.approx(0.5) and rho.residual == pytest.approx(rho.predicted - 0.5)
    eq4 = fit.at_real_gamma(pm.pipespec_tokens_per_step, 0.8, 2.5)
    assert rows["tokens/s (Eq. 4)"].measured == pytest.approx(32.0)
    # fewer than 5 one-token steps: t_K(1) is the fitted cost at n = 1
    assert rows["tokens/s (Eq. 4)"].predicted == pytest.approx(eq4 / m.stages[1].cost(1))
    given = {c.quantity: c for c in fit.paper_comparison(m, "pipespec", t_target_1=0.028)}
    assert given["tokens/s (Eq. 4)"].predicted == pytest.approx(eq4 / 0.028)
    eq6 = fit.at_real_gamma(pm.pipespec_high_acceptance, 0.8, 2.5)
    assert given["tokens/s (Eq. 6)"].predicted == pytest.approx(eq6 / 0.028) and eq6 > eq4


# --------------------------------------------------------------------------- the reader and real traces


def test_reader_and_measurement_on_fixture_runs():
    runs = find_runs([FIXTURE])
    assert [r.strategy for r in runs] == ["greedy", "sd", "pipespec"]
    sd = runs[1]
    assert sd.lookahead == 2 and sd.depth == 2 and sd.hierarchy == "smollm2_int8_fp32"
    assert len(sd.samples) == 2 and len(sd.traces(0)) == 2
    m = fit.measure_run(sd)
    pair = m.pairs[0]
    counted = sum(s["stages"][1]["verify_steps"] for s in sd.samples)
    assert pair.verify_steps == counted
    assert pair.gamma <= 2 and 0.3 < pair.alpha.alpha < 1.0
    assert m.tokens == sd.summary["new_tokens"]
    assert m.tokens_per_s == pytest.approx(sd.tokens_per_s)


def test_reader_errors_are_one_line_and_name_the_path(tmp_path):
    with pytest.raises(ResultsError, match="no such directory"):
        find_runs([tmp_path / "missing"])
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("hello")
    with pytest.raises(ResultsError, match="foreign.*not a pipespec run directory"):
        find_runs([tmp_path / "foreign"])
    run = tmp_path / "run"
    shutil.copytree(FIXTURE / "1_sd_L2", run)
    (run / "summary.json").write_text("{not json")
    with pytest.raises(ResultsError, match=r"summary.json: corrupt JSON") as info:
        load_run(run)
    assert "\n" not in str(info.value)
    shutil.copy(FIXTURE / "1_sd_L2" / "summary.json", run / "summary.json")
    (run / "traces" / "00000.json.gz").write_bytes(b"garbage")
    with pytest.raises(ResultsError, match="00000.json.gz: corrupt trace"):
        load_run(run).traces(0)
    with gzip.open(run / "traces" / "00000.json.gz", "wt") as handle:
        json.dump({"stages": [{"stage": 0, "name": "x", "start_time": 0, "end_time": 1, "steps": {}}]}, handle)
    with pytest.raises(ResultsError, match="not a pipespec trace"):
        load_run(run).traces(0)


# --------------------------------------------------------------------------- the authors' logs


@needs_official
def test_measure_official_logs():
    chain = fit.measure_official(official.load_log(
        OFFICIAL_DIR / "chain_Llama-3.1-8B-Instruct-Meta-Llama-3.1-70B-Instruct_8.json"))
    assert chain.windows == [7] and not chain.alpha_is_lower_bound[0]
    assert chain.alphas[0] == pytest.approx(0.946, abs=0.002)  # censored MLE with the known window
    assert chain.ms_per_token == pytest.approx(93.42, abs=0.01)
    deep = fit.measure_official(official.load_log(
        OFFICIAL_DIR / "chain_Llama-3.2-1B-Instruct-Llama-3.1-8B-Instruct-Meta-Llama-3.1-70B-Instruct_8.json"))
    assert deep.windows == [7, 8]  # the middle stage fills a full window for the target
    assert max(official.accepted_counts(deep.log, 1)) <= 9
    async_log = fit.measure_official(official.load_log(
        OFFICIAL_DIR / "async-chain_Llama-3.1-8B-Instruct-Meta-Llama-3.1-70B-Instruct_0.json"))
    assert async_log.alpha_is_lower_bound == [True] and async_log.windows == [None]
    assert async_log.step_mean_s[1] > 3 * 0.12  # a 70B verification costs far more than a 0.12 s one-token step
