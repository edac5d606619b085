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

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


@pytest.fixture(scope="module")
def tiny_profile(tmp_path_factory):
    out = tmp_path_factory.mktemp("profile")
    command = [sys.executable, "-m", "experiments.profile", "models=tiny_k2", "dataset.n_samples=2",
               "profile.max_fed=6", "profile.repeats=2", "profile.continuation=16", "profile.handoff_tokens=8",
               f"hydra.run.dir={out}"]  # fmt: skip
    done = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    return out / "profile.json"


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
    assert profile.handoff_s > 0 and raw["duration_s"] < 60
    assert pf.mismatches(profile) == []  # measured here


def test_predict_every_strategy(tiny_profile):
    profile = pf.load_profile(tiny_profile)
    greedy = pr.predict(profile, "greedy")
    assert greedy.predicted_tokens_per_s == pytest.approx(1 / profile.stages[-1].cost_fit(1).stage_cost()(1))
    for strategy, lookahead in (("sd", 3), ("pipespec", 0), ("pipespec", 2)):
        p = pr.predict(profile, strategy, lookahead)
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
    raw["stages"][0]["step_s_alone"] = [1.0]
    with pytest.raises(pf.ProfileError, match="same number"):
        pf.parse_profile(raw)


def test_acceptance_by_position_sampler():
    perfect_then_never = sim.simulate_sync_sd([0.01, 1.0], [sim.ByPosition([1.0, 1.0, 0.0])], 5, 200)
    assert set(perfect_then_never.accepted_counts[0]) == {3}  # two drafts accepted, the third never
    with pytest.raises(ValueError, match="rates"):
        sim.ByPosition([1.5])
