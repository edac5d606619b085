"""Hydra callbacks: at the end of a multirun, fill every run's greedy comparison and print one table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig


class CollectAtEnd(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from analysis.collect import collect, format_markdown
        from analysis.rundir import ResultsError, find_run_dirs, refresh_reference

        sweep_dir = Path(config.hydra.sweep.dir)
        if config.run.plan or not sweep_dir.exists():
            return
        try:
            for run_dir in find_run_dirs([sweep_dir]):
                refresh_reference(run_dir)  # a run that finished before its greedy sibling gets its comparison now
            rows = collect([sweep_dir])
        except ResultsError as error:  # e.g. every job failed before writing results
            print(f"(no table: {error})")
            return
        print(f"\nmultirun {sweep_dir}: {len(rows)} runs (python -m experiments.collect {sweep_dir})")
        print(format_markdown(rows))
