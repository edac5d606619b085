"""Reliability of runs and their results: a stage fault in the middle of a run, a
multirun killed at several points and resumed, and HumanEval checks that misbehave.

tests/test_runner.py kills one single run once; here a whole multirun is killed inside a
sample, between two runs and inside the second run, with a half-written line left behind,
and resumed after each kill.
"""

import json
import random
import time
import warnings
from pathlib import Path

import psutil
import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from pipespec.api import Pipeline
from experiments.compose import CONF_MODULE
from pipespec.errors import StageError
from pipespec.faults import FaultPlan
from experiments.reliability import processes_gone
from analysis.rundir import RECORD_KEYS, read_records, read_summary, read_trace

SEED = 9


def composed(*overrides) -> dict:
    with initialize_config_module(config_module=CONF_MODULE, version_base="1.3"):
        return OmegaConf.to_container(compose("config", overrides=list(overrides)), resolve=True)


def check_lines(run_dir: Path) -> list[dict]:
    """samples.jsonl as written: complete records with their traces, no id twice, at most a torn last line."""
    path = run_dir / "samples.jsonl"
    if not path.exists():
        return []
    data = path.read_bytes()
    lines = data.split(b"\n")
    torn = lines.pop()  # b"" when the file ends with a newline
    records = [json.loads(line) for line in lines]  # every newline-terminated line is a whole record
    assert all(all(key in r for key in RECORD_KEYS) for r in records)
    ids = [r["sample_id"] for r in records]
    assert len(ids) == len(set(ids)), f"a sample twice in {path}"
    for r in records:
        read_trace(run_dir, r["index"])
    if torn:
        assert read_records(run_dir)[1] == 1  # a torn line is never read as a record
    return records


# ---- a stage fault in the middle of a run ---------------------------------------------------


def test_a_stage_fault_mid_run_leaves_valid_results_and_resume_completes(tmp_path, monkeypatch):
    config = composed(
        "models=tiny_k2", "strategy=pipespec", "strategy.lookahead=2", "dataset=news_lee_cnndm",
        "dataset.n_samples=3", "max_new_tokens=12", "run.progress=false", "run.stall_timeout_s=3",
        "run.warmup_tokens=0", "run.gpu_monitor=false",
    )  # fmt: skip
    from experiments.runner import run_experiment

    rng = random.Random(SEED)
    fault = {"stage": rng.randrange(2), "at_token": rng.randint(1, 8), "action": rng.choice(["raise", "kill"])}
    original = Pipeline.generate
    calls, pids = [], []

    def generate(self, prompt, max_new_tokens=128, **options):
        calls.append(prompt)
        if len(calls) == 2:  # the second sample
            pids.extend(self.pids)
            options["faults"] = FaultPlan(**fault)
        return original(self, prompt, max_new_tokens, **options)

    monkeypatch.setattr(Pipeline, "generate", generate)
    run_dir = tmp_path / "run"
    started = time.monotonic()
    with pytest.raises(StageError, match=f"stage {fault['stage']}:"):
        run_experiment(config, run_dir)
    assert time.monotonic() - started < 30
    assert processes_gone(pids)
    records = check_lines(run_dir)
    assert [r["index"] for r in records] == [0]  # exactly the finished sample
    assert not (run_dir / "summary.json").exists() or read_summary(run_dir)
    assert not list(run_dir.rglob(".*.tmp"))  # no half-written file left beside the results

    monkeypatch.setattr(Pipeline, "generate", original)
    config["run"]["resume"] = True
    summary = run_experiment(config, run_dir)  # the next run in the same process
    assert summary["n_samples"] == 3 and summary["complete"]
    records = check_lines(run_dir)
    assert sorted(r["index"] for r in records) == [0, 1, 2]
    assert records[0] == check_lines(run_dir)[0]  # the first sample was kept, not redone


# ---- a multirun killed at several points and resumed ---------------------------------------


@pytest.mark.slow
def test_a_multirun_killed_at_random_points_resumes_with_each_sample_once():
    """The reliability command's resume check: kills inside run 0, between runs, inside run 1, a torn line."""
    from experiments.reliability import run_resume

    report = run_resume(log=print)
    assert report["failures"] == []
    assert len(report["points"]) == 3 and report["samples"] == 8


# ---- HumanEval checks that misbehave ------------------------------------------------------------

PROBLEM = {"task_id": "Probe/0", "prompt": "def f(x):\n", "entry_point": "f",
           "test": "def check(candidate):\n    assert candidate(2) == 2\n"}  # fmt: skip


def check(completion, **limits):
    from experiments.data.quality import check_completion

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        started = time.monotonic()
        result = check_completion(PROBLEM, completion, allow_code_execution=True, **limits)
    return result, time.monotonic() - started


def test_code_execution_stays_opt_in():
    from experiments.data.quality import check_completion

    with pytest.raises(PermissionError, match="allow_code_execution"):
        check_completion(PROBLEM, "    return x\n")
    assert composed()["run"]["execute_code"] is False
    assert check("    return x\n")[0]["passed"]


def test_a_completion_cannot_write_outside_its_directory(tmp_path):
    target = tmp_path / "outside.txt"
    for how in (f"open({str(target)!r}, 'w').write('x')",
                f"import os; os.close(os.open({str(target)!r}, os.O_WRONLY | os.O_CREAT))"):  # fmt: skip
        result, _ = check(f"    {how}\n    return x\n")
        assert not result["passed"] and "outside" in result["result"], result
        assert not target.exists()
    # its own temporary directory stays writable
    assert check("    open('scratch.txt', 'w').write('x')\n    return x\n")[0]["passed"]


def test_a_fork_bomb_is_contained_and_reported_failed():
    # bounded, whatever happens: only the first process forks, at most 50 children, each sleeps then exits
    bomb = (
        "    import posix, time\n"
        "    for _ in range(50):\n"
        "        if posix.fork() == 0:\n"
        "            time.sleep(30)\n"
        "            posix._exit(0)\n"
        "    return x\n"
    )
    result, took = check(bomb, timeout_s=5)
    assert not result["passed"] and took < 5 + 2, (result, took)
    time.sleep(0.2)
    left = [p for p in psutil.process_iter(["cmdline"]) if "pipespec-humaneval-" in " ".join(p.info["cmdline"] or [])]
    assert not left, "processes of the check outlived it"


def test_a_memory_hog_is_stopped_by_the_limit():
    result, took = check("    block = bytearray(1 << 30)\n    return x\n", memory_limit_mb=256, timeout_s=5)
    assert not result["passed"] and "MemoryError" in result["result"] and took < 5, result
