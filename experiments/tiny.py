"""Tiny random LLaMA hierarchies for tests and quick experiments.

The target is a small random LLaMA; each draft is the target's weights plus
Gaussian noise of a chosen relative size, so agreement with the target goes
from high (small noise) to low (large noise). All share one word-level
tokenizer saved beside each model, so they pass the shared-vocabulary check.
A small `vocab_size` (e.g. 16) and `eos_token_id=None` (no EOS: every output
has the full budget) make the target's sequence distribution small enough to
compute exactly, for statistical tests of sampling.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

VOCAB_SIZE = 256


def make_tokenizer(vocab_size: int = VOCAB_SIZE):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(vocab_size)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="t0", eos_token="t1")


def tiny_config(vocab_size: int = VOCAB_SIZE, eos_token_id: int | None = 1, num_layers: int = 2):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=0.3,  # large weights give peaked logits: no near-ties in argmax
        eos_token_id=eos_token_id,
        bos_token_id=None,
        pad_token_id=None,
        tie_word_embeddings=False,
    )


def build_tiny_hierarchy(
    directory: str | Path,
    draft_noise: Sequence[float],
    seed: int = 0,
    eos_token_id: int | None = 1,
    vocab_size: int = VOCAB_SIZE,
    num_layers: int = 2,
    flat_logits: float | None = None,
) -> list[str]:
    """Save drafts (noise levels, in order) then the target; return their paths, smallest... target last.

    `num_layers` 1 makes a step about 40% cheaper (transformers' per-layer overhead dominates
    at this size): statistical tests that need many thousands of tokens use it.
    `flat_logits` s (None: off) rebuilds the target's output layer before the drafts copy it:
    every row becomes one shared row plus s times its own, so all logits sit near one common
    value of ordinary size and differ by s of their usual spread: near-ties at every step
    (`build_flat_hierarchy`)."""
    import torch
    from transformers import GenerationConfig, LlamaForCausalLM

    directory = Path(directory)
    torch.manual_seed(seed)
    config = tiny_config(vocab_size, eos_token_id, num_layers)
    target = LlamaForCausalLM(config).eval()
    if flat_logits is not None:
        with torch.no_grad():
            weight = target.lm_head.weight
            weight.copy_(FLAT_SHARED_GAIN * weight[0] + flat_logits * weight)
    tokenizer = make_tokenizer(vocab_size)
    paths = []
    for i, noise in enumerate(list(draft_noise) + [None]):
        model = target
        if noise is not None:
            model = LlamaForCausalLM(config).eval()
            generator = torch.Generator().manual_seed(seed * 1000 + i + 1)
            with torch.no_grad():
                for (name, p), (_, q) in zip(model.named_parameters(), target.named_parameters()):
                    p.copy_(q + noise * q.std() * torch.randn(q.shape, generator=generator))
        path = directory / ("target" if noise is None else f"draft{i}_noise{noise}")
        model.save_pretrained(path)
        GenerationConfig(eos_token_id=eos_token_id).save_pretrained(path)
        tokenizer.save_pretrained(path)
        paths.append(str(path))
    return paths


FLAT_LOGITS = 1e-3  # own part of each output row: top-2 margins ~1e-3, below a float16 ulp at |logit| ~ 10
FLAT_SHARED_GAIN = 4.0  # the shared row: logits of a few units to tens, where a float16 ulp is 2^-7..2^-6


def build_flat_hierarchy(
    directory: str | Path, draft_noise: Sequence[float] = (0.05,), seed: int = 0, flat_logits: float = FLAT_LOGITS
) -> list[str]:
    """A tiny hierarchy whose target has deliberately flat logits: its argmax is decided by margins
    smaller than a half-precision rounding, so float16 / bfloat16 runs flip tokens against float32
    (or against another kernel): near-ties, for the identity classification's tests. No EOS."""
    return build_tiny_hierarchy(directory, draft_noise, seed=seed, eos_token_id=None, flat_logits=flat_logits)


def set_eos(model_dirs: Sequence[str], eos_token_id: int) -> None:
    """Rewrite the EOS id of saved models (tests pick an EOS the target actually emits)."""
    from transformers import AutoConfig, GenerationConfig

    for path in model_dirs:
        config = AutoConfig.from_pretrained(path)
        config.eos_token_id = eos_token_id
        config.save_pretrained(path)
        GenerationConfig(eos_token_id=eos_token_id).save_pretrained(path)


def random_prompts(n: int, length: int = 12, seed: int = 0, vocab_size: int = VOCAB_SIZE) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    return [[rng.randrange(2, vocab_size) for _ in range(length)] for _ in range(n)]
