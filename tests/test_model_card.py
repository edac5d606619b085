"""The model card's arithmetic on hand-made traces (the measuring itself runs real models)."""

from types import SimpleNamespace

from pipespec.api import GenerationResult
from experiments.model_card import DATASETS, format_card, summarize_runs
from pipespec.trace import StageTrace


def result(tokens, time_s, verifies=()):
    """A 2-stage result whose target verified (offered, accepted) per entry of `verifies`."""
    drafter, target = StageTrace(0, "d"), StageTrace(1, "t")
    for offered, accepted in verifies:
        target.record(0.0, 0.1, "verify", offered + 1, offered, accepted, accepted + 1)
    return GenerationResult(tokens, "", time_s, "sd", 4, [drafter, target])


def test_summarize_runs_pools_pairs_and_counts_identical():
    runs = {
        "greedy": [result([1, 2, 3], 1.0), result([4, 5], 1.0)],
        "sd": [result([1, 2, 3], 0.5, [(4, 2)]), result([4, 6], 0.5, [(4, 4), (2, 0)])],
        "pipespec": [result([1, 2, 3], 0.25), result([4, 5], 0.25)],
    }
    row = summarize_runs(runs, n_stages=2)
    assert row["n"] == 2
    assert row["pairs"] == [{"draft_acceptance_rate": 6 / 10, "mean_acceptance_length": 3.0}]
    assert row["greedy"] == {"tokens_per_s": 2.5, "identical": 2}
    assert row["sd"]["identical"] == 1 and row["sd"]["tokens_per_s"] == 5.0
    assert row["pipespec"]["tokens_per_s"] == 10.0


def test_format_card_has_a_row_per_pair_and_the_costs():
    row = {"n": 2, "pairs": [{"draft_acceptance_rate": 0.5, "mean_acceptance_length": None}],
           "greedy": {"tokens_per_s": 1, "identical": 2}, "sd": {"tokens_per_s": 2, "identical": 2},
           "pipespec": {"tokens_per_s": 3, "identical": 1}}
    cards = {"h": {"stages": ["0:a", "1:b"], "idle_cpu": 0.001, **{d: row for d in DATASETS}}}
    args = SimpleNamespace(samples=2, max_new_tokens=8, sd_lookahead=4)
    card = format_card(cards, {"b": [float(n) for n in range(1, 17)]}, args)
    assert card.count("| h |") == len(DATASETS)
    assert "| 0.50 | - | 1.0 | 2.0 | 3.0 | 2/2 | 1/2 |" in card
    assert "| b | 1 | 2 |" in card and "- h: 0.001" in card
