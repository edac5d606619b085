"""Synthetic acceptance (benchmarking only): each verifier keeps each draft by a seeded coin.

The coin is tossed per examined draft, until the first tails (like vLLM's synthetic rejection
sampler, whose rate is the conditional acceptance rate). So the rate r shows in the traces as
accepted / (accepted + rejections): every examined draft is a Bernoulli(r) trial. The trace
summary's `draft_acceptance_rate` is accepted / offered, and offered also counts the drafts after the
first rejection that no coin was tossed for; its expectation given the offered counts n of each
verification is sum over verifications of r (1 - r^n) / (1 - r), divided by the drafts offered,
which the tests check too.
"""

import pytest

from pipespec.api import Pipeline
from pipespec.decoding import greedy_generate
from pipespec.errors import ConfigError
from pipespec.models import CausalLMRunner, load_model
from pipespec.specs import StageSpec
from experiments.tiny import random_prompts

MAX_NEW = 64
# pipespec verifiers wait for 2 drafts (lookahead 2): these tiny stages all step equally fast, so with
# lookahead 0 a verifier mostly steps alone before drafts arrive and few coins are tossed
TOLERANCE_SD = 4.0  # a correct rule fails with probability ~1e-4 (pipespec is not seeded exactly)


# drafter (weight noise 0.3), middle (0.05), target; vocabulary 256, no EOS (full-length outputs)
TINY = {"noise": [0.3, 0.05], "eos_token_id": None}


def verify_rows(results, stage):
    """(offered, accepted) of every verification step of `stage` over the results."""
    rows = []
    for result in results:
        steps = result.stage_traces[stage].steps
        rows += [(o, a) for k, o, a in zip(steps["kind"], steps["offered"], steps["accepted"]) if k == "verify"]
    return rows


def check_conditional_rate(rows, rate):
    """Each examined draft is a coin: accepted ones, plus one rejection per verification that stopped early."""
    accepted = sum(a for _, a in rows)
    examined = accepted + sum(a < o for o, a in rows)
    assert examined >= 200, examined
    tolerance = TOLERANCE_SD * (rate * (1 - rate) / examined) ** 0.5
    assert abs(accepted / examined - rate) <= tolerance, (accepted / examined, rate, examined)


def check_summary_rate(results, stage, rows, rate):
    """summarize_stage's draft_acceptance_rate (accepted / offered) against its exact expectation given the offers."""
    offered = sum(o for o, _ in rows)
    summaries = [r.summary()[stage] for r in results]
    assert sum(s["offered"] for s in summaries) == offered
    accepted = sum(s["accepted"] for s in summaries)
    mean = var = 0.0
    for n, _ in rows:  # accepted = min(heads before the first tails, n)
        probs = [rate**a * (1 - rate) for a in range(n)] + [rate**n]
        m = sum(a * p for a, p in enumerate(probs))
        mean += m
        var += sum(a * a * p for a, p in enumerate(probs)) - m * m
    assert abs(accepted - mean) <= TOLERANCE_SD * var**0.5 + 1e-9, (accepted / offered, mean / offered)


@pytest.mark.parametrize("strategy, lookahead", [("sd", 4), ("pipespec", 2)])
@pytest.mark.parametrize(
    "k, rates", [(2, [0.2]), (2, [0.8]), pytest.param(3, [0.2, 0.8], marks=pytest.mark.slow),
                 pytest.param(3, [0.8, 0.2], marks=pytest.mark.slow)]
)
def test_measured_acceptance_follows_the_rate(pipes, strategy, lookahead, k, rates):
    prompts = random_prompts(6, length=8, seed=k)
    first_seed = 100 * k + round(10 * rates[0])  # coin streams of their own: the cases stay independent
    results = [
        pipes[k].generate(
            p, MAX_NEW, strategy=strategy, lookahead=lookahead, acceptance="synthetic", synthetic_rates=rates,
            seed=first_seed + i,
        )
        for i, p in enumerate(prompts)
    ]
    assert all(r.acceptance == "synthetic" and not r.lossless and r.synthetic_rates == rates for r in results)
    for stage, rate in enumerate(rates, start=1):
        rows = verify_rows(results, stage)
        check_conditional_rate(rows, rate)
        check_summary_rate(results, stage, rows, rate)


