"""Token bookkeeping of a simulation: every token is an abstract id created once, by one stage, at one
position, on one context. Copies (a verifier accepting a draft, a stage rolling back to a later stage's
output) keep the id, so two buffers holding the same id at position q agree on every position <= q:
prefix checks are O(1) and a rollback touches only the tokens that differ.
"""

from __future__ import annotations


ROOT = -1  # parent id of the first generated token (the prompt)


class _Tokens:
    """Creates token ids; remembers each id's parent id and position, and which ids stand for the
    same token (two stages that produced the same token at the same position without seeing each
    other's: found equal when a commit reaches the stage that produced the other)."""

    def __init__(self) -> None:
        self.parent: list[int] = []
        self.position: list[int] = []
        self.unseen: set[int] = set()  # a verifier's own token made where its drafter had none yet
        self.alias: dict[int, int] = {}

    def new(self, buffer: list[int], unseen: bool = False) -> int:
        """A fresh token to be appended to ``buffer``."""
        self.parent.append(buffer[-1] if buffer else ROOT)
        self.position.append(len(buffer))
        token = len(self.parent) - 1
        if unseen:
            self.unseen.add(token)
        return token

    def find(self, token: int) -> int:
        while token in self.alias:
            token = self.alias[token]
        return token

    def same(self, a: int, b: int) -> bool:
        return self.find(a) == self.find(b)

    def merge(self, a: int, b: int) -> None:
        """Tokens ``a`` and ``b`` (same position, same prefix) turned out to be the same token."""
        a, b = self.find(a), self.find(b)
        if a != b:
            self.alias[b] = a

    def holds(self, buffer: list[int], token: int) -> bool:
        """True if ``buffer`` contains ``token`` at its position (hence agrees on the prefix)."""
        if token == ROOT:
            return True
        pos = self.position[token]
        return pos < len(buffer) and self.same(buffer[pos], token)

    def diverging(self, buffer: list[int], last: int) -> list[int]:
        """The tokens of the sequence ending in ``last`` that ``buffer`` lacks, in order of position."""
        missing = []
        token = last
        while not self.holds(buffer, token):  # walk back to the common prefix
            missing.append(token)
            token = self.parent[token]
        return missing[::-1]

    def agree_through(self, a: list[int], b: list[int], length: int) -> bool:
        """True if buffers ``a`` and ``b`` agree on their first ``length`` tokens."""
        return length == 0 or (len(a) >= length and len(b) >= length and self.same(a[length - 1], b[length - 1]))
