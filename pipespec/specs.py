"""Stage specs: what each pipeline stage runs, every option checked once, without torch.

A stage is a Hugging Face causal LM (a hub id or a local directory, with a dtype, a device, optional
int8 dynamic or nf4 quantization, kernels and a vocabulary limit) or a model-free drafter
(`pipespec.drafters`: prompt lookup, or a suffix index). `StageSpec.from_any` turns a string or a
mapping into a validated spec, a `ConfigError` naming the option otherwise. Loading the models is
`pipespec.models`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping, Sequence

from pipespec.errors import ConfigError

KINDS = ("hf", "prompt_lookup", "suffix")
MODEL_FREE_KINDS = ("prompt_lookup", "suffix")  # drafters without a model: pipespec.drafters
DTYPES = ("float32", "float16", "bfloat16")
QUANTIZATIONS = (None, "int8-dynamic", "nf4")
KERNELS = ("auto", "onednn", "torch")  # fp32 CPU linears: pipespec.kernels
KERNELS_ENV = "PIPESPEC_KERNELS"  # "torch": "auto" means torch's kernels (pipespec.kernels)


@dataclass
class StageSpec:
    """What one stage runs. `model` is a hub id or a local directory (kind "hf")."""

    model: str | None = None
    kind: str = "hf"
    dtype: str = "float32"
    device: str = "cpu"
    quantize: str | None = None
    name: str | None = None
    threads: int = 1
    kernels: str = "auto"  # auto | onednn | torch: fp32 CPU linears prepacked for oneDNN (pipespec.kernels)
    vocab_limit: int | None = None  # drafters (kind hf): lm_head over ids < N only, logit -inf above (VocabLimitedHead)
    ngram_size: int = 3  # prompt_lookup: longest n-gram to match
    max_proposal: int = 8  # prompt_lookup, suffix: most tokens proposed per step
    max_depth: int = 8  # suffix: longest suffix matched (and n-gram depth indexed)
    min_match: int = 1  # suffix: shortest suffix match that may propose
    min_count: int = 1  # suffix: stop where the continuation was seen fewer times
    confidence: float = 0.0  # suffix: stop once the product of continuation shares falls below (0 = off)
    max_index_tokens: int = 65536  # suffix: tokens of earlier outputs + corpus kept (oldest outputs evicted)
    corpus: list | None = None  # suffix: files or folders (.py/.txt/.md) tokenized with `model`'s tokenizer
    tree_nodes: int = 0  # prompt_lookup, suffix: propose token trees of up to N nodes (0 = a chain)
    compile: bool = False  # kind hf: the step exported and compiled ahead of time, cached (pipespec.exported)
    extra: dict = field(default_factory=dict)  # passed to from_pretrained (e.g. device_map)
    params_b: float | None = None  # declared size in billions: plan mode's estimate when weights are not local

    @classmethod
    def from_any(cls, value: "StageSpec | str | Mapping[str, Any]", check_devices: bool = True) -> "StageSpec":
        if isinstance(value, StageSpec):
            spec = value
        elif isinstance(value, str):
            spec = cls(kind="prompt_lookup") if value == "prompt_lookup" else cls(model=value)
        elif isinstance(value, Mapping):
            known = {f.name for f in fields(cls)}
            unknown = sorted(set(value) - known)
            if unknown:
                raise ConfigError(f"unknown stage option(s) {unknown}; expected some of {sorted(known)}")
            spec = cls(**{k: v for k, v in value.items()})
        else:
            raise ConfigError(f"a stage must be a model id, a path or a mapping, got {type(value).__name__}")
        spec.validate(check_devices)
        return spec

    @property
    def devices(self) -> list[str]:
        """`device` may list several GPUs ("cuda:2,cuda:3"): the model is split over them."""
        return [d.strip() for d in str(self.device).split(",")]

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        if self.kind == "prompt_lookup":
            return f"prompt_lookup(n={self.ngram_size})"
        if self.kind == "suffix":
            return f"suffix(depth={self.max_depth})"
        base = Path(str(self.model)).name or str(self.model)
        tags = [self.quantize] if self.quantize else []
        if self.vocab_limit is not None:
            tags.append(f"vocab{self.vocab_limit}")
        return f"{base}[{','.join(tags)}]" if tags else base

    def validate(self, check_devices: bool = True) -> None:
        """Check every option; `check_devices=False` (plan mode) skips asking whether the devices exist."""
        if self.kind not in KINDS:
            raise ConfigError(f"stage kind must be one of {list(KINDS)}, got {self.kind!r}")
        check_tree_nodes(self)
        check_compile_option(self)
        if self.vocab_limit is not None and self.kind != "hf":
            raise ConfigError(
                f"stage option 'vocab_limit' is for model stages (kind 'hf'): a {self.kind} stage has no lm_head"
            )
        if self.kind == "hf":
            if not self.model:
                raise ConfigError("stage option 'model' is required for kind 'hf' (a hub id or a local directory)")
            if self.dtype not in DTYPES:
                raise ConfigError(f"stage option 'dtype' must be one of {list(DTYPES)}, got {self.dtype!r}")
            if self.quantize not in QUANTIZATIONS:
                raise ConfigError(
                    f"stage option 'quantize' must be one of {list(QUANTIZATIONS)}, got {self.quantize!r}"
                )
            if self.quantize == "int8-dynamic" and not self.device.startswith("cpu"):
                raise ConfigError("quantize 'int8-dynamic' runs on the CPU only: set device: cpu")
            for device in self.devices:
                _check_device(device, check_devices)
            if self.quantize == "nf4":
                _check_nf4(self.devices, check_devices)
            if self.kernels not in KERNELS:
                raise ConfigError(f"stage option 'kernels' must be one of {list(KERNELS)}, got {self.kernels!r}")
            why_not = static_kernel_obstacle(self.device, self.dtype, self.quantize)
            if self.kernels == "onednn" and why_not:
                raise ConfigError(f"stage option kernels 'onednn' cannot apply: {why_not}")
            if len(self.devices) > 1 and not all(d.startswith("cuda") for d in self.devices):
                raise ConfigError(f"a model split over several devices needs CUDA devices, got {self.device!r}")
            limit = self.vocab_limit
            if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
                raise ConfigError(
                    f"stage option 'vocab_limit' must be an integer >= 1 (the lm_head keeps ids 0..N-1) or null, "
                    f"got {limit!r}"
                )
        elif self.kind == "prompt_lookup":
            if self.ngram_size < 1 or self.max_proposal < 1:
                raise ConfigError("prompt_lookup needs ngram_size >= 1 and max_proposal >= 1")
        else:
            check_suffix_options(
                self.max_proposal, self.max_depth, self.min_match, self.min_count, self.confidence, self.max_index_tokens
            )
            if self.corpus is not None:
                if isinstance(self.corpus, str) or not all(isinstance(p, str) for p in self.corpus) or not self.corpus:
                    raise ConfigError(f"suffix stage option 'corpus' must be a list of paths, got {self.corpus!r}")
                if not self.model:
                    raise ConfigError(
                        "suffix stage option 'corpus' needs 'model': the target, whose tokenizer reads the files"
                    )
        if self.threads < 1:
            raise ConfigError(f"stage option 'threads' must be >= 1, got {self.threads}")


def check_tree_nodes(spec: StageSpec, context: int | None = None) -> None:
    """`tree_nodes`: an integer >= 0, for model-free stages only (their proposals are point masses, which the
    tree rule verifies), and no larger than the target's `context` (tokens) where it is known."""
    value = spec.tree_nodes
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"stage option 'tree_nodes' must be an integer >= 0 (0 = a chain), got {value!r}")
    if value and spec.kind not in MODEL_FREE_KINDS:
        raise ConfigError(f"stage option 'tree_nodes' is for model-free stages ({' or '.join(MODEL_FREE_KINDS)}): "
                          f"stage {spec.label!r} is a model, whose drafts are verified as a chain")  # fmt: skip
    if value and context is not None and value >= context:
        raise ConfigError(f"stage option 'tree_nodes' ({value}) of stage {spec.label!r} does not fit the target's "
                          f"context of {context} tokens")  # fmt: skip


