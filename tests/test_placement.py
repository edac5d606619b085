"""Stage placement and precision from the command line (`experiments.placement`), checked once with one
`ConfigError`; the paper's checkpoints' published shapes (`experiments.architectures`) and the per-device
memory plan mode prints from them (`experiments.plan`), no weights loaded."""

import json
import re

import pytest

from experiments.architectures import PUBLISHED, shape_for, shape_from_config
from experiments.compose import compose
from experiments.run_config import RunConfig
from experiments.hierarchies import available, read_hierarchy
from experiments.placement import auto_devices, check_gpu_count, place_stages, placed_devices
from experiments.plan import GIB, OVERHEAD, device_budget, format_plan, plan_stages
from pipespec.errors import ConfigError

# the parameter counts the checkpoints' model cards publish
PUBLISHED_PARAMS = {
    "meta-llama/Llama-3.2-1B-Instruct": 1.24e9,
    "meta-llama/Llama-3.1-8B-Instruct": 8.03e9,
    "meta-llama/Llama-3.1-70B-Instruct": 70.6e9,
    "meta-llama/Llama-2-7b-hf": 6.74e9,
    "meta-llama/Llama-2-13b-hf": 13.0e9,
    "JackFram/llama-68m": 68e6,
}


@pytest.mark.parametrize("model, published", PUBLISHED_PARAMS.items())
def test_published_shapes_give_the_published_parameter_counts(model, published):
    shape = shape_for(model)
    assert shape is not None and shape_for(model.upper()) is shape
    assert shape.params == pytest.approx(published, rel=0.02)


def test_every_paper_stage_has_a_published_shape():
    for name in (n for n in available() if n.startswith("llama")):
        for stage in read_hierarchy(name)["stages"]:
            assert shape_for(stage["model"]) is not None, (name, stage["model"])
            assert shape_for(stage["model"]).params == pytest.approx(stage["params_b"] * 1e9, rel=0.02)
    assert shape_for("someone/unknown-7b") is None and len(set(PUBLISHED.values())) == 6


def test_the_shape_formula_counts_a_real_model_exactly():
    from experiments.hierarchies import tiny_model_dir
    from experiments.plan import count_parameters
    from experiments.prepare import prepare_smollm2

    for path in (tiny_model_dir("target"), prepare_smollm2()):  # untied and tied embeddings
        config = json.loads((path / "config.json").read_text())
        assert shape_from_config(config).params == count_parameters(str(path))


def test_plan_prints_weights_and_kv_per_device_from_published_shapes():
    specs = place_stages(read_hierarchy("llama3_1b_8b_70b"), plan=True)[2]
    rows = plan_stages(specs)
    big = rows[2]
    assert big.params_source == "published shapes" and big.precision == "nf4"
    assert big.kv_gib_per_1k_tokens == pytest.approx(2 * 80 * 8 * 128 * 2 * 1000 / GIB)  # K, V in fp16
    linear = 80 * (8192 * 64 * 128 * 2 + 8192 * 8 * 128 * 2 + 3 * 8192 * 28672)
    assert big.weights_gib == pytest.approx((linear * 0.5625 + (big.params - linear) * 2) * OVERHEAD / GIB)
    assert big.weights_at["fp16/bf16"] == pytest.approx(big.params * 2 * OVERHEAD / GIB)
    assert 40 < big.weights_gib < 46 and 140 < big.weights_at["fp16/bf16"] < 150  # 70B: NF4 over two 40 GB GPUs
    budget = device_budget(rows)
    assert budget["cuda:2"]["kv_per_1k"] == pytest.approx(big.kv_gib_per_1k_tokens / 2)
    text = format_plan(rows)
    assert "KV not known" not in text and "?" not in text.split("per device")[1] and "GiB/1k tok" in text


def test_auto_gives_each_model_stage_a_gpu_and_the_split_stage_what_is_left():
    stages = read_hierarchy("llama3_1b_8b_70b")["stages"]
    assert auto_devices(stages, 4) == ["cuda:0", "cuda:1", "cuda:2,cuda:3"]
    assert auto_devices(stages, 8) == ["cuda:0", "cuda:1", "cuda:2,cuda:3"]  # as many as the hierarchy lists
    assert auto_devices(stages, 3) == ["cuda:0", "cuda:1", "cuda:2"]
    assert auto_devices(stages, 0) == ["cpu", "cpu", "cpu"]
    with pytest.raises(ConfigError, match=r"placement=cuda:0 .*placement=\[cuda:0,cuda:1,cuda:0\]"):
        auto_devices(stages, 2)
    cpu_only = read_hierarchy("smollm2_pld_int8_fp32")["stages"]  # prompt lookup, int8 (CPU only), fp32
    assert auto_devices(cpu_only, 2) == ["cpu", "cpu", "cuda:0"]


