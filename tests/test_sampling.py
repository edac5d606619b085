"""Sampling at temperature > 0 is lossless in every strategy: statistical tests against the exact target.

Two levels, because draws through the multi-process pipeline are slow (tens of ms each):
- the rule in this process at high N: the output of `speculative_verify` matches p by a
  chi-square test (20000 draws per case: a shift of 2% of the probability mass between two
  likely tokens gives a noncentrality of about 50, found nearly always), a k = 3 chain
  (drafter -> middle -> target, windows of 2; 10000 draws) built from the same rule matches
  the target's joint distribution of two tokens, and the wrong alternatives (keep every draft;
  forward the residual instead of p) fail.
- a stage's distribution bookkeeping (what a drafter sends, what its verifier keeps) under
  random drafting, verification and rollbacks, without processes.
- the whole pipeline (sd and pipespec, k = 2 and 3) on tiny models with a 16-token vocabulary
  and no EOS: the joint distribution of the 3 tokens of many short calls matches the exact
  target joint computed from the target's probabilities, and a deliberately wrong rule (the
  target keeps every draft, injected with the test-only fault action "accept_drafts") fails the
  same test. At 600 calls per case they catch a shift of about 8% of the mass between the two
  likeliest sequences (p < 1e-4 four times in five), far less than plumbing errors move (a
  distribution sent for the wrong token or position, a stale one after a rollback); long
  generations add rollbacks at every stage.
Every draw is seeded, so sd's results are fixed; pipespec's depend on timing, and its
thresholds (p > 1e-4) make a false alarm a 1-in-10000 event.
"""

import itertools
from collections import Counter

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from pipespec.api import Pipeline
from pipespec.decoding import greedy_generate
from pipespec.models import CausalLMRunner, ConfigError, StageSpec, load_model
from pipespec.schedule import roles
from pipespec.stage import Job, StageRequest
from pipespec.testing import build_tiny_hierarchy
from pipespec.verify import Sampling, encode_dist, point_mass, sampling_probs, speculative_verify

VOCAB = 16
PROMPT = [3, 5, 7, 9]
JOINT_SAMPLING = Sampling(temperature=0.8, top_k=8)  # peaked: about 10 likely 3-token sequences
DRAWS = 600  # pipeline calls per strategy and depth (about 20 ms each)
WRONG_DRAWS = 400
PASS_P = 1e-4  # a correct rule fails with this probability (pipespec is not seeded exactly)
FAIL_P = 1e-6  # a wrong rule must be at least this clearly wrong


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    torch.set_num_threads(1)  # in-process rule tests: thread pools only add latency on tiny tensors


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
    job = Job(1, [1], 10_000, [], roles("pipespec", 2, 0, 8), 1.0, ["d", "v"], sampling=Sampling(1.0))
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


@pytest.fixture(scope="module")
def tiny16(tmp_path_factory):
    """drafter (weight noise 0.3), middle (0.1), target; vocabulary 16, no EOS."""
    return build_tiny_hierarchy(tmp_path_factory.mktemp("tiny16"), [0.3, 0.1], eos_token_id=None, vocab_size=VOCAB)


@pytest.fixture(scope="module")
def pipes(tiny16):
    with Pipeline(tiny16[1:]) as k2, Pipeline(tiny16) as k3:
        yield {2: k2, 3: k3}


def exact_joint(model_path: str, prompt: list[int], n: int, sampling: Sampling) -> dict:
    """P(first n tokens) under the target's transformed distribution, from one batched forward."""
    model = load_model(StageSpec(model=model_path))
    prefixes = list(itertools.product(range(VOCAB), repeat=n - 1))
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + list(s) for s in prefixes])).logits[:, len(prompt) - 1 :]
    probs = sampling_probs(logits, sampling)
    joint = {}
    for row, prefix in enumerate(prefixes):
        head = float(np.prod([float(probs[row, j, t]) for j, t in enumerate(prefix)]))
        for token in range(VOCAB):
            if head * probs[row, n - 1, token] > 0:
                joint[prefix + (token,)] = head * float(probs[row, n - 1, token])
    return joint


@pytest.fixture(scope="module")
def target_joint(tiny16):
    return exact_joint(tiny16[-1], PROMPT, 3, JOINT_SAMPLING)


def draw_sequences(pipe, strategy, lookahead, draws, **options) -> tuple[Counter, list]:
    """Counts of the 3-token outputs of `draws` calls (seeds 0, 1, ...), and the results."""
    s = JOINT_SAMPLING
    results = [
        pipe.generate(
            PROMPT, 3, strategy=strategy, lookahead=lookahead, temperature=s.temperature, top_k=s.top_k,
            top_p=s.top_p, seed=i, **options,
        )
        for i in range(draws)
    ]
    return Counter(tuple(r.tokens) for r in results), results


