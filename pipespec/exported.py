"""Compiled stages (`compile: true`): a model stage's step exported once and compiled ahead of time.

The step is exported by `torch.export` as a pure function (`ExportedStep`): the tokens fed, their
positions, which fed token may see which, how many rows of logits to keep, and the cache's K/V in; those
logits and the fed tokens' K/V out. The number fed, the rows kept and the cache's length are dynamic, so
one graph serves every step the stage loop makes (one token, verifications of any length after
rollbacks, token trees) and nothing compiles while the stage serves. AOTInductor compiles that graph
into a package (C++ kernels, the weights as constants: inductor's freezing prepacks the linears for
oneDNN), checked against the eager model on an example step before it is kept, and cached per machine
(`package_path`: the CPU, torch, transformers, the model's config and weight files, dtype, threads,
vocabulary limit). The first start builds it (about 1.5 minutes for SmolLM2-135M on 2 cores); every later
start loads it in seconds, without loading the model.

`ExportedRunner` is `CausalLMRunner` over a package: its K/V cache is one tensor of the runner's,
[tokens, layers, 2, kv heads, head dim], whose first `cache_length` rows each call reads, so a rollback
is a length and keeping a token tree's path is a copy of rows. Models: causal LMs whose logits are the
output embedding applied to the decoder's last hidden state (Llama, Mistral, Qwen, SmolLM ...); a model
the export or the check refuses is a `ConfigError` naming it, at the stage's start.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from pipespec.errors import ConfigError
from pipespec.models import CausalLMRunner, additive_mask, load_model
from pipespec.specs import StageSpec, resolve_model_path

FORMAT = 1  # of the exported step: a change here makes earlier packages stale
EXAMPLE_PAST, EXAMPLE_FED, EXAMPLE_KEPT = 6, 4, 3  # the export's example sizes (0 and 1 would specialise)
FIRST_ROWS = 1024  # the K/V cache's first allocation, in tokens; doubled when a call needs more
WARM_CONTEXT = 48  # tokens of the warm-up's prefill
TOLERANCE = {"float32": 1e-3, "bfloat16": 5e-2}  # the check's largest |logit difference| / max(1, |logit|)


class ExportedStep(torch.nn.Module):
    """The model's step as a pure function for `torch.export`:

    (input_ids [1, fed], position_ids [1, fed], among_fed [fed, fed] additive mask (which fed token sees
    which; every fed token sees the whole cache), kept [rows] (its length alone: the logits' rows to keep,
    the last ones), past [cache, layers, 2, kv heads, head dim]) -> (logits [rows, vocab], the fed tokens'
    K/V [fed, layers, 2, kv heads, head dim])."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, position_ids, among_fed, kept, past):
        from transformers import DynamicCache

        fed = input_ids.shape[1]
        cache = DynamicCache(config=self.model.config)
        for layer in range(past.shape[1]):
            states = past[:, layer].permute(1, 2, 0, 3)  # [2, heads, cache, dim]
            cache.update(states[0].unsqueeze(0), states[1].unsqueeze(0), layer)
        mask = torch.cat([among_fed.new_zeros(fed, past.shape[0]), among_fed], dim=1)[None, None]
        hidden = self.model.get_decoder()(
            input_ids=input_ids, position_ids=position_ids, attention_mask=mask, cache=cache, use_cache=True
        ).last_hidden_state
        logits = self.model.get_output_embeddings()(hidden[0, -kept.shape[0] :])
        new = torch.stack([torch.stack([layer.keys[0, :, -fed:], layer.values[0, :, -fed:]]) for layer in cache.layers])
        return logits, new.permute(3, 0, 1, 2, 4).contiguous()


def cache_shape(config, rows: int) -> tuple[int, ...]:
    """[rows, layers, 2, kv heads, head dim] of a model config."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return (rows, config.num_hidden_layers, 2, heads, head_dim)


def example_inputs(config, dtype) -> tuple:
    """ExportedStep's inputs for a step of EXAMPLE_FED tokens after EXAMPLE_PAST cached ones."""
    generator = torch.Generator().manual_seed(0)
    fed = torch.randint(0, config.vocab_size, (1, EXAMPLE_FED), generator=generator)
    positions = torch.arange(EXAMPLE_PAST, EXAMPLE_PAST + EXAMPLE_FED)[None]
    among_fed = additive_mask(torch.ones(EXAMPLE_FED, EXAMPLE_FED, dtype=torch.bool).tril(), dtype)
    past = torch.randn(cache_shape(config, EXAMPLE_PAST), generator=generator).to(dtype)
    return fed, positions, among_fed, torch.empty(EXAMPLE_KEPT), past


