"""Prompt lookup: continue the latest earlier occurrence of the sequence's last n-gram (no model)."""

from __future__ import annotations

from typing import Sequence


class PromptLookup:
    """A model-free drafter: continue the latest earlier occurrence of the sequence's last n-gram."""

    def __init__(self, ngram_size: int = 3, max_proposal: int = 8):
        self.ngram_size = ngram_size
        self.max_proposal = max_proposal
        self.last_match = 0  # length of the match behind the last proposal (0: none); for measurements

    def propose(self, sequence: Sequence[int], limit: int) -> list[int]:
        self.last_match = 0
        limit = min(limit, self.max_proposal)
        if limit <= 0:
            return []
        for n in range(min(self.ngram_size, len(sequence) - 1), 0, -1):
            tail = list(sequence[-n:])
            # search right to left for the latest earlier match
            for start in range(len(sequence) - n - 1, -1, -1):
                if list(sequence[start : start + n]) == tail:
                    follow = list(sequence[start + n : start + n + limit])
                    if follow:
                        self.last_match = n
                        return follow
        return []

    def observe_output(self, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> None:
        """Prompt lookup remembers nothing between requests."""

    def forget_outputs(self) -> None:
        """Nothing to forget."""
