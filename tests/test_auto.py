"""auto (experiments.auto: `AutoPipeline`, the runner's strategy=auto, the bench's auto system): the
configuration a machine profile predicts fastest, greedy included, in the runner and the API; the short profile measured and cached when there is none; a profile
from elsewhere refused under auto. One short tiny_k2 profile is measured for the module (by the runner)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from analysis import predict as pr
from analysis import profile as pf
from experiments import auto as autoconf
from pipespec.errors import ConfigError

# its module-scoped fixtures are built once: every test of the module on one xdist worker (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("test_auto")
SLOW_FIXTURES = ('auto_run',)  # a runner `auto` run that measures a profile: their tests are `slow` (conftest.py)


ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def _run(cache, out, *overrides, timeout=300, dataset="humaneval"):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PIPESPEC_CACHE": str(cache)}
    command = [sys.executable, "-m", "experiments.run", "models=tiny_k2", f"dataset={dataset}", "dataset.n_samples=2",
               "max_new_tokens=8", "run.progress=false", f"hydra.run.dir={out}", *overrides]  # fmt: skip
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def auto_run(cache, tmp_path_factory):
    """A runner call with strategy=auto and no profile: it measures the short profile and caches it."""
    out = tmp_path_factory.mktemp("auto_run")
    done = _run(cache, out, "strategy=auto")
    assert done.returncode == 0, done.stderr[-2000:]
    return out, json.loads((out / "summary.json").read_text())


@pytest.fixture(scope="module")
def profile_path(auto_run, cache):
    found = list((cache / "profiles").glob("tiny_k2-*.json"))
    assert len(found) == 1
    return found[0]


def test_runner_auto_measures_caches_and_records_the_choice(auto_run, profile_path):
    out, summary = auto_run
    record = summary["auto"]
    assert set(record) >= {"chosen", "predicted_tokens_per_s", "runners_up", "reason"}
    assert record["profile"] == str(profile_path)
    profile = pf.load_profile(profile_path)
    assert profile.duration_s <= 60 and profile.hierarchy == "tiny_k2"
    ranked, _ = pr.sweep(profile, autoconf.PREDICT_TOKENS)
    best = ranked[0]
    assert record["chosen"] == {"strategy": best.strategy, "lookahead": best.lookahead, "max_lead": best.max_lead,
                                "stages": list(best.stage_indices)}  # fmt: skip
    assert record["predicted_tokens_per_s"] == pytest.approx(best.predicted_tokens_per_s)
    assert len(record["runners_up"]) == autoconf.RUNNERS_UP
    assert summary["strategy"] == best.strategy  # the run ran the chosen configuration
    from analysis.collect import collect

    (row,) = collect([out])
    assert row["strategy"].startswith(f"auto (stages {list(best.stage_indices)}): {best.strategy}")
    assert len(summary["stage_names"]) == len(best.stage_indices)


def _refused(entry_point, monkeypatch, cache, out, *overrides):
    """`_run`'s command for a configuration refused before any stage starts, in this process (conftest.py)."""
    monkeypatch.setenv("PIPESPEC_CACHE", str(cache))
    return entry_point("experiments.run", "models=tiny_k2", "dataset=humaneval", "dataset.n_samples=2",
                       "max_new_tokens=8", "run.progress=false", f"hydra.run.dir={out}", *overrides)  # fmt: skip


def test_runner_auto_reuses_a_profile_and_refuses_one_from_elsewhere(cache, profile_path, tmp_path, entry_point,
                                                                     monkeypatch):  # fmt: skip
    again = _run(cache, tmp_path / "again", "strategy=auto", f"strategy.profile={profile_path}")
    assert again.returncode == 0, again.stderr[-2000:]
    assert "measuring a short one" not in again.stdout + again.stderr
    wrong = _refused(entry_point, monkeypatch, cache, tmp_path / "k3", "models=tiny_k3", "strategy=auto",
                     f"strategy.profile={profile_path}")  # fmt: skip
    lines = wrong.stderr.strip().splitlines()
    assert wrong.returncode == 2 and lines[-1].startswith("error: strategy auto") and "hierarchy:" in lines[-1]
    assert not (tmp_path / "k3" / "samples.jsonl").exists()


def test_the_cached_short_profile_is_per_dataset(cache, profile_path, tmp_path):
    """Acceptance differs between datasets: a news run measures its own short profile (the code run's stays
    cached), and the cache key is the prompts' (the same prompts find the same file)."""
    specs = _specs(profile_path)
    code = [("a", [5, 6, 7]), ("b", [8, 9])]
    path = autoconf.cached_profile_path(specs, "tiny_k2", "humaneval", code)
    assert path == autoconf.cached_profile_path(specs, "tiny_k2", "humaneval", [("a", [5, 6, 7]), ("b", [8, 9])])
    assert path != autoconf.cached_profile_path(specs, "tiny_k2", "humaneval", [("a", [5, 6, 7]), ("b", [8])])
    news = _run(cache, tmp_path / "news", "strategy=auto", dataset="news_lee_cnndm")
    assert news.returncode == 0 and "measuring a short one" in news.stdout + news.stderr, news.stderr[-2000:]
    cached = sorted(p.name for p in (cache / "profiles").glob("tiny_k2-*.json"))
    assert len(cached) == 2 and any("news_lee" in name for name in cached)
    recorded = json.loads((tmp_path / "news" / "summary.json").read_text())["auto"]["profile"]
    assert "news_lee" in Path(recorded).name and pf.load_profile(recorded).dataset.startswith("news_lee")


