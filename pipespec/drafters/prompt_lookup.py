"""Prompt lookup: continue the latest earlier occurrence of the sequence's last n-gram (no model)."""

from __future__ import annotations

from typing import Sequence

from pipespec.tree import DraftTree

MAX_MATCHES = 16  # a tree proposal merges the continuations of at most this many earlier matches (the latest)


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

    def propose_tree(self, sequence: Sequence[int], max_nodes: int, max_depth: int | None = None) -> DraftTree:
        """The continuations of several earlier matches of the longest n-gram that has one (the latest
        `MAX_MATCHES`, at most `max_depth` tokens each and `max_proposal`) merged into a trie, each node's
        probability the share of the matches through it; its `max_nodes` most likely nodes."""
        self.last_match = 0
        depth = min(self.max_proposal if max_depth is None else max_depth, self.max_proposal)
        if depth <= 0 or max_nodes <= 0:
            return DraftTree()
        for n in range(min(self.ngram_size, len(sequence) - 1), 0, -1):
            tail = list(sequence[-n:])
            follows = []
            for start in range(len(sequence) - n - 1, -1, -1):  # the latest first
                if list(sequence[start : start + n]) == tail:
                    follows.append(list(sequence[start + n : start + n + depth]))
                    if len(follows) == MAX_MATCHES:
                        break
            follows = [f for f in follows if f]
            if follows:
                self.last_match = n
                return DraftTree.from_paths(follows).pruned(max_nodes=max_nodes)
        return DraftTree()

    def observe_output(self, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> None:
        """Prompt lookup remembers nothing between requests."""

    def forget_outputs(self) -> None:
        """Nothing to forget."""
