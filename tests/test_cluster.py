"""Sweeps through Hydra's submitit launcher (the `cluster` extra), tested with `hydra/launcher=submitit_local`:
every job a real subprocess tree of its own, two at a time, the results the same as the basic launcher's."""

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from analysis.collect import collect
from analysis.rundir import (
    RunStore,
    read_config,
    read_records,
    read_summary,
    refresh_reference,
    summarize_run,
    summary_lock,
)

# its module-scoped fixtures are built once: every test of the module on one xdist worker (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("test_cluster")
SLOW_FIXTURES = ('submitit_sweep', 'basic_sweep')  # sweeps of subprocess jobs: their tests are `slow` (conftest.py)


ROOT = Path(__file__).resolve().parent.parent


def launcher_installed() -> bool:
    try:
        plugin = importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher")
    except ModuleNotFoundError:
        return False
    return plugin is not None and importlib.util.find_spec("submitit") is not None


needs_launcher = pytest.mark.skipif(
    not launcher_installed(), reason="the cluster extra is not installed (pip install -e '.[cluster]')"
)

# three jobs: two run at once (the sweeper's batches of two), greedy alone after them, so it finishes last
SWEEP = ["models=tiny_k2", "strategy=sd,pipespec,greedy", "dataset=news_lee_cnndm", "dataset.n_samples=2",
         "max_new_tokens=10", "strategy.lookahead=2", "run.progress=false"]  # fmt: skip
SUBMITIT = ["hydra/launcher=submitit_local", "hydra.sweeper.max_batch_size=2", "hydra.launcher.timeout_min=15"]
# without the end-of-multirun callback every comparison must come from the jobs themselves
NO_CALLBACK = ["~hydra.callbacks.collect"]
# figures that depend on timing: the speeds, and which drafts pipespec's verifiers happened to see
TIMED = {"run", "ms_per_token", "tokens_per_s", "speedup_vs_greedy", "target_busy"}
PIPESPEC_TIMED = TIMED | {"target_draft_acceptance_rate", "target_mean_acceptance_length", "target_accepted_per_verify"}
JOB_MODULE = "submitit.core._submit"  # the command line of a job's process


def experiments_run(*args, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "experiments.run", *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True, **kwargs,
    )  # fmt: skip


def job_processes(root: psutil.Process) -> list[psutil.Process]:
    """The submitit job processes below `root` (each runs one Hydra job). A job's child caught between its
    fork and its exec still shows the job's command line: only the uppermost match is the job."""
    found = []
    for process in root.children(recursive=True):
        try:
            if JOB_MODULE in " ".join(process.cmdline()):
                found.append(process)
        except psutil.Error:
            continue
    pids = {process.pid for process in found}

    def below_a_job(process: psutil.Process) -> bool:
        try:
            return any(parent.pid in pids for parent in process.parents())
        except psutil.Error:
            return False

    return [process for process in found if not below_a_job(process)]


