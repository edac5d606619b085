"""Sampling at temperature > 0 is lossless in every strategy: statistical tests against the exact target.

- the rule in this process at high N: the output of `speculative_verify` matches p by a
  chi-square test (20000 draws per case: a shift of 2% of the probability mass between two
  likely tokens gives a noncentrality of about 50, found nearly always), a k = 3 chain
  (drafter -> middle -> target, windows of 2; 10000 draws) built from the same rule matches
  the target's joint distribution of two tokens, and the wrong alternatives (keep every draft;
  forward the residual instead of p) fail.
- a stage's distribution bookkeeping (what a drafter sends, what its verifier keeps) under
  random drafting, verification and rollbacks, without processes.
- the whole pipeline (sd and pipespec, k = 2 and 3, top-k and top-p) on tiny models with a
  16-token vocabulary and no EOS: every token of long generations (rollbacks at every stage)
  against the target's exact conditional distribution at its position, by a chi-square test of
  rank classes with enough tokens to catch a 2% shift (each case asserts its power, and a
  simulation checks that power); a deliberately wrong rule (the target keeps every draft,
  injected with the test-only fault action "accept_drafts") fails the same test.
Every draw is seeded, so sd's results are fixed; pipespec's depend on timing, and the pass
threshold (p > 1e-4) makes a false alarm a 1-in-10000 event.
"""

from collections import Counter
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from scipy.stats import chi2, chisquare, norm

from pipespec.faults import FaultPlan
from pipespec.api import Pipeline
from pipespec.decoding import greedy_generate
from pipespec.errors import ConfigError
from pipespec.models import CausalLMRunner, load_model
from pipespec.specs import StageSpec
from pipespec.schedule import roles
from pipespec.protocol import Job
from pipespec.stage import StageRequest
from pipespec.verify import Acceptance, Sampling, encode_dist, point_mass, sampling_probs, speculative_verify

VOCAB = 16
PROMPT = [3, 5, 7, 9]
PASS_P = 1e-4  # a correct rule fails with this probability (pipespec is not seeded exactly)
FAIL_P = 1e-6  # a wrong rule must be at least this clearly wrong


pytestmark = pytest.mark.usefixtures("one_thread")


def chi2_pvalue(counts: Counter, expected: dict) -> float:
    """Chi-square of observed counts against exact probabilities; cells expecting < 5 pooled into one."""
    n = sum(counts.values())
    total = sum(expected.values())  # 1 up to float32 rounding
    cells = [c for c in expected if expected[c] / total * n >= 5]
    exp = [expected[c] / total * n for c in cells]
    obs = [counts.get(c, 0) for c in cells]
    if len(cells) < len(expected) or set(counts) - set(cells):
        exp.append(max(n - sum(exp), 1e-9))
        obs.append(n - sum(obs))
    exp = [e * n / sum(exp) for e in exp]  # scipy wants equal sums to 1e-8
    return chisquare(obs, exp).pvalue


# ---- the rule, in this process ------------------------------------------------------------


def test_sampling_probs_transform():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0, -1.0]])
    plain = sampling_probs(logits, Sampling(1.0))
    torch.testing.assert_close(plain, torch.softmax(logits, -1))
    torch.testing.assert_close(sampling_probs(logits, Sampling(0.5)), torch.softmax(logits / 0.5, -1))
    top3 = sampling_probs(logits, Sampling(1.0, top_k=3))
    assert (top3[0, 3:] == 0).all() and torch.isclose(top3.sum(), torch.tensor(1.0))
    # top-p: the smallest most-likely set with mass >= top_p (here the first two: 0.64 + 0.24)
    cum = plain[0].cumsum(0)
    top_p = float(cum[1]) - 0.01
    kept = sampling_probs(logits, Sampling(1.0, top_p=top_p))[0]
    assert (kept[:2] > 0).all() and (kept[2:] == 0).all()
    torch.testing.assert_close(kept[:2], plain[0, :2] / plain[0, :2].sum())
    assert (sampling_probs(logits, Sampling(1.0, top_k=100, top_p=1.0)) > 0).all()


