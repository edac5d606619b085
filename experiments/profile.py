"""Hydra entry point: measure a machine profile of one hierarchy into `profile.json` in the run dir.

    python -m experiments.profile models=smollm2_int8_fp32 dataset=humaneval dataset.n_samples=10
    python -m experiments.profile models=tiny_k2 profile.max_fed=8 hydra.run.dir=/tmp/p
    python -m experiments.profile models=smollm2_int8_fp32 dataset=news_lee costs_from=OTHER/profile.json
        # acceptance on news_lee, step costs, prefill and handoff reused from OTHER (same machine and stages)
    python -m experiments.profile models=smollm2_int8_fp32 cost_cache=false
        # step costs measured again (by default a cached cost sweep of the same machine and stages is reused)

The measurement is `experiments.profiler`; `python -m analysis.predict RUN_DIR/profile.json` reads it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from experiments.hub import default_offline  # noqa: E402
default_offline()  # offline unless the user set HF_HUB_OFFLINE & co. or the run names a hub id

import hydra  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from experiments.compose import CONFIG_PATH  # noqa: E402
from experiments.data import DataError, prompts_for  # noqa: E402
from experiments.hierarchies import resolve_stages  # noqa: E402
from experiments.profiler import ProfileOptions, measure_profile  # noqa: E402
from pipespec.errors import ConfigError, StageError  # noqa: E402
from pipespec.models import check_shared_vocabulary, context_length  # noqa: E402

# experiments.run_config (torch) and Hydra's runtime config are imported where used: importing this module
# stays cheap for the tests.

PROFILE_FILE = "profile.json"


def read_costs_from(path: str | None) -> dict | None:
    """The JSON of the profile named by `costs_from` (with its "path"), or None; a `ConfigError` if unreadable."""
    if path is None:
        return None
    file = Path(path)
    if file.is_dir():
        file = file / PROFILE_FILE
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError) as error:
        raise ConfigError(f"costs_from: cannot read a profile from {file}: {error}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"costs_from: {file} is not a pipespec profile")
    return {**data, "path": str(file)}


def check_run_dir(config: dict, run_dir: str | Path) -> None:
    """A profile is measured into a directory that holds none: another one there would be lost (checked
    before anything is measured, and by `experiments.callbacks.CheckRunDirectory` before Hydra writes)."""
    if (Path(run_dir) / PROFILE_FILE).exists():
        raise ConfigError(f"{run_dir} already holds a profile ({PROFILE_FILE}): choose another hydra.run.dir, or "
                          "move it away to measure again")  # fmt: skip


def write_profile(config: dict, run_dir: str | Path) -> Path:
    """Measure the profile `config` (a composed conf/profile.yaml) describes into `run_dir`/profile.json, on
    the prompts a run of the same models, dataset and max_new_tokens would take."""
    from experiments.run_config import check_budget, check_family

    check_run_dir(config, run_dir)
    options = ProfileOptions(**(config.get("profile") or {}))
    family, budget = check_family(config["models"].get("family", "base")), check_budget(config["max_new_tokens"])
    specs = resolve_stages(config["models"]["stages"])
    tokenizer = check_shared_vocabulary(specs)
    prompts = prompts_for(config["dataset"], tokenizer, family, context_length(specs[-1].model), budget)
    log = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    costs_from = read_costs_from(config.get("costs_from"))
    cost_cache = config.get("cost_cache", True)
    if not isinstance(cost_cache, bool):
        raise ConfigError(f"cost_cache must be true or false, got {cost_cache!r}")
    profile = measure_profile(specs, config["models"]["name"], prompts.pairs(), options, dataset=prompts.name,
                              log=log, costs_from=costs_from, cost_cache=cost_cache)  # fmt: skip
    path = Path(run_dir) / PROFILE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(profile, indent=1))
    return path


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="profile")
def main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    config = OmegaConf.to_container(cfg, resolve=True)
    try:
        path = write_profile(config, HydraConfig.get().runtime.output_dir)
    except (ConfigError, DataError, StageError, TypeError) as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    profile = json.loads(path.read_text())
    print(f"profile: {path} ({profile['duration_s']:.0f} s, {len(profile['sample_ids'])} prompts)")


if __name__ == "__main__":
    main()
