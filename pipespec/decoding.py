"""Decoding primitives shared by every strategy, in one process and in the stage processes.

`model_step` is the only thing a model stage ever does: one forward pass over
its pending committed tokens plus the offered drafts, the shared verify rule,
and a cache crop back to exactly the tokens that stay committed. A plain
decode step is a `model_step` with no drafts.
"""

from __future__ import annotations

from typing import Sequence

from pipespec.models import CausalLMRunner
from pipespec.verify import greedy_verify


def model_step(runner: CausalLMRunner, sequence: Sequence[int], drafts: Sequence[int]) -> tuple[int, int, int]:
    """Verify `drafts` after `sequence`; return (drafts accepted, own next token, tokens fed).

    Afterwards the cache holds `sequence + drafts[:accepted]`; the own token is pending.
    """
    fed = len(sequence) - runner.cache_length + len(drafts)
    logits = runner.forward(sequence, drafts)
    accepted, own_token = greedy_verify(drafts, logits)
    runner.truncate(len(sequence) + accepted)
    if runner.cached_length() != runner.cache_length:  # cheap guard against off-by-one rollbacks
        raise RuntimeError(f"KV cache holds {runner.cached_length()} tokens, expected {runner.cache_length}")
    return accepted, own_token, fed


def is_finished(generated: Sequence[int], max_new_tokens: int, eos_ids: Sequence[int]) -> bool:
    return len(generated) >= max_new_tokens or any(t in eos_ids for t in generated)


def final_output(generated: Sequence[int], max_new_tokens: int, eos_ids: Sequence[int]) -> list[int]:
    """What greedy decoding would have returned: at most the budget, ending at the first EOS (kept)."""
    out = list(generated[:max_new_tokens])
    for i, token in enumerate(out):
        if token in eos_ids:
            return out[: i + 1]
    return out


def greedy_generate(runner: CausalLMRunner, prompt_ids: Sequence[int], max_new_tokens: int, eos_ids: Sequence[int]):
    """Autoregressive greedy decoding with a KV cache, in this process (the reference)."""
    runner.start()
    sequence = list(prompt_ids)
    generated: list[int] = []
    while not is_finished(generated, max_new_tokens, eos_ids):
        _, token, _ = model_step(runner, sequence, [])
        sequence.append(token)
        generated.append(token)
    return final_output(generated, max_new_tokens, eos_ids)
