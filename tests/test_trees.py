"""Token-tree verification for model-free drafters (pipespec.tree): the drafters' trees, the
model's one pass over a tree and its cache, the rule (greedy: identical to greedy decoding; sampling:
the target's distribution), the loop in sd and pipespec, the options refused, and the simulator and
predictor of tree configurations."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from analysis import predict as pr
from analysis import profile as pf
from analysis import simulate as sim
from pipespec.drafters import PromptLookup, SuffixDrafter
from pipespec.tree import DraftTree
from pipespec.errors import ConfigError
from pipespec.faults import FaultPlan
from pipespec.schedule import tree_size
from pipespec.specs import StageSpec
from pipespec.verify import Sampling, VerifyRule, sampling_probs

pytestmark = pytest.mark.usefixtures("one_thread")

GREEDY_TINY = {"noise": [0.05]}  # experiments.tiny options: a 256-token vocabulary, EOS 1
MAX_NEW = 16

# ---- the tree and the drafters' trees ---------------------------------------------------------------


def test_a_tree_is_depth_first_most_likely_child_first():
    tree = DraftTree.build([5, 6, 7, 8, 9], [-1, -1, 0, 0, 1], [0.3, 0.6, 0.1, 0.2, 0.5])
    assert tree.tokens == (6, 9, 5, 8, 7) and tree.parents == (-1, 0, -1, 2, 2)
    assert tree.best_path() == [0, 1] and tree.depth == 2 and tree.depths() == (1, 2, 1, 2, 2)
    assert tree.follow([5, 7, 1]) == [2, 4] and tree.ancestors(4) == [2, 4]
    assert tree.pruned(max_nodes=3).tokens == (6, 9, 5)  # the 3 likeliest: 0.6, 0.5, 0.3
    assert tree.pruned(max_depth=1).tokens == (6, 5)
    assert tree.pruned(stop_tokens={6}).tokens == (6, 5, 8, 7)  # nothing below an EOS
    below = tree.subtree([5])
    assert below.tokens == (8, 7) and below.probs == pytest.approx((2 / 3, 1 / 3)) and tree.subtree([4]) is None
    grafted = tree.graft(1, DraftTree.chain([1, 2], [0.5, 0.25]))
    assert grafted.path_tokens(grafted.best_path()) == [6, 9, 1, 2] and grafted.probs[3] == pytest.approx(0.125)
    assert DraftTree.from_paths([[1, 2, 3], [1, 4], [5]]).probs == pytest.approx((2 / 3, 1 / 3, 1 / 3, 1 / 3, 1 / 3))
    with pytest.raises(ValueError, match="parent must precede"):
        DraftTree((1, 2), (1, -1), (1.0, 1.0))


def _suffix_with_branches(depth: int = 8) -> SuffixDrafter:
    drafter = SuffixDrafter(max_proposal=8, max_depth=depth)
    for tail in ([20, 21, 22], [20, 21, 22], [20, 30, 31], [40, 41]):
        drafter.observe_output([1, 2], [3, 4] + tail)
    return drafter


def test_the_suffix_tree_grows_best_first_and_its_best_path_is_the_chain():
    drafter = _suffix_with_branches()
    chain = drafter.propose([9, 3, 4], 8)
    tree = drafter.propose_tree([9, 3, 4], 16)
    assert tree.path_tokens(tree.best_path()) == chain == [20, 21, 22]
    # 20 in 3 of 4 occurrences, 40 in 1; after 20: 21 in 2 of 3, 30 in 1
    assert dict(zip(tree.tokens, tree.probs)) == pytest.approx({20: 0.75, 21: 0.5, 22: 0.5, 30: 0.25, 31: 0.25,
                                                                 40: 0.25, 41: 0.25})  # fmt: skip
    small = drafter.propose_tree([9, 3, 4], 4)  # 40 and 30 both 0.25: the shallower first
    assert small.tokens == (20, 21, 22, 40) and drafter.propose_tree([9, 3, 4], 8, max_depth=1).tokens == (20, 40)
    assert _suffix_with_branches().propose_tree([7, 8], 8) == DraftTree()  # nothing matches
    strict = SuffixDrafter(confidence=0.4)
    for tail in ([20, 21, 22], [20, 21, 22], [20, 30, 31], [40, 41]):
        strict.observe_output([1, 2], [3, 4] + tail)
    assert strict.propose_tree([9, 3, 4], 16).tokens == (20, 21, 22)  # below 0.4: pruned as the chain stops


def test_prompt_lookup_merges_earlier_matches_into_a_trie():
    sequence = [1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 6, 1, 2]
    lookup = PromptLookup(ngram_size=2, max_proposal=3)
    tree = lookup.propose_tree(sequence, 16)
    assert lookup.last_match == 2
    assert sorted(tree.path_tokens(tree.ancestors(i)) for i in range(len(tree)) if not tree.children()[i + 1]) == [
        [3, 4, 1], [3, 5, 1], [6, 1, 2]]  # fmt: skip
    assert tree.path_tokens(tree.best_path())[0] == 3 and tree.probs[0] == pytest.approx(2 / 3)
    assert len(lookup.propose_tree(sequence, 4)) == 4


# ---- the model: one pass over a tree, and the cache after it ----------------------------------------------


@pytest.fixture(scope="module")
def greedy_models(tiny_models):
    return tiny_models(**GREEDY_TINY)


@pytest.fixture(scope="module")
def target_runner(greedy_models):
    from pipespec.models import CausalLMRunner, load_model

    return CausalLMRunner(load_model(StageSpec(model=greedy_models[-1])))


def test_forward_tree_equals_the_chain_along_every_path_and_keep_path_leaves_prefix_and_path(target_runner):
    from pipespec.models import CausalLMRunner

    runner, fresh = target_runner, CausalLMRunner(target_runner.model)
    sequence = [3, 5, 7, 9, 11, 13]
    tree = DraftTree.build([20, 21, 22, 30, 31, 40, 41], [-1, 0, 1, 0, 3, -1, 5], [.5, .4, .3, .3, .2, .2, .1])
    for path in (tree.ancestors(4), [5], []):
        runner.start()
        runner.forward(sequence[:4], [])  # the first 4 tokens cached: two pending
        runner.truncate(4)
        logits = runner.forward_tree(sequence, tree)
        assert logits.shape[0] == len(tree) + 1 and runner.cache_length == len(sequence) + len(tree)
        for leaf in range(len(tree)):
            along = tree.ancestors(leaf)
            fresh.start()
            chain = fresh.forward(sequence, tree.path_tokens(along))
            torch.testing.assert_close(logits[[0] + [n + 1 for n in along]], chain, rtol=1e-4, atol=1e-4)
        runner.keep_path(path)
        assert runner.cache_length == runner.cached_length() == len(sequence) + len(path)
        kept = sequence + tree.path_tokens(path)
        following = runner.forward(kept + [50], [60, 61])
        fresh.start()
        torch.testing.assert_close(following, fresh.forward(kept + [50], [60, 61]), rtol=1e-4, atol=1e-4)


def test_the_greedy_tree_rule_follows_the_argmax_and_a_tree_step_decodes_greedily(target_runner):
    from pipespec.decoding import greedy_generate, tree_step

    prompt = [3, 5, 7, 9]
    expected = greedy_generate(target_runner, prompt, 6, [])
    # the greedy continuation hidden on the second branch, a wrong token on the first
    tree = DraftTree.build([expected[0], 99, expected[0] + 1, expected[1], expected[2]], [-1, 0, -1, 0, 3],
                           [0.6, 0.5, 0.4, 0.3, 0.2])  # fmt: skip
    target_runner.start()
    step = tree_step(target_runner, prompt, tree, VerifyRule())
    assert step.kept == expected[:3] and step.token == expected[3] and step.fed == len(prompt) + len(tree)
    assert target_runner.cache_length == len(prompt) + 3
    step = tree_step(target_runner, prompt + expected[:4], DraftTree.chain([expected[4] + 1]), VerifyRule())
    assert step.kept == [] and step.token == expected[4]


def test_the_sampling_tree_rule_emits_draws_from_p_and_the_wrong_rule_does_not():
    """Every emitted token is p's draw at its row: the first token after the root follows p exactly whatever
    the tree; following the likeliest child without drawing (the wrong rule) does not."""
    generator = torch.Generator().manual_seed(3)
    sampling = Sampling(1.0, top_k=6)
    logits = torch.randn(5, 8, generator=generator) * 1.5
    p = sampling_probs(logits, sampling)[0]
    tree = DraftTree.build([int(p.argmin()), int(p.argmax()), 2, 3], [-1, -1, 0, 1], [0.5, 0.4, 0.3, 0.2])
    expected = {t: float(p[t]) for t in range(8) if p[t] > 0}

    def first_tokens(check: bool, draws: int) -> dict:
        rule = VerifyRule(sampling, check_drafts=check)
        counts = {}
        for _ in range(draws):
            verdict = rule.decide_tree(tree, logits)
            first = tree.tokens[verdict.path[0]] if verdict.path else verdict.token
            counts[first] = counts.get(first, 0) + 1
            assert verdict.probs.shape[0] == len(verdict.path) + 1
        return counts

    from test_sampling import FAIL_P, PASS_P, chi2_pvalue

    assert chi2_pvalue(first_tokens(True, 20000), expected) > PASS_P
    assert chi2_pvalue(first_tokens(False, 3000), expected) < FAIL_P


def test_tree_size_verifies_what_pays_for_its_cost():
    slow = (0.072, 0.084, 0.098, 0.105, 0.112, 0.118, 0.124, 0.130)  # t(n) ms / 1000, n = 1..8
    assert tree_size([0.9, 0.8, 0.7, 0.6], slow) == 4
    assert tree_size([0.9, 0.02, 0.01], slow) == 1  # unlikely nodes cost more than they return
    assert tree_size([0.01], (0.07, 0.14)) == 0  # a one-token step


# ---- the loop: greedy identity in sd and pipespec ------------------------------------------------------


def repetitive_prompts(count: int = 12, seed: int = 0) -> list[list[int]]:
    """Prompts with one shared ending: on a second pass the suffix index holds each one's earlier output,
    all after the same 8 tokens, so the first proposal has `count` continuations to choose from."""
    rng = np.random.default_rng(seed)
    ending = [int(t) for t in rng.integers(2, 256, 8)]
    return [[int(t) for t in rng.integers(2, 256, 3)] + ending for _ in range(count)]


@pytest.fixture(scope="module")
def greedy_reference(target_runner):
    from pipespec.decoding import greedy_generate

    prompts = repetitive_prompts()
    return prompts, [greedy_generate(target_runner, p, MAX_NEW, [1]) for p in prompts]


def tokens_per_verification(results) -> float:
    """Tokens the suffix stage's verifier produced per step that had drafts or none (its every model step)."""
    produced = steps = 0
    for result in results:
        rows = result.stage_traces[1].steps
        steps += len(rows["kind"])
        produced += sum(rows["produced"])
    return produced / steps


