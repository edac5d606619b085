"""Bad input through the command line: one `error: ` line naming the option and what is
expected, exit code 2, no traceback, no results written.

tests/test_runner.py covers max_new_tokens <= 0, negative lookahead, an unknown family, a hub
dataset without a path, a missing model path, an unknown dataset field, an empty dataset
and an unknown config key; tests/test_engine.py the same options through the Python API.
This file covers the rest through `python -m experiments.run` (its entry run in the test's
process: the `entry_point` fixture), and corrupt or foreign results given to collect and the analysis.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "results_tiny"
DRAFT, TARGET = "{model:'tiny:draft_noise0.05'}", "{model:'tiny:target'}"

BAD_RUNS = {
    "mismatched vocabularies": (["models.stages=[{model:OTHER_VOCAB},%s]" % TARGET],
                                "does not share the target's tokenizer: vocabulary sizes 300 vs 256"),
    "unknown dtype": (["models.stages=[{model:'tiny:draft_noise0.05',dtype:float8},%s]" % TARGET],
                      "stage option 'dtype' must be one of ['float32', 'float16', 'bfloat16'], got 'float8'"),
    "unknown device": (["models.stages=[%s,{model:'tiny:target',device:tpu}]" % DRAFT],
                       "stage option 'device' must be 'cpu', 'cuda[:N]', 'auto'"),
    "device not present": (["models.stages=[%s,{model:'tiny:target',device:'cuda:99'}]" % DRAFT],
                           "name GPU(s) cuda:99 (stages on cpu, cuda:99) but this machine has"),
    "prompt longer than the context": (
        ["dataset.prompt.allow_truncation=false", "max_new_tokens=400"],
        "exceeds context_length=512 - max_new_tokens=400 and prompt.allow_truncation is false",
    ),
    "one model for sd": (["models.stages=[%s]" % TARGET, "strategy=sd"], "strategy 'sd' needs at least 2 stages"),
    "one model for pipespec": (["models.stages=[%s]" % TARGET, "strategy=pipespec"],
                               "strategy 'pipespec' needs at least 2 stages"),
    "missing dataset": (["dataset=xsum", "dataset.path=/nonexistent/xsum.jsonl"],
                        "dataset.path '/nonexistent/xsum.jsonl' does not exist"),
}  # fmt: skip


def run_cli(module, *args, timeout=180):
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


@pytest.fixture(scope="module")
def other_vocab(tmp_path_factory) -> str:
    """A tiny model whose vocabulary (300) is not the tiny target's (256)."""
    from experiments.tiny import build_tiny_hierarchy

    return build_tiny_hierarchy(tmp_path_factory.mktemp("vocab300"), [], vocab_size=300)[0]


@pytest.mark.parametrize("name", list(BAD_RUNS))
def test_a_bad_option_is_one_error_line_and_writes_no_results(name, other_vocab, tmp_path, entry_point):
    overrides, message = BAD_RUNS[name]
    run_dir = tmp_path / "run"
    result = entry_point("experiments.run", "models=tiny_k2", "dataset=news_lee_cnndm", "dataset.n_samples=1",
                         "max_new_tokens=4", *(o.replace("OTHER_VOCAB", other_vocab) for o in overrides),
                         "run.progress=false", f"hydra.run.dir={run_dir}")  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and message in errors[0], result.stderr[-2000:]
    assert not (run_dir / "samples.jsonl").exists() and not (run_dir / "summary.json").exists()
    assert not (run_dir / "traces").exists()


def one_error_line(result, *names):
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.startswith("error: ") and result.stderr.strip().count("\n") == 0, result.stderr
    assert all(name in result.stderr for name in names), result.stderr


def test_a_torn_summary_stops_the_analysis_with_one_line(tmp_path):
    run = tmp_path / "torn"
    shutil.copytree(FIXTURE / "1_sd_L2", run)
    text = (run / "summary.json").read_text()
    (run / "summary.json").write_text(text[: len(text) // 2])  # as a non-atomic writer killed mid-way would
    one_error_line(run_cli("analysis.report", str(run), "--out", str(tmp_path / "out")), "summary.json")
    one_error_line(run_cli("experiments.collect", str(run)), "summary.json")


def test_a_foreign_config_stops_collect_with_one_line(tmp_path):
    run = tmp_path / "foreign"
    shutil.copytree(FIXTURE / "0_greedy", run)
    (run / "config.yaml").write_text("- not\n- a run config\n")
    one_error_line(run_cli("experiments.collect", str(run)), "config.yaml", "not a mapping")


def test_collect_counts_only_the_finished_samples_of_a_killed_run(tmp_path):
    """A run killed mid-way (no summary, a torn last line) is collected with its whole records only."""
    run = tmp_path / "killed"
    shutil.copytree(FIXTURE / "0_greedy", run)
    (run / "summary.json").unlink()
    lines = (run / "samples.jsonl").read_text().splitlines()
    (run / "samples.jsonl").write_text(lines[0] + "\n" + lines[1][: len(lines[1]) // 2])
    result = run_cli("experiments.collect", str(run), "--csv", str(tmp_path / "t.csv"))
    assert result.returncode == 0, result.stderr
    header, row = (tmp_path / "t.csv").read_text().splitlines()
    fields = dict(zip(header.split(","), row.split(",")))
    assert fields["n_samples"] == "1" and fields["complete"] == "False"
    assert fields["new_tokens"] == str(json.loads(lines[0])["new_tokens"])
