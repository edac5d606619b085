"""The Hydra runner, the results store and collect: composition, sweeps, resume, errors."""

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
from hydra import compose, initialize_config_module

from experiments.compose import CONF_MODULE, options
from analysis.rundir import (
    RunStore,
    ResultsError,
    find_greedy_reference,
    read_records,
    refresh_reference,
)

# its module-scoped fixtures are built once: every test of the module on one xdist worker (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("test_runner")
SLOW_FIXTURES = ('multirun',)  # a Hydra multirun in a subprocess: their tests are `slow` (conftest.py)


ROOT = Path(__file__).resolve().parent.parent
EXPERIMENTS = options("experiment")
SUMMARY_FIELDS = (
    "strategy", "models", "dataset", "n_samples", "new_tokens", "total_time_s", "ms_per_token",
    "tokens_per_s", "stages", "identical_to_greedy", "speedup_vs_greedy",
)  # fmt: skip
STAGE_FIELDS = ("name", "draft_acceptance_rate", "mean_acceptance_length", "verify_fraction", "busy_fraction")
SAMPLE_FIELDS = ("sample_id", "output_ids", "output_text", "new_tokens", "time_s")


def run_cli(*args, timeout=300, **kwargs):
    return subprocess.run(
        [sys.executable, "-m", "experiments.run", *args, "run.progress=false"],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout, **kwargs,
    )  # fmt: skip


# ---- composition -----------------------------------------------------------------