def run_twice(pipe, prompts, reference, **options) -> list:
    """Each prompt, then each again in reverse order (so the one asked has its earlier output indexed once,
    as most others do); every output checked against greedy. The second pass's results."""
    results = []
    for order in (range(len(prompts)), reversed(range(len(prompts)))):
        for i in order:
            result = pipe.generate(prompts[i], MAX_NEW, **options)
            assert result.tokens == reference[i], (i, options)
            results.append(result)
    return results[len(prompts):]


CASES = [("sd", 2, 3, "suffix"), ("sd", 2, 24, "suffix"), ("pipespec", 2, 24, "suffix"), ("pipespec", 3, 8, "suffix"),
         ("sd", 3, 8, "prompt_lookup")]  # fmt: skip


@pytest.mark.parametrize("strategy, k, nodes, kind", CASES, ids=[f"{c[0]}-k{c[1]}-{c[3]}{c[2]}" for c in CASES])
def test_trees_decode_exactly_greedy(greedy_models, greedy_reference, strategy, k, nodes, kind):
    from pipespec.api import Pipeline

    prompts, reference = greedy_reference
    stages = [{"kind": kind, "tree_nodes": nodes, "name": kind}] + list(greedy_models[-(k - 1):])
    with Pipeline(stages, strategy=strategy, lookahead=4) as pipe:
        second = run_twice(pipe, prompts, reference)
        if (strategy, nodes) == ("sd", 24):
            run_twice(pipe, prompts[:4], reference[:4], size_verification=True)
    steps = [r.stage_traces[1].steps for r in second]
    assert sum(o > 0 for s in steps for o in s["offered"]) > len(prompts)  # the drafter's trees were verified
    if kind == "suffix":  # the earlier outputs' continuations: branches, so more nodes fed than a path holds
        assert any(f > 1 + o for s in steps for f, o in zip(s["fed"], s["offered"]))