def test_distributions_travel_sparse_or_dense():
    row = sampling_probs(torch.randn(1, 1000), Sampling(1.0, top_k=20))[0]
    sparse = encode_dist(row)
    assert sparse.ids is not None and len(sparse.ids) == 20
    torch.testing.assert_close(sparse.dense(1000), row, rtol=0, atol=0)  # exactly the numbers sampled from
    full = encode_dist(torch.softmax(torch.randn(1000), -1))
    assert full.ids is None and full.probs.dtype == np.float32
    assert point_mass(7).dense(10).tolist() == [0.0] * 7 + [1.0] + [0.0] * 2
    # a verifier with a smaller (unpadded) vocabulary drops the drafter's padded ids
    assert encode_dist(torch.tensor([0.5, 0.5, 0.0])).dense(2).tolist() == [0.5, 0.5]


def _rule_case(case: str, generator: torch.Generator):
    """(verifier logits, 2 rows; the drafter's distribution q; sampling) for one in-process case."""
    v = 8
    p_logits = torch.randn(2, v, generator=generator) * 1.5
    q_logits = p_logits[0] + torch.randn(v, generator=generator) * 1.5
    sampling = {
        "temperature": Sampling(1.0),
        "top_k": Sampling(0.7, top_k=3),
        "top_p": Sampling(1.3, top_p=0.8),
        "prompt_lookup": Sampling(1.0),
    }[case]
    q = sampling_probs(q_logits.unsqueeze(0), sampling)[0]
    return p_logits, q, sampling


def _first_token_counts(p_logits, q, sampling, draws, check_drafts=True, point=None):
    generator = torch.Generator().manual_seed(1)
    counts = Counter()
    dist = point_mass(point) if point is not None else encode_dist(q)
    for _ in range(draws):
        draft = point if point is not None else int(torch.multinomial(q, 1, generator=generator))
        verdict = speculative_verify([draft], [dist], p_logits, sampling, generator, check_drafts)
        counts[draft if verdict.accepted else verdict.token] += 1
    return counts


@pytest.mark.parametrize("case", ["temperature", "top_k", "top_p", "prompt_lookup"])
def test_rule_output_follows_the_verifier(case):
    p_logits, q, sampling = _rule_case(case, torch.Generator().manual_seed(5))
    p = sampling_probs(p_logits, sampling)[0]
    expected = {t: float(p[t]) for t in range(len(p)) if p[t] > 0}
    point = int(q.argmin()) if case == "prompt_lookup" else None  # a proposal the verifier finds unlikely
    counts = _first_token_counts(p_logits, q, sampling, 20000, point=point)
    assert set(counts) <= set(expected)  # nothing outside the verifier's top-k / top-p support
    assert chi2_pvalue(counts, expected) > PASS_P
    wrong = _first_token_counts(p_logits, q, sampling, 3000, check_drafts=False, point=point)
    assert chi2_pvalue(wrong, expected) < FAIL_P


class MarkovWorld:
    """Three 'models' over a 6-token vocabulary whose logits depend on the previous token only."""

    V = 6

    def __init__(self, sampling: Sampling, seed: int = 1):
        g = torch.Generator().manual_seed(seed)
        base = torch.randn(self.V, self.V, generator=g) * 1.5
        self.tables = [base + s * torch.randn(self.V, self.V, generator=g) for s in (1.0, 0.5)] + [base]
        self.sampling = sampling

    def exact_pairs(self) -> dict:
        p = sampling_probs(self.tables[2], self.sampling)
        return {(a, b): float(p[0, a] * p[a, b]) for a in range(self.V) for b in range(self.V) if p[0, a] * p[a, b] > 0}

    def sd_chain(self, draws: int, forward: str = "p", window: int = 2) -> Counter:
        """Two tokens after token 0 by tiered sd rounds: drafter window -> middle -> target, each by the rule."""
        generator = torch.Generator().manual_seed(2)
        q0 = sampling_probs(self.tables[0], self.sampling)
        counts = Counter()
        for _ in range(draws):
            out = [0]
            while len(out) < 3:
                drafts, dists = [], []
                for _ in range(window):
                    row = q0[drafts[-1] if drafts else out[-1]]
                    drafts.append(int(torch.multinomial(row, 1, generator=generator)))
                    dists.append(encode_dist(row))
                middle = speculative_verify(
                    drafts, dists, self.tables[1][[out[-1]] + drafts], self.sampling, generator
                )
                emitted = drafts[: middle.accepted] + [middle.token]
                emitted_dists = [encode_dist(r) for r in middle.probs]
                if forward == "residual" and middle.accepted < len(drafts):  # the tempting wrong choice
                    residual = (middle.probs[-1] - dists[middle.accepted].dense(self.V)).clamp_min(0)
                    emitted_dists[-1] = encode_dist(residual / residual.sum())
                target = speculative_verify(
                    emitted, emitted_dists, self.tables[2][[out[-1]] + emitted], self.sampling, generator
                )
                out += emitted[: target.accepted] + [target.token]
            counts[(out[1], out[2])] += 1
        return counts


