"""Both models against what was measured: our predictor and the paper's model on measured runs and on
the authors' published logs (no torch).

    python -m analysis.evaluate RUN_DIRS... [--official DIR] [--all-logs] [--tolerance 0.15]

A measured run (``evaluate_runs``): our predictor (``analysis.predict``) played with the costs,
contention, acceptance and latencies fitted on the run's own traces (``Hierarchy.from_measurement``: an
in-sample decomposition, not a prediction), its samples' token counts and prompt lengths; the paper's
model beside it with the time unit t_K(1) from the run's own one-token target steps, a greedy run of
the same hierarchy, or the fitted target cost at n = 1.

A published log (``predict_official``): the costs are the log's mean step times (each model on its own
GPUs: no contention), and acceptance is the logged counts replayed (synchronous logs: the offered window
is known) or, for asynchronous logs that never recorded how many drafts were offered, a per-pair alpha
calibrated so that the simulated mean accepted per verification equals the logged one (method of
moments with the pipeline's own censoring).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

import numpy as np

from analysis import fit
from analysis import import_official as official
from analysis import simulate as sim
from analysis.predict import Hierarchy, Prediction, predict, simulate_generation
from pipespec.schedule import DEFAULT_MAX_LEAD

__all__ = [
    "OfficialPrediction",
    "official_lookahead",
    "calibrate_alphas",
    "predict_official",
    "official_predictions",
    "RunEvaluation",
    "evaluate_run",
    "evaluate_runs",
    "main",
]

CALIBRATION_TOKENS = 2000
REFERENCE_DEFAULT_LOOKAHEAD = 5  # the authors' 70B async runs used their decoder's default (see the logs' README)
ASYNC_MAX_LEAD = 64  # the reference's async drafters are not held back by a lead cap
ASYNC_REPEATS = 3  # simulated generations of an async log, by seed


# --------------------------------------------------------------------------- the authors' logs


@dataclass(frozen=True)
class OfficialPrediction:
    """Both models on one published log, in ms/token."""

    file: str
    strategy: str  # ours: greedy / sd / pipespec
    models: tuple[str, ...]
    measured_ms: float
    ours_ms: float
    paper_ms: float | None  # None without a greedy log of the same target (no t_K(1))
    alphas: tuple[float, ...]  # what our simulation used
    alpha_source: str  # "replayed counts", "calibrated", "-"
    lookahead: int  # minimum drafts a simulated verifier waits for (pipespec) / window (sd)

    @property
    def ours_error(self) -> float:
        return self.ours_ms / self.measured_ms - 1.0

    @property
    def paper_error(self) -> float | None:
        return None if self.paper_ms is None else self.paper_ms / self.measured_ms - 1.0


def official_lookahead(log: official.OfficialLog) -> int:
    """Minimum drafts a verifier of an async log waited for, in our simulator's terms.

    The reference decoder offers lookahead - 1 drafts (as in its synchronous
    logs, where no count exceeds lookahead). The 70B async files say 0 but ran
    with the then-default lookahead 5 (their README), hence 4.
    """
    stated = log.lookahead
    if log.strategy == "async-chain" and stated == 0 and "70B" in log.model_names[-1]:
        stated = REFERENCE_DEFAULT_LOOKAHEAD
    return max(stated - 1, 0)


def _with_alphas(hierarchy: Hierarchy, alphas: Sequence[float]) -> Hierarchy:
    return replace(hierarchy, acceptance=tuple(sim.Bernoulli(a) for a in alphas))


def calibrate_alphas(hierarchy: Hierarchy, target_accepted: Sequence[float], tokens: int, lookahead: int,
                     rounds: int = 2, iterations: int = 12, seed: int = 0) -> list[float]:  # fmt: skip
    """Per-pair alpha such that the simulated pipeline of ``hierarchy`` (with i.i.d. acceptance at that alpha)
    has mean accepted per verification (own token included) ``target_accepted`` (bisection per pair,
    pairs in order, ``rounds`` passes)."""
    alphas = [0.5] * len(target_accepted)
    for _ in range(rounds):
        for pair, wanted in enumerate(target_accepted):
            low, high = 0.0, 0.999
            for _ in range(iterations):
                middle = (low + high) / 2
                trial = list(alphas)
                trial[pair] = middle
                _, result = simulate_generation(_with_alphas(hierarchy, trial), "pipespec", tokens, lookahead,
                                                ASYNC_MAX_LEAD, seed)  # fmt: skip
                if result.accepted_per_verify[pair] < wanted:
                    low = middle
                else:
                    high = middle
            alphas[pair] = (low + high) / 2
    return alphas


def _paper_ms(log: official.OfficialLog, measured: fit.OfficialMeasurement, greedy: official.OfficialLog | None):
    if greedy is None:
        return None
    t_target = float(np.mean(official.step_times(greedy, 0)))  # one target step: the paper's time unit
    strategy = official.STRATEGY_NAMES[log.strategy]
    if strategy == "greedy":
        return 1000.0 * t_target
    pair = log.num_pairs - 1
    window = measured.windows[pair]
    gamma = float(window) if window is not None else measured.accepted_per_verify[pair]  # async: a lower bound
    rate = fit.paper_tokens_per_s(strategy, t_target, measured.alphas[pair], gamma, measured.step_mean_s[-2])
    return 1000.0 / rate


def _official_hierarchy(log: official.OfficialLog, measured: fit.OfficialMeasurement, strategy: str,
                        seed: int) -> tuple[Hierarchy, int, int, tuple[float, ...], str]:  # fmt: skip
    """The log's hierarchy with its acceptance, the lookahead and max_lead to play, the alphas and their source."""
    if strategy == "greedy":
        return Hierarchy.from_official(measured, ()), 0, DEFAULT_MAX_LEAD, (), "-"
    if strategy == "sd":
        replays = [sim.Replay(tuple(official.accepted_counts(log, p))) for p in range(log.num_pairs)]
        return (Hierarchy.from_official(measured, replays), official.sync_window(log), DEFAULT_MAX_LEAD,
                tuple(measured.alphas), "replayed counts")  # fmt: skip
    lookahead = official_lookahead(log)
    wanted = [a + 1.0 for a in measured.accepted_per_verify]
    unset = Hierarchy.from_official(measured, [sim.Bernoulli(0.5)] * log.num_pairs, range(ASYNC_REPEATS))
    # a shorter simulation suffices to match a mean; the prediction uses every token
    alphas = tuple(calibrate_alphas(unset, wanted, min(measured.tokens, CALIBRATION_TOKENS), lookahead, seed=seed))
    return _with_alphas(unset, alphas), lookahead, ASYNC_MAX_LEAD, alphas, "calibrated"


