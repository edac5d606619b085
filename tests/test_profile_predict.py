"""The machine profile (experiments.profile -> profile.json), its torch-free reader (analysis.profile)
and the prediction from it (analysis.predict), on a tiny k = 2 hierarchy measured in the test."""

import json
import os
import subprocess
import sys

import pytest

from analysis import predict as pr
from analysis import profile as pf
from analysis import simulate as sim
from pipespec.errors import ConfigError

# its module-scoped fixtures are built once: every test of the module on one xdist worker (--dist loadgroup),
# the worker of test_validate_sweep.py, so that the session's measured tiny_k2 profile is measured once
pytestmark = pytest.mark.xdist_group("tiny_k2_profile")
SLOW_FIXTURES = ('tiny_profile',)  # a measured profile: their tests are `slow` (conftest.py)


ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


@pytest.fixture(scope="module")
def tiny_profile(tiny_k2_profile):
    """tiny_k2's measured profile (conftest.py: measured once, shared with test_validate_sweep.py)."""
    return tiny_k2_profile


def test_profile_holds_what_prediction_needs(tiny_profile):
    raw = json.loads(tiny_profile.read_text())
    profile = pf.load_profile(tiny_profile)
    assert profile.hierarchy == "tiny_k2" and profile.sample_ids == ("HumanEval/0", "HumanEval/1")
    assert [len(s.step_s_alone) for s in profile.stages] == [6, 6]
    assert all(len(s.step_s_loaded) == 6 and s.prefill_s_per_token > 0 for s in profile.stages)
    pair = raw["pairs"][0]
    assert len(pair["acceptance_by_position"]) == 8 and pair["offered_by_position"][0] == pair["starts"] > 0
    assert all(o >= a for o, a in zip(pair["offered_by_position"], pair["accepted_by_position"]))
    assert raw["machine"]["cpu"]["vector_extensions"] is not None and raw["machine"]["threads_per_stage"] == [1, 1]
    # a short profile: 75 s on a 2-core machine in an hour that ran SmolLM2 1.8x slower than its quiet speed
    assert profile.handoff_s > 0 and raw["duration_s"] < 150
    assert pf.mismatches(profile) == []  # measured here
    # t(n) at a second, longer context, at the sizes up to max_fed: the seconds each token of context adds
    for entry, stage in zip(raw["stages"], profile.stages):
        short, long = entry["context_costs"]["tokens"]
        assert short == raw["prompt_tokens"][0] - 1 and long > short + 32
        assert entry["context_costs"]["sizes"] == [1, 2, 4]  # CONTEXT_SIZES up to max_fed
        assert stage.context_tokens == short and [n for n, _ in stage.context_slopes] == [1, 2, 4]


def test_predict_every_strategy(tiny_profile):
    profile = pf.load_profile(tiny_profile)
    greedy = pr.predict_profile(profile, "greedy")
    # the target alone: its measured t(1) per token at each token's context, and reading the (mean) prompt once
    target, prompt = profile.stages[-1], round(sum(profile.prompt_tokens) / len(profile.prompt_tokens))
    t1, per_token = target.step_s_alone[0], dict(target.context_slopes)[1]
    steps = sum(t1 * max(1 + per_token * (prompt + g - target.context_tokens), 0.5) for g in range(128))
    seconds = steps + prompt * target.prefill_s_per_token
    assert greedy.predicted_tokens_per_s == pytest.approx(128 / seconds)
    for strategy, lookahead in (("sd", 3), ("pipespec", 0), ("pipespec", 2)):
        p = pr.predict_profile(profile, strategy, lookahead)
        assert p.predicted_tokens_per_s > 0 and p.paper_predicted_tokens_per_s > 0
        # None: the simulated target never verified (a drafter no faster than the target, as tiny ones can be)
        assert p.mean_acceptance_length is None or 1 <= p.mean_acceptance_length <= 1 + max(lookahead, 8)
        assert 0 <= p.verify_fraction <= 1 and 0 < p.target_busy <= 1
    done = subprocess.run([sys.executable, "-m", "analysis.predict", str(tiny_profile), "strategy=sd", "lookahead=2",
                           "--json"], env=ENV, capture_output=True, text=True, timeout=60)  # fmt: skip
    record = json.loads(done.stdout)
    for key in ("strategy", "lookahead", "max_lead", "stages", "predicted_tokens_per_s",
                "paper_predicted_tokens_per_s", "mean_acceptance_length"):
        assert key in record
    assert record["strategy"] == "sd" and record["lookahead"] == 2


@pytest.mark.parametrize("text,names", [("{", "not valid JSON"), ('{"format": "other"}', "not a pipespec profile"),
                                        ("[]", "not a pipespec profile")])