def test_a_tree_yields_more_tokens_per_verification_than_the_chain(greedy_models, greedy_reference):
    """On the repetitive prompts (sd: deterministic) the tree's first verification finds each output's
    continuation among the earlier ones; the chain has only the most recent."""
    from pipespec.api import Pipeline

    prompts, reference = greedy_reference
    rates = {}
    for nodes in (0, 24):
        with Pipeline([{"kind": "suffix", "tree_nodes": nodes}, greedy_models[-1]], strategy="sd", lookahead=6) as pipe:
            rates[nodes] = tokens_per_verification(run_twice(pipe, prompts, reference))
    assert rates[24] > rates[0], rates


# ---- the loop: sampling follows the target ----------------------------------------------------------------


def tree_samples(tiny_models, strategy: str, lookahead: int, calls: int, faults=None):
    from test_sampling import TINY as SAMPLED
    from test_sampling import TOP_K, draw_outputs

    from pipespec.api import Pipeline

    models = tiny_models(**SAMPLED)
    with Pipeline([{"kind": "suffix", "tree_nodes": 8, "max_proposal": 4}, models[-1]], strategy=strategy) as pipe:
        return models, draw_outputs(pipe, strategy, lookahead, TOP_K, calls, faults=faults)


@pytest.mark.slow  # a statistical test over thousands of pipeline tokens
@pytest.mark.parametrize("strategy, lookahead", [("sd", 4), ("pipespec", 2)])
def test_sampled_trees_follow_the_target_distribution(tiny_models, strategy, lookahead):
    """The project's distribution test (tests/test_sampling.py): every token against the target's exact
    conditional, with its asserted power."""
    from test_sampling import CALLS, LENGTH, MIN_POWER, PASS_P, SHIFT, TOP_K, calibration_test, target_conditionals

    from pipespec.models import load_model

    calls = CALLS
    models, results = tree_samples(tiny_models, strategy, lookahead, calls)
    assert all(len(r.tokens) == LENGTH for r in results) and results[-1].lossless
    steps = [r.stage_traces[1].steps for r in results]
    assert sum(f > 1 + o for s in steps for f, o in zip(s["fed"], s["offered"])) > calls  # trees with branches
    check = calibration_test(*target_conditionals(load_model(StageSpec(model=models[-1])), results, TOP_K))
    assert check.power >= MIN_POWER, f"{check.positions} positions catch a {SHIFT:.0%} shift with power {check.power:.2f}"
    assert check.pvalue > PASS_P, check


