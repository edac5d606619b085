"""Importer for the PipeSpec authors' published benchmark logs (JSON, one file per run).

Schema (see results/official/README.md)::

    {"metadata": {"strategy": "greedy|chain|async-chain", "model_configs": [{"path", ...}, ...],
                  "lookahead": int, "dataset": str, "num_samples": int},
     "results": [{"sample_index": int,
                  "metrics": {"total_time": s, "tokens_generated": int,
                              "token_times": [...]                      # greedy
                              "model_times": [[...] per stage],          # chain / async-chain
                              "accepted_tokens": [[...] per pair]}}]}    # idem, incl. own token

Usage::

    python -m analysis.import_official DIR [--csv]

prints one row per log file: strategy, models, lookahead, samples, pooled
ms/token (sum total_time / sum tokens_generated), speedup against the greedy
log of the same target found in DIR, and mean accepted tokens per
verification for each adjacent (drafter, verifier) pair, as logged (the count
includes the verifier's own bonus/correction token).

This module only uses the standard library (no torch, no pipespec).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

__all__ = [
    "DEFAULT_DIR",
    "OfficialLogError",
    "SampleMetrics",
    "OfficialLog",
    "LogSummary",
    "short_model_name",
    "load_log",
    "load_dir",
    "pooled_ms_per_token",
    "accepted_counts",
    "step_times",
    "sync_window",
    "STRATEGY_NAMES",
    "largest_target_logs",
    "summarize_log",
    "summarize_logs",
    "import_dir",
    "format_table",
    "format_csv",
    "main",
]

# the authors' logs as committed with their licence and provenance (results/official/README.md)
DEFAULT_DIR = Path(__file__).resolve().parents[1] / "results" / "official" / "humaneval"
STRATEGIES = ("greedy", "chain", "async-chain")
STRATEGY_NAMES = {"greedy": "greedy", "chain": "sd", "async-chain": "pipespec"}  # ours, for each logged strategy


class OfficialLogError(ValueError):
    """A folder or file that cannot be read as the authors' benchmark logs (message is one line)."""


@dataclass(frozen=True)
class SampleMetrics:
    """Metrics of one benchmark sample.

    ``model_times``: per stage, the logged step times in seconds (smallest model
    first, target last); for greedy logs a single stage holding ``token_times``.
    ``accepted_tokens``: per adjacent pair (stage i-1 drafting for stage i), the
    tokens accepted per verification, INCLUDING the verifier's own token; empty
    for greedy logs.
    """

    sample_index: int
    total_time: float
    tokens_generated: int
    model_times: tuple[tuple[float, ...], ...]
    accepted_tokens: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class OfficialLog:
    """One parsed log file."""

    path: Path
    strategy: str
    model_paths: tuple[str, ...]
    lookahead: int
    dataset: str
    samples: tuple[SampleMetrics, ...]

    @property
    def model_names(self) -> tuple[str, ...]:
        return tuple(short_model_name(p) for p in self.model_paths)

    @property
    def target(self) -> str:
        """Model path of the target (last, largest model)."""
        return self.model_paths[-1]

    @property
    def num_samples(self) -> int:
        return len(self.samples)

    @property
    def num_pairs(self) -> int:
        return len(self.model_paths) - 1 if self.strategy != "greedy" else 0


@dataclass(frozen=True)
class LogSummary:
    """One output row of the importer."""

    file: str
    strategy: str
    models: tuple[str, ...]
    target: str
    lookahead: int
    samples: int
    tokens: int
    ms_per_token: float
    speedup: float | None  # None where DIR has no greedy log of the same target
    accepted_per_verify: tuple[float, ...] = field(default_factory=tuple)  # per pair, as logged


# --------------------------------------------------------------------------- parsing


_SIZE_RE = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)([BbMm])(?![A-Za-z])")


def short_model_name(model_path: str) -> str:
    """'meta-llama/Meta-Llama-3.1-70B-Instruct' -> '70B'; falls back to the last path component."""
    base = model_path.rstrip("/").split("/")[-1]
    sizes = _SIZE_RE.findall(base)
    if not sizes:
        return base
    number, unit = sizes[-1]  # the parameter count is the last size-like token
    return number + unit.upper()


