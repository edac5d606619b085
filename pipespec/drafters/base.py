"""What every drafter shares: the interface the stage loop calls, and the common-prefix walk.

- `propose(sequence, limit) -> list[int]`: the tokens the drafter guesses follow
  `sequence` (prompt + output so far), at most `limit` (and its own cap);
- `propose_tree(sequence, max_nodes, max_depth=None) -> DraftTree`: several continuations at once, a
  token tree of at most `max_nodes` nodes, at most `max_depth` deep (`pipespec.tree`), for a
  stage with `tree_nodes` > 0;
- `observe_output(prompt_ids, output_ids)`: a request ended with this final
  output of the target (the suffix drafter indexes it; prompt lookup ignores it);
- `forget_outputs()`: drop every earlier output (a benchmark's repetitions stay independent).
"""

from __future__ import annotations

from typing import Protocol, Sequence

from pipespec.tree import DraftTree


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens the two sequences share."""
    n, limit = 0, min(len(a), len(b))
    while n < limit and a[n] == b[n]:
        n += 1
    return n


class Drafter(Protocol):
    def propose(self, sequence: Sequence[int], limit: int) -> list[int]: ...

    def propose_tree(self, sequence: Sequence[int], max_nodes: int, max_depth: int | None = None) -> DraftTree: ...

    def observe_output(self, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> None: ...

    def forget_outputs(self) -> None: ...