def test_corrupt_or_foreign_file_is_one_error_line(tmp_path, text, names):
    path = tmp_path / "profile.json"
    path.write_text(text)
    for module in ("analysis.profile", "analysis.predict"):
        done = subprocess.run([sys.executable, "-m", module, str(path)], env=ENV, capture_output=True, text=True,
                              timeout=60)  # fmt: skip
        assert done.returncode == 2
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:") and names in lines[0]


def test_profile_from_elsewhere_names_the_mismatch(tiny_profile):
    raw = json.loads(tiny_profile.read_text())
    raw["machine"]["cpu"]["name"] = "Some Other CPU"
    raw["machine"]["libraries"]["torch"] = "0.0.1"
    profile = pf.parse_profile(raw)
    found = pf.mismatches(profile, hierarchy="smollm2_int8_fp32")
    assert any(f.startswith("hierarchy:") for f in found) and any(f.startswith("cpu:") for f in found)
    assert any(f.startswith("torch:") and "0.0.1" in f for f in found)
    stages = [{k: v for k, v in s.items() if k != "name"} for s in raw["stages"]]
    assert stages[-1]["kernels"] in ("torch", "onednn") and not pf.mismatches(profile, here={}, stages=stages)
    del raw["stages"][-1]["kernels"]  # written before the option: torch's kernels ran
    stages[-1]["kernels"] = "onednn"
    found = pf.mismatches(pf.parse_profile(raw), here={}, stages=stages)
    assert found == ["stage 1 kernels: profile 'torch', run 'onednn'"]
    raw["stages"][0]["step_s_alone"] = [1.0]
    with pytest.raises(pf.ProfileError, match="same number"):
        pf.parse_profile(raw)


@pytest.mark.slow
def test_background_stages_pause_and_run_as_told():
    """Contention is measured in alternating sweeps: a background stage told to pause takes no step
    until it is told to run again (else the "alone" sweeps would be loaded too)."""
    import time

    from experiments.hierarchies import load_hierarchy
    from experiments.profiler import Background

    specs = load_hierarchy("tiny_k2")
    with Background(specs, [1, 2, 3, 4]) as background:
        assert all(count.value >= 1 for count in background.steps)  # both loaded and stepping
        background.run_only([1])
        paused, running = background.steps[0].value, background.steps[1].value
        time.sleep(0.3)
        assert background.steps[0].value == paused  # not one step while paused
        assert background.steps[1].value > running
        background.run_only([0])
        resumed, stopped = background.steps[0].value, background.steps[1].value
        time.sleep(0.3)
        assert background.steps[0].value > resumed and background.steps[1].value == stopped


def test_a_background_target_feeds_a_verifications_tokens_and_keeps_one(monkeypatch):
    """The target's steady loop feeds `fed` tokens a step (its next token and fed - 1 candidates, as a
    verification does) and keeps one, so its cache grows by one token a step; `profile.verify_fed` sets
    it for the target (one by default), the drafters feed one."""
    import threading

    import torch

    from experiments import profiler

    class Runner:  # records what each step fed
        def __init__(self):
            self.cache_length, self.fed = 0, []

        def forward(self, sequence, candidates):
            self.fed.append(len(sequence) - self.cache_length + len(candidates))
            self.cache_length = len(sequence) + len(candidates)
            return torch.zeros(len(candidates) + 1, 5)

        def truncate(self, valid):
            self.cache_length = min(self.cache_length, valid)

    class Stop:  # stops after six steps
        def __init__(self):
            self.calls = 0

        def is_set(self):
            self.calls += 1
            return self.calls > 6

    runner = Runner()
    monkeypatch.setattr(profiler, "_runner", lambda spec: runner)
    run, ready, paused = threading.Event(), threading.Event(), threading.Event()
    run.set()
    steps = type("Count", (), {"value": 0})()
    profiler._steady_loop(None, [1, 2, 3], ready, Stop(), run, paused, steps, fed=4)
    assert steps.value == 6 and runner.fed == [3 + 3] + [4] * 5  # the context first, then 1 + 3 a step
    assert runner.cache_length == 3 + 5  # the context and one kept token a step (the sixth not yet fed)
    assert profiler.ProfileOptions().verify_fed == 1
    with pytest.raises(ConfigError, match="verify_fed"):
        profiler.ProfileOptions(verify_fed=0)