def sweep_overrides(cfg) -> list[list[str]]:
    """Every job of an experiment's configured sweep, as override lists."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = cfg.hydra.sweeper.params or {}  # parsed as Hydra's sweeper parses them (ranges, {mapping} choices)
    parsed = OverridesParser.create().parse_overrides([f"{key}={value}" for key, value in params.items()])
    choices = [[f"{o.key_or_group}={v}" for v in (o.sweep_string_iterator() if o.is_sweep_override() else [o.value()])]
               for o in parsed]  # fmt: skip
    return [list(combo) for combo in itertools.product(*choices)]


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes_and_plans(experiment, capsys):
    from experiments.run_config import RunConfig
    from experiments.run import plan

    with initialize_config_module(config_module=CONF_MODULE, version_base="1.3"):
        base = compose("config", overrides=[f"experiment={experiment}"], return_hydra_config=True)
        jobs = sweep_overrides(base)
        assert jobs, f"{experiment} defines no sweep"
        for job in jobs:
            cfg = compose("config", overrides=[f"experiment={experiment}", "run.plan=true", *job])
            from omegaconf import OmegaConf

            config = OmegaConf.to_container(cfg, resolve=True)
            plan(RunConfig.from_config(config))
            out = capsys.readouterr().out
            for stage in config["models"]["stages"]:
                assert stage["name"][:17] in out
            assert "per device" in out
            assert "?" not in out.split("per device")[1], f"unknown memory in {experiment} {job}"


def test_plan_cli_on_a_gpu_config_here(tmp_path, entry_point):
    result = entry_point("experiments.run", "models=llama3_1b_8b_70b", "run.plan=true",
                         f"hydra.run.dir={tmp_path}/plan")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "cuda:2,cuda:3" in result.stdout and "nf4" in result.stdout
    # 70.6B in NF4 over two GPUs, x 1.1 overhead: the decoder's projections at 0.5625 bytes a parameter, the
    # embeddings, head and norms at 2 (experiments.architectures' published shapes)
    assert "21.88 GiB" in result.stdout


# ---- sweeps and collect --------------------------------------------------------------


@pytest.fixture(scope="module")
def multirun(tmp_path_factory):
    sweep = tmp_path_factory.mktemp("sweep")
    result = run_cli(
        "-m", "models=tiny_k2", "strategy=pipespec,greedy", "dataset=humaneval,news_lee_cnndm",
        "dataset.n_samples=2", "max_new_tokens=10", "strategy.lookahead=2", f"hydra.sweep.dir={sweep}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return sweep, result


def test_multirun_2x2_writes_four_runs_with_greedy_comparisons(multirun):
    sweep, result = multirun
    runs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert len(runs) == 4
    for run in runs:
        summary = json.loads((run / "summary.json").read_text())
        assert all(field in summary for field in SUMMARY_FIELDS)
        assert all(field in stage for stage in summary["stages"] for field in STAGE_FIELDS)
        assert summary["n_samples"] == 2 and summary["complete"]
        records, dropped = read_records(run)
        assert len(records) == 2 and dropped == 0
        assert all(field in r for r in records for field in SAMPLE_FIELDS)
        assert all((run / "traces" / f"{r['index']:05d}.json.gz").exists() for r in records)
        assert (run / "config.yaml").exists() and (run / "env.json").exists()
        if summary["strategy"] == "pipespec":
            # pipespec ran first: its comparison was filled in when the multirun ended
            assert summary["identical_to_greedy"] == "2/2"
            assert summary["speedup_vs_greedy"] > 0
            assert summary["reference_run"].endswith(f"greedy_L2_tiny_k2_{summary['dataset']}")
        else:
            assert summary["identical_to_greedy"] is None
    assert "speedup_vs_greedy" in result.stdout  # the table printed at the end


def test_collect_prints_and_writes_the_speedup_table(multirun, tmp_path):
    sweep, _ = multirun
    csv_path, md_path = tmp_path / "t.csv", tmp_path / "t.md"
    result = subprocess.run(
        [sys.executable, "-m", "experiments.collect", str(sweep), "--csv", str(csv_path), "--markdown", str(md_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("| tiny_k2")]
    assert len(rows) == 4
    pipespec_rows = [r for r in rows if "| pipespec |" in r]
    assert all("| 2/2 |" in r for r in pipespec_rows)
    lines = csv_path.read_text().splitlines()
    assert lines[0].startswith("run,models,strategy") and len(lines) == 5
    assert md_path.read_text().strip() == result.stdout.strip()


def test_collect_refuses_a_foreign_or_corrupt_directory(tmp_path, capsys):
    from experiments.collect import main as collect_main

    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("hello")
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "summary.json").write_text("{not json")
    (corrupt / "config.yaml").write_text("models: {name: x}\nstrategy: {name: greedy}\ndataset: {name: d}\n")
    for bad in ("foreign", "corrupt", "missing"):
        assert collect_main([str(tmp_path / bad)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and "Traceback" not in err and err.count("\n") == 1
        assert bad in err


# ---- resume ------------------------------------------------------------------------


@pytest.mark.slow
def test_a_run_killed_mid_way_resumes_with_each_sample_exactly_once(tmp_path, entry_point, monkeypatch):
    run_dir = tmp_path / "run"
    args = ["models=tiny_k2", "strategy=sd", "strategy.lookahead=3", "dataset=news_lee_cnndm",
            "dataset.n_samples=6", "max_new_tokens=48", f"hydra.run.dir={run_dir}"]  # fmt: skip
    child = subprocess.Popen(
        [sys.executable, "-m", "experiments.run", *args, "run.progress=false"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    samples = run_dir / "samples.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and (not samples.exists() or len(samples.read_text().splitlines()) < 2):
        assert child.poll() is None, "the run ended before it could be killed"
        time.sleep(0.05)
    family = [child.pid] + [p.pid for p in psutil.Process(child.pid).children(recursive=True)]
    os.killpg(child.pid, signal.SIGKILL)  # the driver and its stage processes, mid-sample
    child.wait(10)
    killed_with = len(read_records(run_dir)[0])
    assert 2 <= killed_with < 6
    with open(samples, "a") as handle:  # as if the kill had hit while a line was being written
        handle.write('{"sample_id": "lee-999", "index": 5, "output_ids": [1, 2')
    time.sleep(1.0)
    assert not [pid for pid in family if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]

    hydra_record = {p: p.read_text() for p in (run_dir / ".hydra").glob("*.yaml")}
    again = entry_point("experiments.run", *args, "run.progress=false")  # without resume: refused, nothing touched
    assert again.returncode == 2 and "run.resume=true" in again.stderr
    assert hydra_record and {p: p.read_text() for p in hydra_record} == hydra_record  # how it was run, as it was
    # the resume in this process (the killed run above was the real command): no new interpreter to import torch
    resumed = entry_point("experiments.run", *args, "run.resume=true", "run.progress=false")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"{killed_with} samples done" in resumed.stderr
    records, dropped = read_records(run_dir)
    assert dropped == 0
    ids = [r["sample_id"] for r in records]
    assert len(ids) == 6 and len(set(ids)) == 6
    assert sorted(r["index"] for r in records) == list(range(6))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["n_samples"] == 6 and summary["complete"]

    # resumed once finished: no stage starts, and the fork server the run warmed is ended at once (left
    # alone, it would import torch and transformers for seconds after the command has exited)
    import pipespec.api

    ended = []
    monkeypatch.setattr(pipespec.api, "warm_stage_server", lambda launch=None: True)
    monkeypatch.setattr(pipespec.api, "stop_stage_server", lambda: ended.append(True))
    finished = entry_point("experiments.run", *args, "run.resume=true", "run.progress=false")
    assert finished.returncode == 0 and "6 samples done, 0 to go" in finished.stderr and ended == [True]

    different = entry_point("experiments.run", *args[:-2], "max_new_tokens=20", f"hydra.run.dir={run_dir}",
                            "run.resume=true", "run.progress=false")  # fmt: skip
    assert different.returncode == 2 and "different max_new_tokens" in different.stderr


# ---- the store on its own ---------------------------------------------------------------


def record(sample_id, index, tokens):
    return {"sample_id": sample_id, "index": index, "output_ids": tokens, "output_text": "", "new_tokens": len(tokens),
            "time_s": 0.1 * len(tokens), "stages": []}  # fmt: skip


def test_a_resume_keeps_the_environment_its_first_samples_ran_in_and_lists_its_own(tmp_path):
    store = RunStore(tmp_path)
    store.write_env({"cpu": "first", "torch": "2"})
    store.write_env({"cpu": "first again", "torch": "2"})  # no sample yet: a fresh start
    store.append(record("a", 0, [1, 2]), {"stages": []})
    RunStore(tmp_path).write_env({"cpu": "second", "torch": "3"})
    resumed = RunStore(tmp_path)
    resumed.append(record("b", 1, [3]), {"stages": []})
    resumed.write_env({"cpu": "third", "torch": "3"})
    env = json.loads((tmp_path / "env.json").read_text())
    assert env == {"cpu": "first again", "torch": "2", "resumed": [{"samples_before": 1, "cpu": "second", "torch": "3"},
                                                                   {"samples_before": 2, "cpu": "third", "torch": "3"}]}


def test_store_drops_a_half_written_line_and_keeps_the_rest(tmp_path):
    store = RunStore(tmp_path)
    store.append(record("a", 0, [1, 2]), {"stages": []})
    store.append(record("b", 1, [3]), {"stages": []})
    with open(tmp_path / "samples.jsonl", "a") as handle:
        handle.write('{"sample_id": "c", "ind')
    reopened = RunStore(tmp_path)
    assert reopened.finished_ids == {"a", "b"} and reopened.dropped_lines == 1
    reopened.append(record("c", 2, [4]), {"stages": []})
    records, dropped = read_records(tmp_path)
    assert [r["sample_id"] for r in records] == ["a", "b", "c"] and dropped == 0
    assert not list(tmp_path.glob(".*.tmp"))


def write_run(directory, strategy, max_new_tokens=8, records=()):
    store = RunStore(directory)
    store.write_config({
        "models": {"name": "m", "stages": [{"model": "d"}, {"model": "t"}]},
        "strategy": {"name": strategy, "lookahead": 0}, "dataset": {"name": "humaneval"},
        "max_new_tokens": max_new_tokens,
    })  # fmt: skip
    for r in records:
        store.append(r, {"stages": []})
    from analysis.rundir import read_config, summarize_run

    store.write_summary(summarize_run(read_config(directory), store.records, True))
    return directory


def test_reference_run_must_be_a_comparable_greedy_run(tmp_path):
    greedy = write_run(tmp_path / "g", "greedy", records=[record("a", 0, [1, 2, 3, 4])])
    fast = write_run(tmp_path / "p", "pipespec", records=[dict(record("a", 0, [1, 2, 3, 4]), time_s=0.2)])
    summary = refresh_reference(fast, str(greedy))
    assert summary["identical_to_greedy"] == "1/1" and summary["speedup_vs_greedy"] == pytest.approx(2.0)
    other_budget = write_run(tmp_path / "g2", "greedy", max_new_tokens=16)
    with pytest.raises(ResultsError, match="not comparable"):
        find_greedy_reference(fast, {"models": {"stages": [{"model": "t"}]}, "strategy": {"name": "sd"},
                                     "dataset": {"name": "humaneval"}, "max_new_tokens": 8}, str(other_budget))  # fmt: skip
    with pytest.raises(ResultsError, match="not greedy"):
        refresh_reference(greedy, str(fast))


# ---- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "override, message",
    [
        ("max_new_tokens=0", "max_new_tokens must be an integer > 0"),
        ("strategy.lookahead=-1", "lookahead must be an integer >= 0"),
        ("models.family=robot", "models.family must be 'base' or 'chat'"),
        ("dataset=cnn_dailymail", "dataset.path"),
        ("models.stages=[{model:/nonexistent/model},{model:/nonexistent/target}]", "does not exist"),
        ("dataset=xsum dataset.path=FIXTURE dataset.source_field=body", "body"),
        ("dataset=xsum dataset.path=EMPTY", "has no rows"),
    ],
)
def test_bad_options_give_one_line_errors_and_write_no_results(override, message, tmp_path, entry_point):
    from multiprocessing import forkserver

    run_dir = tmp_path / "bad"
    overrides = bad_input_files(tmp_path, override)
    dataset = [] if override.startswith("dataset=") else ["dataset=news_lee_cnndm"]
    server = getattr(forkserver._forkserver, "_forkserver_pid", None)
    result = entry_point("experiments.run", "models=tiny_k2", *dataset, "dataset.n_samples=1", "max_new_tokens=4",
                         *overrides, f"hydra.run.dir={run_dir}", "run.progress=false")  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and message in errors[0], result.stderr[-2000:]
    assert not (run_dir / "samples.jsonl").exists() and not (run_dir / "summary.json").exists()
    assert getattr(forkserver._forkserver, "_forkserver_pid", None) == server, "the failed run left its stage server"


def bad_input_files(tmp_path: Path, override: str) -> list[str]:
    """The override's FIXTURE (one summarisation row) and EMPTY (no rows) made files under tmp_path."""
    (tmp_path / "x.jsonl").write_text(json.dumps({"id": "1", "document": "A story.", "summary": "Story."}) + "\n")
    (tmp_path / "empty.jsonl").write_text("")
    text = override.replace("FIXTURE", str(tmp_path / "x.jsonl"))
    return text.replace("EMPTY", str(tmp_path / "empty.jsonl")).split()


