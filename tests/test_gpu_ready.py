"""GPU readiness without a GPU: placement, fail-fast CUDA / nf4 errors, plan memory, NVML figures,
and fp16 / bf16 identity classified into identical / near-tie / unexplained."""

import math

import pytest
import torch

from pipespec import Pipeline
from pipespec.errors import ConfigError
from pipespec.gpu import (
    GpuSampler,
    energy_j,
    physical_index,
    pool_gpu_figures,
    sample_gpu_figures,
    stage_sampler,
)
from experiments.hierarchies import read_hierarchy, resolve_stages, available
from pipespec.models import assign_devices, load_kwargs
from pipespec.specs import place_devices, StageSpec
from experiments.plan import CUDA_CONTEXT_GIB, GIB, device_budget, format_plan, plan_stages
from analysis.rundir import classify_identity, classify_mismatch, near_tie_threshold
from experiments.tiny import build_flat_hierarchy, random_prompts
from pipespec.trace import StageTrace

NO_GPU = not torch.cuda.is_available()


# ---- placement ------------------------------------------------------------------------


def test_auto_takes_one_whole_free_gpu_per_stage():
    assert place_devices(["auto", "auto", "cuda:0"], 3) == ["cuda:1", "cuda:2", "cuda:0"]
    assert place_devices(["auto", "cuda:1,cuda:2", "auto"], 4) == ["cuda:0", "cuda:1,cuda:2", "cuda:3"]
    # more auto stages than free GPUs: whole free GPUs shared round-robin, never a named one
    assert place_devices(["auto", "auto", "auto", "cuda:0"], 3) == ["cuda:1", "cuda:2", "cuda:1", "cuda:0"]
    assert place_devices(["auto", "cpu"], 0) == ["cpu", "cpu"]
    with pytest.raises(ConfigError, match="every one of the 2 GPU"):
        place_devices(["auto", "cuda:0", "cuda:1"], 2)


def test_assign_devices_resolves_auto_specs_only():
    specs = [StageSpec(model="a", device="auto"), StageSpec(model="b", device="cuda:0")]
    placed = assign_devices(specs, n_gpus=2)
    assert [s.device for s in placed] == ["cuda:1", "cuda:0"]
    assert [s.device for s in assign_devices([StageSpec(model="a", device="auto")], n_gpus=0)] == ["cpu"]


def test_a_single_gpu_stage_loads_straight_onto_its_gpu():
    one = load_kwargs(StageSpec(model="m", device="cuda:1"), torch.float16)
    assert one == {"dtype": torch.float16, "device_map": {"": "cuda:1"}}
    assert load_kwargs(StageSpec(model="m", device="cuda"), torch.float16)["device_map"] == {"": "cuda:0"}
    assert "device_map" not in load_kwargs(StageSpec(model="m", device="cpu"), torch.float32)
    split = load_kwargs(StageSpec(model="m", device="cuda:2,cuda:3"), torch.float16, lambda i: 40 * GIB + i)
    assert split["device_map"] == "auto" and split["max_memory"] == {2: 40 * GIB + 2, 3: 40 * GIB + 3}


# ---- fail fast ----------------------------------------------------------------------------


@pytest.mark.skipif(not NO_GPU, reason="a machine without CUDA")
def test_a_cuda_device_without_cuda_is_one_config_error(monkeypatch):
    if torch.version.cuda is None:
        with pytest.raises(ConfigError, match="CPU-only build"):
            StageSpec.from_any({"model": "m", "device": "cuda:0"})
    monkeypatch.setattr(torch.version, "cuda", "12.4")  # a CUDA build that finds no GPU
    with pytest.raises(ConfigError, match="CUDA is not available"):
        StageSpec.from_any({"model": "m", "device": "cuda:0"})
    # plan mode does not ask
    assert StageSpec.from_any({"model": "m", "device": "cuda:0"}, check_devices=False).device == "cuda:0"


