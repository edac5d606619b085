"""Acceptance along the target's greedy continuation, for a machine profile (`experiments.profiler`).

Per drafter/verifier pair, at every position of the continuation of each prompt, how many drafts in a row
the verifier keeps from there (`model_runs`, `teacher_forced`, `kept`; a model-free drafter's
`proposal_runs` and its token trees, `tree_runs`), and acceptance by draft position along the walk
decoding takes (`acceptance_by_position`). `measure_acceptance` gives a profile's `pairs` and
`skip_pairs`; `experiments.profiler` says how they are measured and read.
"""

from __future__ import annotations

from typing import Sequence

from analysis.profile import walk_counts
from pipespec.drafters import common_prefix
from pipespec.errors import ConfigError


# ---- acceptance by draft position -------------------------------------------------------------------


def greedy_continuation(runner, prompt: Sequence[int], tokens: int) -> list[int]:
    runner.start()
    sequence = list(prompt)
    for _ in range(tokens):
        sequence.append(int(runner.forward(sequence, []).argmax()))
    return sequence[len(prompt) :]


def teacher_forced(runner, prompt: Sequence[int], continuation: Sequence[int]) -> list[int]:
    """The runner's argmax after the prompt and the continuation's first j tokens, for every j: one pass of
    one-token steps over the continuation (teacher forcing). One-token steps, not one call over the whole
    continuation: int8 activations are quantized per call, and a long call changes the argmax
    (first-position acceptance 0.60 against 0.87 on four HumanEval problems). The int8 drafter's argmax
    also depends on how its cache was built: against the earlier walk (`draft_k` one-token drafts from
    each start, a few tokens a call on a rollback), int8 -> fp32 on HumanEval 0-9 gives 0.77 against
    0.84 at the first position; the held-out runs lie between (sd window 4: mean acceptance length 3.72
    measured, 3.43 and 3.96 predicted from the two)."""
    runner.start()
    sequence, found = list(prompt), []
    for token in continuation:
        found.append(int(runner.forward(sequence, []).argmax()))
        sequence.append(int(token))
    return found


def along(own: Sequence[int], continuation: Sequence[int], j: int) -> list[int]:
    """A model's tokens from position j of `continuation` while its context is that continuation: its
    teacher-forced argmax there (`own`), up to and including the first that leaves the continuation (its
    context differs after that one)."""
    tokens = []
    for position in range(j, len(continuation)):
        tokens.append(own[position])
        if own[position] != continuation[position]:
            break
    return tokens


def verifier_text(continuation: Sequence[int], verifier: Sequence[int] | None, j: int) -> Sequence[int]:
    """The verifier's tokens from position j of `continuation` (`along`; None: the verifier made the
    continuation, whose tokens are its own)."""
    return continuation[j:] if verifier is None else along(verifier, continuation, j)


def kept(proposal: Sequence[int], continuation: Sequence[int], verifier: Sequence[int] | None, j: int) -> int:
    """How many drafts of a proposal at position j its verifier keeps: the common prefix with the verifier's
    tokens there (`verifier_text`)."""
    return common_prefix(proposal, verifier_text(continuation, verifier, j))


def model_runs(runner, prompt: Sequence[int], continuation: Sequence[int],
               verifier: Sequence[int] | None = None) -> list[int]:  # fmt: skip
    """Per position j of `continuation`: how many greedy drafts in a row a model drafter gets kept from j.

    While its drafts follow the continuation, a drafter's draft at position j is its argmax after the
    prompt and the continuation's first j tokens (`teacher_forced`), instead of `draft_k` steps per start.
    `verifier`: the verifier's own teacher-forced tokens along the continuation, when another model (the
    target) made it (`kept`)."""
    return runs_along(teacher_forced(runner, prompt, continuation), continuation, verifier)