def test_a_run_failing_its_checks_leaves_no_process_behind(tmp_path):
    """The command itself, in a subprocess: a run whose dataset fails after the stage server has started exits
    with one error line, and no process it started (the fork server importing torch) outlives it."""
    run_dir = tmp_path / "bad"
    tag = f"pipespec-test-{uuid.uuid4().hex}"  # in the environment of every process the run starts
    with open(tmp_path / "err.txt", "w+") as err:  # a file, not a pipe: the call returns when the run exits
        code = subprocess.call([sys.executable, "-m", "experiments.run", "models=tiny_k2", "dataset=xsum",
                                *bad_input_files(tmp_path, "dataset.path=EMPTY"), "dataset.n_samples=1",
                                "max_new_tokens=4", f"hydra.run.dir={run_dir}", "run.progress=false"],
                               cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err, timeout=120,
                               env={**os.environ, "PIPESPEC_TEST_TAG": tag})  # fmt: skip
        left = tagged_processes(tag, grace_s=2.0)
        err.seek(0)
        stderr = err.read()
    assert code == 2 and "Traceback" not in stderr, stderr[-2000:]
    assert [line for line in stderr.splitlines() if line.startswith("error: ")] == [stderr.strip().splitlines()[-1]]
    assert "has no rows" in stderr and not (run_dir / "samples.jsonl").exists()
    assert not left, f"processes the failed run started outlived it: {left}"


