"""Plan mode: where each stage goes and how much memory it needs, without loading any weights.

    rows = plan_stages(specs); print(format_plan(rows))

Shapes come from the model's config.json when it is local (parameters counted on
the `meta` device: shapes only, no memory), else from the published shapes of the
paper's checkpoints (`experiments.architectures`: LLaMA-3.2-1B, 3.1-8B, 3.1-70B,
LLaMA-2-7B, 13B, llama-68m), else from the stage's declared `params_b` (weights
only). Weight memory = parameters x bytes per parameter of the dtype (fp16 / bf16:
2, fp32: 4), or under nf4 the decoder's projections at 4 bits + one fp32 scale per
64 weights with the embeddings and norms in the compute dtype, plus 10% for buffers
and activations; each model stage also shows its weights at fp16 / bf16 and at nf4.
A model split over several GPUs is counted evenly on each. The KV cache (K and V of
every layer in the stage's dtype) is given per 1,000 tokens and for one sequence
(batch 1) of `context_tokens` tokens (default 4,096, capped at the model's context),
split like the layers; without a shape it is reported as not known. Every stage process
that runs on a CUDA device also holds a CUDA context there: CUDA_CONTEXT_GIB
(0.5 GiB, the usual size of the context plus the kernels torch loads; it grows
with the number of kernels, e.g. with bitsandbytes) per stage and device.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Sequence

from experiments.architectures import NF4_BYTES_PER_WEIGHT, Shape, shape_for, shape_from_config
from pipespec.specs import MODEL_FREE_KINDS, StageSpec, is_local_path

# torch and transformers are imported where a local model is counted or a GPU's memory read: a plan from the
# published shapes (`run.plan=true`) imports neither.

GIB = 1024**3
BYTES_PER_PARAM = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0}
QUANTIZED_BYTES_PER_PARAM = {"int8-dynamic": 1.0, "nf4": NF4_BYTES_PER_WEIGHT}  # where the shape is not known
OVERHEAD = 1.10
CUDA_CONTEXT_GIB = 0.5  # per stage process and CUDA device it uses (context + loaded kernels)
CONTEXT_TOKENS = 4096  # default KV-cache length counted per stage (batch 1): prompt + new tokens
ALTERNATIVES = (("fp16/bf16", None, 2.0), ("nf4", "nf4", 2.0))  # (column, quantize, bytes per param)


@dataclass
class StagePlan:
    index: int
    name: str
    model: str
    devices: list[str]
    precision: str
    params: float | None  # parameters, or None when unknown
    params_source: str
    weights_gib: float | None
    kv_gib_per_1k_tokens: float | None
    kv_tokens: int | None = None  # the context the KV cache is counted for
    kv_gib: float | None = None  # KV cache of one sequence of kv_tokens tokens (batch 1)
    weights_at: dict[str, float | None] = field(default_factory=dict)  # weights GiB at fp16/bf16 and at nf4


def _local_config(model: str) -> dict | None:
    if not is_local_path(model):
        return None
    path = os.path.join(os.path.expanduser(model), "config.json")
    if not os.path.exists(path):
        return None
    with open(path) as handle:
        return json.load(handle)


def count_parameters(model: str) -> int:
    """Parameters of a local model, built on the meta device (no weights read, no memory used)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(os.path.expanduser(model))
    with torch.device("meta"):
        built = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in built.parameters())


def weight_gib(params: float | None, shape: Shape | None, quantize: str | None, bytes_per_param: float) -> float | None:
    """Weights (+10%) of `params` parameters at `bytes_per_param`, or quantized; nf4 with a known shape leaves
    the embeddings and norms (all but the decoder's projections) in the compute dtype."""
    if params is None:
        return None
    if quantize == "nf4" and shape is not None:
        linear = min(shape.linear_params, params)
        total = linear * NF4_BYTES_PER_WEIGHT + (params - linear) * bytes_per_param
    else:
        total = params * QUANTIZED_BYTES_PER_PARAM.get(quantize or "", bytes_per_param)
    return total * OVERHEAD / GIB


def _shape_and_params(spec: StageSpec) -> tuple[Shape | None, float | None, str]:
    config = _local_config(spec.model)
    if config is not None:
        return shape_from_config(config), float(count_parameters(spec.model)), "config.json"
    shape = shape_for(spec.model)
    if shape is not None:
        return shape, float(shape.params), "published shapes"
    if spec.params_b is not None:
        return None, spec.params_b * 1e9, "declared params_b"
    return None, None, "unknown: set params_b"


def plan_stage(index: int, spec: StageSpec, context_tokens: int = CONTEXT_TOKENS) -> StagePlan:
    if spec.kind in MODEL_FREE_KINDS:  # drafters without a model (pipespec.drafters)
        return StagePlan(index, spec.label, spec.kind, ["cpu"], "-", 0, "no model", 0.0, None)
    shape, params, source = _shape_and_params(spec)
    per_value = BYTES_PER_PARAM[spec.dtype]
    kv = shape.kv_bytes_per_token(per_value) if shape is not None else None
    tokens = min(context_tokens, shape.context or context_tokens) if shape is not None else None
    return StagePlan(
        index, spec.label, spec.model, spec.devices, spec.quantize or spec.dtype, params, source,
        weight_gib(params, shape, spec.quantize, per_value),
        kv * 1000 / GIB if kv is not None else None,
        tokens if kv is not None else None,
        kv * tokens / GIB if kv is not None else None,
        {column: weight_gib(params, shape, quantize, size) for column, quantize, size in ALTERNATIVES},
    )  # fmt: skip