@pytest.mark.slow  # a statistical test over thousands of draws
def test_a_wrong_tree_rule_fails_the_same_test(tiny_models):
    """The verifier follows the likeliest child without drawing (the fault "accept_drafts")."""
    from test_sampling import PASS_P, TOP_K, calibration_test, target_conditionals

    from pipespec.models import load_model

    models, results = tree_samples(tiny_models, "sd", 4, 40, faults=FaultPlan(stage=1, action="accept_drafts"))
    assert not results[-1].lossless
    assert calibration_test(*target_conditionals(load_model(StageSpec(model=models[-1])), results, TOP_K)).pvalue < PASS_P


# ---- options refused -------------------------------------------------------------------------------------


def test_bad_tree_options_are_config_errors(greedy_models):
    from pipespec.api import Pipeline

    target = greedy_models[-1]
    with pytest.raises(ConfigError, match="'tree_nodes' is for model-free stages"):
        StageSpec.from_any({"model": target, "tree_nodes": 4})
    with pytest.raises(ConfigError, match="'tree_nodes' must be an integer >= 0"):
        StageSpec.from_any({"kind": "suffix", "tree_nodes": -1})
    with pytest.raises(ConfigError, match="tree_nodes.*synthetic"):
        Pipeline([{"kind": "suffix", "tree_nodes": 4}, target], acceptance="synthetic", synthetic_rates=0.5)
    with pytest.raises(ConfigError, match="tree_nodes.*cascade"):
        Pipeline([{"kind": "suffix", "tree_nodes": 4}] + list(greedy_models), cascade=True)
    with pytest.raises(ConfigError, match="does not fit the target's context"):
        Pipeline([{"kind": "prompt_lookup", "tree_nodes": 100_000}, target])
    from pipespec.options import CallOptions

    with pytest.raises(ConfigError, match="'tree_nodes' is for model-free stages"):  # a spec built unchecked
        CallOptions(strategy="sd").plan(["hf", "hf"], ["draft", "target"], [4, 0])
    pipe = Pipeline([{"kind": "suffix", "tree_nodes": 4}, target])  # a call's own options are checked too
    with pytest.raises(ConfigError, match="tree_nodes.*synthetic"):
        pipe.generate([3, 4], 4, acceptance="synthetic", synthetic_rates=0.5)
    assert not pipe.started


