"""The real default target: SmolLM2-135M-Instruct (fp32) with drafts that share its tokenizer."""

import pytest

from pipespec.api import Pipeline
from experiments.data import load_dataset
from pipespec.decoding import greedy_generate
from experiments.hierarchies import load_hierarchy
from pipespec.models import CausalLMRunner, load_model
from experiments.prepare import is_prepared, prepare_smollm2

MAX_NEW = 48
pytestmark = pytest.mark.slow  # real models: `-m "not slow"` skips them; scripts/test.sh runs everything


@pytest.fixture(scope="module")
def humaneval_prompts():
    return [s.source for s in load_dataset({"name": "humaneval", "loader": "humaneval", "n_samples": 2}).samples]


@pytest.fixture(scope="module")
def greedy_reference():
    """reference(target spec, prompt ids, eos ids): greedy decoding of the target in this process.

    All three hierarchies end in the same target (fp32 SmolLM2, oneDNN kernels) and run the same
    first prompts, so each target is loaded and each prompt decoded once per module (per xdist
    worker), not once per hierarchy: the same reference tokens, about 4 s of decoding each saved.
    Keyed by everything the tokens depend on (spec, resolved kernels, prompt, eos ids); computed on
    first use, inside the calling test (so under its PIPESPEC_KERNELS)."""
    from pipespec.models import resolved_kernels

    runners, outputs = {}, {}

    def reference(spec, ids, eos_ids):
        model_key = (repr(spec), resolved_kernels(spec))
        key = (model_key, tuple(ids), tuple(eos_ids))
        if key not in outputs:
            if model_key not in runners:
                runners[model_key] = CausalLMRunner(load_model(spec))
            outputs[key] = greedy_generate(runners[model_key], ids, MAX_NEW, eos_ids)
        return outputs[key]

    return reference


def test_prepared_directory_is_plain_and_cached():
    path = prepare_smollm2()
    assert is_prepared(path)
    assert not (path / "model.gguf").exists()
    assert prepare_smollm2() == path  # second call is a no-op


# every stage of the k = 2 hierarchies is one of this k = 3 hierarchy's (same spec): they run on its stages
SHARED = "smollm2_pld_int8_fp32"


@pytest.fixture(scope="module")
def shared_pipeline():
    """The k = 3 pipeline (prompt lookup -> int8 -> fp32, the target's linears prepacked by oneDNN), started
    once per module (its tests share one xdist worker): each named hierarchy runs on its own stages of it
    (`generate(stages=...)`, the others idle), not on stage processes of its own (suite time: one start of
    the stages and one load of each model instead of three)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PIPESPEC_KERNELS", "onednn")  # the prepacked path (the suite pins torch's for tiny models)
        with Pipeline(load_hierarchy(SHARED)) as pipe:
            yield pipe


@pytest.mark.xdist_group("smollm2")  # one worker, one shared pipeline
@pytest.mark.parametrize("hierarchy", ["smollm2_pld_int8_fp32", "smollm2_int8_fp32", "smollm2_pld_fp32"])
def test_named_hierarchy_identical_to_greedy_fp32(hierarchy, humaneval_prompts, greedy_reference, shared_pipeline,
                                                 monkeypatch):
    import torch

    from pipespec.models import resolved_kernels

    monkeypatch.setenv("PIPESPEC_KERNELS", "onednn")  # the prepacked path (the suite pins torch's for tiny models)
    torch.set_num_threads(1)
    specs = load_hierarchy(hierarchy)
    assert resolved_kernels(specs[-1]) == "onednn"  # the fp32 target's linears prepacked, in every process
    pipe = shared_pipeline
    stages = [pipe.specs.index(spec) for spec in specs]  # the named hierarchy: these stages of the shared pipeline
    assert [pipe.specs[i] for i in stages] == specs and stages[-1] == len(pipe.specs) - 1
    # the greedy strategy activates only the target (pipespec.schedule.roles: every drafter idle), and that
    # stage is the same fp32 SmolLM2 in all three hierarchies: it runs through the k = 3 one, on all three
    # prompts (every prompt the k = 2 ones run; greedy through k = 2 pipelines: test_engine, every depth)
    runs = [("sd", 3), ("pipespec", 0), ("pipespec", 2)]
    if len(specs) == 3:
        runs.insert(0, ("greedy", 0))
    for prompt in humaneval_prompts:  # two (suite time), each one's reference decoded once for all three
        ids = pipe.encode(prompt)
        expected = greedy_reference(specs[-1], ids, pipe.eos_ids)
        for strategy, lookahead in runs:
            result = pipe.generate(ids, MAX_NEW, strategy=strategy, lookahead=lookahead, stages=stages)
            assert result.tokens == expected, (hierarchy, strategy, lookahead)
            assert strategy == "greedy" or result.stages == stages, (hierarchy, strategy, result.stages)
