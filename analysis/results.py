"""Reader of run directories written by ``python -m experiments.run`` (no torch).

A run directory holds::

    config.yaml          resolved Hydra config (models.name, models.stages, strategy.name,
                         strategy.lookahead, strategy.max_lead, dataset.name, max_new_tokens)
    env.json             machine and library versions
    samples.jsonl        one JSON object per sample (sample_id, index, new_tokens, time_s, stages, ...)
    traces/NNNNN.json.gz {"sample_id", "index", "stages": [StageTrace.to_dict(), ...]} per sample
    summary.json         pooled figures (strategy, models, tokens_per_s, ms_per_token, stages, ...)

A multirun directory holds run directories (``0/``, ``1/``, ...), possibly nested.
``load_run`` reads one run directory; samples and traces are read lazily, on first
use. ``find_runs`` accepts run directories and directories that contain them.
Every problem (missing folder, missing or corrupt file, a foreign directory) is a
``ResultsError`` whose message is one line naming the path.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from pipespec.trace import StageTrace

__all__ = ["ResultsError", "Run", "is_run_dir", "load_run", "find_runs"]

SUMMARY_KEYS = ("strategy", "models", "n_samples", "new_tokens", "total_time_s", "tokens_per_s")
MAX_SEARCH_DEPTH = 4  # multirun folders nest run dirs one or two levels deep; do not crawl whole disks


class ResultsError(ValueError):
    """A directory or file that cannot be read as pipespec results (the message is one line)."""


# --------------------------------------------------------------------------- file readers


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ResultsError(f"{path}: missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        where = f" (line {exc.lineno})" if isinstance(exc, json.JSONDecodeError) else ""
        raise ResultsError(f"{path}: corrupt JSON{where}") from None
    except OSError as exc:
        raise ResultsError(f"{path}: cannot read ({exc.strerror})") from None


def _read_yaml(path: Path) -> dict:
    import yaml  # PyYAML ships with Hydra; imported here so the module loads without it

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ResultsError(f"{path}: missing") from None
    except (yaml.YAMLError, UnicodeDecodeError):
        raise ResultsError(f"{path}: corrupt YAML") from None
    except OSError as exc:
        raise ResultsError(f"{path}: cannot read ({exc.strerror})") from None
    if not isinstance(data, dict):
        raise ResultsError(f"{path}: not a mapping")
    return data


def _read_jsonl(path: Path) -> list[dict]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ResultsError(f"{path}: missing") from None
    except UnicodeDecodeError:
        raise ResultsError(f"{path}: not text") from None
    except OSError as exc:
        raise ResultsError(f"{path}: cannot read ({exc.strerror})") from None
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise ResultsError(f"{path}: corrupt JSON on line {number}") from None
        if not isinstance(row, dict):
            raise ResultsError(f"{path}: line {number} is not an object")
        rows.append(row)
    return rows


def _read_trace(path: Path) -> list[StageTrace]:
    try:
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        raise ResultsError(f"{path}: missing") from None
    except (OSError, EOFError, zlib.error, json.JSONDecodeError, UnicodeDecodeError):
        raise ResultsError(f"{path}: corrupt trace (not gzip JSON)") from None
    stages = data.get("stages") if isinstance(data, dict) else None
    if not isinstance(stages, list) or not stages:
        raise ResultsError(f"{path}: trace without a 'stages' list")
    try:
        return [StageTrace.from_dict(stage) for stage in stages]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ResultsError(f"{path}: not a pipespec trace ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None


# --------------------------------------------------------------------------- the run


@dataclass
class Run:
    """One run directory; ``samples`` and ``traces`` are read on first use."""

    path: Path
    summary: dict
    config: dict
    env: dict
    _samples: list[dict] | None = field(default=None, repr=False)

    # ---- identity --------------------------------------------------------
    @property
    def strategy(self) -> str:
        return str(self.summary.get("strategy") or _get(self.config, "strategy.name") or "")

    @property
    def hierarchy(self) -> str:
        return str(self.summary.get("models") or _get(self.config, "models.name") or "")

    @property
    def lookahead(self) -> int:
        value = self.summary.get("lookahead", _get(self.config, "strategy.lookahead"))
        return int(value) if value is not None else 0

    @property
    def max_lead(self) -> int | None:
        value = self.summary.get("max_lead", _get(self.config, "strategy.max_lead"))
        return int(value) if value is not None else None

    @property
    def dataset(self) -> str:
        return str(self.summary.get("dataset") or _get(self.config, "dataset.name") or "")

    @property
    def stage_names(self) -> list[str]:
        names = self.summary.get("stage_names")
        if names:
            return [str(n) for n in names]
        stages = _get(self.config, "models.stages") or []
        return [str(s.get("name", i)) if isinstance(s, dict) else str(s) for i, s in enumerate(stages)]

    @property
    def stage_kinds(self) -> list[str]:
        """'lookup' or 'model' per stage, from the config (a stage with kind prompt_lookup is 'lookup')."""
        stages = _get(self.config, "models.stages") or []
        kinds = []
        for stage in stages:
            kind = stage.get("kind") if isinstance(stage, dict) else stage
            kinds.append("lookup" if kind in ("prompt_lookup", "lookup") else "model")
        return kinds

    @property
    def depth(self) -> int:
        """Number of stages of the hierarchy (k); greedy runs still report the whole hierarchy."""
        return len(self.stage_names)

    @property
    def max_new_tokens(self) -> int | None:
        value = _get(self.config, "max_new_tokens")
        return int(value) if value is not None else None

    @property
    def tokens_per_s(self) -> float:
        return float(self.summary["tokens_per_s"])

    @property
    def ms_per_token(self) -> float:
        return float(self.summary.get("ms_per_token") or 1000.0 / self.tokens_per_s)

    @property
    def label(self) -> str:
        """Short human label, e.g. 'smollm2_int8_fp32 pipespec L=0'."""
        text = f"{self.hierarchy} {self.strategy}"
        return text if self.strategy == "greedy" else f"{text} L={self.lookahead}"

    # ---- lazily read parts ------------------------------------------------
    @property
    def samples(self) -> list[dict]:
        if self._samples is None:
            rows = _read_jsonl(self.path / "samples.jsonl")
            for number, row in enumerate(rows, start=1):
                if "new_tokens" not in row or "time_s" not in row:
                    raise ResultsError(f"{self.path / 'samples.jsonl'}: line {number} lacks new_tokens/time_s")
            self._samples = rows
        return self._samples

    def trace_path(self, sample: dict, position: int) -> Path:
        index = sample.get("index", position)
        return self.path / "traces" / f"{int(index):05d}.json.gz"

    def has_traces(self) -> bool:
        return (self.path / "traces").is_dir() and any((self.path / "traces").glob("*.json.gz"))

    def traces(self, position: int) -> list[StageTrace]:
        """Stage traces of the sample at ``position`` in samples.jsonl (stage order, smallest first)."""
        samples = self.samples
        if not 0 <= position < len(samples):
            raise IndexError(f"sample position must be in [0, {len(samples)}), got {position}")
        return _read_trace(self.trace_path(samples[position], position))

    def iter_traces(self) -> Iterator[tuple[dict, list[StageTrace]]]:
        """(sample row, stage traces) for every sample, read one file at a time."""
        for position, sample in enumerate(self.samples):
            yield sample, self.traces(position)


def _get(mapping: dict, dotted: str) -> Any:
    """``_get(cfg, 'strategy.name')``: nested lookup, None where a key is absent."""
    value: Any = mapping
    for key in dotted.split("."):
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


# --------------------------------------------------------------------------- loading


def is_run_dir(path: str | Path) -> bool:
    return (Path(path) / "summary.json").is_file()


def _check_summary(path: Path, summary: Any) -> dict:
    if not isinstance(summary, dict):
        raise ResultsError(f"{path}: not a JSON object")
    missing = [k for k in SUMMARY_KEYS if k not in summary]
    if missing:
        raise ResultsError(f"{path}: not a pipespec run summary (missing {', '.join(missing)})")
    try:
        rate = float(summary["tokens_per_s"])
    except (TypeError, ValueError):
        raise ResultsError(f"{path}: tokens_per_s is not a number") from None
    if not (math.isfinite(rate) and rate > 0):
        raise ResultsError(f"{path}: tokens_per_s must be a positive number, got {summary['tokens_per_s']!r}")
    return summary


def load_run(path: str | Path) -> Run:
    """Read a run directory's summary, config and env (samples and traces on first use)."""
    path = Path(path)
    if not path.exists():
        raise ResultsError(f"{path}: no such directory")
    if not path.is_dir():
        raise ResultsError(f"{path}: not a directory")
    if not (path / "summary.json").is_file():
        raise ResultsError(f"{path}: not a pipespec run directory (no summary.json)")
    summary = _check_summary(path / "summary.json", _read_json(path / "summary.json"))
    config = _read_yaml(path / "config.yaml") if (path / "config.yaml").is_file() else {}
    env_path = path / "env.json"
    env = _read_json(env_path) if env_path.is_file() else {}
    if not isinstance(env, dict):
        raise ResultsError(f"{env_path}: not a JSON object")
    return Run(path=path, summary=summary, config=config, env=env)


def _natural_key(path: Path) -> tuple:
    # '10' after '9': numbered multirun subdirectories sort numerically
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(path)))


def _run_dirs_under(directory: Path, depth: int) -> list[Path]:
    if is_run_dir(directory):
        return [directory]
    if depth <= 0:
        return []
    found = []
    for child in sorted((c for c in directory.iterdir() if c.is_dir() and not c.name.startswith(".")), key=_natural_key):
        found.extend(_run_dirs_under(child, depth - 1))
    return found


def find_runs(paths: Iterable[str | Path] | str | Path) -> list[Run]:
    """Runs of every path: a run directory, or a directory holding run directories (nested up to 4 levels).

    A path that is neither (or holds none) is a ResultsError naming it.
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    runs: list[Run] = []
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise ResultsError(f"{path}: no such directory")
        if not path.is_dir():
            raise ResultsError(f"{path}: not a directory")
        found = _run_dirs_under(path, MAX_SEARCH_DEPTH)
        if not found:
            raise ResultsError(f"{path}: not a pipespec run directory (no summary.json here or below)")
        runs.extend(load_run(p) for p in found)
    return runs

