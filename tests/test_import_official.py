"""Tests of analysis.import_official on the authors' published logs and on synthetic logs."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from analysis import fit
from analysis import import_official as io_

REPO_ROOT = Path(__file__).resolve().parents[1]
OFFICIAL_DIR = io_.DEFAULT_DIR  # results/official/humaneval, committed with its licence

needs_official = pytest.mark.skipif(not OFFICIAL_DIR.is_dir(), reason=f"official logs absent: {OFFICIAL_DIR}")

# Paper Table 2, HumanEval, LLaMA3.1-70B rows (file, ms/token, speedup)
TABLE2_70B = [
    ("greedy_Meta-Llama-3.1-70B-Instruct.json", 123.69, 1.00),
    ("chain_Llama-3.1-8B-Instruct-Meta-Llama-3.1-70B-Instruct_8.json", 93.42, 1.32),
    ("chain_Llama-3.2-1B-Instruct-Llama-3.1-8B-Instruct-Meta-Llama-3.1-70B-Instruct_8.json", 90.14, 1.37),
    ("async-chain_Llama-3.1-8B-Instruct-Meta-Llama-3.1-70B-Instruct_0.json", 54.52, 2.27),
    ("async-chain_Llama-3.2-1B-Instruct-Llama-3.1-8B-Instruct-Meta-Llama-3.1-70B-Instruct_0.json", 48.76, 2.54),
]


@pytest.fixture(scope="module")
def official_rows():
    if not OFFICIAL_DIR.is_dir():
        pytest.skip(f"official logs absent: {OFFICIAL_DIR}")
    return {row.file: row for row in io_.import_dir(OFFICIAL_DIR)}


# --------------------------------------------------------------------------- official logs


@needs_official
@pytest.mark.parametrize("file,ms,speedup", TABLE2_70B)
def test_reproduces_table2_70b_rows(official_rows, file, ms, speedup):
    row = official_rows[file]
    assert f"{row.ms_per_token:.2f}" == f"{ms:.2f}"
    assert f"{row.speedup:.2f}" == f"{speedup:.2f}"


@needs_official
def test_one_row_per_file_and_metadata(official_rows):
    assert len(official_rows) == len(list(OFFICIAL_DIR.glob("*.json")))
    row = official_rows[TABLE2_70B[4][0]]
    assert row.strategy == "async-chain"
    assert row.models == ("1B", "8B", "70B")
    assert row.samples == 20
    assert len(row.accepted_per_verify) == 2
    assert all(a >= 1.0 for a in row.accepted_per_verify)  # counts include the verifier's own token


@needs_official
def test_per_log_extraction():
    log = io_.load_log(OFFICIAL_DIR / TABLE2_70B[4][0])
    assert log.num_pairs == 2 and log.model_names == ("1B", "8B", "70B")
    first = log.samples[0]
    assert len(first.model_times) == 3 and len(first.accepted_tokens) == 2
    counts = io_.accepted_counts(log, 1)
    assert len(counts) == sum(len(s.accepted_tokens[1]) for s in log.samples)
    assert min(counts) >= 1
    times = io_.step_times(log, 2)
    assert len(times) == sum(len(s.model_times[2]) for s in log.samples) and min(times) > 0
    with pytest.raises(IndexError):
        io_.accepted_counts(log, 2)
    greedy = io_.load_log(OFFICIAL_DIR / TABLE2_70B[0][0])
    assert greedy.num_pairs == 0 and len(io_.step_times(greedy, 0)) > 0  # token_times


@needs_official
def test_sync_window_and_alpha_on_official_chain():
    log = io_.load_log(OFFICIAL_DIR / TABLE2_70B[1][0])
    assert io_.sync_window(log) == 7  # lookahead 8: 7 drafts + the verifier's token
    counts = io_.accepted_counts(log, 0)
    assert max(counts) == 8
    censored = fit.estimate_alpha(counts, window=7)
    lower = fit.estimate_alpha(counts)
    assert 0.0 < lower < censored < 1.0


@needs_official
def test_cli_table_and_csv():
    result = subprocess.run(
        [sys.executable, "-m", "analysis.import_official", str(OFFICIAL_DIR)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split()[0] == "strategy"
    assert len(lines) == 1 + len(list(OFFICIAL_DIR.glob("*.json")))
    assert any("123.69" in line and "70B" in line for line in lines)
    csv_result = subprocess.run(
        [sys.executable, "-m", "analysis.import_official", str(OFFICIAL_DIR), "--csv"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )
    assert csv_result.returncode == 0
    assert csv_result.stdout.startswith("file,strategy,models,")
    assert '"1B,8B,70B",0,20,48.76,2.54,' in csv_result.stdout


# --------------------------------------------------------------------------- synthetic logs


def _write_log(path, strategy="chain", models=("org/Tiny-1B", "org/Big-8B"), samples=None, lookahead=4):
    if samples is None:
        samples = [{"total_time": 2.0, "tokens_generated": 100,
                    "model_times": [[0.01] * 10, [0.1] * 5], "accepted_tokens": [[3, 4, 1]]}]
    if strategy == "greedy":
        samples = [{"total_time": s["total_time"], "tokens_generated": s["tokens_generated"],
                    "token_times": [0.05] * 3} for s in samples]
    data = {
        "metadata": {"strategy": strategy, "model_configs": [{"path": m} for m in models],
                     "lookahead": lookahead, "dataset": "x", "num_samples": len(samples)},
        "results": [{"sample_index": i, "metrics": m} for i, m in enumerate(samples)],
    }
    path.write_text(json.dumps(data))
    return path


def test_synthetic_dir_speedup_and_missing_baseline(tmp_path):
    _write_log(tmp_path / "sd.json")
    _write_log(tmp_path / "ar.json", strategy="greedy", models=("org/Big-8B",),
               samples=[{"total_time": 4.0, "tokens_generated": 100}])
    _write_log(tmp_path / "other.json", models=("org/Tiny-1B", "org/Huge-70B"))
    (tmp_path / "README.md").write_text("not a log, ignored (not *.json)")
    rows = {r.file: r for r in io_.import_dir(tmp_path)}
    assert set(rows) == {"sd.json", "ar.json", "other.json"}
    assert rows["sd.json"].ms_per_token == pytest.approx(20.0)
    assert rows["sd.json"].speedup == pytest.approx(2.0)
    assert rows["ar.json"].speedup == pytest.approx(1.0)
    assert rows["other.json"].speedup is None  # no greedy 70B log in the folder
    assert rows["sd.json"].accepted_per_verify == pytest.approx((8 / 3,))
    table = io_.format_table(list(rows.values()))
    other_line = next(line for line in table.splitlines() if "1B,70B" in line)
    assert "20.00" in other_line


def test_pooled_not_mean_of_ratios(tmp_path):
    samples = [
        {"total_time": 1.0, "tokens_generated": 10, "model_times": [[0.1], [0.1]], "accepted_tokens": [[1]]},
        {"total_time": 3.0, "tokens_generated": 90, "model_times": [[0.1], [0.1]], "accepted_tokens": [[2]]},
    ]
    log = io_.load_log(_write_log(tmp_path / "a.json", samples=samples))
    assert io_.pooled_ms_per_token(log) == pytest.approx(40.0)  # 4 s / 100 tokens, not mean(100, 33.3)


def test_short_model_name():
    assert io_.short_model_name("meta-llama/Meta-Llama-3.1-70B-Instruct") == "70B"
    assert io_.short_model_name("meta-llama/Llama-3.2-1B-Instruct") == "1B"
    assert io_.short_model_name("JackFram/llama-68m") == "68M"
    assert io_.short_model_name("gpt2") == "gpt2"


def _run_cli(*args):
    return subprocess.run([sys.executable, "-m", "analysis.import_official", *map(str, args)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)


def test_cli_missing_folder(tmp_path):
    result = _run_cli(tmp_path / "nope")
    assert result.returncode == 2
    assert "no such folder" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_cli_empty_folder(tmp_path):
    result = _run_cli(tmp_path)
    assert result.returncode == 2
    assert "no log files" in result.stderr and "Traceback" not in result.stderr


def test_results_folder_or_its_log_subfolder(tmp_path):
    """The published results folder holds its logs in humaneval/: either folder is accepted."""
    logs = tmp_path / "humaneval"
    logs.mkdir()
    _write_log(logs / "sd.json")
    (tmp_path / "README.md").write_text("about the logs")
    assert io_.log_dir(tmp_path) == logs and io_.log_dir(logs) == logs
    assert [r.file for r in io_.import_dir(tmp_path)] == [r.file for r in io_.import_dir(logs)] == ["sd.json"]
    result = _run_cli(tmp_path)
    assert result.returncode == 0, result.stderr
    assert "1B,8B" in result.stdout


def test_several_log_subfolders_are_ambiguous(tmp_path):
    for name in ("humaneval", "cnndm"):
        (tmp_path / name).mkdir()
        _write_log(tmp_path / name / "sd.json")
    result = _run_cli(tmp_path)
    assert result.returncode == 2
    assert "cnndm, humaneval" in result.stderr and "Traceback" not in result.stderr


@needs_official
def test_cli_accepts_the_published_results_folder():
    result = _run_cli(OFFICIAL_DIR.parent)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 1 + len(list(OFFICIAL_DIR.glob("*.json")))


@pytest.mark.parametrize(
    "content,reason",
    [
        ("{not json", "invalid JSON"),
        (json.dumps({"foo": 1}), "no metadata"),
        (json.dumps({"metadata": {"strategy": "beam", "model_configs": [{"path": "m"}]}, "results": []}),
         "unknown strategy"),
        (json.dumps({"metadata": {"strategy": "greedy", "model_configs": [{"path": "m"}]}, "results": []}),
         "no results"),
        (json.dumps({"metadata": {"strategy": "chain", "model_configs": [{"path": "a"}, {"path": "b"}]},
                     "results": [{"metrics": {"total_time": 1.0, "tokens_generated": 3}}]}),
         "model_times"),
    ],
)
def test_cli_bad_file_is_named(tmp_path, content, reason):
    _write_log(tmp_path / "good.json")
    (tmp_path / "broken.json").write_text(content)
    result = _run_cli(tmp_path)
    assert result.returncode == 2
    assert "broken.json" in result.stderr and reason in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    with pytest.raises(io_.OfficialLogError, match="broken.json"):
        io_.load_log(tmp_path / "broken.json")
