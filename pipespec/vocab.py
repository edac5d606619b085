"""A drafter's reduced lm_head (stage option `vocab_limit`): logits for the most frequent token ids only.

BPE vocabularies put frequent tokens first (on SmolLM2's outputs, ids < 16384 cover about 92% of
the generated tokens), so a drafter's head over the first N rows does most of the drafting at a
fraction of the head's cost. The ids above get logit -inf: the logits keep the full vocabulary
width, greedy argmax, softmax and the verify rule are unchanged, and the draft distribution has
zero mass outside the kept ids, which keeps speculative sampling lossless (the target's own
distribution decides every emitted token).
"""

from __future__ import annotations

import torch


class VocabLimitedHead(torch.nn.Module):
    """An lm_head over token ids 0..limit-1, as the full head gives them, and -inf for the rest.

    `kept` is a plain nn.Linear over a copy of the head's first `limit` rows (and bias), so a head
    tied to the input embedding leaves that embedding whole; int8 dynamic quantization and oneDNN
    prepacking replace `kept` like any other Linear of the model."""

    def __init__(self, head: torch.nn.Linear, limit: int):
        super().__init__()
        if not 1 <= limit <= head.out_features:
            raise ValueError(f"limit must be in 1..{head.out_features}, got {limit}")
        weight = head.weight.detach()
        self.kept = torch.nn.Linear(
            head.in_features, limit, bias=head.bias is not None, device=weight.device, dtype=weight.dtype
        )
        with torch.no_grad():
            self.kept.weight.copy_(weight[:limit])
            if head.bias is not None:
                self.kept.bias.copy_(head.bias.detach()[:limit])
        self.limit, self.vocab_size = limit, head.out_features
        self.device = weight.device  # a model split over GPUs: the hidden state may arrive from another one

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if hidden.device != self.device:
            hidden = hidden.to(self.device)
        kept = self.kept(hidden)
        return torch.nn.functional.pad(kept, (0, self.vocab_size - self.limit), value=float("-inf"))

    def extra_repr(self) -> str:
        return f"limit={self.limit}, vocab_size={self.vocab_size}"