def runs_along(own: Sequence[int], continuation: Sequence[int], verifier: Sequence[int] | None) -> list[int]:
    """Per position of `continuation`: how many of a model drafter's drafts (its teacher-forced tokens `own`,
    followed while they follow the continuation) the verifier keeps there (`kept`)."""
    return [kept(along(own, continuation, j), continuation, verifier, j) for j in range(len(continuation))]


def proposal_runs(propose, prompt: Sequence[int], continuation: Sequence[int], k: int,
                  verifier: Sequence[int] | None = None) -> tuple[list[int], list[int]]:  # fmt: skip
    """A model-free drafter's proposal at every position j of `continuation` (`propose(sequence, k)`):
    how many of its tokens the verifier keeps from j (`kept`), and how many it proposed."""
    runs, proposed = [], []
    for j in range(len(continuation)):
        proposal = propose(list(prompt) + list(continuation[:j]), min(k, len(continuation) - j))
        runs.append(kept(proposal, continuation, verifier, j))
        proposed.append(len(proposal))
    return runs, proposed


TREE_SIZES = (4, 8, 16)  # the tree_nodes a model-free drafter's token trees are measured at (`tree_runs`)


def tree_runs(propose_tree, prompt: Sequence[int], continuation: Sequence[int], k: int, max_nodes: int,
              verifier: Sequence[int] | None = None) -> dict[str, list[int]]:  # fmt: skip
    """A model-free drafter's token tree at every position j of `continuation` (`propose_tree(sequence,
    max_nodes, depth)`, at most `k` deep): how deep its branch along the verifier's tokens goes (`runs`: the
    drafts a greedy tree verification keeps there: the verifier follows the child holding its own token;
    `kept`'s `verifier`), how many nodes the tree holds (`nodes`), how many tokens its most likely path holds
    (`paths`: what the drafter appends to its buffer, and proposes on from) and how many of them the verifier
    keeps (`path_runs`: what it keeps of them when it checks the drafter's chain instead of its tree)."""
    found: dict[str, list[int]] = {"runs": [], "nodes": [], "paths": [], "path_runs": []}
    for j in range(len(continuation)):
        tree = propose_tree(list(prompt) + list(continuation[:j]), max_nodes, min(k, len(continuation) - j))
        text = verifier_text(continuation, verifier, j)
        path = tree.path_tokens(tree.best_path())
        found["runs"].append(len(tree.follow(text)))
        found["nodes"].append(len(tree))
        found["paths"].append(len(path))
        found["path_runs"].append(common_prefix(path, text))  # `kept`, on the text read once
    return found


def measure_trees(drafter, ids: Sequence[Sequence[int]], continuation: Sequence[Sequence[int]], draft_k: int,
                  verifiers: Sequence[Sequence[int] | None] | None = None) -> list[dict]:  # fmt: skip
    """A pair's `tree_runs`: the model-free `drafter`'s trees (`tree_runs`) at every size of `TREE_SIZES`."""
    entries = []
    verifiers = verifiers or [None] * len(ids)
    for size in TREE_SIZES:
        found = [tree_runs(drafter.propose_tree, p, c, draft_k, size, v) for p, c, v in zip(ids, continuation, verifiers)]
        entries.append({"tree_nodes": size, **{key: [f[key] for f in found] for key in found[0]}})
    return entries


def acceptance_by_position(runs: Sequence[Sequence[int]], proposed: Sequence[Sequence[int]] | None,
                           draft_k: int) -> dict:  # fmt: skip
    """Acceptance by draft position along the decoding walk (`analysis.profile.walk_counts`: drafts start
    after the accepted prefix and the verifier's own token, or one token on when the drafter had nothing),
    from per-position runs (`model_runs`, `proposal_runs`; `proposed` None: a model drafter always drafts
    `draft_k`), pooled over the continuations: per position, drafts offered there (all earlier ones
    accepted) and accepted; how often the drafter proposed anything and the mean proposal length."""
    walks = [walk_counts(along, None if proposed is None else proposed[c], draft_k) for c, along in enumerate(runs)]
    offered = [sum(w.offered[p] for w in walks) for p in range(draft_k)]
    accepted = [sum(w.accepted[p] for w in walks) for p in range(draft_k)]
    starts, proposals = sum(w.starts for w in walks), sum(w.proposals for w in walks)
    lengths = sum(w.proposed_tokens for w in walks)
    rates = [a / o if o else None for a, o in zip(accepted, offered)]
    return {
        "acceptance_by_position": rates, "offered_by_position": offered, "accepted_by_position": accepted,
        "starts": starts, "proposal_rate": proposals / starts if starts else 0.0,
        "mean_proposal_length": lengths / proposals if proposals else 0.0,
    }  # fmt: skip


