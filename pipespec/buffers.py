"""What a stage does with its neighbours' buffers: the drafts it is offered and how it follows a commit.

Pure functions of buffer lengths and tokens, torch-free: the stage loop (`pipespec.stage.StageRequest`)
and the simulator (`analysis.simulate`) both decide with them. Each applies the decision to its own
representation of a buffer (the engine: lists of token ids; the simulator: abstract token ids whose
prefix checks are O(1)).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection


def offered_drafts(
    generated: int,
    upstream: list[int],
    extends: bool,
    budget: int,
    eos_ids: Collection[int] = (),
    limit: int | None = None,
) -> list[int]:
    """The drafts a verifier holding `generated` tokens is offered by its drafter's buffer `upstream`:
    the drafter's tokens beyond the verifier's, when that buffer extends the verifier's (`extends`: the
    two agree on the verifier's `generated` tokens), at most `limit` of them (None: all), cut at
    room - 1 of the `budget` (the verifier's own token takes the last place) and after an EOS (nothing
    after one can be kept)."""
    if len(upstream) <= generated or not extends:
        return []
    end = len(upstream) if limit is None else min(len(upstream), generated + limit)
    drafts = upstream[generated : min(end, generated + max(budget - generated - 1, 0))]
    if eos_ids:
        for i, token in enumerate(drafts):
            if token in eos_ids:
                return drafts[: i + 1]
    return drafts


@dataclass(frozen=True)
class Adoption:
    """How a stage follows a commit (the next stage's whole buffer)."""

    replace_from: int | None  # from here on its buffer becomes the commit's tokens (None: it extends the commit)
    rolled_back: int  # how many of its own tokens differ from the commit's and are dropped (0: none, a catch-up)


def adopt(generated: int, committed: int, common: int) -> Adoption:
    """A stage holding `generated` tokens receives a commit of `committed` tokens; the two share their
    first `common`. Where they differ the stage rolls back to the commit; where the commit is ahead it
    catches up; a buffer that already extends the commit keeps its own tokens beyond it."""
    if common >= committed:
        return Adoption(None, 0)
    return Adoption(common, generated - common)
