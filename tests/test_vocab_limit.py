"""A drafter's lm_head over the most frequent token ids only (stage option `vocab_limit`, pipespec.vocab):
logits -inf above the limit, the full model's below; lossless in a pipeline; refused where it cannot apply."""

import pytest

from pipespec.errors import ConfigError
from pipespec.specs import StageSpec

TINY = {"noise": [0.05]}
LIMIT = 128  # of the tiny vocabulary's 256 ids
MAX_NEW = 24


def _logits(spec: StageSpec, prompt, candidates):
    from pipespec.models import CausalLMRunner, load_model

    runner = CausalLMRunner(load_model(spec))
    runner.start()
    return runner, runner.forward(prompt, candidates)


@pytest.mark.parametrize("options", [{}, {"quantize": "int8-dynamic"}, {"kernels": "onednn"}])
def test_limited_logits_are_minus_inf_above_the_limit_and_the_full_models_below(tiny, one_thread, options):
    import torch

    from pipespec.kernels import onednn_available, PrepackedLinear
    from pipespec.vocab import VocabLimitedHead

    if options.get("kernels") == "onednn" and not onednn_available():
        pytest.skip("torch without oneDNN prepacking")
    prompt, candidates = [5, 17, 200, 33, 90, 2], [7, 250, 64]
    _, full = _logits(StageSpec(model=tiny[0], **options), prompt, candidates)
    runner, limited = _logits(StageSpec(model=tiny[0], vocab_limit=LIMIT, **options), prompt, candidates)
    assert limited.shape == full.shape == (len(candidates) + 1, 256)
    assert torch.isneginf(limited[:, LIMIT:]).all() and torch.isfinite(limited[:, :LIMIT]).all()
    torch.testing.assert_close(limited[:, :LIMIT], full[:, :LIMIT], rtol=1e-5, atol=1e-5)
    head = runner.model.get_output_embeddings()
    assert isinstance(head, VocabLimitedHead) and head.limit == LIMIT
    kept = type(head.kept)
    if options.get("quantize"):  # the reduced head is quantized like every other Linear
        assert kept is not torch.nn.Linear and "quantized" in kept.__module__
    elif options.get("kernels"):
        assert kept is PrepackedLinear
    else:
        assert kept is torch.nn.Linear


def test_a_tied_head_leaves_the_input_embedding_whole(tmp_path, one_thread):
    import torch
    from transformers import LlamaForCausalLM

    from pipespec.models import load_model
    from experiments.tiny import tiny_config

    config = tiny_config()
    config.tie_word_embeddings = True
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    full = load_model(StageSpec(model=str(tmp_path)))
    model = load_model(StageSpec(model=str(tmp_path), vocab_limit=LIMIT))
    embedding = model.get_input_embeddings().weight
    assert embedding.shape == (256, config.hidden_size)
    torch.testing.assert_close(embedding, full.get_input_embeddings().weight, rtol=0, atol=0)
    kept = model.get_output_embeddings().kept.weight
    assert kept.data_ptr() != embedding.data_ptr()
    torch.testing.assert_close(kept, embedding[:LIMIT], rtol=0, atol=0)
    ids = torch.tensor([[3, 200, 9]])
    with torch.inference_mode():
        torch.testing.assert_close(model(ids).logits[..., :LIMIT], full(ids).logits[..., :LIMIT])


def test_a_limited_drafter_keeps_sd_and_pipespec_identical_to_greedy(tiny):
    import torch

    from pipespec.api import Pipeline
    from pipespec.decoding import greedy_generate
    from pipespec.models import CausalLMRunner, load_model
    from experiments.tiny import random_prompts

    torch.set_num_threads(1)
    prompts = random_prompts(3, length=10, seed=5)
    runner = CausalLMRunner(load_model(StageSpec(model=tiny[-1])))
    reference = [greedy_generate(runner, p, MAX_NEW, [1]) for p in prompts]
    assert any(t >= LIMIT for r in reference for t in r)  # the drafter must miss some of the target's tokens
    stages = [{"model": tiny[0], "vocab_limit": LIMIT, "name": "limited"}, tiny[-1]]
    with Pipeline(stages, strategy="sd") as pipe:
        assert pipe.names[0] == "0:limited"
        for strategy in ("sd", "pipespec"):
            for prompt, expected in zip(prompts, reference):
                assert pipe.generate(prompt, MAX_NEW, strategy=strategy).tokens == expected, strategy


def test_the_label_names_the_limit(tiny):
    assert StageSpec(model=tiny[0], quantize="int8-dynamic", vocab_limit=LIMIT).label.endswith(
        f"[int8-dynamic,vocab{LIMIT}]"
    )
    assert StageSpec(model=tiny[0], vocab_limit=LIMIT).label.endswith(f"[vocab{LIMIT}]")


@pytest.mark.parametrize("value", [0, -3, 1.5, "16384", True])
def test_a_bad_vocab_limit_is_refused(tiny, value):
    with pytest.raises(ConfigError, match="'vocab_limit' must be an integer >= 1"):
        StageSpec.from_any({"model": tiny[0], "vocab_limit": value})


@pytest.mark.parametrize("kind", ["prompt_lookup", "suffix"])
def test_a_model_free_stage_has_no_vocab_limit(kind):
    with pytest.raises(ConfigError, match=f"'vocab_limit' is for model stages .* a {kind} stage has no lm_head"):
        StageSpec.from_any({"kind": kind, "vocab_limit": 100})


def test_the_target_may_not_have_a_vocab_limit(tiny):
    from pipespec.api import Pipeline
    from experiments.hierarchies import resolve_stages

    stages = [tiny[0], {"model": tiny[-1], "vocab_limit": LIMIT, "name": "target"}]
    with pytest.raises(ConfigError, match="'vocab_limit' is for drafters only: the last stage 'target'"):
        resolve_stages(stages)
    with pytest.raises(ConfigError, match="'vocab_limit' is for drafters only"):
        Pipeline(stages)  # refused before any stage process starts
    resolve_stages([{"model": tiny[0], "vocab_limit": LIMIT}, tiny[-1]])  # a drafter may


def test_a_limit_above_the_vocabulary_is_refused_naming_the_stage(tiny):
    from pipespec.api import Pipeline
    from pipespec.models import load_model

    spec = StageSpec(model=tiny[0], vocab_limit=257, name="big")
    with pytest.raises(ConfigError, match=r"stage 'big': vocab_limit 257 is above the vocabulary size 256 of model"):
        load_model(spec)
    with pytest.raises(ConfigError, match=r"stage 'big': vocab_limit 257 is above the vocabulary size 256"):
        Pipeline([spec, tiny[-1]])
    StageSpec.from_any({"model": tiny[0], "vocab_limit": 256})  # the whole vocabulary: allowed (a no-op)


def test_the_named_hierarchies_limit_the_int8_drafter_only():
    from experiments.hierarchies import read_hierarchy

    for name, drafter in (("smollm2_int8v16k_fp32", 0), ("smollm2_suffix_int8v16k_fp32", 1)):
        stages = [StageSpec.from_any(s, check_devices=False) for s in read_hierarchy(name)["stages"]]
        assert [s.vocab_limit for s in stages] == [16384 if i == drafter else None for i in range(len(stages))]
        assert stages[drafter].quantize == "int8-dynamic" and stages[-1].quantize is None
