"""Our wall-clock model: tokens/s of greedy, sd and pipespec for any hierarchy (no torch).

The paper's model (``analysis.paper_model``) counts tokens per target step and
assumes every target step costs the same. This model predicts seconds instead,
from per-pair acceptance and per-stage step costs, and adds what the paper
leaves out:

- per-stage step cost t_i(n) = a_i + b_i n (a verification of n drafts costs more
  than a one-token step), plus each stage's per-step overhead (message handling
  between its own steps), from ``analysis.fit``;
- CPU contention: stages share the machine's cores; a stage's step slows by
  (1 + s_i) per other stage computing at the same time, as processor sharing
  (the simulator's ``contention``), with s_i fitted from the traces;
- the rate at which each drafter can actually supply drafts (a model drafter:
  one token per t(1); prompt lookup: a proposal after a commit with its measured
  supply probability), the waits of a verifier for its drafter (lookahead),
  the lead cap (max_lead) and discarded drafter steps: the discrete-event
  simulator ``analysis.simulate`` plays the pipeline with these costs, so
  whichever stage is the bottleneck sets the pace;
- rollback cascade delay: every message hop between stages takes the measured
  handoff latency h (the simulator's ``rollback_delay`` for pipespec; for sd
  2(k - 1) hops per lockstep round, added analytically);
- depth: every stage and pair of the hierarchy enters, not only the last pair;
- acceptance in runs: a draft that starts a run (first of a verification
  after a rejection or a one-token step) is accepted with alpha_first, one that
  continues an agreeing run with alpha_next (``TwoRateAcceptance``; prompt
  lookup copies spans that are wrong at once or right for a while);
- sd: a verifier's step follows a handoff whose latency holds its loop
  overhead, so only the first stage's consecutive drafting steps pay the
  per-step overhead;
- start-up: the prompt prefill of the stages on the critical path (the target
  for greedy and pipespec with lookahead 0, every model stage where each waits
  for its drafter: sd and pipespec with lookahead > 0), and the fixed cost of a
  generate call (dispatch and result), per sample.

Assumptions (each a known source of error):
- given the two rates, acceptance is independent of everything else (timing,
  position, which stage drafted the token);
- a prompt-lookup stage is a drafter whose proposals cost ~0 and take no core:
  after each commit that reaches it, it has a proposal with its measured
  supply probability (else it idles until the next commit and its verifier
  takes a one-token step), and a proposal runs up to max_lead tokens;
- step costs and contention are the run's own fits: background load on the
  machine during the run is folded into them as an average;
- a stage's prefill costs ``prefill_s_per_token`` x prompt tokens.

``predict`` works from a ``HierarchyModel`` (any alphas and costs, e.g. what-if
questions); ``predict_measurement`` builds one from a measured run and
``evaluate_runs`` sets both models beside run directories. For the authors'
logs (``predict_official``) costs are the logs' mean step times (each model on
its own GPUs: no contention), and acceptance is the logged counts replayed
(synchronous logs: the offered window is known) or, for asynchronous logs that
never recorded how many drafts were offered, a per-pair alpha calibrated so
that the simulated mean accepted per verification equals the logged one
(method of moments with the pipeline's own censoring).

    python -m analysis.wallclock RUN_DIRS... [--official DIR] [--tolerance 0.15]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from analysis import fit
from analysis import import_official as official
from analysis import simulate as sim

__all__ = [
    "StageModel",
    "HierarchyModel",
    "Prediction",
    "predict",
    "model_from_measurement",
    "predict_measurement",
    "OfficialPrediction",
    "official_lookahead",
    "calibrate_alphas",
    "predict_official",
    "official_predictions",
    "largest_target_logs",
    "TwoRateAcceptance",
    "RunEvaluation",
    "evaluate_run",
    "evaluate_runs",
    "main",
]

LOOKUP_STEP_S = 1e-4  # one prompt-lookup proposal token: microseconds of Python
REPEATS = 4  # simulated repetitions per sample: the simulator's sampling noise averages out


# --------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class TwoRateAcceptance(sim.Bernoulli):
    """Acceptance in runs, for the simulator: a two-state chain over draft positions, as estimated by
    ``fit.fit_two_rates``. A draft that starts a run (the first of a verification after a rejection
    or a one-token step) is accepted with probability ``first``; one that continues an agreeing run
    (after an accepted draft, or first after a fully accepted verification) with ``alpha``. A
    verifier's own token agrees with the drafter's token at its position with ``alpha`` at the bonus
    position of a fully accepted verification, with ``first`` after a one-token step.
    With first == alpha this is the simulator's i.i.d. ``Bernoulli``."""

    first: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.first <= 1.0:
            raise ValueError(f"first must be in [0, 1], got {self.first!r}")

    def sampler(self, rng: np.random.Generator, seed: int = 0) -> "_TwoRateSampler":
        return _TwoRateSampler(self.first, self.alpha, rng)