def _bad(path: Path, reason: str) -> OfficialLogError:
    return OfficialLogError(f"{path.name}: not a PipeSpec benchmark log ({reason})")


def _number_list(value: object, path: Path, what: str, kind: type) -> tuple:
    """Validate a JSON list of numbers; ``kind`` int also accepts integral floats."""
    if not isinstance(value, list):
        raise _bad(path, f"{what} is not a list")
    out = []
    for item in value:
        if isinstance(item, bool) or not isinstance(item, (int, float)):
            raise _bad(path, f"{what} holds a non-number")
        if kind is int:
            if item != int(item):
                raise _bad(path, f"{what} holds a non-integer")
            item = int(item)
        out.append(kind(item))
    return tuple(out)


def _parse_sample(raw: object, strategy: str, n_models: int, path: Path, position: int) -> SampleMetrics:
    if not isinstance(raw, dict) or not isinstance(raw.get("metrics"), dict):
        raise _bad(path, f"results[{position}] has no metrics")
    metrics = raw["metrics"]
    try:
        total_time = float(metrics["total_time"])
        tokens = int(metrics["tokens_generated"])
    except (KeyError, TypeError, ValueError):
        raise _bad(path, f"results[{position}] lacks total_time/tokens_generated") from None
    if not math.isfinite(total_time) or total_time < 0 or tokens < 0:
        raise _bad(path, f"results[{position}] has a negative or non-finite time/token count")
    if strategy == "greedy":
        model_times = (_number_list(metrics.get("token_times", []), path, "token_times", float),)
        accepted: tuple[tuple[int, ...], ...] = ()
    else:
        if "model_times" not in metrics or "accepted_tokens" not in metrics:
            raise _bad(path, f"results[{position}] lacks model_times/accepted_tokens")
        stages = metrics["model_times"]
        pairs = metrics["accepted_tokens"]
        if not isinstance(stages, list) or not isinstance(pairs, list):
            raise _bad(path, f"results[{position}] model_times/accepted_tokens are not lists")
        if len(stages) != n_models or len(pairs) != n_models - 1:
            raise _bad(path, f"results[{position}] has {len(stages)} stages / {len(pairs)} pairs "
                             f"for {n_models} models")
        model_times = tuple(_number_list(s, path, "model_times", float) for s in stages)
        accepted = tuple(_number_list(p, path, "accepted_tokens", int) for p in pairs)
    index = raw.get("sample_index", position)
    return SampleMetrics(
        sample_index=int(index) if isinstance(index, (int, float)) else position,
        total_time=total_time,
        tokens_generated=tokens,
        model_times=model_times,
        accepted_tokens=accepted,
    )


