"""Reliability figures: injected faults, a soak, killed-and-resumed sweeps and bad input, on tiny models.

    python -m experiments.reliability [--soak-generations 100] [--only faults,soak,resume,bad]

1. faults: a stage raises, exits or is SIGKILLed at a seeded random point of a generation
   (every stage of k = 2 and k = 3, sd and pipespec), a stage stops responding, a control
   message is lost (`pipespec.faults`); each must end the call with a StageError naming the
   stage within 10 s, leave no stage process, and the next call on the same Pipeline must
   return greedy's tokens. Delayed messages (0.5 s) must change nothing but the time.
2. soak: `experiments.soak` on one pipeline (no hang, outputs identical to greedy, RSS growth
   per process under its bound).
3. resume: a tiny_k2 multirun (greedy, sd; 4 samples each) killed inside a run, between
   runs and inside the next run, a torn line added, resumed each time: every sample once.
4. bad input: each bad option or results directory through its command line; the error
   line each gives (exit code 2, no traceback, no results written).

Prints the figures for the README's "Reliability" section; exits 1 if any check fails.
About 3 minutes on 2 cores with the default soak.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

from analysis.rundir import RECORD_KEYS, read_records, read_summary
from experiments.hierarchies import load_hierarchy, tiny_model_dir
from experiments.hub import default_offline
from experiments.soak import WARMUP, soak
from experiments.tiny import build_tiny_hierarchy, random_prompts
from pipespec.errors import StageError
from pipespec.faults import FaultPlan
from pipespec.models import CausalLMRunner, load_model

# torch and the modules that import it (pipespec.api, pipespec.decoding) are imported where a model runs:
# importing this module stays cheap for its argument checks and the tests.

ROOT = Path(__file__).resolve().parent.parent
SEED = 9
STALL_S = 3
ERROR_WITHIN_S = 10
MAX_NEW = 16
PARTS = ("faults", "soak", "resume", "bad")


def processes_gone(pids, within_s: float = 5.0) -> bool:
    """Whether every pid has exited (zombies count as gone) within `within_s`; the tests use it too."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]:
            return True
        time.sleep(0.1)
    return False


# ---- 1. faults ------------------------------------------------------------------------------


