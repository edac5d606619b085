"""Published shapes of the paper's checkpoints: memory without their weights or their config.json.

    shape = shape_for("meta-llama/Llama-3.1-70B-Instruct")   # None for a model not in the table
    shape.params, shape.kv_bytes_per_token(2.0), shape.weight_bytes("nf4", 2.0)

Plan mode (`experiments.plan`) reads a local config.json where there is one; for a hub id on a machine
without the weights (a GPU run planned on a laptop) it takes the shape from this table: the numbers of
each checkpoint's published config.json (layers, hidden size, attention and KV heads, head dim, MLP size,
vocabulary, tied embeddings, context). Parameters are counted from the shape (a LLaMA decoder: embedding,
per layer the q/k/v/o projections, the gated MLP and two RMSNorms, a final norm, and the lm_head unless
tied); `tests/test_placement.py` checks them against the published counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

NF4_BYTES_PER_WEIGHT = 0.5625  # 4 bits + one fp32 absmax per block of 64 (bitsandbytes nf4, no double quant)


@dataclass(frozen=True)
class Shape:
    """A LLaMA-architecture decoder's shape (the fields of its config.json)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool  # lm_head shares the embedding matrix
    context: int  # max_position_embeddings

    @property
    def linear_params(self) -> int:
        """The decoder layers' projection weights: what nf4 quantizes (bitsandbytes keeps the rest)."""
        attention = self.hidden * self.heads * self.head_dim * 2 + self.hidden * self.kv_heads * self.head_dim * 2
        mlp = 3 * self.hidden * self.intermediate
        return self.layers * (attention + mlp)

    @property
    def other_params(self) -> int:
        """Embedding, lm_head (unless tied) and the RMSNorm weights: kept in the compute dtype under nf4."""
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return embeddings + (2 * self.layers + 1) * self.hidden

    @property
    def params(self) -> int:
        return self.linear_params + self.other_params

    def kv_bytes_per_token(self, bytes_per_value: float) -> float:
        """K and V of every layer for one token (batch 1)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * bytes_per_value

    def weight_bytes(self, quantize: str | None, bytes_per_param: float) -> float:
        """Weight memory: every parameter at `bytes_per_param`, or under nf4 the projections at 4 bits."""
        if quantize == "nf4":
            return self.linear_params * NF4_BYTES_PER_WEIGHT + self.other_params * bytes_per_param
        return self.params * bytes_per_param


# The published config.json of each checkpoint (base and instruct share the shape).
LLAMA_3_2_1B = Shape(layers=16, hidden=2048, heads=32, kv_heads=8, head_dim=64, intermediate=8192, vocab=128256,
                     tied=True, context=131072)  # fmt: skip
LLAMA_3_1_8B = Shape(layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=14336, vocab=128256,
                     tied=False, context=131072)  # fmt: skip
LLAMA_3_1_70B = Shape(layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128, intermediate=28672, vocab=128256,
                      tied=False, context=131072)  # fmt: skip
LLAMA_2_7B = Shape(layers=32, hidden=4096, heads=32, kv_heads=32, head_dim=128, intermediate=11008, vocab=32000,
                   tied=False, context=4096)  # fmt: skip
LLAMA_2_13B = Shape(layers=40, hidden=5120, heads=40, kv_heads=40, head_dim=128, intermediate=13824, vocab=32000,
                    tied=False, context=4096)  # fmt: skip
LLAMA_68M = Shape(layers=2, hidden=768, heads=12, kv_heads=12, head_dim=64, intermediate=3072, vocab=32000,
                  tied=False, context=2048)  # fmt: skip

# hub id (lower case) -> shape; the published parameter counts are in tests/test_placement.py
PUBLISHED: dict[str, Shape] = {
    "meta-llama/llama-3.2-1b": LLAMA_3_2_1B,
    "meta-llama/llama-3.2-1b-instruct": LLAMA_3_2_1B,
    "meta-llama/llama-3.1-8b": LLAMA_3_1_8B,
    "meta-llama/llama-3.1-8b-instruct": LLAMA_3_1_8B,
    "meta-llama/meta-llama-3.1-8b": LLAMA_3_1_8B,
    "meta-llama/meta-llama-3.1-8b-instruct": LLAMA_3_1_8B,
    "meta-llama/llama-3.1-70b": LLAMA_3_1_70B,
    "meta-llama/llama-3.1-70b-instruct": LLAMA_3_1_70B,
    "meta-llama/meta-llama-3.1-70b": LLAMA_3_1_70B,
    "meta-llama/meta-llama-3.1-70b-instruct": LLAMA_3_1_70B,
    "meta-llama/llama-2-7b-hf": LLAMA_2_7B,
    "meta-llama/llama-2-7b-chat-hf": LLAMA_2_7B,
    "meta-llama/llama-2-13b-hf": LLAMA_2_13B,
    "meta-llama/llama-2-13b-chat-hf": LLAMA_2_13B,
    "jackfram/llama-68m": LLAMA_68M,
}


def shape_for(model: str | None) -> Shape | None:
    """The published shape of a hub id in the table (any case), else None."""
    return PUBLISHED.get(str(model or "").strip().lower())


def shape_from_config(config: Mapping[str, Any]) -> Shape | None:
    """The shape a LLaMA-style config.json describes (None where it lacks the fields)."""
    layers, hidden, heads = (config.get(k) for k in ("num_hidden_layers", "hidden_size", "num_attention_heads"))
    if not (layers and hidden and heads):
        return None
    return Shape(
        layers=layers, hidden=hidden, heads=heads, kv_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("head_dim") or hidden // heads, intermediate=config.get("intermediate_size") or 4 * hidden,
        vocab=config.get("vocab_size") or 0, tied=bool(config.get("tie_word_embeddings", False)),
        context=config.get("max_position_embeddings") or 0,
    )  # fmt: skip
