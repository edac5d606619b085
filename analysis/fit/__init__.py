"""Estimation from measurements, and the paper's model checked against them (no torch).

From stage traces (``pipespec.trace``; our runs) and the authors' published logs
(``analysis.import_official``): per adjacent pair the acceptance rate alpha (`alpha`), per stage the one
step-cost fit t(n) = a + b n with its CPU contention (`cost`), and a run's measurement, rho, gamma,
tokens per step, supply, per-step overhead and handoff (`measure`); the paper's Eq. 1 / 3 / 4 / 5 / 6
beside the measured values (`paper`). What each figure is: docs/analysis.md ("Fits and models") and
docs/concepts/metrics.md.
"""

from analysis.fit.alpha import estimate_alpha, AlphaFit, fit_alpha, fit_two_rates
from analysis.fit.cost import CostFit, MIN_REGIME_STEPS, fit_step_cost
from analysis.fit.measure import MIN_GAPS, StageFit, PairStats, Measurement, overlap_with, measure_traces, measure_run
from analysis.fit.paper import (
    LOOKUP_COST_S, OfficialMeasurement, official_window, measure_official, at_real_gamma, paper_tokens_per_s,
    Comparison, paper_comparison, PAPER_EQUATION, stage_t1, MIN_SINGLE_STEPS, paper_t1, paper_run_tokens_per_s
)
