"""The prepared GPU check's choices without a GPU (`experiments.gpu_check`): the dry run when there is none,
the real SmolLM2 pair or local checkpoints when there is, one results folder named after the machine that
never overwrites another, bad options refused before anything is built. The dry run end to end:
tests/test_gpu_ready.py::test_the_gpu_check_runs_on_a_cpu."""

import pytest

from experiments import gpu_check
from pipespec.errors import ConfigError


def test_without_a_gpu_the_check_is_a_dry_run_on_tiny_models(monkeypatch):
    monkeypatch.delenv(gpu_check.DRY_RUN_VARIABLE, raising=False)
    args = gpu_check.parse_args([], gpu=False)
    assert args.dry_run and args.device == "cpu" and args.hierarchies == ["tiny_k2"]
    assert args.dtypes == ["float32", "float16"] and (args.prompts, args.tokens) == (2, 16)


def test_on_a_gpu_it_runs_smollm2_in_three_dtypes_or_the_local_checkpoints(monkeypatch, tmp_path):
    monkeypatch.delenv(gpu_check.DRY_RUN_VARIABLE, raising=False)
    monkeypatch.delenv(gpu_check.MODELS_VARIABLE, raising=False)
    args = gpu_check.parse_args([], gpu=True)
    assert not args.dry_run and args.device == "cuda:0" and args.hierarchies == ["smollm2"]
    assert args.dtypes == ["float32", "float16", "bfloat16"] and (args.prompts, args.tokens) == (4, 128)
    specs = gpu_check.stage_specs("smollm2", "float16", "cuda:0", {})
    assert [s["dtype"] for s in specs] == ["bfloat16", "float16"] and specs[0]["model"] == specs[1]["model"]
    monkeypatch.setenv(gpu_check.DRY_RUN_VARIABLE, "1")
    assert gpu_check.parse_args([], gpu=True).dry_run
    monkeypatch.setenv(gpu_check.DRY_RUN_VARIABLE, "0")
    monkeypatch.setenv(gpu_check.MODELS_VARIABLE, f"{tmp_path}/a,{tmp_path}/b")
    assert gpu_check.parse_args([], gpu=True).hierarchies == ["local"]


@pytest.mark.parametrize("argv, message", [
    (["--dtypes", "float8"], "stage option 'dtype'"),
    (["--device", "tpu:0"], "stage option 'device'"),
    (["--hierarchies", "llama"], "unknown --hierarchies ['llama']"),
    (["--hierarchies", "local"], "GPU_CHECK_MODELS must list two or more local checkpoint directories"),
])  # fmt: skip
def test_bad_options_are_one_error_before_anything_is_built(argv, message, monkeypatch):
    monkeypatch.delenv(gpu_check.MODELS_VARIABLE, raising=False)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        gpu_check.check_options(gpu_check.parse_args(argv, gpu=False))


def test_one_results_folder_named_after_the_machine_never_overwritten(monkeypatch, tmp_path):
    facts = {"gpus": ["NVIDIA A100-SXM4-40GB"] * 4}
    assert gpu_check.machine_name(facts, dry_run=False) == "4x-nvidia-a100-sxm4-40gb"
    assert gpu_check.machine_name({"gpus": ["NVIDIA H100 80GB HBM3"]}, False) == "nvidia-h100-80gb-hbm3"
    assert gpu_check.machine_name(facts, dry_run=True).startswith("cpu-")
    monkeypatch.setattr(gpu_check, "ROOT", tmp_path)
    first = gpu_check.out_dir(None, "nvidia-h100", dry_run=False)
    assert first.parent == tmp_path / "results" / "gpu_check" and first.name.startswith("nvidia-h100_")
    first.mkdir(parents=True)
    second = gpu_check.out_dir(None, "nvidia-h100", dry_run=False)
    assert second != first and second.name == f"{first.name}-2"
    assert gpu_check.out_dir(None, "cpu-x", dry_run=True).parent == tmp_path / "outputs" / "gpu_check"
