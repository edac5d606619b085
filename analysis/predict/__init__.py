"""Our wall-clock predictor: tokens/s of greedy, sd and pipespec for any hierarchy (no torch).

    python -m analysis.predict PROFILE [strategy=pipespec] [lookahead=0] [max_lead=8] [tokens=128] [--json]
    python -m analysis.predict PROFILE --sweep [tokens=128] [--json]     # every configuration, best first

One input, a `Hierarchy` (`hierarchy`: per stage its step cost, overhead, prefill, contention and supply,
per pair an acceptance model, the handoff and dispatch latencies), built from a machine profile, a run's
measurement or a published log; `predict` plays it in the simulator (`analysis.simulate`, the engine's
own schedule) and returns a `Prediction` (`prediction`); a profile's configurations, the paper's model
beside and the sweep (`from_profile`); the command line (`cli`). What it adds to the paper's model, its
assumptions and how well it predicts: docs/prediction.md; in sample on runs: docs/analysis.md.
"""

from analysis.predict.hierarchy import (
    SEEDS, REPEAT_SEEDS, CRITICAL_PATH, SIDE_BY_SIDE, TwoRateAcceptance, StageModel, Hierarchy, stage_cost,
    sample_cost, fitted_cost, subset_pairs, check_stages, profile_contention, acceptance, tree_acceptance,
    tree_proposals
)
from analysis.predict.prediction import (
    STRATEGIES, Prediction, sd_handoff_s, simulate_generation, startup_s, predict, INTERVAL_Z, prompt_interval
)
from analysis.predict.from_profile import (
    SD_WINDOWS, LOOKAHEADS, MAX_LEADS, paper_alpha_gamma, paper_profile_tokens_per_s, paper_profile_counts,
    predict_profile, with_speedup, stage_subsets, configurations, tree_sizes, sweep
)
from analysis.predict.cli import OPTIONS, parse_options, prediction_record, format_prediction, USAGE, main
from analysis import simulate as sim