_PREDICTED: dict[tuple, OfficialPrediction] = {}  # (log file, greedy log file, seed) -> its prediction


def _file_key(path: Path) -> tuple:
    stat = os.stat(path)
    return str(Path(path).resolve()), stat.st_mtime_ns, stat.st_size


def predict_official(
    log: official.OfficialLog, greedy: official.OfficialLog | None = None, seed: int = 0
) -> OfficialPrediction:
    """Our predictor and the paper's model against one published log (ms/token). A deterministic function of
    the two log files and the seed, remembered per process (its calibration simulates for seconds)."""
    key = (_file_key(log.path), None if greedy is None else _file_key(greedy.path), seed)
    if key not in _PREDICTED:
        _PREDICTED[key] = _predict_official(log, greedy, seed)
    return _PREDICTED[key]


def _predict_official(log: official.OfficialLog, greedy: official.OfficialLog | None, seed: int) -> OfficialPrediction:
    measured = fit.measure_official(log)
    strategy = official.STRATEGY_NAMES[log.strategy]
    hierarchy, lookahead, max_lead, alphas, source = _official_hierarchy(log, measured, strategy, seed)
    ours = predict(hierarchy, strategy, [measured.tokens], lookahead=lookahead, max_lead=max_lead, seed=seed)
    return OfficialPrediction(
        file=log.path.name,
        strategy=strategy,
        models=log.model_names,
        measured_ms=measured.ms_per_token,
        ours_ms=1000.0 * ours.seconds / measured.tokens,
        paper_ms=_paper_ms(log, measured, greedy),
        alphas=alphas,
        alpha_source=source,
        lookahead=lookahead,
    )


