"""The one acceptance rule, shared by every strategy and every stage.

A verifier runs one forward pass over its last committed token followed by the
offered draft tokens; row j of its logits predicts the token after position j.
It keeps the longest prefix of drafts that matches its own greedy choice and
appends one token of its own: the correction at the first mismatch, or the
bonus token when every draft matched.
"""

from __future__ import annotations

from typing import Sequence

import torch


def greedy_verify(draft_tokens: Sequence[int], verifier_logits: torch.Tensor) -> tuple[int, int]:
    """Return (number of drafts accepted, the verifier's own next token).

    `verifier_logits` has one row per fed position: len(draft_tokens) + 1 rows,
    row 0 being the prediction after the last committed token.
    """
    if verifier_logits.shape[0] != len(draft_tokens) + 1:
        raise ValueError(
            f"verifier_logits has {verifier_logits.shape[0]} rows, expected {len(draft_tokens) + 1}"
        )
    predictions = verifier_logits.argmax(dim=-1).tolist()
    accepted = 0
    while accepted < len(draft_tokens) and draft_tokens[accepted] == predictions[accepted]:
        accepted += 1
    return accepted, predictions[accepted]