def test_nf4_needs_cuda_and_bitsandbytes(monkeypatch):
    import importlib.util

    with pytest.raises(ConfigError, match="nf4' needs CUDA devices"):
        StageSpec.from_any({"model": "m", "device": "cpu", "quantize": "nf4"}, check_devices=False)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "bitsandbytes" else real(name, *a))
    with pytest.raises(ConfigError, match="needs bitsandbytes"):
        StageSpec.from_any({"model": "m", "device": "cuda:2,cuda:3", "quantize": "nf4"})


def test_nf4_config_is_refused_before_any_stage_starts(tmp_path, monkeypatch):
    import pipespec.api

    started = []
    monkeypatch.setattr(pipespec.api.Pipeline, "start", lambda self: started.append(1))
    stages = read_hierarchy("llama3_1b_8b_70b")["stages"]
    with pytest.raises(ConfigError, match="CUDA|bitsandbytes"):
        Pipeline(stages, strategy="pipespec")
    assert not started


# ---- plan -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [n for n in available() if n.startswith("llama")])
def test_every_llama_config_plans_on_a_cpu_machine(name):
    specs = resolve_stages(read_hierarchy(name)["stages"], check_devices=False)
    rows = plan_stages(specs)
    text = format_plan(rows)
    budget = device_budget(rows)
    for device, entry in budget.items():
        assert device.startswith("cuda")
        stages_here = sum(device in row.devices for row in rows)
        assert entry["cuda_context"] == pytest.approx(stages_here * CUDA_CONTEXT_GIB)
        assert f"CUDA context {entry['cuda_context']:.2f} GiB" in text
    assert "?" not in text.split("per device")[1]


def test_plan_counts_kv_cache_and_cuda_context_per_device():
    specs = resolve_stages(read_hierarchy("tiny_k2")["stages"], check_devices=False)
    specs = [StageSpec(**{**s.__dict__, "device": "cuda:0"}) for s in specs]
    rows = plan_stages(specs, context_tokens=256)
    config = {"layers": 2, "kv_heads": 2, "head_dim": 16}  # experiments.tiny.tiny_config
    kv_per_stage = 2 * config["layers"] * config["kv_heads"] * config["head_dim"] * 4 * 256 / GIB  # K, V in fp32
    assert all(row.kv_gib == pytest.approx(kv_per_stage) for row in rows)
    entry = device_budget(rows)["cuda:0"]
    assert entry["kv"] == pytest.approx(2 * kv_per_stage)
    assert entry["cuda_context"] == 2 * CUDA_CONTEXT_GIB
    assert entry["total"] == pytest.approx(entry["weights"] + entry["kv"] + entry["cuda_context"])


# ---- GPU figures --------------------------------------------------------------------------


class FakeBackend:
    """A GPU whose power is 100 W + 10 W per sample taken, utilisation 50%, memory rising."""

    name = "fake"

    def __init__(self):
        self.n = 0

    def describe(self, index):
        return {"index": index, "name": "FakeGPU"}

    def read(self, indices):
        self.n += 1
        return {i: (50.0, 1000.0 + self.n, 100.0 + 10 * self.n) for i in indices}

    def close(self):
        pass


def test_energy_is_the_integral_of_power_clipped_to_the_window():
    assert energy_j([0.0, 1.0, 2.0], [100.0, 100.0, 100.0], 0.5, 1.5) == pytest.approx(100.0)
    assert energy_j([0.0, 2.0], [0.0, 200.0], 0.0, 2.0) == pytest.approx(200.0)  # a ramp: mean 100 W
    assert energy_j([0.0, 2.0], [0.0, 200.0], 1.0, 2.0) == pytest.approx(150.0)
    assert energy_j([1.0], [50.0], 0.0, 4.0) == pytest.approx(200.0)  # one sample: held flat
    assert energy_j([], [], 0.0, 1.0) is None


