"""Compiled stages (pipespec.compiled): the option refused where it cannot apply, and a compiled verifier that,
once warmed, compiles nothing more in sd and pipespec calls and decodes exactly as greedy decoding."""

import os

import pytest

from pipespec.errors import ConfigError
from pipespec.specs import StageSpec

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.xdist_group("compiled")]

TINY = {"noise": [0.3, 0.05], "num_layers": 1}  # experiments.tiny: a 256-token vocabulary, EOS 1; one layer: smaller graphs to compile
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
def inductor_cache(tmp_path_factory):
    """Compiled artefacts of this module in a fresh cache. Stage processes are forked from a fork server
    and have its environment: the server an earlier test started is ended, so the next one starts with it."""
    from pipespec.api import stop_stage_server

    path = tmp_path_factory.mktemp("inductor")
    previous = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    stop_stage_server()
    yield path
    if previous is None:
        os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
    else:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = previous
    stop_stage_server()


@pytest.fixture(scope="module")
def reference(tiny):
    from pipespec.decoding import greedy_generate
    from pipespec.models import CausalLMRunner, load_model

    runner = CausalLMRunner(load_model(StageSpec(model=tiny[-1])))
    return [greedy_generate(runner, p, MAX_NEW, [1]) for p in PROMPTS]


def test_a_trace_counts_the_graphs_dynamo_compiles():
    """The count a compiled stage's trace reports (`StageTrace.compiled_graphs`) moves when dynamo compiles a
    graph (the eager backend: nothing to build) and survives the trace's dict."""
    import torch

    from pipespec.compiled import compiled_graphs
    from pipespec.trace import StageTrace

    before = compiled_graphs()
    torch.compile(lambda x: x * 2 + 1, backend="eager")(torch.ones(3))
    assert compiled_graphs() == before + 1
    trace = StageTrace(1, "target", compiled_graphs=0)
    assert StageTrace.from_dict(trace.to_dict()).compiled_graphs == 0
    assert "compiled_graphs" not in StageTrace(1, "target").to_dict()


@pytest.mark.slow  # compiles in the stage process: a minute or two on a 2-core machine
def test_a_compiled_verifier_is_identical_to_greedy_in_sd_and_pipespec(tiny, reference, inductor_cache):
    """A compiled target behind a drafter of token trees: warmed (trees too) before it reports ready, its
    warm-up on record; then no call of sd or pipespec compiles a graph (verifications of several lengths after
    rollbacks, token trees: each trace's `compiled_graphs` is 0), every output is greedy decoding's, and the
    compiled artefacts are on disk for the next start."""
    from pipespec.api import Pipeline

    stages = [{"kind": "suffix", "tree_nodes": 6}, {"model": tiny[-1], "compile": True}]
    with Pipeline(stages, strategy="sd", lookahead=4) as pipe:
        assert pipe.warm_up_s[0] == 0 and pipe.warm_up_s[1] > 0
        for strategy in ("sd", "pipespec", "sd"):  # later calls draft from the earlier outputs: trees
            results = [pipe.generate(p, max_new_tokens=MAX_NEW, strategy=strategy) for p in PROMPTS]
            assert [r.tokens for r in results] == reference
            assert [[t.compiled_graphs for t in r.stage_traces] for r in results] == [[None, 0]] * len(PROMPTS)
    assert any(inductor_cache.iterdir())