def official_predictions(directory, all_logs: bool = False) -> list[OfficialPrediction]:
    """Both models on the published logs (by default only those of the largest target, the 70B runs)."""
    logs = official.load_dir(directory)
    greedy = {}
    for log in logs:
        if log.strategy == "greedy":
            greedy.setdefault(log.target, log)
    chosen = logs if all_logs else official.largest_target_logs(logs)
    return [predict_official(log, greedy.get(log.target)) for log in chosen]


# --------------------------------------------------------------------------- measured runs


@dataclass
class RunEvaluation:
    """One measured run beside both models' predictions."""

    run: object  # analysis.runs.Run
    measurement: fit.Measurement
    ours: Prediction
    paper_tokens_per_s: float | None
    paper_t1_s: float | None  # the paper's time unit t_K(1) used
    paper_t1_source: str  # "own one-token steps", "greedy run", "fit at n=1"
    comparisons: list[fit.Comparison]

    @property
    def measured_tokens_per_s(self) -> float:
        return self.measurement.tokens_per_s

    @property
    def ours_error(self) -> float:
        return self.ours.tokens_per_s / self.measured_tokens_per_s - 1.0

    @property
    def paper_error(self) -> float | None:
        if self.paper_tokens_per_s is None:
            return None
        return self.paper_tokens_per_s / self.measured_tokens_per_s - 1.0


def _greedy_key(run) -> tuple:
    return (run.hierarchy, run.dataset, run.stage_names[-1] if run.stage_names else "")


def evaluate_run(run, greedy_t1_s: float | None = None, seed: int = 0) -> RunEvaluation:
    """Measure a run from its traces, predict it with our model and the paper's.

    The paper's t_K(1): the run's own one-token target steps (>= 5 of them),
    else ``greedy_t1_s`` (a greedy run of the same hierarchy), else the fitted
    target cost at n = 1.
    """
    from analysis.runs import ResultsError

    try:
        return _evaluate(run, greedy_t1_s, seed)
    except ResultsError:
        raise
    except (ValueError, KeyError, TypeError, IndexError, RuntimeError) as error:
        # traces that contradict the summary (a strategy without its stages, ...): name the run, in one line
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ResultsError(f"{run.path}: traces cannot be analysed ({reason})") from None


def _evaluate(run, greedy_t1_s: float | None, seed: int) -> RunEvaluation:
    measurement = fit.measure_run(run)
    target = measurement.target
    if target.single_steps >= fit.MIN_SINGLE_STEPS:
        t1, source = target.single_step_s, "own one-token steps"
    elif greedy_t1_s is not None:
        t1, source = greedy_t1_s, "greedy run"
    else:
        t1, source = fit.stage_t1(target), "fit at n=1"
    ours = predict(Hierarchy.from_measurement(measurement), run.strategy, measurement.sample_tokens,
                   measurement.sample_prompt_tokens, run.lookahead, run.max_lead or DEFAULT_MAX_LEAD, seed)
    paper = fit.paper_run_tokens_per_s(measurement, run.strategy, t_target_1=t1) if t1 is not None else None
    comparisons = fit.paper_comparison(measurement, run.strategy, t_target_1=t1) if t1 is not None else []
    return RunEvaluation(run, measurement, ours, paper, t1, source, comparisons)


