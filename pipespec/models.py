"""Stage models: what each pipeline stage runs, and the primitives it runs them with.

A stage is either a Hugging Face causal LM (hub id or local directory, with a
dtype, a device and optional int8 dynamic or nf4 quantization) or a model-free
drafter (`pipespec.drafters`: prompt lookup continues the latest n-gram match of
prompt + output; a suffix drafter continues the longest suffix match in the prompt,
earlier outputs and corpus files).

The model primitives follow gpt-fast: explicit positions and an explicit KV
cache whose length is tracked beside it. A `CausalLMRunner` holds the K/V of a
prefix of the committed sequence; `verify` feeds the rest of that sequence plus
the offered drafts in one forward pass and crops the cache back to exactly the
tokens that stay committed.
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
            from pipespec.drafters import check_suffix_options

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


def visible_gpus() -> int:
    """CUDA devices this process can use (0 with a CPU-only torch)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def assign_devices(specs: Sequence[StageSpec], n_gpus: int | None = None) -> list[StageSpec]:
    """The specs with `auto` devices resolved by `place_devices` (and checked again where resolved)."""
    from dataclasses import replace

    if not any(spec.device == "auto" for spec in specs):
        return list(specs)
    placed = place_devices([spec.device for spec in specs], visible_gpus() if n_gpus is None else n_gpus)
    out = []
    for spec, device in zip(specs, placed):
        if device != spec.device:
            spec = replace(spec, device=device)
            spec.validate(n_gpus is None)
        out.append(spec)
    return out


def load_kwargs(spec: StageSpec, dtype, total_memory=None) -> dict[str, Any]:
    """from_pretrained's placement arguments: straight onto one device, or split over the listed GPUs.

    A single CUDA device gets `device_map={"": device}`: the weights are read onto that GPU,
    not through host RAM or GPU 0. `total_memory(i)` gives GPU i's bytes (for a split)."""
    kwargs: dict[str, Any] = {"dtype": dtype}
    devices = spec.devices
    if len(devices) == 1 and devices[0].startswith("cuda"):
        kwargs["device_map"] = {"": cuda_device(devices[0])}
    elif len(devices) > 1:
        # split over the listed GPUs only: accelerate places layers on the devices max_memory names
        kwargs["device_map"] = "auto"
        wanted = sorted({int(d.partition(":")[2] or 0) for d in devices})
        kwargs["max_memory"] = {i: total_memory(i) for i in wanted}
    return kwargs


def cuda_device(device: str) -> str:
    """'cuda' is 'cuda:0': a stage always names the GPU it binds."""
    return device if ":" in device else f"{device}:0"


def bind_device(spec: StageSpec) -> None:
    """Make the stage's (first) GPU this process's current device: no context or allocation lands on GPU 0."""
    first = spec.devices[0]
    if first.startswith("cuda"):
        import torch

        torch.cuda.set_device(torch.device(cuda_device(first)))


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


def load_tokenizer(model: str):
    from transformers import AutoTokenizer

    path = resolve_model_path(model)
    try:
        return AutoTokenizer.from_pretrained(path)
    except OSError as error:
        raise ConfigError(f"cannot load the tokenizer of {model!r}: {str(error).splitlines()[0]}") from None


def check_target_options(specs: Sequence[StageSpec]) -> None:
    """Refuse drafter-only options on the last stage (the target): its logits are the output's definition."""
    if specs and specs[-1].vocab_limit is not None:
        raise ConfigError(
            f"stage option 'vocab_limit' is for drafters only: the last stage {specs[-1].label!r} is the target, "
            "whose full vocabulary defines the output"
        )


def check_vocab_limits(specs: Sequence[StageSpec]) -> None:
    """A drafter's vocab_limit may not exceed its model's vocabulary (config.json's vocab_size, where local)."""
    from transformers import AutoConfig

    for spec in specs:
        if spec.kind != "hf" or spec.vocab_limit is None:
            continue
        try:
            vocab = getattr(AutoConfig.from_pretrained(resolve_model_path(spec.model)), "vocab_size", None)
        except OSError:
            continue  # not readable here: load_model checks against the loaded lm_head
        if vocab is not None and spec.vocab_limit > vocab:
            raise ConfigError(vocab_limit_too_large(spec, vocab))


def vocab_limit_too_large(spec: StageSpec, vocab: int) -> str:
    return (
        f"stage {spec.label!r}: vocab_limit {spec.vocab_limit} is above the vocabulary size {vocab} of model "
        f"{spec.model!r}"
    )


def check_shared_vocabulary(specs: Sequence[StageSpec]):
    """Refuse a hierarchy whose model stages do not share the target's tokenizer; return the target's."""
    model_specs = [s for s in specs if s.kind == "hf"]
    if not model_specs:
        raise ConfigError("the last stage (the target) must be a model (kind 'hf')")
    if specs[-1].kind != "hf":
        raise ConfigError("the last stage (the target) must be a model (kind 'hf'), not prompt_lookup")
    check_target_options(specs)
    check_vocab_limits(specs)
    target = load_tokenizer(specs[-1].model)
    target_vocab = target.get_vocab()
    for spec in model_specs[:-1]:
        if spec.model == specs[-1].model:
            continue  # the same model (e.g. quantized): same tokenizer by construction
        vocab = load_tokenizer(spec.model).get_vocab()
        if vocab != target_vocab:
            differing = len(set(vocab.items()) ^ set(target_vocab.items()))
            raise ConfigError(
                f"stage {spec.label!r} does not share the target's tokenizer: vocabulary sizes "
                f"{len(vocab)} vs {len(target_vocab)}, {differing} differing entries"
            )
    return target


