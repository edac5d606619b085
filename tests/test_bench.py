"""`python -m experiments.bench` end to end on tiny models, and its arithmetic on hand-made traces."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipespec.api import GenerationResult
from experiments.compose import load as load_conf
from pipespec.trace import StageTrace

ROOT = Path(__file__).resolve().parent.parent
SYSTEMS = ["hf_greedy", "hf_assisted", "hf_prompt_lookup", "greedy", "sd", "pipespec_k2", "pipespec_k3"]
CASCADE = "pipespec@tiny_pld_k3"  # listed in `systems`, with its own settings in `system_options`
MORE = ["sd@tiny_k2", "pipespec@tiny_k2"]  # `hierarchies`: each in a pipeline of its own
TINY = [
    "random_prompt_length=12",
    "samples=2",
    "max_new_tokens=8",
    "repetitions=2",
    "warmup_tokens=4",
    "prepass_prompts=1",
    "progress=false",
    "hf.threads=1",  # the thread pre-pass has its own test
    "greedy_threads=[1]",
    "systems=[" + ",".join(SYSTEMS + [CASCADE]) + "]",  # auto has its own test (tests/test_auto.py)
    "hierarchies=[tiny_k2]",
    'system_options=[{system:"pipespec@tiny_k2",lookahead:1},{system:"pipespec@tiny_pld_k3",cascade:true}]',
    "models@k2=tiny_k2",
    "k3.name=tiny_pld_k3",
    'k3.stages=[{kind:prompt_lookup,ngram_size:3,max_proposal:8},{model:"tiny:draft_noise0.05"},{model:"tiny:target"}]',
    "sd_windows=[2,3]",
    "hf.assisted=[{num_assistant_tokens:20},{num_assistant_tokens:3,assistant_confidence_threshold:0.0}]",
]


def bench(tmp_path, *overrides, timeout=240, kernels="torch"):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PIPESPEC_KERNELS=kernels)
    return subprocess.run(
        [sys.executable, "-m", "experiments.bench", *overrides, f"hydra.run.dir={tmp_path}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
    )


@pytest.mark.slow
def test_bench_end_to_end_on_tiny_models(tmp_path):
    done = bench(tmp_path, *TINY, kernels="onednn")  # oneDNN for our stages (pinned: tiny models measure torch's
    # faster), torch's for HF
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "bench.json").read_text())
    rows = {r["name"]: r for r in report["systems"]}
    assert list(rows) == SYSTEMS + [CASCADE] + MORE
    assert rows["pipespec@tiny_k2"]["settings"]["lookahead"] == 1 and rows["pipespec_k2"]["settings"]["lookahead"] == 0
    assert rows[CASCADE]["settings"]["cascade"] is True and not rows["pipespec_k3"]["settings"]["cascade"]
    assert rows["pipespec@tiny_k2"]["hierarchy"] == "tiny_k2" and rows["sd@tiny_k2"]["settings"]["window"] in (2, 3)
    assert [p["window"] for p in report["prepass"]["sd@tiny_k2"]] == [2, 3, 2, 3]
    assert report["hierarchies"]["k2"]["kernels"] == ["onednn", "onednn"] and report["hf_kernels"] == "torch"
    for name, r in rows.items():
        assert r["tokens_per_s_min"] <= r["tokens_per_s_median"] <= r["tokens_per_s_max"], name
        assert len(r["tokens_per_s_per_repetition"]) == 2 and r["runs"] == 4
        # every system returns exactly greedy's tokens (tiny models have no near-ties)
        assert r["identical_to_greedy"] == "4/4", name
        assert r["peak_rss_mb"] and all(p["peak_rss_mb"] > 0 for p in r["peak_rss_mb"]), name
        assert r["ratio_vs_hf_greedy"] is not None and r["ratio_vs_hf_assisted"] is not None
    assert rows["hf_greedy"]["ratio_vs_hf_greedy"] == pytest.approx(1.0)
    assert len(rows["pipespec_k3"]["peak_rss_mb"]) == 3 and len(rows["hf_greedy"]["peak_rss_mb"]) == 1
    for name in ("greedy", "sd", "pipespec_k2", "pipespec_k3", CASCADE, *MORE):
        r = rows[name]
        assert r["ideal_bound_tokens_per_s"] > 0 and 0 < r["target_busy_fraction"] <= 1
        assert r["breakdown"]["stages"][-1]["compute_ms_per_token"] > 0
    assert rows["sd"]["settings"]["window"] in (2, 3) and report["sd_best_window"] == rows["sd"]["settings"]["window"]
    assert [(p["window"], p["draft_confidence"]) for p in report["prepass"]["sd"]] == [(2, 0.0), (3, 0.0), (2, 0.4), (3, 0.4)]
    assert len(report["prepass"]["hf_assisted"]) == 2
    assert rows["hf_prompt_lookup"]["settings"] == {"prompt_lookup_num_tokens": 8, "max_matching_ngram_size": 3}
    assert {t["target"] for t in report["targets"]} >= {"greedy_vs_hf_greedy", "pipespec_vs_ideal",
                                                        "best_speculative_vs_hf_greedy", "best_pipespec_vs_best_sd"}
    assert all(t["met"] or t["why"] for t in report["targets"])  # a miss says why
    table = (tmp_path / "bench.md").read_text()
    cpu = report["machine"]["cpu"]  # a VM's CPU name alone hides generations that measure 2x apart
    assert cpu["name"] and cpu["torch_capability"] and f"machine: {cpu['name']} (family {cpu['family']}" in table
    assert "| system | tok/s median |" in table and "## Where the time goes" in table
    assert all(f"| {name} |" in table for name in SYSTEMS + [CASCADE] + MORE)
    assert "kernels: tiny_k2 onednn/onednn;" in table and "HF systems torch" in table
    assert "| system | tok/s median |" in done.stdout  # printed too
    # the bench composes the runner's group files (no copies of their settings)
    assert report["config"]["pipespec"] == load_conf("strategy", "pipespec")
    assert report["config"]["k2"] == load_conf("models", "tiny_k2")
    assert "| mean acceptance length | draft acceptance rate |" in table
    runs = json.loads((tmp_path / "runs.json").read_text())
    assert len(runs) == 10 * 4 and all("stage_traces" in r for r in runs if r["system"] == "pipespec_k3")


@pytest.mark.parametrize(
    "override, message",
    [
        ("systems=[hf_greedy,nope]", "unknown system(s) ['nope']"),
        ("dataset=nothing", "unknown dataset 'nothing'"),
        ("pipespec.max_lead=0", "pipespec: max_lead must be an integer >= 1"),
        ("hierarchies=[nowhere]", "hierarchies: unknown model hierarchy 'nowhere'"),
        ("systems=[greedy,beam@tiny_k2]", "unknown system(s) ['beam@tiny_k2']"),
        ("hierarchies=[smollm2_pld_fp32]", "hierarchy smollm2_pld_fp32 must end in k2's target"),
        ('k3.stages=[{kind:suffix},{model:"tiny:target"}]', "has a suffix stage: list it under `hierarchies`"),
        ("system_options=[{system:greedy,lookahead:1}]", "system_options: 'greedy' is not a pipespec system"),
        ('system_options=[{system:"pipespec@tiny_k2",window:1}]', "system_options.pipespec@tiny_k2: expected settings"),
        ('system_options=[{system:"pipespec@tiny_k2",cascade:true}]', "cascade needs strategy pipespec and at least 3"),
        ("prompt_offset=-1", "prompt_offset must be an integer >= 0"),
    ],
)
def test_bad_config_is_a_one_line_error(tmp_path, override, message, entry_point):
    done = entry_point("experiments.bench", *TINY, override, f"hydra.run.dir={tmp_path}")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("error: ") and message in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("holds", ["bench.md", "humaneval/bench.json"])
def test_a_directory_that_holds_a_bench_is_refused_before_anything_runs(tmp_path, holds, entry_point):
    (tmp_path / holds).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / holds).write_text("earlier results")
    done = entry_point("experiments.bench", *TINY, f"hydra.run.dir={tmp_path}")
    assert done.returncode == 2 and f"already holds a bench ({holds})" in done.stderr.strip().splitlines()[-1]
    assert (tmp_path / holds).read_text() == "earlier results" and not (tmp_path / ".hydra").exists()


def _result(target_steps, drafter_busy, tokens, time_s, target_wall):
    drafter, target = StageTrace(0, "d"), StageTrace(1, "t")
    t = 0.0
    for fed, kind, offered, accepted, produced, seconds in target_steps:
        target.record(t, t + seconds, kind, fed, offered, accepted, produced)
        t += seconds
    target.start_time, target.end_time = 0.0, target_wall
    for j in range(len(drafter_busy)):
        drafter.record(j, j + drafter_busy[j], "draft", 1, 0, 0, 1)
    drafter.start_time, drafter.end_time = 0.0, target_wall
    return GenerationResult(list(range(tokens)), "", time_s, "pipespec", 0, [drafter, target])


def test_ideal_bound_and_breakdown_arithmetic():
    from experiments.benchlib.report import analyse_pipeline_runs, step_cost

    a, b = step_cost([1, 2, 3, 4], [0.012, 0.014, 0.016, 0.018])  # analysis.fit's t(n) = a + b n
    assert a == pytest.approx(0.010) and b == pytest.approx(0.002)
    assert step_cost([3, 3], [0.04, 0.06]) == pytest.approx((0.05, 0.0))
    # prefill (t0 = 0.1 s, 1 token), then 4 verifications of 2 drafts, all accepted (3 tokens each): T = 13
    steps = [(10, "single", 0, 0, 1, 0.1)] + [(3, "verify", 2, 2, 3, 0.04)] * 4
    run = _result(steps, [0.01] * 12, tokens=13, time_s=0.6, target_wall=0.5)
    out = analyse_pipeline_runs([run], 2, ["0:d", "1:t"])
    ideal = out["ideal"]
    assert ideal["accepted_per_verify"] == 2 and ideal["fed_per_verify"] == 3
    # target: 0.1 + (13 - 1) * t(3) / (2 + 1) = 0.26 s > drafter compute 0.12 s
    assert ideal["tokens_per_s"] == pytest.approx(13 / 0.26)
    assert ideal["binding_stage"] == "1:t"
    target = out["stages"][1]
    assert target["compute_ms_per_token"] == pytest.approx(1000 * 0.26 / 13)
    assert target["idle_ms_per_token"] == pytest.approx(1000 * 0.24 / 13)
    assert out["driver_overhead_ms_per_token"] == pytest.approx(1000 * 0.1 / 13)
    assert out["stages"][0]["ideal_limit_tokens_per_s"] == pytest.approx(13 / 0.12)
    # headline acceptance (pipespec.stats): 2 accepted + 1 bonus per verification, every offered draft kept
    assert target["mean_acceptance_length"] == 3 and target["draft_acceptance_rate"] == 1.0


def test_datasets_run_one_bench_each_with_their_own_targets(tmp_path, monkeypatch):
    """The default covers HumanEval and news_lee in one invocation, each into a folder of its own."""
    from experiments import bench as entry

    seen = []
    monkeypatch.setattr(entry, "run_bench", lambda cfg, out: seen.append((cfg, out)) or {"name": cfg["dataset"]["name"]})
    monkeypatch.setattr(entry, "format_markdown", lambda report: f"# {report['name']}")
    cfg = {"datasets": ["humaneval", "news_lee_cnndm"],
           "targets": {"best_speculative_vs_hf_greedy": 1.6, "best_pipespec_vs_best_sd": 1.0},
           "targets_by_dataset": {"news_lee_cnndm": {"best_speculative_vs_hf_greedy": 1.3}}}
    reports = entry.run_datasets(cfg, tmp_path)
    assert [name for name, _ in reports] == ["humaneval", "news_lee_cnndm"]
    assert [out for _, out in seen] == [tmp_path / "humaneval", tmp_path / "news_lee_cnndm"]
    assert [c["dataset"] for c, _ in seen] == [load_conf("dataset", "humaneval"), load_conf("dataset", "news_lee_cnndm")]
    assert [c["targets"]["best_speculative_vs_hf_greedy"] for c, _ in seen] == [1.6, 1.3]
    assert all(c["targets"]["best_pipespec_vs_best_sd"] == 1.0 and c["datasets"] is None for c, _ in seen)
    assert "# humaneval" in (tmp_path / "bench.md").read_text() and "# news_lee_cnndm" in (tmp_path / "bench.md").read_text()
    # any dataset override on the command line means that one dataset
    assert entry.single_dataset_argv(["dataset=humaneval", "samples=2"])[-1] == "datasets=null"
    assert entry.single_dataset_argv(["dataset.ids=[HumanEval/3]"])[-1] == "datasets=null"
    assert entry.single_dataset_argv(["samples=2"]) == ["samples=2"]
    assert entry.single_dataset_argv(["dataset=humaneval", "datasets=[humaneval]"])[-1] == "datasets=[humaneval]"
    with pytest.raises(Exception, match="unknown dataset"):
        entry.run_datasets({"datasets": ["humaneval", "nowhere"]}, tmp_path / "other")


def test_prompt_offset_skips_the_first_prompts():
    from experiments.benchlib.config import BenchConfigError, load_prompts
    from experiments.tiny import make_tokenizer

    tokenizer = make_tokenizer()
    cfg = {"samples": 5, "max_new_tokens": 8, "dataset": load_conf("dataset", "humaneval")}
    first = load_prompts(cfg, tokenizer, None, "base")
    assert load_prompts({**cfg, "samples": 2, "prompt_offset": 3}, tokenizer, None, "base") == first[3:5]
    with pytest.raises(BenchConfigError, match="prompt_offset=163 \\+ samples=5"):
        load_prompts({**cfg, "prompt_offset": 163}, tokenizer, None, "base")


@pytest.mark.slow
def test_hf_systems_and_our_greedy_run_at_the_faster_thread_count(tmp_path):
    """The pre-pass times HF greedy at 1 and 2 threads and our greedy in the k2 pipeline (1 thread) and alone at 2;
    each runs at the faster, recorded in its settings and the pre-pass record; identity holds at both."""
    overrides = [a for a in TINY if not a.startswith(("systems=", "hf.threads", "greedy_threads", "hierarchies",
                                                        "system_options"))]  # fmt: skip
    done = bench(tmp_path, *overrides, "systems=[hf_greedy,greedy]", "hierarchies=[]", "system_options=[]",
                 "hf.threads=[1,2]", "greedy_threads=[1,2]")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "bench.json").read_text())
    rows = {r["name"]: r for r in report["systems"]}
    for name in ("hf_greedy", "greedy"):
        timed = report["prepass"][f"{name}_threads"]
        assert [t["threads"] for t in timed] == [1, 2] and all(t["tokens_per_s"] > 0 for t in timed)
        best = max(timed, key=lambda t: t["tokens_per_s"])["threads"]
        assert rows[name]["settings"]["threads"] == best
        assert rows[name]["identical_to_greedy"] == "4/4"
    greedy_threads = rows["greedy"]["settings"]["threads"]  # the k2 pipeline at 1 thread, the target alone at 2
    assert len(rows["greedy"]["stages"]) == (2 if greedy_threads == 1 else 1)
    assert report["hf_greedy_reference"] == "hf_greedy" and "fastest HF greedy (hf_greedy)" in (tmp_path / "bench.md").read_text()


def test_a_compiled_hf_greedy_that_cannot_compile_is_left_out_with_its_reason():
    from experiments.benchlib.hf import CompileUnavailable
    from experiments.benchlib.systems import System, Systems

    class NoCompiler:
        def compile_warmup(self, prompt, max_new, threads=None):
            raise CompileUnavailable("CalledProcessError: no C++ compiler")

    systems = Systems.__new__(Systems)
    systems.hf, systems.skipped, systems.compile_s, systems.cfg = NoCompiler(), {}, None, {"hf": {"threads": [1, 2]}}
    built = [System(n, None, list) for n in ("hf_greedy", "hf_compiled", "greedy")]
    kept = systems.compile_hf(built, [1, 2, 3], 8)
    assert [s.name for s in kept] == ["hf_greedy", "greedy"]
    assert systems.skipped == {"hf_compiled": "cannot compile here: CalledProcessError: no C++ compiler"}


def test_hf_compiled_is_compiled_at_every_thread_count_before_anything_is_timed():
    """A changed thread count compiles again: each count the pre-pass times is compiled first, its seconds
    recorded apart, so no timed call pays for a compile."""
    from experiments.benchlib.systems import System, Systems

    class Compiler:
        def __init__(self):
            self.threads = []

        def compile_warmup(self, prompt, max_new, threads=None):
            self.threads.append(threads)
            return 10.0 * threads

    systems = Systems.__new__(Systems)
    systems.hf, systems.skipped, systems.compile_s, systems.cfg = Compiler(), {}, None, {"hf": {"threads": [1, 2]}}
    built = [System(n, None, list) for n in ("hf_greedy", "hf_compiled")]
    kept = systems.compile_hf(built, [1, 2, 3], 8)
    assert systems.hf.threads == [1, 2] and [s.name for s in kept] == ["hf_greedy", "hf_compiled"]
    assert kept[1].settings["compile_s_by_threads"] == {"1": 10.0, "2": 20.0} and kept[1].settings["compile_s"] == 30.0
    assert systems.recompiles()["graphs_compiled_while_timed"] == 0


def test_the_fastest_hf_greedy_is_every_headline_ratios_base():
    from experiments.benchlib.report import _add_ratios, check_targets

    rows = [{"name": "hf_greedy", "tokens_per_s_median": 10.0}, {"name": "hf_compiled", "tokens_per_s_median": 12.5},
            {"name": "hf_assisted", "tokens_per_s_median": 8.0}, {"name": "greedy", "tokens_per_s_median": 12.5}]
    _add_ratios(rows)
    assert [r["ratio_vs_hf_greedy"] for r in rows] == [0.8, 1.0, 0.64, 1.0]
    (check,) = check_targets(rows, {"greedy_vs_hf_greedy": 1.0})
    assert check["value"] == pytest.approx(1.0) and "hf_compiled" in check["label"]


def test_hf_assisted_with_early_exit_drafts_with_the_targets_own_layers(tiny_models):
    """`assistant_early_exit` N (transformers' self-speculation) needs no draft model: the target's first N
    layers draft; its forwards are counted as drafts, the full ones as the target's; greedy's tokens either way."""
    from experiments.benchlib.hf import HFBaseline, assisted_settings
    from pipespec.errors import ConfigError
    from pipespec.specs import StageSpec

    target = tiny_models([0.05])[-1]
    hf = HFBaseline(StageSpec(model=target))
    prompt = [5, 9, 17, 33, 65, 129, 5, 9, 17]
    try:
        greedy = hf.generate(prompt, 24, "greedy")
        settings = {"assistant_early_exit": 1, "num_assistant_tokens": 3, "assistant_confidence_threshold": 0.0}
        early = hf.generate(prompt, 24, "assisted", assisted=settings)
        assert early.tokens == greedy.tokens
        assert early.settings["assistant_early_exit"] == 1 and early.draft_calls > 0 and early.draft_time_s > 0
        assert early.target_calls <= greedy.target_calls  # a target step yields >= 1 token: drafts are not counted
        assert greedy.draft_calls == 0 and greedy.draft_time_s == 0
        with pytest.raises(ConfigError, match="below the target's 2 layers"):
            hf.generate(prompt, 8, "assisted", assisted={"assistant_early_exit": 2})
        with pytest.raises(ConfigError, match="HF assisted generation needs a draft model"):
            hf.generate(prompt, 8, "assisted", assisted={})
    finally:
        hf.close()
    with pytest.raises(ConfigError, match="assistant_early_exit must be null"):
        assisted_settings({"assistant_early_exit": 0})


def test_an_sd_systems_settings_keep_the_warm_up_of_its_compiled_stages():
    """After sd's pre-pass its settings name the window chosen and what was tried, and keep `warm_up_s` (the
    compiled stages' seconds at start) from the settings the system was built with."""
    from experiments.benchlib.systems import sd_settings

    chosen = {"strategy": "sd", "lookahead": 3, "max_lead": 8, "draft_confidence": 0.4}
    candidates = [(2, 0.0), (3, 0.0), (2, 0.4), (3, 0.4)]
    settings = sd_settings(chosen, candidates, {"warm_up_s": [0.0, 345.2]})
    assert settings == {"strategy": "sd", "window": 3, "draft_confidence": 0.4, "chosen_from": [2, 3],
                        "draft_confidences_tried": [0.0, 0.4], "warm_up_s": [0.0, 345.2]}  # fmt: skip
    assert "warm_up_s" not in sd_settings(chosen, candidates, {})


def test_a_compiled_hf_call_runs_with_no_hook_for_dynamo_to_trace(tiny_models):
    """HF compiled at its best: during its generate call no forward hook of ours is attached to the target or the
    assistant (dynamo would trace their Python state and recompile at every call); they are back afterwards, and
    the call's counts follow from greedy decoding (one prefill, then one token per forward)."""
    from experiments.benchlib.hf import HFBaseline
    from pipespec.specs import StageSpec

    *drafts, target = tiny_models([0.05])
    hf = HFBaseline(StageSpec(model=target), StageSpec(model=drafts[0]))
    prompt = [5, 9, 17, 33, 65, 129, 5, 9, 17]
    seen = []
    real = hf.target.generate

    def generate(**kwargs):
        seen.append((len(hf.target._forward_pre_hooks), len(hf.draft._forward_pre_hooks),
                     len(hf.target._forward_hooks)))
        kwargs = {k: v for k, v in kwargs.items() if k not in ("cache_implementation", "max_cache_len",
                                                               "compile_config")}
        return real(**kwargs)  # the hooks' absence is what is checked, not the compiler

    try:
        greedy = hf.generate(prompt, 12, "greedy")
        hf.target.generate = generate
        compiled = hf.generate(prompt, 12, "compiled")
        hf.target.generate = real
        again = hf.generate(prompt, 12, "greedy")
    finally:
        hf.close()
    assert seen == [(0, 0, 0)]
    assert compiled.tokens == greedy.tokens == again.tokens
    assert again.target_fed == greedy.target_fed and again.target_time_s > 0  # the hooks count again
    assert compiled.target_fed == [len(prompt)] + [1] * (len(compiled.tokens) - 1)
    assert compiled.target_time_s == pytest.approx(compiled.time_s) and compiled.draft_calls == 0


def test_every_bench_ratio_has_a_paired_interval_over_prompts_and_its_worst_prompt():
    """Paired per prompt and repetition against the base: a system twice as fast on every prompt but one (where it
    runs at 0.75) has that prompt as its worst, an interval around its geometric mean, and the base comes out 1."""
    from types import SimpleNamespace

    from experiments.benchlib.intervals import paired_ratio_fields, ratio_cell, worst_cell

    def system(name, seconds):
        runs = [(rep, index, SimpleNamespace(tokens=[0] * 10, time_s=s * (1 + 0.01 * rep)))
                for index, s in enumerate(seconds) for rep in range(3)]
        return SimpleNamespace(name=name, runs=runs)

    base = system("hf_greedy", [1.0] * 6)
    fast = system("sd", [0.5, 0.5, 0.5, 0.5, 0.5, 1 / 0.75])
    fields = paired_ratio_fields([base, fast], "hf_greedy")
    sd = fields["sd"]
    assert sd["worst_prompt_index_vs_hf_greedy"] == 5
    assert sd["worst_prompt_vs_hf_greedy"] == pytest.approx(0.75)
    expected = math.exp((5 * math.log(2) + math.log(0.75)) / 6)
    assert sd["ratio_vs_hf_greedy_paired"] == pytest.approx(expected)
    assert sd["ratio_vs_hf_greedy_low"] < expected < sd["ratio_vs_hf_greedy_high"] <= 2.0 + 1e-9
    assert fields["hf_greedy"]["ratio_vs_hf_greedy_paired"] == pytest.approx(1.0)
    assert ratio_cell(sd).startswith(f"{expected:.2f} (") and worst_cell(sd) == "0.75 (prompt 5)"
    assert paired_ratio_fields([fast], "hf_greedy") == {} and ratio_cell({}) == "-"


def test_a_committed_bench_is_re_read_with_intervals_and_a_missing_one_is_one_line(tmp_path, capsys):
    """`python -m experiments.benchlib.intervals RUN_DIR` re-reads a bench's runs.json: every system's paired ratio
    with its interval and worst prompt; a folder without runs.json is one line and exit status 2."""
    from experiments.benchlib.intervals import main

    records = [{"system": name, "repetition": rep, "prompt": p, "tokens": [1] * 8, "time_s": s * (1 + p / 10)}
               for name, s in (("hf_greedy", 1.0), ("sd", 0.5)) for p in range(3) for rep in range(2)]
    (tmp_path / "runs.json").write_text(json.dumps(records))
    assert main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| sd | 2.00 (2.00-2.00) | 2.00 (prompt " in out
    assert main([str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert main([str(tmp_path), "--base", "nothing"]) == 2