def test_sampler_windows_ship_in_traces_and_pool_into_the_summary():
    sampler = GpuSampler([0], FakeBackend(), interval_s=0.0)
    for _ in range(5):
        sampler.sample_once()
    times = [row[0] for row in sampler.samples[0]]
    window = sampler.window(times[1], times[3])
    assert len(window) == 1 and window[0]["name"] == "FakeGPU"
    assert window[0]["t"] == times  # the samples inside plus one either side
    trace = StageTrace(0, "s")
    trace.gpu = window
    again = StageTrace.from_dict(trace.to_dict())
    assert again.gpu == window
    assert "gpu" not in StageTrace(0, "cpu-stage").to_dict() and StageTrace.from_dict(
        StageTrace(0, "old").to_dict()
    ).gpu is None  # old traces and CPU stages: no "gpu" key
    figures = sample_gpu_figures([trace.to_dict(), StageTrace(1, "cpu").to_dict()])
    assert figures[0]["utilization_mean_pct"] == 50.0 and figures[0]["memory_peak_mib"] == 1005.0
    expected = energy_j(window[0]["t"], window[0]["power_w"], times[1], times[3])
    assert figures[0]["energy_j"] == pytest.approx(expected)
    pooled = pool_gpu_figures([{"new_tokens": 10, "gpu": figures}, {"new_tokens": 30, "gpu": figures}])
    assert pooled[0]["energy_per_token_j"] == pytest.approx(2 * expected / 40)
    assert pooled[0]["power_mean_w"] == pytest.approx(expected / (times[3] - times[1]))
    assert pool_gpu_figures([{"new_tokens": 10, "gpu": None}]) is None  # CPU runs: null


def test_no_gpu_means_no_sampler_and_visible_devices_are_mapped():
    assert stage_sampler(["cpu"]) is None
    if NO_GPU:
        assert stage_sampler(["cuda:0"]) is None or stage_sampler(["cuda:0"]).backend.name == "nvidia-smi"
    assert physical_index(1, "4,5,6") == 5 and physical_index(1, "") == 1 and physical_index(0, "GPU-abc") == 0


# ---- identity classes ---------------------------------------------------------------------


def test_thresholds_follow_the_dtype_precision():
    assert near_tie_threshold("float16") == pytest.approx(4 * 2**-10 * 32)
    assert near_tie_threshold("bfloat16") == pytest.approx(8 * near_tie_threshold("float16"))
    assert near_tie_threshold("float32") < 1e-4


def test_mismatches_are_classified_by_the_margin_where_they_diverge():
    reference = {"sample_id": "a", "output_ids": [1, 2, 3, 4], "target_margins": [2.0, 0.01, 3.0, 3.0]}
    flip = {"sample_id": "a", "output_ids": [1, 2, 9, 9], "target_margins": [2.0, 0.01, 0.02, 1.0]}
    wrong = {"sample_id": "a", "output_ids": [1, 7, 3, 4], "target_margins": [2.0, 0.01, 3.0, 3.0]}
    old = {"sample_id": "a", "output_ids": [1, 2, 9, 9]}  # a record from before margins were recorded
    assert classify_mismatch(reference, reference, 0.125) is None
    near = classify_mismatch(flip, reference, 0.125)
    assert (near["position"], near["margin"], near["reference_margin"], near["class"]) == (2, 0.02, 3.0, "unexplained")
    reference_tie = dict(reference, target_margins=[2.0, 0.01, 0.05, 3.0])
    assert classify_mismatch(flip, reference_tie, 0.125)["class"] == "near_tie"
    assert classify_mismatch(wrong, reference, 0.125)["class"] == "near_tie"  # position 1: margin 0.01 in both
    assert classify_mismatch(wrong, reference, 0.005)["class"] == "unexplained"
    assert classify_mismatch(old, reference_tie, 0.125)["class"] == "unexplained"
    identity = classify_identity([flip, {"sample_id": "b", "output_ids": [5]}], [reference_tie, {"sample_id": "b", "output_ids": [5]}], 0.125)
    assert (identity["identical"], identity["near_tie"], identity["unexplained"]) == (1, 1, 0)
    assert identity["mismatches"][0]["sample_id"] == "a"


