"""The suffix drafter: a suffix index over the prompt, earlier outputs and corpus files.

It follows the interface of `pipespec.drafters.base`; an output is indexed only once its request
has ended (`observe_output`), so it is never proposed before its own generation is over.

`SuffixDrafter` follows the idea of SuffixDecoding (arXiv 2411.04975): it finds
the longest suffix of the sequence (up to `max_depth` tokens) that occurs in its
index, and walks forward from every occurrence at once, like a walk down a
suffix tree: at each step it takes the continuation seen most often among the
occurrences still agreeing (ties: the most recent), and multiplies its
confidence by that continuation's share. It stops at `limit`, when no
occurrence continues, when the chosen continuation was seen fewer than
`min_count` times, or once the confidence falls below `confidence`. `propose_tree` keeps every
continuation instead: a token tree (`pipespec.tree`) grown best-first by each node's
estimated probability, the product of the shares along its path, up to a node budget.

The index holds three kinds of documents:
- the current request's sequence (prompt + output so far), indexed
  incrementally as it grows and rolled back with it;
- every earlier output, prefixed with the last `max_depth` tokens of its prompt
  (so the start of an output is found after the same prompt ending);
- optional corpus documents (e.g. the target-tokenized text of .py files).

Memory policy: earlier outputs and corpus documents together hold at most
`max_index_tokens` tokens. Corpus documents are pinned (a corpus larger than
the budget is refused); when a new output would exceed the budget, the oldest
outputs are evicted first, one by one, each in time proportional to its
length (no rebuild), and an output longer than the whole budget keeps its
last tokens. Each indexed token costs at most `max_depth` index entries
(about 100 MB at the default 65536 tokens x depth 8 when every n-gram is
distinct, far less on real text), and a proposal examines at most `max_candidates` occurrences
(the most recent) of the longest match, so a proposal's cost is bounded by
`max_depth` dictionary look-ups plus `max_candidates` x `limit` token reads.
Everything is deterministic: no hashing of strings, no randomness, ties go to
the most recent occurrence.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from pathlib import Path
from typing import Sequence

from pipespec.drafters.base import common_prefix
from pipespec.tree import ROOT as ROOT_NODE, DraftTree
from pipespec.errors import ConfigError
from pipespec.specs import check_suffix_options

END = -1  # ends every document in the flat buffer: no match or walk crosses it


class _NgramIndex:
    """Positions by the n-gram (n = 1..depth) that ends right before them, in increasing order.

    A position p of a token buffer is recorded under every key buffer[p - n : p] that lies within
    its document; buffer[p] is then the continuation seen after that key. Positions are absolute:
    a buffer whose oldest tokens were dropped holds position p at index p - base.
    """

    def __init__(self, depth: int):
        self.depth = depth
        self.maps: list[dict[tuple, list[int]]] = [{} for _ in range(depth + 1)]  # maps[n]; maps[0] unused

    def add(self, tokens: Sequence[int], position: int, doc_start: int, base: int = 0) -> None:
        at = position - base
        for n in range(1, min(self.depth, position - doc_start) + 1):
            self.maps[n].setdefault(tuple(tokens[at - n : at]), []).append(position)

    def remove(self, tokens: Sequence[int], position: int, doc_start: int, base: int = 0, newest: bool = True) -> None:
        """Undo `add` of the newest position (a rollback) or of the oldest (an eviction)."""
        at = position - base
        for n in range(1, min(self.depth, position - doc_start) + 1):
            key = tuple(tokens[at - n : at])
            positions = self.maps[n][key]
            positions.pop(-1 if newest else 0)
            if not positions:
                del self.maps[n][key]

    def lookup(self, n: int, key: tuple) -> list[int]:
        return self.maps[n].get(key, [])

    def entries(self) -> int:
        return sum(len(p) for m in self.maps for p in m.values())


class _DocumentStore:
    """Whole documents in one flat buffer, each followed by END, indexed; the oldest can be evicted."""

    def __init__(self, depth: int):
        self.tokens: list[int] = []
        self.base = 0  # absolute position of tokens[0]
        self.index = _NgramIndex(depth)
        self.lengths: deque[int] = deque()
        self.size = 0  # tokens held, END markers not counted

    def append(self, doc: Sequence[int]) -> None:
        start = self.base + len(self.tokens)
        self.tokens.extend(doc)
        self.tokens.append(END)
        for position in range(start + 1, start + len(doc)):  # positions with a continuation in the document
            self.index.add(self.tokens, position, start, self.base)
        self.lengths.append(len(doc))
        self.size += len(doc)

    def evict_oldest(self) -> None:
        length = self.lengths.popleft()
        start = self.base
        for position in range(start + 1, start + length):
            self.index.remove(self.tokens, position, start, self.base, newest=False)
        del self.tokens[: length + 1]
        self.base += length + 1
        self.size -= length


class SuffixDrafter:
    """Propose the continuation of the longest matching suffix, from the prompt and earlier outputs."""

    def __init__(
        self,
        max_proposal: int = 8,
        max_depth: int = 8,
        min_match: int = 1,
        min_count: int = 1,
        confidence: float = 0.0,
        max_index_tokens: int = 65536,
        max_candidates: int = 64,
        corpus: Sequence[Sequence[int]] = (),
    ):
        check_suffix_options(max_proposal, max_depth, min_match, min_count, confidence, max_index_tokens)
        if max_candidates < 1:
            raise ConfigError(f"suffix option 'max_candidates' must be >= 1, got {max_candidates}")
        self.max_proposal = max_proposal
        self.max_depth = max_depth
        self.min_match = min_match
        self.min_count = min_count
        self.confidence = confidence
        self.max_index_tokens = max_index_tokens
        self.max_candidates = max_candidates
        self.last_match = 0  # length of the suffix match behind the last proposal (0: none); for measurements
        self.corpus = _DocumentStore(max_depth)  # pinned
        for doc in corpus:
            if doc:
                self.corpus.append(doc)
        if self.corpus.size > max_index_tokens:
            raise ConfigError(
                f"the suffix stage's corpus has {self.corpus.size} tokens, more than max_index_tokens "
                f"({max_index_tokens}): raise max_index_tokens or name fewer files"
            )
        self.outputs = _DocumentStore(max_depth)  # earlier outputs (after their prompt's ending), oldest first
        self._reset_local()

    # ---- earlier outputs ------------------------------------------------------------------------------
    def observe_output(self, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> None:
        """Index a finished output (after the last `max_depth` prompt tokens); end the current request."""
        self._reset_local()
        room = self.max_index_tokens - self.corpus.size
        if not output_ids or room < 2:
            return
        doc = (list(prompt_ids[-self.max_depth :]) + list(output_ids))[-room:]
        while self.outputs.size + len(doc) > room:
            self.outputs.evict_oldest()
        self.outputs.append(doc)

    def forget_outputs(self) -> None:
        """Drop every earlier output from the index (the corpus stays): e.g. before a benchmark repeats its
        prompts, whose earlier outputs would otherwise be drafted back verbatim."""
        self.outputs = _DocumentStore(self.max_depth)
        self._reset_local()

    def indexed_tokens(self) -> int:
        """Tokens of earlier outputs and corpus documents in the index (at most max_index_tokens)."""
        return self.outputs.size + self.corpus.size

    def index_entries(self) -> int:
        """Positions recorded in the index of earlier outputs and corpus (at most max_depth a token)."""
        return self.outputs.index.entries() + self.corpus.index.entries()

    # ---- the current request's sequence -----------------------------------------------------------
    def _reset_local(self) -> None:
        self.local_tokens: list[int] = []
        self.local = _NgramIndex(self.max_depth)

    def _sync_local(self, sequence: Sequence[int]) -> None:
        """Make the local index cover `sequence`: extend it, or roll it back where the sequence changed."""
        have = self.local_tokens
        n = len(have)
        if not (len(sequence) >= n and list(sequence[:n]) == have):
            common = common_prefix(have, sequence)
            if common < n // 2:  # another request: start over
                self._reset_local()
            else:  # a rollback: positions 1..n-1 are indexed; keep those below `common`
                for position in range(n - 1, max(common, 1) - 1, -1):
                    self.local.remove(have, position, 0)
                del have[common:]
        have = self.local_tokens
        start = len(have)
        have.extend(sequence[start:])
        for position in range(max(start, 1), len(have)):  # position p continues with have[p]
            self.local.add(have, position, 0)

    # ---- proposing ----------------------------------------------------------------------------------
    def propose(self, sequence: Sequence[int], limit: int) -> list[int]:
        self.last_match = 0
        limit = min(limit, self.max_proposal)
        if limit <= 0 or not sequence:
            return []
        found = self._occurrences(sequence)
        if found is None:
            return []
        n, sources = found
        proposal = self._walk(sources, limit)
        self.last_match = n if proposal else 0
        return proposal

    def propose_tree(self, sequence: Sequence[int], max_nodes: int, max_depth: int | None = None) -> DraftTree:
        """Several continuations at once: from the occurrences of the longest matching suffix, the tree of
        their continuations grown best-first by each node's estimated probability (the product of the
        continuation shares along its path) up to `max_nodes` nodes, at most `max_depth` deep (and
        `max_proposal`); `min_count` and `confidence` prune nodes as they stop a proposal. Its most
        likely path is `propose`'s chain (where the nodes reach that far)."""
        self.last_match = 0
        depth = min(self.max_proposal if max_depth is None else max_depth, self.max_proposal)
        if depth <= 0 or max_nodes <= 0 or not sequence:
            return DraftTree()
        found = self._occurrences(sequence)
        if found is None:
            return DraftTree()
        n, sources = found
        tree = self._grow(sources, depth, max_nodes)
        self.last_match = n if len(tree) else 0
        return tree

    def _occurrences(self, sequence: Sequence[int]) -> tuple[int, list] | None:
        """(n, sources) for the longest suffix of `sequence` (n tokens, at least `min_match`) found in the
        index: its occurrences to walk forward from, at most max_candidates (the most recent) as
        (buffer, base, end, positions), oldest source first; None when no suffix is found."""
        self._sync_local(sequence)
        local_tokens = self.local_tokens
        end = len(local_tokens)
        indexes = (self.corpus.index, self.outputs.index, self.local)  # oldest to newest
        for n in range(min(self.max_depth, end), self.min_match - 1, -1):
            key = tuple(local_tokens[end - n :])
            found = [index.lookup(n, key) for index in indexes]
            if any(found):
                break
        else:
            return None
        # at most max_candidates occurrences, the most recent: the current sequence's, then the newest outputs'
        left = self.max_candidates
        chosen = []
        for positions in reversed(found):
            take = positions[max(len(positions) - left, 0) :] if left > 0 else []
            chosen.append(take)
            left -= len(take)
        chosen.reverse()
        return n, [
            (self.corpus.tokens, self.corpus.base, len(self.corpus.tokens), chosen[0]),
            (self.outputs.tokens, self.outputs.base, len(self.outputs.tokens), chosen[1]),
            (local_tokens, 0, end, chosen[2]),
        ]

    def _walk(self, sources: list, limit: int) -> list[int]:
        """Follow the occurrences forward: the most frequent continuation each step (ties: the newest).

        `sources`: (buffer, base, end, positions), oldest first; a position p reads buffer[p - base]
        and stops at END or at `end`.
        """
        proposal: list[int] = []
        confidence = 1.0
        for step in range(limit):
            counts, newest = _continuations(sources, step)
            if not counts:
                break
            best = max(counts, key=lambda t: (counts[t], newest[t]))
            confidence *= counts[best] / sum(counts.values())
            if counts[best] < self.min_count or confidence < self.confidence:
                break
            proposal.append(best)
            sources = _following(sources, step, best)
        return proposal

    def _grow(self, sources: list, depth: int, max_nodes: int) -> DraftTree:
        """The continuation tree, best-first: a heap of candidate nodes by estimated probability (ties: the
        shallower, then the newest occurrence, then the first found); each node taken adds its own
        continuations."""
        heap: list = []
        tokens: list[int] = []
        parents: list[int] = []
        probs: list[float] = []
        found = itertools.count()  # the order candidates were found in: the last tie-break

        def offer(parent: int, parent_sources: list, step: int, prob: float) -> None:
            counts, newest = _continuations(parent_sources, step)
            total = sum(counts.values())
            for token, count in counts.items():
                share = prob * (count / total)  # as the chain multiplies its confidence
                if count >= self.min_count and share >= self.confidence:
                    heapq.heappush(heap, (-share, step, -newest[token], next(found), parent, token, step,
                                          parent_sources))  # fmt: skip

        offer(ROOT_NODE, sources, 0, 1.0)
        while heap and len(tokens) < max_nodes:
            negative, _, _, _, parent, token, step, parent_sources = heapq.heappop(heap)
            tokens.append(token)
            parents.append(parent)
            probs.append(-negative)
            if step + 1 < depth:
                offer(len(tokens) - 1, _following(parent_sources, step, token), step + 1, -negative)
        return DraftTree.build(tokens, parents, probs)


