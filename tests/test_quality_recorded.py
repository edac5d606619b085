"""Quality recorded: a run's dataset.metric checked before anything starts, pass@1 on by default for HumanEval
(with its opt-out and timeout), and `python -m experiments.score` writing pass@1 into finished runs without
touching what they measured."""

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import yaml

from experiments.compose import compose
from experiments.run_config import RunConfig
from experiments.data import load_dataset
from experiments.data.quality import PASS_AT_1, CodeExecutionWarning, MetricError, QualitySetup, quality_setup
from experiments.score import main as score_main

ROOT = Path(__file__).resolve().parents[1]
PROBLEMS = ("HumanEval/2", "HumanEval/0")


def composed(*overrides: str) -> dict:
    return compose("config", ["models=tiny_k2", "dataset.n_samples=1", "max_new_tokens=4", *overrides])


# ---- dataset.metric and the pass@1 settings ------------------------------------------------------------------


@pytest.mark.parametrize("dataset", ["news_lee_cnndm", "humaneval"])  # without references, and with them
def test_an_unknown_metric_is_one_error_before_anything_starts(dataset):
    with pytest.raises(MetricError) as caught:
        RunConfig.from_config(composed(f"dataset={dataset}", "dataset.metric=bleurt_xl_9"))
    message = str(caught.value)
    assert message.startswith("dataset.metric='bleurt_xl_9': no such metric") and "\n" not in message


@pytest.mark.slow  # a Hydra run in a subprocess
def test_the_run_command_stops_on_an_unknown_metric_with_one_line_and_no_results(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "experiments.run", "dataset=news_lee_cnndm", "dataset.metric=bleurt_xl_9",
         "dataset.n_samples=1", "models=tiny_k2", "max_new_tokens=4", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**__import__("os").environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"},
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.startswith("error: dataset.metric='bleurt_xl_9'") and result.stderr.count("\n") == 1
    assert not (tmp_path / "run" / "samples.jsonl").exists()


def test_pass_at_1_is_on_by_default_for_humaneval_with_an_opt_out():
    on = quality_setup(RunConfig.from_config(composed("dataset=humaneval")).dataset)
    assert on == QualitySetup(PASS_AT_1, True, 10.0)
    off = RunConfig.from_config(composed("dataset=humaneval", "dataset.execute_code=false"))
    assert quality_setup(off.dataset) == QualitySetup(PASS_AT_1, False, 10.0)
    assert quality_setup(off.dataset, execute_code=True).execute_code  # run.execute_code=true still opts in
    problem = load_dataset({"name": "humaneval", "loader": "humaneval", "ids": ["HumanEval/2"]}).samples[0]
    assert quality_setup(off.dataset).score(problem, problem.reference, "base") is None  # nothing executed
    news = RunConfig.from_config(composed("dataset=news_lee_cnndm")).dataset
    assert quality_setup(news) == QualitySetup(None, False, 10.0)


@pytest.mark.parametrize("override, match", [
    ("dataset.metric=pass@1", "needs a code dataset"),
    ("dataset.execute_code=maybe", "dataset.execute_code must be true or false"),
    ("dataset.execute_timeout_s=0", "dataset.execute_timeout_s must be a number of seconds > 0"),
])  # fmt: skip
def test_bad_quality_settings_are_one_line_errors(override, match):
    dataset = "news_lee_cnndm" if "metric" in override else "humaneval"
    with pytest.raises(MetricError, match=match):
        RunConfig.from_config(composed(f"dataset={dataset}", override))


def test_a_check_that_runs_too_long_fails_at_the_timeout():
    problem = load_dataset({"name": "humaneval", "loader": "humaneval", "ids": ["HumanEval/2"]}).samples[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CodeExecutionWarning)
        looping = QualitySetup(PASS_AT_1, True, 1.0).score(problem, "    while True:\n        pass\n", "base")
    assert looping == {"passed": 0.0, "result": "timed out"}


# ---- scoring finished runs -------------------------------------------------------------------------------


def write_run(run_dir: Path, dataset: str, outputs: dict[str, str]) -> None:
    """A finished run of `dataset` whose records hold `outputs` (sample id -> output_text), as a sweep writes."""
    run_dir.mkdir(parents=True)
    config = composed(f"dataset={dataset}")
    config["models"]["family"] = "base"
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    records = [{"sample_id": f"{sid}@r0", "index": i, "output_ids": [1, 2], "output_text": text, "new_tokens": 2,
                "time_s": 0.125 + i, "stages": [{"name": "t", "verify_steps": 1}], "quality": None,
                "slot": {"prompt": sid, "repetition": 0}} for i, (sid, text) in enumerate(outputs.items())]  # fmt: skip
    (run_dir / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + '{"torn": ')
    summary = {"strategy": "greedy", "models": "tiny_k2", "dataset": dataset, "n_samples": len(records),
               "new_tokens": 4, "total_time_s": 1.25, "ms_per_token": 312.5, "tokens_per_s": 3.2, "stages": [],
               "quality": None}  # fmt: skip
    (run_dir / "summary.json").write_text(json.dumps(summary))


def test_scoring_writes_pass_at_1_and_leaves_the_measurements(tmp_path, capsys):
    selection = {"name": "humaneval", "loader": "humaneval", "ids": list(PROBLEMS)}
    problems = {p.sample_id: p for p in load_dataset(selection)}
    passing, failing = problems["HumanEval/2"].reference, "    return None\n"
    write_run(tmp_path / "run", "humaneval", {"HumanEval/2": passing, "HumanEval/0": failing})
    before = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()[:2]]
    summary_before = json.loads((tmp_path / "run" / "summary.json").read_text())
    with warnings.catch_warnings(record=True):
        assert score_main([str(tmp_path)]) == 0
    assert "pass@1 0.500" in capsys.readouterr().out
    lines = (tmp_path / "run" / "samples.jsonl").read_text().splitlines()
    after = [json.loads(line) for line in lines[:2]]
    assert [r["quality"]["passed"] for r in after] == [1.0, 0.0]
    assert after[0]["quality"]["result"] == "passed" and after[1]["quality"]["result"].startswith("failed")
    for old, new in zip(before, after):
        assert {k: v for k, v in new.items() if k != "quality"} == {k: v for k, v in old.items() if k != "quality"}
    assert lines[2] == '{"torn": '  # a torn line of a killed run is kept as it was
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["quality"] == {"passed": 0.5} and summary["quality_metric"] == PASS_AT_1
    assert {k: v for k, v in summary.items() if not k.startswith("quality")} == {
        k: v for k, v in summary_before.items() if not k.startswith("quality")}


def test_scoring_a_run_without_references_writes_nothing(tmp_path, capsys):
    write_run(tmp_path / "run", "news_lee_cnndm", {"lee_background-000": "a summary"})
    files = {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()}
    assert score_main([str(tmp_path / "run")]) == 0
    assert "nothing to score (no reference, a stand-in): nothing written" in capsys.readouterr().out
    assert {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()} == files


def test_scoring_a_folder_without_runs_is_one_error_line(tmp_path, capsys):
    assert score_main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
