"""Token trees: several continuations a model-free drafter proposes at once, verified in one pass.

A `DraftTree` is parallel tuples, one entry per node: its token, its parent (-1: the root, the position
after the sequence the tree extends) and its estimated probability (the product of the continuation
shares along its path: how likely the drafter thinks it is that the verifier's sequence passes
through it). Nodes are in depth-first order with each node's children most likely first (ties: the
earlier one), so every parent precedes its children and the first path down from the root is the most
likely one (`best_path`; the suffix drafter's is the chain it would propose alone). Siblings hold
distinct tokens.

A chain proposal is a tree with one path (`DraftTree.chain`). Torch-free: a tree travels in
`pipespec.protocol.Drafts`, and the profile's measurements (`experiments.profiler`) walk it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Sequence

ROOT = -1  # the parent of a first-level node: the position after the sequence


@dataclass(frozen=True)
class DraftTree:
    """Proposed continuations as a token tree (the module docstring): tokens, parents and probabilities."""

    tokens: tuple[int, ...] = ()
    parents: tuple[int, ...] = ()
    probs: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "tokens", tuple(int(t) for t in self.tokens))
        object.__setattr__(self, "parents", tuple(int(p) for p in self.parents))
        object.__setattr__(self, "probs", tuple(float(p) for p in self.probs))
        if not len(self.tokens) == len(self.parents) == len(self.probs):
            raise ValueError(f"a tree needs one parent and one probability per token, got {len(self.tokens)} "
                             f"tokens, {len(self.parents)} parents, {len(self.probs)} probabilities")  # fmt: skip
        if any(not ROOT <= p < i for i, p in enumerate(self.parents)):
            raise ValueError(f"every parent must precede its child (or be {ROOT}, the root): {self.parents}")

    def __len__(self) -> int:
        return len(self.tokens)

    # ---- building ---------------------------------------------------------------------------------
    @classmethod
    def chain(cls, tokens: Sequence[int], probs: Sequence[float] | None = None) -> "DraftTree":
        """One path: `tokens` in order (probabilities 1 unless given)."""
        return cls(tuple(tokens), tuple(range(-1, len(tokens) - 1)), tuple(probs or [1.0] * len(tokens)))

    @classmethod
    def build(cls, tokens: Sequence[int], parents: Sequence[int], probs: Sequence[float]) -> "DraftTree":
        """The tree of nodes given in any order where parents precede children, put in depth-first order
        with each node's children most likely first (ties: the one given first)."""
        children: list[list[int]] = [[] for _ in range(len(tokens) + 1)]
        for i, parent in enumerate(parents):
            children[parent + 1].append(i)
        order: list[int] = []
        stack = sorted(children[0], key=lambda c: (-probs[c], c), reverse=True)
        while stack:
            node = stack.pop()
            order.append(node)
            stack.extend(sorted(children[node + 1], key=lambda c: (-probs[c], c), reverse=True))
        where = {old: new for new, old in enumerate(order)}
        return cls(tuple(tokens[i] for i in order), tuple(where.get(parents[i], ROOT) for i in order),
                   tuple(probs[i] for i in order))  # fmt: skip

    @classmethod
    def from_paths(cls, paths: Sequence[Sequence[int]]) -> "DraftTree":
        """A trie of token paths (e.g. several earlier matches' continuations), each node's probability the
        share of the paths through it; siblings ordered by that share, ties: the path given first."""
        index: dict[tuple[int, int], int] = {}
        tokens: list[int] = []
        parents: list[int] = []
        counts: list[int] = []
        for path in paths:
            node = ROOT
            for token in path:
                key = (node, int(token))
                if key not in index:
                    index[key] = len(tokens)
                    tokens.append(int(token))
                    parents.append(node)
                    counts.append(0)
                node = index[key]
                counts[node] += 1
        total = max(len(paths), 1)
        return cls.build(tokens, parents, [c / total for c in counts])

    # ---- reading ------------------------------------------------------------------------------------
    def depths(self) -> tuple[int, ...]:
        """Each node's depth: 1 for a child of the root (its token sits right after the sequence)."""
        depths: list[int] = []
        for parent in self.parents:
            depths.append(1 if parent == ROOT else depths[parent] + 1)
        return tuple(depths)

    @property
    def depth(self) -> int:
        """The longest path's length in tokens (0: an empty tree)."""
        return max(self.depths(), default=0)

    def children(self) -> list[list[int]]:
        """children()[node + 1]: the node's children in order (children()[0]: the root's)."""
        found: list[list[int]] = [[] for _ in range(len(self) + 1)]
        for i, parent in enumerate(self.parents):
            found[parent + 1].append(i)
        return found

    def best_path(self) -> list[int]:
        """The nodes of the most likely path from the root (first children all the way down)."""
        path = []
        for i, parent in enumerate(self.parents):
            if parent != (path[-1] if path else ROOT):
                break
            path.append(i)
        return path

    def path_tokens(self, nodes: Sequence[int]) -> list[int]:
        return [self.tokens[i] for i in nodes]

    def ancestors(self, node: int) -> list[int]:
        """The nodes from the root's child down to `node`, `node` included."""
        path = []
        while node != ROOT:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def follow(self, tokens: Sequence[int]) -> list[int]:
        """The nodes of the longest path from the root whose tokens are a prefix of `tokens`."""
        children, path = self.children(), []
        for token in tokens:
            node = next((c for c in children[(path[-1] if path else ROOT) + 1] if self.tokens[c] == token), None)
            if node is None:
                break
            path.append(node)
        return path

    # ---- changing ------------------------------------------------------------------------------------
    def subtree(self, tokens: Sequence[int]) -> "DraftTree | None":
        """The tree below the node that `tokens` lead to from the root (probabilities given that node), or
        None when `tokens` is not a path of this tree."""
        path = self.follow(tokens)
        if len(path) < len(tokens):
            return None
        if not path:
            return self
        top = path[-1]
        below = [i for i in range(top + 1, len(self)) if self._descends(i, top)]
        where = {top: ROOT, **{old: new for new, old in enumerate(below)}}
        scale = self.probs[top] or 1.0
        return DraftTree(tuple(self.tokens[i] for i in below), tuple(where[self.parents[i]] for i in below),
                         tuple(self.probs[i] / scale for i in below))  # fmt: skip

    def _descends(self, node: int, ancestor: int) -> bool:
        while node > ancestor:
            node = self.parents[node]
        return node == ancestor

    def graft(self, node: int, other: "DraftTree") -> "DraftTree":
        """This tree with `other`'s nodes below `node` (a leaf; ROOT: beside the root's children), their
        probabilities times `node`'s."""
        base = 1.0 if node == ROOT else self.probs[node]
        offset = len(self)
        tokens = self.tokens + other.tokens
        parents = self.parents + tuple(node if p == ROOT else p + offset for p in other.parents)
        return DraftTree.build(tokens, parents, self.probs + tuple(base * p for p in other.probs))

    def pruned(self, max_depth: int | None = None, stop_tokens: Collection[int] = (),
               max_nodes: int | None = None) -> "DraftTree":  # fmt: skip
        """The nodes at depth <= `max_depth`, none below a stop token (an EOS: nothing after it can be kept),
        and of those the `max_nodes` most likely (ties: the earlier one; a node's parent always comes first)."""
        depths, keep = self.depths(), []
        kept_set: set[int] = set()
        for i, parent in enumerate(self.parents):
            if (max_depth is not None and depths[i] > max_depth) or (parent != ROOT and parent not in kept_set):
                continue
            if parent != ROOT and self.tokens[parent] in stop_tokens:
                continue
            keep.append(i)
            kept_set.add(i)
        if max_nodes is not None and len(keep) > max_nodes:
            chosen: set[int] = set()
            for i in sorted(keep, key=lambda i: (-self.probs[i], i)):
                if len(chosen) == max_nodes:
                    break
                if self.parents[i] == ROOT or self.parents[i] in chosen:
                    chosen.add(i)
            keep = [i for i in keep if i in chosen]
        if len(keep) == len(self):
            return self
        where = {old: new for new, old in enumerate(keep)}
        return DraftTree(tuple(self.tokens[i] for i in keep), tuple(where.get(self.parents[i], ROOT) for i in keep),
                         tuple(self.probs[i] for i in keep))  # fmt: skip