def _continuations(sources: list, step: int) -> tuple[dict[int, int], dict[int, int]]:
    """How often each token continues the occurrences `step` tokens on, and the order of its newest one."""
    counts: dict[int, int] = {}
    newest: dict[int, int] = {}
    order = 0
    for tokens, base, end, positions in sources:
        for p in positions:  # oldest first, so `newest` ends on the latest occurrence
            at = p + step - base
            token = tokens[at] if at < end else END
            if token != END:
                counts[token] = counts.get(token, 0) + 1
                newest[token] = order
            order += 1
    return counts, newest


def _following(sources: list, step: int, token: int) -> list:
    """The occurrences whose continuation `step` tokens on is `token`."""
    return [
        (tokens, base, end, [p for p in positions if p + step - base < end and tokens[p + step - base] == token])
        for tokens, base, end, positions in sources
    ]


CORPUS_SUFFIXES = (".py", ".txt", ".md")


def corpus_files(paths: Sequence[str]) -> list[Path]:
    """The files a corpus option names: files as given, folders searched for .py/.txt/.md files, sorted."""
    files: list[Path] = []
    for entry in paths:
        path = Path(str(entry)).expanduser()
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files.extend(sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in CORPUS_SUFFIXES))
        else:
            raise ConfigError(f"suffix stage corpus path {str(entry)!r} does not exist")
    if not files:
        raise ConfigError(f"suffix stage corpus {list(paths)} holds no {'/'.join(CORPUS_SUFFIXES)} files")
    return files


def tokenize_corpus(paths: Sequence[str], tokenizer) -> list[list[int]]:
    """Each corpus file as one document of the target's token ids (in sorted file order)."""
    docs = []
    for path in corpus_files(paths):
        text = path.read_text(encoding="utf-8", errors="replace")
        docs.append(list(tokenizer(text, add_special_tokens=False)["input_ids"]))
    return docs
