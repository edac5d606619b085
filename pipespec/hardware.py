"""The CPU a measurement ran on: a VM's name ("AMD EPYC") hides generations whose int8 and few-row fp32
matrix products differ by 2x, so also its family, model and vector extensions."""

from __future__ import annotations

import platform
from typing import Any

VECTOR_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16")


def cpu_info() -> dict[str, Any]:
    """The CPU behind a measurement: a VM's name ("AMD EPYC") hides generations whose int8 and
    few-row fp32 matrix products differ by 2x, so also family, model and vector extensions."""
    import torch

    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if not line.strip():
                    break  # the first processor is enough
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    flags = set(fields.get("flags", "").split())
    return {
        "name": fields.get("model name") or platform.processor() or platform.machine(),
        "family": fields.get("cpu family"),
        "model": fields.get("model"),
        "vector_extensions": [f for f in VECTOR_FLAGS if f in flags],
        "torch_capability": torch.backends.cpu.get_cpu_capability(),
    }