@pytest.mark.slow  # a statistical test over thousands of draws
def test_three_level_chain_in_process_matches_target():
    """Every emitted token travels with the emitter's own p (accepted draft or correction alike)."""
    world = MarkovWorld(Sampling(1.0))
    expected = world.exact_pairs()
    assert chi2_pvalue(world.sd_chain(10000), expected) > PASS_P
    # forwarding the residual a correction was drawn from, instead of p, is biased
    assert chi2_pvalue(world.sd_chain(3000, forward="residual"), expected) < FAIL_P


class _Wire:
    def __init__(self):
        self.sent = []

    def send(self, rank, message):
        self.sent.append((rank, message))


class _NoModel:
    lookup = None
    runner = None

    def truncate(self, valid_tokens):
        pass


def test_distribution_mirror_survives_rollbacks():
    """A verifier's drafts come with exactly the distributions the drafter last sent for them."""
    rng = np.random.default_rng(0)
    job = Job(1, [1], 10_000, [], roles("pipespec", 2, 0, 8), 1.0, ["d", "v"], sampling=Sampling(1.0), acceptance=Acceptance())
    drafter_wire, verifier_wire = _Wire(), _Wire()
    drafter = StageRequest(0, job, _NoModel(), drafter_wire, job.stage_names)
    verifier = StageRequest(1, job, _NoModel(), verifier_wire, job.stage_names)
    published = ([], [])  # the drafter's buffer and distributions at its last message
    offered = 0
    for _ in range(2000):
        action = rng.integers(4)
        if action == 0:  # the drafter drafts
            n = int(rng.integers(1, 4))
            dists = [encode_dist(torch.softmax(torch.randn(VOCAB), -1)) for _ in range(n)]
            drafter.extend([int(t) for t in rng.integers(0, 3, n)], dists)
        elif action == 1:  # the verifier checks what is there, keeps a prefix, adds its own token, commits
            drafts, dists = verifier.available_drafts()
            start = len(verifier.out)
            assert verifier.upstream_buffer == published[0]
            for i, d in enumerate(dists or []):
                assert d is published[1][start + i], "a stale or misplaced distribution"
            offered += len(drafts)
            keep = int(rng.integers(0, len(drafts) + 1))
            verifier.extend(drafts[:keep] + [int(rng.integers(0, 3))], None)
            verifier.commit_upstream()
        elif action == 2:  # the verifier's own verifier rolls it back, with its own token at the cut
            cut = int(rng.integers(0, len(verifier.out) + 1))
            verifier.adopt(verifier.out[:cut] + [int(rng.integers(0, 3))])
            verifier.commit_upstream()
        else:
            before = len(drafter_wire.sent)
            drafter.publish(more_coming=True)
            if len(drafter_wire.sent) > before:
                published = (list(drafter.out), list(drafter.dists))
        for rank, message in drafter_wire.sent:
            verifier.handle(message)
        for rank, message in verifier_wire.sent:
            drafter.handle(message)
        drafter_wire.sent.clear()
        verifier_wire.sent.clear()
        assert all(d is None for d in drafter.dists[: drafter.downstream_committed])  # dropped: never needed
    assert offered > 200
    assert sum(drafter.trace.steps["rollbacks"]) + drafter.trace.pending_rollbacks > 50


