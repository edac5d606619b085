"""Measured against predicted: a machine profile's predictions checked on measurements (no torch).

    python -m analysis.validate PROFILE SWEEP_DIR [--json]          # a paired sweep (python -m experiments.sweep)
    python -m analysis.validate PROFILE RUN_DIRS... [--json]        # sequential runs (no pairing)
    python -m analysis.validate PROFILE RUN_DIRS... --costs         # the profile's t(n) beside the runs' own
    python -m analysis.validate PROFILE RUN_DIRS... --greedy-speed  # costs at the greedy run's speed
    python -m analysis.validate PROFILE RUN_DIRS... --repeats       # identical runs: their spread, the floor
    python -m analysis.validate --summary VALIDATION_JSON...        # the figures over several --json reports

What a report holds, its targets and how to read it: docs/prediction.md ("Validate", "The kinds of error").
Here: sequential runs (`runs`); a paired sweep read and checked (`sweeps`), its timing-free counts
(`counts`), the statistics of its noise floor (`stats`), the targets and error kinds (`targets`), its
records (`records`), the text and JSON report (`report`); the command line (`cli`).
"""

from analysis.validate.runs import (
    Validation, run_stages, in_sample, run_warnings, why_not, predict_run, validate_run, validate, summary,
    SEQUENTIAL, format_report, configuration, Repeats, repeats, format_repeats, target_step_costs, greedy_speed,
    at_speed, format_costs
)
from analysis.validate.records import (
    SWEEP_FORMAT, ACCEPTANCE, STEPS, VERIFY, TARGETS, SHOWN_BELOW, SweepRuns, CountCheck, SweepRecord, Ranking,
    SweepReport
)
from analysis.validate.stats import (
    relative_error, repetition_spread, relative_half_width, average_ranks, spearman, top_pick, ranking,
    regret_floor, repetition_speedups, repetition_agreement
)
from analysis.validate.counts import (
    pooled_stages, counts_of, count_values, count_prompt_spreads, predicted_counts, by_repetition, count_checks
)
from analysis.validate.sweeps import (
    is_sweep_dir, load_sweep, check_hierarchy, sweep_overlap, STEP_SIZES, TraceReading, speed_factors,
    tokens_per_s, check_configuration, check_sweep, sweep_costs, stage_costs
)
from analysis.validate.targets import (
    sweep_figures, _figure, prompts_floor, sampling_reach, beyond_sampling, sampling_line, decomposition
)
from analysis.validate.report import (
    FIGURE_LABELS, target_lines, decomposition_line, report_figures, format_sweep_report, sweep_report_json,
    read_sweep_report, format_sweep_summary
)
from analysis.validate.cli import read_reports, format_summary, USAGE, main, sweep_main, sequential_main
from analysis.paired import REFERENCE
