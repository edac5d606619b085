"""Stage models: loading what a stage spec (`pipespec.specs.StageSpec`) names, and the primitives
a stage runs it with.

The model primitives follow gpt-fast: explicit positions and an explicit KV
cache whose length is tracked beside it. A `CausalLMRunner` holds the K/V of a
prefix of the committed sequence; `forward` feeds the rest of that sequence plus
the offered drafts in one forward pass and `truncate` crops the cache back to exactly the
tokens that stay committed (`forward_tree` and `keep_path` do the same for a token tree).
"""

from __future__ import annotations

from typing import Any, Sequence

from pipespec.errors import ConfigError
from pipespec.specs import StageSpec, check_target_options, place_devices, resolve_model_path


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


def load_tokenizer(model: str):
    from transformers import AutoTokenizer

    path = resolve_model_path(model)
    try:
        return AutoTokenizer.from_pretrained(path)
    except OSError as error:
        raise ConfigError(f"cannot load the tokenizer of {model!r}: {str(error).splitlines()[0]}") from None


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


def resolved_kernels(spec: StageSpec) -> str | None:
    """What the stage's linears run: "onednn" or "torch" (None: a model-free stage); for kernels "auto" the
    faster of the two on this machine, measured once and cached (`pipespec.kernels`); "compiled" for a
    stage with `compile: true` (its package's own, prepacked by inductor: `pipespec.exported`)."""
    if spec.kind != "hf":
        return None
    if spec.compile:
        return "compiled"
    from pipespec.kernels import resolve

    return resolve(spec, measure_kernel_choice)


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


def check_compilers(specs: Sequence[StageSpec]) -> None:
    """Refuse `compile: true` where torch cannot compile here (`pipespec.compiled.compiler_obstacle`)."""
    compiled = [spec.label for spec in specs if spec.compile]
    if compiled:
        from pipespec.compiled import compiler_obstacle

        why_not = compiler_obstacle()
        if why_not:
            raise ConfigError(f"stage option 'compile' of stage(s) {compiled} cannot apply: {why_not}")


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


def tree_attention(pending: int, tree):
    """(pending + nodes) x (pending + nodes) bool: which fed token may attend to which, when `pending`
    committed tokens and then the nodes of the token `tree` are fed in one pass: the pending tokens
    causally, a node every pending token, its ancestors and itself (the cached prefix: every fed token)."""
    import torch

    fed = pending + len(tree)
    allowed = torch.zeros(fed, fed, dtype=torch.bool)
    allowed[:, :pending] = torch.ones(fed, pending, dtype=torch.bool)
    allowed[:pending, :pending] = torch.ones(pending, pending, dtype=torch.bool).tril()
    for i, parent in enumerate(tree.parents):
        row = pending + i
        if parent != -1:
            allowed[row, pending:] = allowed[pending + parent, pending:]
        allowed[row, row] = True
    return allowed


def additive_mask(allowed, dtype):
    """A bool attention mask as an additive float one: 0 where allowed, the dtype's minimum elsewhere."""
    import torch

    return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)