def tagged_processes(tag: str, grace_s: float) -> list[str]:
    """The command lines of the processes whose environment holds PIPESPEC_TEST_TAG=tag and that are alive
    `grace_s` after the call (multiprocessing's resource tracker ends a moment after its last user)."""
    deadline = time.monotonic() + grace_s
    while True:
        found = []
        for process in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if process.environ().get("PIPESPEC_TEST_TAG") == tag and process.status() != psutil.STATUS_ZOMBIE:
                    found.append(" ".join(process.cmdline())[:200])
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def test_an_unknown_config_key_is_refused_by_hydra(tmp_path, entry_point):
    result = entry_point("experiments.run", "max_new_token=4", f"hydra.run.dir={tmp_path}/x")
    assert result.returncode != 0 and "max_new_token" in result.stderr


# ---- quality per sample ----------------------------------------------------------------


def test_per_sample_quality_rouge_and_opt_in_pass_at_1():
    from experiments.data import load_dataset
    from experiments.data.loaders import Sample
    from experiments.runner import quality_of

    problem = load_dataset({"name": "humaneval", "loader": "humaneval", "ids": ["HumanEval/2"]}).samples[0]
    assert quality_of(problem, problem.reference, "code", "base", execute_code=False) is None  # opt-in only
    assert quality_of(problem, problem.reference, "code", "base", execute_code=True)["passed"] == 1.0
    assert quality_of(problem, "    return None\n", "code", "base", execute_code=True)["passed"] == 0.0
    fenced = "Here it is:\n```python\ndef truncate_number(number: float) -> float:\n    return number % 1.0\n```"
    assert quality_of(problem, fenced, "code", "chat", execute_code=True)["passed"] == 1.0
    article = Sample("a", "The cat sat on the mat all day.", "A cat sat on a mat.", {})
    scores = quality_of(article, "A cat sat on a mat.", "summarization", "base", execute_code=False)
    assert scores["rouge1"] == pytest.approx(1.0)
