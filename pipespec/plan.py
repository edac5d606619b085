"""Plan mode: where each stage goes and how much memory it needs, without loading any weights.

    rows = plan_stages(specs); print(format_plan(rows))

Parameters come from the model's config.json when it is local (the model is built
on the `meta` device: shapes only, no memory), else from the stage's declared
`params_b` (hub ids on a machine without the hub, e.g. a Table 2 config checked
on a laptop). Weight memory = parameters x bytes per parameter of the dtype or
quantization, plus 10% for buffers and activations; a model split over several
GPUs is counted evenly on each. The KV cache is reported per 1,000 tokens where
the config is known.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Sequence

from pipespec.models import StageSpec, is_local_path

GIB = 1024**3
BYTES_PER_PARAM = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0}
QUANTIZED_BYTES_PER_PARAM = {"int8-dynamic": 1.0, "nf4": 0.5625}  # nf4: 4 bits + one fp16 scale per 64 weights
OVERHEAD = 1.10


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


def plan_stage(index: int, spec: StageSpec) -> StagePlan:
    if spec.kind == "prompt_lookup":
        return StagePlan(index, spec.label, "prompt lookup (no model)", ["cpu"], "-", 0, "no model", 0.0, None)
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
    return StagePlan(
        index, spec.label, spec.model, spec.devices, precision, params, source, weights,
        kv * 1000 / GIB if kv is not None else None,
    )


def plan_stages(specs: Sequence[StageSpec]) -> list[StagePlan]:
    return [plan_stage(i, spec) for i, spec in enumerate(specs)]


def memory_per_device(rows: Sequence[StagePlan]) -> dict[str, float | None]:
    """Estimated GiB per device; None where some stage on it has an unknown size."""
    totals: dict[str, float | None] = {}
    for row in rows:
        for device in row.devices:
            share = row.weights_gib / len(row.devices) if row.weights_gib is not None else None
            current = totals.get(device, 0.0)
            totals[device] = None if current is None or share is None else current + share
    return totals


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
    lines.append("per device (weights + 10%):")
    for device, total in memory_per_device(rows).items():
        capacity = device_capacity_gib(device)
        fits = "" if capacity is None or total is None else (" fits" if total < capacity else " DOES NOT FIT")
        where = f" of {capacity:.1f} GiB{fits}" if capacity is not None else (
            "" if device == "cpu" else " (device not present on this machine)"
        )
        lines.append(f"  {device:<10}{gib(total):>8} GiB{where}")
    return "\n".join(lines)
