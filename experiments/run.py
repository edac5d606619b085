"""Hydra entry point: one run of a hierarchy x strategy x dataset, or a `-m` sweep of them.

    python -m experiments.run                        # the embedded default: -m strategy=greedy,auto
    python -m experiments.run models=smollm2_int8_fp32 strategy=sd dataset=news_lee_cnndm \\
        dataset.n_samples=10 max_new_tokens=64 strategy.lookahead=3
    python -m experiments.run -m strategy=greedy,sd,pipespec dataset=humaneval,news_lee_cnndm
    python -m experiments.run experiment=table2_humaneval_llama3 run.plan=true
    torchrun --nproc_per_node=4 -m experiments.run models=tiny_k3 strategy=pipespec   # rank 0 + 3 stage ranks

The work is in `experiments.runner` (no Hydra there); this file composes the config,
checks it once (`experiments.run_config.RunConfig`), prints the plan or the run's table, and
turns known errors into one line.
"""

from __future__ import annotations

import importlib.util
import sys

# Offline or online is each run's `hub.offline` setting, resolved by RunConfig.from_config (experiments.hub).
import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from experiments.compose import CONFIG_PATH
from experiments.data import DataError
from experiments.plan import format_plan, plan_stages
from pipespec.errors import ConfigError, StageError
from pipespec.launch import LaunchEnv, under_torchrun

# experiments.run_config and experiments.runner (torch) are imported in `main`, once Hydra has parsed the
# command line: `--help`, `--cfg job`, a bad override and a stage rank's argument check import no torch.

EMBEDDED_DEFAULT = ["-m", "strategy=greedy,auto"]


def plan(run) -> None:
    """`run.plan=true`: the stages' placement and memory estimates of `run` (a `RunConfig`), nothing loaded."""
    print(
        f"plan: {run.hierarchy} ({len(run.stages)} stages), strategy {run.call.strategy} "
        f"(lookahead {run.call.lookahead}), dataset {run.dataset['name']}, max_new_tokens {run.budget}"
    )
    print(format_plan(plan_stages(list(run.stages))))


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="config")
def main(cfg: DictConfig) -> dict | None:
    from experiments.run_config import RunConfig
    from experiments.runner import RunError, format_run, run_experiment

    try:
        run = RunConfig.from_config(OmegaConf.to_container(cfg, resolve=True))
        if run.options.plan:
            plan(run)
            return None
        summary = run_experiment(run, HydraConfig.get().runtime.output_dir)
    except (ConfigError, DataError, RunError, StageError) as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    print(format_run(summary))
    return summary


# Under torchrun every rank runs this program: rank 0 the run, ranks >= 1 one stage each, which they
# serve when the run makes its Pipeline (`pipespec.launch`), then exit. They write nothing, Hydra neither.
STAGE_RANK_OVERRIDES = ["hydra.run.dir=.", "hydra.output_subdir=null", "hydra/job_logging=disabled"]


def torchrun_arguments(argv: list[str], environ=None) -> list[str]:
    """The arguments of this rank: unchanged outside torchrun; a stage rank's Hydra writes no files."""
    if not under_torchrun(environ):
        return argv
    if "-m" in argv or "--multirun" in argv:
        raise ConfigError("under torchrun, launch one run at a time (its stage ranks serve one pipeline): drop -m")
    return argv + STAGE_RANK_OVERRIDES if LaunchEnv.from_environ(environ).rank >= 1 else argv


LAUNCHER_PLUGINS = {"submitit_local": "cluster", "submitit_slurm": "cluster"}  # hydra/launcher option -> extra


def check_launcher(argv: list[str]) -> None:
    """A hydra/launcher named on the command line whose plugin is not installed: name the extra to install."""
    for arg in argv:
        key, _, choice = arg.partition("=")
        if key.lstrip("+~") == "hydra/launcher" and choice in LAUNCHER_PLUGINS:
            try:
                found = importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is not None
            except ModuleNotFoundError:  # no hydra_plugins package at all
                found = False
            if not found or importlib.util.find_spec("submitit") is None:
                raise ConfigError(f"hydra/launcher={choice} needs Hydra's submitit launcher plugin: "
                                  f"pip install 'pipespec[{LAUNCHER_PLUGINS[choice]}]'")  # fmt: skip


def entry() -> None:
    if len(sys.argv) == 1:
        print("no arguments: running the embedded default, " + " ".join(EMBEDDED_DEFAULT), file=sys.stderr)
        sys.argv += EMBEDDED_DEFAULT
    try:
        check_launcher(sys.argv[1:])
        sys.argv[1:] = torchrun_arguments(sys.argv[1:])
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    main()


if __name__ == "__main__":
    entry()