def test_one_model_stage_is_timed_alone_half_before_acceptance_and_half_after():
    """Prompt lookup -> one model: no background stage, loaded = alone; the timed sweeps are split around
    the acceptance measurement (a slow spell of the machine then falls on part of them only)."""
    from experiments.hierarchies import load_hierarchy
    from experiments.profiler import ProfileOptions, measure_profile

    lookup, _, target = load_hierarchy("tiny_pld_k3")
    said: list[str] = []
    prompts = [("a", list(range(5, 40))), ("b", list(range(7, 30)) * 2)]
    raw = measure_profile([lookup, target], "tiny_pld_k2", prompts, log=said.append,
                          options=ProfileOptions(max_fed=4, repeats=3, continuation=12, draft_k=4, handoff_tokens=0))
    stage = raw["stages"][1]
    assert len(stage["step_s_alone"]) == 4 and stage["step_s_loaded"] == stage["step_s_alone"]
    assert not any("background" in line for line in said)
    timing = [i for i, line in enumerate(said) if line.endswith("t(n)")]
    acceptance = [i for i, line in enumerate(said) if "acceptance" in line]
    assert len(timing) == 2 and timing[0] < acceptance[0] <= acceptance[-1] < timing[1]


def test_a_longer_context_continues_with_the_other_prompts_within_the_model_s_positions():
    from experiments.profiler import CONTEXT_SIZES, longer_context

    prompts = [[1, 2, 3], [4, 5], [6]]
    assert longer_context(prompts, 40, None) == [1, 2, 3] + [4, 5, 6] * 13 + [4]
    assert len(longer_context(prompts, 400, 100)) == 100 - max(CONTEXT_SIZES)  # room for the largest step
    assert longer_context(prompts, 400, 3 + 31 + max(CONTEXT_SIZES)) is None  # fewer than 32 more: not measured
    assert longer_context([[7, 8]], 40, None) == [7, 8] + [7, 8] * 20  # one prompt: itself again


def test_one_runner_is_timed_at_two_contexts_in_alternating_sweeps_each_after_its_own():
    """`context_step_times` through the one t(n) sweep: each step follows its own context, the cache reads a
    context again only where the other one's is in it, and the first sweep of each is a warm-up."""
    from experiments.profiler import context_step_times

    class Recording:
        def __init__(self):
            self.cache, self.reads, self.steps = [], [], []

        def start(self):
            self.cache = []

        def truncate(self, n):
            self.cache = self.cache[:n]

        def forward(self, sequence, candidates):
            if not self.cache:
                self.reads.append(len(sequence))
            else:
                assert self.cache == list(sequence[: len(self.cache)])  # the step follows its own context
                self.steps.append((len(sequence), 1 + len(candidates)))
            self.cache = list(sequence) + list(candidates)

    runner = Recording()
    entry = context_step_times(runner, [list(range(10)), list(range(30))], [1, 4], repeats=2)
    assert entry["tokens"] == [9, 29] and entry["sizes"] == [1, 4] and len(entry["seconds"]) == 2
    # sweeps short, long (warm-up), long, short, short, long: a read before each switch of context
    assert runner.reads == [10, 30, 10, 30, 10, 30]
    assert [length for length, _ in runner.steps[::2]] == [10, 30, 30, 10, 10, 30]
    assert all(n in (1, 4) for _, n in runner.steps) and len(runner.steps) == 12


def test_a_profile_s_context_costs_give_the_share_a_token_of_context_adds_or_one_error_line(tiny_profile):
    raw = json.loads(tiny_profile.read_text())
    entry = {"tokens": [100, 300], "sizes": [1, 4], "seconds": [[0.010, 0.020], [0.012, 0.030]]}
    stages = [{**raw["stages"][0], "context_costs": entry}, raw["stages"][1]]
    profile = pf.parse_profile({**raw, "stages": stages})
    assert profile.stages[0].context_tokens == 100
    sizes, slopes = zip(*profile.stages[0].context_slopes)  # the share of t(n) a token of context adds
    assert sizes == (1, 4) and slopes == pytest.approx((0.2 / 200, 0.5 / 200))
    old = pf.parse_profile({**raw, "stages": [{k: v for k, v in s.items() if k != "context_costs"} for s in stages]})
    assert old.stages[0].context_slopes == () and isinstance(pr.stage_cost(old.stages[0]), sim.TableCost)
    cost = pr.stage_cost(profile.stages[0])
    assert isinstance(cost, sim.ContextCost) and cost.at_prompt(300)(4) == pytest.approx(cost(4) * 1.5)
    for bad, names in (({**entry, "tokens": [300, 100]}, "tokens"), ({**entry, "sizes": [4, 1]}, "sizes"),
                       ({**entry, "seconds": [[0.01], [0.02]]}, "seconds"), ([1, 2], "tokens")):
        with pytest.raises(pf.ProfileError, match=f"stages\\[0\\].context_costs.{names}"):
            pf.parse_profile({**raw, "stages": [{**stages[0], "context_costs": bad}, stages[1]]})


def test_acceptance_by_position_sampler():
    perfect_then_never = sim.simulate_sync_sd([0.01, 1.0], [sim.ByPosition([1.0, 1.0, 0.0])], 5, 200)
    assert set(perfect_then_never.accepted_counts[0]) == {3}  # two drafts accepted, the third never
    with pytest.raises(ValueError, match="rates"):
        sim.ByPosition([1.5])


