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
) -> list[str]:
    """Save drafts (noise levels, in order) then the target; return their paths, smallest... target last.

    `num_layers` 1 makes a step about 40% cheaper (transformers' per-layer overhead dominates
    at this size): statistical tests that need many thousands of tokens use it."""
    import torch
    from transformers import GenerationConfig, LlamaForCausalLM

    directory = Path(directory)
    torch.manual_seed(seed)
    config = tiny_config(vocab_size, eos_token_id, num_layers)
    target = LlamaForCausalLM(config).eval()
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
