"""Lossless CPU kernels: fp32 linear layers on oneDNN with their weights prepacked once.

On the CPUs this project runs on, torch's default fp32 matrix product (MKL) streams a weight
quickly for one row, but 2-9 rows cost nearly per row: SmolLM2's 49152 x 576 lm_head takes
about 10 ms for 1 row and 20-40 ms for 2-5 (README, Performance). A verification feeds
several rows, so its step costs up to twice a one-token step. oneDNN's linear with a weight
reordered once into its blocked layout (`torch.ops.mkldnn._reorder_linear_weight` +
`_linear_pointwise`, what inductor's CPU freezing pass uses) reads the weight once for any
small row count: verifying 8 tokens costs about one token's step.

The arithmetic is the same fp32 products, summed in another order than MKL's, so logits
may differ from the default kernel in the last bits. Both greedy decoding and every
speculative strategy of a stage run the same kernel; `python -m experiments.kernels` measures
t(n) of both kernels and checks that their greedy outputs are identical on real prompts.

A stage's `kernels` option: "auto" (oneDNN where it applies: CPU, float32, not quantized, a
torch built with oneDNN; else torch's), "onednn" (an error where it cannot apply) or "torch".
The environment variable PIPESPEC_KERNELS=torch makes "auto" mean torch's kernels (e.g. to reproduce
runs measured before this option existed; the test suite's tiny models, where prepacking is slower);
unset, "auto" or "onednn", "auto" prepacks where it applies.
"""

from __future__ import annotations

import os

import torch

from pipespec.errors import ConfigError
from pipespec.specs import KERNELS, KERNELS_ENV, static_kernel_obstacle


def onednn_available() -> bool:
    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def obstacle(device: str, dtype: str, quantize: str | None) -> str | None:
    """Why oneDNN prepacking cannot apply to a stage (None: it can)."""
    why_not = static_kernel_obstacle(device, dtype, quantize)
    if why_not is None and not onednn_available():
        why_not = f"torch {torch.__version__} is built without oneDNN's linear prepacking"
    return why_not


def resolve(kernels: str, device: str, dtype: str, quantize: str | None) -> str:
    """"onednn" or "torch": what a stage with these options runs; a `ConfigError` for "onednn" that cannot apply."""
    if kernels not in KERNELS:
        raise ConfigError(f"stage option 'kernels' must be one of {list(KERNELS)}, got {kernels!r}")
    why_not = obstacle(device, dtype, quantize)
    if kernels == "auto":
        pinned = os.environ.get(KERNELS_ENV) or "auto"
        if pinned not in KERNELS:
            raise ConfigError(f"{KERNELS_ENV} must be one of {list(KERNELS)}, got {pinned!r}")
        return "torch" if pinned == "torch" or why_not else "onednn"
    if kernels == "onednn" and why_not:
        raise ConfigError(f"kernels 'onednn' cannot apply to this stage: {why_not}")
    return kernels


class PrepackedLinear(torch.nn.Module):
    """A frozen `nn.Linear` whose weight lives in oneDNN's blocked layout (inference only)."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        with torch.no_grad():
            self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)
            self.bias = None if linear.bias is None else linear.bias.detach().clone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        out = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, "none", [], "")
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def prepack_linears(model: torch.nn.Module) -> int:
    """Replace every plain fp32 `nn.Linear` of `model` by a `PrepackedLinear`; the number replaced.
    A tied lm_head keeps its embedding (the embedding still reads the original matrix)."""
    replaced = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is torch.nn.Linear and child.weight.dtype == torch.float32:
                setattr(module, name, PrepackedLinear(child))
                replaced += 1
    return replaced
