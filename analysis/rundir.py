"""The results store: one directory per run, written atomically, resumable, readable without torch.

A run directory holds

    config.yaml          the resolved configuration of the run
    env.json             library versions, CPU / GPU names, thread counts
    samples.jsonl        one record per finished sample (see RECORD_KEYS), appended and fsynced
    traces/NNNNN.json.gz the full stage traces of sample NNNNN (pipespec.trace format)
    summary.json         pooled figures of the run (see `summarize_run`), rewritten atomically
    gpu.csv              NVML samples of the driver's machine every 100 ms (GPU machines only)

A record is appended only after its trace file is in place, and a line that is
not complete JSON (a run killed while writing it) is dropped when the run is
resumed, so a resumed run holds each requested sample exactly once.

The greedy reference of a run is a run of strategy greedy with the same target
model, dataset and token budget: named by `reference_run`, or found among the
sibling runs of the same multirun. Everything here is pure Python (no torch),
so `analysis/` and `experiments.collect` use it on result files alone.

This module is the only reader of these files: `read_summary`, `read_config`,
`read_env`, `read_records`, `read_trace` and `find_run_dirs` validate them and
raise `ResultsError` (one line naming the file or directory) for anything
missing, corrupt or foreign; `analysis.runs` builds its `Run` objects on them.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import gzip
import json
import math
import os
import re
import tempfile
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import yaml

from pipespec.gpu import pool_gpu_figures

from pipespec.stats import StageStats, pool, ratio

SAMPLES = "samples.jsonl"
SUMMARY = "summary.json"
CONFIG = "config.yaml"
ENV = "env.json"
TRACES = "traces"
SUMMARY_LOCK = ".summary.lock"  # held by every writer of summary.json (`summary_lock`)
RECORD_KEYS = ("sample_id", "index", "output_ids", "output_text", "new_tokens", "time_s", "stages")
CONFIG_KEYS = ("models", "strategy", "dataset")
# what summarize_run always writes and the readers (collect, analysis) rely on
SUMMARY_KEYS = (
    "strategy", "models", "dataset", "n_samples", "new_tokens", "total_time_s", "ms_per_token", "tokens_per_s",
    "stages",
)  # fmt: skip
MAX_SEARCH_DEPTH = 4  # multirun folders nest run dirs one or two levels deep; do not crawl whole disks


_UMASK = os.umask(0)
os.umask(_UMASK)


class ResultsError(ValueError):
    """A results directory is missing, corrupt, foreign or inconsistent; the message names it."""


# ---- atomic files -------------------------------------------------------------


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary file beside `path`, fsync, then rename: readers see old or new, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp creates 0600; results are ordinary files
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


# errno of a file system without advisory locks (some cluster mounts): the write goes on unlocked
_NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


@contextlib.contextmanager
def summary_lock(run_dir: Path) -> Iterator[None]:
    """The run's summary lock (an exclusive `flock` on `SUMMARY_LOCK` in the run directory), held while
    summary.json is written or read, updated and rewritten: jobs of one sweep that finish at once (a run
    and the greedy sibling that refreshes it) never lose each other's update. Readers need no lock:
    every write is atomic."""
    with open(Path(run_dir) / SUMMARY_LOCK, "a") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        except OSError as error:
            if error.errno not in _NO_LOCKS:
                raise
        yield  # closing the file releases the lock


# ---- reading a run directory ----------------------------------------------------
#
# Every reader below raises ResultsError with a one-line message naming the file or
# directory; `analysis.runs` reads run directories through these functions only.


def _reason(error: BaseException) -> str:
    text = str(getattr(error, "strerror", None) or error)
    return text.splitlines()[0] if text else type(error).__name__


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise ResultsError(f"{path}: missing") from None
    except OSError as error:
        raise ResultsError(f"{path}: cannot read ({_reason(error)})") from None


def _read_mapping(path: Path, what: str) -> dict:
    """A JSON or YAML file (`what`) that must hold a mapping."""
    try:
        text = _read_bytes(path).decode("utf-8")
        data = json.loads(text) if what == "JSON" else yaml.safe_load(text)
    except UnicodeDecodeError:
        raise ResultsError(f"{path}: corrupt {what} (not UTF-8 text)") from None
    except json.JSONDecodeError as error:
        raise ResultsError(f"{path}: corrupt JSON (line {error.lineno}: {error.msg})") from None
    except yaml.YAMLError as error:
        raise ResultsError(f"{path}: corrupt YAML ({_reason(error)})") from None
    if not isinstance(data, dict):
        raise ResultsError(f"{path}: not a mapping")
    return data


def _valid_record(line: bytes) -> dict | None:
    try:
        record = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(record, dict) or any(key not in record for key in RECORD_KEYS):
        return None
    # the fields readers compute with: a hashable id, counts, a time, per-stage figures
    counts = all(_is_number(record[key], int) and record[key] >= 0 for key in ("index", "new_tokens"))
    typed = isinstance(record["sample_id"], (str, int)) and isinstance(record["stages"], list)
    return record if counts and typed and _is_number(record["time_s"], (int, float)) else None


def _is_number(value: Any, types: type | tuple) -> bool:
    return isinstance(value, types) and not isinstance(value, bool)


def read_records(run_dir: Path) -> tuple[list[dict], int]:
    """The valid sample records of a run (first occurrence of each id) and how many lines were dropped.

    A line that is not a complete record (half-written by a killed run, not UTF-8,
    lacking a RECORD_KEYS field) or repeats an earlier sample id is dropped: the
    rule of a resumable store, and the one every reader of samples.jsonl follows.
    No samples.jsonl means no records yet.
    """
    path = Path(run_dir) / SAMPLES
    if not path.exists():
        return [], 0
    records, seen, dropped = [], set(), 0
    for line in _read_bytes(path).splitlines():
        if not line.strip():
            continue
        record = _valid_record(line)
        if record is None or record["sample_id"] in seen:
            dropped += 1
            continue
        seen.add(record["sample_id"])
        records.append(record)
    return records, dropped


def trace_path(run_dir: Path, index: int) -> Path:
    return Path(run_dir) / TRACES / f"{int(index):05d}.json.gz"


class RunStore:
    """Writes one run directory; on resume, keeps the finished samples and drops a half-written line."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.records, dropped = read_records(self.run_dir)
        if dropped:
            # rewrite without the broken tail so the next append starts on a clean line
            atomic_write_text(self.run_dir / SAMPLES, "".join(json.dumps(r) + "\n" for r in self.records))
        self.dropped_lines = dropped

    @property
    def finished_ids(self) -> set[str]:
        return {r["sample_id"] for r in self.records}

    def write_config(self, config: Mapping[str, Any]) -> None:
        atomic_write_text(self.run_dir / CONFIG, yaml.safe_dump(dict(config), sort_keys=False))

    def write_env(self, env: Mapping[str, Any]) -> None:
        """The environment (machine, libraries) the run's samples are measured in. A run that holds samples
        keeps the environment they were measured in: a resume that adds samples lists its own under
        `resumed`, with how many samples it found (`samples_before`), so the machine behind every sample
        stays on record. (A resume that adds nothing calls nothing here.)"""
        path = self.run_dir / ENV
        if not self.records or not path.is_file():
            atomic_write_json(path, dict(env))
            return
        first = read_env(self.run_dir)
        resumed = [*first.get("resumed", []), {"samples_before": len(self.records), **dict(env)}]
        atomic_write_json(path, {**first, "resumed": resumed})

    def append(self, record: dict, trace: dict) -> None:
        """The trace first (atomically), then the record line, fsynced: a listed sample always has its trace."""
        missing = [key for key in RECORD_KEYS if key not in record]
        if missing:
            raise ValueError(f"sample record lacks {missing}")
        atomic_write_bytes(
            trace_path(self.run_dir, record["index"]), gzip.compress(json.dumps(trace).encode(), compresslevel=6)
        )
        with open(self.run_dir / SAMPLES, "a") as handle:
            handle.write(json.dumps(record) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        self.records.append(record)

    def write_summary(self, summary: Mapping[str, Any]) -> None:
        with summary_lock(self.run_dir):
            atomic_write_json(self.run_dir / SUMMARY, dict(summary))


def read_trace(run_dir: Path, index: int) -> dict:
    """traces/NNNNN.json.gz of sample `index`: {"sample_id", "index", "stages": [StageTrace.to_dict(), ...]}."""
    path = trace_path(run_dir, index)
    data = _read_bytes(path)
    try:
        trace = json.loads(gzip.decompress(data))
    except (OSError, EOFError, zlib.error, UnicodeDecodeError, json.JSONDecodeError):
        raise ResultsError(f"{path}: corrupt trace (not gzip JSON)") from None
    stages = trace.get("stages") if isinstance(trace, dict) else None
    if not isinstance(stages, list) or not stages:
        raise ResultsError(f"{path}: trace without a 'stages' list")
    return trace


def read_config(run_dir: Path) -> dict:
    path = Path(run_dir) / CONFIG
    if not path.exists():
        raise ResultsError(f"{run_dir}: not a pipespec run directory (no {CONFIG})")
    config = _read_mapping(path, "YAML")
    missing = [key for key in CONFIG_KEYS if not isinstance(config.get(key), dict)]
    if missing:
        raise ResultsError(f"{path}: not a pipespec run config (needs {', '.join(missing)})")
    return config


def read_summary(run_dir: Path) -> dict:
    path = Path(run_dir) / SUMMARY
    if not path.exists():
        raise ResultsError(f"{run_dir}: not a pipespec run directory (no {SUMMARY})")
    summary = _read_mapping(path, "JSON")
    missing = [key for key in SUMMARY_KEYS if key not in summary]
    if missing:
        raise ResultsError(f"{path}: not a pipespec run summary (missing {', '.join(missing)})")
    if not isinstance(summary["stages"], list):
        raise ResultsError(f"{path}: stages is not a list")
    rate = summary["tokens_per_s"]  # None: a run without any generation time (see summarize_run)
    if rate is not None and not (_is_number(rate, (int, float)) and math.isfinite(rate) and rate >= 0):
        raise ResultsError(f"{path}: tokens_per_s must be a number >= 0 or null, got {rate!r}")
    return summary


def read_env(run_dir: Path) -> dict:
    """env.json (library versions, machine); {} where the run has none."""
    path = Path(run_dir) / ENV
    return _read_mapping(path, "JSON") if path.is_file() else {}


def is_run_dir(path: str | Path) -> bool:
    """A finished or summarised run: a directory holding summary.json."""
    return (Path(path) / SUMMARY).is_file()


def _run_dirs_below(directory: Path, depth: int) -> list[Path]:
    if is_run_dir(directory):
        return [directory]
    if depth <= 0:
        return []
    try:
        children = [c for c in directory.iterdir() if c.is_dir() and not c.name.startswith(".")]
    except OSError as error:
        raise ResultsError(f"{directory}: cannot read ({_reason(error)})") from None
    return [run for child in sorted(children, key=_natural_key) for run in _run_dirs_below(child, depth - 1)]


def find_run_dirs(paths: Iterable[str | Path] | str | Path) -> list[Path]:
    """Run directories named directly, or found below the given directories (e.g. a multirun).

    A directory named directly counts if it holds summary.json or config.yaml (a run
    killed before its summary); below it, directories holding summary.json are
    searched for, MAX_SEARCH_DEPTH levels deep, skipping hidden ones (.hydra).
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    found: list[Path] = []
    for path in map(Path, paths):
        if not path.exists():
            raise ResultsError(f"{path}: no such directory")
        if not path.is_dir():
            raise ResultsError(f"{path}: not a directory")
        if (path / SUMMARY).exists() or (path / CONFIG).exists():
            found.append(path)
            continue
        below = _run_dirs_below(path, MAX_SEARCH_DEPTH)
        if not below:
            raise ResultsError(f"{path}: not a pipespec run directory (no {SUMMARY} here or below)")
        found.extend(below)
    return found


def _natural_key(path: Path) -> tuple:
    # '10' after '9': numbered multirun subdirectories sort numerically
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(path)))


# ---- summaries ----------------------------------------------------------------


def stage_stats(record: Mapping[str, Any]) -> list[StageStats]:
    """Per-stage statistics of one sample record (records of earlier versions included)."""
    return [replace(StageStats.from_dict(s), output_tokens=record["new_tokens"]) for s in record["stages"]]


def pool_stages(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per-stage figures pooled over samples (sums of counts and times, not means of ratios)."""
    if not records:
        return []
    by_name: dict[str, list[StageStats]] = {}  # a sample may run a subset of the stages (auto that learns)
    for record in records:
        for stage, stats in zip(record["stages"], stage_stats(record)):
            by_name.setdefault(stage["name"], []).append(stats)
    return [pool(stats).as_dict(name) for name, stats in by_name.items()]


def summarize_run(config: Mapping[str, Any], records: Sequence[Mapping[str, Any]], complete: bool) -> dict[str, Any]:
    """summary.json: the run's pooled figures (ms/token = sum of time / sum of tokens, as in the paper)."""
    tokens = sum(r["new_tokens"] for r in records)
    total_time = sum(r["time_s"] for r in records)
    models, strategy, dataset = config["models"], config["strategy"], config["dataset"]
    stages = pool_stages(records)
    return {
        "strategy": strategy["name"],
        "models": models["name"],
        "stage_names": [s["name"] for s in stages],
        "dataset": dataset["name"],
        "dataset_label": dataset.get("label", dataset["name"]),
        "stand_in": bool(dataset.get("stand_in", False)),
        "n_samples": len(records),
        "new_tokens": tokens,
        "max_new_tokens": config["max_new_tokens"],
        "lookahead": strategy.get("lookahead"),
        "max_lead": strategy.get("max_lead"),
        "draft_confidence": strategy.get("draft_confidence", 0.0),
        "size_verification": strategy.get("size_verification", False),
        "cascade": strategy.get("cascade", False),
        "value_stop": strategy.get("value_stop", 0.0),
        "acceptance": acceptance_mode(config),
        "lossless": acceptance_mode(config) == "exact",
        "sampling": config.get("sampling"),
        "synthetic_rate": (config.get("acceptance") or {}).get("rate") if acceptance_mode(config) != "exact" else None,
        "total_time_s": total_time,
        "ms_per_token": ratio(1000 * total_time, tokens),
        "tokens_per_s": ratio(tokens, total_time),
        "truncated_prompts": sum(bool(r.get("truncated")) for r in records),
        "stages": stages,
        "quality": pool_quality(records),
        "gpu": pool_gpu_figures(records),  # per GPU: utilisation, peak memory, power, energy per token; None on CPU
        "identical_to_greedy": None,
        "identity": None,  # identical / near_tie / unexplained against the greedy reference (`classify_identity`)
        "speedup_vs_greedy": None,
        "reference_run": None,
        "complete": complete,
    }


def pool_quality(records: Sequence[Mapping[str, Any]]) -> dict[str, float] | None:
    """Mean of each per-sample quality figure (ROUGE F1, passed) over the samples that have it."""
    values: dict[str, list[float]] = {}
    for record in records:
        for key, value in (record.get("quality") or {}).items():
            if isinstance(value, (int, float)):
                values.setdefault(key, []).append(float(value))
    return {key: sum(v) / len(v) for key, v in values.items()} or None


# ---- greedy references ----------------------------------------------------------


def target_key(config: Mapping[str, Any]) -> tuple:
    """What makes two runs' outputs comparable: the target model, the dataset and the budget."""
    target = dict(config["models"]["stages"][-1])
    target.pop("name", None)
    dataset = config["dataset"]
    return (
        json.dumps(target, sort_keys=True),
        dataset["name"],
        json.dumps(dataset.get("path")),
        config["max_new_tokens"],
        _sampling_key(config.get("sampling")),
    )


def _sampling_key(sampling: Mapping[str, Any] | None) -> str:
    """Temperature 0 (or no sampling section) is greedy whatever top-k / top-p / seed say."""
    sampling = sampling or {}
    if not sampling.get("temperature"):
        return "greedy"
    return json.dumps({k: sampling.get(k) for k in ("temperature", "top_k", "top_p")}, sort_keys=True)


def acceptance_mode(config: Mapping[str, Any]) -> str:
    return (config.get("acceptance") or {}).get("mode", "exact")


def is_greedy_reference(config: Mapping[str, Any]) -> bool:
    return config["strategy"]["name"] == "greedy" and acceptance_mode(config) == "exact"


def pick_reference(run_dir: Path, config: Mapping[str, Any], candidates: Iterable[tuple[Path, Mapping[str, Any]]]):
    """The one greedy-reference rule: among `candidates` ((directory, config) pairs), a lossless greedy run
    with this run's `target_key` (target model, dataset, budget, decoding), the one in the same folder (the
    same sweep) first, then one of the same hierarchy; None if there is none. Returns the (directory,
    config) pair chosen; a greedy run among them is its own reference."""
    run_dir = Path(run_dir)
    key, hierarchy = target_key(config), config["models"].get("name")
    matching = [(d, c) for d, c in candidates if is_greedy_reference(c) and target_key(c) == key]
    matching.sort(key=lambda pair: (Path(pair[0]).parent != run_dir.parent, pair[1]["models"].get("name") != hierarchy))
    return matching[0] if matching else None


def find_greedy_reference(run_dir: Path, config: Mapping[str, Any], reference_run: str | None) -> Path | None:
    """`reference_run` if given (checked to match), else a matching finished greedy sibling in the same
    multirun (one with its summary.json: a sibling still running is not a reference yet)."""
    run_dir = Path(run_dir)
    if reference_run:
        reference = Path(reference_run)
        ref_config = read_config(reference)
        if not is_greedy_reference(ref_config):
            raise ResultsError(f"reference_run {reference} is a {ref_config['strategy']['name']!r} run, not greedy")
        if target_key(ref_config) != target_key(config):
            raise ResultsError(
                f"reference_run {reference} is not comparable: it differs in target model, dataset or max_new_tokens"
            )
        return reference
    if is_greedy_reference(config):
        return None
    found = pick_reference(run_dir, config, _readable_configs(_finished_siblings(run_dir)))
    return found[0] if found else None


def _finished_siblings(run_dir: Path) -> list[Path]:
    """The other finished runs (holding summary.json) in the directory of `run_dir`, in natural order."""
    run_dir = Path(run_dir)
    return [d for d in sorted(run_dir.parent.iterdir(), key=_natural_key) if d != run_dir and is_run_dir(d)]


def _readable_configs(directories: Iterable[Path]) -> Iterator[tuple[Path, dict]]:
    """(directory, config) of each directory holding a readable run config; the others are skipped."""
    for directory in directories:
        if (directory / CONFIG).exists():
            try:
                yield directory, read_config(directory)
            except ResultsError:
                continue


def compare_with_reference(records: Sequence[Mapping], reference_records: Sequence[Mapping]) -> dict[str, Any]:
    """identical_to_greedy "n/m" and speedup (greedy ms/token / this ms/token) over the samples both hold."""
    by_id = {r["sample_id"]: r for r in reference_records}
    common = [r for r in records if r["sample_id"] in by_id]
    if not common:
        return {"identical_to_greedy": None, "speedup_vs_greedy": None}
    identical = sum(r["output_ids"] == by_id[r["sample_id"]]["output_ids"] for r in common)
    mine = ratio(sum(r["time_s"] for r in common), sum(r["new_tokens"] for r in common))
    theirs = ratio(
        sum(by_id[r["sample_id"]]["time_s"] for r in common), sum(by_id[r["sample_id"]]["new_tokens"] for r in common)
    )
    return {
        "identical_to_greedy": f"{identical}/{len(common)}",
        "speedup_vs_greedy": ratio(theirs, mine) if mine and theirs else None,
    }


# ---- identity classes ------------------------------------------------------------------
#
# On a GPU, verifying n tokens in fp16 runs other kernels than a one-token step: the
# logits differ in the last bits, and an argmax flips where the two largest logits nearly
# tie. A mismatch with greedy is then numerical, not a bug. The target records the top-2
# margin of the row that decided each token it emits (`target_margins` of a record); a
# mismatch whose margin at the first diverging position is below the near-tie threshold
# (in both runs, where both recorded it) is "near_tie", any other "unexplained".

DTYPE_EPS = {"float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}  # machine epsilon (ulp at 1.0)
NEAR_TIE_EPS_UNITS = 4  # ulps: a few roundings' worth of disagreement between two kernels
LOGIT_SCALE = 32.0  # |top logit| of LLaMA-class models stays below ~32: the ulp there bounds the noise


def near_tie_threshold(dtype: str, eps_units: float = NEAR_TIE_EPS_UNITS, logit_scale: float = LOGIT_SCALE) -> float:
    """The top-2 margin below which a flip is numerical noise: `eps_units` ulps of a logit of size
    `logit_scale` in `dtype` (float16: 4 x 2^-10 x 32 = 0.125; bfloat16: 1.0; float32: 1.5e-5)."""
    if dtype not in DTYPE_EPS:
        raise ValueError(f"no near-tie threshold for dtype {dtype!r}; expected one of {sorted(DTYPE_EPS)}")
    return eps_units * DTYPE_EPS[dtype] * logit_scale


def run_near_tie_threshold(config: Mapping[str, Any]) -> float:
    """`run.near_tie_margin` if set, else the threshold of the target's dtype."""
    explicit = (config.get("run") or {}).get("near_tie_margin")
    if explicit is not None:
        return float(explicit)
    return near_tie_threshold(config["models"]["stages"][-1].get("dtype", "float32"))


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first position where two outputs differ (a prefix differs at the shorter's end); None if equal."""
    for position, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return position
    return None if len(a) == len(b) else min(len(a), len(b))


def _margin_at(record: Mapping[str, Any], position: int) -> float | None:
    margins = record.get("target_margins")
    return float(margins[position]) if isinstance(margins, list) and position < len(margins) else None


def classify_mismatch(record: Mapping, reference: Mapping, threshold: float) -> dict[str, Any] | None:
    """None for identical outputs; else where they diverge, both margins there, and the class."""
    position = first_divergence(record["output_ids"], reference["output_ids"])
    if position is None:
        return None
    margin, reference_margin = _margin_at(record, position), _margin_at(reference, position)
    known = [m for m in (margin, reference_margin) if m is not None]
    near = margin is not None and all(m < threshold for m in known)  # old records without margins: unexplained
    tokens, ref_tokens = record["output_ids"], reference["output_ids"]
    return {
        "sample_id": record["sample_id"],
        "position": position,
        "margin": margin,
        "reference_margin": reference_margin,
        "token": tokens[position] if position < len(tokens) else None,
        "reference_token": ref_tokens[position] if position < len(ref_tokens) else None,
        "class": "near_tie" if near else "unexplained",
    }


def classify_identity(
    records: Sequence[Mapping], reference_records: Sequence[Mapping], threshold: float
) -> dict[str, Any] | None:
    """identical / near_tie / unexplained counts over the samples both runs hold, and every mismatch."""
    by_id = {r["sample_id"]: r for r in reference_records}
    common = [r for r in records if r["sample_id"] in by_id]
    if not common:
        return None
    mismatches = [m for r in common if (m := classify_mismatch(r, by_id[r["sample_id"]], threshold)) is not None]
    near = sum(m["class"] == "near_tie" for m in mismatches)
    return {
        "identical": len(common) - len(mismatches),
        "near_tie": near,
        "unexplained": len(mismatches) - near,
        "near_tie_threshold": threshold,
        "mismatches": mismatches,
    }


def refresh_reference(run_dir: Path, reference_run: str | None = None) -> dict | None:
    """Fill summary.json's identical_to_greedy, identity and speedup_vs_greedy from its greedy reference.

    The reference is `reference_run`, else the run's own `run.reference_run` option, else the preferred
    finished greedy sibling (`pick_reference`), chosen anew on every call. A greedy run without an explicit
    reference refreshes instead its finished comparable siblings: a greedy run that finishes after them
    (jobs of a sweep run in any order on a cluster) still ends up as their reference. Returns the run's
    summary."""
    run_dir = Path(run_dir)
    config = read_config(run_dir)
    explicit = reference_run or (config.get("run") or {}).get("reference_run")
    if explicit or not is_greedy_reference(config):
        return _refresh_one(run_dir, explicit)
    key = target_key(config)
    for sibling, sibling_config in _readable_configs(_finished_siblings(run_dir)):
        if not is_greedy_reference(sibling_config) and target_key(sibling_config) == key:
            try:
                refresh_reference(sibling)
            except ResultsError:
                continue  # a broken sibling is reported when it is collected, not by this run
    return read_summary(run_dir)


def _refresh_one(run_dir: Path, reference_run: str | None) -> dict:
    """refresh_reference of one run: read, compare and rewrite its summary under its summary lock."""
    with summary_lock(run_dir):
        summary, config = read_summary(run_dir), read_config(run_dir)
        reference = find_greedy_reference(run_dir, config, reference_run)
        if reference is None:
            return summary
        records, _ = read_records(run_dir)
        reference_records, _ = read_records(reference)
        summary.update(compare_with_reference(records, reference_records))
        summary["identity"] = classify_identity(records, reference_records, run_near_tie_threshold(config))
        if (config.get("sampling") or {}).get("temperature", 0):
            summary["identical_to_greedy"] = None  # sampled outputs are equal in distribution, not token by token
            summary["identity"] = None
        summary["reference_run"] = str(reference)
        atomic_write_json(run_dir / SUMMARY, summary)
        return summary