def _records(pipe, prompts, tokens, strategy):
    out = []
    for i, prompt in enumerate(prompts):
        result = pipe.generate(prompt, tokens, strategy=strategy)
        assert len(result.margins) == len(result.tokens)
        out.append({"sample_id": i, "output_ids": result.tokens, "target_margins": result.margins})
    return out


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", ["tiny_k2", "tiny_k3"])
def test_tiny_hierarchies_in_half_precision_match_their_greedy(name, dtype):
    stages = [dict(s, dtype=dtype) for s in read_hierarchy(name)["stages"]]
    prompts = random_prompts(3, length=10, seed=7)
    with Pipeline(resolve_stages(stages), strategy="greedy", lookahead=3) as pipe:
        reference = _records(pipe, prompts, 24, "greedy")
        for strategy in ("sd", "pipespec"):
            identity = classify_identity(_records(pipe, prompts, 24, strategy), reference, near_tie_threshold(dtype))
            assert identity["unexplained"] == 0, identity
            assert identity["identical"] + identity["near_tie"] == len(prompts)


def test_flat_logits_make_near_ties_and_a_wrong_output_is_unexplained(tmp_path):
    dtype = "float16"
    threshold = near_tie_threshold(dtype)
    paths = build_flat_hierarchy(tmp_path / "flat")
    prompts = random_prompts(4, length=8, seed=0)
    with Pipeline([{"model": p, "dtype": dtype} for p in paths], strategy="greedy", lookahead=4) as pipe:
        reference = _records(pipe, prompts, 16, "greedy")
        speculative = _records(pipe, prompts, 16, "sd") + [
            dict(r, sample_id=r["sample_id"] + 100) for r in _records(pipe, prompts, 16, "pipespec")
        ]
    reference += [dict(r, sample_id=r["sample_id"] + 100) for r in reference]
    identity = classify_identity(speculative, reference, threshold)
    # verifying n tokens runs other kernels than a one-token step: with flat logits argmaxes flip
    assert identity["near_tie"] >= 1 and identity["unexplained"] == 0, identity
    assert all(m["margin"] < threshold for m in identity["mismatches"])
    # a deliberately wrong token where the target was sure: unexplained
    with Pipeline(resolve_stages(read_hierarchy("tiny_k2")["stages"]), strategy="greedy") as pipe:
        (good,) = _records(pipe, prompts[:1], 16, "greedy")
    position = max(range(16), key=lambda i: good["target_margins"][i])
    assert good["target_margins"][position] > near_tie_threshold("float32")
    bad = dict(good, output_ids=[*good["output_ids"][:position], (good["output_ids"][position] + 1) % 256])
    verdict = classify_identity([bad], [good], near_tie_threshold("float32"))
    assert verdict["unexplained"] == 1 and verdict["mismatches"][0]["position"] == position
    assert math.isfinite(verdict["mismatches"][0]["margin"])


def test_a_run_records_margins_identity_classes_and_gpu_facts(tmp_path):
    import json

    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from experiments.runner import run_experiment

    from experiments.compose import CONF_MODULE

    summaries = {}
    for strategy in ("greedy", "sd"):
        with initialize_config_module(config_module=CONF_MODULE, version_base="1.3"):
            cfg = compose("config", overrides=[
                "models=tiny_k2", f"strategy={strategy}", "dataset=news_lee_cnndm", "dataset.n_samples=2",
                "max_new_tokens=8", "run.start_timeout_s=120", "run.warmup_tokens=0",
            ])  # fmt: skip
        summaries[strategy] = run_experiment(OmegaConf.to_container(cfg, resolve=True), tmp_path / strategy, False)
    identity = summaries["sd"]["identity"]
    assert (identity["identical"], identity["near_tie"], identity["unexplained"]) == (2, 0, 0)
    assert summaries["sd"]["identical_to_greedy"] == "2/2" and summaries["sd"]["gpu"] is None
    record = json.loads((tmp_path / "sd" / "samples.jsonl").read_text().splitlines()[0])
    assert len(record["target_margins"]) == record["new_tokens"] and record["gpu"] is None
    env = json.loads((tmp_path / "sd" / "env.json").read_text())
    assert {"cuda", "driver", "bitsandbytes"} <= set(env)


@pytest.mark.slow
def test_the_gpu_check_runs_on_a_cpu():
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    result = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--device", "cpu", "--dtypes", "float16", "--hierarchies", "tiny_k2",
         "--prompts", "1", "--tokens", "8"],
        cwd=root, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHON": sys.executable},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "8-token / 1-token step time" in result.stdout and "unexplained 0" in result.stdout
    assert "OK: 0 unexplained" in result.stdout
