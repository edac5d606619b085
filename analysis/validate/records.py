"""What a paired sweep's validation holds: the sweep as read (`SweepRuns`), per configuration its record
(`SweepRecord`, its timing-free counts `CountCheck`), the rankings (`Ranking`) and the report
(`SweepReport`, written by `--json` and read back by `--summary`); the counts' names and the targets a
held-out sweep must show (docs/prediction.md, "Validate").
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from analysis.paired import PairedSpeedup, REFERENCE, Sample
from analysis.runs import Run


SWEEP_FORMAT = "pipespec-sweep-validation"
ACCEPTANCE, STEPS, VERIFY = "mean acceptance length", "target steps per token", "verification fraction"
# what a held-out sweep must show: a largest value (|error|, regret), for spearman a least one
TARGETS = {"speedup_median": 0.06, "speedup_max": 0.15, "counts_median": 0.06, "counts_max": 0.15, "regret": 0.03,
           "spearman": 0.8}  # fmt: skip
SHOWN_BELOW = 1 / 3  # a sweep can show a target only where its floor is below this share of the target


@dataclass(frozen=True)
class SweepRuns:
    """A paired sweep as read: per configuration (its folder name) its run, and the sweep's samples and
    paired speedups against greedy."""

    path: Path
    runs: dict[str, Run]
    samples: tuple[Sample, ...]
    speedups: dict[str, PairedSpeedup]


@dataclass(frozen=True)
class CountCheck:
    """One timing-free count of a configuration: measured (pooled stage statistics), ours, the paper's."""

    figure: str  # ACCEPTANCE (per verifier), STEPS or VERIFY (the target's)
    stage: str  # the verifier it is of
    measured: float | None
    predicted: float | None
    paper: float | None
    error: float | None  # predicted / measured - 1 (None where either is missing, or measured is 0)
    paper_error: float | None
    floor: float | None  # its spread over the sweep's repetitions (`repetition_spread`)
    prompts: float | None = None  # half its interval over the sweep's prompts (`count_prompt_spreads`); None: older


@dataclass(frozen=True)
class SweepRecord:
    """One configuration of a sweep against its prediction from the profile."""

    configuration: str
    strategy: str
    lookahead: int
    max_lead: int | None
    stages: tuple[str, ...]
    prompts: int
    repetitions: int
    measured_speedup: float  # geometric-mean paired speedup over greedy
    measurement_interval: tuple[float, float]  # 95%, repetitions resampled within prompts
    sampling_interval: tuple[float, float]  # 95%, prompts resampled
    predicted_speedup: float  # ours: predict_profile(configuration) / predict_profile(greedy)
    predicted_interval: tuple[float, float] | None  # 95% over the profile's prompts
    paper_speedup: float
    speedup_error: float
    paper_speedup_error: float
    counts: tuple[CountCheck, ...]
    measured_tokens_per_s: float  # pooled over the run's samples
    predicted_tokens_per_s: float  # at the profile's speed
    paper_predicted_tokens_per_s: float
    machine_speed: float  # the greedy runs' median speed factor: the machine's speed during the sweep
    own_speed: float | None  # this run's median speed factor (its target's steps, contention included)
    at_speed_error: float  # predicted / machine_speed / measured - 1 (a decomposition)
    paper_at_speed_error: float
    schedule_error: float | None  # what the counts leave of at_speed_error: seconds per target step
    speedup_floor: float | None  # the measurement interval's relative half-width
    tokens_per_s_floor: float | None  # spread of the run's tokens/s over the repetitions
    # each model stage's steps by what came before them and their size (`speed_factors`): (stage, condition, size,
    # their median speed factor over the machine's speed, how many); () in reports written before it
    step_factors: tuple[tuple[str, str, str, float, int], ...] = ()
    # each model stage's busy share while the target decodes (`speed_factors`): (stage, measured, the simulation's);
    # () in reports written before it
    busy: tuple[tuple[str, float, float | None], ...] = ()
    # ours at the sweep's own stage costs (`sweep_costs`), the profile's acceptance; None in reports written before it
    costs_speedup: float | None = None

    @property
    def costs_speedup_error(self) -> float | None:
        return None if self.costs_speedup is None else self.costs_speedup / self.measured_speedup - 1

    @property
    def is_reference(self) -> bool:
        return self.configuration == REFERENCE


@dataclass(frozen=True)
class Ranking:
    """How a model orders a sweep's configurations: Spearman against the measured speedups, and its top pick."""

    spearman: float | None  # None with fewer than three configurations
    top_pick: str
    top_pick_measured: float
    regret: float  # 1 - the top pick's measured speedup / the best measured


@dataclass(frozen=True)
class SweepReport:
    profile: str
    sweep: str
    prompts: tuple[str, ...]
    seen: tuple[str, ...]  # the sweep's prompts that the profile measured acceptance on
    records: tuple[SweepRecord, ...]
    ours: Ranking
    paper: Ranking
    measured_best: str
    repetition_spearman: float | None  # `repetition_agreement`
    regret_floor: float | None  # `regret_floor`
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    # per model stage with steps: (name, speed, contention or None, wake or None, the profile's contention)
    # (`sweep_costs`); () in reports written before it
    stage_costs: tuple[tuple[str, float, float | None, float | None, float], ...] = ()

    @property
    def in_sample(self) -> bool:
        return bool(self.seen)
