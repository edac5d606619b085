"""oneDNN prepacked fp32 linears (pipespec.kernels): the option, its measured resolution, and exactness on a tiny
model."""

import json
import os

import pytest

from pipespec.errors import ConfigError
from pipespec.models import resolved_kernels
from pipespec.specs import StageSpec


@pytest.mark.parametrize(
    "options, message",
    [
        ({"kernels": "fast"}, "'kernels' must be one of"),
        ({"kernels": "onednn", "quantize": "int8-dynamic"}, "cannot apply: quantize int8-dynamic"),
        ({"kernels": "onednn", "dtype": "bfloat16"}, "cannot apply: dtype bfloat16"),
    ],
)
def test_bad_kernels_option_is_refused_clearly(options, message):
    with pytest.raises(ConfigError, match=message):
        StageSpec.from_any({"model": "some/model", **options})


def test_auto_means_the_measured_kernel_where_prepacking_applies_and_the_environment_can_pin_it(monkeypatch):
    from pipespec import kernels

    measured = []
    monkeypatch.setattr(kernels, "cached_choice", lambda spec, measure: measured.append(spec) or {"choice": "torch"})
    monkeypatch.delenv("PIPESPEC_KERNELS", raising=False)
    assert resolved_kernels(StageSpec(model="m")) == "torch" and len(measured) == 1  # the measured choice
    assert resolved_kernels(StageSpec(model="m", quantize="int8-dynamic")) == "torch"  # nothing to measure
    assert resolved_kernels(StageSpec(model="m", kernels="torch")) == "torch"
    assert resolved_kernels(StageSpec(model="m", kernels="onednn")) == "onednn"  # explicit: never measured
    assert resolved_kernels(StageSpec(kind="prompt_lookup")) is None and len(measured) == 1
    monkeypatch.setenv("PIPESPEC_KERNELS", "torch")
    assert resolved_kernels(StageSpec(model="m")) == "torch"
    assert resolved_kernels(StageSpec(model="m", kernels="onednn")) == "onednn"  # explicit wins
    monkeypatch.setenv("PIPESPEC_KERNELS", "onednn")  # prepacked wherever it applies: an int8 stage keeps its kernels
    assert resolved_kernels(StageSpec(model="m")) == "onednn"
    assert resolved_kernels(StageSpec(model="m", quantize="int8-dynamic")) == "torch"
    monkeypatch.setenv("PIPESPEC_KERNELS", "auto")
    assert resolved_kernels(StageSpec(model="m")) == "torch" and len(measured) == 2
    monkeypatch.setenv("PIPESPEC_KERNELS", "fastest")
    with pytest.raises(ConfigError, match="PIPESPEC_KERNELS must be one of"):
        resolved_kernels(StageSpec(model="m"))


def test_the_faster_kernel_is_chosen_and_a_tie_keeps_torchs():
    from pipespec.kernels import choose

    assert choose({"torch": [0.08, 0.09, 0.11, 0.15], "onednn": [0.09, 0.09, 0.09, 0.10]}) == "onednn"
    assert choose({"torch": [0.07, 0.08], "onednn": [0.09, 0.09]}) == "torch"  # prepacking loses: never chosen
    assert choose({"torch": [0.1], "onednn": [0.1]}) == "torch"