class _TwoRateSampler:
    """The state follows ``fit.fit_two_rates``: a verification continues a run only right after a
    fully accepted one; after a rejection or a one-token step the next draft starts a run."""

    def __init__(self, first: float, later: float, rng: np.random.Generator) -> None:
        self.first, self.later, self.rng = first, later, rng
        self.fresh = True  # the next verification's first draft starts a run
        self.bonus_next = False  # the next agrees() is the bonus position of a fully accepted verification

    def verify(self, offered: int, start: int = 0) -> int:
        accepted, probability = 0, self.first if self.fresh else self.later
        while accepted < offered and self.rng.random() < probability:
            accepted += 1
            probability = self.later
        self.fresh = accepted < offered
        self.bonus_next = not self.fresh
        return accepted

    def agrees(self, position: int = 0) -> bool:
        if self.bonus_next:  # the run goes on through the bonus position, or breaks there
            agreed = bool(self.rng.random() < self.later)
            self.fresh = not agreed
        else:  # a one-token step: the drafts after it start a new run
            agreed = bool(self.rng.random() < self.first)
            self.fresh = True
        self.bonus_next = False
        return agreed


@dataclass(frozen=True)
class StageModel:
    """One stage: decode step cost, per-step overhead, kind, prefill cost, contention, supply."""

    name: str
    cost: sim.StageCost  # computing one step when running alone (see contention)
    kind: str = "model"  # "model" or "lookup"
    prefill_s_per_token: float = 0.0
    contention: float = 0.0  # relative slowdown per other model stage computing at the same time
    supply: float | None = None  # lookup: chance of a proposal after each commit (None: always)
    overhead_s: float = 0.0  # between two of its own steps: publishing, reading messages

    def step_cost(self, with_overhead: bool = True) -> sim.StageCost:
        if self.kind == "lookup":
            return sim.StageCost(LOOKUP_STEP_S)
        if not with_overhead:
            return self.cost
        return sim.StageCost(self.cost.fixed + self.overhead_s, self.cost.per_token)


@dataclass(frozen=True)
class HierarchyModel:
    """A hierarchy, smallest stage first: stages, one alpha per adjacent pair, system latencies."""

    stages: tuple[StageModel, ...]
    alphas: tuple[float, ...]
    handoff_s: float = 0.0  # one message hop between neighbouring stages
    dispatch_s: float = 0.0  # per generate call: sending the job, collecting the result
    alphas_first: tuple[float, ...] | None = None  # per pair: acceptance of a run's first draft (None: = alphas)

    def __post_init__(self) -> None:
        if not self.stages:
            raise ValueError("a hierarchy needs at least one stage")
        if len(self.alphas) != len(self.stages) - 1:
            raise ValueError(f"alphas needs one value per adjacent pair ({len(self.stages) - 1}), got {len(self.alphas)}")
        for alpha in self.alphas + (self.alphas_first or ()):
            if not 0.0 <= alpha <= 1.0:
                raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
        if self.alphas_first is not None and len(self.alphas_first) != len(self.alphas):
            raise ValueError("alphas_first needs one value per adjacent pair")

    @property
    def target(self) -> StageModel:
        return self.stages[-1]

    def acceptances(self) -> list[sim.Bernoulli]:
        """The simulator's acceptance per pair: i.i.d., or two-rate where alphas_first is given."""
        if self.alphas_first is None:
            return [sim.Bernoulli(a) for a in self.alphas]
        return [TwoRateAcceptance(a, first) for a, first in zip(self.alphas, self.alphas_first)]


# --------------------------------------------------------------------------- prediction