# ---- simulator and predictor ------------------------------------------------------------------------------


T_N = [0.072, 0.084, 0.091, 0.098, 0.102, 0.105, 0.109, 0.112, 0.115, 0.118, 0.121, 0.124, 0.127, 0.130, 0.133,
       0.136, 0.139]  # fmt: skip  # t(n), n = 1..17: a slowly growing verification cost


def test_the_simulator_prices_a_tree_by_its_nodes():
    runs = ((3, 0, 2, 1, 0, 4, 2, 1) * 8,)
    nodes = ((8,) * 64,)
    costs = [sim.StageCost(1e-6), sim.TableCost(tuple(T_N))]
    chain = sim.simulate_sync_sd(costs, [sim.AlongContinuations(runs, (0.5,))], 4, 64, supply=[1.0, None],
                                 end_at_budget=True)  # fmt: skip
    tree = sim.simulate_sync_sd(costs, [sim.TreeContinuations(runs, (0.5,), nodes)], 4, 64, supply=[1.0, None],
                                end_at_budget=True)  # fmt: skip
    assert tree.accepted_counts == chain.accepted_counts and tree.target_steps == chain.target_steps
    # each verification feeds 1 + 8 nodes instead of 1 + its offered drafts (4, fewer at the budget's end);
    # the first has no pending token (the simulator does not model the prefill)
    offered = tree.offered_counts[0]
    extra = T_N[7] - T_N[offered[0] - 1] + sum(T_N[8] - T_N[o] for o in offered[1:])
    assert tree.offered_counts == chain.offered_counts and max(tree.offered_counts[0]) == 4
    assert tree.total_time - chain.total_time == pytest.approx(extra, rel=1e-6)
    with pytest.raises(ValueError, match="nodes"):
        sim.TreeContinuations(runs, (0.5,), ((1,) * 64,))


def test_a_verifier_off_its_drafter_s_tree_root_checks_the_chain_path_by_path():
    """The drafter appends its tree's most likely path (`proposed`) and, its lead allowing, proposes on from
    the path's end. A verifier whose buffer ends at the drafter's tree root verifies the tree: it keeps the
    branch along the text and feeds the tree's nodes, and those of the trees grafted below its path that
    fit the message's nodes (`budget`), read on where the path above was kept whole. One whose commit has
    not reached the drafter yet (a pipeline's handoff) checks the chain the drafter holds (`pipespec.stage`):
    each path kept as far as `path_runs` says, on into the next proposal where a path was kept whole."""
    runs, nodes = (2, 1, 1, 3, 1, 0, 0, 0), (4, 4, 4, 4, 4, 3, 0, 0)
    paths, kept = (2, 2, 1, 3, 2, 1, 0, 0), (2, 1, 1, 1, 1, 0, 0, 0)  # at 3 another branch than the path
    trees = sim.TreeContinuations([runs], (0.5,), [nodes], proposed=[paths], path_runs=[kept])
    sampler = trees.sampler(np.random.default_rng(0))
    assert [sampler.tree_span(6, 0), sampler.verify_tree(2, 0), sampler.verify_tree(3, 3)] == [(2, 4), 2, 3]
    grafts = replace(trees, budget=8).sampler(np.random.default_rng(0))  # two trees of 4 nodes fit a message
    assert [grafts.tree_span(6, 0), grafts.verify_tree(3, 0), grafts.tree_span(6, 3)] == [(3, 8), 3, (3, 4)]
    assert [sampler.verify(6, 0), sampler.verify(2, 0), sampler.verify(6, 1), sampler.verify(6, 3)] == [4, 2, 1, 1]
    costs = [sim.StageCost(1e-6), sim.TableCost(tuple(T_N))]
    # at the root: 2 kept + own token; then, the commit on its way to the drafter, the chain from 3: 1 + own
    late = sim.simulate_pipespec(costs, [trees], 8, lookahead=1, max_lead=8, supply=[1.0, None], end_at_budget=True,
                                 rollback_delay=0.001)  # fmt: skip
    assert late.offered_counts[0][:2] == (2, 3) and late.accepted_counts[0][:2] == (3, 2)
    at_once = sim.simulate_pipespec(costs, [trees], 8, lookahead=1, max_lead=8, supply=[1.0, None],
                                    end_at_budget=True)  # fmt: skip
    sd = sim.simulate_sync_sd(costs, [trees], 8, 8, supply=[1.0, None], end_at_budget=True)
    assert at_once.accepted_counts[0][:2] == sd.accepted_counts[0][:2] == (3, 4)  # the tree at 3: its branch
    with pytest.raises(ValueError, match="path_runs"):
        sim.TreeContinuations([runs], (0.5,), [nodes], proposed=[paths], path_runs=[(3,) * 8])


