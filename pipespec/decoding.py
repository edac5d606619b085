"""Decoding primitives shared by every strategy, in one process and in the stage processes.

`model_step` is the only thing a model stage ever does: one forward pass over
its pending committed tokens plus the offered drafts, the shared verify rule
(`pipespec.verify.VerifyRule`), and a cache crop back to exactly the tokens
that stay committed. A plain decode step is a `model_step` with no drafts. `tree_step` is the same
over a model-free drafter's token tree (`pipespec.tree`): one pass over the pending tokens and
every node, the tree rule, and a cache that keeps exactly the accepted path.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

from pipespec.tree import DraftTree
from pipespec.models import CausalLMRunner
from pipespec.verify import TokenDist, VerifyRule


class Step(NamedTuple):
    accepted: int  # drafts kept
    token: int  # the stage's own next token
    fed: int  # tokens fed to the model
    probs: object  # torch.Tensor of accepted + 1 rows when sampling (what each emitted token follows), else None
    confidence: list[float] | None = None  # the stage's own probability of each emitted token, when asked for
    margins: list[float] | None = None  # top-2 logit margin of the row that decided each emitted token, when asked
    kept: list[int] | None = None  # a tree step: the tokens of the accepted path (a chain's are drafts[:accepted])


GREEDY_RULE = VerifyRule()


def model_step(
    runner: CausalLMRunner,
    sequence: Sequence[int],
    drafts: Sequence[int],
    draft_dists: Sequence[TokenDist] | None = None,
    rule: VerifyRule = GREEDY_RULE,
    with_confidence: bool = False,
    with_margins: bool = False,
) -> Step:
    """Verify `drafts` after `sequence` with `rule`.

    Afterwards the cache holds `sequence + drafts[:accepted]`; the own token is pending.
    `with_confidence`: also return the stage's own probability of each emitted token (the
    distribution it samples from, or the softmax of its logits when greedy).
    `with_margins`: also return, for each emitted token, the gap between the two largest logits
    of the row that decided it (how near a tie the argmax was: `analysis.rundir` classifies
    fp16 mismatches with it).
    """
    fed = len(sequence) - runner.cache_length + len(drafts)
    logits = runner.forward(sequence, drafts)
    verdict = rule.decide(drafts, draft_dists, logits)
    runner.truncate(len(sequence) + verdict.accepted)
    _check_cache(runner)
    emitted = list(drafts[: verdict.accepted]) + [verdict.token]
    confidence = own_confidence(emitted, verdict.probs, logits[: len(emitted)]) if with_confidence else None
    margins = top2_margins(logits[: verdict.accepted + 1]) if with_margins else None
    return Step(verdict.accepted, verdict.token, fed, verdict.probs, confidence, margins)


def tree_step(
    runner: CausalLMRunner,
    sequence: Sequence[int],
    tree: DraftTree,
    rule: VerifyRule = GREEDY_RULE,
    with_confidence: bool = False,
    with_margins: bool = False,
) -> Step:
    """Verify the token `tree` rooted after `sequence` with `rule` (`VerifyRule.decide_tree`), as `model_step`
    verifies a chain: afterwards the cache holds `sequence` + the accepted path; the own token is pending.
    `fed` counts the pending tokens and every node; `kept` holds the accepted path's tokens."""
    fed = len(sequence) - runner.cache_length + len(tree)
    logits = runner.forward_tree(sequence, tree)
    verdict = rule.decide_tree(tree, logits)
    runner.keep_path(verdict.path)
    _check_cache(runner)
    kept = tree.path_tokens(verdict.path)
    rows = logits[verdict.rows]  # the rows that decided each emitted token
    confidence = own_confidence(kept + [verdict.token], verdict.probs, rows) if with_confidence else None
    margins = top2_margins(rows) if with_margins else None
    return Step(verdict.accepted, verdict.token, fed, verdict.probs, confidence, margins, kept)


def _check_cache(runner: CausalLMRunner) -> None:
    if runner.cached_length() != runner.cache_length:  # cheap guard against off-by-one rollbacks
        raise RuntimeError(f"KV cache holds {runner.cached_length()} tokens, expected {runner.cache_length}")


def own_confidence(emitted: Sequence[int], probs, logits) -> list[float]:
    """The stage's own probability of each emitted token: the distribution it sampled from (`probs`), or
    the softmax of the logits row that decided it when greedy."""
    rows = probs if probs is not None else logits.float().softmax(-1)
    return [float(rows[i, token]) for i, token in enumerate(emitted)]


def top2_margins(logits) -> list[float]:
    """Largest minus second largest logit of each row (inf for a one-token vocabulary)."""
    if logits.shape[-1] < 2:
        return [float("inf")] * logits.shape[0]
    top = logits.topk(2, dim=-1).values
    return (top[:, 0] - top[:, 1]).tolist()


def is_finished(generated: Sequence[int], max_new_tokens: int, eos_ids: Sequence[int]) -> bool:
    return len(generated) >= max_new_tokens or any(t in eos_ids for t in generated)


def final_output(generated: Sequence[int], max_new_tokens: int, eos_ids: Sequence[int]) -> list[int]:
    """What greedy decoding would have returned: at most the budget, ending at the first EOS (kept)."""
    out = list(generated[:max_new_tokens])
    for i, token in enumerate(out):
        if token in eos_ids:
            return out[: i + 1]
    return out


def reference_generate(
    runner: CausalLMRunner,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    eos_ids: Sequence[int],
    rule: VerifyRule = GREEDY_RULE,
) -> list[int]:
    """Autoregressive decoding with a KV cache, in this process: greedy, or sampling with `rule` (the reference)."""
    runner.start()
    sequence = list(prompt_ids)
    generated: list[int] = []
    while not is_finished(generated, max_new_tokens, eos_ids):
        token = model_step(runner, sequence, [], rule=rule).token
        sequence.append(token)
        generated.append(token)
    return final_output(generated, max_new_tokens, eos_ids)


def greedy_generate(runner: CausalLMRunner, prompt_ids: Sequence[int], max_new_tokens: int, eos_ids: Sequence[int]):
    """Autoregressive greedy decoding with a KV cache, in this process (the reference)."""
    return reference_generate(runner, prompt_ids, max_new_tokens, eos_ids)