def fault_cases() -> list[tuple[str, int, str, dict]]:
    """(group, k, strategy, fault) with seeded random points."""
    cases = []
    for k in (2, 3):
        for strategy in ("sd", "pipespec"):
            for stage in range(k):
                rng = random.Random(f"{SEED}-{k}-{strategy}-{stage}")
                action = rng.choice(["raise", "exit", "kill"])
                cases.append(("fail", k, strategy, {"stage": stage, "at_token": rng.randint(1, 2 * MAX_NEW // 3),
                                                    "action": action}))  # fmt: skip
    for strategy, stage in (("sd", 2), ("pipespec", 1), ("sd", 0)):
        at_token = random.Random(f"{SEED}-hang-{strategy}-{stage}").randint(1, MAX_NEW // 2)
        cases.append(("hang", 3, strategy, {"stage": stage, "at_token": at_token, "action": "hang"}))
    for k, strategy, stage, kind in ((3, "sd", 2, "commit"), (2, "pipespec", 1, "result"),
                                     (2, "pipespec", 1, "done"), (3, "pipespec", 1, "trace"),
                                     (2, "sd", 1, "commit")):  # fmt: skip
        nth = random.Random(f"{SEED}-drop-{k}-{kind}").randint(1, 2) if kind == "commit" else 1
        cases.append(("drop", k, strategy, {"stage": stage, "action": "drop", "message": kind, "nth": nth}))
    for k, strategy, fault in ((3, "pipespec", {"stage": 1, "message": "commit", "nth": 2, "count": 2}),
                               (2, "sd", {"stage": 0, "message": "drafts", "nth": 1}),
                               (3, "sd", {"stage": 2, "message": "result"}),
                               (2, "pipespec", {"stage": 0, "message": "drafts", "nth": 3, "count": 2})):  # fmt: skip
        cases.append(("delay", k, strategy, {**fault, "action": "delay", "delay_s": 0.5}))
    return cases


def run_faults(log) -> dict:
    import torch

    from pipespec.api import Pipeline
    from pipespec.decoding import greedy_generate

    specs = {2: load_hierarchy("tiny_k2"), 3: load_hierarchy("tiny_k3")}
    torch.set_num_threads(1)
    runner = CausalLMRunner(load_model(specs[2][-1]))
    prompts = []
    for prompt in random_prompts(20, length=10, seed=SEED):
        expected = greedy_generate(runner, prompt, MAX_NEW, [1])
        if len(expected) == MAX_NEW:  # the whole budget: room for every random point
            prompts.append((prompt, expected))
    (prompt, expected), (other, other_expected) = prompts[:2]
    pipes = {k: Pipeline(s, strategy="pipespec", stall_timeout_s=STALL_S) for k, s in specs.items()}
    groups: dict[str, dict] = {}
    failures = []
    try:
        for group, k, strategy, fault in fault_cases():
            pipe = pipes[k]
            if not pipe.started:
                pipe.start()
            pids = list(pipe.pids)
            stats = groups.setdefault(group, {"tried": 0, "ok": 0, "max_s": 0.0, "messages": []})
            stats["tried"] += 1
            label = f"k={k} {strategy} {json.dumps(fault)}"
            started = time.monotonic()
            try:
                result = pipe.generate(prompt, MAX_NEW, strategy=strategy, lookahead=2, faults=FaultPlan(**fault))
            except StageError as error:
                took = time.monotonic() - started
                message = str(error)
                stats["max_s"] = max(stats["max_s"], took)
                problems = []
                if group == "delay":
                    problems.append(f"a delay ended the call: {message}")
                if group in ("fail", "hang") and f"stage {fault['stage']}:" not in message:
                    problems.append(f"the error does not name stage {fault['stage']}: {message}")
                if took >= ERROR_WITHIN_S:
                    problems.append(f"the error took {took:.1f} s")
                if not processes_gone(pids):
                    problems.append("stage processes were left")
                if pipe.generate(other, MAX_NEW, strategy=strategy, lookahead=2).tokens != other_expected:
                    problems.append("the next call differs from greedy")
                stats["messages"].append(message)
            else:
                took = time.monotonic() - started
                problems = [] if group == "delay" else ["no error"]
                if result.tokens != expected:
                    problems.append("output differs from greedy")
            if problems:
                failures.append(f"{label}: {'; '.join(problems)}")
            else:
                stats["ok"] += 1
            log(f"  {group:<5} {label}: {'ok' if not problems else 'FAILED'} ({took:.2f} s)")
    finally:
        for pipe in pipes.values():
            pipe.close()
    return {"groups": groups, "failures": failures}


# ---- 3. resume ----------------------------------------------------------------------------------

SWEEP = ["-m", "models=tiny_k2", "strategy=greedy,sd", "strategy.lookahead=2", "dataset=news_lee_cnndm",
         "dataset.n_samples=4", "max_new_tokens=32", "run.progress=false", "run.gpu_monitor=false"]  # fmt: skip


def _runs(sweep: Path) -> list[Path]:
    return [next(iter(sweep.glob(f"{n}_*")), sweep / f"{n}_missing") for n in (0, 1)]


def _lines(run: Path) -> int:
    path = run / "samples.jsonl"
    return path.read_bytes().count(b"\n") if path.exists() else 0


def _whole_records(run: Path) -> list[dict]:
    """Newline-terminated lines of samples.jsonl, each a whole record (else the store is corrupt)."""
    path = run / "samples.jsonl"
    if not path.exists():
        return []
    records = [json.loads(line) for line in path.read_bytes().split(b"\n")[:-1]]
    if not all(all(key in r for key in RECORD_KEYS) for r in records):
        raise AssertionError(f"{path}: a record lacks fields")
    return records


def run_resume(log) -> dict:
    rng = random.Random(SEED)
    first, second = rng.randint(1, 3), rng.randint(1, 3)
    failures, points = [], []
    with tempfile.TemporaryDirectory(prefix="pipespec-reliability-") as tmp:
        sweep = Path(tmp) / "sweep"
        kill_points = [
            (f"inside run 0 after {first} samples", lambda: _lines(_runs(sweep)[0]) >= first),
            ("between runs 0 and 1", lambda: (_runs(sweep)[0] / "summary.json").exists()),
            (f"inside run 1 after {second} samples", lambda: _lines(_runs(sweep)[1]) >= second),
        ]
        for n, (where, kill_when) in enumerate(kill_points):
            args = [*SWEEP, f"hydra.sweep.dir={sweep}"] + (["run.resume=true"] if n else [])
            child = subprocess.Popen(
                [sys.executable, "-m", "experiments.run", *args],
                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
            deadline = time.monotonic() + 180
            while not kill_when() and child.poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)
            if child.poll() is not None:
                failures.append(f"the multirun ended before the kill point {where}")
                continue
            family = [child.pid] + [p.pid for p in psutil.Process(child.pid).children(recursive=True)]
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(10)
            if not processes_gone(family):
                failures.append(f"processes left after the kill {where}")
            state = ", ".join(f"run {i}: {_lines(run)} samples" for i, run in enumerate(_runs(sweep)))
            points.append(f"{where} ({state})")
            log(f"  killed {where}: {state}")
            for run in _runs(sweep):
                ids = [r["sample_id"] for r in _whole_records(run)]
                if len(ids) != len(set(ids)):
                    failures.append(f"a sample twice in {run.name} after the kill {where}")
            if n == 0:  # a line torn by the kill, naming a sample not yet done
                run0 = _runs(sweep)[0]
                with open(run0 / "samples.jsonl", "a") as handle:
                    handle.write(json.dumps({"sample_id": "lee-torn", "index": 3, "output_ids": [1, 2]})[:40])
                if read_records(run0)[1] != 1:
                    failures.append("a torn line was read as a record")
        final = subprocess.run([sys.executable, "-m", "experiments.run", *SWEEP, f"hydra.sweep.dir={sweep}",
                                "run.resume=true"], cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
        if final.returncode != 0:
            failures.append(f"the last resume failed: {final.stderr.strip().splitlines()[-1:]}")
        requested = 0
        for run in _runs(sweep):
            records, dropped = read_records(run)
            ids = [r["sample_id"] for r in records]
            requested += 4
            whole = _whole_records(run)
            if len(ids) != 4 or len(set(ids)) != 4 or dropped or len(whole) != 4:
                failures.append(f"{run.name}: {len(ids)} records ({len(set(ids))} distinct, {dropped} dropped lines)")
            elif not read_summary(run)["complete"]:
                failures.append(f"{run.name}: summary not complete")
        log(f"  resumed to the end: {', '.join(f'run {i}: {_lines(r)} samples' for i, r in enumerate(_runs(sweep)))}")
    return {"points": points, "samples": requested, "failures": failures}


# ---- 4. bad input -------------------------------------------------------------------------------

_TARGET = "{model:'tiny:target'}"
_DRAFT = "{model:'tiny:draft_noise0.05'}"
BAD_RUN_OPTIONS = [
    ("mismatched tokenizers", ["models.stages=[{model:OTHER_VOCAB},%s]" % _TARGET]),
    ("model path that does not exist", ["models.stages=[{model:/nonexistent/draft},{model:/nonexistent/target}]"]),
    ("unknown dtype", ["models.stages=[{model:'tiny:draft_noise0.05',dtype:float8},%s]" % _TARGET]),
    ("unknown device", ["models.stages=[%s,{model:'tiny:target',device:tpu}]" % _DRAFT]),
    ("device not present", ["models.stages=[%s,{model:'tiny:target',device:'cuda:99'}]" % _DRAFT]),
    ("prompt longer than the context", ["dataset.prompt.allow_truncation=false", "max_new_tokens=400"]),
    ("max_new_tokens <= 0", ["max_new_tokens=0"]),
    ("negative lookahead", ["strategy.lookahead=-1"]),
    ("fewer than 2 models for sd", ["models.stages=[%s]" % _TARGET, "strategy=sd"]),
    ("fewer than 2 models for pipespec", ["models.stages=[%s]" % _TARGET, "strategy=pipespec"]),
    ("missing dataset", ["dataset=xsum", "dataset.path=/nonexistent/xsum.jsonl"]),
    ("empty dataset", ["dataset=xsum", "dataset.path=EMPTY"]),
    ("unknown dataset field", ["dataset=xsum", "dataset.path=ONE_ROW", "dataset.source_field=body"]),
    ("config key that does not exist", ["max_new_token=4"]),
]  # fmt: skip


FIXTURE = ROOT / "tests" / "fixtures" / "results_tiny"
HYDRAS_OWN = "config key that does not exist"  # Hydra's own message: several lines and exit code 1, accepted as is


def _bad_input_files(tmp: Path) -> dict[str, str]:
    """The files the bad options name, made under `tmp`: placeholder -> path."""
    other_vocab = build_tiny_hierarchy(tmp / "vocab300", [], vocab_size=300)[0]
    (tmp / "empty.jsonl").write_text("")
    (tmp / "one.jsonl").write_text(json.dumps({"id": "1", "document": "A story.", "summary": "Story."}) + "\n")
    return {"OTHER_VOCAB": other_vocab, "EMPTY": str(tmp / "empty.jsonl"), "ONE_ROW": str(tmp / "one.jsonl")}


def _bad_run(tmp: Path, fill: dict[str, str], case: tuple[str, list[str]]) -> tuple:
    """One bad option through `experiments.run`: (name, finished process, results files it wrote, Hydra's own)."""
    name, overrides = case
    for key, value in fill.items():
        overrides = [o.replace(key, value) for o in overrides]
    run_dir = tmp / name.replace(" ", "_").replace("<=", "le")
    dataset = [] if any(o.startswith("dataset=") for o in overrides) else ["dataset=news_lee_cnndm"]
    args = ["models=tiny_k2", *dataset, "dataset.n_samples=1", "max_new_tokens=4", *overrides,
            "run.progress=false", f"hydra.run.dir={run_dir}"]  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "experiments.run", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    wrote = [f for f in ("samples.jsonl", "summary.json") if (run_dir / f).exists()]
    return name, done, wrote, name == HYDRAS_OWN


def _torn_summary(tmp: Path) -> Path:
    """A run whose summary.json a killed writer left half-written (made once)."""
    run = tmp / "torn"
    if not run.exists():
        shutil.copytree(FIXTURE / "1_sd_L2", run)
        text = (run / "summary.json").read_text()
        (run / "summary.json").write_text(text[: len(text) // 2])
    return run


def _foreign(tmp: Path) -> Path:
    """A folder that is no run directory."""
    (tmp / "foreign").mkdir(exist_ok=True)
    (tmp / "foreign" / "data.csv").write_text("a,b\n1,2\n")
    return tmp / "foreign"


def _broken_trace(tmp: Path) -> Path:
    """A run with a trace file that is not gzip JSON."""
    run = tmp / "broken"
    shutil.copytree(FIXTURE / "2_pipespec_L0", run)
    (run / "traces" / "00001.json.gz").write_bytes(b"\x1f\x8b truncated")
    return run


BAD_RESULTS = [
    ("collect: foreign directory", "experiments.collect", _foreign),
    ("collect: torn summary.json", "experiments.collect", _torn_summary),
    ("analysis: foreign directory", "analysis.report", _foreign),
    ("analysis: torn summary.json", "analysis.report", _torn_summary),
    ("analysis: corrupt trace", "analysis.report", _broken_trace),
]


def _bad_results(tmp: Path, case: tuple) -> tuple:
    """One bad results directory through its command: (name, finished process, no files, not Hydra's own)."""
    name, module, make = case
    bad = make(tmp)
    done = subprocess.run([sys.executable, "-m", module, str(bad), *(["--out", str(tmp / "report")]
                           if module == "analysis.report" else [])], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    return name, done, [], False


def _refusal_problems(done, errors: list[str], hydras_own: bool) -> list[str]:
    """How a command failed to refuse bad input cleanly (empty: it did)."""
    problems = []
    if hydras_own:
        if done.returncode == 0 or "Traceback" in done.stderr:
            problems.append("not refused cleanly")
        return problems
    if done.returncode != 2:
        problems.append(f"exit code {done.returncode}")
    if len(errors) != 1 or not errors[0].startswith("error: "):
        problems.append("not exactly one 'error: ' line")
    if "Traceback" in done.stderr:
        problems.append("a traceback")
    return problems


def _judge(outcome: tuple) -> tuple[str, str, list[str]]:
    """(name, the line the command said, problems) of one bad-input outcome."""
    name, done, wrote, hydras_own = outcome
    errors = [line for line in done.stderr.splitlines() if line.startswith("error")]
    first = errors[0] if errors else (done.stderr.strip().splitlines() or ["(nothing)"])[0]
    if hydras_own:
        said = [line for line in done.stderr.splitlines()
                if "max_new_token" in line and "+" not in line and not line[:1].isspace()]  # fmt: skip
        first = " ".join(said) or first
    problems = _refusal_problems(done, errors, hydras_own)
    if wrote:
        problems.append(f"wrote {', '.join(wrote)}")
    return name, first, problems


def run_bad_inputs(log) -> dict:
    tiny_model_dir("target")  # built once, before several processes want it
    failures, lines = [], []
    with tempfile.TemporaryDirectory(prefix="pipespec-reliability-") as tmp:
        tmp = Path(tmp)
        fill = _bad_input_files(tmp)
        with ThreadPoolExecutor(3) as pool:
            outcomes = list(pool.map(lambda case: _bad_run(tmp, fill, case), BAD_RUN_OPTIONS))
        outcomes += [_bad_results(tmp, case) for case in BAD_RESULTS]
        for outcome in outcomes:
            name, first, problems = _judge(outcome)
            first = first.replace(str(tmp), "TMP")
            lines.append((name, first, problems))
            if problems:
                failures.append(f"{name}: {'; '.join(problems)}")
            log(f"  {name}: {first}{'  FAILED: ' + '; '.join(problems) if problems else ''}")
    return {"lines": lines, "failures": failures}


# ---- the report --------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    default_offline()  # offline unless the user set HF_HUB_OFFLINE & co. or the run names a hub id
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--soak-generations", type=int, default=100)
    parser.add_argument("--only", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    parser.add_argument("--verbose", action="store_true", help="one line per case as it runs")
    args = parser.parse_args(argv)
    parts = [p for p in args.only.split(",") if p]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        print(f"error: --only takes {','.join(PARTS)}, got {','.join(unknown)}", file=sys.stderr)
        return 2

    # the stage processes print their own report of every injected fault (a traceback) to stderr:
    # keep those in a file, and this command's output readable
    console = os.fdopen(os.dup(2), "w", buffering=1)
    stage_log = tempfile.NamedTemporaryFile(prefix="pipespec-reliability-stages-", suffix=".log", delete=False)
    os.dup2(stage_log.fileno(), 2)
    code = 1
    try:
        code = _run(args, parts, console, stage_log.name)
        return code
    finally:
        os.dup2(console.fileno(), 2)
        if code == 0:
            os.unlink(stage_log.name)


def _run(args, parts: list[str], console, stage_log: str) -> int:
    def log(line: str) -> None:
        if args.verbose:
            print(line, file=console, flush=True)

    started = time.monotonic()
    failures: list[str] = []
    out: list[str] = []
    if "faults" in parts:
        faults = run_faults(log)
        failures += faults["failures"]
        groups = faults["groups"]
        raised = [g for name, g in groups.items() if name != "delay"]
        tried, ok = sum(g["tried"] for g in raised), sum(g["ok"] for g in raised)
        worst = max(g["max_s"] for g in raised)
        out.append(f"faults: {tried} injected, {ok} survived (StageError naming the stage, no stage process left, "
                   f"next call on the same pipeline identical to greedy); max time to error {worst:.1f} s "
                   f"(stall_timeout_s {STALL_S})")  # fmt: skip
        titles = {
            "fail": "raise / exit / SIGKILL at a random point (k=2,3; sd, pipespec; every stage)",
            "hang": "a stage stops responding",
            "drop": "a control message lost (commit, result, done, trace)",
        }
        for name, title in titles.items():
            g = groups.get(name)
            if g:
                out.append(f"  {title}: {g['ok']}/{g['tried']}, max {g['max_s']:.1f} s")
        if "delay" in groups:
            g = groups["delay"]
            out.append(f"  a control message delayed 0.5 s: {g['ok']}/{g['tried']} outputs identical to greedy")
    if "soak" in parts:
        with contextlib.redirect_stdout(console if args.verbose else io.StringIO()):  # its progress lines
            report = soak("tiny_k3", args.soak_generations, 24, 50.0, 30.0)
        failures += report["failures"]
        growth = ", ".join(f"{name} {mb:+.1f}" for name, mb in report["growth_mb"].items())
        out.append(f"soak: {report['generations']} generations on tiny_k3 in {report['seconds']:.0f} s, "
                   f"{'no hang, every output identical to greedy' if not report['failures'] else 'FAILED'}; "
                   f"RSS growth after {WARMUP} warm-up generations (MB): {growth} (bound 50 MB)")  # fmt: skip
    if "resume" in parts:
        resume = run_resume(log)
        failures += resume["failures"]
        out.append(f"resume: a 2-run multirun killed at {len(resume['points'])} points and resumed each time, plus a "
                   f"torn line: {resume['samples']} samples requested, "
                   f"{'each held exactly once, none lost' if not resume['failures'] else 'FAILED'}")  # fmt: skip
        out += [f"  killed {p}" for p in resume["points"]]
    if "bad" in parts:
        bad = run_bad_inputs(log)
        failures += bad["failures"]
        ok = sum(not problems for _, _, problems in bad["lines"])
        out.append(f"bad input: {len(bad['lines'])} tried, {ok} refused with one line, exit code 2, no traceback, "
                   f"no results written (an unknown config key: Hydra's own message)")  # fmt: skip
        out += [f"  {name}: {line}" for name, line, _ in bad["lines"]]
    out.append(f"({time.monotonic() - started:.0f} s)")
    print("\n".join(out))
    for failure in failures:
        print(f"FAILED: {failure}")
    if failures:
        print(f"(what the stage processes printed: {stage_log})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