def target_checks(results) -> tuple[int, float]:
    """Drafts offered to the target over all results, and the fraction it accepted."""
    summaries = [r.summary()[-1] for r in results]
    offered = sum(s["offered"] for s in summaries)
    return offered, sum(s["accepted"] for s in summaries) / offered


# pipespec waits for 2 drafts (lookahead 2): with lookahead 0 the target of a 3-token call mostly
# samples alone, before any draft arrives, and the test would hardly see the rule at work
@pytest.mark.parametrize("strategy, k, lookahead", [("sd", 2, 2), ("pipespec", 2, 2), ("sd", 3, 2), ("pipespec", 3, 2)])
def test_pipeline_samples_the_target_distribution(pipes, target_joint, strategy, k, lookahead):
    counts, results = draw_sequences(pipes[k], strategy, lookahead, DRAWS)
    assert results[-1].lossless and results[-1].acceptance == "exact"
    assert results[-1].sampling == {**JOINT_SAMPLING.as_dict(), "seed": DRAWS - 1}
    offered, acceptance = target_checks(results)
    assert offered >= DRAWS and 0.1 < acceptance < 0.9  # both outcomes of the ratio test, often
    assert chi2_pvalue(counts, target_joint) > PASS_P, counts.most_common(8)


@pytest.mark.parametrize("strategy, k, lookahead", [("sd", 2, 2), ("pipespec", 3, 2)])
def test_a_wrong_rule_fails_the_same_test(pipes, target_joint, strategy, k, lookahead):
    wrong = {"stage": k - 1, "action": "accept_drafts"}  # the target keeps every draft unchecked
    counts, results = draw_sequences(pipes[k], strategy, lookahead, WRONG_DRAWS, fault=wrong)
    assert not results[-1].lossless
    offered, acceptance = target_checks(results)
    assert offered >= WRONG_DRAWS and acceptance == 1.0
    assert chi2_pvalue(counts, target_joint) < FAIL_P


def collision_z(target_path: str, prompts, outputs, sampling: Sampling) -> float:
    """z-score of sum_t p_t(x_t) against its expectation sum_t sum_x p_t(x)^2 (N(0, 1) when x_t ~ p_t)."""
    model = load_model(StageSpec(model=target_path))
    total = mean = var = 0.0
    for prompt, tokens in zip(prompts, outputs):
        with torch.inference_mode():
            logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : len(prompt) + len(tokens) - 1]
        probs = sampling_probs(logits, sampling)
        chosen = probs[torch.arange(len(tokens)), torch.tensor(tokens)]
        total += float(chosen.sum())
        second = (probs**2).sum(-1)
        mean += float(second.sum())
        var += float(((probs**3).sum(-1) - second**2).sum())
    return (total - mean) / var**0.5


@pytest.mark.parametrize("strategy, lookahead", [("sd", 3), ("pipespec", 0)])
def test_long_generations_with_rollbacks(pipes, tiny16, strategy, lookahead):
    """Deep pipelines (rollbacks at both verifiers, top-p) keep every distribution in place."""
    sampling = Sampling(1.0, top_p=0.95)
    prompts = [[int(t) for t in np.random.default_rng(i).integers(0, VOCAB, 6)] for i in range(6)]
    results = [
        pipes[3].generate(p, 40, strategy=strategy, lookahead=lookahead, temperature=1.0, top_p=0.95, seed=i)
        for i, p in enumerate(prompts)
    ]
    assert all(len(r.tokens) == 40 for r in results)
    assert sum(r.summary()[0]["rollbacks"] for r in results) > 0
    assert abs(collision_z(tiny16[-1], prompts, [r.tokens for r in results], sampling)) < 4.5


def test_a_seed_replays_sd_and_greedy(pipes):
    pipe = pipes[3]
    for strategy in ("sd", "greedy"):
        first = pipe.generate(PROMPT, 24, strategy=strategy, lookahead=3, temperature=1.0, seed=11).tokens
        assert pipe.generate(PROMPT, 24, strategy=strategy, lookahead=3, temperature=1.0, seed=11).tokens == first
        assert pipe.generate(PROMPT, 24, strategy=strategy, lookahead=3, temperature=1.0, seed=12).tokens != first
    fresh = pipe.generate(PROMPT, 24, strategy="sd", lookahead=3, temperature=1.0)  # a fresh seed, recorded
    replay = pipe.generate(PROMPT, 24, strategy="sd", lookahead=3, temperature=1.0, seed=fresh.sampling["seed"])
    assert replay.tokens == fresh.tokens


def test_temperature_zero_is_greedy_whatever_the_other_options(pipes, tiny16):
    runner = CausalLMRunner(load_model(StageSpec(model=tiny16[-1])))
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
def test_bad_sampling_options_are_clear_errors(tiny16, options, message):
    with pytest.raises(ConfigError, match=message):
        Pipeline(tiny16[1:], **options)
    pipe = Pipeline(tiny16[1:])
    with pytest.raises(ConfigError, match=message):
        pipe.generate(PROMPT, 3, **options)
    assert not pipe.started