def test_acceptance_is_sampled_where_decoding_drafts_again():
    """Starts follow the walk: after the accepted prefix and the verifier's own token."""
    from experiments.profiler_acceptance import acceptance_by_position, proposal_runs

    truth = list(range(100, 120))

    def drafter(sequence, k):  # right twice, then wrong; nothing to propose from position 10 on
        start = len(sequence) - 1
        return [] if start >= 10 else (truth[start : start + 2] + [-1] * k)[:k]

    runs, proposed = proposal_runs(drafter, [7], truth, 4)
    assert runs == [2] * 10 + [0] * 10 and proposed == [4] * 10 + [0] * 10
    stats = acceptance_by_position([runs], [proposed], 4)  # starts 0, 3, 6, 9, then one on: 12, 13, .. 18
    assert stats["offered_by_position"] == [4, 4, 4, 0] and stats["accepted_by_position"] == [4, 4, 0, 0]
    assert stats["starts"] == 11 and stats["proposal_rate"] == pytest.approx(4 / 11)
    assert stats["mean_proposal_length"] == 4


def test_a_middle_verifier_keeps_what_its_own_tokens_in_the_target_s_text_agree_with(tiny_models):
    """Along the target's continuation a middle verifier keeps a draft where its own argmax, in the target's
    text so far, is that draft (`kept`), counted up to the first kept token that leaves the target's text
    (its context differs after it): checked against drafting and verifying token by token with the models,
    and on hand-made tokens."""
    from experiments.profiler_acceptance import along, kept, model_runs, proposal_runs, teacher_forced
    from pipespec.models import CausalLMRunner, load_model
    from pipespec.specs import StageSpec

    text = [5, 6, 7, 8]
    assert along([5, 6, 9, 8], text, 0) == [5, 6, 9] and along([5, 6, 9, 8], text, 3) == [8]
    assert kept([5, 6, 7], text, None, 0) == 3 and kept([5, 6, 7], text, [5, 6, 9, 8], 0) == 2
    assert kept([5, 6, 9, 4], text, [5, 6, 9, 8], 0) == 3  # it agrees with a draft the target would not keep
    assert proposal_runs(lambda sequence, k: [6, 7, 8][:k], [1], text, 3, [5, 6, 9, 8]) == ([0, 1, 0, 0], [3, 3, 2, 1])
    draft, middle, target = (CausalLMRunner(load_model(StageSpec(model=str(d)))) for d in tiny_models([0.08, 0.03]))
    prompt = [5, 6, 7, 8]
    target.start()
    continuation = []
    for _ in range(24):
        continuation.append(int(target.forward(prompt + continuation, []).argmax()))
    verifier = teacher_forced(middle, prompt, continuation)
    runs = model_runs(draft, prompt, continuation, verifier)
    for j in range(len(continuation)):
        draft.start()
        middle.start()
        context, right = prompt + continuation[:j], 0
        while j + right < len(continuation):
            drafted = int(draft.forward(context, []).argmax())
            if int(middle.forward(context, []).argmax()) != drafted:
                break
            right += 1
            if drafted != continuation[j + right - 1]:
                break
            context = context + [drafted]
        assert runs[j] == right, j
    assert 0 < sum(r > 0 for r in runs) < len(runs)  # the test can tell kept from not
    assert runs != model_runs(draft, prompt, continuation)  # and the middle verifier keeps other drafts than the target


def test_a_model_drafters_runs_are_its_greedy_drafts_along_the_continuation(tiny_models):
    """model_runs (one-token teacher forcing) gives at each position what greedy drafting from there
    gets right: checked against drafting token by token from every position."""
    from pipespec.models import CausalLMRunner, load_model
    from pipespec.specs import StageSpec
    from experiments.profiler_acceptance import model_runs

    draft, target = (CausalLMRunner(load_model(StageSpec(model=str(d)))) for d in tiny_models([0.3])[-2:])
    prompt = [5, 6, 7, 8]
    target.start()
    continuation = []
    for _ in range(12):
        continuation.append(int(target.forward(prompt + continuation, []).argmax()))
    runs = model_runs(draft, prompt, continuation)
    for j in range(len(continuation)):
        draft.start()
        drafted = []
        while len(drafted) < len(continuation) - j:
            drafted.append(int(draft.forward(prompt + continuation[:j] + drafted, []).argmax()))
            if drafted[-1] != continuation[j + len(drafted) - 1]:
                break
        right = len(drafted) - (drafted[-1] != continuation[j + len(drafted) - 1])
        assert runs[j] == right, j
    assert 0 < sum(r > 0 for r in runs) < len(runs)  # the test can tell right from wrong


