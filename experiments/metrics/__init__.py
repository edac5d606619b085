"""Quality metrics shipped with pipespec as `evaluate` metric modules, one directory each.

    experiments/metrics/rouge/rouge.py    ROUGE-1/2/L F-measures through rouge-score

Each directory holds a script of the same name defining an `evaluate.Metric`, so
`evaluate.load(str(METRICS_DIR / name))` loads it from disk, offline. Nothing here imports
evaluate: `experiments.data.quality.load_metric` resolves `dataset.metric` names (these first,
then a local metric directory, then any evaluate hub id) and loads them.
"""

from __future__ import annotations

from pathlib import Path

METRICS_DIR = Path(__file__).resolve().parent


def bundled_metrics() -> list[str]:
    """Names of the metric modules shipped here (directories holding `<name>/<name>.py`)."""
    return sorted(p.name for p in METRICS_DIR.iterdir() if (p / f"{p.name}.py").is_file())


def bundled_metric_path(name: str) -> Path | None:
    """The directory of the shipped metric `name`, or None when pipespec ships none of that name."""
    path = METRICS_DIR / name
    return path if name in bundled_metrics() else None
