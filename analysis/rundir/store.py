"""Writing and reading a run directory. A record is appended only after its trace file is in place, and a
line that is not complete JSON (a run killed while writing it) is dropped when the run is resumed
(`RunStore`), so a resumed run holds each requested sample exactly once; summary.json is rewritten
atomically under its lock (`summary_lock`). This is the only reader of these files: every reader raises
`ResultsError`, one line naming the file or directory. A finished sweep's traces may be packed into one
archive per sweep: `read_trace` and `has_trace` find them there too (`analysis.rundir.packed`).
docs/experiments.md, docs/analysis.md.
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
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import yaml

from analysis.rundir.errors import ResultsError
from analysis.rundir.packed import archives_of, has_packed_trace, packed_trace


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


#


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
    """Where a run writes sample `index`'s trace; a finished sweep's may be packed instead (`has_trace`)."""
    return Path(run_dir) / TRACES / f"{int(index):05d}.json.gz"


def has_trace(run_dir: Path, index: int) -> bool:
    """Whether sample `index` has a trace: its loose file, or a member of the run's or its sweep's archive
    (`analysis.rundir.packed`)."""
    return trace_path(run_dir, index).exists() or has_packed_trace(run_dir, index)


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
    """traces/NNNNN.json.gz of sample `index`: {"sample_id", "index", "stages": [StageTrace.to_dict(), ...]}; where
    there is no such file, the member of an archive the run's traces were packed into (`analysis.rundir.packed`)."""
    path = trace_path(run_dir, index)
    if not path.exists():
        packed = packed_trace(run_dir, index)
        if packed is not None:
            return _checked_trace(*packed, gzipped=False)
        archives = archives_of(run_dir)
        if archives:
            raise ResultsError(f"{path}: missing (and not in {', '.join(str(a) for a, _ in archives)})")
    return _checked_trace(str(path), _read_bytes(path), gzipped=True)


def _checked_trace(where: str, data: bytes, gzipped: bool) -> dict:
    try:
        trace = json.loads(gzip.decompress(data) if gzipped else data)
    except (OSError, EOFError, zlib.error, UnicodeDecodeError, json.JSONDecodeError):
        raise ResultsError(f"{where}: corrupt trace (not {'gzip ' if gzipped else ''}JSON)") from None
    stages = trace.get("stages") if isinstance(trace, dict) else None
    if not isinstance(stages, list) or not stages:
        raise ResultsError(f"{where}: trace without a 'stages' list")
    return trace


def _run_file(run_dir: Path, name: str, what: str) -> tuple[Path, dict]:
    """The path and mapping of a run directory's `name` (CONFIG, SUMMARY); a `ResultsError` where it has none."""
    path = Path(run_dir) / name
    if not path.exists():
        raise ResultsError(f"{run_dir}: not a pipespec run directory (no {name})")
    return path, _read_mapping(path, what)


def read_config(run_dir: Path) -> dict:
    path, config = _run_file(run_dir, CONFIG, "YAML")
    missing = [key for key in CONFIG_KEYS if not isinstance(config.get(key), dict)]
    if missing:
        raise ResultsError(f"{path}: not a pipespec run config (needs {', '.join(missing)})")
    return config


def read_summary(run_dir: Path) -> dict:
    path, summary = _run_file(run_dir, SUMMARY, "JSON")
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