def test_version_1_profile_is_refused_with_the_reason(tiny_profile):
    raw = json.loads(tiny_profile.read_text())
    assert raw["version"] == pf.VERSION == 2
    with pytest.raises(pf.ProfileError, match="fixed strides.*measure it again"):
        pf.parse_profile({**raw, "version": 1})


def test_costs_from_reuses_the_costs_and_measures_acceptance(tiny_profile, tmp_path, entry_point):
    raw = json.loads(tiny_profile.read_text())
    command = [sys.executable, "-m", "experiments.profile", "models=tiny_k2", "dataset.ids=[HumanEval/5]",
               "profile.continuation=8", f"costs_from={tiny_profile}"]  # fmt: skip
    done = subprocess.run([*command, f"hydra.run.dir={tmp_path / 'a'}"], env=ENV, capture_output=True, text=True,
                          timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    again = json.loads((tmp_path / "a" / "profile.json").read_text())
    assert again["costs_from"] == str(tiny_profile) and again["sample_ids"] == ["HumanEval/5"]
    assert again["handoff_s"] == raw["handoff_s"]
    for old, new in zip(raw["stages"], again["stages"]):
        assert [new.get(k) for k in ("step_s_alone", "step_s_loaded", "prefill_s_per_token")] == \
               [old.get(k) for k in ("step_s_alone", "step_s_loaded", "prefill_s_per_token")]
    assert again["pairs"][0]["starts"] > 0 and pf.load_profile(tmp_path / "a" / "profile.json")
    raw["machine"]["cpu"]["name"] = "Some Other CPU"
    other = tmp_path / "other.json"
    other.write_text(json.dumps(raw))
    command[-1] = f"costs_from={other}"  # refused before anything is measured: in this process (conftest.py)
    done = entry_point("experiments.profile", *command[3:], f"hydra.run.dir={tmp_path / 'b'}", function="main")
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1].startswith("error: costs_from")
    assert "another cpu" in done.stderr and not (tmp_path / "b" / "profile.json").exists()
    # a directory that holds a profile: refused before anything is measured, the profile and its .hydra/ record kept
    (tmp_path / "a" / ".hydra").mkdir(exist_ok=True)
    kept = {p: p.read_bytes() for p in [tmp_path / "a" / "profile.json", *(tmp_path / "a" / ".hydra").glob("*")]}
    done = entry_point("experiments.profile", *command[3:], f"hydra.run.dir={tmp_path / 'a'}", function="main")
    assert done.returncode == 2 and "already holds a profile (profile.json)" in done.stderr.strip().splitlines()[-1]
    assert {p: p.read_bytes() for p in kept} == kept and sorted((tmp_path / "a" / ".hydra").glob("*")) == sorted(
        p for p in kept if p.parent.name == ".hydra")  # fmt: skip


@pytest.mark.slow
def test_a_cached_cost_sweep_is_reused_and_the_time_goes_to_acceptance(tmp_path, monkeypatch):
    """Without costs_from, a profile reuses the cost sweep cached for the same machine, stages and cost
    options, and caches the one it measures; the short profile then takes more prompts."""
    from experiments.hierarchies import load_hierarchy
    from experiments import profiler

    cache = tmp_path / "cache"
    env = {**ENV, "PIPESPEC_CACHE": str(cache)}
    command = [sys.executable, "-m", "experiments.profile", "models=tiny_k2", "profile.max_fed=4", "profile.repeats=2",
               "profile.continuation=8", "profile.handoff_tokens=0"]  # fmt: skip
    first = subprocess.run([*command, "dataset.ids=[HumanEval/0]", f"hydra.run.dir={tmp_path / 'a'}"], env=env,
                           capture_output=True, text=True, timeout=240)  # fmt: skip
    assert first.returncode == 0, first.stderr[-2000:]
    (stored,) = (cache / "costs").glob("*.json")
    assert f"step costs cached in {stored}" in first.stderr and "t(n)" in first.stderr
    second = subprocess.run([*command, "dataset.ids=[HumanEval/5,HumanEval/6]", f"hydra.run.dir={tmp_path / 'b'}"],
                            env=env, capture_output=True, text=True, timeout=240)  # fmt: skip
    assert second.returncode == 0, second.stderr[-2000:]
    assert f"from the cost cache {stored}" in second.stderr and "t(n)" not in second.stderr
    a, b = (json.loads((tmp_path / d / "profile.json").read_text()) for d in ("a", "b"))
    assert a["costs_from"] is None and b["costs_from"] == str(stored)
    assert [s.get("step_s_alone") for s in b["stages"]] == [s.get("step_s_alone") for s in a["stages"]]
    assert b["sample_ids"] == ["HumanEval/5", "HumanEval/6"] and b["pairs"][0]["starts"] > 0
    assert len(list((cache / "costs").glob("*.json"))) == 1  # reused, not measured again
    # the key: the same stages and cost options find the same sweep, other options another one
    monkeypatch.setenv("PIPESPEC_CACHE", str(cache))  # the tiny models too live there
    specs = load_hierarchy("tiny_k2")
    options = profiler.ProfileOptions(max_fed=4, repeats=2, continuation=8, handoff_tokens=0)
    assert profiler.cost_cache_path(profiler.cost_key(specs, options)) == stored
    assert profiler.cached_costs(specs, profiler.ProfileOptions(max_fed=4, repeats=2, continuation=99,
                                                                  handoff_tokens=0))["path"] == str(stored)
    assert profiler.cached_costs(specs, profiler.ProfileOptions(max_fed=5, repeats=2, handoff_tokens=0)) is None
    assert profiler.short_profile_prompts(specs) == profiler.SHORT_PROMPTS
    profiler.store_costs(specs, profiler.SHORT_OPTIONS, a)
    assert profiler.short_profile_prompts(specs) == profiler.SHORT_PROMPTS_WITH_COSTS > profiler.SHORT_PROMPTS


