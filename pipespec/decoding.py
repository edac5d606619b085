"""Decoding primitives shared by every strategy, in one process and in the stage processes.

`model_step` is the only thing a model stage ever does: one forward pass over
its pending committed tokens plus the offered drafts, the shared verify rule
(`pipespec.verify.VerifyRule`), and a cache crop back to exactly the tokens
that stay committed. A plain decode step is a `model_step` with no drafts.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

from pipespec.models import CausalLMRunner
from pipespec.verify import TokenDist, VerifyRule


class Step(NamedTuple):
    accepted: int  # drafts kept
    token: int  # the stage's own next token
    fed: int  # tokens fed to the model
    probs: object  # torch.Tensor of accepted + 1 rows when sampling (what each emitted token follows), else None
    confidence: list[float] | None = None  # the stage's own probability of each emitted token, when asked for
    margins: list[float] | None = None  # top-2 logit margin of the row that decided each emitted token, when asked


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
    if runner.cached_length() != runner.cache_length:  # cheap guard against off-by-one rollbacks
        raise RuntimeError(f"KV cache holds {runner.cached_length()} tokens, expected {runner.cache_length}")
    confidence = None
    if with_confidence:
        emitted = list(drafts[: verdict.accepted]) + [verdict.token]
        rows = verdict.probs if verdict.probs is not None else logits[: len(emitted)].float().softmax(-1)
        confidence = [float(rows[i, token]) for i, token in enumerate(emitted)]
    margins = top2_margins(logits[: verdict.accepted + 1]) if with_margins else None
    return Step(verdict.accepted, verdict.token, fed, verdict.probs, confidence, margins)


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