def test_profile_prompts_are_for_auto_alone():
    from pipespec.api import Pipeline

    with pytest.raises(TypeError, match="profile_prompts"):  # the engine's Pipeline has no profile options
        Pipeline(["tiny:draft", "tiny:target"], strategy="pipespec", profile_prompts=["def f():"])
    with pytest.raises(ConfigError, match="experiments.auto.AutoPipeline"):
        Pipeline(["tiny:draft", "tiny:target"], strategy="auto")
    with pytest.raises(ConfigError, match="AutoPipeline chooses strategy, lookahead, max_lead itself"):
        autoconf.AutoPipeline(["tiny:draft", "tiny:target"], strategy="sd", profile="profile.json")
    with pytest.raises(ConfigError, match="a profile or profile_prompts to measure one on, not both"):
        autoconf.choose_for_pipeline([], "profile.json", profile_prompts=["def f():"])


def _specs(profile_path):
    from pipespec.specs import StageSpec

    raw = json.loads(profile_path.read_text())
    return [StageSpec.from_any({"model": s["model"], "name": s["name"]}) for s in raw["stages"]]


def _edited(profile_path, tmp_path, edit):
    raw = json.loads(profile_path.read_text())
    edit(raw)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(raw))
    return path


def test_a_profile_from_another_machine_or_library_is_an_error(profile_path, tmp_path):
    specs = _specs(profile_path)
    cpu = _edited(profile_path, tmp_path, lambda raw: raw["machine"]["cpu"].update(name="Some Other CPU"))
    with pytest.raises(ConfigError, match="cpu: profile 'Some Other CPU'"):
        autoconf.choose_from_profile(cpu, specs, "tiny_k2")
    torch = _edited(profile_path, tmp_path, lambda raw: raw["machine"]["libraries"].update(torch="0.0.1"))
    with pytest.raises(ConfigError, match="torch: profile 0.0.1"):
        autoconf.choose_from_profile(torch, specs, "tiny_k2")
    with pytest.raises(ConfigError, match="stage 0 model"):
        autoconf.choose_from_profile(profile_path, [specs[1], specs[1]])
    with pytest.raises(ConfigError, match="draft_confidence"):
        autoconf.check_auto_options(0.5)


def _set_costs(raw, drafter_step_s, acceptance):
    drafter, target = raw["stages"]
    drafter["step_s_alone"] = drafter["step_s_loaded"] = [drafter_step_s] * len(drafter["step_s_alone"])
    target["step_s_alone"] = target["step_s_loaded"] = [0.01 + 0.0001 * n for n in range(len(target["step_s_alone"]))]
    raw["pairs"][0]["acceptance_by_position"] = [acceptance] * len(raw["pairs"][0]["acceptance_by_position"])
    raw["handoff_s"] = 0.0


def test_greedy_when_nothing_beats_it_else_the_best(profile_path, tmp_path):
    specs = _specs(profile_path)
    slow = _edited(profile_path, tmp_path, lambda raw: _set_costs(raw, 0.05, 0.1))  # a drafter 5x slower, rarely right
    choice = autoconf.choose_from_profile(slow, specs, "tiny_k2")
    assert choice.strategy == "greedy" and choice.stages == (1,)
    assert choice.reason.startswith("no configuration is predicted to beat greedy")
    fast = _edited(profile_path, tmp_path, lambda raw: _set_costs(raw, 0.001, 0.95))  # 10x faster, nearly always right
    choice = autoconf.choose_from_profile(fast, specs, "tiny_k2")
    assert choice.strategy != "greedy" and choice.stages == (0, 1) and "x greedy's" in choice.reason
    greedy = next(c for c in choice.runners_up if c["strategy"] == "greedy") if any(
        c["strategy"] == "greedy" for c in choice.runners_up) else None
    assert greedy is None or greedy["predicted_tokens_per_s"] < choice.predicted_tokens_per_s


def test_pipeline_auto_resolves_before_starting_and_matches_greedy(profile_path):
    from pipespec.api import Pipeline
    from experiments.tiny import random_prompts

    specs = _specs(profile_path)
    prompt = random_prompts(1, length=8, seed=3)[0]
    with autoconf.AutoPipeline(specs, profile=str(profile_path)) as pipe:
        assert pipe.auto is not None and pipe.strategy == pipe.auto.strategy
        assert len(pipe.specs) == len(pipe.auto.stages)
        tokens = pipe.generate(prompt, 12).tokens
    with Pipeline(specs[-1:], strategy="greedy") as reference:
        assert tokens == reference.generate(prompt, 12).tokens
    with pytest.raises(TypeError, match="profile"):  # a profile is read by AutoPipeline only
        Pipeline(specs, strategy="sd", profile=str(profile_path))