def load_log(path: str | Path) -> OfficialLog:
    """Parse one log file; raises ``OfficialLogError`` naming the file if it is not such a log."""
    path = Path(path)
    try:
        with path.open("r", encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        raise OfficialLogError(f"{path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise _bad(path, "invalid JSON") from None
    except OSError as exc:
        raise OfficialLogError(f"{path.name}: cannot read ({exc.strerror})") from None
    if not isinstance(data, dict) or not isinstance(data.get("metadata"), dict):
        raise _bad(path, "no metadata object")
    meta = data["metadata"]
    strategy = meta.get("strategy")
    if strategy not in STRATEGIES:
        raise _bad(path, f"unknown strategy {strategy!r}")
    configs = meta.get("model_configs")
    if not isinstance(configs, list) or not configs or not all(
        isinstance(c, dict) and isinstance(c.get("path"), str) for c in configs
    ):
        raise _bad(path, "model_configs missing or without paths")
    if strategy != "greedy" and len(configs) < 2:
        raise _bad(path, f"{strategy} needs at least two models")
    lookahead = meta.get("lookahead", 0)
    if isinstance(lookahead, bool) or not isinstance(lookahead, int):
        raise _bad(path, "lookahead is not an integer")
    results = data.get("results")
    if not isinstance(results, list) or not results:
        raise _bad(path, "no results")
    samples = tuple(
        _parse_sample(raw, strategy, len(configs), path, position) for position, raw in enumerate(results)
    )
    if sum(s.tokens_generated for s in samples) <= 0:
        raise _bad(path, "no generated tokens")
    return OfficialLog(
        path=path,
        strategy=strategy,
        model_paths=tuple(c["path"] for c in configs),
        lookahead=lookahead,
        dataset=str(meta.get("dataset", "")),
        samples=samples,
    )


def _log_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.suffix == ".json" and p.is_file())


def log_dir(directory: str | Path) -> Path:
    """The folder holding the logs: ``directory`` itself, or its one subfolder of logs.

    So both the published results folder and its ``humaneval/`` subfolder are accepted.
    """
    directory = Path(directory)
    if not directory.exists():
        raise OfficialLogError(f"{directory}: no such folder")
    if not directory.is_dir():
        raise OfficialLogError(f"{directory}: not a folder")
    if _log_files(directory):
        return directory
    holding = sorted(p for p in directory.iterdir() if p.is_dir() and _log_files(p))
    if len(holding) == 1:
        return holding[0]
    if holding:
        names = ", ".join(p.name for p in holding)
        raise OfficialLogError(f"{directory}: no log files (*.json) here, and several subfolders hold some "
                               f"({names}): name one")
    raise OfficialLogError(f"{directory}: no log files (*.json), here or in a subfolder")


def load_dir(directory: str | Path) -> list[OfficialLog]:
    """Parse every ``*.json`` file of ``log_dir(directory)`` (sorted by name); other files are ignored."""
    return [load_log(p) for p in _log_files(log_dir(directory))]


# --------------------------------------------------------------------------- per-log extraction


def pooled_ms_per_token(log: OfficialLog) -> float:
    """Pooled milliseconds per token: 1000 * sum(total_time) / sum(tokens_generated) (the paper's metric)."""
    return 1000.0 * sum(s.total_time for s in log.samples) / sum(s.tokens_generated for s in log.samples)


def accepted_counts(log: OfficialLog, pair: int) -> list[int]:
    """All logged accepted counts of ``pair`` (0 = stage 0 drafting for stage 1), samples concatenated.

    Each count includes the verifier's own token, so it is >= 1.
    """
    if not 0 <= pair < log.num_pairs:
        raise IndexError(f"pair must be in [0, {log.num_pairs}), got {pair}")
    return [k for s in log.samples for k in s.accepted_tokens[pair]]


def step_times(log: OfficialLog, stage: int) -> list[float]:
    """All logged step times (s) of ``stage`` (0 = smallest model; greedy: stage 0 = token_times)."""
    n_stages = 1 if log.strategy == "greedy" else len(log.model_paths)
    if not 0 <= stage < n_stages:
        raise IndexError(f"stage must be in [0, {n_stages}), got {stage}")
    return [t for s in log.samples for t in s.model_times[stage]]


def active_gpus(log: OfficialLog) -> dict[int, str]:
    """GPU index -> short name of the model on it, from the log's ``model_configs[].devices``
    (GPUs no model was placed on are idle: they must not dilute per-GPU averages)."""
    try:
        configs = json.loads(log.path.read_text())["metadata"]["model_configs"]
        return {int(str(device).rsplit(":", 1)[-1]): short_model_name(str(config["path"]))
                for config in configs for device in config.get("devices", [])}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise _bad(log.path, f"no readable model_configs[].devices ({type(error).__name__})") from None


def gpu_samples(log: OfficialLog, position: int = 0) -> list[dict]:
    """The NVML samples ``{timestamp, gpu_utilizations, gpu_powers, ...}`` of the sample at ``position``
    (empty where the log has none)."""
    try:
        return list(json.loads(log.path.read_text())["results"][position].get("gpustats") or [])
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as error:
        raise _bad(log.path, f"no readable gpustats for sample {position} ({type(error).__name__})") from None


def sync_window(log: OfficialLog, pair: int = 0) -> int | None:
    """Drafts offered per verification where the log fixes it, else None.

    Synchronous ``chain`` logs: the first drafter runs lookahead - 1 tokens
    ahead (logged counts never exceed the lookahead, own token included), so
    pair 0 is offered lookahead - 1 drafts. Deeper pairs of a chain and all
    ``async-chain`` pairs get a varying, unlogged number of drafts: None.
    """
    if log.strategy == "chain" and pair == 0:
        return max(log.lookahead - 1, 0)
    return None


# --------------------------------------------------------------------------- summaries


def summarize_log(log: OfficialLog, baseline: OfficialLog | None = None) -> LogSummary:
    """Row for ``log``; speedup is baseline ms/token / log ms/token when a baseline is given."""
    ms = pooled_ms_per_token(log)
    speedup = pooled_ms_per_token(baseline) / ms if baseline is not None else None
    per_pair = []
    for pair in range(log.num_pairs):
        counts = accepted_counts(log, pair)
        per_pair.append(sum(counts) / len(counts) if counts else math.nan)
    return LogSummary(
        file=log.path.name,
        strategy=log.strategy,
        models=log.model_names,
        target=log.target,
        lookahead=log.lookahead,
        samples=log.num_samples,
        tokens=sum(s.tokens_generated for s in log.samples),
        ms_per_token=ms,
        speedup=speedup,
        accepted_per_verify=tuple(per_pair),
    )


def _size_key(short_name: str) -> float:
    """'70B' -> 70e9, '68M' -> 68e6; names without a size sort last."""
    match = _SIZE_RE.fullmatch(short_name)
    if not match:
        return math.inf
    return float(match.group(1)) * (1e9 if match.group(2).upper() == "B" else 1e6)


def largest_target_logs(logs: Sequence[OfficialLog]) -> list[OfficialLog]:
    """The logs whose target is the largest model among ``logs`` (the published 70B runs)."""
    sizes = {log.target: _size_key(log.model_names[-1]) for log in logs}
    largest = max(sizes.values())
    return [log for log in logs if sizes[log.target] == largest]


def _row_order(summary: LogSummary) -> tuple:
    # group by target (smallest first), then AR / SD / PipeSpec, shallow before deep chains,
    # lookahead numerically
    target = short_model_name(summary.target)
    return (_size_key(target), summary.target, STRATEGIES.index(summary.strategy), len(summary.models),
            tuple(_size_key(m) for m in summary.models), summary.lookahead, summary.file)


def summarize_logs(logs: Sequence[OfficialLog]) -> list[LogSummary]:
    """Rows for ``logs``, each against the greedy log of its target among ``logs`` (if any)."""
    greedy = {}
    for log in logs:
        if log.strategy == "greedy":
            greedy.setdefault(log.target, log)  # first by file name if a target has several
    rows = [summarize_log(log, greedy.get(log.target)) for log in logs]
    return sorted(rows, key=_row_order)


def import_dir(directory: str | Path) -> list[LogSummary]:
    """One row per log file of ``directory``, sorted by target, strategy, models, lookahead."""
    return summarize_logs(load_dir(directory))


# --------------------------------------------------------------------------- output

COLUMNS = ("strategy", "models", "lookahead", "samples", "ms_per_token", "speedup", "accepted_per_verify")


def _cells(row: LogSummary) -> list[str]:
    return [
        row.strategy,
        ",".join(row.models),
        str(row.lookahead),
        str(row.samples),
        f"{row.ms_per_token:.2f}",
        "" if row.speedup is None else f"{row.speedup:.2f}",
        "/".join(f"{a:.2f}" for a in row.accepted_per_verify),
    ]


def format_table(rows: Sequence[LogSummary]) -> str:
    """Aligned plain-text table; numbers right-aligned."""
    table = [list(COLUMNS)] + [_cells(r) for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(COLUMNS))]
    numeric = {2, 3, 4, 5}
    lines = []
    for line in table:
        cells = [c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(line, widths))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def format_csv(rows: Sequence[LogSummary]) -> str:
    """CSV with a header; the file name comes first so rows can be traced back."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(("file",) + COLUMNS)
    for row in rows:
        writer.writerow([row.file] + _cells(row))
    return buffer.getvalue()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m analysis.import_official",
        description="Summarise the PipeSpec authors' benchmark logs (one row per *.json file).",
    )
    parser.add_argument("directory", type=Path,
                        help="folder of log files (*.json), or a folder with one such subfolder (e.g. humaneval/)")
    parser.add_argument("--csv", action="store_true", help="print CSV instead of a table")
    args = parser.parse_args(argv)
    try:
        rows = import_dir(args.directory)
    except OfficialLogError as exc:
        print(f"error: {exc}", file=sys.stderr)  # one line, no traceback
        return 2
    text = format_csv(rows) if args.csv else format_table(rows)
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