def trees_fed(specs: Sequence[StageSpec], index: int) -> int:
    """The nodes of the token trees stage `index` is fed: its drafter's `tree_nodes` (0: chains)."""
    return specs[index - 1].tree_nodes if index > 0 else 0


def check_compile_option(spec: StageSpec) -> None:
    """`compile`: true or false, for unquantized CPU model stages (pipespec sets inductor up for CPU
    float32 and bfloat16 graphs only; torch.ao's dynamically quantized int8 linears are not compiled)."""
    if not isinstance(spec.compile, bool):
        raise ConfigError(f"stage option 'compile' must be true or false, got {spec.compile!r}")
    if not spec.compile:
        return
    if spec.kind != "hf":
        raise ConfigError(f"stage option 'compile' is for model stages (kind 'hf'): a {spec.kind} stage has no "
                          "model to compile")  # fmt: skip
    if not str(spec.device).startswith("cpu") or spec.quantize is not None:
        raise ConfigError(f"stage option 'compile' runs unquantized CPU stages, not device {spec.device!r} "
                          f"with quantize {spec.quantize!r}")  # fmt: skip


def _check_nf4(devices: Sequence[str], present: bool) -> None:
    """nf4 (bitsandbytes 4-bit) runs on CUDA devices and needs bitsandbytes where the model is loaded."""
    if not all(d.startswith("cuda") or d == "auto" for d in devices):
        raise ConfigError(f"quantize 'nf4' needs CUDA devices, got device {','.join(devices)!r}")
    if present:
        import importlib.util

        if importlib.util.find_spec("bitsandbytes") is None:
            raise ConfigError("quantize 'nf4' needs bitsandbytes, which is not installed: pip install '.[gpu]'")