class TreeWatch:
    """Samples the process tree of a sweep every 0.1 s: which jobs ran at once, and each job's descendants."""

    def __init__(self, pid: int):
        self.root = psutil.Process(pid)
        self.max_jobs = 0
        self.descendants: dict[int, set[int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                jobs = job_processes(self.root)
                self.max_jobs = max(self.max_jobs, len(jobs))
                for job in jobs:
                    self.descendants.setdefault(job.pid, set()).update(p.pid for p in job.children(recursive=True))
            except psutil.Error:
                pass
            self._stop.wait(0.1)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def finish(process: subprocess.Popen, timeout: float = 600) -> tuple[int, str, str]:
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        pytest.fail(f"the sweep did not end within {timeout} s: {err[-3000:]}")
    return process.returncode, out, err


def comparable(rows: list[dict]) -> list[dict]:
    """Collect's rows without the timed figures, keyed by run directory name."""
    kept = []
    for row in rows:
        timed = PIPESPEC_TIMED if row["strategy"] == "pipespec" else TIMED
        kept.append({"name": Path(row["run"]).name, **{k: v for k, v in row.items() if k not in timed}})
    return kept


@pytest.fixture(scope="module", autouse=True)
def tiny_models_built():
    """The tiny hierarchy in the cache before any job starts: concurrent jobs then only read it."""
    from experiments.hierarchies import tiny_model_dir

    tiny_model_dir("target")


@pytest.fixture(scope="module")
def submitit_sweep(tmp_path_factory):
    sweep = tmp_path_factory.mktemp("submitit") / "sweep"
    process = experiments_run("-m", *SWEEP, *SUBMITIT, *NO_CALLBACK, f"hydra.sweep.dir={sweep}")
    watch = TreeWatch(process.pid)
    code, _, err = finish(process)
    watch.stop()
    assert code == 0, err[-3000:]
    return sweep, watch


@pytest.fixture(scope="module")
def basic_sweep(tmp_path_factory):
    sweep = tmp_path_factory.mktemp("basic") / "sweep"
    code, _, err = finish(experiments_run("-m", *SWEEP, f"hydra.sweep.dir={sweep}"))
    assert code == 0, err[-3000:]
    return sweep


# ---- the launcher -----------------------------------------------------------------------


@needs_launcher
def test_jobs_run_two_at_a_time_each_with_stage_processes_of_its_own(submitit_sweep):
    _, watch = submitit_sweep
    assert len(watch.descendants) == 3, "one submitit job process per run"
    assert watch.max_jobs == 2, "the sweeper's batches of two: two jobs at once, never three"
    # a job's pipeline is its own: a fork server and one process per stage (k = 2) below the job, none shared
    assert all(len(pids) >= 3 for pids in watch.descendants.values()), watch.descendants
    every = [pid for pids in watch.descendants.values() for pid in pids]
    assert len(every) == len(set(every))


@needs_launcher
def test_every_run_is_complete_and_the_late_greedy_run_is_its_siblings_reference(submitit_sweep):
    sweep, _ = submitit_sweep
    runs = sorted(p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert [p.name.split("_")[1] for p in runs] == ["sd", "pipespec", "greedy"]
    greedy = runs[-1]
    for run in runs:
        summary = json.loads((run / "summary.json").read_text())
        records, dropped = read_records(run)
        assert summary["complete"] and summary["n_samples"] == 2 and len(records) == 2 and dropped == 0
        assert not list(run.glob(".*.tmp"))
        if run != greedy:  # filled by the greedy job when it finished after them: no end-of-sweep callback ran
            assert summary["identical_to_greedy"] == "2/2", run
            assert summary["reference_run"] == str(greedy)


@needs_launcher
def test_collect_gives_the_basic_launchers_table_timings_aside(submitit_sweep, basic_sweep):
    sweep, _ = submitit_sweep
    on_jobs, in_process = collect([sweep]), collect([basic_sweep])
    assert [row["identical_to_greedy"] for row in on_jobs] == ["2/2", "2/2", "(reference)"]
    assert comparable(on_jobs) == comparable(in_process)
    result = subprocess.run([sys.executable, "-m", "experiments.collect", str(sweep)], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert sum("| 2/2 |" in line for line in result.stdout.splitlines()) == 2


# ---- a job killed mid-run --------------------------------------------------------------------


def wait_until(found, process: subprocess.Popen, what: str, timeout: float = 400):
    """`found()`'s first truthy value, asked every 0.05 s while the sweep runs; fails naming `what` when the sweep
    ends or `timeout` seconds pass first."""
    deadline = time.monotonic() + timeout
    while not (value := found()):
        assert process.poll() is None, f"the sweep ended before {what}"
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}"
        time.sleep(0.05)
    return value


def wait_for_samples(run_dir: Path, count: int, process: subprocess.Popen) -> None:
    samples = run_dir / "samples.jsonl"
    wait_until(lambda: samples.exists() and len(samples.read_text().splitlines()) >= count, process,
               f"{run_dir.name} had {count} samples")  # fmt: skip


def job_writing(root: psutil.Process, run_dir: Path, process: subprocess.Popen) -> psutil.Process:
    """The job process whose Hydra log is in `run_dir` (a job keeps its run.log open while it runs), found as soon
    as it starts, so that finding it takes none of the time between two of its samples."""

    def writing_job() -> psutil.Process | None:
        for job in job_processes(root):
            try:
                if any(Path(f.path).resolve().parent == run_dir.resolve() for f in job.open_files()):
                    return job
            except psutil.Error:  # a job that has just ended
                continue
        return None

    return wait_until(writing_job, process, f"a job process opened a file in {run_dir.name}")


def alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.slow
@needs_launcher
def test_a_job_killed_mid_run_resumes_and_the_other_job_is_untouched(tmp_path):
    """Two jobs at once: pipespec, killed after its first sample, and greedy beside it (its reference)."""
    sweep = tmp_path / "sweep"
    args = ["-m", "models=tiny_k2", "strategy=pipespec,greedy", "strategy.lookahead=3", "dataset=news_lee_cnndm",
            "dataset.n_samples=4", "max_new_tokens=24", "run.progress=false", f"hydra.sweep.dir={sweep}",
            *SUBMITIT, *NO_CALLBACK]  # fmt: skip
    process = experiments_run(*args)
    killed_dir = sweep / "0_pipespec_L3_tiny_k2_news_lee_cnndm"
    job = job_writing(psutil.Process(process.pid), killed_dir, process)
    wait_for_samples(killed_dir, 1, process)  # then killed at once: three samples' time to spare
    family = [job, *job.children(recursive=True)]  # the job and its pipeline's processes
    for member in family:
        with contextlib.suppress(psutil.NoSuchProcess):  # a short-lived child may end first
            member.kill()
    code, _, err = finish(process)
    assert code != 0, "the sweep reports the killed job"
    assert not [p.pid for p in family if alive(p)], "a process of the killed job outlived it"
    killed_with = len(read_records(killed_dir)[0])
    assert 1 <= killed_with < 4 and not (killed_dir / "summary.json").exists()
    (other_dir,) = sweep.glob("1_greedy_*")
    other = json.loads((other_dir / "summary.json").read_text())
    assert other["complete"] and other["n_samples"] == 4, "the job running beside it finished undisturbed"

    code, _, err = finish(experiments_run(*args, "run.resume=true"))
    assert code == 0, err[-3000:]
    records, dropped = read_records(killed_dir)
    assert dropped == 0 and sorted(r["index"] for r in records) == list(range(4))
    assert len({r["sample_id"] for r in records}) == 4
    rows = {Path(row["run"]).name: row for row in collect([sweep])}
    assert [rows[d.name]["identical_to_greedy"] for d in (killed_dir, other_dir)] == ["4/4", "(reference)"]
    assert all(row["complete"] for row in rows.values())
    assert json.loads((killed_dir / "summary.json").read_text())["identical_to_greedy"] == "4/4"


# ---- the results store under concurrent jobs ------------------------------------------------------------


def record(sample_id: str, index: int, tokens: list[int]) -> dict:
    return {"sample_id": sample_id, "index": index, "output_ids": tokens, "output_text": "", "new_tokens": len(tokens),
            "time_s": 0.1 * len(tokens), "stages": []}  # fmt: skip


def started_run(directory: Path, strategy: str, records=()) -> RunStore:
    """A run as a job leaves it while running: config and the samples so far, no summary."""
    store = RunStore(directory)
    store.write_config({"models": {"name": "m", "stages": [{"model": "d"}, {"model": "t"}]},
                        "strategy": {"name": strategy, "lookahead": 0}, "dataset": {"name": "humaneval"},
                        "max_new_tokens": 8})  # fmt: skip
    for r in records:
        store.append(r, {"stages": []})
    return store


def finish_run(store: RunStore) -> None:
    """What a job does at its end: its summary, then its greedy comparisons."""
    store.write_summary(summarize_run(read_config(store.run_dir), store.records, True))
    refresh_reference(store.run_dir)


def test_a_greedy_run_counts_as_reference_once_finished_and_then_fills_its_siblings(tmp_path):
    fast = started_run(tmp_path / "0_sd", "sd", [record("a", 0, [1, 2]), record("b", 1, [3])])
    greedy = started_run(tmp_path / "1_greedy", "greedy", [record("a", 0, [1, 2])])
    finish_run(fast)  # the greedy sibling is still running: half its samples are no reference
    summary = read_summary(fast.run_dir)
    assert summary["identical_to_greedy"] is None and summary["reference_run"] is None
    greedy.append(record("b", 1, [3]), {"stages": []})
    finish_run(greedy)  # finishing last, the greedy run fills in the comparison of its finished sibling
    summary = read_summary(fast.run_dir)
    assert summary["identical_to_greedy"] == "2/2" and summary["reference_run"] == str(greedy.run_dir)
    assert summary["n_samples"] == 2 and summary["complete"]


def test_a_summary_write_waits_for_the_run_s_summary_lock(tmp_path):
    store = started_run(tmp_path / "run", "sd", [record("a", 0, [1])])
    summary = summarize_run(read_config(store.run_dir), store.records, True)
    with summary_lock(store.run_dir):
        writer = threading.Thread(target=store.write_summary, args=(summary,))
        writer.start()
        writer.join(0.5)
        assert writer.is_alive() and not (store.run_dir / "summary.json").exists(), "wrote under another's lock"
    writer.join(10)
    assert read_summary(store.run_dir)["n_samples"] == 1


# ---- the extra missing ------------------------------------------------------------------------


def site_without_the_launcher(directory: Path) -> Path:
    """A site directory holding everything installed here except the launcher plugin and submitit."""
    import sysconfig

    site = Path(sysconfig.get_paths()["purelib"])
    hidden = ("submitit", "hydra_plugins", "hydra_submitit_launcher")
    directory.mkdir()
    for entry in site.iterdir():
        if not entry.name.startswith(hidden):
            (directory / entry.name).symlink_to(entry)
    return directory


def test_the_launcher_extra_missing_is_one_error_line_naming_it(tmp_path):
    site = site_without_the_launcher(tmp_path / "site")
    # -S: no site-packages of its own; the copy without the plugin instead (its .pth files: the editable install)
    program = (f"import runpy, site, sys; site.addsitedir({str(site)!r}); sys.argv[0] = 'experiments.run'; "
               "runpy.run_module('experiments.run', run_name='__main__', alter_sys=True)")  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-S", "-c", program, "-m", "hydra/launcher=submitit_local", "models=tiny_k2",
         f"hydra.sweep.dir={tmp_path / 'sweep'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "pipespec[cluster]" in errors[0], result.stderr[-2000:]
    assert not (tmp_path / "sweep").exists()
