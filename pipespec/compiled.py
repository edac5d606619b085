"""torch.compile of a model stage's forward (inductor, just in time), and the sweeps that warm a stage up.

The stage option `compile: true` does not compile here: it exports its step once and compiles it ahead of
time (`pipespec.exported`), one graph for every shape, cached, loaded in seconds by later starts. This
module keeps the just-in-time path that `experiments.kernels` measures beside it (`compile_forward`):
`torch.compile` with dynamic shapes under inductor's freezing, which compiles 6-8 graphs at a stage's
first calls (an empty KV cache, one token fed or more, a cache cropped after a rollback: a strided view
dynamo guards on) and, because the prepacked weights are mkldnn tensors that inductor's FX graph cache
does not keep, compiles them again at every start; and `sweep` / `warm_up`, the untimed calls over the
stage loop's cache patterns that warm any runner (the compiled stage's first calls; the kernels tool's
variants, until a sweep compiles no new graph). `compiler_obstacle` says why compiling cannot work in this
process (no inductor, no C++ compiler for its CPU kernels); the driver refuses `compile: true` with it
before any stage starts.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from typing import Callable

from pipespec.tree import DraftTree

RECOMPILE_LIMIT = 32  # graphs per compiled frame (dynamo's default 8); the warm-up check catches runaways
WARM_UP_SWEEPS = 3  # at most; still compiling new graphs after these is a failure
WARM_FED = 16  # the warm-up's sweeps feed 1..WARM_FED tokens
WALK_STEPS = 24  # steps of the warm-up's walk of verifications
START_ALLOWANCE_S = 1800.0  # added to the driver's start timeout where a stage compiles (`pipespec.exported`)


class StillCompiling(RuntimeError):
    """A compiled model that compiles a new graph on every warm-up sweep (a recompile per call)."""


def compiler_obstacle() -> str | None:
    """Why `torch.compile` cannot compile a CPU model here (None: it can)."""
    try:
        import torch._inductor.config  # noqa: F401
    except Exception as error:  # noqa: BLE001 - any import failure means no compiler
        return f"torch's inductor does not import ({type(error).__name__}: {error})"
    if sys.version_info >= (3, 14):
        return f"torch.compile does not support Python {sys.version_info.major}.{sys.version_info.minor}"
    compiler = os.environ.get("CXX") or "c++"
    if shutil.which(compiler) is None and shutil.which("g++") is None and shutil.which("clang++") is None:
        return f"no C++ compiler ({compiler}, g++ or clang++) on PATH: inductor builds its CPU kernels with one"
    return None


def artefact_cache() -> str:
    """Inductor's on-disk cache of compiled artefacts (TORCHINDUCTOR_CACHE_DIR; set here where unset)."""
    from pipespec.cache import cache_root

    return os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_root() / "inductor"))


def compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process so far."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def graph_breaks() -> dict[str, int]:
    """Dynamo's graph breaks in this process so far: {reason: count}."""
    from torch._dynamo.utils import counters

    return dict(counters["graph_break"])


def compile_forward(model, weight_prepack: bool = True):
    """`model` with its forward compiled by torch.compile (dynamic shapes), each call under inductor's
    freezing (prepacked weights as graph constants) and an error where dynamo would give up recompiling
    and silently run eagerly. `weight_prepack=False` turns inductor's own prepacking of plain linears off
    (graphs without mkldnn tensors, which its graph cache keeps; for `experiments.kernels`)."""
    import torch
    import torch._dynamo.config as dynamo_config
    import torch._inductor.config as inductor_config

    artefact_cache()
    compiled = torch.compile(model.forward, dynamic=True)
    settings = {"freezing": True, "cpp.weight_prepack": weight_prepack}

    def forward(*args, **kwargs):
        with inductor_config.patch(settings), dynamo_config.patch(
            recompile_limit=RECOMPILE_LIMIT, fail_on_recompile_limit_hit=True
        ):
            return compiled(*args, **kwargs)

    model.forward = forward
    model.pipespec_compiled = True  # `CausalLMRunner` keeps its cache's layout canonical for the guards
    return model


def sweep(runner, context: list[int], max_fed: int, tree_nodes: int = 0, seed: int = 0) -> None:
    """One untimed sweep over the stage loop's cache patterns after `context`: first calls on an empty cache
    (with drafts and without, and with a two-branch token tree of up to `tree_nodes` nodes where > 0),
    n = 1..max_fed tokens fed after a crop (a verifier after a rollback: the cache a strided view), steps
    of 1 and 2 tokens that extend the cache (contiguous), then a seeded walk of verifications that keep a
    random part of their drafts, each next step extending the cache or cropping it first, with such a tree
    among them where `tree_nodes` > 0 (the guards are on sizes, strides and whether the cache is empty)."""
    import random

    rng = random.Random(seed)
    filler = [int(context[-1])] * max_fed
    half = max(1, min(tree_nodes, max_fed) // 2)

    def tree() -> DraftTree:
        return DraftTree.from_paths([filler[:half], [int(context[-2])] * half])

    if tree_nodes:  # a request's first step with a tree: the drafter indexed the prompt in an earlier request
        runner.start()
        runner.forward_tree(context, tree())
        runner.keep_path([])
    for drafts in ([], filler[:2]):
        runner.start()
        runner.forward(context, drafts)
    for n in range(1, max_fed + 1):
        runner.truncate(len(context) - 1)
        runner.forward(context, filler[: n - 1])
    runner.truncate(len(context) - 1)
    sequence = list(context)
    for n in (1, 1, 2, 2, 1):  # steps that extend the cache without a crop (greedy decoding, accepted drafts)
        runner.forward(sequence, filler[: n - 1])
        sequence += filler[:n]
    for step in range(WALK_STEPS):
        if tree_nodes and step % 4 == 3:
            runner.forward_tree(sequence, tree())
            kept = rng.randint(0, half)
            runner.keep_path(list(range(kept)))
        else:
            drafts = filler[: rng.randint(0, max_fed - 1)]
            runner.forward(sequence, drafts)
            kept = rng.randint(0, len(drafts))
            runner.truncate(len(sequence) + kept)
        sequence += filler[: kept + 1]  # the kept drafts and the next token, still to feed


def warm_up(runner, context: list[int], max_fed: int = WARM_FED, tree_nodes: int = 0, compiled: bool = True,
            sweeps: int = WARM_UP_SWEEPS, step: Callable[[str], None] | None = None) -> dict:  # fmt: skip
    """The first call (a prefill of `context`) and sweeps until one compiles no new graph: their seconds,
    and for a compiled runner the graphs compiled; `StillCompiling` if every sweep compiles. `step(what)`
    is called after each part (a progress bar)."""
    graphs_before = compiled_graphs() if compiled else 0
    started = time.perf_counter()
    runner.start()
    runner.forward(context, [])
    facts = {"first_call_s": time.perf_counter() - started, "sweeps_s": []}
    step and step("prefill")
    for _ in range(sweeps):
        graphs = compiled_graphs() if compiled else 0
        started = time.perf_counter()
        sweep(runner, context, max_fed, tree_nodes)
        facts["sweeps_s"].append(time.perf_counter() - started)
        step and step("sweep")
        if not compiled or compiled_graphs() == graphs:
            break
    else:
        raise StillCompiling(f"still compiling new graphs after {sweeps} warm-up sweeps of n = 1..{max_fed} "
                             f"({compiled_graphs() - graphs_before} graphs): a recompile per call?")  # fmt: skip
    if compiled:
        facts["graphs"] = compiled_graphs() - graphs_before
    return facts
