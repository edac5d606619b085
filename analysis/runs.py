"""Run directories as analysis sees them: ``Run`` objects with lazily read samples and traces (no torch).

The files of a run directory (config.yaml, env.json, samples.jsonl,
traces/NNNNN.json.gz or a sweep's packed traces, summary.json) are described, written, read and validated
in ``analysis.rundir`` only; this module adds what analysis needs on top:

- ``Run``: a run's summary, config and env, its samples (``analysis.rundir.read_records``:
  half-written lines and repeated sample ids are dropped, as on resume) read on
  first use, and its traces as ``pipespec.trace.StageTrace`` objects;
- ``load_run``: one run directory (it must hold summary.json with a positive tokens/s);
- ``find_runs``: run directories and directories holding them (``analysis.rundir.find_run_dirs``);
- ``select_runs`` / ``run_set_key`` / ``greedy_reference``: runs chosen by what they are (exact or
  synthetic acceptance, greedy or sampled decoding, dataset and budget), so a figure never mixes them.

Every problem (missing folder, missing or corrupt file, a foreign directory) is a
``ResultsError`` (``analysis.rundir.ResultsError``) whose message is one line naming the path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from analysis.rundir import (
    SUMMARY,
    TRACES,
    ResultsError,
    find_run_dirs,
    has_packed_traces,
    is_run_dir,
    pick_reference,
    read_config,
    read_env,
    read_records,
    read_summary,
    read_trace,
    trace_path,
)
from pipespec.trace import StageTrace

__all__ = ["ResultsError", "Run", "is_run_dir", "load_run", "find_runs", "run_set_key", "describe_run_set",
           "select_runs", "greedy_reference"]


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
    def tree_nodes(self) -> int:
        """The first stage's token trees (0: it proposes chains)."""
        stages = _get(self.config, "models.stages") or []
        first = stages[0] if stages and isinstance(stages[0], dict) else {}
        return int(first.get("tree_nodes") or 0)

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
    def n_samples(self) -> int:
        return int(self.summary.get("n_samples") or 0)

    @property
    def acceptance(self) -> str:
        """'exact' (lossless verification) or 'synthetic' (drafts accepted at a set rate: not lossless)."""
        value = self.summary.get("acceptance")
        if value:
            return str(value)
        return "synthetic" if self.summary.get("lossless") is False else "exact"

    @property
    def lossless(self) -> bool:
        return self.acceptance == "exact" and self.summary.get("lossless", True) is not False

    @property
    def synthetic_rate(self) -> float | None:
        value = self.summary.get("synthetic_rate")
        return float(value) if value is not None and not self.lossless else None

    @property
    def temperature(self) -> float:
        sampling = self.summary.get("sampling") or _get(self.config, "sampling") or {}
        return float(sampling.get("temperature") or 0.0)

    @property
    def sampled(self) -> bool:
        """Sampled decoding (temperature > 0): compared in distribution only, never with greedy decoding."""
        return self.temperature > 0

    @property
    def budget(self) -> tuple[int, int | None]:
        """(samples, new tokens per sample): runs of different budgets are not set side by side."""
        return self.n_samples, self.max_new_tokens if self.max_new_tokens is not None else self.summary.get(
            "max_new_tokens")

    @property
    def target(self) -> str:
        return self.stage_names[-1] if self.stage_names else ""

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
            self._samples, _ = read_records(self.path)
        return self._samples

    def has_traces(self) -> bool:
        """Loose traces/ files, or traces packed into the run's or its sweep's archive (`analysis.rundir.packed`)."""
        return ((self.path / TRACES).is_dir() and any((self.path / TRACES).glob("*.json.gz"))) \
            or has_packed_traces(self.path)

    def traces(self, position: int) -> list[StageTrace]:
        """Stage traces of the sample at ``position`` in samples.jsonl (stage order, smallest first)."""
        samples = self.samples
        if not 0 <= position < len(samples):
            raise IndexError(f"sample position must be in [0, {len(samples)}), got {position}")
        index = samples[position]["index"]  # a record always has one (analysis.rundir.RECORD_KEYS)
        return _stage_traces(trace_path(self.path, index), read_trace(self.path, index)["stages"])

    def iter_traces(self) -> Iterator[tuple[dict, list[StageTrace]]]:
        """(sample row, stage traces) for every sample, read one file at a time."""
        for position, sample in enumerate(self.samples):
            yield sample, self.traces(position)


# --------------------------------------------------------------------------- selecting runs by what they are


def run_set_key(run: Run) -> tuple:
    """What runs must share to be drawn in one figure: dataset, budget and decoding (greedy or sampled)."""
    return run.dataset, run.budget, run.temperature


def describe_run_set(key: tuple) -> str:
    """'humaneval, 5 samples x 64 new tokens, greedy decoding' for a ``run_set_key``."""
    dataset, (samples, tokens), temperature = key
    decoding = "greedy decoding" if not temperature else f"sampled decoding (temperature {temperature:g})"
    return f"{dataset}, {samples} samples x {tokens if tokens is not None else '?'} new tokens, {decoding}"


def select_runs(runs: Iterable[Run], *, lossless: bool | None = None, sampled: bool | None = None,
                strategy: str | None = None, key: tuple | None = None) -> list[Run]:
    """The runs that are what is asked for (None: either)."""
    return [r for r in runs
            if (lossless is None or r.lossless == lossless) and (sampled is None or r.sampled == sampled)
            and (strategy is None or r.strategy == strategy) and (key is None or run_set_key(r) == key)]


def greedy_reference(run: Run, runs: Iterable[Run]) -> Run | None:
    """The autoregressive run ``run`` is measured against, among the runs of its own set (``run_set_key``:
    a figure never compares across sets): the one rule of ``analysis.rundir.pick_reference`` (a lossless
    greedy run of the same target, dataset, budget and decoding, so a sampled run only ever meets a
    sampled AR run; the one in the same folder, then of the same hierarchy, first); None if there is none."""
    same_set = {r.path: r for r in runs if run_set_key(r) == run_set_key(run)}
    found = pick_reference(run.path, run.config, [(r.path, r.config) for r in same_set.values()])
    return same_set[found[0]] if found else None


def _get(mapping: dict, dotted: str) -> Any:
    """``_get(cfg, 'strategy.name')``: nested lookup, None where a key is absent."""
    value: Any = mapping
    for key in dotted.split("."):
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


# --------------------------------------------------------------------------- loading


def _stage_traces(path: Path, stages: list) -> list[StageTrace]:
    try:
        return [StageTrace.from_dict(stage) for stage in stages]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ResultsError(f"{path}: not a pipespec trace ({reason})") from None


def load_run(path: str | Path) -> Run:
    """Read a run directory's summary, config and env (samples and traces on first use)."""
    path = Path(path)
    if not path.exists():
        raise ResultsError(f"{path}: no such directory")
    if not path.is_dir():
        raise ResultsError(f"{path}: not a directory")
    summary = read_summary(path)
    rate = summary["tokens_per_s"]
    if rate is None or not (math.isfinite(rate) and rate > 0):
        # the models divide by it: a run that produced no tokens has nothing to analyse
        raise ResultsError(f"{path / SUMMARY}: tokens_per_s must be a positive number, got {rate!r}")
    return Run(path=path, summary=summary, config=read_config(path), env=read_env(path))


def find_runs(paths: Iterable[str | Path] | str | Path) -> list[Run]:
    """Runs of every path: a run directory, or a directory holding run directories (``find_run_dirs``).

    A path that is neither (or holds none) is a ResultsError naming it.
    """
    return [load_run(p) for p in find_run_dirs(paths)]