def _tree_profile(tree_runs: bool = True, costs=T_N) -> dict:
    """A profile of suffix -> target (a short suffix match: its longest match has several continuations)
    along a continuation that goes one of three ways at random after each "7 8 9", measured with the
    profiling code: the chain finds one way, a large enough tree all three."""
    from experiments.profiler_acceptance import acceptance_by_position, measure_trees, proposal_runs

    prompt = [1, 2, 3] + [7, 8, 9, 10] + [3] + [7, 8, 9, 11] + [3] + [7, 8, 9, 12] + [3]
    branches = np.random.default_rng(0).integers(10, 13, 13)  # which of three ways each block goes: no pattern
    continuation = [t for b in branches for t in (7, 8, 9, int(b), 3)]
    chain = proposal_runs(SuffixDrafter(max_proposal=8, max_depth=3).propose, prompt, continuation, 8)
    pair = {"drafter": "suffix", "verifier": "target", **acceptance_by_position([chain[0]], [chain[1]], 8),
            "runs": [chain[0]], "proposed": [chain[1]]}  # fmt: skip
    if tree_runs:
        pair["tree_runs"] = measure_trees(SuffixDrafter(max_proposal=8, max_depth=3), [prompt], [continuation], 8)
    stages = [{"name": "suffix", "kind": "suffix", "model": None, "quantize": None, "dtype": "float32", "threads": 1,
               "kernels": None, "vocab_limit": None},
              {"name": "target", "kind": "hf", "step_s_alone": costs, "step_s_loaded": costs, "prefill_s_per_token": 0.001,
               "quantize": None, "dtype": "float32", "threads": 1, "kernels": "torch", "vocab_limit": 0}]  # fmt: skip
    return {"format": pf.FORMAT, "version": pf.VERSION, "hierarchy": {"name": "trees"}, "machine": {},
            "sample_ids": ["p0"], "prompt_tokens": [len(prompt)], "stages": stages, "pairs": [pair],
            "handoff_s": 0.0005}  # fmt: skip


def test_a_tree_configuration_is_predicted_from_a_profile_with_tree_runs(tmp_path):
    import json

    from experiments.auto import choose_from_profile

    profile = pf.parse_profile(_tree_profile())
    measured = profile.pairs[0].tree(8)
    assert [t.tree_nodes for t in profile.pairs[0].tree_runs] == [4, 8, 16] and max(measured.nodes[0]) <= 8
    chain = pr.predict_profile(profile, "pipespec", 0, 8, tokens=64)
    tree = pr.predict_profile(profile, "pipespec", 0, 8, tokens=64, tree_nodes=16)
    assert tree.tree_nodes == 16 and tree.mean_acceptance_length > chain.mean_acceptance_length
    assert "tree_nodes 16" in pr.format_prediction(tree) and "tree_nodes" not in pr.prediction_record(chain)
    assert pr.prediction_record(tree)["tree_nodes"] == 16
    ranked, _ = pr.sweep(profile, tokens=32)
    assert {p.tree_nodes for p in ranked} == {0, 4, 8, 16}
    flat = _tree_profile(costs=[T_N[0]] * len(T_N))  # nodes cost nothing, and the chain takes the branch the
    pair = flat["pairs"][0]  # text does not: the tree's other branches win
    pair.update(runs=[[0] * len(pair["runs"][0])], acceptance_by_position=[0.0] * 8)
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(flat))
    specs = [StageSpec(kind="suffix"), StageSpec(model="target", kernels="torch")]  # as the profile recorded them
    choice = choose_from_profile(path, specs)
    assert choice.tree_nodes > 0 and choice.record()["chosen"]["tree_nodes"] == choice.tree_nodes
    assert [s.tree_nodes for s in choice.specs(specs)] == [choice.tree_nodes, 0]


