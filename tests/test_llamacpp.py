"""The bench's llama.cpp systems (`experiments.benchlib.llamacpp`): left out with a one-line reason where
llama-cpp-python is missing, the f32 GGUF conversion plan, the identity / near-tie counting, the runner's
calls (on a stand-in for llama-cpp-python), and, where the package is installed, the real thing."""

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from experiments.benchlib import llamacpp
from experiments.benchlib.config import LLAMACPP_SYSTEMS, SYSTEMS, BenchConfigError, check_llamacpp
from experiments.benchlib.llamacpp import (IdentityLedger, LlamaCppError, LlamaCppSystems, conversion_plan,
                                           first_difference, permute_heads)  # fmt: skip
from experiments.benchlib.systems import System
from pipespec.specs import StageSpec

ROOT = Path(__file__).resolve().parent.parent
CFG = {"systems": ["hf_greedy", *LLAMACPP_SYSTEMS], "llamacpp": check_llamacpp(None)}


# ---- left out, with the reason -------------------------------------------------------------------------------
def test_missing_package_is_one_line_naming_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp raises ImportError
    reason = llamacpp.unavailable_reason()
    assert reason is not None and "\n" not in reason
    assert "not installed" in reason and reason.endswith("bash scripts/llamacpp.sh")


def test_wrong_version_is_refused(monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", types.SimpleNamespace(__version__="0.2.0"))
    assert "0.2.0 is installed" in llamacpp.unavailable_reason()


def test_every_wanted_system_is_skipped_with_the_reason(monkeypatch):
    monkeypatch.setattr(llamacpp, "unavailable_reason", lambda: "llama-cpp-python is not installed: bash scripts/llamacpp.sh")
    skipped = {}
    systems = LlamaCppSystems(CFG, StageSpec(model="tiny:target"), skipped, {})
    assert systems.models == {}
    assert skipped == {name: "llama-cpp-python is not installed: bash scripts/llamacpp.sh" for name in LLAMACPP_SYSTEMS}
    systems.close()  # nothing loaded: closes quietly


def test_another_target_has_no_gguf(monkeypatch):
    monkeypatch.setattr(llamacpp, "unavailable_reason", lambda: None)
    skipped = {}
    LlamaCppSystems({**CFG, "systems": ["llamacpp_greedy"]}, StageSpec(model="tiny:target", name="tiny-target"), skipped, {})
    assert list(skipped) == ["llamacpp_greedy"]
    assert "SmolLM2-135M-Instruct target only" in skipped["llamacpp_greedy"] and "tiny-target" in skipped["llamacpp_greedy"]


def test_config_registers_the_systems_and_checks_their_settings():
    assert set(LLAMACPP_SYSTEMS) <= set(SYSTEMS)
    assert check_llamacpp(None) == {"threads": [1, 2], "n_ctx": 2048, "kv_type": "f32", "near_tie_logit": 0.05}
    assert check_llamacpp({"threads": 2, "kv_type": "f16"})["threads"] == [2]
    for bad in ({"kv_type": "q8_0"}, {"n_ctx": 8}, {"near_tie_logit": -1}, {"threads": [0]}, {"n_threads": 2}):
        with pytest.raises(BenchConfigError, match="llamacpp"):
            check_llamacpp(bad)


# ---- the f32 GGUF conversion plan ------------------------------------------------------------------------------
def test_conversion_plan_names_and_reorders_q_and_k():
    names = ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight", "model.layers.0.self_attn.q_proj.weight",
             "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight",
             "model.layers.12.mlp.down_proj.weight", "model.layers.12.post_attention_layernorm.weight"]  # fmt: skip
    plan = {p.source: (p.name, p.heads) for p in conversion_plan(names, n_head=9, n_head_kv=3, tied=True)}
    assert "lm_head.weight" not in plan  # tied: llama.cpp reads token_embd
    assert plan["model.embed_tokens.weight"] == ("token_embd.weight", None)
    assert plan["model.norm.weight"] == ("output_norm.weight", None)
    assert plan["model.layers.0.self_attn.q_proj.weight"] == ("blk.0.attn_q.weight", 9)
    assert plan["model.layers.0.self_attn.k_proj.weight"] == ("blk.0.attn_k.weight", 3)
    assert plan["model.layers.0.self_attn.v_proj.weight"] == ("blk.0.attn_v.weight", None)
    assert plan["model.layers.12.mlp.down_proj.weight"] == ("blk.12.ffn_down.weight", None)
    assert plan["model.layers.12.post_attention_layernorm.weight"] == ("blk.12.ffn_norm.weight", None)
    untied = conversion_plan(["lm_head.weight"], 9, 3, tied=False)
    assert [(p.name, p.heads) for p in untied] == [("output.weight", None)]
    with pytest.raises(LlamaCppError, match="model.layers.0.self_attn.rotary.inv_freq"):
        conversion_plan(["model.layers.0.self_attn.rotary.inv_freq"], 9, 3, tied=True)