def dynamic_shapes(config) -> dict:
    from torch.export import Dim

    longest = int(getattr(config, "max_position_embeddings", None) or 1 << 16)
    fed, cache = Dim("fed", min=1, max=longest), Dim("cache", min=0, max=longest)
    return {"input_ids": {1: fed}, "position_ids": {1: fed}, "among_fed": {0: fed, 1: fed},
            "kept": {0: Dim("kept", min=1, max=longest)}, "past": {0: cache}}  # fmt: skip


def package_key(spec: StageSpec) -> dict:
    """What a package depends on: the kernel choice's key (CPU, torch, model config, dtype, threads,
    vocabulary limit), transformers, the weight files and this module's FORMAT."""
    import transformers

    from pipespec.kernels import choice_key

    path = Path(resolve_model_path(spec.model))
    files = sorted(p for suffix in ("*.safetensors", "*.bin") for p in path.glob(suffix)) if path.is_dir() else []
    weights = [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files]
    return {**choice_key(spec), "transformers": transformers.__version__, "weights": weights, "format": FORMAT}


def package_path(spec: StageSpec) -> Path:
    from pipespec.cache import cache_root

    digest = hashlib.sha256(json.dumps(package_key(spec), sort_keys=True).encode()).hexdigest()[:20]
    return cache_root() / "compiled" / f"{digest}.pt2"


def build_package(spec: StageSpec, path: Path, step=None) -> dict:
    """Export the stage's model, compile it with AOTInductor, check it against the eager model, keep it at
    `path` (written beside it, then renamed: a concurrent start never reads half a file). `step(what)` after
    each part (a progress bar). The facts of the build."""
    started = time.perf_counter()
    model = load_model(replace(spec, kernels="torch", compile=False))
    module, dtype = ExportedStep(model).eval(), getattr(torch, spec.dtype)
    example = example_inputs(model.config, dtype)
    partial = path.with_name(f"{path.stem}.{os.getpid()}.partial.pt2")
    try:  # inductor's own cache of the build (as large as the model again) goes with it
        with torch.no_grad(), private_directory("TORCHINDUCTOR_CACHE_DIR", "pipespec_build_"):
            program = torch.export.export(module, example, dynamic_shapes=dynamic_shapes(model.config))
            step and step("export")
            path.parent.mkdir(parents=True, exist_ok=True)
            torch._inductor.aoti_compile_and_package(program, package_path=str(partial),
                                                     inductor_configs={"freezing": True})  # fmt: skip
    except Exception as error:  # noqa: BLE001 - any export or compile failure: the option cannot apply
        partial.unlink(missing_ok=True)
        raise ConfigError(f"stage {spec.label!r}: 'compile' cannot export or compile model {spec.model!r}: "
                          f"{type(error).__name__}: {' '.join(str(error).split())[:300]}") from None  # fmt: skip
    step and step("compile")
    difference = package_difference(load_package(partial), module, example)
    if difference > TOLERANCE.get(spec.dtype, 5e-2):
        partial.unlink()
        raise ConfigError(f"stage {spec.label!r}: 'compile' of model {spec.model!r} computes other logits than "
                          f"the model (relative difference {difference:.2e}): not a model it can compile")  # fmt: skip
    os.replace(partial, path)
    facts = {"key": package_key(spec), "build_s": time.perf_counter() - started, "check_difference": difference}
    path.with_suffix(".json").write_text(json.dumps(facts, indent=1) + "\n")
    return facts


def package_difference(package, module, example) -> float:
    """Largest |logit difference| between the package and the eager step on `example`, relative to
    max(1, largest |logit|), and the K/V's likewise."""
    with torch.no_grad():
        got, expected = package(*example), module(*example)
    return max(float((a.float() - b.float()).abs().max()) / max(1.0, float(b.float().abs().max()))
               for a, b in zip(got, expected))  # fmt: skip