def test_bench_runs_auto_beside_the_fixed_configurations(profile_path, cache, tmp_path, entry_point, monkeypatch):
    """`auto` in the bench: the pipeline at the profile's choice, timed with the others, its choice recorded,
    and the two targets (auto / best fixed, auto / greedy) checked."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PIPESPEC_CACHE": str(cache)}
    command = [sys.executable, "-m", "experiments.bench", "models@k2=tiny_k2", "random_prompt_length=12", "samples=2",
               "max_new_tokens=8", "repetitions=2", "warmup_tokens=4", "progress=false", "sd_windows=[2]",
               "sd_draft_confidences=[0.0]", "systems=[greedy,sd,pipespec_k2,auto]", "hierarchies=[]", "auto.hierarchy=k2",
               f"auto.profile={profile_path}", f"hydra.run.dir={tmp_path}"]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "bench.json").read_text())
    rows = {r["name"]: r for r in report["systems"]}
    assert list(rows) == ["greedy", "sd", "pipespec_k2", "auto"]
    assert rows["auto"]["identical_to_greedy"] == "4/4" and rows["auto"]["runs"] == 4
    choice = autoconf.choose_from_profile(profile_path, _specs(profile_path))
    assert report["auto"]["chosen"] == choice.record()["chosen"] == rows["auto"]["settings"]["chosen"]
    assert report["auto"]["profile"] == str(profile_path)
    assert len(rows["auto"]["stages"]) == len(choice.stages)
    targets = {t["target"]: t for t in report["targets"]}
    best = max(("greedy", "sd", "pipespec_k2"), key=lambda n: rows[n]["tokens_per_s_median"])
    assert targets["auto_vs_best_fixed"]["value"] == pytest.approx(
        rows["auto"]["tokens_per_s_median"] / rows[best]["tokens_per_s_median"])
    assert best in targets["auto_vs_best_fixed"]["label"] and "auto_vs_greedy" in targets
    assert "auto: " in (tmp_path / "bench.md").read_text()
    monkeypatch.setenv("PIPESPEC_CACHE", str(cache))  # refused before anything runs: in this process (conftest.py)
    bad = entry_point("experiments.bench", *command[3:-1], "auto.hierarchy=k9", f"hydra.run.dir={tmp_path}/bad")
    assert bad.returncode == 2 and "auto.hierarchy must be k2 or k3" in bad.stderr.strip().splitlines()[-1]


def test_auto_that_learns_runs_a_decided_configuration_every_call_identical_to_greedy(profile_path):
    """AutoPipeline(learn=True): every stage started, each call's traces revise the profile, each call runs
    what the previous decision said (a switch or not, with its reason), and every output is greedy's."""
    from experiments.tiny import random_prompts
    from pipespec.api import Pipeline

    specs = _specs(profile_path)
    prompts = random_prompts(4, length=8, seed=5)
    with Pipeline(specs[-1:], strategy="greedy") as reference:
        expected = [reference.generate(p, 12).tokens for p in prompts]
    with autoconf.AutoPipeline(specs, profile=str(profile_path), learn=True) as pipe:
        assert len(pipe.specs) == len(specs)  # every stage: a decision may take another subset
        outputs = [pipe.generate(p, 12).tokens for p in prompts]
        with pytest.raises(ConfigError, match="runs its own configuration"):
            pipe.generate(prompts[0], 4, strategy="sd")
    assert outputs == expected
    decisions = pipe.decisions
    assert [d["call"] for d in decisions] == [1, 2, 3, 4] and all(d["reason"] for d in decisions)
    assert decisions[0]["ran"]["strategy"] == pipe.auto.strategy
    for before, after in zip(decisions, decisions[1:]):
        assert after["ran"] == before["next"]  # each call runs what the decision before it chose
        assert before["switched"] == (before["next"] != before["ran"])
    if pipe.auto.strategy != "greedy":
        assert pipe.observed.offered  # verifications were counted
    assert pipe.observed.calls == 4 and pipe.observed.speed(len(specs) - 1) > 0


def test_the_runner_records_each_samples_learned_configuration(cache, profile_path, tmp_path, entry_point,
                                                              monkeypatch):  # fmt: skip
    done = _run(cache, tmp_path / "learn", "strategy=auto", f"strategy.profile={profile_path}", "strategy.learn=true")
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((tmp_path / "learn" / "summary.json").read_text())
    records = [json.loads(line) for line in (tmp_path / "learn" / "samples.jsonl").read_text().splitlines()]
    assert len(summary["auto"]["calls"]) == 1 + len(records)  # the warm-up call too
    assert [r["auto"] for r in records] == summary["auto"]["calls"][1:]
    assert summary["identical_to_greedy"] is None or summary["identical_to_greedy"].endswith("/2")
    wrong = _refused(entry_point, monkeypatch, cache, tmp_path / "wrong", "strategy=sd", "+strategy.learn=true")
    assert wrong.returncode == 2 and "strategy.learn is for strategy auto" in wrong.stderr.strip().splitlines()[-1]
