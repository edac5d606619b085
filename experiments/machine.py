"""The machine behind a measurement, and what a result records of it (torch imported inside).

- `cpu_info` (`pipespec.hardware`): CPU name, family, model, vector extensions, torch's capability;
- `environment(specs)`: what a run directory's env.json holds (libraries, CPU, GPUs, threads, kernels);
- `machine_facts(specs)`: what a machine profile records (CPU, threads per stage, library versions);
- `stage_identity(spec)`: what a profile records of a stage, so that it is never read for another one.
"""

from __future__ import annotations

import os
import platform
import socket
from typing import Any, Sequence

from pipespec.gpu import gpu_facts
from pipespec.hardware import cpu_info
from pipespec.models import resolved_kernels
from pipespec.specs import MODEL_FREE_KINDS, StageSpec

def environment(specs) -> dict[str, Any]:
    """Library versions, CPU and GPU names, CUDA / driver / bitsandbytes versions (None where absent),
    thread counts: what a reader needs to compare runs."""
    import torch
    import transformers


    cpu = cpu_info()
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu": cpu["name"],
        "cpu_info": cpu,
        "cpu_count": os.cpu_count(),
        **gpu_facts(),  # gpus, cuda, driver, bitsandbytes, ...
        "threads_per_stage": [spec.threads for spec in specs],
        "devices_per_stage": [spec.device for spec in specs],
        "kernels_per_stage": [resolved_kernels(spec) for spec in specs],  # onednn | torch | compiled | None (model-free)
    }


def machine_facts(specs: Sequence[StageSpec]) -> dict:
    import torch
    import transformers

    return {
        "cpu": cpu_info(),
        "cpu_count": os.cpu_count(),
        "hostname": socket.gethostname(),
        "threads_per_stage": [s.threads for s in specs],
        "libraries": {"python": platform.python_version(), "torch": torch.__version__,
                      "transformers": transformers.__version__},
    }  # fmt: skip


def stage_identity(spec: StageSpec) -> dict[str, Any]:
    """What a profile's stage entry records of a stage (`analysis.profile.IDENTITY_KEYS`)."""
    return {"kind": spec.kind, "model": spec.model, "quantize": spec.quantize, "dtype": spec.dtype,
            "threads": spec.threads, "kernels": resolved_kernels(spec),
            "vocab_limit": None if spec.kind in MODEL_FREE_KINDS else spec.vocab_limit or 0,
            "compile": None if spec.kind in MODEL_FREE_KINDS else spec.compile}  # fmt: skip