@dataclass(frozen=True)
class Prediction:
    """Predicted time of a set of samples under one strategy."""

    strategy: str
    lookahead: int
    tokens: int
    seconds: float
    startup_s: float  # prefill on the critical path + dispatch, summed over samples
    tokens_per_target_step: float  # simulated (greedy: 1)
    target_rho: float  # simulated verification fraction of the target (greedy: 0)
    target_gamma: float  # simulated mean drafts offered per target verification
    busy_fraction: tuple[float, ...] = field(default_factory=tuple)  # simulated, per stage

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def ms_per_token(self) -> float:
        return 1000.0 * self.seconds / self.tokens

    @property
    def bottleneck(self) -> int:
        """Index of the busiest stage in the simulation (the one that sets the pace)."""
        return int(np.argmax(self.busy_fraction)) if self.busy_fraction else len(self.busy_fraction) - 1


def _critical_stages(model: HierarchyModel, strategy: str, lookahead: int) -> list[int]:
    """Stages whose prefill delays the target's first step (see the module docstring)."""
    last = len(model.stages) - 1
    if strategy == "greedy" or (strategy == "pipespec" and lookahead == 0):
        return [last]
    return [i for i, stage in enumerate(model.stages) if stage.kind == "model"]


def _startup_s(model: HierarchyModel, strategy: str, lookahead: int, prompt_tokens: int) -> float:
    # a prefill replaces one ordinary step: only its excess over t(1) is extra time
    extra = 0.0
    for i in _critical_stages(model, strategy, lookahead):
        stage = model.stages[i]
        extra += max(stage.prefill_s_per_token * prompt_tokens - stage.step_cost()(1), 0.0)
    return extra + model.dispatch_s


def _sim_costs(model: HierarchyModel, strategy: str) -> list[sim.StageCost]:
    """Step costs for the simulator. In sd a verifier's step always follows a handoff, whose measured
    latency already holds the verifier's loop overhead: only the first stage's consecutive drafting
    steps pay the per-step overhead there."""
    return [s.step_cost(with_overhead=strategy != "sd" or i == 0) for i, s in enumerate(model.stages)]


def _decode(model: HierarchyModel, strategy: str, tokens: int, lookahead: int, max_lead: int, seed: int):
    """Seconds to decode ``tokens`` (one simulated sample) and the simulator's result (None for greedy)."""
    if strategy == "greedy":
        return tokens * model.target.step_cost()(1), None
    costs = _sim_costs(model, strategy)
    acceptances = model.acceptances()
    if strategy == "sd":
        supply = [s.supply for s in model.stages]
        result = sim.simulate_sync_sd(costs, acceptances, lookahead, tokens, seed=seed, supply=supply)
        rounds = result.target_steps
        hops = 2 * (len(costs) - 1)  # drafts travel down the chain, the commit cascades back up
        return result.total_time + rounds * hops * model.handoff_s, result
    if strategy == "pipespec":
        # prompt lookup takes no core: it neither slows down nor slows the others
        contention = [None if s.kind == "lookup" else s.contention for s in model.stages]
        result = sim.simulate_pipespec(
            costs, acceptances, tokens, lookahead=lookahead, max_lead=max(max_lead, lookahead, 1),
            rollback_delay=model.handoff_s, seed=seed, contention=contention,
            supply=[s.supply for s in model.stages],
        )
        return result.total_time, result
    raise ValueError(f"unknown strategy {strategy!r}")