def test_a_tree_deeper_than_its_drafter_s_chain_is_predicted_with_its_whole_branch():
    """Prompt lookup's tree merges several earlier matches: along the continuation its branch can go deeper
    than the one chain the drafter proposes there. The drafter then offers that branch (`tree_proposals`), and
    the deeper branches are kept: more tokens per verification than the same trees capped at the chain."""
    assert pr.tree_proposals(((0, 2, 1, 0),), ((1, 1, 3, 0),)) == ((1, 2, 3, 0),)
    assert pr.tree_proposals((), ((1, 2),)) == ()
    raw = _tree_profile()
    pair = raw["pairs"][0]
    shallow = pr.predict_profile(pf.parse_profile(raw), "sd", 8, tokens=64, tree_nodes=8)
    chain = pair["proposed"][0]
    for entry in pair["tree_runs"]:  # one token deeper than the chain wherever the tree holds it
        entry["runs"] = [[max(r, min(p + 1, n)) for r, p, n in zip(entry["runs"][0], chain, entry["nodes"][0])]]
    assert any(r > p for r, p in zip(pair["tree_runs"][1]["runs"][0], chain))
    deeper = pr.predict_profile(pf.parse_profile(raw), "sd", 8, tokens=64, tree_nodes=8)
    assert deeper.mean_acceptance_length > shallow.mean_acceptance_length


def test_a_profile_measures_each_tree_s_most_likely_path_and_how_much_of_it_is_kept():
    """`measure_trees` records, per position, the tree's most likely path (what the drafter appends) and how
    much of it the verifier keeps. On a text that repeats its prompt every path is kept whole, so with a lead
    cap above a tree's depth the chain a pipeline's verifier checks off the tree's root reaches into the
    drafter's next proposals: longer verifications at max_lead 16 than at 4. The reader refuses paths
    without their kept counts, or kept counts above them."""
    from experiments.profiler_acceptance import acceptance_by_position, measure_trees, proposal_runs

    raw = _tree_profile()
    for entry in raw["pairs"][0]["tree_runs"]:
        for runs, nodes, paths, kept in zip(entry["runs"], entry["nodes"], entry["paths"], entry["path_runs"]):
            assert all(k <= p <= n and k <= r for r, n, p, k in zip(runs, nodes, paths, kept))
            assert any(k < r for r, k in zip(runs, kept))  # another branch is the one along the continuation
    text = list(range(20, 80))
    pair = raw["pairs"][0]
    pair["tree_runs"] = measure_trees(SuffixDrafter(max_proposal=8, max_depth=3), [text], [text], 8)
    chain = proposal_runs(SuffixDrafter(max_proposal=8, max_depth=3).propose, text, text, 8)
    pair.update(runs=[chain[0]], proposed=[chain[1]], **acceptance_by_position([chain[0]], [chain[1]], 8))
    four = pair["tree_runs"][0]
    assert four["tree_nodes"] == 4 and four["path_runs"] == four["paths"] and max(four["paths"][0]) == 4
    lengths = [pr.predict_profile(pf.parse_profile(raw), "pipespec", 1, m, tokens=48, tree_nodes=4)
               .mean_acceptance_length for m in (4, 16)]  # fmt: skip
    assert lengths[1] > lengths[0] + 1
    bad = _tree_profile()
    del bad["pairs"][0]["tree_runs"][0]["path_runs"]
    with pytest.raises(pf.ProfileError, match="paths and path_runs together"):
        pf.parse_profile(bad)
    bad = _tree_profile()
    entry = bad["pairs"][0]["tree_runs"][0]
    entry["path_runs"][0][0] = entry["paths"][0][0] + 1
    with pytest.raises(pf.ProfileError, match="path_run <= path"):
        pf.parse_profile(bad)


def test_profiles_without_tree_runs_stay_readable_and_refuse_tree_predictions():
    profile = pf.parse_profile(_tree_profile(tree_runs=False))
    assert profile.pairs[0].tree_runs == ()
    ranked, _ = pr.sweep(profile, tokens=16)
    assert {p.tree_nodes for p in ranked} == {0}
    with pytest.raises(ConfigError, match="no token trees of 8 nodes"):
        pr.predict_profile(profile, "sd", 4, tokens=16, tree_nodes=8)
    bad = _tree_profile()
    bad["pairs"][0]["tree_runs"][0]["nodes"][0][0] = -1
    with pytest.raises(pf.ProfileError, match="tree_runs"):
        pf.parse_profile(bad)
