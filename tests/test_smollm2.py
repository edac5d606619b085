"""The real default target: SmolLM2-135M-Instruct (fp32) with drafts that share its tokenizer."""

import pytest

from pipespec.api import Pipeline
from pipespec.data import load_dataset
from pipespec.decoding import greedy_generate
from pipespec.hierarchies import load_hierarchy
from pipespec.models import CausalLMRunner, load_model
from pipespec.prepare import is_prepared, prepare_smollm2

MAX_NEW = 48
pytestmark = pytest.mark.slow  # real models: `-m "not slow"` skips them; scripts/test.sh runs everything


@pytest.fixture(scope="module")
def humaneval_prompts():
    return [s.source for s in load_dataset({"name": "humaneval", "loader": "humaneval", "n_samples": 3}).samples]


def test_prepared_directory_is_plain_and_cached():
    path = prepare_smollm2()
    assert is_prepared(path)
    assert not (path / "model.gguf").exists()
    assert prepare_smollm2() == path  # second call is a no-op


@pytest.mark.parametrize("hierarchy", ["smollm2_pld_int8_fp32", "smollm2_int8_fp32", "smollm2_pld_fp32"])
def test_named_hierarchy_identical_to_greedy_fp32(hierarchy, humaneval_prompts, monkeypatch):
    import torch

    from pipespec.models import resolved_kernels

    monkeypatch.setenv("PIPESPEC_KERNELS", "auto")  # the default kernels (the suite pins torch's for tiny models)
    torch.set_num_threads(1)
    specs = load_hierarchy(hierarchy)
    assert resolved_kernels(specs[-1]) == "onednn"  # the fp32 target's linears prepacked, in every process
    target = CausalLMRunner(load_model(specs[-1]))
    with Pipeline(specs) as pipe:
        # three prompts for the k = 3 default, two for the others (suite time)
        for prompt in humaneval_prompts[: 3 if len(specs) == 3 else 2]:
            ids = pipe.encode(prompt)
            expected = greedy_generate(target, ids, MAX_NEW, pipe.eos_ids)
            for strategy, lookahead in (("greedy", 0), ("sd", 3), ("pipespec", 0), ("pipespec", 2)):
                result = pipe.generate(ids, MAX_NEW, strategy=strategy, lookahead=lookahead)
                assert result.tokens == expected, (hierarchy, strategy, lookahead)