def test_permute_heads_interleaves_each_heads_rotary_halves():
    rows = np.arange(8, dtype=np.float32)[:, None] * np.ones((1, 3), dtype=np.float32)
    assert permute_heads(rows, 1)[:, 0].tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    assert permute_heads(rows, 2)[:, 0].tolist() == [0, 2, 1, 3, 4, 6, 5, 7]
    with pytest.raises(LlamaCppError, match="heads"):
        permute_heads(rows, 3)


def _prepared():
    from experiments.prepare import gguf_location, is_prepared, smollm2_dir

    try:
        gguf_location()
    except FileNotFoundError as error:
        pytest.skip(str(error))
    if not is_prepared(smollm2_dir()):
        pytest.skip("the SmolLM2 target is not prepared: bash scripts/setup.sh")
    return smollm2_dir(), gguf_location()


def test_plan_on_the_prepared_target_gives_the_packaged_tensors():
    """Layer 0's q and k (reordered) and v of the fp32 safetensors equal the packaged GGUF's, de-quantized."""
    import json as _json

    import gguf
    from safetensors import safe_open

    hf_dir, package = _prepared()
    config = _json.loads((hf_dir / "config.json").read_text())
    wanted = [f"model.layers.0.self_attn.{p}_proj.weight" for p in "qkv"]
    plan = conversion_plan(wanted, config["num_attention_heads"], config["num_key_value_heads"], tied=True)
    packaged = {t.name: t for t in gguf.GGUFReader(str(package)).tensors}
    with safe_open(str(hf_dir / "model.safetensors"), "np") as weights:
        for step in plan:
            raw = weights.get_tensor(step.source)
            array = permute_heads(raw, step.heads) if step.heads else raw
            tensor = packaged[step.name]
            dequantized = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(array.shape)
            assert np.array_equal(array, dequantized), step
            if step.heads:  # the reorder is needed: HF's own row order differs
                assert not np.array_equal(raw, dequantized), step


# ---- identity with the reference, near ties ------------------------------------------------------------------
def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2, 3], [1, 2]) == 2
    assert first_difference([], []) is None


class _Logits:
    """A stand-in torch model: the logits of the last position are `table[length of the input]`."""

    def __init__(self, table):
        self.table, self.calls = table, 0

    def __call__(self, input_ids):
        import torch

        self.calls += 1
        row = torch.zeros(1, input_ids.shape[1], 8)
        row[0, -1] = torch.tensor(self.table[input_ids.shape[1]])
        return types.SimpleNamespace(logits=row)


def _system(name, outputs):
    """A System whose run returns `outputs[prompt]` (as a result with .tokens)."""
    return System(name, lambda prompt, n, threads=None: types.SimpleNamespace(tokens=outputs[tuple(prompt)][:n]),
                  lambda: [], {})  # fmt: skip


def test_ledger_counts_identical_prompts_and_near_ties_in_any_order():
    p0, p1, p2 = (1, 2), (3, 4, 5), (6,)
    ref = {p0: [7, 7, 7, 7], p1: [1, 2, 3, 4], p2: [5, 5, 5, 5]}
    ours = {p0: [7, 7, 7, 7], p1: [1, 2, 6, 6], p2: [5, 4, 4, 4]}
    # margins at the first differences: p1 at index 2 (input 3 + 2 tokens), p2 at index 1 (input 1 + 1)
    logits = {5: [0, 0, 0, 1.00, 0, 0, 0.98, 0], 2: [0, 0, 0, 0, 1.5, 3.0, 0, 0]}
    model = _Logits(logits)
    reference, mine = _system("hf_greedy", ref), _system("llamacpp_greedy", ours)
    ledger = IdentityLedger("hf_greedy", max_new=4, near_tie=0.05, margin_model=lambda: model)
    ledger.watch([reference, mine])
    mine.run(list(p0), 2)  # a warm-up of another length: not compared
    assert "vs_reference" not in mine.settings
    mine.run(list(p0), 4)  # before the reference ran it: nothing to compare yet
    assert mine.settings["vs_reference"]["prompts"] == 0
    for prompt in (p0, p1, p2):
        reference.run(list(prompt), 4)
        mine.run(list(prompt), 4)
    summary = mine.settings["vs_reference"]
    assert (summary["prompts"], summary["identical"], summary["near_ties"]) == (3, 1, 1)
    assert [(d["prompt"], d["first_difference"], d["reference_token"], d["token"]) for d in summary["differing"]] == [
        (1, 2, 3, 6), (2, 1, 5, 4)]  # fmt: skip
    assert [d["hf_logit_margin"] for d in summary["differing"]] == [pytest.approx(0.02), pytest.approx(1.5)]
    calls = model.calls
    mine.run(list(p1), 4)  # the same divergence again: its margin is not computed twice
    assert model.calls == calls
    assert ledger.lines() == ["llamacpp_greedy vs hf_greedy: 1/3 prompts identical, 2 differ (1 near ties, HF logit "
                              "margin <= 0.05): prompt 1 at 2 (margin 0.02), prompt 2 at 1 (margin 1.5)"]  # fmt: skip