# ---- the pipeline ---------------------------------------------------------------------------
#
# Every generated token is tested against the target's exact conditional distribution. Under a
# lossless rule each output token x_t, given everything before it (drafts and timing included),
# is distributed as p_t = the target's transformed distribution after prompt + x_<t. So with
# c_t = the rank class of x_t under p_t (likeliest, 2nd, 3rd, 4th, any other) and pi_t the class
# probabilities, sums over t of (onehot(c_t) - pi_t), weighted or not, are martingales with known
# variance: their statistics (`calibration_test`) hold for pipespec's timing-dependent draws as
# for sd's seeded ones. One call of 128 tokens gives 128 observations (a 3-token joint needs a
# call per observation), so the test can catch a 2% shift: each case computes, from the
# positions it saw, its power against "2% of the mass moved between the target's likeliest and
# second likeliest token at every position" and asserts it is at least 0.9.

RANK_CLASSES = 5
SHIFT = 0.02  # the shift (total variation per position) each case must be able to catch
MIN_POWER = 0.9
LENGTH = 128  # tokens per call
CALLS = 40  # calls per distribution test: power 0.93-0.96 measured in its seven cases (0.9 asserted)
PROMPT_LENGTH = 6
# Flat conditionals make each token say more about a shift (the score's noncentrality per position,
# m^2 (1/pi_0 + 1/pi_1), grows as the likeliest two get less likely): on these targets 0.95 power takes
# about 40 calls of 128 tokens at these settings against about 60 at temperature 0.6 with top-k 8.
# Both still truncate: top-k keeps 10 of 16 tokens, top-p about 6.5 on average.
TOP_K = Sampling(temperature=0.9, top_k=10)
TOP_P = Sampling(temperature=1.0, top_p=0.98)


# drafter (weight noise 0.08), middle (0.03), target; one layer, vocabulary 16, no EOS. Both
# outcomes of the ratio test are common, and high acceptance and one layer keep a token cheap.
TINY = {"noise": [0.08, 0.03], "eos_token_id": None, "vocab_size": VOCAB, "num_layers": 1}


@pytest.fixture(scope="module")
def target_model(tiny):
    return load_model(StageSpec(model=tiny[-1]))


def random_prompt(seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, VOCAB, PROMPT_LENGTH)]


def draw_outputs(pipe, strategy, lookahead, sampling, calls, **options) -> list:
    """`calls` generations of LENGTH tokens, call i from random_prompt(i) with seed i."""
    s = sampling
    return [
        pipe.generate(
            random_prompt(i), LENGTH, strategy=strategy, lookahead=lookahead, temperature=s.temperature,
            top_k=s.top_k, top_p=s.top_p, seed=i, **options,
        )
        for i in range(calls)
    ]


def target_conditionals(model, results, sampling) -> tuple[np.ndarray, np.ndarray]:
    """(p_t for every generated position [positions, vocab] float64, the generated tokens), one batched forward."""
    sequences = torch.tensor([random_prompt(i) + r.tokens for i, r in enumerate(results)])
    with torch.inference_mode():
        logits = model(sequences).logits[:, PROMPT_LENGTH - 1 : -1]
    probs = sampling_probs(logits, sampling).double().reshape(-1, VOCAB).numpy()
    return probs, sequences[:, PROMPT_LENGTH:].reshape(-1).numpy()


@dataclass
class Calibration:
    pvalue: float  # of the rank classes under the target's conditionals (both statistics, Bonferroni)
    power: float  # at PASS_P, against a SHIFT moved from the 2nd likeliest token to the likeliest or back
    positions: int


