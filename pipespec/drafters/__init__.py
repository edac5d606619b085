"""Model-free drafters, one per file: prompt lookup (`prompt_lookup`) and a suffix index over
earlier outputs (`suffix`). Both follow the interface in `base` that the stage loop
(`pipespec.stage`) calls; `build_drafter` makes the one a stage spec names. Both also propose token
trees (`pipespec.tree`: several continuations verified in one pass).
"""

from __future__ import annotations

from pipespec.drafters.base import Drafter, common_prefix
from pipespec.drafters.prompt_lookup import PromptLookup
from pipespec.drafters.suffix import SuffixDrafter, corpus_files, tokenize_corpus

__all__ = ["Drafter", "PromptLookup", "SuffixDrafter", "build_drafter", "common_prefix", "corpus_files", "tokenize_corpus"]


def build_drafter(spec) -> Drafter | None:
    """The drafter of a model-free stage (`pipespec.specs.StageSpec`), None for a model stage."""
    if spec.kind == "prompt_lookup":
        return PromptLookup(spec.ngram_size, spec.max_proposal)
    if spec.kind != "suffix":
        return None
    corpus: list[list[int]] = []
    if spec.corpus:
        from pipespec.models import load_tokenizer

        corpus = tokenize_corpus(spec.corpus, load_tokenizer(spec.model))
    return SuffixDrafter(
        spec.max_proposal, spec.max_depth, spec.min_match, spec.min_count, spec.confidence,
        spec.max_index_tokens, corpus=corpus,
    )  # fmt: skip