def plan_stages(specs: Sequence[StageSpec], context_tokens: int = CONTEXT_TOKENS) -> list[StagePlan]:
    return [plan_stage(i, spec, context_tokens) for i, spec in enumerate(specs)]


def _add(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a + b


def device_budget(rows: Sequence[StagePlan]) -> dict[str, dict[str, float | None]]:
    """Per device: GiB of weights (+10%), KV cache (per 1k tokens and for the counted context) and CUDA
    contexts, and their total.

    None where some stage on the device has an unknown size (weights) or shape (KV); a split
    stage's weights and KV are counted evenly on each of its devices, its CUDA context on each."""
    out: dict[str, dict[str, float | None]] = {}
    for row in rows:
        for device in row.devices:
            share = lambda v: v / len(row.devices) if v is not None else None  # noqa: E731
            entry = out.setdefault(device, {"weights": 0.0, "kv": 0.0, "kv_per_1k": 0.0, "cuda_context": 0.0})
            entry["weights"] = _add(entry["weights"], share(row.weights_gib))
            entry["kv"] = _add(entry["kv"], share(row.kv_gib) if row.params != 0 else 0.0)
            entry["kv_per_1k"] = _add(entry["kv_per_1k"], share(row.kv_gib_per_1k_tokens) if row.params != 0 else 0.0)
            if device.startswith("cuda"):
                entry["cuda_context"] += CUDA_CONTEXT_GIB
    for entry in out.values():
        entry["total"] = _add(_add(entry["weights"], entry["kv"]), entry["cuda_context"])
    return out


def memory_per_device(rows: Sequence[StagePlan]) -> dict[str, float | None]:
    """Estimated GiB per device (weights + KV + CUDA contexts); None where some part is unknown."""
    return {device: entry["total"] for device, entry in device_budget(rows).items()}


def device_capacity_gib(device: str) -> float | None:
    """Memory of a CUDA device present on this machine, else None."""
    if not device.startswith("cuda"):
        return None
    import torch

    index = int(device.partition(":")[2] or 0)
    if index >= torch.cuda.device_count():
        return None
    return torch.cuda.get_device_properties(index).total_memory / GIB


def _gib(value: float | None) -> str:
    return f"{value:.2f}" if value is not None else "?"


def _stage_lines(rows: Sequence[StagePlan]) -> list[str]:
    lines = [
        f"{'stage':<6}{'name':<18}{'devices':<16}{'precision':<13}{'params':>8}  {'weights GiB':>11}  "
        f"{'fp16/bf16':>9}  {'nf4':>6}  {'KV GiB/1k tok':>13}  model (shapes from)",
    ]
    for row in rows:
        params = f"{row.params / 1e9:.3g}B" if row.params else ("-" if row.params == 0 else "?")
        at = [_gib(row.weights_at[c]) if row.weights_at else "-" for c, _, _ in ALTERNATIVES]
        kv = "-" if row.params == 0 else _gib(row.kv_gib_per_1k_tokens)
        lines.append(
            f"{row.index:<6}{row.name[:17]:<18}{','.join(row.devices):<16}{row.precision:<13}{params:>8}  "
            f"{_gib(row.weights_gib):>11}  {at[0]:>9}  {at[1]:>6}  {kv:>13}  "
            f"{row.model} ({row.params_source})"
        )
    return lines


def _fits(device: str, entry: dict) -> str:
    capacity = device_capacity_gib(device)
    if capacity is None:
        return "" if device == "cpu" else " (device not present on this machine)"
    known = entry["weights"] if entry["kv"] is None else entry["total"]  # a lower bound without the KV cache
    if known is None:
        return f" of {capacity:.1f} GiB"
    if entry["kv"] is None:
        return f" of {capacity:.1f} GiB" + (" DOES NOT FIT" if known >= capacity else " (fits without the KV cache)")
    return f" of {capacity:.1f} GiB" + (" fits" if known < capacity else " DOES NOT FIT")


def format_plan(rows: Sequence[StagePlan]) -> str:
    lines = _stage_lines(rows) + [""]
    tokens = sorted({row.kv_tokens for row in rows if row.kv_tokens})
    context = f"KV cache per 1k tokens and for {'/'.join(map(str, tokens))} tokens at batch 1" if tokens else "KV cache"
    lines.append(f"per device (weights + 10%, {context}, {CUDA_CONTEXT_GIB} GiB CUDA context per stage on a GPU):")
    budget = device_budget(rows)
    index = lambda d: int(d.partition(":")[2]) if d.partition(":")[2].isdigit() else 0  # noqa: E731
    order = sorted(budget, key=lambda d: (d.startswith("cuda"), index(d), d))  # the CPU, then cuda:0, cuda:1, ...
    for device, entry in ((d, budget[d]) for d in order):
        weights, kv, total = entry["weights"], entry["kv"], entry["total"]
        kv_text = (f"KV {_gib(entry['kv_per_1k'])} GiB/1k tok ({_gib(kv)} GiB)" if kv is not None
                   else "KV not known (no config.json or published shape: set params_b for weights only)")
        summed = f" = {_gib(total)} GiB" if total is not None else ""
        context_text = f" + CUDA context {entry['cuda_context']:.2f} GiB" if device.startswith("cuda") else ""
        fits = _fits(device, entry)
        lines.append(f"  {device:<10}weights {_gib(weights)} GiB + {kv_text}{context_text}{summed}{fits}")
    return "\n".join(lines)