def calibration_test(probs: np.ndarray, tokens: np.ndarray, shift: float = SHIFT) -> Calibration:
    """Two statistics of the rank class c_t of each token under its conditional pi_t, each at PASS_P / 2:

    - any shift between classes: the chi-square of sum_t (onehot(c_t) - pi_t) with its covariance;
    - the score of "mass m_t = min(shift, pi_t1) moved between the likeliest and the 2nd": sum_t m_t
      (1[c_t = 0] / pi_t0 - 1[c_t = 1] / pi_t1), mean 0 and variance sum_t m_t^2 (1/pi_t0 + 1/pi_t1),
      the most powerful statistic for that shift (noncentrality sum_t m_t^2 (1/pi_t0 + 1/pi_t1)).
    """
    order = np.argsort(-probs, axis=1, kind="stable")
    ranked = np.take_along_axis(probs, order, axis=1)
    pi = np.concatenate([ranked[:, : RANK_CLASSES - 1], ranked[:, RANK_CLASSES - 1 :].sum(1, keepdims=True)], 1)
    classes = np.minimum(np.argmax(order == tokens[:, None], axis=1), RANK_CLASSES - 1)
    deviation = (np.bincount(classes, minlength=RANK_CLASSES) - pi.sum(0))[:-1]  # the last class is implied
    covariance = (np.diag(pi.sum(0)) - pi.T @ pi)[:-1, :-1]
    omnibus = chi2.sf(float(deviation @ np.linalg.solve(covariance, deviation)), RANK_CLASSES - 1)
    usable = pi[:, 1] > 0
    p0, p1, c = pi[usable, 0], pi[usable, 1], classes[usable]
    moved = np.minimum(shift, p1)
    score = float((moved * ((c == 0) / p0 - (c == 1) / p1)).sum())
    noncentrality = float((moved**2 * (1 / p0 + 1 / p1)).sum())
    directed = 2 * norm.sf(abs(score) / noncentrality**0.5)  # the score's variance equals its noncentrality
    critical = norm.isf(PASS_P / 4)
    power = norm.sf(critical - noncentrality**0.5) + norm.cdf(-critical - noncentrality**0.5)
    return Calibration(min(1.0, 2 * min(omnibus, directed)), power, len(tokens))


def target_checks(results) -> tuple[int, float]:
    """Drafts offered to the target over all results, and the fraction it accepted."""
    summaries = [r.summary()[-1] for r in results]
    offered = sum(s["offered"] for s in summaries)
    return offered, sum(s["accepted"] for s in summaries) / offered


# (strategy, k, lookahead, sampling, calls, options). pipespec waits for 2 drafts: tiny stages all run
# at the same speed, and with lookahead 0 the target would mostly step alone before drafts arrive; its
# k = 3 case also stops drafters whose own probability of their lead is below 0.5
CASES = [
    ("sd", 2, 4, TOP_K, CALLS, {}),
    ("pipespec", 2, 2, TOP_P, CALLS, {}),
    ("sd", 3, 3, TOP_P, CALLS, {}),
    ("pipespec", 3, 2, TOP_K, CALLS, {"draft_confidence": 0.5}),
]


@pytest.mark.slow  # a statistical test over thousands of pipeline tokens
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-k{c[1]}-L{c[2]}" for c in CASES])
def test_pipeline_samples_the_target_distribution(pipes, target_model, case):
    strategy, k, lookahead, sampling, calls, options = case
    results = draw_outputs(pipes[k], strategy, lookahead, sampling, calls, **options)
    assert results[-1].lossless and results[-1].acceptance == "exact"
    assert results[-1].sampling == {**sampling.as_dict(), "seed": calls - 1}
    assert all(len(r.tokens) == LENGTH for r in results)
    offered, acceptance = target_checks(results)
    assert offered >= calls * LENGTH / 4 and 0.1 < acceptance < 0.95  # the ratio test decides often, both ways
    assert sum(r.summary()[0]["rollbacks"] for r in results) > calls  # rollbacks reach the first stage
    check = calibration_test(*target_conditionals(target_model, results, sampling))
    assert check.power >= MIN_POWER, f"{check.positions} positions catch a {SHIFT:.0%} shift with power {check.power:.2f}"
    assert check.pvalue > PASS_P, check


# the target keeps every draft unchecked; or the middle does, and so sends its own p for tokens that
# follow the drafter's q, and the target tests them against the wrong q (untruncated sampling: under
# top-k / top-p the target already refuses a draft its sender gave probability 0, a louder failure).
# Both sample at temperature 0.6, which sharpens the drafter's departures from the target: at TOP_K's
# flatter setting 30 calls of sd's wrong rule gave p = 0.006, and pipespec's at temperature 1 gave
# p = 1.3e-4 once on a loaded machine (1e-16 to 3e-7 on a quieter one; 1e-20 to 3e-35 at 0.6), where
# failing means p < 1e-4.
@pytest.mark.slow  # a statistical test over thousands of pipeline tokens
@pytest.mark.parametrize(
    "strategy, k, wrong_stage, sampling, calls",
    [("sd", 2, 1, Sampling(0.6, top_k=8), 30), ("pipespec", 3, 1, Sampling(0.6), 30)],
)
def test_a_wrong_rule_fails_the_same_test(pipes, target_model, strategy, k, wrong_stage, sampling, calls):
    wrong = FaultPlan(stage=wrong_stage, action="accept_drafts")
    results = draw_outputs(pipes[k], strategy, 2, sampling, calls, faults=wrong)
    assert not results[-1].lossless
    kept = [r.summary()[wrong_stage] for r in results]
    assert sum(s["offered"] for s in kept) > 0 and all(s["accepted"] == s["offered"] for s in kept)
    assert calibration_test(*target_conditionals(target_model, results, sampling)).pvalue < PASS_P


