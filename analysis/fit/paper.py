"""The paper's model beside measurements: the authors' published logs measured (``measure_official``), the
paper's throughput (``paper_tokens_per_s``: Eq. 5 for sd, Eq. 4 over t_K(1) for pipespec) and
``paper_comparison``, its predictions (Eq. 3 rho, Eq. 1 and 4 tokens per step, Eq. 5 / 6 throughput)
beside the measured values with residuals. The paper's real-valued gamma is handled by linear
interpolation between the integer windows on either side (``at_real_gamma``; ``paper_model`` takes
integers). docs/analysis.md, "Fits and models".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from analysis import import_official as official
from analysis import paper_model as pm
from analysis.fit.alpha import estimate_alpha
from analysis.fit.measure import Measurement, StageFit


LOOKUP_COST_S = 1e-4  # a prompt-lookup proposal takes microseconds; a floor keeps speed ratios finite


@dataclass
class OfficialMeasurement:
    """What the authors' logs allow to measure for one log file (no offered counts for async logs)."""

    log: official.OfficialLog
    step_mean_s: list[float]  # per stage, mean logged step time
    alphas: list[float]  # per pair: censored MLE where the window is known, else the lower bound
    alpha_is_lower_bound: list[bool]
    windows: list[int | None]  # drafts offered per verification where known
    accepted_per_verify: list[float]  # per pair, mean logged count minus the verifier's own token
    tokens: int
    time_s: float

    @property
    def ms_per_token(self) -> float:
        return 1000 * self.time_s / self.tokens

    @property
    def target_tokens_per_step(self) -> float:
        return self.tokens / len(official.step_times(self.log, len(self.step_mean_s) - 1))


def official_window(log: official.OfficialLog, pair: int) -> int | None:
    """Drafts offered per verification in a log, where the logs fix it.

    Synchronous ``chain`` logs: pair 0 is offered lookahead - 1 drafts
    (``import_official.sync_window``); a deeper verifier is offered a full
    window of ``lookahead`` tokens, because the reference's middle stage keeps
    generating until its output fills the window (its logged step time grows
    as its own acceptance falls, and no count exceeds lookahead + 1).
    Asynchronous logs: unknown (None).
    """
    if log.strategy != "chain":
        return None
    return official.sync_window(log, pair) if pair == 0 else log.lookahead


def measure_official(log: official.OfficialLog) -> OfficialMeasurement:
    n_stages = 1 if log.strategy == "greedy" else len(log.model_paths)
    alphas, lower, windows, accepted = [], [], [], []
    for pair in range(log.num_pairs):
        counts = official.accepted_counts(log, pair)
        window = official_window(log, pair)
        try:
            alphas.append(estimate_alpha(counts, window))
        except ValueError:  # a window of 0 drafts says nothing about alpha
            alphas.append(math.nan)
        lower.append(window is None)
        windows.append(window)
        accepted.append(float(np.mean(counts)) - 1.0)
    return OfficialMeasurement(
        log=log,
        step_mean_s=[float(np.mean(official.step_times(log, s))) for s in range(n_stages)],
        alphas=alphas,
        alpha_is_lower_bound=lower,
        windows=windows,
        accepted_per_verify=accepted,
        tokens=sum(s.tokens_generated for s in log.samples),
        time_s=sum(s.total_time for s in log.samples),
    )


def at_real_gamma(function: Callable[..., float], alpha: float, gamma: float, *args: float) -> float:
    """``function(alpha, g, *args)`` at a real window g: linear interpolation between floor(g) and ceil(g)."""
    if not math.isfinite(gamma) or gamma < 0:
        raise ValueError(f"gamma must be a finite number >= 0, got {gamma!r}")
    low = math.floor(gamma)
    weight = gamma - low
    value = function(alpha, low, *args)
    if weight > 0:
        value = (1 - weight) * value + weight * function(alpha, low + 1, *args)
    return value


def paper_tokens_per_s(
    strategy: str, t_target_1: float, alpha: float | None = None, gamma: float | None = None,
    t_drafter_1: float | None = None, high_acceptance: bool = False,
) -> float:
    """The paper's throughput in tokens/s: its per-target-step figure divided by one target step t_K(1).

    greedy: 1 / t_K(1). sd: Eq. 5 with c = t_K(1) / t_{K-1}(1). pipespec: Eq. 4
    (Eq. 6 with ``high_acceptance``). Depth enters only through the last pair's
    alpha and gamma, as in the paper.
    """
    if strategy == "greedy":
        return 1.0 / t_target_1
    if alpha is None or gamma is None:
        raise ValueError(f"{strategy} needs alpha and gamma")
    if strategy == "sd":
        speed_ratio = t_target_1 / max(t_drafter_1 or LOOKUP_COST_S, LOOKUP_COST_S)
        return at_real_gamma(pm.sync_sd_throughput, alpha, gamma, speed_ratio) / t_target_1
    if strategy == "pipespec":
        per_step = pm.pipespec_high_acceptance if high_acceptance else pm.pipespec_tokens_per_step
        return at_real_gamma(per_step, alpha, gamma) / t_target_1
    raise ValueError(f"unknown strategy {strategy!r}")