def test_the_choice_is_measured_once_per_machine_model_and_threads(tiny_models, monkeypatch, tmp_path):
    """The first resolution measures and caches; the next ones read the cache (another process too); another
    thread count is another choice; a model that loses on oneDNN is loaded with torch's kernels."""
    import subprocess
    import sys

    from pipespec import kernels, models
    from pipespec.models import load_model

    monkeypatch.setenv("PIPESPEC_CACHE", str(tmp_path))
    monkeypatch.setenv("PIPESPEC_KERNELS", "auto")
    target = tiny_models([])[-1]
    calls = []

    def measure(spec):
        calls.append(spec.threads)
        return {"choice": "torch", "step_s": {"torch": [0.01], "onednn": [0.02]}}

    monkeypatch.setattr(models, "measure_kernel_choice", measure)
    spec = StageSpec(model=target)
    assert resolved_kernels(spec) == "torch" and resolved_kernels(spec) == "torch" and calls == [1]
    assert resolved_kernels(StageSpec(model=target, threads=2)) == "torch" and calls == [1, 2]
    assert not any(isinstance(m, kernels.PrepackedLinear) for m in load_model(spec).modules()) and calls == [1, 2]
    record = json.loads(kernels.choice_path(kernels.choice_key(spec)).read_text())
    assert record["choice"] == "torch" and record["key"]["threads"] == 1 and record["step_s"]["onednn"] == [0.02]
    other = subprocess.run([sys.executable, "-c", "import sys; from pipespec.models import resolved_kernels; "
                            "from pipespec.specs import StageSpec; print(resolved_kernels(StageSpec(model=sys.argv[1])))",
                            target], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PIPESPEC_CACHE": str(tmp_path), "PIPESPEC_KERNELS": "auto"})  # fmt: skip
    assert other.returncode == 0 and other.stdout.strip() == "torch", other.stderr[-2000:]


def test_measuring_times_both_kernels_on_the_stages_model_and_restores_it(tiny_models):
    """A real measurement on a tiny model: medians for every size of both kernels, and the switch between
    them puts back the very modules the model had."""
    import torch

    from pipespec import kernels
    from pipespec.models import load_model, measure_kernel_choice

    spec = StageSpec(model=tiny_models([])[-1], kernels="torch")
    record = measure_kernel_choice(spec, sizes=(1, 4), repeats=1)
    assert record["choice"] in ("onednn", "torch") and record["sizes"] == [1, 4]
    assert set(record["step_s"]) == {"torch", "onednn"} and all(len(t) == 2 and min(t) > 0
                                                                for t in record["step_s"].values())  # fmt: skip
    model = load_model(spec)
    before = [type(m) for m in model.modules()]
    switch = kernels.LinearSwitch(model)
    switch.use(prepacked=True)
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    switch.use(prepacked=False)
    assert [type(m) for m in model.modules()] == before


def test_prepacked_model_decodes_and_verifies_like_the_plain_one(tiny_models):
    """Same greedy tokens as torch's kernels, logits within float rounding, and one pass over a whole
    continuation (a verification) picks the greedy token at every position."""
    import torch

    from pipespec.kernels import PrepackedLinear
    from pipespec.models import CausalLMRunner, load_model
    from experiments.profiler_acceptance import greedy_continuation
    from experiments.tiny import random_prompts

    torch.set_num_threads(1)
    target = tiny_models([])[-1]
    plain = CausalLMRunner(load_model(StageSpec(model=target, kernels="torch")))
    packed = CausalLMRunner(load_model(StageSpec(model=target, kernels="onednn")))
    assert isinstance(packed.model.lm_head, PrepackedLinear)
    assert not any(type(m) is torch.nn.Linear for m in packed.model.modules())
    assert not any(isinstance(m, PrepackedLinear) for m in plain.model.modules())
    for prompt in random_prompts(3, length=10, seed=5):
        plain.start(), packed.start()
        torch.testing.assert_close(packed.forward(prompt, [7, 8, 9]), plain.forward(prompt, [7, 8, 9]),
                                   rtol=1e-4, atol=1e-4)  # fmt: skip
        output = greedy_continuation(packed, prompt, 24)
        assert output == greedy_continuation(plain, prompt, 24)
        packed.start()
        assert packed.forward(prompt, output[:-1]).argmax(-1).tolist() == output


def test_experiment_variants_are_parsed_and_a_bad_one_is_refused_in_one_line(capsys):
    from experiments.kernels import main, parse_variants

    assert parse_variants("onednn, compile") == ("onednn", "compile")
    for text, message in [("torch,fast", "unknown fast; allowed: torch, onednn, exported, compile"), (",", "at least one"),
                          ("torch,torch", "named twice")]:  # fmt: skip
        with pytest.raises(ValueError, match=message):
            parse_variants(text)
    assert main(["--variants", "onednn,fastest", "models=tiny_k2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --variants: unknown fastest"), err


def test_a_failing_compiled_variant_is_reported_and_the_others_measured(tiny_models, monkeypatch, one_thread):
    """An error of the compiled model (here: at its first call) fails that variant with a one-line reason."""
    from experiments import kernels
    from experiments.tiny import random_prompts
    from pipespec import compiled

    def broken(model):
        def forward(*args, **kwargs):
            raise RuntimeError("inductor said no\n  at some depth")

        model.forward = forward
        return model

    monkeypatch.setattr(compiled, "compile_forward", broken)  # what the `compile` variant applies
    prompts = [(f"p{i}", p) for i, p in enumerate(random_prompts(2, length=8, seed=3))]
    stage = kernels.compare_stage(StageSpec(model=tiny_models([])[-1]), ("torch", "compile", "onednn"), prompts,
                                  max_fed=2, repeats=1, budget=4, log=lambda text: None)  # fmt: skip
    assert stage["failed"] == {"compile": "RuntimeError: inductor said no at some depth"}
    assert list(stage["step_s"]) == ["torch", "onednn"] and all(len(t) == 2 for t in stage["step_s"].values())
    assert [s["identical"] for s in stage["samples"]] == [True, True]
    assert "compile" in kernels.format_markdown({"models": "tiny", "dataset": "random", "max_new_tokens": 4,
                                                 "repeats": 1, "variants": list(stage["variants"]),
                                                 "machine": {"cpu": {}, "libraries": {"torch": "x"}},
                                                 "stages": [stage]})  # fmt: skip


def test_the_unpacked_compiled_variant_compiles_torchs_model_with_inductors_prepacking_off(tiny_models, monkeypatch,
                                                                                           one_thread):  # fmt: skip
    """`compile_unpacked`: the model with torch's linears (no mkldnn weight anywhere), compiled with inductor's
    weight prepacking off, so that inductor's graph cache can keep its graphs."""
    from experiments import kernels
    from experiments.tiny import random_prompts
    from pipespec import compiled
    from pipespec.kernels import PrepackedLinear

    seen = []

    def record(model, weight_prepack=True):  # what compile_forward is given; the model stays eager
        seen.append((weight_prepack, any(isinstance(m, PrepackedLinear) for m in model.modules())))
        return model

    monkeypatch.setattr(compiled, "compile_forward", record)
    prompts = [(f"p{i}", p) for i, p in enumerate(random_prompts(2, length=8, seed=3))]
    stage = kernels.compare_stage(StageSpec(model=tiny_models([])[-1]), ("onednn", "compile_unpacked"), prompts,
                                  max_fed=2, repeats=1, budget=4, log=lambda text: None)  # fmt: skip
    assert seen == [(False, False)]
    assert list(stage["step_s"]) == ["onednn", "compile_unpacked"] and "failed" not in stage
    assert [s["identical"] for s in stage["samples"]] == [True, True]
    assert stage["warm_up"]["compile_unpacked"]["graphs"] == 0  # nothing compiled here: the check still runs