def predict(
    model: HierarchyModel,
    strategy: str,
    new_tokens: Sequence[int],
    prompt_tokens: Sequence[int] | None = None,
    lookahead: int = 0,
    max_lead: int = 8,
    seed: int = 0,
    repeats: int = REPEATS,
) -> Prediction:
    """Predicted pooled time of samples with ``new_tokens`` output tokens each (and their prompt lengths).

    greedy runs only the target; sd and pipespec need at least two stages.
    """
    new_tokens = [int(n) for n in new_tokens]
    if not new_tokens or min(new_tokens) < 1:
        raise ValueError("new_tokens must be a non-empty list of positive token counts")
    prompts = [0] * len(new_tokens) if prompt_tokens is None else [int(p) for p in prompt_tokens]
    if len(prompts) != len(new_tokens):
        raise ValueError("prompt_tokens needs one value per sample")
    if strategy != "greedy" and len(model.stages) < 2:
        raise ValueError(f"{strategy} needs at least two stages")
    seconds = startup = 0.0
    committed = steps = verifications = offered = 0.0
    busy: list[np.ndarray] = []
    for index, (tokens, prompt) in enumerate(zip(new_tokens, prompts)):
        start = _startup_s(model, strategy, lookahead, prompt)
        decode = []
        for repeat in range(repeats if strategy != "greedy" else 1):
            time_s, result = _decode(model, strategy, tokens, lookahead, max_lead, seed + 1000 * repeat + index)
            decode.append(time_s)
            if result is not None:
                committed += result.committed_tokens
                steps += result.target_steps
                counts = result.offered_counts[-1]
                verifications += len(counts)
                offered += sum(counts)
                busy.append(np.asarray(result.busy_fraction))
        seconds += start + float(np.mean(decode))
        startup += start
    if strategy == "greedy":
        per_step, rho, gamma, busy_mean = 1.0, 0.0, math.nan, (1.0,)
    else:
        per_step = committed / steps if steps else math.nan
        rho = verifications / steps if steps else math.nan
        gamma = offered / verifications if verifications else math.nan
        busy_mean = tuple(float(x) for x in np.mean(busy, axis=0))
    return Prediction(strategy, lookahead, sum(new_tokens), seconds, startup, per_step, rho, gamma, busy_mean)


# --------------------------------------------------------------------------- from measurements


def model_from_measurement(measurement: fit.Measurement, two_rate: bool = True) -> HierarchyModel:
    """Costs, alphas and latencies of a measured run (``analysis.fit.measure_run``).

    A model stage's decode cost is its fitted t(n) (its per-step overhead is
    kept apart, see ``StageModel.step_cost``); a stage without a decode fit (it only prefilled) costs its mean
    prefill time per step. A pair that never verified a draft gets alpha 0.
    ``two_rate``: acceptance in runs (``fit.fit_two_rates``), else the i.i.d. MLE alpha.
    """
    stages = []
    for stage in measurement.stages:
        if stage.kind == "lookup":
            stages.append(StageModel(stage.name, sim.StageCost(LOOKUP_STEP_S), "lookup", 0.0, supply=stage.supply))
            continue
        if stage.cost is not None:
            cost = stage.cost.stage_cost()
        else:
            cost = sim.StageCost(max(stage.prefill_s, LOOKUP_STEP_S))
        contention = stage.cost.contention if stage.cost is not None else 0.0
        stages.append(StageModel(stage.name, cost, "model", stage.prefill_s_per_token or 0.0, contention,
                                 overhead_s=stage.step_overhead_s))
    alphas, firsts = [], []
    for pair in measurement.pairs:
        single = pair.alpha.alpha if pair.alpha is not None else 0.0
        later = pair.alpha_next if math.isfinite(pair.alpha_next) else single
        first = pair.alpha_first if math.isfinite(pair.alpha_first) else single
        alphas.append(later if two_rate else single)
        firsts.append(first)
    return HierarchyModel(tuple(stages), tuple(alphas), measurement.handoff_s, measurement.dispatch_s,
                          tuple(firsts) if two_rate else None)


def predict_measurement(
    measurement: fit.Measurement, strategy: str, lookahead: int = 0, max_lead: int = 8, seed: int = 0
) -> Prediction:
    """Our model's prediction for a measured run: its own samples' token counts and prompt lengths."""
    return predict(
        model_from_measurement(measurement), strategy, measurement.sample_tokens,
        measurement.sample_prompt_tokens, lookahead, max_lead, seed,
    )


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


STRATEGY_NAMES = {"greedy": "greedy", "chain": "sd", "async-chain": "pipespec"}
CALIBRATION_TOKENS = 2000
REFERENCE_DEFAULT_LOOKAHEAD = 5  # the authors' 70B async runs used their decoder's default (see the logs' README)


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


def _simulate_async(costs, alphas, tokens, lookahead, seed=0):
    return sim.simulate_pipespec(costs, [sim.Bernoulli(a) for a in alphas], tokens, lookahead=lookahead,
                                 max_lead=64, seed=seed)


