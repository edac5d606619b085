"""Hydra callbacks: before a run, the entry point's check of its run directory (so that a refused run leaves
the directory's `.hydra/` record as it was); at the end of a multirun, fill every run's greedy comparison and
print one table."""

from __future__ import annotations

import importlib
import shutil
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict

from analysis.collect import collect, format_markdown
from analysis.rundir import ResultsError, find_run_dirs, refresh_reference
from pipespec.errors import ConfigError

# experiments.runner (torch, through pipespec.api) is imported where a run's directory is checked, for its
# RunError: collecting a multirun's table at its end imports no torch.


class CheckRunDirectory(Callback):
    """Hydra writes a run's `.hydra/` files (config, overrides) into its run directory before the entry point
    starts, so a run the entry point then refuses (a directory that holds results without resume, a resume
    with another config) would leave that directory describing a run that never happened. This runs the
    entry point's own check first: `check`, the dotted path of a function of (the composed config without
    `hydra`, the run directory) that raises an error naming the problem; the run ends with it (exit code 2)
    and nothing is written. A run it lets go on in a directory that holds an earlier invocation's `.hydra/`
    files (a resume) keeps those of the first one (`keep_start_record`). A single run only: a multirun's jobs
    are checked by the entry point alone."""

    def __init__(self, check: str):
        module, _, name = check.rpartition(".")
        self.check = getattr(importlib.import_module(module), name)

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        from experiments.runner import RunError

        if config.hydra.output_subdir is None:  # Hydra writes nothing (a torchrun stage rank)
            return
        run_dir = Path(str(OmegaConf.select(config, "hydra.run.dir")))
        if not run_dir.is_dir():
            return
        task = config.copy()
        with open_dict(task):
            del task["hydra"]
        try:
            self.check(OmegaConf.to_container(task, resolve=True), run_dir)
        except (ConfigError, RunError, ResultsError) as error:
            print(f"error: {str(error).splitlines()[0]}", file=sys.stderr)
            raise SystemExit(2) from None
        keep_start_record(run_dir / str(config.hydra.output_subdir))


STARTED = "started"  # beside Hydra's files of a run's latest invocation: those of the one that started it


def keep_start_record(hydra_dir: Path) -> None:
    """A run resumed (or run again) in its directory: Hydra is about to write this invocation's `.hydra/` files
    over those of the invocation that started the run; the first time, those are kept in `.hydra/started/`."""
    files = sorted(hydra_dir.glob("*.yaml"))
    if files and not (hydra_dir / STARTED).exists():
        (hydra_dir / STARTED).mkdir()
        for path in files:
            shutil.copy2(path, hydra_dir / STARTED / path.name)


class CollectAtEnd(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
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