def measure_acceptance(stages: list[dict], drafters: Sequence, runners: dict, ids: Sequence[Sequence[int]],
                       continuation_tokens: int, draft_k: int, log=print) -> tuple[list[dict], list[dict]]:
    """The profile's `pairs` (adjacent) and `skip_pairs` (a drafter with a later verifier): each pair's runs
    along the target's greedy continuation of every prompt, and acceptance by position from them. In a
    pipeline every stage's output is rolled back to the target's, so a middle verifier keeps drafts while
    its own tokens, in the target's text, agree with them (its teacher-forced tokens along the target's
    continuation); along its own greedy continuation instead, prompt lookup -> int8 was kept 2.3x as long
    on news_lee (mean run 3.43 against 1.53 for the same drafter -> fp32): int8's text repeats the
    article more."""
    target = len(stages) - 1
    for v in range(1, len(stages)):
        if v not in runners:
            raise ConfigError(f"stage {v} ({stages[v]['name']}) verifies drafts: it must be a model")
    log(f"profile: {stages[target]['name']}: greedy continuations")
    continuation = [greedy_continuation(runners[target], p, continuation_tokens) for p in ids]
    tokens: dict[int, list] = {target: [None] * len(ids)}  # per stage, its tokens along them (None: its own)

    def along_target(stage: int) -> list:
        if stage not in tokens:
            log(f"profile: {stages[stage]['name']}: its tokens along them")
            tokens[stage] = [teacher_forced(runners[stage], p, c) for p, c in zip(ids, continuation)]
        return tokens[stage]

    pairs, skip_pairs = [], []
    for v in range(1, len(stages)):
        verifier = along_target(v)
        for d in range(v - 1, -1, -1):  # the adjacent drafter, then every earlier one (subsets skip stages)
            log(f"profile: acceptance {stages[d]['name']} -> {stages[v]['name']}")
            pair = {"drafter": stages[d]["name"], "verifier": stages[v]["name"], "drafter_index": d,
                    "verifier_index": v, **_pair_runs(drafters[d], along_target, d, ids, continuation, verifier,
                                                      draft_k)}  # fmt: skip
            (pairs if d == v - 1 else skip_pairs).append(pair)
    return pairs, skip_pairs


def _pair_runs(drafter, along_target, d: int, ids: Sequence[Sequence[int]], continuation: Sequence[Sequence[int]],
               verifier: Sequence, draft_k: int) -> dict:  # fmt: skip
    """One pair's runs, proposals, acceptance by position and (a model-free drafter's) token trees."""
    if drafter is None:  # a model: its drafts follow its own tokens along the continuation
        own = along_target(d)
        runs = [runs_along(o, c, w) for o, c, w in zip(own, continuation, verifier)]
        proposed = None
    else:
        found = [proposal_runs(drafter.propose, p, c, draft_k, w) for p, c, w in zip(ids, continuation, verifier)]
        runs, proposed = [r for r, _ in found], [n for _, n in found]
    entry = {**acceptance_by_position(runs, proposed, draft_k), "runs": runs, "proposed": proposed, "along": "target"}
    if drafter is not None:
        entry["tree_runs"] = measure_trees(drafter, ids, continuation, draft_k, verifier)
    return entry
