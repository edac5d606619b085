"""Compiled stages (pipespec.exported): the option refused where it cannot apply; the exported step computing
what the model computes through rollbacks and token trees; a model it cannot export or that computes other
logits refused clearly; a compiled verifier decoding exactly as greedy decoding in sd and pipespec, its
package built at the first start and loaded by the next."""

import json
from pathlib import Path

import pytest

from pipespec.errors import ConfigError
from pipespec.specs import StageSpec

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.xdist_group("compiled")]

TINY = {"noise": [0.3, 0.05], "num_layers": 1}  # experiments.tiny: 256-token vocabulary, EOS 1; one layer: quicker
MAX_NEW = 16
PROMPTS = [[5, 17, 99, 23, 41, 7, 3], [200, 13, 13, 13, 56, 8, 101, 9, 44, 2, 77]]


@pytest.mark.parametrize(
    "options, message",
    [
        ({"kind": "suffix", "compile": True}, "'compile' is for model stages"),
        ({"kind": "prompt_lookup", "compile": True}, "'compile' is for model stages"),
        ({"model": "some/model", "compile": "yes"}, "'compile' must be true or false"),
        ({"model": "some/model", "compile": 1}, "'compile' must be true or false"),
        ({"model": "some/model", "compile": True, "quantize": "int8-dynamic"}, "'compile' runs unquantized CPU"),
    ],
)
def test_a_compile_option_that_cannot_apply_is_refused_clearly(options, message):
    with pytest.raises(ConfigError, match=message):
        StageSpec.from_any(options)


def test_compile_without_a_compiler_is_one_error_before_any_stage_starts(tiny, tmp_path, monkeypatch):
    from pipespec.api import Pipeline

    monkeypatch.setenv("PATH", str(tmp_path))  # no c++, g++ or clang++
    monkeypatch.delenv("CXX", raising=False)
    with pytest.raises(ConfigError, match=r"'compile' of stage\(s\) \['\S+'\] cannot apply: no C\+\+ compiler"):
        Pipeline([tiny[0], {"model": tiny[-1], "compile": True}])


@pytest.fixture(scope="module")
def compiled_cache(tmp_path_factory):
    """PIPESPEC_CACHE of this module: packages built here, in a fresh folder. Set once the fork server the
    stage processes are forked from runs (with the environment of its own start): a stage takes the
    driver's environment of its pipeline's start, so the pipeline test's stage builds its package here."""
    from pipespec.api import warm_stage_server

    warm_stage_server()
    path = tmp_path_factory.mktemp("pipespec_cache")
    with pytest.MonkeyPatch.context() as patch:  # restored when the module ends
        patch.setenv("PIPESPEC_CACHE", str(path))
        yield path


@pytest.fixture(scope="module")
def reference(tiny):
    from pipespec.decoding import greedy_generate
    from pipespec.models import CausalLMRunner, load_model

    runner = CausalLMRunner(load_model(StageSpec(model=tiny[-1])))
    return [greedy_generate(runner, p, MAX_NEW, [1]) for p in PROMPTS]


def test_the_count_of_graphs_dynamo_compiles_moves_with_a_compile():
    """`compiled_graphs` (the kernels tool's check that a torch.compile variant compiles nothing while timed)
    moves when dynamo compiles a graph (the eager backend: nothing to build)."""
    import torch

    from pipespec.compiled import compiled_graphs

    before = compiled_graphs()
    torch.compile(lambda x: x * 2 + 1, backend="eager")(torch.ones(3))
    assert compiled_graphs() == before + 1


def _walk(runners, steps: int, seed: int = 0):
    """Drive the runners through the same seeded walk of the stage loop's calls (chains of 0-6 drafts kept in
    part, token trees kept along a path, several requests); yield each call's logits from every runner."""
    import random

    from pipespec.tree import DraftTree

    rng = random.Random(seed)
    token = lambda: rng.randrange(256)  # noqa: E731
    for request in range(2):
        sequence = [token() for _ in range(5 + 40 * request)]  # the second request: a longer prompt
        for runner in runners:
            runner.start()
        for step in range(steps):
            if step % 3 == 2:
                tree = DraftTree.from_paths([[token() for _ in range(3)], [token() for _ in range(2)]])
                yield [runner.forward_tree(sequence, tree) for runner in runners]
                path = [[], [0], [0, 1], [3], [3, 4]][rng.randrange(5)]
                for runner in runners:
                    runner.keep_path(path)
                sequence += [tree.tokens[i] for i in path] + [token()]
            else:
                drafts = [token() for _ in range(rng.randint(0, 6))]
                yield [runner.forward(sequence, drafts) for runner in runners]
                kept = rng.randint(0, len(drafts))
                for runner in runners:
                    runner.truncate(len(sequence) + kept)
                sequence += drafts[:kept] + [token()]
            assert len({runner.cache_length for runner in runners}) == 1