def test_placement_forms():
    stages = read_hierarchy("llama3_1b_8b_70b")["stages"]
    assert placed_devices(stages, None) == ["cuda:0", "cuda:1", "cuda:2,cuda:3"]
    assert placed_devices(stages, ["cuda:0", "cuda:0", "cuda:1+cuda:2"]) == ["cuda:0", "cuda:0", "cuda:1,cuda:2"]
    assert placed_devices(stages, "cuda:0,cuda:1,cuda:1") == ["cuda:0", "cuda:1", "cuda:1"]
    assert placed_devices(stages, "cpu") == ["cpu"] * 3
    assert placed_devices(stages, "auto:4") == ["cuda:0", "cuda:1", "cuda:2,cuda:3"]
    assert placed_devices(stages, "auto", lambda: 3) == ["cuda:0", "cuda:1", "cuda:2"]
    for bad, message in [(["cuda:0"], "lists 1 device(s) for the 3 stages"), (3, "placement must be one of"),
                         ("auto:x", "auto:N needs a number"), ([1, 2, 3], "one device per stage")]:  # fmt: skip
        with pytest.raises(ConfigError, match=re.escape(message)):
            placed_devices(stages, bad)


def test_more_gpu_stages_than_gpus_is_one_error_naming_placement():
    stages = read_hierarchy("llama3_1b_8b_70b")["stages"]
    for n_gpus, hint in [(0, "run.plan=true"), (1, "placement=cuda:0"), (3, "placement=auto")]:
        with pytest.raises(ConfigError, match=f"has {n_gpus} GPUs: set {hint}") as raised:
            check_gpu_count("llama3_1b_8b_70b", stages, n_gpus, f"{n_gpus} GPUs")
        assert "cuda:3" in str(raised.value) and "\n" not in str(raised.value)
    check_gpu_count("llama3_1b_8b_70b", stages, 4, "4 GPUs")  # enough: no error
    with pytest.raises(ConfigError, match="set placement=cpu"):  # no nf4 stage: the CPU can run it
        check_gpu_count("llama2_68m_7b", read_hierarchy("llama2_68m_7b")["stages"], 0, "no GPU")
    with pytest.raises(ConfigError, match="placement="):  # outside plan mode, before any device is asked for
        place_stages(read_hierarchy("llama3_1b_8b_70b"), gpus=lambda: (1, "1 GPU(s)"))


@pytest.mark.parametrize("name", available())
def test_every_stage_option_is_overridable_by_index_without_plus(name):
    stages = read_hierarchy(name)["stages"]
    for i, stage in enumerate(stages):
        values = {"device": "cuda:7", "dtype": "bfloat16", "quantize": "nf4", "model": "some/model"}
        composed = compose("config", [f"models={name}"] + [f"models.stages.{i}.{k}={v}" for k, v in values.items()])
        assert {k: composed["models"]["stages"][i][k] for k in values} == values


@pytest.fixture(scope="module")
def llama_config():
    return compose("config", ["models=llama3_1b_8b_70b", "run.plan=true", "max_new_tokens=8"])


def _with(config, **top):
    return {**config, **top}


@pytest.mark.parametrize("override, message", [
    ("models.stages.0.device=cuda:x", "models.stages.0 (llama3.2-1b): stage option 'device' must be"),
    ("models.stages.1.device=tpu:0", "models.stages.1 (llama3.1-8b): stage option 'device' must be"),
    ("models.stages.2.dtype=fp8", "models.stages.2 (llama3.1-70b): stage option 'dtype' must be one of"),
    ("placement=[cuda:0,cuda:1]", "placement lists 2 device(s) for the 3 stages of llama3_1b_8b_70b"),
    ("placement=auto:2", "placement=auto gives each of the 3 model stages its own GPU, but 2"),
    ("precision=fp8", "precision must be null, fp32, fp16 or bf16"),
])  # fmt: skip
def test_a_bad_stage_override_is_one_config_error(override, message):
    config = compose("config", ["models=llama3_1b_8b_70b", "run.plan=true", override])
    with pytest.raises(ConfigError) as raised:
        RunConfig.from_config(config)
    assert str(raised.value).startswith(message) and "\n" not in str(raised.value)


def test_an_index_past_the_last_stage_is_a_config_error():
    with pytest.raises(ConfigError, match="models.stages.3.device"):
        compose("config", ["models=llama3_1b_8b_70b", "models.stages.3.device=cuda:0"])


def test_placement_and_precision_are_recorded_in_the_run_config(llama_config):
    plain = RunConfig.from_config(llama_config)
    assert plain.raw == llama_config and plain.hierarchy == "llama3_1b_8b_70b"
    placed = RunConfig.from_config(_with(llama_config, placement="cuda:0", precision="bf16"))
    assert [s.device for s in placed.stages] == ["cuda:0"] * 3 and {s.dtype for s in placed.stages} == {"bfloat16"}
    assert placed.stages[2].quantize == "nf4"  # the 70B stays in 4 bits, computing in bf16
    assert placed.hierarchy == placed.raw["models"]["name"] == "llama3_1b_8b_70b_bf16"
    assert [s["device"] for s in placed.raw["models"]["stages"]] == ["cuda:0"] * 3  # config.yaml: as run
    assert RunConfig.from_config(placed.raw) == placed  # applying it again changes nothing
    same = RunConfig.from_config(_with(llama_config, precision="fp16"))  # already fp16: nothing changes
    assert same.hierarchy == "llama3_1b_8b_70b" and same.raw == _with(llama_config, precision="fp16")