def test_ledger_without_a_model_reports_no_margin():
    ref, ours = {(1,): [2, 3]}, {(1,): [2, 4]}
    reference, mine = _system("greedy", ref), _system("llamacpp_q4", ours)
    IdentityLedger("greedy", 2, 0.05, None).watch([reference, mine])
    reference.run([1], 2)
    mine.run([1], 2)
    assert mine.settings["vs_reference"]["differing"][0]["hf_logit_margin"] is None
    assert mine.settings["vs_reference"]["near_ties"] == 0


# ---- the runner, on a stand-in for llama-cpp-python -------------------------------------------------------------
class _FakeLlama:
    """Greedy on a fixed continuation; remembers what `reset`, `eval` and the thread setting saw."""

    instances = []

    def __init__(self, model_path, **options):
        self.options, self.resets, self.threads, self.evals = options, 0, None, []
        _FakeLlama.instances.append(self)
        self._ctx = types.SimpleNamespace(ctx=self)

    def reset(self):
        self.resets += 1

    def eval(self, tokens):
        self.evals.append(list(tokens))

    def generate(self, tokens, **sampling):
        self.sampling = sampling
        self.eval(tokens)
        for token in [5, 6, 2, 9, 9]:  # 2 is the EOS
            yield token
            self.eval([token])

    def close(self):
        self.closed = True


@pytest.fixture
def fake_llama_cpp(monkeypatch):
    api = types.ModuleType("llama_cpp")
    api.__version__ = llamacpp.LLAMACPP_VERSION
    api.Llama = _FakeLlama
    api.llama_cpp = types.SimpleNamespace(llama_set_n_threads=lambda ctx, n, nb: setattr(ctx, "threads", (n, nb)))
    speculative = types.ModuleType("llama_cpp.llama_speculative")
    speculative.LlamaDraftModel = object
    speculative.LlamaPromptLookupDecoding = lambda **kw: (lambda ids, **_: np.array([], dtype=np.intc))
    monkeypatch.setitem(sys.modules, "llama_cpp", api)
    monkeypatch.setitem(sys.modules, "llama_cpp.llama_speculative", speculative)
    _FakeLlama.instances.clear()
    return _FakeLlama


def test_generate_is_greedy_from_an_empty_cache_and_cut_like_greedy(fake_llama_cpp):
    model = llamacpp.LlamaCppModel(Path("m.gguf"), eos_ids=[2], n_ctx=64, kv_type="f32", threads=1)
    llm = fake_llama_cpp.instances[0]
    assert llm.options["type_k"] == llm.options["type_v"] == 0 and llm.options["n_threads"] == 1
    result = model.generate([1, 2, 3], 8, threads=2)
    assert result.tokens == [5, 6, 2]  # just after the first EOS
    assert llm.threads == (2, 2) and llm.resets == 1
    assert llm.sampling["temp"] == 0.0 and llm.sampling["repeat_penalty"] == 1.0
    assert result.target_fed[0] == 3 and result.prompt_length == 3  # the whole prompt, every call
    assert model.generate([1, 2, 3], 2, threads=1).tokens == [5, 6] and llm.resets == 2
    assert result.target_stats().produced == 3 and result.time_s > 0
    with pytest.raises(LlamaCppError, match="llamacpp.n_ctx"):
        model.generate(list(range(60)), 8, threads=1)
    model.close()
    assert llm.closed


