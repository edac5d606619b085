"""What every figure module shares: default inputs, the ``Drawn`` record, paths as shown, and the 95% intervals.

Intervals are never computed here by a bootstrap of their own: every one comes from
``analysis.paired`` (``paired_speedups`` for paired speedups, ``bootstrap_sampling`` for a mean over
prompts, the prompts resampled), so a figure's interval is the one ``python -m analysis.paired`` prints.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from analysis import paired

REPO_ROOT = Path(__file__).resolve().parents[2]
RESULTS = REPO_ROOT / "results"
# the paired sweeps behind the "ours" figures: (hierarchy, dataset) -> sweep folder
SWEEPS = {(hierarchy, dataset): RESULTS / "validation_paired" / hierarchy / dataset / "sweep"
          for hierarchy in ("smollm2_int8_fp32", "smollm2_pld_int8_fp32")
          for dataset in ("humaneval", "news_lee_cnndm")}
SYNTHETIC = RESULTS / "synthetic_sweep"
DEFAULT_RESULTS = (*SWEEPS.values(), SYNTHETIC)
DEFAULT_OUT = REPO_ROOT / "paper_figures"
COMMAND = "python -m analysis.figures"
# what makes each default input, for the one-line error when it is missing
MAKES = {**{path: f"HIERARCHIES={h} DATASETS={d} bash scripts/validation_paired.sh" for (h, d), path in SWEEPS.items()},
         SYNTHETIC: "bash scripts/synthetic_sweep.sh"}
MANIFEST = "figures.csv"
README = "README.md"
MANIFEST_COLUMNS = ("figure", "files", "data", "selection", "machine", "caption")
SUFFIXES = ("png", "pdf", "csv")
SYNTHETIC_LABEL = "synthetic acceptance (not lossless)"
IN_SAMPLE = "in-sample decomposition"
NO_ENERGY = ("energy per token: not available (our runs are on CPUs: no NVML power samples; "
             "env.json holds none)")
OFFICIAL_MACHINE = "4x NVIDIA A100-40GB (the authors' machine, results/official/README.md)"
# histogram bins of tokens appended per verification (own token included): one per count up to the
# synchronous window of the 70B logs (8), then two wide bins for PipeSpec's long runs
BINS = ((1, 1), (2, 2), (3, 3), (4, 4), (5, 5), (6, 6), (7, 7), (8, 8), (9, 16), (17, None))
GAMMAS = (1, 2, 4, 8, 16)
SEED = 0


@dataclass
class Drawn:
    """A built figure with the data it plots (``rows``), where that came from, its caption and machine."""

    fig: object  # matplotlib Figure
    rows: list[dict]
    sources: list[str]  # data folders (repo-relative where possible)
    selection: str  # which runs or logs, chosen how
    caption: str
    extra: dict = field(default_factory=dict)
    machine: str = ""


def shown(path: str | Path) -> str:
    """A path relative to the repository (stable whichever folder the command runs from)."""
    return os.path.relpath(os.path.abspath(path), REPO_ROOT)


def fmt(value) -> str:
    if value is None:
        return ""
    if isinstance(value, (float, np.floating)):
        return "" if not math.isfinite(value) else f"{float(value):.6g}"
    return str(value)


def bin_label(low: int, high: int | None) -> str:
    return str(low) if high == low else (f"{low}+" if high is None else f"{low}-{high}")


def binned_shares(counts: Sequence[int], bins=BINS) -> list[float]:
    """Percent of ``counts`` in each (low, high) bin (high None: open)."""
    total = max(len(counts), 1)
    return [100.0 * sum(1 for c in counts if c >= low and (high is None or c <= high)) / total for low, high in bins]


# --------------------------------------------------------------------------- intervals (analysis.paired's bootstrap)


def _groups(per_prompt: Sequence[Sequence[float]]) -> list[list[float]]:
    return [g for g in ([float(v) for v in values if v is not None and math.isfinite(v)] for values in per_prompt) if g]


def mean_interval(per_prompt: Sequence[Sequence[float]]) -> tuple[float, float, float]:
    """(mean, low, high): the mean over prompts of each prompt's mean over its repetitions, and its 95% interval
    with the prompts resampled (``paired.bootstrap_sampling``, which returns exp of the interval of a mean: it is
    given the values less their mean, so taking the log back is exact). NaNs without values."""
    groups = _groups(per_prompt)
    if not groups:
        return math.nan, math.nan, math.nan
    point = float(np.mean([np.mean(g) for g in groups]))
    low, high = paired.bootstrap_sampling([[v - point for v in g] for g in groups], np.random.default_rng(SEED))
    return point, point + math.log(low), point + math.log(high)


def geometric_interval(per_prompt: Sequence[Sequence[float]]) -> tuple[float, float, float]:
    """(geometric mean, low, high) over prompts of positive values (a rate, a time), as ``paired`` pools ratios."""
    groups = _groups([[math.log(v) for v in values if v and v > 0] for values in per_prompt])
    if not groups:
        return math.nan, math.nan, math.nan
    low, high = paired.bootstrap_sampling(groups, np.random.default_rng(SEED))
    return math.exp(float(np.mean([np.mean(g) for g in groups]))), low, high


def scaled_interval(pooled: float, per_prompt: Sequence[Sequence[float]]) -> tuple[float, float]:
    """A pooled rate's 95% interval: the relative interval over prompts of their geometric mean
    (``geometric_interval``) applied to the pooled value."""
    center, low, high = geometric_interval(per_prompt)
    if not math.isfinite(center) or center <= 0:
        return math.nan, math.nan
    return pooled * low / center, pooled * high / center


def interval_columns(name: str, value: tuple[float, float, float]) -> dict:
    """{name: point, name_low: low, name_high: high}."""
    return {name: value[0], f"{name}_low": value[1], f"{name}_high": value[2]}
