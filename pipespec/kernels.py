"""Lossless CPU kernels: fp32 linear layers on oneDNN with their weights prepacked once, where that is faster.

torch's default fp32 matrix product (MKL) streams a weight quickly for one row, but on some CPUs
2-9 rows cost nearly per row, so a verification of several drafts costs up to twice a one-token
step. oneDNN's linear with a weight reordered once into its blocked layout
(`torch.ops.mkldnn._reorder_linear_weight` + `_linear_pointwise`, what inductor's CPU freezing
pass uses) reads the weight once for any small row count. Which of the two is faster depends on
the CPU: on an AVX-512 machine prepacking made an 8-token verification cost about one step, on an
AVX2 one a prepacked one-token step was slower than torch's.

The arithmetic is the same fp32 products, summed in another order than MKL's, so logits may differ
from the default kernel in the last bits. Greedy decoding and every speculative strategy of a stage
run the same kernel; `python -m experiments.kernels` measures t(n) of both kernels and checks that
their greedy outputs are identical on real prompts.

A stage's `kernels` option:
- "auto" (the default): where prepacking can apply (CPU, float32, not quantized, a torch built with
  oneDNN), the kernel that is faster for this stage's model on this machine, **measured** once
  (`pipespec.models.measure_kernel_choice`: t(n) of both for a one-token step and verifications of 1, 3 and 7 drafts, in
  alternating sweeps) and cached per machine, library versions, model and thread count under
  `pipespec.cache.cache_root() / "kernels"`; elsewhere torch's;
- "onednn" (an error where it cannot apply) or "torch": as named.
The environment variable PIPESPEC_KERNELS pins what "auto" means without measuring: "torch"
(torch's kernels; the test suite's tiny models) or "onednn" (prepacked wherever it applies);
unset or "auto", "auto" measures.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from pathlib import Path
from typing import Callable

import torch

from pipespec.errors import ConfigError
from pipespec.hardware import cpu_info
from pipespec.specs import KERNELS, KERNELS_ENV, StageSpec, resolve_model_path, static_kernel_obstacle

MEASURED_SIZES = (1, 2, 4, 8)  # tokens fed: a one-token step, verifications of 1, 3 and 7 drafts
MEASURED_REPEATS = 6  # timed sweeps per kernel (medians per size), after an untimed one each
CONTEXT_TOKENS = 64  # the cache the measured steps extend
CHOICE_FORMAT = "pipespec-kernel-choice"


def onednn_available() -> bool:
    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def obstacle(device: str, dtype: str, quantize: str | None) -> str | None:
    """Why oneDNN prepacking cannot apply to a stage (None: it can)."""
    why_not = static_kernel_obstacle(device, dtype, quantize)
    if why_not is None and not onednn_available():
        why_not = f"torch {torch.__version__} is built without oneDNN's linear prepacking"
    return why_not


def pinned_auto() -> str:
    """What PIPESPEC_KERNELS makes "auto" mean: "auto" (measure), "onednn" or "torch"."""
    pinned = os.environ.get(KERNELS_ENV) or "auto"
    if pinned not in KERNELS:
        raise ConfigError(f"{KERNELS_ENV} must be one of {list(KERNELS)}, got {pinned!r}")
    return pinned


def resolve(spec: StageSpec, measure: Callable[[StageSpec], dict]) -> str:
    """"onednn" or "torch": what a model stage runs; a `ConfigError` for "onednn" that cannot apply. "auto"
    where prepacking applies is the cached measured choice (`measure(spec)` measures it when there is none:
    `pipespec.models.measure_kernel_choice`)."""
    if spec.kernels not in KERNELS:
        raise ConfigError(f"stage option 'kernels' must be one of {list(KERNELS)}, got {spec.kernels!r}")
    why_not = obstacle(spec.device, spec.dtype, spec.quantize)
    if spec.kernels == "onednn" and why_not:
        raise ConfigError(f"kernels 'onednn' cannot apply to this stage: {why_not}")
    if spec.kernels != "auto":
        return spec.kernels
    pinned = pinned_auto()
    if why_not or pinned == "torch":
        return "torch"
    if pinned == "onednn":
        return "onednn"
    return cached_choice(spec, measure)["choice"]


# ---- the measured choice ------------------------------------------------------------------------------


def choice_key(spec: StageSpec) -> dict:
    """What a kernel choice depends on: the CPU, the libraries, the model (its directory and config) and
    the stage's threads and vocabulary limit."""
    path = resolve_model_path(spec.model)
    config = Path(path) / "config.json"
    return {
        "cpu": cpu_info(), "torch": torch.__version__, "onednn": onednn_available(),
        "model": os.path.realpath(path) if os.path.isdir(path) else spec.model,
        "config": hashlib.sha256(config.read_bytes()).hexdigest()[:16] if config.is_file() else None,
        "dtype": spec.dtype, "threads": spec.threads, "vocab_limit": spec.vocab_limit,
    }  # fmt: skip


def choice_path(key: dict) -> Path:
    from pipespec.cache import cache_root

    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return cache_root() / "kernels" / f"{digest}.json"


def cached_choice(spec: StageSpec, measure: Callable[[StageSpec], dict]) -> dict:
    """The cached choice record of this stage on this machine, measured (once: other processes wait on a
    lock file and read it) when there is none."""
    key = choice_key(spec)
    path = choice_path(key)
    record = _read_choice(path, key)
    if record is not None:
        return record
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        record = _read_choice(path, key)
        if record is None:
            record = {"format": CHOICE_FORMAT, "key": key, **measure(spec)}
            _write_atomically(path, record)
    return record


def _read_choice(path: Path, key: dict) -> dict | None:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(record, dict) and record.get("format") == CHOICE_FORMAT and record.get("key") == key
    return record if ok and record.get("choice") in ("onednn", "torch") else None


def _write_atomically(path: Path, record: dict) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(temporary, path)


def choose(step_s: dict[str, list[float]]) -> str:
    """The kernel whose summed median t(n) over the measured sizes is smaller (torch's on a tie)."""
    return "onednn" if sum(step_s["onednn"]) < sum(step_s["torch"]) else "torch"


class LinearSwitch:
    """A model's plain fp32 linears and their prepacked twins, either put in place by `use`."""

    def __init__(self, model: torch.nn.Module):
        self.slots = [(module, name, child, PrepackedLinear(child)) for module in list(model.modules())
                      for name, child in list(module.named_children())
                      if type(child) is torch.nn.Linear and child.weight.dtype == torch.float32]  # fmt: skip

    def use(self, prepacked: bool) -> None:
        for module, name, plain, packed in self.slots:
            setattr(module, name, packed if prepacked else plain)


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
    switch = LinearSwitch(model)
    switch.use(prepacked=True)
    return len(switch.slots)