def test_make_builds_a_driver_system_at_the_chosen_threads(fake_llama_cpp, monkeypatch):
    monkeypatch.setattr(llamacpp, "weight_bytes", lambda path: 123)
    systems = LlamaCppSystems.__new__(LlamaCppSystems)
    systems.options, systems.lookup = check_llamacpp(None), {}
    systems.models = {"llamacpp_greedy": llamacpp.LlamaCppModel(Path("f32.gguf"), [2], 64, "f32", 1)}
    system = systems.make("llamacpp_greedy", System)
    assert system.kind == "hf" and system.hierarchy == "llama.cpp" and system.processes()[0][1] == os.getpid()
    assert system.settings["identical_expected"] and system.settings["weight_bytes_per_step"] == 123
    system.settings = {**system.settings, "threads": 2}  # what the thread pre-pass chose
    system.run([1], 4)
    assert fake_llama_cpp.instances[0].threads == (2, 2)


# ---- the bench, end to end ---------------------------------------------------------------------------------------
@pytest.mark.slow
def test_bench_leaves_llamacpp_out_with_its_reason_and_runs_the_rest(tmp_path):
    """On the tiny target (no GGUF; or no package) the llama.cpp row is left out, the notes say why in one line."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    args = ["random_prompt_length=8", "samples=1", "max_new_tokens=4", "repetitions=1", "warmup_tokens=0",
            "prepass_prompts=1", "progress=false", "hf.threads=1", "systems=[hf_greedy,llamacpp_greedy]",
            "hierarchies=[]", "models@k2=tiny_k2", "datasets=null"]  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "experiments.bench", *args, f"hydra.run.dir={tmp_path}"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "bench.json").read_text())
    assert [r["name"] for r in report["systems"]] == ["hf_greedy"]
    assert list(report["skipped"]) == ["llamacpp_greedy"]
    notes = [n for n in report["notes"] if n.startswith("llamacpp_greedy not run: ")]
    assert len(notes) == 1 and "\n" not in notes[0]


# ---- with llama-cpp-python installed --------------------------------------------------------------------------------
@pytest.mark.slow
def test_llamacpp_f32_matches_hf_greedy_or_near_ties():
    reason = llamacpp.unavailable_reason()
    if reason:
        pytest.skip(reason)
    import torch

    from pipespec.models import eos_token_ids, load_model

    hf_dir, _ = _prepared()
    target = StageSpec(model=str(hf_dir), dtype="float32", quantize=None)
    hf = load_model(target)
    eos = eos_token_ids(str(hf_dir))
    from pipespec.models import load_tokenizer

    tokenizer = load_tokenizer(str(hf_dir))
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Write a Python function that adds two numbers."}],
                                         tokenize=False, add_generation_prompt=True)  # fmt: skip
    prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
    with torch.inference_mode():
        out = hf.generate(input_ids=torch.tensor([prompt]), max_new_tokens=16, do_sample=False, eos_token_id=eos)
    from pipespec.decoding import final_output

    reference = final_output(out[0, len(prompt):].tolist(), 16, eos)
    model = llamacpp.LlamaCppModel(llamacpp.ensure_f32_gguf(quiet=True), eos, 256, "f32", 1)
    lookup = llamacpp.LlamaCppModel(llamacpp.ensure_f32_gguf(quiet=True), eos, 256, "f32", 1,
                                    {"max_matching_ngram_size": 3, "prompt_lookup_num_tokens": 8})  # fmt: skip
    first, again = model.generate(prompt, 16, threads=1), model.generate(prompt, 16, threads=2)
    assert first.target_fed[0] == again.target_fed[0] == len(prompt)  # no prompt reused from the last call
    for result in (first, again, lookup.generate(prompt, 16, threads=1)):
        index = first_difference(reference, result.tokens)
        if index is not None:  # a near tie of two fp32 implementations, nothing more
            margin = llamacpp.logit_margin(hf, prompt, reference, index, result.tokens[index])
            assert abs(margin) < 0.05, (index, margin)
    model.close()
    lookup.close()


@pytest.mark.slow
def test_llamacpp_prompt_lookup_takes_a_prompt_longer_than_one_batch():
    """llama.cpp's prompt lookup keeps every position's logits; a prompt over its batch (512 tokens) once
    overflowed the buffer llama-cpp-python sized for one batch (a news_lee prompt of 644 tokens)."""
    reason = llamacpp.unavailable_reason()
    if reason:
        pytest.skip(reason)
    hf_dir, _ = _prepared()
    from pipespec.models import eos_token_ids

    lookup = llamacpp.LlamaCppModel(llamacpp.ensure_f32_gguf(quiet=True), eos_token_ids(str(hf_dir)), 1024, "f32", 1,
                                    {"max_matching_ngram_size": 3, "prompt_lookup_num_tokens": 8})  # fmt: skip
    prompt = [(17 * i) % 5000 + 100 for i in range(600)]
    result = lookup.generate(prompt, 4, threads=1)
    assert len(result.tokens) == 4 and sum(result.target_fed) >= len(prompt)
    lookup.close()