@pytest.mark.parametrize("strategy, lookahead", [("sd", 4), ("pipespec", 2)])
def test_rate_one_accepts_every_draft_and_rate_zero_none(pipes, tiny, strategy, lookahead):
    prompt = random_prompts(1, length=8, seed=3)[0]
    everything = pipes[3].generate(
        prompt, 32, strategy=strategy, lookahead=lookahead, acceptance="synthetic", synthetic_rates=1.0
    )
    assert everything.synthetic_rates == [1.0, 1.0]
    for stage in (1, 2):
        s = everything.summary()[stage]
        assert s["offered"] > 0 and s["accepted"] == s["offered"], (stage, s)
    nothing = pipes[3].generate(
        prompt, 32, strategy=strategy, lookahead=lookahead, acceptance="synthetic", synthetic_rates=[0.0, 0.0]
    )
    for stage in (1, 2):
        s = nothing.summary()[stage]
        assert s["offered"] > 0 and s["accepted"] == 0, (stage, s)
    # rejecting every draft leaves the target's own argmax at every position: greedy decoding
    runner = CausalLMRunner(load_model(StageSpec(model=tiny[-1])))
    assert nothing.tokens == greedy_generate(runner, prompt, 32, [])


def test_synthetic_sd_replays_with_its_seed(pipes):
    prompt = random_prompts(1, length=8, seed=4)[0]
    runs = [
        pipes[3].generate(prompt, 32, strategy="sd", lookahead=4, acceptance="synthetic", synthetic_rates=0.5, seed=9)
        for _ in range(2)
    ]
    assert runs[0].tokens == runs[1].tokens
    assert [t.steps["accepted"] for t in runs[0].stage_traces] == [t.steps["accepted"] for t in runs[1].stage_traces]


def test_exact_acceptance_is_the_default(pipes):
    result = pipes[2].generate([5, 6, 7], 8)
    assert (result.acceptance, result.lossless, result.synthetic_rates) == ("exact", True, None)
    # rates set on the pipeline are only used when a call asks for synthetic acceptance
    with Pipeline(pipes[2].specs, synthetic_rates=0.5) as pipe:
        assert pipe.generate([5, 6, 7], 8).acceptance == "exact"
        assert pipe.generate([5, 6, 7], 8, acceptance="synthetic").synthetic_rates == [0.5]


@pytest.mark.parametrize(
    "options, message",
    [
        ({"acceptance": "synthetic", "synthetic_rates": -0.1}, "synthetic_rates"),
        ({"acceptance": "synthetic", "synthetic_rates": 1.5}, "synthetic_rates"),
        ({"acceptance": "synthetic", "synthetic_rates": "high"}, "synthetic_rates"),
        ({"acceptance": "synthetic", "synthetic_rates": True}, "synthetic_rates"),
        ({"acceptance": "synthetic", "synthetic_rates": [0.5, 0.5]}, "synthetic_rates"),  # k = 2: one pair
        ({"acceptance": "synthetic", "synthetic_rates": [float("nan")]}, "synthetic_rates"),
        ({"acceptance": "synthetic"}, "synthetic_rates"),
        ({"acceptance": "synthetic", "synthetic_rates": 0.5, "temperature": 0.7}, "temperature 0"),
        ({"acceptance": "lucky"}, "acceptance"),
        ({"synthetic_rates": 2.0}, "synthetic_rates"),
    ],
)
def test_bad_acceptance_options_are_clear_errors(tiny, options, message):
    with pytest.raises(ConfigError, match=message):
        Pipeline(tiny[1:], **options)
    pipe = Pipeline(tiny[1:])
    with pytest.raises(ConfigError, match=message):
        pipe.generate([5, 6, 7], 8, **options)
    assert not pipe.started
