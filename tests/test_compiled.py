"""Compiled stages (pipespec.compiled): the option refused where it cannot apply, a compiled model that
compiles nothing more once warmed, and compiled stages in sd and pipespec identical to greedy decoding."""

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
    """Compiled artefacts of this module in a fresh cache (the stage processes inherit it)."""
    path = tmp_path_factory.mktemp("inductor")
    previous = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    yield path
    if previous is None:
        os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
    else:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = previous


@pytest.fixture(scope="module")
def reference(tiny):
    from pipespec.decoding import greedy_generate
    from pipespec.models import CausalLMRunner, load_model

    runner = CausalLMRunner(load_model(StageSpec(model=tiny[-1])))
    return [greedy_generate(runner, p, MAX_NEW, [1]) for p in PROMPTS]


@pytest.mark.slow  # compiles 8 graphs: a minute or two on a 2-core machine
def test_a_warmed_compiled_model_decodes_like_greedy_without_compiling_again(tiny, reference, inductor_cache):
    """After `warm_stage`, decoding, verifying drafts after crops and a token tree compile no new graph, and
    the tokens are the eager model's."""
    from pipespec.compiled import compiled_graphs, warm_stage
    from pipespec.decoding import greedy_generate
    from pipespec.drafters import DraftTree
    from pipespec.models import CausalLMRunner, load_model

    runner = CausalLMRunner(load_model(StageSpec(model=tiny[-1], compile=True)))
    assert warm_stage(runner, "target", 256, tree_nodes=4) > 0
    graphs = compiled_graphs()
    assert [greedy_generate(runner, p, MAX_NEW, [1]) for p in PROMPTS] == reference
    sequence = PROMPTS[0] + reference[0][:3]
    runner.start()  # a prefill with drafts, then verifications of 1..6 drafts, each after a rollback
    for n in range(1, 7):
        runner.truncate(len(sequence) - 1)
        logits = runner.forward(sequence, reference[0][3 : 3 + n])
        assert logits.argmax(-1).tolist()[: n] == reference[0][3 : 3 + n]
    runner.truncate(len(sequence) - 1)
    runner.forward_tree(sequence, DraftTree.from_paths([reference[0][3:6], [7, 7]]))
    runner.keep_path([0, 1, 2])
    assert compiled_graphs() == graphs
    assert any(inductor_cache.iterdir())  # artefacts for the next start


@pytest.mark.slow  # compiles in the stage process: a minute or two on a 2-core machine
def test_a_compiled_verifier_is_identical_to_greedy_in_sd_and_pipespec(tiny, reference, inductor_cache):
    """A compiled target behind a drafter of token trees: warmed (trees too) before it reports ready, its
    warm-up on record, every call of sd and pipespec identical to greedy decoding."""
    from pipespec.api import Pipeline

    stages = [{"kind": "suffix", "tree_nodes": 6}, {"model": tiny[-1], "compile": True}]
    with Pipeline(stages, strategy="sd", lookahead=4) as pipe:
        assert pipe.warm_up_s[0] == 0 and pipe.warm_up_s[1] > 0
        for strategy in ("sd", "pipespec", "sd"):  # later calls draft from the earlier outputs: trees
            outputs = [pipe.generate(p, max_new_tokens=MAX_NEW, strategy=strategy).tokens for p in PROMPTS]
            assert outputs == reference