def test_a_model_free_first_stage_proposes_a_whole_run_at_once():
    """Like the engine's PROPOSE: a verifier waiting for one draft gets the whole run (up to max_lead)."""
    costs = [sim.StageCost(1e-5), sim.StageCost(0.01)]
    free = sim.simulate_pipespec(costs, [0.0], 200, lookahead=1, max_lead=4, supply=[1.0, None], seed=0)
    assert set(free.offered_counts[0]) == {4}
    model = sim.simulate_pipespec(costs, [0.0], 200, lookahead=1, max_lead=4, seed=0)  # one draft a step
    assert min(model.offered_counts[0]) == 1


# ---- the sweep ----------------------------------------------------------------------------------------


def _k3_from_k2(raw: dict, skip: bool) -> dict:
    """A k = 3 profile built from the measured k = 2 one: the drafter twice (a skip pair where asked)."""
    k3 = json.loads(json.dumps(raw))
    first = dict(k3["stages"][0], name="drafter-a")
    k3["stages"] = [first] + k3["stages"]
    k3["pairs"] = [dict(k3["pairs"][0], drafter="drafter-a", verifier=k3["stages"][1]["name"])] + k3["pairs"]
    k3["skip_pairs"] = [dict(k3["pairs"][1], drafter_index=0, verifier_index=2)] if skip else []
    return k3