@contextlib.contextmanager
def private_directory(variable: str, prefix: str):
    """The environment variable `variable` naming a fresh folder for the block's calls, then restored and
    the folder removed."""
    import shutil
    import tempfile

    private = tempfile.mkdtemp(prefix=prefix)
    previous = os.environ.get(variable)
    os.environ[variable] = private
    try:
        yield private
    finally:
        if previous is None:
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = previous
        shutil.rmtree(private, ignore_errors=True)


def load_package(path: Path):
    """The compiled model in the package at `path`. AOTInductor's loader unpacks the package (its library and
    weights: as large as the model) into a folder of the temporary directory and removes it only when the
    loaded model is destroyed, which a stage process ending by `os._exit` never does; so it unpacks into a
    private folder here (TMPDIR for the call), removed once loaded (the library and weights are in memory)."""
    with private_directory("TMPDIR", "pipespec_package_"):
        return torch._inductor.aoti_load_package(str(path))


class ExportedRunner(CausalLMRunner):
    """`CausalLMRunner` over a compiled package (`load_package`)."""

    def __init__(self, package, config, dtype):
        self.package, self.config, self.dtype = package, config, dtype
        self.model, self.device, self.canonical_cache = None, "cpu", False
        self.kv = torch.zeros(cache_shape(config, FIRST_ROWS), dtype=dtype)
        self.cache_length, self.tree_base = 0, 0

    def start(self) -> None:
        self.cache_length = 0

    def truncate(self, valid_tokens: int) -> None:
        self.cache_length = min(self.cache_length, valid_tokens)

    def cached_length(self) -> int:
        return self.cache_length

    def _call(self, fed: list[int], positions: list[int], among_fed, keep: int):
        n, past = len(fed), self.cache_length
        if among_fed is None:
            among_fed = torch.ones(n, n, dtype=torch.bool).tril()
        if past + n > self.kv.shape[0]:
            grown = torch.zeros(cache_shape(self.config, max(2 * self.kv.shape[0], past + n)), dtype=self.dtype)
            grown[:past] = self.kv[:past]
            self.kv = grown
        mask = additive_mask(among_fed, self.dtype)
        inputs = (torch.tensor([fed]), torch.tensor([positions]), mask, torch.empty(keep))
        with torch.inference_mode():
            logits, states = self.package(*inputs, self.kv[:past])
            self.kv[past : past + n] = states
        return logits.float()

    def _move_rows(self, base: int, source: list[int]) -> None:
        self.kv[base : base + len(source)] = self.kv[torch.tensor(source)]


def compiled_runner(spec: StageSpec, tree_nodes: int = 0) -> tuple[ExportedRunner, float]:
    """The stage's runner over its package, built first where the cache has none (a progress bar on
    stderr), and warmed by one sweep of the stage loop's calls (`pipespec.compiled.sweep`): the runner and
    the seconds all that took (the stage's warm-up, reported apart from any call)."""
    from tqdm.auto import tqdm
    from transformers import AutoConfig

    from pipespec.compiled import WARM_FED, sweep

    started = time.perf_counter()
    path = package_path(spec)
    if not path.is_file():
        with tqdm(total=2, desc=f"compiling {spec.label}", unit="part", file=sys.stderr, leave=False,
                  disable=None) as bar:  # fmt: skip
            build_package(spec, path, step=lambda what: bar.update(1))
    config = AutoConfig.from_pretrained(resolve_model_path(spec.model))
    runner = ExportedRunner(load_package(path), config, getattr(torch, spec.dtype))
    context = [(7 * i + 3) % config.vocab_size for i in range(WARM_CONTEXT)]
    sweep(runner, context, WARM_FED, tree_nodes)
    runner.start()  # the warm-up's cache goes: the first request starts from an empty one
    return runner, time.perf_counter() - started


def stage_runner(spec: StageSpec, tree_nodes: int = 0) -> tuple[CausalLMRunner, float]:
    """The runner a model stage's spec makes and its warm-up seconds: over the compiled package for
    `compile: true` (`compiled_runner`), else `CausalLMRunner` over the loaded model (0 s). The stage, a
    profile's step costs and the model card all measure the runner the pipeline runs."""
    if spec.compile:
        return compiled_runner(spec, tree_nodes)
    return CausalLMRunner(load_model(spec)), 0.0