def static_kernel_obstacle(device: str, dtype: str, quantize: str | None) -> str | None:
    """Why oneDNN prepacking cannot apply to a stage with these options (None: it can, if torch has oneDNN)."""
    if not str(device).startswith("cpu"):
        return f"device {device} (prepacking is for the CPU)"
    if dtype != "float32":
        return f"dtype {dtype} (prepacking is for float32)"
    if quantize is not None:
        return f"quantize {quantize} (quantized linears keep their own kernels)"
    return None


def resolved_kernels(spec: StageSpec) -> str | None:
    """What the stage's linears run: "onednn" or "torch" (None: a model-free stage)."""
    if spec.kind != "hf":
        return None
    from pipespec.kernels import resolve

    return resolve(spec.kernels, spec.device, spec.dtype, spec.quantize)


def load_model(spec: StageSpec):
    """Load a stage's model for inference (eval mode, dtype, device, quantization)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # stage processes load quietly; their bars only interleave with the run's
    path = resolve_model_path(spec.model)
    if spec.device == "auto":  # not placed by the driver (a direct call): one whole GPU, or the CPU
        spec = assign_devices([spec])[0]
    bind_device(spec)
    kwargs = load_kwargs(spec, getattr(torch, spec.dtype), lambda i: torch.cuda.get_device_properties(i).total_memory)
    if spec.quantize == "nf4":
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=getattr(torch, spec.dtype)
        )
    kwargs.update(spec.extra)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except OSError as error:
        raise ConfigError(f"cannot load model {spec.model!r}: {str(error).splitlines()[0]}") from None
    if "device_map" not in kwargs:
        model.to(spec.device)
    model.eval()
    if spec.vocab_limit is not None:
        limit_vocabulary(model, spec)  # before quantization and prepacking: the reduced head is a plain Linear
    if spec.quantize == "int8-dynamic":
        model = quantize_int8_dynamic(model)
    if resolved_kernels(spec) == "onednn":
        from pipespec.kernels import prepack_linears

        prepack_linears(model)
    return model


def limit_vocabulary(model, spec: StageSpec) -> None:
    """Give `model` a `VocabLimitedHead` over ids < spec.vocab_limit (the input embedding stays whole)."""
    import torch

    from pipespec.vocab import VocabLimitedHead

    head = model.get_output_embeddings()
    if type(head) is not torch.nn.Linear:
        raise ConfigError(
            f"stage {spec.label!r}: vocab_limit needs an nn.Linear lm_head, model {spec.model!r} has "
            f"{type(head).__name__}"
        )
    if spec.vocab_limit > head.out_features:
        raise ConfigError(vocab_limit_too_large(spec, head.out_features))
    if spec.vocab_limit < head.out_features:
        model.set_output_embeddings(VocabLimitedHead(head, spec.vocab_limit))


def quantize_int8_dynamic(model):
    """int8 weights, activations quantized per call (per-channel), for every Linear layer."""
    import warnings

    import torch
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*quantiz.*deprecated", category=UserWarning)
        return quantize_dynamic(model, {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8)


def eos_token_ids(model_path: str) -> list[int]:
    """The target's end-of-sequence ids, as its generation config (or config) declares them."""
    from transformers import AutoConfig, GenerationConfig

    path = resolve_model_path(model_path)
    try:
        eos = GenerationConfig.from_pretrained(path).eos_token_id
    except OSError:
        eos = None
    if eos is None:
        eos = AutoConfig.from_pretrained(path).eos_token_id
    if eos is None:
        return []
    return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]


def context_length(model_path: str) -> int | None:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(resolve_model_path(model_path))
    return getattr(config, "max_position_embeddings", None)


class CausalLMRunner:
    """One sequence of one causal LM: the KV cache and how many tokens it holds."""

    def __init__(self, model):
        self.model = model
        self.device = next(model.parameters()).device if any(True for _ in model.parameters()) else "cpu"
        self.cache = None
        self.cache_length = 0

    def start(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.model.config)
        self.cache_length = 0

    def truncate(self, valid_tokens: int) -> None:
        """Keep the K/V of the first `valid_tokens` tokens only (crop takes a negative count)."""
        drop = self.cache_length - valid_tokens
        if drop > 0:
            self.cache.crop(-drop)
            self.cache_length = valid_tokens

    def forward(self, sequence: Sequence[int], candidates: Sequence[int]):
        """Logits after the last committed token and after each candidate: len(candidates) + 1 rows.

        Feeds `sequence[cache_length:] + candidates` at their explicit positions.
        """
        import torch

        pending = list(sequence[self.cache_length :])
        if not pending:
            raise RuntimeError("the last committed token must not be in the cache yet")
        fed = pending + list(candidates)
        input_ids = torch.tensor([fed], dtype=torch.long, device=self.device)
        positions = torch.arange(self.cache_length, self.cache_length + len(fed), device=self.device)
        with torch.inference_mode():
            out = self.model(
                input_ids=input_ids,
                position_ids=positions.unsqueeze(0),
                cache=self.cache,
                use_cache=True,
                logits_to_keep=len(candidates) + 1,
            )
        self.cache_length += len(fed)
        return out.logits[0].float()

    def cached_length(self) -> int:
        """The cache's own idea of its length (tests compare it with `cache_length`)."""
        return self.cache.get_seq_length() if self.cache is not None else 0