@dataclass(frozen=True)
class Comparison:
    """One predicted-vs-measured figure."""

    quantity: str  # e.g. "rho (Eq. 3)"
    scope: str  # e.g. the pair "0:draft -> 1:target", or "run"
    predicted: float
    measured: float

    @property
    def residual(self) -> float:
        return self.predicted - self.measured

    @property
    def relative_error(self) -> float:
        return self.residual / self.measured if self.measured else math.nan


def paper_comparison(measurement: Measurement, strategy: str, t_target_1: float | None = None) -> list[Comparison]:
    """The paper's Eq. 3 rho, Eq. 1 / 4 tokens per step and Eq. 5 / 6 tokens/s beside the measured values.

    alpha: the pair's MLE; gamma: the measured mean offered per verification;
    t_K(1): ``t_target_1`` if given, else ``paper_t1`` of the run.
    """
    rows: list[Comparison] = []
    for pair in measurement.pairs:
        if pair.alpha is None or not pair.verify_steps:
            continue
        scope = f"{pair.drafter} -> {pair.verifier}"
        a, g = pair.alpha.alpha, pair.gamma
        rows.append(Comparison("rho (Eq. 3)", scope, at_real_gamma(pm.steady_state_rho, a, g), pair.rho))
        rows.append(Comparison("tokens/step (Eq. 1, measured rho)", scope,
                               at_real_gamma(lambda al, gg: pm.expected_tokens_per_step(pair.rho, al, gg), a, g),
                               pair.tokens_per_step))
        rows.append(Comparison("tokens/step (Eq. 4)", scope, at_real_gamma(pm.pipespec_tokens_per_step, a, g),
                               pair.tokens_per_step))
    predicted = paper_run_tokens_per_s(measurement, strategy, t_target_1=t_target_1)
    if predicted is not None:
        rows.append(Comparison(f"tokens/s ({PAPER_EQUATION[strategy]})", "run", predicted, measurement.tokens_per_s))
    if strategy == "pipespec":
        limit = paper_run_tokens_per_s(measurement, strategy, high_acceptance=True, t_target_1=t_target_1)
        if limit is not None:
            rows.append(Comparison("tokens/s (Eq. 6)", "run", limit, measurement.tokens_per_s))
    return rows


PAPER_EQUATION = {"greedy": "1/t_K(1)", "sd": "Eq. 5", "pipespec": "Eq. 4"}


def stage_t1(stage: StageFit) -> float | None:
    """t(1) of a stage: its fitted decode cost at n = 1; lookup stages cost ~0; None when unknown."""
    if stage.kind == "lookup":
        return LOOKUP_COST_S
    if stage.cost is None:
        return None
    return max(stage.cost(1), LOOKUP_COST_S)


MIN_SINGLE_STEPS = 5  # one-token steps needed to time t_K(1) directly


def paper_t1(measurement: Measurement) -> float | None:
    """The paper's time unit, one target step t_K(1): the mean of the run's own one-token target steps
    where it took at least 5, else the fitted cost at n = 1 (None when neither exists)."""
    target = measurement.target
    if target.single_steps >= MIN_SINGLE_STEPS:
        return target.single_step_s
    return stage_t1(target)


def paper_run_tokens_per_s(
    measurement: Measurement, strategy: str, high_acceptance: bool = False, t_target_1: float | None = None
) -> float | None:
    """The paper model's tokens/s for a measured run (None where its inputs are missing).

    ``t_target_1`` overrides the time unit (e.g. with a greedy run's one-token step).
    """
    t_target = t_target_1 if t_target_1 is not None else paper_t1(measurement)
    if t_target is None:
        return None
    if strategy == "greedy":
        return paper_tokens_per_s("greedy", t_target)
    last = measurement.pairs[-1] if measurement.pairs else None
    if last is None or last.alpha is None or not math.isfinite(last.gamma):
        return None
    t_drafter = stage_t1(measurement.stages[-2])
    return paper_tokens_per_s(strategy, t_target, last.alpha.alpha, last.gamma, t_drafter, high_acceptance)
