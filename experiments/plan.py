"""Plan mode: where each stage goes and how much memory it needs, without loading any weights.

    rows = plan_stages(specs); print(format_plan(rows))

Parameters come from the model's config.json when it is local (the model is built
on the `meta` device: shapes only, no memory), else from the stage's declared
`params_b` (hub ids on a machine without the hub, e.g. a Table 2 config checked
on a laptop). Weight memory = parameters x bytes per parameter of the dtype or
quantization, plus 10% for buffers and activations; a model split over several
GPUs is counted evenly on each. The KV cache is counted per device for one
sequence (batch 1) of `context_tokens` tokens (default 4,096, capped at the
model's context), split like the layers, where the config is known (local
config.json); for a hub id it is reported as not known. Every stage process
that runs on a CUDA device also holds a CUDA context there: CUDA_CONTEXT_GIB
(0.5 GiB, the usual size of the context plus the kernels torch loads; it grows
with the number of kernels, e.g. with bitsandbytes) per stage and device.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Sequence


from pipespec.specs import MODEL_FREE_KINDS, StageSpec, is_local_path

GIB = 1024**3
BYTES_PER_PARAM = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0}
QUANTIZED_BYTES_PER_PARAM = {"int8-dynamic": 1.0, "nf4": 0.5625}  # nf4: 4 bits + one fp16 scale per 64 weights
OVERHEAD = 1.10
CUDA_CONTEXT_GIB = 0.5  # per stage process and CUDA device it uses (context + loaded kernels)
CONTEXT_TOKENS = 4096  # default KV-cache length counted per stage (batch 1): prompt + new tokens


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


def _kv_bytes_per_token(config: dict, bytes_per_value: float) -> float | None:
    layers = config.get("num_hidden_layers")
    heads = config.get("num_attention_heads")
    hidden = config.get("hidden_size")
    if not (layers and heads and hidden):
        return None
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    return 2 * layers * kv_heads * head_dim * bytes_per_value  # K and V


def plan_stage(index: int, spec: StageSpec, context_tokens: int = CONTEXT_TOKENS) -> StagePlan:
    if spec.kind in MODEL_FREE_KINDS:  # drafters without a model (pipespec.drafters)
        return StagePlan(index, spec.label, f"{spec.kind} (no model)", ["cpu"], "-", 0, "no model", 0.0, None)
    precision = spec.quantize or spec.dtype
    per_param = QUANTIZED_BYTES_PER_PARAM.get(spec.quantize or "", BYTES_PER_PARAM[spec.dtype])
    config = _local_config(spec.model)
    if config is not None:
        params, source = float(count_parameters(spec.model)), "config.json"
    elif spec.params_b is not None:
        params, source = spec.params_b * 1e9, "declared params_b"
    else:
        params, source = None, "unknown: set params_b"
    weights = params * per_param * OVERHEAD / GIB if params is not None else None
    kv = _kv_bytes_per_token(config, BYTES_PER_PARAM[spec.dtype]) if config else None
    tokens = min(context_tokens, config.get("max_position_embeddings") or context_tokens) if config else None
    return StagePlan(
        index, spec.label, spec.model, spec.devices, precision, params, source, weights,
        kv * 1000 / GIB if kv is not None else None,
        tokens if kv is not None else None,
        kv * tokens / GIB if kv is not None else None,
    )


def plan_stages(specs: Sequence[StageSpec], context_tokens: int = CONTEXT_TOKENS) -> list[StagePlan]:
    return [plan_stage(i, spec, context_tokens) for i, spec in enumerate(specs)]


def _add(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a + b


def device_budget(rows: Sequence[StagePlan]) -> dict[str, dict[str, float | None]]:
    """Per device: GiB of weights (+10%), KV cache and CUDA contexts, and their total.

    None where some stage on the device has an unknown size (weights) or shape (KV); a split
    stage's weights and KV are counted evenly on each of its devices, its CUDA context on each."""
    out: dict[str, dict[str, float | None]] = {}
    for row in rows:
        for device in row.devices:
            share = lambda v: v / len(row.devices) if v is not None else None  # noqa: E731
            entry = out.setdefault(device, {"weights": 0.0, "kv": 0.0, "cuda_context": 0.0})
            entry["weights"] = _add(entry["weights"], share(row.weights_gib))
            entry["kv"] = _add(entry["kv"], share(row.kv_gib) if row.params != 0 else 0.0)
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


def format_plan(rows: Sequence[StagePlan]) -> str:
    def gib(value):
        return f"{value:.2f}" if value is not None else "?"

    lines = [
        f"{'stage':<6}{'name':<18}{'devices':<16}{'precision':<14}{'params':>10}  {'weights GiB':>11}  "
        f"{'KV GiB/1k tok':>13}  model",
    ]
    for row in rows:
        params = f"{row.params / 1e9:.3g}B" if row.params else ("-" if row.params == 0 else "?")
        lines.append(
            f"{row.index:<6}{row.name[:17]:<18}{','.join(row.devices):<16}{row.precision:<14}{params:>10}  "
            f"{gib(row.weights_gib):>11}  {gib(row.kv_gib_per_1k_tokens):>13}  {row.model} ({row.params_source})"
        )
    lines.append("")
    tokens = sorted({row.kv_tokens for row in rows if row.kv_tokens})
    context = f"KV cache of {'/'.join(map(str, tokens))} tokens at batch 1" if tokens else "KV cache"
    lines.append(f"per device (weights + 10%, {context}, {CUDA_CONTEXT_GIB} GiB CUDA context per stage on a GPU):")
    for device, entry in device_budget(rows).items():
        capacity = device_capacity_gib(device)
        weights, kv, total = entry["weights"], entry["kv"], entry["total"]
        known = weights if kv is None else total  # a lower bound when the KV cache is not known
        fits = "" if capacity is None or known is None else (
            (" fits" if known < capacity else " DOES NOT FIT") if kv is not None else
            (" DOES NOT FIT" if known >= capacity else " (fits without the KV cache)")
        )
        where = f" of {capacity:.1f} GiB{fits}" if capacity is not None else (
            "" if device == "cpu" else " (device not present on this machine)"
        )
        kv_text = f"KV {gib(kv)} GiB" if kv is not None else "KV not known (no local config.json)"
        summed = f" = {gib(total)} GiB" if total is not None else ""
        context_text = f" + CUDA context {entry['cuda_context']:.2f} GiB" if device.startswith("cuda") else ""
        lines.append(f"  {device:<10}weights {gib(weights)} GiB + {kv_text}{context_text}{summed}{where}")
    return "\n".join(lines)