def evaluate_runs(runs: Sequence, seed: int = 0) -> list[RunEvaluation]:
    """``evaluate_run`` for each run; greedy runs lend their t_K(1) to the runs of the same hierarchy."""
    greedy_t1: dict[tuple, float] = {}
    evaluations: dict[int, RunEvaluation] = {}
    for position, run in enumerate(runs):  # greedy runs first: the others borrow their step time
        if run.strategy == "greedy":
            evaluation = evaluate_run(run, seed=seed)
            evaluations[position] = evaluation
            if evaluation.paper_t1_s is not None:
                greedy_t1.setdefault(_greedy_key(run), evaluation.paper_t1_s)
    for position, run in enumerate(runs):
        if position not in evaluations:
            evaluations[position] = evaluate_run(run, greedy_t1.get(_greedy_key(run)), seed=seed)
    return [evaluations[p] for p in range(len(runs))]


# --------------------------------------------------------------------------- command line


def format_official(rows: Sequence[OfficialPrediction]) -> str:
    lines = [f"{'file':<75} {'measured':>9} {'ours':>8} {'err':>7} {'paper':>8} {'err':>7}  alphas ({'source'})"]
    for row in rows:
        paper = "-" if row.paper_ms is None else f"{row.paper_ms:8.2f}"
        paper_error = "-" if row.paper_error is None else f"{100 * row.paper_error:+6.1f}%"
        alphas = "/".join(f"{a:.3f}" for a in row.alphas)
        lines.append(f"{row.file:<75} {row.measured_ms:9.2f} {row.ours_ms:8.2f} {100 * row.ours_error:+6.1f}% "
                     f"{paper:>8} {paper_error:>7}  {alphas} ({row.alpha_source})")
    return "\n".join(lines)


def format_evaluations(evaluations: Sequence[RunEvaluation]) -> str:
    lines = [f"{'run':<48} {'measured':>9} {'ours':>8} {'err':>7} {'paper':>8} {'err':>7}  tok/s"]
    for e in evaluations:
        paper = "-" if e.paper_tokens_per_s is None else f"{e.paper_tokens_per_s:8.2f}"
        paper_error = "-" if e.paper_error is None else f"{100 * e.paper_error:+6.1f}%"
        lines.append(f"{e.run.label[:48]:<48} {e.measured_tokens_per_s:9.2f} {e.ours.tokens_per_s:8.2f} "
                     f"{100 * e.ours_error:+6.1f}% {paper:>8} {paper_error:>7}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    import argparse
    import sys

    from analysis.runs import ResultsError, find_runs

    parser = argparse.ArgumentParser(
        prog="python -m analysis.evaluate",
        description="Both models (ours and the paper's) against measured runs and/or the published logs.",
    )
    parser.add_argument("runs", nargs="*", help="run directories or directories holding runs")
    parser.add_argument("--official", help="folder of the authors' logs (committed: "
                        f"{official.DEFAULT_DIR.relative_to(official.DEFAULT_DIR.parents[2])})")
    parser.add_argument("--all-logs", action="store_true",
                        help="with --official: every log, not only the largest target's (slower)")
    parser.add_argument("--tolerance", type=float, default=None,
                        help="exit 1 if our model's error exceeds this fraction on any run or async/sync log")
    args = parser.parse_args(argv)
    if not args.runs and not args.official:
        parser.error("give run directories and/or --official DIR")
    worst = 0.0
    try:
        if args.official:
            rows = official_predictions(args.official, args.all_logs)
            print(format_official(rows))
            worst = max([worst] + [abs(r.ours_error) for r in rows if r.strategy != "greedy"])
        if args.runs:
            evaluations = evaluate_runs(find_runs(args.runs))
            print(format_evaluations(evaluations))
            worst = max([worst] + [abs(e.ours_error) for e in evaluations])
    except (ResultsError, official.OfficialLogError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.tolerance is not None and worst > args.tolerance:
        print(f"FAIL: our model's largest error {100 * worst:.1f}% exceeds {100 * args.tolerance:.0f}%",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