def test_the_calibration_test_catches_a_two_percent_shift(target_model):
    """The power the pipeline tests assert is real: draws 2% off the target at every position fail."""
    rng = np.random.default_rng(0)
    sequences = torch.tensor([random_prompt(i) + list(rng.integers(0, VOCAB, LENGTH)) for i in range(80)])
    with torch.inference_mode():
        logits = target_model(sequences).logits[:, PROMPT_LENGTH - 1 : -1]
    probs = sampling_probs(logits, TOP_K).double().reshape(-1, VOCAB).numpy()
    order = np.argsort(-probs, axis=1, kind="stable")
    first, second = order[:, 0], order[:, 1]
    rows = np.arange(len(probs))
    shifted = probs.copy()
    moved = np.minimum(SHIFT, probs[rows, second])
    shifted[rows, first] += moved
    shifted[rows, second] -= moved
    power = calibration_test(probs, first).power  # the tokens do not matter for the power
    assert power >= MIN_POWER
    caught = exact = 0
    for _ in range(100):
        exact += calibration_test(probs, _draw_rows(probs, rng)).pvalue > PASS_P
        caught += calibration_test(probs, _draw_rows(shifted, rng)).pvalue < PASS_P
    assert exact >= 97 and caught >= 100 * power - 12, (exact, caught, power)


def _draw_rows(probs: np.ndarray, rng) -> np.ndarray:
    """One token per row of `probs`."""
    return (probs.cumsum(1) < rng.random((len(probs), 1))).sum(1).clip(max=probs.shape[1] - 1)


def test_a_seed_replays_sd_and_greedy(pipes):
    pipe = pipes[3]
    for strategy in ("sd", "greedy"):
        first = pipe.generate(PROMPT, 24, strategy=strategy, lookahead=3, temperature=1.0, seed=11).tokens
        assert pipe.generate(PROMPT, 24, strategy=strategy, lookahead=3, temperature=1.0, seed=11).tokens == first
        assert pipe.generate(PROMPT, 24, strategy=strategy, lookahead=3, temperature=1.0, seed=12).tokens != first
    fresh = pipe.generate(PROMPT, 24, strategy="sd", lookahead=3, temperature=1.0)  # a fresh seed, recorded
    replay = pipe.generate(PROMPT, 24, strategy="sd", lookahead=3, temperature=1.0, seed=fresh.sampling["seed"])
    assert replay.tokens == fresh.tokens


def test_temperature_zero_is_greedy_whatever_the_other_options(pipes, tiny):
    runner = CausalLMRunner(load_model(StageSpec(model=tiny[-1])))
    for prompt in ([3, 5, 7, 9], [2, 11, 4], [8]):
        expected = greedy_generate(runner, prompt, 16, [])
        for strategy, lookahead in (("greedy", 0), ("sd", 3), ("pipespec", 0), ("pipespec", 2)):
            result = pipes[3].generate(
                prompt, 16, strategy=strategy, lookahead=lookahead, temperature=0, top_k=2, top_p=0.3, seed=4
            )
            assert result.tokens == expected, (strategy, lookahead)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"top_k": True}, "top_k"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"seed": -3}, "seed"),
        ({"seed": "abc"}, "seed"),
    ],
)
def test_bad_sampling_options_are_clear_errors(tiny, options, message):
    with pytest.raises(ConfigError, match=message):
        Pipeline(tiny[1:], **options)
    pipe = Pipeline(tiny[1:])
    with pytest.raises(ConfigError, match=message):
        pipe.generate(PROMPT, 3, **options)
    assert not pipe.started