def _check_device(device: str, present: bool = True) -> None:
    kind, _, index = device.partition(":")
    if kind not in ("cpu", "cuda", "auto") or (index and not index.isdigit()) or (kind == "auto" and index):
        raise ConfigError(
            f"stage option 'device' must be 'cpu', 'cuda[:N]', 'auto' or a list 'cuda:N,cuda:M', got {device!r}"
        )
    if kind == "cuda" and present:
        import torch

        if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
            raise ConfigError(
                f"device {device!r} is not present: this torch ({torch.__version__}) is a CPU-only build; "
                "install a CUDA build of torch"
            )
        if not torch.cuda.is_available():
            raise ConfigError(
                f"device {device!r} is not present: CUDA is not available (torch {torch.__version__} is built for CUDA "
                f"{torch.version.cuda}, but finds no usable GPU or driver)"
            )
        count = torch.cuda.device_count()
        wanted = int(index) if index else 0
        if wanted >= count:
            raise ConfigError(f"device {device!r} is not present (this machine has {count} CUDA device(s))")


def place_devices(devices: Sequence[str], n_gpus: int) -> list[str]:
    """Resolve `auto` stage devices: one whole GPU per auto stage, never one another stage names.

    `devices` holds each stage's `device` option in stage order. Auto stages take, in stage
    order, the GPUs no explicitly placed stage names (cuda:0 first); more auto stages than
    such GPUs share them round-robin, a whole GPU each (a stage is never spread over several
    GPUs). With no GPU at all, auto is the CPU. A pure function of the stage list and the GPU
    count, so the driver and every stage process (external launch) reach the same placement.
    """
    named = {int(d.partition(":")[2] or 0) for device in devices for d in device.split(",") if d.strip().startswith("cuda")}
    free = [i for i in range(n_gpus) if i not in named]
    placed, auto_seen = [], 0
    for stage, device in enumerate(devices):
        if device != "auto":
            placed.append(device)
            continue
        if n_gpus == 0:
            placed.append("cpu")
        elif not free:
            raise ConfigError(
                f"stage {stage} has device 'auto' but every one of the {n_gpus} GPU(s) is named by another stage: "
                "name its device explicitly"
            )
        else:
            placed.append(f"cuda:{free[auto_seen % len(free)]}")
            auto_seen += 1
    return placed


def check_target_options(specs: Sequence[StageSpec]) -> None:
    """Refuse drafter-only options on the last stage (the target): its logits are the output's definition."""
    if specs and specs[-1].vocab_limit is not None:
        raise ConfigError(
            f"stage option 'vocab_limit' is for drafters only: the last stage {specs[-1].label!r} is the target, "
            "whose full vocabulary defines the output"
        )


def static_kernel_obstacle(device: str, dtype: str, quantize: str | None) -> str | None:
    """Why oneDNN prepacking cannot apply to a stage with these options (None: it can, if torch has oneDNN)."""
    if not str(device).startswith("cpu"):
        return f"device {device} (prepacking is for the CPU)"
    if dtype != "float32":
        return f"dtype {dtype} (prepacking is for float32)"
    if quantize is not None:
        return f"quantize {quantize} (quantized linears keep their own kernels)"
    return None


def check_suffix_options(
    max_proposal: int, max_depth: int, min_match: int, min_count: int, confidence: float, max_index_tokens: int
) -> None:
    """One clear error per bad suffix-stage option (StageSpec.validate and SuffixDrafter both call it)."""
    def integer(value) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    for name, value, low in (
        ("max_proposal", max_proposal, 1),
        ("max_depth", max_depth, 1),
        ("min_match", min_match, 1),
        ("min_count", min_count, 1),
        ("max_index_tokens", max_index_tokens, 1),
    ):
        if not integer(value) or value < low:
            raise ConfigError(f"suffix stage option {name!r} must be an integer >= {low}, got {value!r}")
    if min_match > max_depth:
        raise ConfigError(f"suffix stage option 'min_match' ({min_match}) must not exceed 'max_depth' ({max_depth})")
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0 <= confidence < 1:
        raise ConfigError(f"suffix stage option 'confidence' must be a number with 0 <= confidence < 1, got {confidence!r}")


def is_local_path(model: str) -> bool:
    return model.startswith((".", "/", "~")) or os.path.isdir(os.path.expanduser(model))


def resolve_model_path(model: str) -> str:
    """A local directory must exist; a hub id is refused up front when the hub is offline and not cached."""
    if is_local_path(model):
        path = os.path.expanduser(model)
        if not os.path.isdir(path):
            raise ConfigError(f"model path {model!r} does not exist")
        if not os.path.exists(os.path.join(path, "config.json")):
            raise ConfigError(f"model path {model!r} has no config.json: not a Hugging Face model directory")
        return path
    return model