def calibrate_alphas(
    costs: Sequence[sim.StageCost | float], target_accepted: Sequence[float], tokens: int, lookahead: int,
    rounds: int = 2, iterations: int = 12, seed: int = 0,
) -> list[float]:
    """Per-pair alpha such that the simulated pipeline's mean accepted per verification (own token
    included) equals ``target_accepted`` (bisection per pair, pairs in order, ``rounds`` passes)."""
    alphas = [0.5] * len(target_accepted)
    for _ in range(rounds):
        for pair, wanted in enumerate(target_accepted):
            low, high = 0.0, 0.999
            for _ in range(iterations):
                middle = (low + high) / 2
                trial = list(alphas)
                trial[pair] = middle
                result = _simulate_async(costs, trial, tokens, lookahead, seed)
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
    strategy = STRATEGY_NAMES[log.strategy]
    if strategy == "greedy":
        return 1000.0 * t_target
    pair = log.num_pairs - 1
    window = measured.windows[pair]
    gamma = float(window) if window is not None else measured.accepted_per_verify[pair]  # async: a lower bound
    rate = fit.paper_tokens_per_s(strategy, t_target, measured.alphas[pair], gamma, measured.step_mean_s[-2])
    return 1000.0 / rate


def predict_official(
    log: official.OfficialLog, greedy: official.OfficialLog | None = None, seed: int = 0
) -> OfficialPrediction:
    """Our simulator and the paper's model against one published log (ms/token)."""
    measured = fit.measure_official(log)
    strategy = STRATEGY_NAMES[log.strategy]
    tokens = measured.tokens
    costs = [sim.StageCost(t) for t in measured.step_mean_s]
    if strategy == "greedy":
        ours_s, alphas, source, lookahead = tokens * measured.step_mean_s[0], (), "-", 0
    elif strategy == "sd":
        replays = [sim.Replay(tuple(official.accepted_counts(log, p))) for p in range(log.num_pairs)]
        lookahead = official.sync_window(log)
        ours_s = sim.simulate_sync_sd(costs, replays, lookahead, tokens, seed=seed).total_time
        alphas, source = tuple(measured.alphas), "replayed counts"
    else:
        lookahead = official_lookahead(log)
        wanted = [a + 1.0 for a in measured.accepted_per_verify]
        # a shorter simulation suffices to match a mean; the prediction below uses every token
        alphas = tuple(calibrate_alphas(costs, wanted, min(tokens, CALIBRATION_TOKENS), lookahead, seed=seed))
        runs = [_simulate_async(costs, alphas, tokens, lookahead, seed + s).total_time for s in range(3)]
        ours_s, source = float(np.mean(runs)), "calibrated"
    return OfficialPrediction(
        file=log.path.name,
        strategy=strategy,
        models=log.model_names,
        measured_ms=measured.ms_per_token,
        ours_ms=1000.0 * ours_s / tokens,
        paper_ms=_paper_ms(log, measured, greedy),
        alphas=tuple(alphas),
        alpha_source=source,
        lookahead=lookahead,
    )


# --------------------------------------------------------------------------- evaluating runs


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
    ours = predict_measurement(measurement, run.strategy, run.lookahead, run.max_lead or 8, seed)
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


def largest_target_logs(logs: Sequence[official.OfficialLog]) -> list[official.OfficialLog]:
    """The logs whose target is the largest model among ``logs`` (the published 70B runs)."""
    sizes = {log.target: official._size_key(log.model_names[-1]) for log in logs}
    largest = max(sizes.values())
    return [log for log in logs if sizes[log.target] == largest]


def official_predictions(directory, all_logs: bool = False) -> list[OfficialPrediction]:
    """Both models on the published logs (by default only those of the largest target, the 70B runs)."""
    logs = official.load_dir(directory)
    greedy = {}
    for log in logs:
        if log.strategy == "greedy":
            greedy.setdefault(log.target, log)
    chosen = logs if all_logs else largest_target_logs(logs)
    return [predict_official(log, greedy.get(log.target)) for log in chosen]


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
        prog="python -m analysis.wallclock",
        description="Both models (ours and the paper's) against measured runs and/or the published logs.",
    )
    parser.add_argument("runs", nargs="*", help="run directories or directories holding runs")
    parser.add_argument("--official", help="folder of the authors' logs (e.g. .../pipespec-official-results/humaneval)")
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
        print(f"FAIL: our model's largest error {100 * worst:.1f}% exceeds {100 * args.tolerance:.0f}%", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