def test_an_exported_step_computes_what_the_model_computes_through_rollbacks_and_trees(tiny, compiled_cache):
    """The compiled package's runner against the eager model's, call by call: the same logits (to float
    rounding) and the same greedy choices through a walk of verifications, crops and token trees; the package
    is then in the cache, and the next start loads it instead of building it again; no unpacked copy of it
    stays in the temporary directory."""
    import torch

    from pipespec import exported
    from pipespec.models import CausalLMRunner, load_model

    import tempfile

    spec = StageSpec(model=tiny[-1], compile=True)
    unpacked = lambda: set(Path(tempfile.gettempdir()).glob("aotinductor_*"))  # noqa: E731 - the loader's folders
    before = unpacked()
    runner, first_s = exported.compiled_runner(spec, tree_nodes=6)
    assert unpacked() == before  # the unpacked package is not left behind (a stage ends without destroying it)
    assert not list(Path(tempfile.gettempdir()).glob("pipespec_*_*"))  # nor the build's or the load's folder
    path = exported.package_path(spec)
    built = path.stat().st_mtime_ns
    eager = CausalLMRunner(load_model(StageSpec(model=tiny[-1])))
    for compiled_logits, eager_logits in _walk([runner, eager], steps=30):
        assert compiled_logits.shape == eager_logits.shape
        torch.testing.assert_close(compiled_logits, eager_logits, rtol=1e-4, atol=1e-4)
        assert compiled_logits.argmax(-1).tolist() == eager_logits.argmax(-1).tolist()
    again, second_s = exported.compiled_runner(spec, tree_nodes=6)
    assert path.stat().st_mtime_ns == built and second_s < first_s / 2, (first_s, second_s)
    assert json.loads(path.with_suffix(".json").read_text())["check_difference"] < exported.TOLERANCE["float32"]


def test_a_profile_times_the_compiled_step_the_pipeline_runs(tiny, compiled_cache):
    """A profile's step costs (and the model card's) come from the runner the stage makes: the compiled
    package's for `compile: true` (loaded here from the cache an earlier start filled), the eager model's
    otherwise; its kernels are recorded as `compiled`."""
    from experiments.profiler import _runner
    from pipespec.exported import ExportedRunner, stage_runner
    from pipespec.models import CausalLMRunner, resolved_kernels

    compiled = _runner(StageSpec(model=tiny[-1], compile=True))
    assert isinstance(compiled, ExportedRunner) and compiled.cache_length == 0
    assert resolved_kernels(StageSpec(model=tiny[-1], compile=True, kernels="auto")) == "compiled"  # nothing measured
    eager, warm_up_s = stage_runner(StageSpec(model=tiny[-1]))
    assert type(eager) is CausalLMRunner and warm_up_s == 0.0


@pytest.mark.parametrize("failure", ["export", "check"])
def test_a_model_it_cannot_compile_is_one_clear_error_and_leaves_no_package(tiny, tmp_path, monkeypatch, failure):
    """An export that fails, or a package whose logits are not the model's (a model whose head is not the output
    embedding of the last hidden state): a `ConfigError` naming the stage and the model, nothing cached."""
    import torch

    from pipespec import exported

    if failure == "export":
        def refuse(*args, **kwargs):
            raise RuntimeError("Dynamic control flow\n  deep inside")

        monkeypatch.setattr(torch.export, "export", refuse)
        message = r"stage 'target': 'compile' cannot export or compile model .*RuntimeError: Dynamic control flow deep"
    else:  # a package that is not the model's: nothing compiled, a check that finds other logits
        monkeypatch.setattr(torch._inductor, "aoti_compile_and_package",
                            lambda program, package_path, **options: Path(package_path).write_bytes(b"not built"))
        monkeypatch.setattr(torch._inductor, "aoti_load_package", lambda path: None)
        monkeypatch.setattr(exported, "package_difference", lambda *args: 0.25)
        message = r"stage 'target': 'compile' of model .* computes other logits .*\(relative difference 2.50e-01\)"
    monkeypatch.setenv("PIPESPEC_CACHE", str(tmp_path))
    spec = StageSpec(model=tiny[-1], compile=True, name="target")
    with pytest.raises(ConfigError, match=message):
        exported.build_package(spec, exported.package_path(spec))
    assert not list(tmp_path.rglob("*.pt2"))


@pytest.mark.slow  # builds a package in the stage process, then starts again from it
def test_a_compiled_verifier_is_identical_to_greedy_in_sd_and_pipespec(tiny, reference, compiled_cache):
    """A compiled target behind a drafter of token trees: its first start builds the package (its warm-up on
    record), every sd and pipespec call (verifications of several lengths after rollbacks, token trees) decodes
    exactly as greedy decoding, and the next start loads the package: a shorter warm-up, the same outputs."""
    from pipespec.api import Pipeline

    import shutil

    shutil.rmtree(compiled_cache / "compiled", ignore_errors=True)  # built by an earlier test of the module
    stages = [{"kind": "suffix", "tree_nodes": 6}, {"model": tiny[-1], "compile": True}]
    warm_up_s = []
    for start in range(2):
        with Pipeline(stages, strategy="sd", lookahead=4) as pipe:
            assert pipe.warm_up_s[0] == 0 and pipe.warm_up_s[1] > 0
            warm_up_s.append(pipe.warm_up_s[1])
            for strategy in ("sd", "pipespec", "sd")[: 3 - 2 * start]:  # later calls draft from earlier outputs: trees
                results = [pipe.generate(p, max_new_tokens=MAX_NEW, strategy=strategy) for p in PROMPTS]
                assert [r.tokens for r in results] == reference
    assert len(list(compiled_cache.rglob("*.pt2"))) == 1  # the stage read the driver's PIPESPEC_CACHE
    assert warm_up_s[1] < warm_up_s[0] / 2, warm_up_s
