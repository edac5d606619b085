"""A run's greedy reference is found by what makes outputs comparable, not by how a config spells its stages."""

from analysis.rundir.reference import target_key


def _config(target: dict, **extra) -> dict:
    return {"models": {"name": "h", "stages": [{"model": "d"}, target]}, "dataset": {"name": "humaneval"},
            "max_new_tokens": 96, **extra}


def test_a_target_spelled_with_its_default_options_is_the_same_target():
    """conf/models lists every stage's model, device, dtype and quantize (so Hydra can override them per index);
    a run made so matches a committed run whose target named only its model, and not one of another dtype,
    device, quantization, budget, dataset or decoding."""
    bare = _config({"model": "smollm2", "name": "smollm2-fp32"})
    spelled = _config({"model": "smollm2", "name": "fp32", "dtype": "float32", "device": "cpu", "quantize": None})
    assert target_key(bare) == target_key(spelled)
    for other in ({"dtype": "float16"}, {"device": "cuda:0"}, {"quantize": "int8-dynamic"}, {"model": "other"}):
        assert target_key(_config({"model": "smollm2", **other})) != target_key(bare), other
    assert target_key({**bare, "max_new_tokens": 64}) != target_key(bare)
    assert target_key({**bare, "dataset": {"name": "news_lee_cnndm"}}) != target_key(bare)
    assert target_key({**bare, "sampling": {"temperature": 0.7}}) != target_key(bare)
    assert target_key({**bare, "sampling": {"temperature": 0.0, "top_k": 5}}) == target_key(bare)