def test_sweep_ranks_every_configuration(tiny_profile):
    done = subprocess.run([sys.executable, "-m", "analysis.predict", str(tiny_profile), "--sweep", "tokens=32",
                           "--json"], env=ENV, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    records = json.loads(done.stdout)
    expected = 1 + len(pr.SD_WINDOWS) + sum(lead >= la for la in pr.LOOKAHEADS for lead in pr.MAX_LEADS)
    assert len(records) == expected
    rates = [r["predicted_tokens_per_s"] for r in records]
    assert rates == sorted(rates, reverse=True)
    assert [r["strategy"] for r in records].count("greedy") == 1
    configs = {(r["strategy"], r["lookahead"], r["max_lead"]) for r in records}
    assert ("sd", 8, 8) in configs and ("pipespec", 4, 16) in configs and ("pipespec", 2, 4) in configs
    for record in records:
        for key in ("strategy", "lookahead", "max_lead", "stages", "predicted_tokens_per_s",
                    "paper_predicted_tokens_per_s", "mean_acceptance_length"):
            assert key in record
    text = subprocess.run([sys.executable, "-m", "analysis.predict", str(tiny_profile), "--sweep", "tokens=32"],
                          env=ENV, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert text.stdout.splitlines()[0].startswith("1. ") and len(text.stdout.splitlines()) == expected


def test_sweep_uses_stage_subsets_only_with_their_acceptance(tiny_profile):
    raw = json.loads(tiny_profile.read_text())
    with_skip = pf.parse_profile(_k3_from_k2(raw, skip=True))
    subsets, notes = pr.stage_subsets(with_skip)
    assert subsets == [(0, 1, 2), (0, 2), (1, 2)] and notes == []
    skipping = pr.predict_profile(with_skip, "sd", 2, tokens=32, stages=(0, 2))
    assert skipping.stages == ("drafter-a", raw["stages"][1]["name"]) and skipping.stage_indices == (0, 2)
    ranked, _ = pr.sweep(with_skip, tokens=16)
    assert {p.stage_indices for p in ranked if p.strategy != "greedy"} == {(0, 1, 2), (0, 2), (1, 2)}
    without = pf.parse_profile(_k3_from_k2(raw, skip=False))
    subsets, notes = pr.stage_subsets(without)
    assert subsets == [(0, 1, 2), (1, 2)] and len(notes) == 1 and "drafter-a > " in notes[0]
    with pytest.raises(ConfigError, match="no acceptance"):
        pr.predict_profile(without, "sd", 2, stages=(0, 2))
    with pytest.raises(ConfigError, match="ending with the target"):
        pr.predict_profile(without, "sd", 2, stages=(0, 1))


def test_draft_confidence_is_refused_with_a_clear_error(tiny_profile):
    with pytest.raises(ConfigError, match="draft_confidence cannot be predicted"):
        pr.predict_profile(pf.load_profile(tiny_profile), "pipespec", draft_confidence=0.5)
    done = subprocess.run([sys.executable, "-m", "analysis.predict", str(tiny_profile), "draft_confidence=0.5"],
                          env=ENV, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2 and done.stderr.startswith("error: draft_confidence")


# ---- validation on runs ------------------------------------------------------------------------------


def _run(out, *overrides):
    command = [sys.executable, "-m", "experiments.run", "models=tiny_k2", "dataset=humaneval", "max_new_tokens=8",
               "run.progress=false", f"hydra.run.dir={out}", *overrides]  # fmt: skip
    done = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return out


def test_repeats_give_the_spread_of_identical_runs_and_the_floor_of_any_prediction():
    """Runs of one configuration measured at 6 and 9 tokens/s: whatever one prediction p says, it is off by
    at least (9 - 6) / (9 + 6) = 20% on one of them (p = 7.2 reaches exactly that on both)."""
    from analysis.validate import Validation, format_repeats, repeats

    def record(run, strategy, measured, predicted, in_sample=False, lookahead=0, max_lead=None):
        return Validation(run=run, strategy=strategy, lookahead=lookahead, max_lead=max_lead, stages=("a", "b"),
                          measured_tokens_per_s=measured, predicted_tokens_per_s=predicted,
                          paper_predicted_tokens_per_s=predicted, error=predicted / measured - 1,
                          paper_error=predicted / measured - 1, in_sample=in_sample)  # fmt: skip

    records = [record("r1", "sd", 6.0, 7.2, lookahead=4), record("r2", "sd", 9.0, 7.2, lookahead=4),
               record("r3", "sd", 5.0, 7.2, lookahead=2), record("p1", "pipespec", 8.0, 8.0),
               record("p2", "pipespec", 8.8, 8.0),
               record("seen", "sd", 1.0, 7.2, in_sample=True, lookahead=4)]  # fmt: skip
    groups = {g.configuration: g for g in repeats(records)}
    assert set(groups) == {"sd L4 [a>b]", "sd L2 [a>b]", "pipespec L0 M8 [a>b]"}  # in-sample runs left out
    sd = groups["sd L4 [a>b]"]
    assert sd.runs == 2 and sd.spread == pytest.approx(0.5) and sd.floor == pytest.approx(0.2)
    assert max(abs(e) for e in sd.errors) == pytest.approx(sd.floor)  # the best single prediction reaches it
    text = format_repeats(records)
    assert "sd L2" not in text  # ran once: no spread
    assert text.splitlines()[-1].startswith("floor: any one prediction per configuration is off by at least 20.0%")
    assert format_repeats(records[2:3] + records[5:]).startswith("no configuration ran more than once")


def test_validate_separates_in_sample_runs_and_names_mismatches(tiny_profile, tmp_path):
    held_out = _run(tmp_path / "greedy", "strategy=greedy", "dataset.ids=[HumanEval/2,HumanEval/3]")
    seen = _run(tmp_path / "sd", "strategy=sd", "strategy.lookahead=2", "dataset.n_samples=2")  # HumanEval/0, 1
    done = subprocess.run([sys.executable, "-m", "analysis.validate", str(tiny_profile), str(held_out), str(seen),
                           "--json"], env=ENV, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    records = {r["run"]: r for r in json.loads(done.stdout)}
    assert records[str(held_out)]["in_sample"] is False and records[str(seen)]["in_sample"] is True
    for record in records.values():
        for key in ("run", "measured_tokens_per_s", "predicted_tokens_per_s", "paper_predicted_tokens_per_s",
                    "error", "in_sample"):
            assert key in record
        assert record["error"] == pytest.approx(record["predicted_tokens_per_s"] / record["measured_tokens_per_s"] - 1)
    text = subprocess.run([sys.executable, "-m", "analysis.validate", str(tiny_profile), str(held_out), str(seen)],
                          env=ENV, capture_output=True, text=True, timeout=120).stdout  # fmt: skip
    held, _, in_sample = text.partition("in-sample runs")
    assert "held-out runs" in held and "greedy" in held and "sd" not in held.split("ours:")[0].split("\n", 2)[2]
    assert "sd" in in_sample and "over 1 runs" in in_sample
    costs = subprocess.run([sys.executable, "-m", "analysis.validate", str(tiny_profile), str(held_out), str(seen),
                            "--costs"], env=ENV, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert costs.returncode == 0, costs.stderr
    rows = [line.split() for line in costs.stdout.splitlines()[2:]]
    assert rows and rows[0][0] == "1"  # greedy's one-token steps: t(1) in the profile beside the runs'
    assert all(float(r[1]) > 0 and float(r[2]) > 0 and int(r[3]) > 0 for r in rows)
    # the decomposition at the greedy run's speed: costs scaled by its t(1) over the profile's, all in-sample
    scaled = subprocess.run([sys.executable, "-m", "analysis.validate", str(tiny_profile), str(held_out), str(seen),
                             "--json", "--greedy-speed"], env=ENV, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert scaled.returncode == 0, scaled.stderr
    factor = float(scaled.stderr.split("step costs x ")[1].split(",")[0])
    at_speed = {r["run"]: r for r in json.loads(scaled.stdout)}
    assert all(r["in_sample"] and r["speed_from"] == str(held_out) for r in at_speed.values())
    greedy_before, greedy_after = records[str(held_out)], at_speed[str(held_out)]
    assert greedy_after["predicted_tokens_per_s"] == pytest.approx(greedy_before["predicted_tokens_per_s"] / factor,
                                                                   rel=2e-3)  # fmt: skip
    no_greedy = subprocess.run([sys.executable, "-m", "analysis.validate", str(tiny_profile), str(seen),
                                "--greedy-speed"], env=ENV, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert no_greedy.returncode == 2 and no_greedy.stderr.startswith("error: --greedy-speed needs a greedy run")
    # --summary: the figures over several --json reports together, held-out and in-sample apart
    report = tmp_path / "validation.json"
    report.write_text(done.stdout)
    summed = subprocess.run([sys.executable, "-m", "analysis.validate", "--summary", str(report), str(report)],
                            env=ENV, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert summed.returncode == 0, summed.stderr
    held_part, _, in_part = summed.stdout.partition("in-sample runs")
    error = abs(records[str(held_out)]["error"])
    assert f"median |error| {100 * error:.1f}%" in held_part and "over 2 runs" in held_part  # the report twice
    assert "over 2 runs" in in_part
    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps([{"run": "x"}]))
    refused = subprocess.run([sys.executable, "-m", "analysis.validate", "--summary", str(foreign)], env=ENV,
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    assert refused.returncode == 2 and refused.stderr.startswith("error:")
    assert "not a validation report" in refused.stderr
    raw = json.loads(tiny_profile.read_text())
    raw["machine"]["cpu"]["name"] = "Some Other CPU"
    other = tmp_path / "other.json"
    other.write_text(json.dumps(raw))
    done = subprocess.run([sys.executable, "-m", "analysis.validate", str(other), str(held_out)], env=ENV,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0 and "warning:" in done.stderr and "cpu: profile 'Some Other CPU'" in done.stderr


def test_a_prediction_pools_the_target_s_counts_over_its_generations_as_a_run_pools_its_samples():
    """The verification fraction and mean acceptance length are ratios of counts summed over every simulated
    generation (as `pipespec.stats.pool` sums a run's samples), not means of each generation's ratio."""
    stages = (pr.StageModel("lookup", sim.StageCost(1e-4), "lookup", contention=None, supply=0.5),
              pr.StageModel("target", sim.StageCost(0.01, 0.001)))  # fmt: skip
    # generations alternate between a text the drafter proposes 8 good drafts everywhere and one where it
    # proposes nothing: few steps nearly all verifying, then many one-token steps
    along = sim.AlongContinuations(((8,) * 64, (0,) * 64), (0.5,) * 8, proposed=((8,) * 64, (0,) * 64))
    hierarchy = pr.Hierarchy(stages, (along,), seeds=tuple(range(12)))
    for strategy, lookahead in (("pipespec", 1), ("sd", 4)):
        prediction = pr.predict(hierarchy, strategy, [40], lookahead=lookahead, max_lead=8)
        results = [pr.simulate_generation(hierarchy, strategy, 40, lookahead, 8, seed)[1] for seed in range(12)]
        verifications = [len(r.offered_counts[-1]) for r in results]
        steps = [r.target_steps for r in results]
        assert prediction.verify_fraction == pytest.approx(sum(verifications) / sum(steps))
        assert prediction.mean_acceptance_length == pytest.approx(
            sum(sum(r.accepted_counts[-1]) for r in results) / sum(verifications))
        per_generation = sum(v / s for v, s in zip(verifications, steps)) / len(results)
        assert per_generation > 2 * prediction.verify_fraction  # the generations differ: the two differ