class CausalLMRunner:
    """One sequence of one causal LM: the KV cache and how many tokens it holds."""

    def __init__(self, model):
        self.model = model
        self.device = next(model.parameters()).device if any(True for _ in model.parameters()) else "cpu"
        self.cache = None
        self.cache_length = 0
        self.tree_base = 0  # after `forward_tree`: the length of the sequence its tree extends
        # a compiled model (`pipespec.compiled`) guards on the cache's layout: the first call's K/V (views of
        # the projections) are made contiguous, so every later call sees a contiguous cache or a crop of one
        self.canonical_cache = bool(getattr(model, "pipespec_compiled", False))

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
        pending = self._pending(sequence)
        fed = pending + list(candidates)
        positions = list(range(self.cache_length, self.cache_length + len(fed)))
        logits = self._call(fed, positions, None, len(candidates) + 1)
        self._after_call(len(fed))
        return logits

    def forward_tree(self, sequence: Sequence[int], tree):
        """Logits after the last committed token and after each node of the token `tree`
        (`pipespec.tree.DraftTree`, rooted after `sequence`): len(tree) + 1 rows.

        Feeds `sequence[cache_length:]` at their positions and every node at position len(sequence) +
        its depth - 1, under a mask where each node sees the committed prefix and its own ancestors only
        (`tree_attention`). The cache then holds every node: `keep_path` keeps the accepted path's.
        """
        pending = self._pending(sequence)
        base, past = len(sequence), self.cache_length
        positions = list(range(past, base)) + [base + d - 1 for d in tree.depths()]
        fed = pending + list(tree.tokens)
        logits = self._call(fed, positions, tree_attention(len(pending), tree), len(tree) + 1)
        self._after_call(len(fed))
        self.tree_base = base
        return logits

    def keep_path(self, nodes: Sequence[int]) -> None:
        """After `forward_tree`: keep the K/V of the committed prefix and of the accepted path's `nodes`
        (root to leaf) only, moved to the positions right after the prefix, and crop the rest."""
        base = self.tree_base
        if nodes:
            self._move_rows(base, [base + n for n in nodes])
        self.truncate(base + len(nodes))

    def _pending(self, sequence: Sequence[int]) -> list[int]:
        pending = list(sequence[self.cache_length :])
        if not pending:
            raise RuntimeError("the last committed token must not be in the cache yet")
        return pending

    def _call(self, fed: list[int], positions: list[int], among_fed, keep: int):
        """The model on `fed` tokens at `positions` after the cache (K/V appended to it): float logits of the
        last `keep` rows. `among_fed` (None: causal) is which fed token may see which (`tree_attention`):
        a 4D additive mask that also opens the whole cached prefix (sdpa and eager attention add it)."""
        import torch

        input_ids = torch.tensor([fed], dtype=torch.long, device=self.device)
        mask = None
        if among_fed is not None:
            dtype = getattr(self.model, "dtype", torch.float32)  # the attention's: float16 / bfloat16 on GPUs
            allowed = torch.cat([torch.ones(len(fed), self.cache_length, dtype=torch.bool), among_fed], dim=1)
            mask = additive_mask(allowed, dtype)[None, None].to(self.device)
        with torch.inference_mode():
            out = self.model(
                input_ids=input_ids,
                position_ids=torch.tensor([positions], dtype=torch.long, device=self.device),
                attention_mask=mask,
                cache=self.cache,
                use_cache=True,
                logits_to_keep=keep,
            )
        return out.logits[0].float()

    def _after_call(self, fed: int) -> None:
        import torch

        if self.cache_length == 0 and self.canonical_cache:
            with torch.inference_mode():  # inference tensors, as the cache's others (the guards check it)
                for layer in self.cache.layers:
                    layer.keys, layer.values = layer.keys.contiguous(), layer.values.contiguous()
        self.cache_length += fed

    def _move_rows(self, base: int, source: list[int]) -> None:
        """The K/V at cache positions `source` copied to positions base, base + 1, ..."""
        import torch

        rows = torch.tensor(source, dtype=torch.long)
        with torch.inference_mode():
            for layer in self.cache.layers:  # transformers' DynamicCache layers: [batch, heads, tokens, dim]
                for name in ("keys", "values"):
                    states = getattr(layer, name)  # a split model's layers live on several devices
                    states[..., base : base + len(source), :] = states.index_select(-2, rows.to(states.device))

    def cached_length(self) -> int:
        """The cache's own idea of its length (tests compare it with `cache_length`)."""
        return self.cache.get_seq_length() if self.cache is not None else 0


def measure_kernel_choice(spec: StageSpec, sizes=None, repeats: int | None = None) -> dict:
    """Time the stage's model on torch's kernels and prepacked for oneDNN (`pipespec.kernels`), in alternating
    sweeps of `sizes` tokens fed on a warm cache with the stage's thread count; the faster and the medians."""
    from dataclasses import replace

    import torch

    from pipespec import kernels
    from pipespec.timing import interleaved_step_times, medians

    sizes = kernels.MEASURED_SIZES if sizes is None else tuple(sizes)
    repeats = kernels.MEASURED_REPEATS if repeats is None else repeats
    threads = torch.get_num_threads()
    torch.set_num_threads(spec.threads)
    try:
        model = load_model(replace(spec, kernels="torch", compile=False))
        switch = kernels.LinearSwitch(model)
        runner = CausalLMRunner(model)
        vocab = model.get_input_embeddings().num_embeddings
        context = [(7 * i + 3) % vocab for i in range(kernels.CONTEXT_TOKENS)]
        times = interleaved_step_times({"torch": runner, "onednn": runner}, context, max(sizes), repeats,
                                       before=lambda key: switch.use(key == "onednn"), sizes=sizes)  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    step_s = {key: medians(per_size) for key, per_size in times.items()}
    return {"choice": kernels.choose(step_s), "sizes": list(sizes), "step_s": step_s, "repeats": repeats}
