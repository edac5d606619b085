"""Shared fixtures: tiny random hierarchies and the pipelines over them.

A module that uses `tiny` or `pipes` says what it wants in module-level constants:

    TINY = {"noise": [0.3, 0.05], "eos_token_id": None}   # experiments.tiny.build_tiny_hierarchy options
    K2_STAGES = (0, -1)            # which two of the tiny stages make the k=2 pipeline (default: the last two)
    PIPELINE_OPTIONS = {...}       # passed to every Pipeline of `pipes`
    SLOW_FIXTURES = ("swept",)     # fixtures that cost a subprocess run or a long sweep: their tests are `slow`

`tiny` is the list of model directories (drafts in noise order, target last); `pipes` is
{2: Pipeline, 3: Pipeline}, open for the whole module. Hierarchies are built once per session.
"""

import os

import pytest

# Tests never reach the Hugging Face hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Tiny models run slower on oneDNN's prepacked linears (per-call overhead at 64 features): the suite
# runs them on torch's. The default oneDNN path is tested on tiny models explicitly (test_kernels.py,
# test_bench.py) and through every strategy on the real SmolLM2 hierarchies (test_smollm2.py).
os.environ.setdefault("PIPESPEC_KERNELS", "torch")


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(items):
    """A test that needs one of its module's SLOW_FIXTURES (directly or through another fixture) is `slow`:
    `pytest -m "not slow"` leaves it to the whole suite. Once the other plugins have deselected and reordered,
    the modules with the most slow tests come first (each module's tests together and in their order)."""
    for item in items:
        slow = getattr(getattr(item, "module", None), "SLOW_FIXTURES", ())
        if set(slow) & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    result = yield
    items[:] = slow_modules_first(items)
    return result


def slow_modules_first(items: list) -> list:
    """`items` with whole modules reordered by their count of slow tests, most first (ties in collection order).
    Under --dist loadgroup (scripts/test.sh) the xdist groups are sent out first, then the other tests one by
    one in this order: the long tests start early and the short ones fill the end, so neither worker sits
    idle while the other finishes a long test."""
    modules: dict[str, list] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    ranked = sorted(modules.values(), key=lambda tests: -sum(1 for t in tests if t.get_closest_marker("slow")))
    return [item for tests in ranked for item in tests]


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """tiny_models(noise, **options) -> model directories, built once per session per options."""
    from experiments.tiny import build_tiny_hierarchy

    built = {}

    def make(noise, **options):
        key = (tuple(noise), tuple(sorted(options.items())))
        if key not in built:
            built[key] = build_tiny_hierarchy(tmp_path_factory.mktemp("tiny"), list(noise), **options)
        return built[key]

    return make


@pytest.fixture(scope="module")
def tiny(request, tiny_models):
    """The module's tiny hierarchy (its TINY constant)."""
    return tiny_models(**request.module.TINY)


@pytest.fixture(scope="module")
def pipes(request, tiny):
    """{2: Pipeline, 3: Pipeline} over the module's tiny hierarchy, closed when the module ends."""
    from pipespec.api import Pipeline

    pair = getattr(request.module, "K2_STAGES", (-2, -1))
    options = getattr(request.module, "PIPELINE_OPTIONS", {})
    with Pipeline([tiny[i] for i in pair], **options) as k2, Pipeline(tiny, **options) as k3:
        yield {2: k2, 3: k3}


@pytest.fixture(scope="module")
def one_thread():
    """In-process tests on tiny tensors: torch's thread pool only adds latency on a 2-core machine."""
    import torch

    torch.set_num_threads(1)


@pytest.fixture
def entry_point(monkeypatch, capsys):
    """entry_point(module, *args, function="entry") -> CompletedProcess: `python -m module args` run in this
    process (the module's entry function with that argv; Hydra told to leave logging alone), with its exit code,
    stdout and stderr. For the bad-option tests: a CLI's error path without the seconds a fresh interpreter
    spends importing torch. A test per entry point still runs the real command in a subprocess. The tiny
    models' cache is built first, as any earlier run leaves it: the output is the command's own."""
    import importlib
    import subprocess
    import sys

    from experiments.hierarchies import tiny_model_dir

    tiny_model_dir("target")

    def run(module: str, *args: str, function: str = "entry") -> subprocess.CompletedProcess:
        call = getattr(importlib.import_module(module), function)
        argv = [module, *args, "hydra/job_logging=none", "hydra/hydra_logging=none"]
        monkeypatch.setattr(sys, "argv", argv)
        capsys.readouterr()
        try:
            call()
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(argv, code, out, err)

    return run


@pytest.fixture(scope="session")
def tiny_k2_profile(tmp_path_factory):
    """A measured machine profile of tiny_k2 (`python -m experiments.profile`: acceptance on HumanEval/0 and 1,
    a short cost sweep), measured once per worker for every module that reads one."""
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("profile")
    command = [sys.executable, "-m", "experiments.profile", "models=tiny_k2", "dataset.n_samples=2",
               "profile.max_fed=6", "profile.repeats=2", "profile.continuation=16", "profile.handoff_tokens=8",
               "cost_cache=false", f"hydra.run.dir={out}"]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return out / "profile.json"
